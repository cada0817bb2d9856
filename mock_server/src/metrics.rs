//! The server's Prometheus metrics ([`Metrics`]): vLLM's metric set, per simulated worker as
//! vLLM labels its data-parallel engines (`model_name`, `engine`; vLLM's bucket boundaries, so
//! dashboards and routers built for vLLM read them unchanged), plus `servesim_*` router, HTTP,
//! speculative-prefill and KV-event series (label `worker`).
//!
//! Built on `prometheus-client`, which writes metric names as given, so vLLM's `vllm:` names
//! (valid in both the Prometheus and the OpenMetrics text formats) come out unescaped. Counters are
//! registered without their `_total` suffix; the encoder appends it to the samples. Token
//! counters and latency histograms are fed by the driver task, which sees every engine
//! output; gauges are set from the cluster's snapshot when `/metrics` is scraped.
//!
//! With many workers the exposition is large (about 25 MB and 280,000 lines at 1,024 workers)
//! and costly to build, so [`Metrics::encode`] builds it off the runtime's worker threads
//! (`block_in_place`), one build at a time, and an exposition that took at least
//! `REUSE_THRESHOLD` to build is served again to scrapes that arrive within
//! `REUSE_FACTOR` times its build time: however many clients scrape, building costs at most
//! about a quarter of one core. A scrape after a quiet spell, and every scrape of a server whose
//! exposition builds faster than the threshold, gets a fresh build.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use servesim::cluster::ClusterStats;
use servesim::ids::WorkerId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use tokio::time::Instant;

/// The per-worker label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// Worker index.
    pub worker: u32,
}

impl From<WorkerId> for WorkerLabel {
    fn from(w: WorkerId) -> WorkerLabel {
        WorkerLabel { worker: w.0 }
    }
}

/// vLLM's label set of an engine's series: the served model and the engine (data-parallel
/// rank: the simulated worker).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabel {
    /// The served (base) model.
    pub model_name: String,
    /// The worker's index.
    pub engine: u32,
}

/// `vllm:request_success`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedLabel {
    /// The served (base) model.
    pub model_name: String,
    /// The worker's index.
    pub engine: u32,
    /// `length` (the engine always runs to the output limit).
    pub finished_reason: &'static str,
}

/// `vllm:cache_config_info`'s labels: the KV-cache settings, as strings, as vLLM reports them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheConfigLabel {
    /// The worker's index.
    pub engine: u32,
    /// Tokens per block.
    pub block_size: String,
    /// `auto`.
    pub cache_dtype: &'static str,
    /// `True` or `False`, as Python prints it.
    pub enable_prefix_caching: &'static str,
    /// vLLM's default, 0.9 (nothing is allocated here).
    pub gpu_memory_utilization: &'static str,
    /// Host-memory blocks (the G2 tier's, else 0).
    pub num_cpu_blocks: String,
    /// KV blocks per worker.
    pub num_gpu_blocks: String,
}

/// `vllm:lora_requests_info`'s labels, as vLLM reports them: comma-separated adapter names.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoraInfoLabel {
    /// Adapters of running requests.
    pub running_lora_adapters: String,
    /// Adapters of waiting requests.
    pub waiting_lora_adapters: String,
    /// `--max-loras`.
    pub max_lora: String,
}

/// A LoRA adapter's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterLabel {
    /// The adapter's served name.
    pub adapter: String,
}

/// The HTTP endpoint label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// `chat` or `completions`.
    pub endpoint: &'static str,
}

/// Why a speculative prefill was not submitted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabel {
    /// `in_flight_limit` or `queue_full`.
    pub reason: &'static str,
}

/// The label of a fault injected on the KV event plane (`--kv-events-faults`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvFaultLabel {
    /// Worker index.
    pub worker: u32,
    /// `drop`, `duplicate`, `reorder` or `delay`.
    pub fault: &'static str,
}

/// The injected-fault label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabel {
    /// The fault type's name (`rate-limit`, `stream-cut`, ...).
    pub r#type: &'static str,
}

/// Skip reason: `crate::driver::state::MAX_SPECULATIVE_PREFILLS` already running.
pub(crate) const SKIP_IN_FLIGHT: &str = "in_flight_limit";
/// `finished_reason` of a request that ran to its output limit.
pub(crate) const FINISHED_LENGTH: &str = "length";

