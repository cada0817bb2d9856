//! Client overhead: how many streamed chunks per second one loadgen core can time, and how far
//! its TTFT is from the fixed-time model's configured TTFT at that load.
//!
//! Run with: `cargo bench -p loadgen --bench client_overhead` (a few seconds).
//!
//! The embedded mockserve runs on its own runtime (one worker thread); the loadgen driver runs on
//! a current-thread runtime, so it has one core.
//! 1. `--speedup-ratio inf`: 64 closed-loop users, 256 output tokens per request: the server is
//!    never the bottleneck, so chunks timed per second of wall time is the client's ceiling.
//! 2. `--fixed-latency 20,5` at speed 1: rounds of 64 simultaneous requests (8 output tokens)
//!    over 64 round-robin workers, so every request finds an idle worker and the engine's TTFT is
//!    exactly one prefill pass, 20 ms, with no queueing; the report is the client's TTFT minus
//!    20 ms: client, HTTP and timer overhead at that load.
//! 3. `--speedup-ratio inf`: 32 closed-loop users, 128-token prompts, 32 output tokens (the
//!    shape of `scripts/capacity.sh`): requests/s against mockserve, and the client thread's CPU
//!    time per request (Linux: from `/proc/thread-self/stat`), the client's cost of one request.

use std::sync::Arc;
use std::time::Duration;

use loadgen::client::{self, Endpoint, Response};
use loadgen::driver::{self, DriverConfig, Planned, Script, Start};
use mock_server::args::EngineArgs;
use mock_server::cmd::serve::ServeArgs;
use mock_server::config::{ReasoningFormat, ServerConfig};

const USERS: usize = 64;

struct Rounds {
    body: Arc<serde_json::Value>,
    offsets: Vec<Duration>,
    next: usize,
}

impl Script for Rounds {
    fn first_start(&self) -> Duration {
        self.offsets[0]
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let at = *self.offsets.get(self.next)?;
        self.next += 1;
        Some(Planned {
            start: Start::At(at),
            body: (*self.body).clone(),
        })
    }
}

struct Closed {
    body: Arc<serde_json::Value>,
    left: usize,
}

impl Script for Closed {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Planned {
            start: Start::After(Duration::ZERO),
            body: (*self.body).clone(),
        })
    }
}

fn server(flags: &[&str]) -> ServerConfig {
    use clap::Parser;
    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        engine: EngineArgs,
    }
    let mut argv = vec!["x"];
    argv.extend_from_slice(flags);
    let engine = P::try_parse_from(argv).expect("engine flags").engine;
    ServerConfig::from_args(&ServeArgs {
        host: "127.0.0.1".into(),
        port: 0,
        model_name: "m".into(),
        max_model_len: 1 << 20,
        api_key: None,
        max_waiting: None,
        max_inflight_bytes: mock_server::config::DEFAULT_MAX_INFLIGHT_BYTES,
        reasoning_ratio: 0.0,
        reasoning_format: ReasoningFormat::Separate,
        default_max_tokens: 16,
        output_length_dist: Default::default(),
        stop_probability: mock_server::config::DEFAULT_STOP_PROBABILITY,
        tool_call_probability: mock_server::config::DEFAULT_TOOL_CALL_PROBABILITY,
        max_body_bytes: 1 << 24,
        tokenizer: None,
        http: Default::default(),
        faults: Default::default(),
        engine,
    })
    .expect("server config")
}

fn body(max_tokens: usize) -> Arc<serde_json::Value> {
    body_of(16, max_tokens)
}

/// A streamed completion body of `words` times "hello world " (two tokens each).
fn body_of(words: usize, max_tokens: usize) -> Arc<serde_json::Value> {
    Arc::new(serde_json::json!({
        "model": "m", "prompt": "hello world ".repeat(words), "max_tokens": max_tokens,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true},
    }))
}

