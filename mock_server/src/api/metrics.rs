//! `GET /metrics`: request counters kept by the handlers plus the engine's live state, in the
//! Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

/// Counters the HTTP layer keeps (the engine's own state comes from its snapshot).
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// `POST /v1/chat/completions` received.
    pub chat_requests: AtomicU64,
    /// `POST /v1/completions` received.
    pub completion_requests: AtomicU64,
    /// Requests that ran to their output limit.
    pub finished: AtomicU64,
    /// Requests answered with an error (before or during the stream).
    pub failed: AtomicU64,
    /// Requests refused because the queue was full.
    pub overloaded: AtomicU64,
    /// Prompt tokens of submitted client requests.
    pub prompt_tokens: AtomicU64,
    /// Output tokens sent to clients.
    pub generation_tokens: AtomicU64,
    /// Speculative prefills submitted.
    pub speculative_prefills: AtomicU64,
}

impl ServerMetrics {
    /// Counts an error response and returns it.
    pub fn fail(&self, e: ApiError) -> Response {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if e.status == axum::http::StatusCode::TOO_MANY_REQUESTS {
            self.overloaded.fetch_add(1, Ordering::Relaxed);
        }
        e.into_response()
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP mockserve_{name} {help}");
    let _ = writeln!(out, "# TYPE mockserve_{name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "mockserve_{name}{labels} {value}");
    }
}

/// Renders every metric.
pub async fn handler(State(state): State<AppState>) -> Response {
    let live = match state.engine.snapshot().await {
        Ok(live) => live,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let m = &state.metrics;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64;
    let model = &state.config.model_name;
    let mut out = String::new();
    metric(
        &mut out,
        "requests_total",
        "counter",
        "Requests received by endpoint.",
        &[
            (
                format!("{{endpoint=\"chat\",model_name=\"{model}\"}}"),
                get(&m.chat_requests),
            ),
            (
                format!("{{endpoint=\"completions\",model_name=\"{model}\"}}"),
                get(&m.completion_requests),
            ),
        ],
    );
    let simple: [(&str, &str, &AtomicU64); 6] = [
        (
            "request_success_total",
            "Requests that ran to their output limit.",
            &m.finished,
        ),
        (
            "request_failure_total",
            "Requests answered with an error.",
            &m.failed,
        ),
        (
            "request_overloaded_total",
            "Requests refused because the waiting queue was full.",
            &m.overloaded,
        ),
        (
            "prompt_tokens_total",
            "Prompt tokens of client requests.",
            &m.prompt_tokens,
        ),
        (
            "generation_tokens_total",
            "Output tokens sent to clients.",
            &m.generation_tokens,
        ),
        (
            "speculative_prefills_total",
            "Speculative next-turn prefills submitted.",
            &m.speculative_prefills,
        ),
    ];
    for (name, help, counter) in simple {
        metric(
            &mut out,
            name,
            "counter",
            help,
            &[(String::new(), get(counter))],
        );
    }
    metric(
        &mut out,
        "request_cancelled_total",
        "counter",
        "Requests cancelled because the client went away.",
        &[(String::new(), live.cancelled as f64)],
    );
    metric(
        &mut out,
        "prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache (first admission).",
        &[(String::new(), live.prefix_hit_tokens as f64)],
    );
    metric(
        &mut out,
        "active_requests",
        "gauge",
        "Requests submitted to the engine and not done.",
        &[(String::new(), live.cluster.active_requests as f64)],
    );
    metric(
        &mut out,
        "router_parked_requests",
        "gauge",
        "Requests waiting at the router.",
        &[(String::new(), live.cluster.parked as f64)],
    );
    metric(
        &mut out,
        "kv_transfers_total",
        "counter",
        "Disaggregated prefill-to-decode KV hand-offs started.",
        &[(String::new(), live.cluster.kv_transfers as f64)],
    );
    metric(
        &mut out,
        "kv_transfer_seconds_total",
        "counter",
        "Simulated time spent moving prompt KV from prefill to decode workers.",
        &[(String::new(), live.cluster.kv_transfer_us as f64 / 1e6)],
    );
    metric(
        &mut out,
        "kv_transfers_in_flight",
        "gauge",
        "KV hand-offs in flight.",
        &[(String::new(), live.cluster.kv_transfers_in_flight as f64)],
    );
    // Per-pool utilisation: simulated pass time per worker of the pool since the start.
    let mut pools: Vec<(String, f64)> = Vec::new();
    for w in &live.cluster.workers {
        let label = format!("{{pool=\"{}\"}}", w.role);
        match pools.iter_mut().find(|(l, _)| *l == label) {
            Some((_, busy)) => *busy += w.busy_us as f64 / 1e6,
            None => pools.push((label, w.busy_us as f64 / 1e6)),
        }
    }
    metric(
        &mut out,
        "pool_busy_seconds_total",
        "counter",
        "Simulated seconds the workers of each pool spent in passes (divide by uptime and \
         worker count for utilisation).",
        &pools,
    );
    type Sample = fn(&servesim::worker::WorkerStats) -> f64;
    let per_worker: [(&str, &str, &str, Sample); 8] = [
        ("num_requests_running", "gauge", "Running requests.", |w| {
            w.scheduler.running as f64
        }),
        ("num_requests_waiting", "gauge", "Waiting requests.", |w| {
            w.scheduler.waiting as f64
        }),
        (
            "kv_cache_usage_perc",
            "gauge",
            "Share of KV blocks held by running requests.",
            |w| w.scheduler.active_blocks as f64 / w.num_gpu_blocks.max(1) as f64,
        ),
        (
            "kv_cache_cached_blocks",
            "gauge",
            "KV blocks cached but held by no request.",
            |w| w.scheduler.inactive_blocks as f64,
        ),
        ("num_preemptions_total", "counter", "Preemptions.", |w| {
            w.scheduler.preemptions as f64
        }),
        (
            "g2_resident_blocks",
            "gauge",
            "KV blocks resident in the host tier (G2).",
            |w| w.scheduler.g2_resident_blocks as f64,
        ),
        (
            "g2_onboarded_blocks_total",
            "counter",
            "KV blocks onboarded from the host tier.",
            |w| w.scheduler.g2_onboarded_blocks as f64,
        ),
        (
            "worker_busy_seconds_total",
            "counter",
            "Simulated seconds spent in passes.",
            |w| w.busy_us as f64 / 1e6,
        ),
    ];
    for (name, kind, help, sample) in per_worker {
        let samples: Vec<(String, f64)> = live
            .cluster
            .workers
            .iter()
            .map(|w| (format!("{{worker=\"{}\"}}", w.worker.0), sample(w)))
            .collect();
        metric(&mut out, name, kind, help, &samples);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}
