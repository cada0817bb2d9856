//! `mockserve fleet` at scale: for fleets of 1, 16 and 256 endpoints in one process, the time to
//! start (every socket listening), the memory the fleet holds after serving (resident set, each
//! size in a process of its own) and the requests per second served through all its endpoints
//! (chat completions of 8 tokens at `--speedup-ratio inf`, 32 in flight, round-robin over the
//! endpoints, every endpoint warmed by one request first), with the memory each endpoint adds
//! and every figure as a ratio to the one-endpoint fleet of the same run.
//!
//! Run with: `cargo bench -p mock_server --bench fleet_scale`
//!
//! Without `--bench` (as under `cargo test --all-targets`) it runs a smoke version: fleets of 1
//! and 4 endpoints, 40 requests each.

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mock_server::fleet::{launch, FleetConfig};
use mock_server::{Cli, Command};
use serde_json::{json, Value};

/// The allocator of the `mockserve` binary, so that this measures the process it ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Set in a child process: the fleet size it measures.
const CHILD_ENV: &str = "FLEET_SCALE_WORKERS";
/// Set in a child process: how many requests it sends.
const REQUESTS_ENV: &str = "FLEET_SCALE_REQUESTS";
/// Requests in flight at once.
const CONCURRENCY: usize = 32;

/// The resident set of this process in bytes (Linux; None elsewhere).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// One chat completion to `url`; an error unless it succeeded.
async fn chat(client: &reqwest::Client, url: &str, k: usize) -> Result<()> {
    let body = json!({
        "model": "mock-model",
        "messages": [{"role": "user", "content": format!("request {k} of the fleet benchmark")}],
        "max_tokens": 8,
        "ignore_eos": true,
    });
    let response = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&body)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!("{url}: HTTP {}", response.status());
    }
    response.bytes().await?;
    Ok(())
}

/// In the child: starts a fleet of `workers`, warms every endpoint, sends `requests` requests
/// round-robin over them; one JSON line of figures.
async fn measure(workers: usize, requests: usize) -> Result<Value> {
    let n = workers.to_string();
    let cli = Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--workers",
        &n,
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
    ])?;
    let Some(Command::Fleet(args)) = cli.command else {
        bail!("expected fleet");
    };
    let config = FleetConfig::from_args(&args)?;
    let rss_before = rss_bytes();
    let started = Instant::now();
    let fleet = launch(config).await?;
    let startup = started.elapsed();
    let urls: Arc<Vec<String>> = Arc::new(
        fleet
            .manifest
            .workers
            .iter()
            .map(|w| w.url.clone())
            .collect(),
    );
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(2)
        .build()?;
    for (k, url) in urls.iter().enumerate() {
        chat(&client, url, k).await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY.min(requests) {
        let (client, urls, next) = (client.clone(), Arc::clone(&urls), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= requests {
                    return Ok::<(), anyhow::Error>(());
                }
                chat(&client, &urls[k % urls.len()], k).await?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let elapsed = started.elapsed();
    let rss_after = rss_bytes();
    fleet.shutdown().await;
    Ok(json!({
        "workers": workers,
        "startup_ms": startup.as_secs_f64() * 1e3,
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "requests": requests,
        "requests_per_s": requests as f64 / elapsed.as_secs_f64(),
    }))
}

/// Runs one size in a child process of this binary; its figures.
fn child(workers: usize, requests: usize) -> Result<Value> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .env(CHILD_ENV, workers.to_string())
        .env(REQUESTS_ENV, requests.to_string())
        .output()?;
    if !out.status.success() {
        bail!(
            "the {workers}-endpoint fleet failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(out.stdout)?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("no figures from the child")?;
    Ok(serde_json::from_str(line)?)
}

fn run() -> Result<()> {
    if let Ok(workers) = std::env::var(CHILD_ENV) {
        let workers: usize = workers.parse()?;
        let requests: usize = std::env::var(REQUESTS_ENV)?.parse()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let figures = runtime.block_on(measure(workers, requests))?;
        println!("{figures}");
        return Ok(());
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (sizes, requests): (&[usize], usize) = if full {
        (&[1, 16, 256], 5000)
    } else {
        (&[1, 4], 40)
    };
    let rows: Vec<Value> = sizes
        .iter()
        .map(|&n| child(n, requests))
        .collect::<Result<_>>()?;
    let f = |row: &Value, key: &str| row[key].as_f64().unwrap_or(f64::NAN);
    let base = &rows[0];
    println!(
        "mockserve fleet at scale ({requests} chat completions of 8 tokens per size, {CONCURRENCY} in flight, round-robin over the endpoints)"
    );
    println!(
        "{:>9} {:>11} {:>10} {:>15} {:>12} {:>13}",
        "endpoints", "startup ms", "RSS MiB", "KiB / endpoint", "requests/s", "vs 1 endpoint"
    );
    for row in &rows {
        let n = f(row, "workers");
        let extra = (n > 1.0)
            .then(|| (f(row, "rss_after_bytes") - f(base, "rss_after_bytes")) / (n - 1.0) / 1024.0);
        println!(
            "{:>9} {:>11.1} {:>10.1} {:>15} {:>12.0} {:>12.2}x",
            n,
            f(row, "startup_ms"),
            f(row, "rss_after_bytes") / (1 << 20) as f64,
            extra.map_or("-".to_string(), |e| format!("{e:.0}")),
            f(row, "requests_per_s"),
            f(row, "requests_per_s") / f(base, "requests_per_s"),
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet_scale: {e:#}");
            ExitCode::FAILURE
        }
    }
}
