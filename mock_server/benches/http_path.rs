//! The HTTP path of `mockserve`: streamed tokens per second and requests per second on loopback
//! with `--speedup-ratio inf` (the engine costs no simulated time), against a bare axum endpoint
//! that streams the same number of SSE events with the same client, plus how closely observed
//! TTFT and inter-token gaps of concurrent streams follow `--fixed-latency 20,5` and
//! `--fixed-latency 20,0.5` (decode steps shorter than tokio's 1 ms timer tick).
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

/// The allocator of the `mockserve` binary, so that this measures the path it ships.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Output tokens per request.
const TOKENS: usize = 64;
/// Streams in flight at once.
const CONCURRENCY: usize = 8;

struct Settings {
    /// How long each server is loaded.
    load: Duration,
    /// Requests per stream in each timing check.
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

/// How closely the tokens of `CONCURRENCY` concurrent streams follow the engine's model, at one
/// decode step.
struct Timing {
    /// The decode step, ms.
    step_ms: f64,
    /// Tokens per request.
    tokens: usize,
    /// |observed TTFT - modelled TTFT| per request, ms, sorted.
    ttft_err: Vec<f64>,
    /// |observed inter-token gap - step| per gap, ms, sorted.
    gap_err: Vec<f64>,
    /// Observed inter-token gaps, ms, sorted.
    gaps: Vec<f64>,
    /// Arrival of the role chunk (sent at submission) after the request was sent, ms, sorted:
    /// the share of the TTFT error that is the HTTP round trip, not the token's delivery.
    role: Vec<f64>,
}

/// Sends one streamed request; returns the arrival time (since `t0`) and text of each SSE event.
async fn stream_events(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
    t0: Instant,
) -> Result<Vec<(Duration, String)>> {
    let response = client.post(url).json(body).send().await?;
    if !response.status().is_success() {
        bail!("status {}", response.status());
    }
    let mut stream = response.bytes_stream();
    let mut events = Vec::new();
    let mut buf = String::new();
    while let Some(chunk) = stream.next().await {
        let now = t0.elapsed();
        buf.push_str(std::str::from_utf8(&chunk?)?);
        while let Some(end) = buf.find("\n\n") {
            events.push((now, buf[..end].to_string()));
            buf.drain(..end + 2);
        }
    }
    Ok(events)
}

/// `requests` requests on each of `CONCURRENCY` concurrent streams, stream `i` pinned to worker
/// `i` of a `CONCURRENCY`-worker cluster running `--fixed-latency 20,<step_ms>`: every gap of
/// the model is one step, and its TTFT is the response's `nvext.timing.ttft_ms`.
async fn timing(step_ms: f64, tokens: usize, requests: usize) -> Result<Timing> {
    let mut cluster = ClusterConfig {
        num_workers: CONCURRENCY,
        ..ClusterConfig::default()
    };
    cluster.engine.latency.model = Arc::new(Fixed {
        prefill_ms: 20.0,
        decode_ms: step_ms,
    });
    let (addr, _stop) = start_mockserve(ServerConfig::new(cluster)).await?;
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("http://{addr}/v1/chat/completions");
    let streams: Vec<_> = (0..CONCURRENCY)
        .map(|worker| {
            let (client, url) = (client.clone(), url.clone());
            let mut body = body(tokens);
            body["nvext"] = json!({"backend_instance_id": worker, "extra_fields": ["timing"]});
            tokio::spawn(async move {
                // Warm the connection.
                stream_events(&client, &url, &body, Instant::now()).await?;
                let (mut ttft_err, mut gaps, mut role) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..requests {
                    let t0 = Instant::now();
                    let events = stream_events(&client, &url, &body, t0).await?;
                    // Role, tokens, finish (with `nvext`), [DONE].
                    if events.len() != tokens + 3 {
                        bail!("expected {} events, got {}", tokens + 3, events.len());
                    }
                    let finish: serde_json::Value = serde_json::from_str(
                        events[tokens + 1]
                            .1
                            .strip_prefix("data: ")
                            .context("not data")?,
                    )?;
                    let model_ttft = finish["nvext"]["timing"]["ttft_ms"]
                        .as_f64()
                        .context("no nvext.timing.ttft_ms")?;
                    let times: Vec<f64> = events[1..=tokens]
                        .iter()
                        .map(|(t, _)| t.as_secs_f64() * 1e3)
                        .collect();
                    ttft_err.push((times[0] - model_ttft).abs());
                    role.push(events[0].0.as_secs_f64() * 1e3);
                    gaps.extend(times.windows(2).map(|w| w[1] - w[0]));
                }
                anyhow::Ok((ttft_err, gaps, role))
            })
        })
        .collect();
    let (mut ttft_err, mut gaps, mut role) = (Vec::new(), Vec::new(), Vec::new());
    for stream in streams {
        let (t, g, r) = stream.await??;
        ttft_err.extend(t);
        gaps.extend(g);
        role.extend(r);
    }
    let mut gap_err: Vec<f64> = gaps.iter().map(|g| (g - step_ms).abs()).collect();
    for v in [&mut ttft_err, &mut gaps, &mut gap_err, &mut role] {
        v.sort_by(f64::total_cmp);
    }
    Ok(Timing {
        step_ms,
        tokens,
        ttft_err,
        gap_err,
        gaps,
        role,
    })
}

/// The baseline of the role chunk's arrival: the first event of the bare endpoint, after the
/// request was sent, over `CONCURRENCY` concurrent streams of `requests` requests each (20 ms
/// apart), ms, sorted.
async fn bare_first_event(addr: SocketAddr, tokens: usize, requests: usize) -> Result<Vec<f64>> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("http://{addr}/v1/chat/completions");
    let streams: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body(tokens));
            tokio::spawn(async move {
                // Warm the connection.
                stream_events(&client, &url, &body, Instant::now()).await?;
                let mut first = Vec::new();
                for _ in 0..requests {
                    let t0 = Instant::now();
                    let events = stream_events(&client, &url, &body, t0).await?;
                    let (at, _) = events.first().context("no events")?;
                    first.push(at.as_secs_f64() * 1e3);
                    // Paced as the timed streams are (a request takes them tens of ms), so the
                    // server is as idle between requests.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                anyhow::Ok(first)
            })
        })
        .collect();
    let mut first = Vec::new();
    for stream in streams {
        first.extend(stream.await??);
    }
    first.sort_by(f64::total_cmp);
    Ok(first)
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
    let p = |v: &[f64], q: f64| Distribution::percentile(v, q).unwrap_or(f64::NAN);
    // No tokens: the role, finish and `[DONE]` events only, so the first event's arrival is
    // the HTTP round trip, not the time to build a whole answer.
    let bare_first = bare_first_event(bare_addr, 0, settings.timing_requests).await?;
    for (step_ms, tokens) in [(5.0, 20), (0.5, 100)] {
        let t = timing(step_ms, tokens, settings.timing_requests).await?;
        println!(
            "timing, --fixed-latency 20,{} on {CONCURRENCY} workers, {CONCURRENCY} concurrent \
             streams (one per worker) x {} requests x {} tokens, |observed - modelled|:",
            t.step_ms, settings.timing_requests, t.tokens
        );
        for (name, v) in [("TTFT", &t.ttft_err), ("inter-token gap", &t.gap_err)] {
            println!(
                "  {name:<16} p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (n = {})",
                p(v, 50.0),
                p(v, 99.0),
                v.last().copied().unwrap_or(f64::NAN),
                v.len()
            );
        }
        println!(
            "  median gap {:.3} ms against a {} ms step (bursts would show a shorter one)",
            p(&t.gaps, 50.0),
            t.step_ms
        );
        println!(
            "  role chunk (sent at submission) after p50 {:.3} ms  p99 {:.3} ms: the HTTP round \
             trip in the TTFT error",
            p(&t.role, 50.0),
            p(&t.role, 99.0)
        );
        println!(
            "  (the bare axum endpoint's first event, same client and concurrency: p50 {:.3} ms  \
             p99 {:.3} ms)",
            p(&bare_first, 50.0),
            p(&bare_first, 99.0)
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            load: Duration::from_secs(2),
            // 320 TTFTs per step: the p99 is then the fourth largest, not nearly the maximum.
            timing_requests: 40,
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