/// Skip reason: the `--max-waiting` queue is full.
pub(crate) const SKIP_QUEUE_FULL: &str = "queue_full";

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// `servesim_token_lateness_seconds` buckets: 50 µs to 10 s.
pub(crate) const LATENESS_BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// `vllm:iteration_tokens_total` buckets (vLLM's default CUDA-graph capture sizes).
const ITERATION_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to the limit.
pub(crate) fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exponent = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * exponent;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        exponent = match exponent.checked_mul(10) {
            Some(e) => e,
            None => return out,
        };
    }
}

/// Builds token-count histograms with the 1-2-5 buckets up to the context length.
#[derive(Clone, Debug)]
pub struct TokenBuckets(Vec<f64>);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for TokenBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

fn iteration_histogram() -> Histogram {
    Histogram::new(ITERATION_BUCKETS)
}

fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
fn itl_histogram() -> Histogram {
    Histogram::new(ITL_BUCKETS)
}
fn e2e_histogram() -> Histogram {
    Histogram::new(E2E_BUCKETS)
}

/// Every metric the server exposes. Handles are cheap clones sharing the same atomics.
#[derive(Debug)]
pub struct Metrics {
    /// The registry that encodes them all.
    registry: Registry,
    /// `vllm:num_requests_running` (gauge, from the snapshot).
    pub running: Family<EngineLabel, Gauge>,
    /// `vllm:num_requests_waiting` (gauge, from the snapshot).
    pub waiting: Family<EngineLabel, Gauge>,
    /// `vllm:kv_cache_usage_perc`: share (0..1) of KV blocks held by requests.
    pub kv_usage: Family<EngineLabel, Gauge<f64, AtomicU64>>,
    /// `vllm:prefix_cache_queries`: prompt tokens looked up in the prefix cache, per admission.
    pub prefix_queries: Family<EngineLabel, Counter>,
    /// `vllm:prefix_cache_hits`: prompt tokens found there.
    pub prefix_hits: Family<EngineLabel, Counter>,
    /// `vllm:prompt_tokens`: prompt tokens of requests that produced their first token.
    pub prompt_tokens: Family<EngineLabel, Counter>,
    /// `vllm:generation_tokens`: output tokens.
    pub generation_tokens: Family<EngineLabel, Counter>,
    /// `vllm:num_preemptions`.
    pub preemptions: Family<EngineLabel, Counter>,
    /// `vllm:time_to_first_token_seconds`, from submission to the first token.
    pub ttft: HistogramFamily<EngineLabel>,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: HistogramFamily<EngineLabel>,
    /// `vllm:e2e_request_latency_seconds`, from submission to the last token.
    pub e2e: HistogramFamily<EngineLabel>,
    /// `vllm:request_success`: finished requests, by `finished_reason` (`length` or `stop`).
    pub success: Family<FinishedLabel, Counter>,
    /// `vllm:request_time_per_output_token_seconds`: per request, decode time per output
    /// token after the first.
    pub tpot: HistogramFamily<EngineLabel>,
    /// `vllm:request_queue_time_seconds`: submission to first admission.
    pub queue_time: HistogramFamily<EngineLabel>,
    /// `vllm:request_prefill_time_seconds`: first admission to first token.
    pub prefill_time: HistogramFamily<EngineLabel>,
    /// `vllm:request_decode_time_seconds`: first token to last token.
    pub decode_time: HistogramFamily<EngineLabel>,
    /// `vllm:request_inference_time_seconds`: first admission to last token.
    pub inference_time: HistogramFamily<EngineLabel>,
    /// `vllm:request_prompt_tokens`: prompt length per finished request.
    pub request_prompt_tokens: Family<EngineLabel, Histogram, TokenBuckets>,
    /// `vllm:request_generation_tokens`: output length per finished request.
    pub request_generation_tokens: Family<EngineLabel, Histogram, TokenBuckets>,
    /// `vllm:request_params_max_tokens`: the output limit per finished request.
    pub request_max_tokens: Family<EngineLabel, Histogram, TokenBuckets>,
    /// `vllm:iteration_tokens_total`: tokens per engine step (prefilled prompt tokens of
    /// requests that got their first token plus tokens emitted, per worker and advance).
    pub iteration_tokens: HistogramFamily<EngineLabel>,
    /// `vllm:cache_config_info` (1): the KV-cache settings, per engine.
    pub cache_config_info: Family<CacheConfigLabel, Gauge>,
    /// `vllm:lora_requests_info`: Unix time of the last update, labelled with the adapters
    /// of running and waiting requests.
    pub lora_info: Family<LoraInfoLabel, Gauge<f64, AtomicU64>>,
    /// The model name of the `vllm:*` series.
    pub model_name: String,
    /// `servesim_lora_requests` per adapter: generation requests served under it.
    pub lora_requests: Family<AdapterLabel, Counter>,
    /// `servesim_http_requests`: requests received per endpoint.
    pub http_requests: Family<EndpointLabel, Counter>,
    /// `servesim_http_request_failures`: requests answered with an error (before or mid-stream).
    pub http_failures: Counter,
    /// `servesim_http_requests_overloaded`: refused with 429 (queue full).
    pub overloaded: Counter,
    /// `servesim_requests_cancelled`: cancelled because the client went away.
    pub cancelled: Counter,
    /// `servesim_router_requests`: requests per worker, counted at their first admission.
    pub routed: Family<WorkerLabel, Counter>,
    /// `servesim_router_pinned_requests`: requests pinned to a worker by the client.
    pub pinned: Counter,
    /// `servesim_router_parked_requests` (gauge): requests waiting at the router.
    pub parked: Gauge,
    /// `servesim_active_requests` (gauge): submitted and not done.
    pub active: Gauge,
    /// `servesim_speculative_prefill_submitted`.
    pub spec_submitted: Counter,
    /// `servesim_speculative_prefill_skipped` by reason.
    pub spec_skipped: Family<SkipLabel, Counter>,
    /// `servesim_speculative_prefill_in_flight` (gauge).
    pub spec_in_flight: Gauge,
    /// `servesim_kv_transfers` (gauge, from the snapshot): prefill-to-decode hand-offs done.
    pub kv_transfers: Gauge,
    /// `servesim_kv_transfer_seconds` (gauge, from the snapshot): simulated transfer time.
    pub kv_transfer_seconds: Gauge<f64, AtomicU64>,
    /// `servesim_kv_transfers_in_flight` (gauge).
    pub kv_transfers_in_flight: Gauge,
    /// `servesim_pool_busy_seconds` per pool (aggregated, prefill, decode): simulated time the
    /// pool's workers spent in passes (divide by uptime and worker count for utilisation).
    pub pool_busy_seconds: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    /// `servesim_worker_busy_seconds` per worker.
    pub worker_busy_seconds: Family<WorkerLabel, Gauge<f64, AtomicU64>>,
    /// `servesim_g2_resident_blocks` per worker: blocks in the host-memory tier.
    pub g2_resident_blocks: Family<WorkerLabel, Gauge>,
    /// `servesim_g2_onboarded_blocks` per worker: blocks brought back from the host tier.
    pub g2_onboarded_blocks: Family<WorkerLabel, Gauge>,
    /// `servesim_faults` by type: faults injected (`--fault-rate`, `x-servesim-fault`).
    pub faults: Family<FaultLabel, Counter>,
    /// `servesim_kv_events_published` per worker: KV-event batches published (numbered, kept
    /// for replay and queued for each subscriber).
    pub kv_events_published: Family<WorkerLabel, Counter>,
    /// `servesim_kv_events_dropped` per worker: batches dropped for a subscriber that fell
    /// more than [`crate::kv_events::PEER_QUEUE`] batches behind (its oldest queued one, once
    /// per subscriber that lost it); other subscribers and the engine never wait for it, and
    /// replay can serve the batch.
    pub kv_events_dropped: Family<WorkerLabel, Counter>,
    /// `servesim_kv_events_faults` per worker and fault: batches that met a fault injected
    /// with `--kv-events-faults`.
    pub kv_events_faults: Family<KvFaultLabel, Counter>,
    /// `servesim_kv_events_replayed` per worker: batches the replay endpoint served (a
    /// subscriber recovering a gap).
    pub kv_events_replayed: Family<WorkerLabel, Counter>,
    /// `servesim_kv_events_unknown_blocks`: stored blocks published without their tokens
    /// (a defect: always 0).
    pub kv_events_unknown_blocks: Counter,
    /// `servesim_token_lateness_seconds`: per token handed to a client, how long after its
    /// simulated time (`crate::driver::SimClock`) the handler got it. A host that cannot keep
    /// up with the schedule (too little CPU for the load) shows here: client-side latencies
    /// then include host delay that the engine did not model.
    pub token_lateness: Histogram,
    /// `servesim_behind_schedule_seconds` (gauge): the lateness of the last token handed to a
    /// client.
    pub behind_schedule: Gauge<f64, AtomicU64>,
    /// The length of the last exposition: the next one starts with room for it (with many
    /// workers it runs to megabytes, which growing from empty copies about twice over).
    encoded_len: AtomicUsize,
    /// The last exposition built. A `std` mutex held for a whole build (off the runtime's
    /// worker threads, never across an await), so that scrapes build one at a time and a
    /// scrape that waited can take the build that finished meanwhile.
    exposition: Mutex<Option<Exposition>>,
}

