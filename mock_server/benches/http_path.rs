//! The HTTP path of `mockserve`: streamed tokens per second and requests per second on loopback
//! with `--speedup-ratio inf` (the engine costs no simulated time), against a bare axum endpoint
//! that streams the same number of SSE events with the same client, plus how closely observed
//! TTFT and inter-token gaps follow `--fixed-latency 20,5`.
//!
//! Run with: `cargo bench -p mock_server --bench http_path`
//!
//! Without `--bench` (as under `cargo test --all-targets`) it runs a few-hundred-millisecond
//! smoke version.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use futures_util::StreamExt;
use mock_server::config::ServerConfig;
use mock_server::server::serve;
use serde_json::json;
use servesim::cluster::ClusterConfig;
use servesim::metrics::Distribution;
use servesim::perf::Fixed;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// Output tokens per request.
const TOKENS: usize = 64;
/// Streams in flight at once.
const CONCURRENCY: usize = 8;

struct Settings {
    /// How long each server is loaded.
    load: Duration,
    /// Requests of the timing check.
    timing_requests: usize,
}

/// Binds 127.0.0.1:0 and spawns a server future built from the listener; returns its address
/// and a sender that stops it.
async fn spawn_server<F, Fut>(make: F) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)>
where
    F: FnOnce(TcpListener, tokio::sync::oneshot::Receiver<()>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(make(listener, stopped));
    Ok((addr, stop))
}

async fn start_mockserve(
    config: ServerConfig,
) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    spawn_server(|listener, stopped| async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = serve(listener, config, shutdown).await {
            eprintln!("mockserve: {e:#}");
        }
    })
    .await
}

/// The baseline: parses the JSON body and streams a role chunk, `max_tokens` token chunks, a
/// finish chunk and `[DONE]`, each a serialised chat chunk, with no engine behind it.
async fn bare_handler(body: Bytes) -> Response {
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let n = request["max_tokens"].as_u64().unwrap_or(16) as usize;
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let value = json!({"id": "chatcmpl-bare", "object": "chat.completion.chunk",
            "created": 0, "model": "mock-model", "system_fingerprint": "fp_bare",
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {value}\n\n")))
    };
    let events = std::iter::once(chunk(json!({"role": "assistant", "content": ""}), None))
        .chain((0..n).map(move |i| chunk(json!({"content": format!(" word{i}")}), None)))
        .chain(std::iter::once(chunk(json!({}), Some("length"))))
        .chain(std::iter::once(Ok(Bytes::from_static(b"data: [DONE]\n\n"))));
    let mut response = Body::from_stream(futures_util::stream::iter(events)).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

async fn start_bare() -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    spawn_server(|listener, stopped| async move {
        let listener = listener.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let app = axum::Router::new().route("/v1/chat/completions", post(bare_handler));
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    })
    .await
}

fn body(max_tokens: usize) -> serde_json::Value {
    json!({"model": "mock-model", "stream": true, "max_tokens": max_tokens, "ignore_eos": true,
           "messages": [{"role": "user", "content": "benchmark the streaming path please"}]})
}

/// Sends one streamed request; returns the arrival time of each `data:` event (since `t0`).
async fn stream_once(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    t0: Instant,
) -> Result<Vec<Duration>> {
    let response = client.post(url).json(body).send().await?;
    if !response.status().is_success() {
        bail!("status {}", response.status());
    }
    let mut stream = response.bytes_stream();
    let mut times = Vec::with_capacity(TOKENS + 3);
    let mut tail = 0u8; // Trailing newlines carried over from the previous chunk.
    while let Some(chunk) = stream.next().await {
        let now = t0.elapsed();
        for &b in chunk?.iter() {
            if b == b'\n' {
                tail += 1;
                if tail == 2 {
                    times.push(now);
                    tail = 0;
                }
            } else {
                tail = 0;
            }
        }
    }
    Ok(times)
}

/// Requests/s and tokens/s over `CONCURRENCY` streams for `load`.
async fn throughput(addr: SocketAddr, load: Duration) -> Result<(f64, f64)> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("http://{addr}/v1/chat/completions");
    let body = Arc::new(body(TOKENS));
    // Warm the connections.
    stream_once(&client, &url, &body, Instant::now()).await?;
    let start = Instant::now();
    let end = start + load;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), Arc::clone(&body));
            tokio::spawn(async move {
                let mut done = 0usize;
                while Instant::now() < end {
                    let events = stream_once(&client, &url, &body, start).await?;
                    // Role, tokens, finish, [DONE].
                    if events.len() != TOKENS + 3 {
                        bail!("expected {} events, got {}", TOKENS + 3, events.len());
                    }
                    done += 1;
                }
                anyhow::Ok(done)
            })
        })
        .collect();
    let mut requests = 0;
    for task in tasks {
        requests += task.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((requests as f64 / secs, (requests * TOKENS) as f64 / secs))
}

