//! The target's Prometheus metrics over a run: [`parse`] reads the text exposition format
//! (any line it cannot read is skipped, never an error), [`Snapshot::of`] picks the serving
//! figures out of known metric names (vLLM `vllm:*`, SGLang `sglang:*`, Dynamo `dynamo_*`,
//! mockserve's `vllm:*` per worker and `servesim_*`; [`Snapshot::read`] parses only their
//! lines), and `Scraper` samples `{url}/metrics` every interval while the run lasts (further
//! apart after a slow scrape). The result, [`ServerMetrics`], is a time series plus a
//! summary (peak and mean) in the report's `server_metrics` key.
//!
//! Figures per sample: requests running and waiting (summed over workers), KV-cache usage (the
//! mean over workers, 0..1), the prefix-cache hit rate over the interval (from the hit and query
//! counters, or a hit-rate gauge), preemptions since the first sample, and the same per worker
//! when the series carry a worker label (`worker`, `worker_id`, `engine`, `dp_rank`).
//!
//! The modules: `parse` reads the text format, `snapshot` picks the known figures of one
//! scrape, `routing` and `lateness` read mockserve's routing judge and token-lateness
//! histogram, `series` builds the time series and its summary, `fetch` makes one scrape and
//! `scraper` samples in the background.

mod fetch;
mod lateness;
mod parse;
mod routing;
mod scraper;
mod series;
mod snapshot;

pub(crate) use lateness::LATENESS_METRIC;
pub use lateness::{Buckets, Lateness};
pub use parse::{parse, PromSample};
pub use routing::{OwnRouting, RoutingFigures, RoutingSummary};
pub(crate) use scraper::Scraper;
pub use series::{series, PeakMean, ServerMetrics, ServerSample, ServerSummary};
pub use snapshot::{Snapshot, WorkerFigures};

/// Expositions the tests of several modules read.
#[cfg(test)]
mod fixtures {
    pub(super) const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{worker="0",model_name="m"} 3
vllm:num_requests_running{worker="1",model_name="m"} 1
vllm:num_requests_waiting{worker="0"} 2
vllm:num_requests_waiting{worker="1"} 0
vllm:kv_cache_usage_perc{worker="0"} 0.5
vllm:kv_cache_usage_perc{worker="1"} 0.25
vllm:prefix_cache_queries_total{worker="0"} 100
vllm:prefix_cache_hits_total{worker="0"} 40
vllm:num_preemptions_total{worker="0"} 1
servesim_router_parked_requests 0
vllm:time_to_first_token_seconds_bucket{le="+Inf",worker="0"} 7
"#;
}