/// An exposition built earlier, kept for the scrapes right after it.
#[derive(Debug)]
struct Exposition {
    /// When its build began.
    started: Instant,
    /// How long the build took.
    took: Duration,
    /// The text.
    text: Bytes,
}

/// Builds that took at least this long are reused (see [`REUSE_FACTOR`]); cheaper ones never.
pub(crate) const REUSE_THRESHOLD: Duration = Duration::from_millis(25);

/// A costly exposition is served again to scrapes arriving within this many times its build
/// time after its build began.
pub(crate) const REUSE_FACTOR: u32 = 4;

/// The serving-pool label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// `aggregated`, `prefill` or `decode`.
    pub pool: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric (all zero), for model `mock-model` and a context of 131072.
    pub fn new() -> Metrics {
        Metrics::for_model("mock-model", 131_072)
    }

    /// The `vllm:*` label of worker `w`.
    pub fn engine(&self, w: WorkerId) -> EngineLabel {
        EngineLabel {
            model_name: self.model_name.clone(),
            engine: w.0,
        }
    }

    /// Registers every metric (all zero); `vllm:*` series carry `model_name`, and token-count
    /// histograms have buckets up to `max_model_len`.
    pub(crate) fn for_model(model_name: &str, max_model_len: usize) -> Metrics {
        let tokens = TokenBuckets(buckets_1_2_5(max_model_len));
        let mut m = Metrics {
            registry: Registry::default(),
            running: Family::default(),
            waiting: Family::default(),
            kv_usage: Family::default(),
            prefix_queries: Family::default(),
            prefix_hits: Family::default(),
            prompt_tokens: Family::default(),
            generation_tokens: Family::default(),
            preemptions: Family::default(),
            ttft: Family::new_with_constructor(ttft_histogram as fn() -> Histogram),
            itl: Family::new_with_constructor(itl_histogram as fn() -> Histogram),
            e2e: Family::new_with_constructor(e2e_histogram as fn() -> Histogram),
            success: Family::default(),
            tpot: Family::new_with_constructor(itl_histogram as fn() -> Histogram),
            queue_time: Family::new_with_constructor(e2e_histogram as fn() -> Histogram),
            prefill_time: Family::new_with_constructor(e2e_histogram as fn() -> Histogram),
            decode_time: Family::new_with_constructor(e2e_histogram as fn() -> Histogram),
            inference_time: Family::new_with_constructor(e2e_histogram as fn() -> Histogram),
            request_prompt_tokens: Family::new_with_constructor(tokens.clone()),
            request_generation_tokens: Family::new_with_constructor(tokens.clone()),
            request_max_tokens: Family::new_with_constructor(tokens),
            iteration_tokens: Family::new_with_constructor(
                iteration_histogram as fn() -> Histogram,
            ),
            cache_config_info: Family::default(),
            lora_info: Family::default(),
            model_name: model_name.to_string(),
            lora_requests: Family::default(),
            http_requests: Family::default(),
            http_failures: Counter::default(),
            overloaded: Counter::default(),
            cancelled: Counter::default(),
            routed: Family::default(),
            pinned: Counter::default(),
            parked: Gauge::default(),
            active: Gauge::default(),
            spec_submitted: Counter::default(),
            spec_skipped: Family::default(),
            spec_in_flight: Gauge::default(),
            kv_transfers: Gauge::default(),
            kv_transfer_seconds: Gauge::default(),
            kv_transfers_in_flight: Gauge::default(),
            pool_busy_seconds: Family::default(),
            worker_busy_seconds: Family::default(),
            g2_resident_blocks: Family::default(),
            g2_onboarded_blocks: Family::default(),
            faults: Family::default(),
            kv_events_published: Family::default(),
            kv_events_dropped: Family::default(),
            kv_events_faults: Family::default(),
            kv_events_replayed: Family::default(),
            kv_events_unknown_blocks: Counter::default(),
            token_lateness: Histogram::new(LATENESS_BUCKETS),
            behind_schedule: Gauge::default(),
            exposition: Mutex::new(None),
            encoded_len: AtomicUsize::new(0),
        };
        let r = &mut m.registry;
        r.register(
            "servesim_faults",
            "Faults injected, by type",
            m.faults.clone(),
        );
        r.register(
            "servesim_kv_transfers",
            "Prefill-to-decode KV hand-offs completed",
            m.kv_transfers.clone(),
        );
        r.register(
            "servesim_kv_transfer_seconds",
            "Simulated seconds spent moving KV from prefill to decode workers",
            m.kv_transfer_seconds.clone(),
        );
        r.register(
            "servesim_kv_transfers_in_flight",
            "KV hand-offs under way",
            m.kv_transfers_in_flight.clone(),
        );
        r.register(
            "servesim_pool_busy_seconds",
            "Simulated seconds the workers of each pool spent in passes",
            m.pool_busy_seconds.clone(),
        );
        r.register(
            "servesim_worker_busy_seconds",
            "Simulated seconds the worker spent in passes",
            m.worker_busy_seconds.clone(),
        );
        r.register(
            "servesim_g2_resident_blocks",
            "KV blocks held in the host-memory (G2) tier",
            m.g2_resident_blocks.clone(),
        );
        r.register(
            "servesim_g2_onboarded_blocks",
            "KV blocks brought back from the host-memory tier",
            m.g2_onboarded_blocks.clone(),
        );
        r.register(
            "servesim_kv_events_published",
            "KV-event batches published on ZeroMQ, per worker",
            m.kv_events_published.clone(),
        );
        r.register(
            "servesim_kv_events_dropped",
            "KV-event batches dropped for subscribers that fell behind, per worker",
            m.kv_events_dropped.clone(),
        );
        r.register(
            "servesim_kv_events_faults",
            "KV-event batches that met an injected fault (--kv-events-faults), per worker and fault",
            m.kv_events_faults.clone(),
        );
        r.register(
            "servesim_kv_events_replayed",
            "KV-event batches served by the replay endpoint, per worker",
            m.kv_events_replayed.clone(),
        );
        r.register(
            "servesim_kv_events_unknown_blocks",
            "Stored blocks published without their tokens",
            m.kv_events_unknown_blocks.clone(),
        );
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            m.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting for admission on the worker",
            m.waiting.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: 1 means 100 percent",
            m.kv_usage.clone(),
        );
        r.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens queried in the prefix cache",
            m.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            m.prefix_hits.clone(),
        );
        r.register(
            "vllm:prompt_tokens",
            "Prefilled prompt tokens",
            m.prompt_tokens.clone(),
        );
        r.register(
            "vllm:generation_tokens",
            "Generated tokens",
            m.generation_tokens.clone(),
        );
        r.register("vllm:num_preemptions", "Preemptions", m.preemptions.clone());
        r.register(
            "vllm:time_to_first_token_seconds",
            "Time to first token in seconds",
            m.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens in seconds",
            m.itl.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds",
            m.e2e.clone(),
        );
        r.register(
            "vllm:request_success",
            "Requests that ran to their output limit",
            m.success.clone(),
        );
        r.register(
            "vllm:request_time_per_output_token_seconds",
            "Time per output token (after the first) per request in seconds",
            m.tpot.clone(),
        );
        r.register(
            "vllm:request_queue_time_seconds",
            "Time spent waiting before the first admission in seconds",
            m.queue_time.clone(),
        );
        r.register(
            "vllm:request_prefill_time_seconds",
            "Time from the first admission to the first token in seconds",
            m.prefill_time.clone(),
        );
        r.register(
            "vllm:request_decode_time_seconds",
            "Time from the first token to the last in seconds",
            m.decode_time.clone(),
        );
        r.register(
            "vllm:request_inference_time_seconds",
            "Time from the first admission to the last token in seconds",
            m.inference_time.clone(),
        );
        r.register(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed",
            m.request_prompt_tokens.clone(),
        );
        r.register(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed",
            m.request_generation_tokens.clone(),
        );
        r.register(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter",
            m.request_max_tokens.clone(),
        );
        r.register(
            "vllm:iteration_tokens_total",
            "Histogram of the number of tokens per engine step",
            m.iteration_tokens.clone(),
        );
        r.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            m.cache_config_info.clone(),
        );
        r.register(
            "vllm:lora_requests_info",
            "Running stats on lora requests",
            m.lora_info.clone(),
        );
        r.register(
            "servesim_lora_requests",
            "Generation requests served under each LoRA adapter",
            m.lora_requests.clone(),
        );
        r.register(
            "servesim_http_requests",
            "HTTP generation requests received, by endpoint",
            m.http_requests.clone(),
        );
        r.register(
            "servesim_http_request_failures",
            "Requests answered with an error, before or during the stream",
            m.http_failures.clone(),
        );
        r.register(
            "servesim_http_requests_overloaded",
            "Requests refused with 429 because the waiting queue was full",
            m.overloaded.clone(),
        );
        r.register(
            "servesim_requests_cancelled",
            "Requests cancelled because the client went away",
            m.cancelled.clone(),
        );
        r.register(
            "servesim_router_requests",
            "Requests per worker, counted at first admission",
            m.routed.clone(),
        );
        r.register(
            "servesim_router_pinned_requests",
            "Requests pinned to a worker (nvext.backend_instance_id or header)",
            m.pinned.clone(),
        );
        r.register(
            "servesim_router_parked_requests",
            "Requests waiting at the router while every worker is busy",
            m.parked.clone(),
        );
        r.register(
            "servesim_active_requests",
            "Requests submitted to the engine and not done",
            m.active.clone(),
        );
        r.register(
            "servesim_speculative_prefill_submitted",
            "Speculative next-turn prefills submitted to the engine",
            m.spec_submitted.clone(),
        );
        r.register(
            "servesim_speculative_prefill_skipped",
            "Speculative next-turn prefills skipped, by reason",
            m.spec_skipped.clone(),
        );
        r.register(
            "servesim_speculative_prefill_in_flight",
            "Speculative next-turn prefills running now",
            m.spec_in_flight.clone(),
        );
        r.register(
            "servesim_token_lateness_seconds",
            "Per token sent, how long after its simulated time the server handed it to the client",
            m.token_lateness.clone(),
        );
        r.register(
            "servesim_behind_schedule_seconds",
            "Lateness of the last token sent against its simulated time",
            m.behind_schedule.clone(),
        );
        m
    }

    /// Records a token handed to its client `late` after its simulated time.
    pub(crate) fn token_sent(&self, late: Duration) {
        let secs = late.as_secs_f64();
        self.token_lateness.observe(secs);
        self.behind_schedule.set(secs);
    }

    /// The registry, to add series beside the server's own before it is shared (a fleet adds
    /// its routing judge's).
    pub(crate) fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Creates every per-worker series, so a scrape shows each worker before it has served.
    pub(crate) fn init_workers(&self, num_workers: usize) {
        for w in 0..num_workers as u32 {
            let label = self.engine(WorkerId(w));
            let _ = self.tpot.get_or_create(&label);
            let _ = self.queue_time.get_or_create(&label);
            let _ = self.prefill_time.get_or_create(&label);
            let _ = self.decode_time.get_or_create(&label);
            let _ = self.inference_time.get_or_create(&label);
            let _ = self.request_prompt_tokens.get_or_create(&label);
            let _ = self.request_generation_tokens.get_or_create(&label);
            let _ = self.request_max_tokens.get_or_create(&label);
            let _ = self.iteration_tokens.get_or_create(&label);
            let _ = self.success.get_or_create(&FinishedLabel {
                model_name: self.model_name.clone(),
                engine: w,
                finished_reason: FINISHED_LENGTH,
            });
            let _ = self.routed.get_or_create(&WorkerLabel { worker: w });
            let _ = self.running.get_or_create(&label);
            let _ = self.waiting.get_or_create(&label);
            let _ = self.kv_usage.get_or_create(&label);
            let _ = self.prefix_queries.get_or_create(&label);
            let _ = self.prefix_hits.get_or_create(&label);
            let _ = self.prompt_tokens.get_or_create(&label);
            let _ = self.generation_tokens.get_or_create(&label);
            let _ = self.preemptions.get_or_create(&label);
            let _ = self.ttft.get_or_create(&label);
            let _ = self.itl.get_or_create(&label);
            let _ = self.e2e.get_or_create(&label);
        }
        for endpoint in ["chat", "completions"] {
            let _ = self
                .http_requests
                .get_or_create(&EndpointLabel { endpoint });
        }
        for reason in [SKIP_IN_FLIGHT, SKIP_QUEUE_FULL] {
            let _ = self.spec_skipped.get_or_create(&SkipLabel { reason });
        }
    }

    /// Sets `vllm:cache_config_info` for `num_workers` engines of `config`.
    pub(crate) fn set_cache_config(
        &self,
        num_workers: usize,
        config: &servesim::scheduler::EngineConfig,
    ) {
        let num_cpu_blocks = config.g2.as_ref().map_or(0, |g2| g2.num_blocks);
        for w in 0..num_workers as u32 {
            self.cache_config_info
                .get_or_create(&CacheConfigLabel {
                    engine: w,
                    block_size: config.block_size.to_string(),
                    cache_dtype: "auto",
                    enable_prefix_caching: if config.enable_prefix_caching {
                        "True"
                    } else {
                        "False"
                    },
                    gpu_memory_utilization: "0.9",
                    num_cpu_blocks: num_cpu_blocks.to_string(),
                    num_gpu_blocks: config.num_gpu_blocks.to_string(),
                })
                .set(1);
        }
    }

    /// Sets `vllm:lora_requests_info` to now (Unix seconds), labelled with the adapters of
    /// running and waiting requests, as vLLM does: one series, replaced at each update.
    pub(crate) fn set_lora_info(&self, running: &[String], waiting: &[String], max_loras: usize) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.lora_info.clear();
        self.lora_info
            .get_or_create(&LoraInfoLabel {
                running_lora_adapters: running.join(","),
                waiting_lora_adapters: waiting.join(","),
                max_lora: max_loras.to_string(),
            })
            .set(now);
    }

    /// Sets the gauges from a cluster snapshot.
    pub(crate) fn set_gauges(&self, stats: &ClusterStats) {
        for w in &stats.workers {
            let label = self.engine(w.worker);
            self.running
                .get_or_create(&label)
                .set(w.scheduler.running as i64);
            self.waiting
                .get_or_create(&label)
                .set(w.scheduler.waiting as i64);
            self.kv_usage
                .get_or_create(&label)
                .set(w.scheduler.active_blocks as f64 / w.num_gpu_blocks.max(1) as f64);
        }
        self.parked.set(stats.parked as i64);
        self.active.set(stats.active_requests as i64);
        self.kv_transfers.set(stats.kv_transfers as i64);
        self.kv_transfer_seconds
            .set(stats.kv_transfer_us as f64 / 1e6);
        self.kv_transfers_in_flight
            .set(stats.kv_transfers_in_flight as i64);
        let mut pools: Vec<(String, f64)> = Vec::new();
        for w in &stats.workers {
            let label = WorkerLabel::from(w.worker);
            let busy = w.busy_us as f64 / 1e6;
            self.worker_busy_seconds.get_or_create(&label).set(busy);
            self.g2_resident_blocks
                .get_or_create(&label)
                .set(w.scheduler.g2_resident_blocks as i64);
            self.g2_onboarded_blocks
                .get_or_create(&label)
                .set(w.scheduler.g2_onboarded_blocks as i64);
            let pool = w.role.to_string();
            match pools.iter_mut().find(|(p, _)| *p == pool) {
                Some((_, total)) => *total += busy,
                None => pools.push((pool, busy)),
            }
        }
        for (pool, busy) in pools {
            self.pool_busy_seconds
                .get_or_create(&PoolLabel { pool })
                .set(busy);
        }
    }

    /// The OpenMetrics text exposition: built now, or the one a scrape just before this one
    /// built when building is costly (see the module docs). On a multi-threaded runtime the
    /// build (or the wait for another scrape's) runs in `block_in_place`, so the runtime's other
    /// tasks move to another thread meanwhile.
    pub fn encode(&self) -> Bytes {
        let arrived = Instant::now();
        let build = || {
            let mut last = self
                .exposition
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = last.as_ref() {
                let recent = e.took >= REUSE_THRESHOLD
                    && arrived.saturating_duration_since(e.started) < e.took * REUSE_FACTOR;
                if e.started >= arrived || recent {
                    return e.text.clone();
                }
            }
            let started = Instant::now();
            let text = Bytes::from(self.build());
            *last = Some(Exposition {
                started,
                took: started.elapsed(),
                text: text.clone(),
            });
            text
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(build)
            }
            _ => build(),
        }
    }

    /// Builds the exposition.
    fn build(&self) -> String {
        let room = self.encoded_len.load(Ordering::Relaxed);
        let mut out = String::with_capacity(room + room / 8);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        self.encoded_len.store(out.len(), Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cheap_exposition_is_built_fresh_for_every_scrape() {
        let m = Metrics::new();
        m.init_workers(2);
        let before = m.encode();
        assert_eq!(before, Bytes::from(m.build()));
        m.overloaded.inc();
        let after = m.encode();
        assert_ne!(before, after);
        let text = std::str::from_utf8(&after).expect("utf-8");
        assert!(
            text.contains("servesim_http_requests_overloaded_total 1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_costly_exposition_is_served_again_within_its_window_only() {
        let m = Metrics::new();
        let costly = |took: Duration| Exposition {
            started: Instant::now(),
            took,
            text: Bytes::from_static(b"cached"),
        };
        // Built just now and costly: reused.
        *m.exposition.lock().expect("lock") = Some(costly(Duration::from_secs(60)));
        assert_eq!(m.encode(), Bytes::from_static(b"cached"));
        // Cheap builds are never reused.
        *m.exposition.lock().expect("lock") = Some(costly(Duration::from_millis(1)));
        assert_eq!(m.encode(), Bytes::from(m.build()));
        // Costly but old: rebuilt.
        *m.exposition.lock().expect("lock") = Some(Exposition {
            started: Instant::now() - Duration::from_secs(10),
            took: REUSE_THRESHOLD,
            text: Bytes::from_static(b"cached"),
        });
        assert_eq!(m.encode(), Bytes::from(m.build()));
    }

    /// The cost of scraping 1,024 workers: `cargo test -p mock_server --lib -- --ignored
    /// --nocapture scrape_cost` (debug builds are several times slower than release).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn scrape_cost_at_1024_workers() {
        let m = std::sync::Arc::new(Metrics::for_model("mock-model", 131_072));
        m.init_workers(1024);
        for w in 0..1024 {
            let label = m.engine(WorkerId(w));
            m.ttft.get_or_create(&label).observe(0.05);
            m.request_prompt_tokens.get_or_create(&label).observe(900.0);
        }
        let started = std::time::Instant::now();
        let text = m.build();
        let one = started.elapsed();
        println!(
            "one build: {one:?}, {} bytes, {} lines",
            text.len(),
            text.lines().count()
        );
        // Two scrape loops back to back for two seconds, before (a build per scrape) and now.
        for (name, reuse) in [("a build per scrape", false), ("encode", true)] {
            let scrapes = AtomicUsize::new(0);
            let until = std::time::Instant::now() + Duration::from_secs(2);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        while std::time::Instant::now() < until {
                            let _ = if reuse {
                                m.encode()
                            } else {
                                Bytes::from(m.build())
                            };
                            scrapes.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            println!("{name}: {} scrapes in 2 s", scrapes.load(Ordering::Relaxed));
        }
    }
}