fn run(config: ServerConfig, scripts: Vec<Box<dyn Script>>) -> driver::DriverOutput {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("server runtime");
    let listener = server_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    server_rt.spawn(mock_server::cmd::serve::serve(listener, config, async {
        let _ = stopped.await;
    }));
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let out = client_rt
        .block_on(async {
            let endpoint = Endpoint {
                client: client::client(Duration::from_secs(60)).expect("client"),
                url: format!("http://{addr}/v1/completions"),
                wire: client::Wire::OpenAi,
                api_key: None,
                max_line_bytes: loadgen::sse::DEFAULT_MAX_LINE_BYTES,
            };
            driver::drive(endpoint, scripts, &DriverConfig::default()).await
        })
        .expect("drive");
    let _ = stop.send(());
    server_rt.shutdown_timeout(Duration::from_secs(1));
    out
}

/// CPU time (user + system) the calling thread has used so far; None where
/// `/proc/thread-self/stat` cannot be read (not Linux).
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel's USER_HZ is 100 on every Linux ABI.
    Some(Duration::from_millis(ticks * 10))
}

fn main() {
    // 1. Throughput ceiling.
    let scripts = (0..USERS)
        .map(|_| {
            Box::new(Closed {
                body: body(256),
                left: 8,
            }) as Box<dyn Script>
        })
        .collect();
    let started = std::time::Instant::now();
    let out = run(server(&["--speedup-ratio", "inf"]), scripts);
    let wall = started.elapsed().as_secs_f64();
    let chunks: usize = out
        .samples
        .iter()
        .map(|s| s.response.timing.token_chunks_us.len())
        .sum();
    let failed = out
        .samples
        .iter()
        .filter(|s| s.response.failure.is_some())
        .count();
    println!(
        "client_overhead/chunks: {USERS} users, {} requests ({failed} failed), {chunks} chunks in {wall:.2} s = {:.0} chunks/s on one client core",
        out.samples.len(),
        chunks as f64 / wall
    );

    // 2. TTFT error against the fixed model.
    let rounds: Vec<Duration> = (0..5)
        .map(|r| Duration::from_millis(50 + 150 * r))
        .collect();
    let scripts = (0..USERS)
        .map(|_| {
            Box::new(Rounds {
                body: body(8),
                offsets: rounds.clone(),
                next: 0,
            }) as Box<dyn Script>
        })
        .collect();
    let out = run(
        server(&[
            "--fixed-latency",
            "20,5",
            "--num-workers",
            &USERS.to_string(),
            "--router-mode",
            "round-robin",
        ]),
        scripts,
    );
    let mut err: Vec<f64> = out
        .samples
        .iter()
        .filter(|s| s.response.failure.is_none())
        .filter_map(|s| {
            s.response
                .timing
                .first_answer_us
                .map(|t| (t + s.lag_us()) as f64 / 1000.0 - 20.0)
        })
        .collect();
    let d = servesim::metrics::Distribution::from_samples(&mut err);
    println!(
        "client_overhead/ttft_error: {} requests in rounds of {USERS}, TTFT - 20 ms configured: mean {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        err.len(),
        d.mean,
        d.median,
        d.p99,
        d.max
    );

    // 3. Requests per second at the capacity script's shape, and the client's CPU per request.
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this once, briefly.
    const RPS_USERS: usize = 32;
    let rps_requests = if std::env::args().any(|a| a == "--bench") {
        250
    } else {
        10
    };
    let scripts = (0..RPS_USERS)
        .map(|_| {
            Box::new(Closed {
                body: body_of(64, 32),
                left: rps_requests,
            }) as Box<dyn Script>
        })
        .collect();
    let cpu_before = thread_cpu();
    let out = run(server(&["--speedup-ratio", "inf"]), scripts);
    // From the driver's start to the last completion (server start-up and shutdown left out).
    let wall = out.duration.as_secs_f64();
    let cpu = cpu_before
        .zip(thread_cpu())
        .map(|(a, b)| b.saturating_sub(a));
    let ok = out
        .samples
        .iter()
        .filter(|s| s.response.failure.is_none())
        .count();
    let per_request = match cpu {
        Some(cpu) => format!(
            ", client CPU {:.0} us per request",
            cpu.as_secs_f64() * 1e6 / out.samples.len().max(1) as f64
        ),
        None => String::new(),
    };
    println!(
        "client_overhead/requests: {RPS_USERS} users, ~128-token prompts, 32 output tokens: {} requests ({} failed) in {wall:.2} s = {:.0} requests/s against mockserve --speedup-ratio inf{per_request}",
        out.samples.len(),
        out.samples.len() - ok,
        ok as f64 / wall
    );
}