/// p-th percentile (0..=100) of sorted values.
/// |observed - configured| in ms for TTFT and the inter-token gaps, sequential requests.
async fn timing(requests: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    const PREFILL_MS: f64 = 20.0;
    const DECODE_MS: f64 = 5.0;
    const N: usize = 20;
    let mut cluster = ClusterConfig::default();
    cluster.engine.latency.model = Arc::new(Fixed {
        prefill_ms: PREFILL_MS,
        decode_ms: DECODE_MS,
    });
    let (addr, _stop) = start_mockserve(ServerConfig::new(cluster)).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("http://{addr}/v1/chat/completions");
    let body = body(N);
    stream_once(&client, &url, &body, Instant::now()).await?;
    let (mut ttft, mut gaps) = (Vec::new(), Vec::new());
    for _ in 0..requests {
        let t0 = Instant::now();
        let events = stream_once(&client, &url, &body, t0).await?;
        // events[0] is the role chunk (sent at once); events[1..=N] carry tokens.
        let tokens = events.get(1..=N).context("too few events")?;
        ttft.push((tokens[0].as_secs_f64() * 1e3 - PREFILL_MS).abs());
        for w in tokens.windows(2) {
            gaps.push(((w[1] - w[0]).as_secs_f64() * 1e3 - DECODE_MS).abs());
        }
    }
    ttft.sort_by(f64::total_cmp);
    gaps.sort_by(f64::total_cmp);
    Ok((ttft, gaps))
}

async fn run(settings: Settings) -> Result<()> {
    let mut cluster = ClusterConfig::default();
    cluster.engine.latency.speedup_ratio = f64::INFINITY;
    let (mock_addr, _mock_stop) = start_mockserve(ServerConfig::new(cluster)).await?;
    let (bare_addr, _bare_stop) = start_bare().await?;
    let (mock_rps, mock_tps) = throughput(mock_addr, settings.load).await?;
    let (bare_rps, bare_tps) = throughput(bare_addr, settings.load).await?;
    println!(
        "http_path: {CONCURRENCY} concurrent streams, {TOKENS} tokens per request, {:.1} s per server",
        settings.load.as_secs_f64()
    );
    println!("{:<28} {:>12} {:>14}", "server", "requests/s", "tokens/s");
    println!(
        "{:<28} {:>12.0} {:>14.0}",
        "mockserve --speedup-ratio inf", mock_rps, mock_tps
    );
    println!(
        "{:<28} {:>12.0} {:>14.0}",
        "bare axum SSE", bare_rps, bare_tps
    );
    println!(
        "ratio mockserve / bare axum: {:.2} (tokens/s)",
        mock_tps / bare_tps
    );
    let (ttft, gaps) = timing(settings.timing_requests).await?;
    println!(
        "timing, --fixed-latency 20,5, {} sequential requests x 20 tokens, |observed - configured|:",
        settings.timing_requests
    );
    for (name, v) in [("TTFT", &ttft), ("inter-token gap", &gaps)] {
        println!(
            "  {name:<16} p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (n = {})",
            Distribution::percentile(v, 50.0).unwrap_or(0.0),
            Distribution::percentile(v, 99.0).unwrap_or(0.0),
            v.last().copied().unwrap_or(0.0),
            v.len()
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            load: Duration::from_secs(2),
            timing_requests: 30,
        }
    } else {
        Settings {
            load: Duration::from_millis(200),
            timing_requests: 2,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings))
}
