//! The HTTP path of `mockserve`: streamed tokens per second and requests per second on loopback
//! with `--speedup-ratio inf` (the engine costs no simulated time), against a bare axum endpoint
//! that streams the same number of SSE events with the same client, plus how closely observed
//! TTFT and inter-token gaps of concurrent streams follow `--fixed-latency 20,5` and
//! `--fixed-latency 20,0.5` (decode steps shorter than tokio's 1 ms timer tick), against the
//! same schedule kept by a bare endpoint paced by one precise timer (the timing baseline: the
//! HTTP path, the timer and the host, without the engine), the timer's own lateness and the
//! host's pauses.
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
use mock_server::test_kit::TestServer;
use mock_server::timer::PreciseTimer;
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
    /// How long every core spins to catch the host's pauses.
    pause_probe: Duration,
    /// Waits in each check of the timer's own lateness.
    timer_waits: usize,
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

/// The baseline: parses the JSON body and streams a role chunk, `max_tokens` token chunks, a
/// finish chunk and `[DONE]`, each a serialised chat chunk, with no engine behind it.
async fn bare_handler(body: Bytes) -> Response {
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let n = request["max_tokens"].as_u64().unwrap_or(16) as usize;
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        Ok::<_, std::convert::Infallible>(Bytes::from(bare_chunk(delta, finish)))
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

/// One SSE event of the bare endpoint: a chat chunk built as a `serde_json::Value`.
fn bare_chunk(delta: serde_json::Value, finish: Option<&str>) -> String {
    let value = json!({"id": "chatcmpl-bare", "object": "chat.completion.chunk",
        "created": 0, "model": "mock-model", "system_fingerprint": "fp_bare",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
    format!("data: {value}\n\n")
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

/// The modelled prefill of the timing checks, ms (`--fixed-latency 20,<step>`).
const PREFILL_MS: f64 = 20.0;

/// Turns each server takes in a timing check.
const TIMING_ROUNDS: usize = 4;

/// How closely the tokens of `CONCURRENCY` concurrent streams follow their schedule, at one
/// decode step, on one server (each list sorted once [`Timing::merge`] has made it).
#[derive(Default)]
struct Timing {
    /// |observed TTFT - modelled TTFT| per request, ms.
    ttft_err: Vec<f64>,
    /// |observed inter-token gap - step| per gap, ms.
    gap_err: Vec<f64>,
    /// Observed inter-token gaps, ms.
    gaps: Vec<f64>,
    /// Arrival of the role chunk (sent at once) after the request was sent, ms: the share of
    /// the TTFT error that is the HTTP round trip, not the token's delivery.
    role: Vec<f64>,
}

impl Timing {
    /// The figures of several checks together, sorted.
    fn merge(parts: Vec<Timing>) -> Timing {
        let mut all = Timing::default();
        for part in parts {
            all.ttft_err.extend(part.ttft_err);
            all.gap_err.extend(part.gap_err);
            all.gaps.extend(part.gaps);
            all.role.extend(part.role);
        }
        for v in [
            &mut all.ttft_err,
            &mut all.gap_err,
            &mut all.gaps,
            &mut all.role,
        ] {
            v.sort_by(f64::total_cmp);
        }
        all
    }
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

/// `requests` requests of `tokens` tokens on each of `CONCURRENCY` concurrent streams (stream
/// `i` sends `bodies[i]`) at `--fixed-latency 20,<step_ms>` pacing; the modelled TTFT of a
/// response is `model_ttft` of its finish event (ms).
async fn timed_streams(
    addr: SocketAddr,
    bodies: Vec<serde_json::Value>,
    step_ms: f64,
    tokens: usize,
    requests: usize,
    model_ttft: fn(&serde_json::Value) -> Option<f64>,
) -> Result<Timing> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = format!("http://{addr}/v1/chat/completions");
    let streams: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                // Warm the connection.
                stream_events(&client, &url, &body, Instant::now()).await?;
                let (mut ttft_err, mut gaps, mut role) = (Vec::new(), Vec::new(), Vec::new());
                for _ in 0..requests {
                    let t0 = Instant::now();
                    let events = stream_events(&client, &url, &body, t0).await?;
                    // Role, tokens, finish, [DONE].
                    if events.len() != tokens + 3 {
                        bail!("expected {} events, got {}", tokens + 3, events.len());
                    }
                    let finish: serde_json::Value = serde_json::from_str(
                        events[tokens + 1]
                            .1
                            .strip_prefix("data: ")
                            .context("not data")?,
                    )?;
                    let model = model_ttft(&finish).context("no modelled TTFT")?;
                    let times: Vec<f64> = events[1..=tokens]
                        .iter()
                        .map(|(t, _)| t.as_secs_f64() * 1e3)
                        .collect();
                    ttft_err.push((times[0] - model).abs());
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
    let gap_err = gaps.iter().map(|g| (g - step_ms).abs()).collect();
    Ok(Timing {
        ttft_err,
        gap_err,
        gaps,
        role,
    })
}

/// The two servers of a timing check at one decode step: mockserve with `CONCURRENCY` workers
/// running `--fixed-latency 20,<step_ms>` (stream `i` pinned to worker `i`, so every gap of the
/// model is one step, and its TTFT is the response's `nvext.timing.ttft_ms`), and the paced
/// bare endpoint, whose every TTFT is exactly the prefill.
struct TimedServers {
    mockserve: SocketAddr,
    bare: SocketAddr,
    /// The mockserve server (dropping it stops it) and the bare one's stop.
    _stops: (TestServer, tokio::sync::oneshot::Sender<()>),
}

impl TimedServers {
    async fn start(step_ms: f64) -> Result<TimedServers> {
        let mut cluster = ClusterConfig {
            num_workers: CONCURRENCY,
            ..ClusterConfig::default()
        };
        cluster.engine.latency.model = Arc::new(Fixed {
            prefill_ms: PREFILL_MS,
            decode_ms: step_ms,
        });
        let mock = TestServer::start(ServerConfig::new(cluster)).await?;
        let (bare, bare_stop) = start_paced_bare(step_ms).await?;
        Ok(TimedServers {
            mockserve: mock.addr,
            bare,
            _stops: (mock, bare_stop),
        })
    }

    async fn mockserve(&self, step_ms: f64, tokens: usize, requests: usize) -> Result<Timing> {
        let bodies = (0..CONCURRENCY)
            .map(|worker| {
                let mut body = body(tokens);
                body["nvext"] = json!({"backend_instance_id": worker, "extra_fields": ["timing"]});
                body
            })
            .collect();
        timed_streams(
            self.mockserve,
            bodies,
            step_ms,
            tokens,
            requests,
            |finish| finish["nvext"]["timing"]["ttft_ms"].as_f64(),
        )
        .await
    }

    async fn bare(&self, step_ms: f64, tokens: usize, requests: usize) -> Result<Timing> {
        let bodies = vec![body(tokens); CONCURRENCY];
        timed_streams(self.bare, bodies, step_ms, tokens, requests, |_| {
            Some(PREFILL_MS)
        })
        .await
    }
}

/// A stream's ask of the pacer: wake me at this instant.
type Ask = (Instant, tokio::sync::oneshot::Sender<()>);

/// One wake-up the pacer owes: fire `fire` at `at` (ordered so that a max-heap pops the
/// earliest first, in the order they were asked for).
struct Due {
    at: Instant,
    seq: u64,
    fire: tokio::sync::oneshot::Sender<()>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The paced baseline's clock, built as mockserve's driver wakes (one task sleeping on one
/// [`PreciseTimer`] until the earliest deadline of every stream, then waking the streams that
/// are due), with no engine behind it.
async fn pacer(mut asks: tokio::sync::mpsc::UnboundedReceiver<Ask>) {
    let Ok(timer) = PreciseTimer::start() else {
        eprintln!("http_path: no timer thread for the paced endpoint");
        return;
    };
    let mut due = std::collections::BinaryHeap::new();
    let mut seq = 0u64;
    // The wake-up asked of the timer, kept while the earliest deadline stays the same: as the
    // driver does, a later deadline costs the timer thread nothing.
    let mut planned: Option<Instant> = None;
    let mut sleep: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
        Box::pin(std::future::pending());
    loop {
        let now = Instant::now();
        while due.peek().is_some_and(|d: &Due| d.at <= now) {
            if let Some(d) = due.pop() {
                let _ = d.fire.send(());
            }
        }
        let next = due.peek().map(|d| d.at);
        if next != planned {
            planned = next;
            sleep = match next {
                Some(at) => Box::pin(timer.sleep_until(at)),
                None => Box::pin(std::future::pending()),
            };
        }
        tokio::select! {
            biased;
            ask = asks.recv() => match ask {
                Some((at, fire)) => {
                    due.push(Due { at, seq, fire });
                    seq += 1;
                }
                None => return,
            },
            () = &mut sleep => {
                // Done: never polled again.
                sleep = Box::pin(std::future::pending());
                planned = None;
            }
        }
    }
}

/// The paced baseline: streams the bare endpoint's events on the schedule of
/// `--fixed-latency 20,<step>`, from the moment the request was whole: the role chunk at once,
/// token `i` at 20 ms + `i` steps, then the finish and `[DONE]`.
async fn paced_handler(
    axum::extract::State((asks, step)): axum::extract::State<(
        tokio::sync::mpsc::UnboundedSender<Ask>,
        Duration,
    )>,
    body: Bytes,
) -> Response {
    let received = Instant::now();
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let n = request["max_tokens"].as_u64().unwrap_or(16) as usize;
    let first = received + Duration::from_secs_f64(PREFILL_MS / 1e3);
    let events = futures_util::stream::unfold(0usize, move |i| {
        let asks = asks.clone();
        async move {
            let data = if i == 0 {
                bare_chunk(json!({"role": "assistant", "content": ""}), None)
            } else if i <= n {
                let (fire, fired) = tokio::sync::oneshot::channel();
                let at = first + step * (i as u32 - 1);
                if asks.send((at, fire)).is_err() || fired.await.is_err() {
                    return None;
                }
                bare_chunk(json!({"content": format!(" word{i}")}), None)
            } else if i == n + 1 {
                bare_chunk(json!({}), Some("length"))
            } else if i == n + 2 {
                "data: [DONE]\n\n".to_string()
            } else {
                return None;
            };
            Some((Ok::<_, std::convert::Infallible>(Bytes::from(data)), i + 1))
        }
    });
    let mut response = Body::from_stream(events).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

async fn start_paced_bare(step_ms: f64) -> Result<(SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let (asks, asked) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(pacer(asked));
    let step = Duration::from_secs_f64(step_ms / 1e3);
    spawn_server(move |listener, stopped| async move {
        let listener = listener.tap_io(|s| {
            let _ = s.set_nodelay(true);
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(paced_handler))
            .with_state((asks, step));
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
    })
    .await
}

/// How late a [`PreciseTimer`] wait wakes its task: `waits` waits, each `gap` from when it was
/// asked for, µs, sorted.
async fn timer_lateness(gap: Duration, waits: usize) -> Result<Vec<f64>> {
    let timer = PreciseTimer::start()?;
    let mut late = Vec::with_capacity(waits);
    for _ in 0..waits {
        let deadline = Instant::now() + gap;
        timer.sleep_until(deadline).await;
        late.push((Instant::now() - deadline).as_secs_f64() * 1e6);
    }
    late.sort_by(f64::total_cmp);
    Ok(late)
}

/// Pauses of the host, seen by spinning on every core at once for `span`: per core, how many
/// times the clock jumped by more than 0.5 ms between two reads (a time the core was taken
/// away), and the longest jump, ms.
fn host_pauses(span: Duration) -> Vec<(usize, f64)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spinners: Vec<_> = (0..cores)
        .map(|_| {
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                let (mut last, mut pauses, mut longest) = (start, 0usize, Duration::ZERO);
                while last - start < span {
                    let now = std::time::Instant::now();
                    let jump = now - last;
                    if jump > Duration::from_micros(500) {
                        pauses += 1;
                        longest = longest.max(jump);
                    }
                    last = now;
                }
                (pauses, longest.as_secs_f64() * 1e3)
            })
        })
        .collect();
    spinners.into_iter().filter_map(|s| s.join().ok()).collect()
}

async fn run(settings: Settings) -> Result<()> {
    let mut cluster = ClusterConfig::default();
    cluster.engine.latency.speedup_ratio = f64::INFINITY;
    let mock = TestServer::start(ServerConfig::new(cluster)).await?;
    let mock_addr = mock.addr;
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
    let pauses = host_pauses(settings.pause_probe);
    println!(
        "host: pauses of over 0.5 ms seen spinning on each core for {:.2} s: {}",
        settings.pause_probe.as_secs_f64(),
        pauses
            .iter()
            .map(|(n, longest)| format!("{n} (longest {longest:.2} ms)"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut lateness = Vec::new();
    for gap_us in [300, 3000] {
        let late = timer_lateness(Duration::from_micros(gap_us), settings.timer_waits).await?;
        lateness.push(format!(
            "{} ms apart, p50 {:.0} / p99 {:.0} us",
            gap_us as f64 / 1e3,
            percentile(&late, 50.0),
            percentile(&late, 99.0)
        ));
    }
    println!(
        "timer: how late a task woke from a PreciseTimer wait ({} waits each): {}",
        settings.timer_waits,
        lateness.join("; ")
    );
    for (step_ms, tokens) in [(5.0, 20), (0.5, 100)] {
        // The two servers take turns, a few requests per stream each, so that both see the
        // machine in the same state.
        let rounds = settings.timing_requests.clamp(1, TIMING_ROUNDS);
        let per_round = settings.timing_requests.div_ceil(rounds);
        let servers = TimedServers::start(step_ms).await?;
        let (mut mock, mut bare) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            mock.push(servers.mockserve(step_ms, tokens, per_round).await?);
            bare.push(servers.bare(step_ms, tokens, per_round).await?);
        }
        let (mock, bare) = (Timing::merge(mock), Timing::merge(bare));
        println!(
            "timing, --fixed-latency 20,{step_ms}: {CONCURRENCY} concurrent streams x {} requests \
             x {tokens} tokens; mockserve on {CONCURRENCY} workers (one per stream) against the \
             paced bare endpoint (the same schedule from one precise timer, no engine), taking \
             turns; |observed - modelled|, ms:",
            rounds * per_round
        );
        println!(
            "  {:<32} {:>24} {:>24}",
            "", "mockserve", "paced bare endpoint"
        );
        let spread = |v: &[f64]| {
            format!(
                "{:.3} / {:.3} / {:.3}",
                percentile(v, 50.0),
                percentile(v, 99.0),
                v.last().copied().unwrap_or(f64::NAN)
            )
        };
        let rows = [
            (
                "TTFT error p50 / p99 / max",
                spread(&mock.ttft_err),
                spread(&bare.ttft_err),
            ),
            (
                "gap error p50 / p99 / max",
                spread(&mock.gap_err),
                spread(&bare.gap_err),
            ),
            (
                "median gap (the step: no bursts)",
                format!("{:.3}", percentile(&mock.gaps, 50.0)),
                format!("{:.3}", percentile(&bare.gaps, 50.0)),
            ),
            (
                "role chunk after p50 / p99",
                format!(
                    "{:.3} / {:.3}",
                    percentile(&mock.role, 50.0),
                    percentile(&mock.role, 99.0)
                ),
                format!(
                    "{:.3} / {:.3}",
                    percentile(&bare.role, 50.0),
                    percentile(&bare.role, 99.0)
                ),
            ),
        ];
        for (name, m, b) in rows {
            println!("  {name:<32} {m:>24} {b:>24}");
        }
        println!(
            "  (n = {} TTFTs and {} gaps each; the role chunk, sent at once, is the HTTP round \
             trip in the TTFT error)",
            mock.ttft_err.len(),
            mock.gap_err.len()
        );
    }
    Ok(())
}

/// The `q`th percentile of sorted `v` (NaN when empty).
fn percentile(v: &[f64], q: f64) -> f64 {
    Distribution::percentile(v, q).unwrap_or(f64::NAN)
}

fn main() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            load: Duration::from_secs(2),
            // 320 TTFTs per step: the p99 is then the fourth largest, not nearly the maximum.
            timing_requests: 40,
            pause_probe: Duration::from_millis(500),
            timer_waits: 400,
        }
    } else {
        Settings {
            load: Duration::from_millis(200),
            timing_requests: 2,
            pause_probe: Duration::from_millis(20),
            timer_waits: 10,
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(settings))
}
