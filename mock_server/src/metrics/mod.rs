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

mod bucket;
mod exposition;
mod label;
mod register;
mod update;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use servesim::ids::WorkerId;

use bucket::HistogramFamily;
pub use bucket::TokenBuckets;
use exposition::Exposition;
pub use label::{
    AdapterLabel, CacheConfigLabel, EndpointLabel, EngineLabel, FaultLabel, FinishedLabel,
    KvFaultLabel, LoraInfoLabel, PoolLabel, SkipLabel, WorkerLabel,
};
pub(crate) use label::{FINISHED_LENGTH, SKIP_IN_FLIGHT, SKIP_QUEUE_FULL};

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
    /// `servesim_http_requests_over_inflight_bound`: refused with 503 `server_overloaded`
    /// (`--max-inflight-bytes`).
    pub over_inflight_bound: Counter,
    /// `servesim_inflight_bytes` (gauge, at each scrape): the estimated memory of the requests
    /// in flight.
    pub inflight_bytes: Gauge,
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

    /// The registry, to add series beside the server's own before it is shared (a fleet adds
    /// its routing judge's).
    pub(crate) fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }
}
