//! `mockserve fleet`: N workers in one process, each its own endpoint; the manifest; every
//! request runs on its listener's worker; the routing judge's log and metrics; bad flags.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mock_server::fleet::judge::Decision;
use mock_server::fleet::manifest::Manifest;
use mock_server::fleet::{launch, FleetConfig, RunningFleet};
use mock_server::{Cli, Command};
use serde_json::{json, Value};

use crate::common::*;

/// The fleet configuration of `mockserve fleet FLAGS...`.
pub(crate) fn fleet_config(flags: &[&str]) -> Result<FleetConfig> {
    let mut argv = vec!["mockserve", "fleet"];
    argv.extend_from_slice(flags);
    let cli = Cli::try_parse_from(&argv)?;
    let Some(Command::Fleet(args)) = cli.command else {
        bail!("expected fleet");
    };
    Ok(FleetConfig::from_args(&args)?)
}

/// The error `mockserve fleet FLAGS...` is refused with, before anything binds.
pub(crate) fn refused(flags: &[&str]) -> String {
    match fleet_config(flags) {
        Ok(config) => panic!("{flags:?} accepted: {config:?}"),
        Err(e) => format!("{e:#}"),
    }
}

/// A fresh folder under the system's temporary one.
fn scratch(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("mockserve-fleet-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A chat completion of `text` (3 tokens, to the limit) sent to `url`; returns the response.
pub(crate) async fn chat(client: &reqwest::Client, url: &str, text: &str) -> Result<Value> {
    let body = chat_body(
        &json!([user(text)]),
        json!({"max_tokens": 3, "ignore_eos": true}),
    );
    let response = within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    Ok(within(response.json::<Value>()).await??)
}

/// Scrapes `url` (a `/metrics` URL) and parses it.
pub(crate) async fn scrape_url(
    client: &reqwest::Client,
    url: &str,
) -> Result<BTreeMap<String, f64>> {
    let response = within(client.get(url).send()).await??;
    assert_eq!(response.status(), 200);
    parse_exposition(&within(response.text()).await??)
}

/// The judge's log, from `url` (a worker's or the admin's base URL).
pub(crate) async fn decisions(client: &reqwest::Client, url: &str) -> Result<Vec<Decision>> {
    let response = within(client.get(format!("{url}/fleet/decisions")).send()).await??;
    assert_eq!(response.status(), 200);
    let text = within(response.text()).await??;
    text.lines()
        .map(|line| serde_json::from_str(line).with_context(|| line.to_string()))
        .collect()
}

/// A page of `GET /fleet/decisions?QUERY` from `url`: the decisions' numbers and the next
/// page's `since` (its header).
pub(crate) async fn page(
    client: &reqwest::Client,
    url: &str,
    query: &str,
) -> Result<(Vec<u64>, u64)> {
    let response = within(client.get(format!("{url}/fleet/decisions?{query}")).send()).await??;
    assert_eq!(response.status(), 200);
    let next = response
        .headers()
        .get("x-fleet-next-since")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .context("x-fleet-next-since")?;
    let text = within(response.text()).await??;
    let seqs = text
        .lines()
        .map(|line| Ok(serde_json::from_str::<Decision>(line)?.seq))
        .collect::<Result<Vec<u64>>>()?;
    Ok((seqs, next))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_runs_what_its_listener_receives() -> Result<()> {
    let dir = scratch("eight")?;
    let path = dir.join("fleet.json");
    let config = fleet_config(&[
        "--workers",
        "8",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
        "--kv-events-endpoint",
        "tcp://*:0",
        "--fleet-manifest",
        path.to_str().context("a UTF-8 path")?,
    ])?;
    let fleet: RunningFleet = within(launch(config)).await??;
    let manifest: Manifest = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    assert_eq!(manifest, fleet.manifest);
    assert_eq!(manifest.workers.len(), 8);
    assert_eq!(manifest.block_size, 16);
    let client = reqwest::Client::new();
    for (i, worker) in manifest.workers.iter().enumerate() {
        assert_eq!(worker.index, i);
        assert!(worker.url.starts_with("http://127.0.0.1:"), "{worker:?}");
        assert_eq!(worker.metrics_url, format!("{}/metrics", worker.url));
        let kv = worker.kv_events_endpoint.as_deref().unwrap_or_default();
        assert!(kv.starts_with("tcp://127.0.0.1:"), "{worker:?}");
        // Worker i gets i + 1 requests, each a prompt of its own.
        for turn in 0..=i {
            let text = format!("{} worker {i} turn {turn}", long_question());
            let answer = chat(&client, &worker.url, &text).await?;
            assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
        }
    }
    let ports: std::collections::BTreeSet<&str> = manifest
        .workers
        .iter()
        .filter_map(|w| w.kv_events_endpoint.as_deref())
        .collect();
    assert_eq!(ports.len(), 8, "one KV-event socket per worker");
    for (i, worker) in manifest.workers.iter().enumerate() {
        let samples = scrape_url(&client, &worker.metrics_url).await?;
        let success = format!(
            "vllm:request_success_total{{model_name=\"mock-model\",engine=\"{i}\",\
             finished_reason=\"length\"}}"
        );
        assert_eq!(
            samples.get(&success),
            Some(&(i as f64 + 1.0)),
            "{samples:?}"
        );
        let generated =
            format!("vllm:generation_tokens_total{{model_name=\"mock-model\",engine=\"{i}\"}}");
        assert_eq!(samples.get(&generated), Some(&(3.0 * (i as f64 + 1.0))));
        // Only this worker's series.
        let others: Vec<&String> = samples
            .keys()
            .filter(|k| k.contains("engine=") && !k.contains(&format!("engine=\"{i}\"")))
            .collect();
        assert!(others.is_empty(), "worker {i} shows {others:?}");
        let published = format!("servesim_kv_events_published_total{{worker=\"{i}\"}}");
        assert!(samples.get(&published) >= Some(&1.0), "{samples:?}");
        let chat = "servesim_http_requests_total{endpoint=\"chat\"}";
        assert_eq!(samples.get(chat), Some(&(i as f64 + 1.0)));
        // The endpoint says how late it handed over its own tokens (3 per request).
        assert_eq!(
            samples.get("servesim_token_lateness_seconds_count"),
            Some(&(3.0 * (i as f64 + 1.0)))
        );
        assert_eq!(
            samples.get("servesim_routing_decisions_total"),
            Some(&36.0),
            "1 + 2 + ... + 8 requests"
        );
    }
    let log = decisions(&client, &manifest.workers[0].url).await?;
    let chosen: Vec<u32> = log.iter().map(|d| d.worker).collect();
    let expected: Vec<u32> = (0..8u32).flat_map(|i| vec![i; i as usize + 1]).collect();
    assert_eq!(chosen, expected);
    // Sequential requests: the chosen and the best worker idle at each arrival.
    assert!(log.iter().all(|d| (d.chosen_load, d.best_load) == (0, 0)));
    within(fleet.shutdown()).await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_scores_each_decision_against_every_workers_cache() -> Result<()> {
    let config = fleet_config(&[
        "--workers",
        "2",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
    ])?;
    let fleet = within(launch(config)).await??;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    let [w0, w1] = [0, 1].map(|i| fleet.manifest.workers[i].url.clone());
    let prompt = long_question();
    let first = chat(&client, &w0, &prompt).await?;
    let prompt_tokens = first["usage"]["prompt_tokens"]
        .as_u64()
        .context("prompt_tokens")? as usize;
    let cached = prompt_tokens / 16 * 16;
    assert!(cached >= 16, "a prompt of {prompt_tokens} tokens");
    chat(&client, &w1, &prompt).await?;
    chat(&client, &w0, &prompt).await?;
    let log = decisions(&client, &admin).await?;
    assert_eq!(log.len(), 3, "{log:?}");
    let summary: Vec<(u32, usize, usize, usize)> = log
        .iter()
        .map(|d| {
            (
                d.worker,
                d.chosen_overlap_tokens,
                d.best_overlap_tokens,
                d.regret_tokens,
            )
        })
        .collect();
    // Nothing cached yet; then worker 0 held the prompt and worker 1 was chosen; then both.
    assert_eq!(
        summary,
        vec![(0, 0, 0, 0), (1, 0, cached, cached), (0, cached, cached, 0)]
    );
    assert_eq!(log[1].best_worker, 0);
    assert!(log.iter().all(|d| d.prompt_tokens == prompt_tokens));
    assert_eq!(log.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
    // `since` skips what a reader has seen.
    let response = within(
        client
            .get(format!("{admin}/fleet/decisions?since=2"))
            .send(),
    )
    .await??;
    assert_eq!(within(response.text()).await??.lines().count(), 1);
    // `limit` cuts a page; the next page's `since` is in a header.
    let (seqs, next) = page(&client, &admin, "since=0&limit=2").await?;
    assert_eq!((seqs, next), (vec![0, 1], 2));
    let (seqs, next) = page(&client, &admin, "since=2&limit=2").await?;
    assert_eq!((seqs, next), (vec![2], 3));
    let (seqs, next) = page(&client, &admin, "since=3").await?;
    assert_eq!((seqs, next), (vec![], 3));
    let samples = scrape_url(&client, &format!("{admin}/metrics")).await?;
    let get = |name: &str| samples.get(name).copied();
    assert_eq!(get("servesim_routing_decisions_total"), Some(3.0));
    assert_eq!(
        get("servesim_routing_oracle_hit_tokens_total"),
        Some(2.0 * cached as f64)
    );
    assert_eq!(
        get("servesim_routing_achieved_hit_tokens_total"),
        Some(cached as f64)
    );
    assert_eq!(
        get("servesim_routing_regret_tokens_sum"),
        Some(cached as f64)
    );
    assert_eq!(
        get("servesim_routing_regret_tokens_bucket{le=\"0.0\"}"),
        Some(2.0)
    );
    // The admin's `/metrics` is the whole fleet's: both workers' series.
    for i in 0..2 {
        let running =
            format!("vllm:num_requests_running{{model_name=\"mock-model\",engine=\"{i}\"}}");
        assert_eq!(get(&running), Some(0.0), "{samples:?}");
    }
    let health = within(client.get(format!("{admin}/health")).send()).await??;
    assert_eq!(health.status(), 200);
    let manifest: Manifest = within(
        within(client.get(format!("{admin}/fleet/manifest")).send())
            .await??
            .json(),
    )
    .await??;
    assert_eq!(manifest, fleet.manifest);
    within(fleet.shutdown()).await?;
    Ok(())
}

/// Issue 43: the log keeps its latest `--decision-log-size` decisions, pages through them, and
/// refuses a page that is not a canonical number or beyond the most a page holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_log_keeps_its_size_and_pages() -> Result<()> {
    let config = fleet_config(&[
        "--workers",
        "2",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--speedup-ratio",
        "inf",
        "--decision-log-size",
        "5",
    ])?;
    let fleet = within(launch(config)).await??;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    for i in 0..7 {
        chat(&client, &fleet.manifest.workers[i % 2].url, "hello").await?;
    }
    // The five latest, in pages of two.
    let mut since = 0;
    let mut seen = Vec::new();
    loop {
        let (seqs, next) = page(&client, &admin, &format!("since={since}&limit=2")).await?;
        assert!(seqs.len() <= 2);
        if seqs.is_empty() {
            assert_eq!(next, since);
            break;
        }
        seen.extend(seqs);
        since = next;
    }
    assert_eq!(seen, vec![2, 3, 4, 5, 6]);
    assert_eq!(page(&client, &admin, "").await?.0, vec![2, 3, 4, 5, 6]);
    for (query, param) in [
        ("since=%2B1", "since"),
        ("since=+1", "since"),
        ("since=01", "since"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=1&limit=2", "limit"),
    ] {
        let url = format!("{admin}/fleet/decisions?{query}");
        let response = within(client.get(url).send()).await??;
        assert_eq!(response.status(), 400, "{query}");
        let body: Value = within(response.json()).await??;
        assert_eq!(body["error"]["param"], param, "{query}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    }
    within(fleet.shutdown()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_256_workers_answers_on_every_endpoint() -> Result<()> {
    let config = fleet_config(&["--workers", "256", "--port", "0", "--speedup-ratio", "inf"])?;
    let fleet = within(launch(config)).await??;
    let client = reqwest::Client::new();
    let mut ports = std::collections::BTreeSet::new();
    for worker in &fleet.manifest.workers {
        let response = within(client.get(format!("{}/health", worker.url)).send()).await??;
        assert_eq!(response.status(), 200, "{}", worker.url);
        ports.insert(worker.url.clone());
    }
    assert_eq!(ports.len(), 256);
    // The last worker serves and shows its own series.
    let last = &fleet.manifest.workers[255];
    chat(&client, &last.url, "hello there").await?;
    let samples = scrape_url(&client, &last.metrics_url).await?;
    let key = "vllm:request_success_total{model_name=\"mock-model\",engine=\"255\",\
               finished_reason=\"length\"}";
    assert_eq!(samples.get(key), Some(&1.0));
    within(fleet.shutdown()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_gives_each_worker_its_own_address() -> Result<()> {
    let config = fleet_config(&[
        "--listen",
        "127.0.0.2:0,127.0.0.3:0",
        "--speedup-ratio",
        "inf",
    ])?;
    let fleet = within(launch(config)).await??;
    let client = reqwest::Client::new();
    for (i, worker) in fleet.manifest.workers.iter().enumerate() {
        let prefix = format!("http://127.0.0.{}:", i + 2);
        assert!(worker.url.starts_with(&prefix), "{worker:?}");
        chat(&client, &worker.url, "hello").await?;
    }
    let log = decisions(&client, &fleet.manifest.workers[1].url).await?;
    assert_eq!(log.iter().map(|d| d.worker).collect::<Vec<_>>(), vec![0, 1]);
    within(fleet.shutdown()).await?;
    Ok(())
}

#[test]
fn bad_fleet_flags_are_refused_with_the_flag_named() {
    let cases: &[(&[&str], &str)] = &[
        (&["--workers", "0"], "at least one worker"),
        (&[], "--workers N"),
        (&["--workers", "8", "--port", "65530"], "beyond 65535"),
        (&["--workers", "5000", "--port", "0"], "at most 4096"),
        (
            &["--workers", "3", "--listen", "127.0.0.1:0,127.0.0.1:0"],
            "--listen gives 2 addresses",
        ),
        (&["--workers", "2", "--num-workers", "4"], "--num-workers"),
        (
            &["--workers", "2", "--serving-mode", "disagg"],
            "--serving-mode disagg",
        ),
        (
            &["--workers", "4", "--kv-events-endpoint", "tcp://*:65534"],
            "beyond 65535",
        ),
        (
            &["--workers", "2", "--speedup-ratio", "0"],
            "--speedup-ratio",
        ),
        // Issue 43: any size was accepted, and the log grew with it.
        (
            &[
                "--workers",
                "2",
                "--decision-log-size",
                "18446744073709551615",
            ],
            "--decision-log-size 18446744073709551615: the decision log keeps at most 1000000",
        ),
        (
            &["--workers", "2", "--decision-log-size", "1000001"],
            "(0 to 1000000)",
        ),
    ];
    for (flags, needle) in cases {
        let msg = refused(flags);
        assert!(msg.contains(needle), "{flags:?}: {msg}");
    }
    // The largest log is fine.
    assert!(fleet_config(&["--workers", "2", "--decision-log-size", "1000000"]).is_ok());
    // A worker count at the edge of the port range is fine.
    assert!(fleet_config(&["--workers", "6", "--port", "65530"]).is_ok());
    // --listen and --port exclude each other (clap says so).
    let both = Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--listen",
        "127.0.0.1:0",
        "--port",
        "1",
    ]);
    assert!(both.is_err());
}

#[tokio::test]
async fn a_port_in_use_is_an_error_naming_the_worker() -> Result<()> {
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = taken.local_addr()?.port();
    // The first worker's port is taken.
    let config = fleet_config(&["--workers", "2", "--port", &port.to_string()])?;
    let error = launch(config).await.expect_err("port in use");
    let msg = error.to_string();
    assert!(
        msg.contains("worker 0") && msg.contains(&port.to_string()),
        "{msg}"
    );
    Ok(())
}

/// The real binary prints every worker's address and serves on each.
#[tokio::test]
async fn fleet_binary_smoke_test() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args([
            "fleet",
            "--workers",
            "2",
            "--port",
            "0",
            "--admin-port",
            "0",
            "--speedup-ratio",
            "inf",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut reader = tokio::io::BufReader::new(stdout);
    let mut urls = Vec::new();
    for prefix in [
        "mockserve fleet worker 0 listening on ",
        "mockserve fleet worker 1 listening on ",
        "mockserve fleet admin listening on ",
    ] {
        let mut line = String::new();
        within(reader.read_line(&mut line)).await??;
        let url = line.trim().strip_prefix(prefix).context(line.clone())?;
        urls.push(url.to_string());
    }
    for url in &urls {
        let response = within(reqwest::get(format!("{url}/health"))).await??;
        assert_eq!(response.status(), 200, "{url}");
    }
    child.kill().await?;
    Ok(())
}

/// Worker 1's KV events come out of worker 1's own socket, as a vLLM without data parallelism
/// publishes them (rank 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_publishes_its_kv_events_on_its_own_socket() -> Result<()> {
    use zeromq::{Socket, SocketRecv};
    let config = fleet_config(&[
        "--workers",
        "3",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
        "--kv-events-endpoint",
        "tcp://*:0",
    ])?;
    let fleet = within(launch(config)).await??;
    let worker = &fleet.manifest.workers[1];
    let endpoint = worker.kv_events_endpoint.clone().context("an endpoint")?;
    let mut sub = zeromq::SubSocket::new();
    within(sub.connect(&endpoint)).await??;
    within(sub.subscribe("")).await??;
    let client = reqwest::Client::new();
    // A subscriber misses what was published before it joined: send until a batch comes.
    let mut payload = None;
    for turn in 0..40 {
        let text = format!("turn {turn} {}", long_question());
        chat(&client, &worker.url, &text).await?;
        if let Ok(message) = tokio::time::timeout(Duration::from_millis(250), sub.recv()).await {
            let frames = message?.into_vec();
            assert_eq!(frames.len(), 3, "[topic, seq, payload]");
            payload = Some(frames[2].clone());
            break;
        }
    }
    let payload = payload.context("no KV-event batch from worker 1")?;
    let batch = rmpv::decode::read_value(&mut &payload[..])?;
    let batch = batch.as_array().context("[ts, events, rank]")?;
    assert_eq!(batch[2].as_u64(), Some(0), "a standalone worker is rank 0");
    let tags: Vec<&str> = batch[1]
        .as_array()
        .context("events")?
        .iter()
        .filter_map(|e| e.as_array()?.first()?.as_str())
        .collect();
    assert!(tags.contains(&"BlockStored"), "{tags:?}");
    // Nothing ran on the other workers.
    let samples = scrape_url(&client, &fleet.manifest.workers[0].metrics_url).await?;
    let published = samples.get("servesim_kv_events_published_total{worker=\"0\"}");
    assert_eq!(published, Some(&0.0), "{samples:?}");
    within(fleet.shutdown()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sglang_dialect_speaks_sglangs_metric_names() -> Result<()> {
    let config = fleet_config(&[
        "--workers",
        "2",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--metrics-dialect",
        "sglang",
    ])?;
    let fleet = within(launch(config)).await??;
    let client = reqwest::Client::new();
    let worker = &fleet.manifest.workers[1];
    chat(&client, &worker.url, "hello there").await?;
    let samples = scrape_url(&client, &worker.metrics_url).await?;
    let get = |name: &str| samples.get(name).copied();
    assert_eq!(
        get("sglang:generation_tokens_total{model_name=\"mock-model\"}"),
        Some(3.0),
        "{samples:?}"
    );
    assert_eq!(
        get("sglang:num_running_reqs{model_name=\"mock-model\"}"),
        Some(0.0)
    );
    assert!(
        samples.keys().all(|k| !k.starts_with("vllm:")),
        "{samples:?}"
    );
    within(fleet.shutdown()).await?;
    Ok(())
}
