//! A fleet worker's `/metrics` ([`WorkerMetrics`]): its own slice of the engine's metrics,
//! under the same vLLM names and labels `serve` uses (`engine` is the worker's index), its
//! endpoint's own HTTP counters, and the routing judge's `servesim_routing_*` series.
//!
//! The fleet's engine feeds one [`Metrics`] for every worker (the driver labels each series
//! with its worker). A worker's registry holds clones of that worker's series only (a
//! `prometheus-client` metric clone reads the same atomics), so a scrape encodes a few dozen
//! series whatever the fleet's size, instead of filtering the whole fleet's exposition.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use servesim::ids::WorkerId;
use servesim::scheduler::EngineConfig;

use crate::metrics::{CacheConfigLabel, FinishedLabel, Metrics, WorkerLabel, FINISHED_LENGTH};

use super::judge::RoutingMetrics;

/// Series of a family shared by every worker, encoded under their own labels: one worker's
/// part of it.
#[derive(Debug)]
struct Slice<L, M>(Vec<(L, M)>);

impl<L: EncodeLabelSet, M: EncodeMetric + TypedMetric> EncodeMetric for Slice<L, M> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, metric) in &self.0 {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

/// The series of `family` under each of `labels` (created when missing).
fn slice<L, M, C>(family: &Family<L, M, C>, labels: impl IntoIterator<Item = L>) -> Slice<L, M>
where
    L: Clone + std::hash::Hash + Eq,
    M: Clone,
    C: MetricConstructor<M>,
{
    Slice(
        labels
            .into_iter()
            .map(|l| {
                let metric = family.get_or_create(&l).clone();
                (l, metric)
            })
            .collect(),
    )
}

/// What one fleet worker's `/metrics` shows (see the module docs).
#[derive(Debug)]
pub struct WorkerMetrics {
    /// The worker's series, sharing their atomics with the fleet's.
    registry: Registry,
    /// The engine's metrics, whose gauges a scrape refreshes.
    pub engine: Arc<Metrics>,
}

impl WorkerMetrics {
    /// Worker `worker`'s series of `engine` (the metrics the fleet's engine feeds, its engine
    /// settings `config`), the HTTP counters of its endpoint (`own`) and the judge's `routing`.
    pub fn new(
        engine: &Arc<Metrics>,
        own: &Metrics,
        routing: &RoutingMetrics,
        worker: WorkerId,
        config: &EngineConfig,
    ) -> WorkerMetrics {
        let mut registry = Registry::default();
        let r = &mut registry;
        let m = engine.as_ref();
        let e = [m.engine(worker)];
        r.register(
            "vllm:num_requests_running",
            "Requests in the running batch",
            slice(&m.running, e.clone()),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting for admission on the worker",
            slice(&m.waiting, e.clone()),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage: 1 means 100 percent",
            slice(&m.kv_usage, e.clone()),
        );
        let counters = [
            (
                "vllm:prefix_cache_queries",
                "Prompt tokens queried in the prefix cache",
                &m.prefix_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "Prompt tokens found in the prefix cache",
                &m.prefix_hits,
            ),
            (
                "vllm:prompt_tokens",
                "Prefilled prompt tokens",
                &m.prompt_tokens,
            ),
            (
                "vllm:generation_tokens",
                "Generated tokens",
                &m.generation_tokens,
            ),
            ("vllm:num_preemptions", "Preemptions", &m.preemptions),
        ];
        for (name, help, family) in counters {
            r.register(name, help, slice(family, e.clone()));
        }
        let histograms = [
            (
                "vllm:time_to_first_token_seconds",
                "Time to first token in seconds",
                &m.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Time between consecutive output tokens in seconds",
                &m.itl,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "End-to-end request latency in seconds",
                &m.e2e,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Time per output token (after the first) per request in seconds",
                &m.tpot,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Time spent waiting before the first admission in seconds",
                &m.queue_time,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Time from the first admission to the first token in seconds",
                &m.prefill_time,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Time from the first token to the last in seconds",
                &m.decode_time,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Time from the first admission to the last token in seconds",
                &m.inference_time,
            ),
            (
                "vllm:iteration_tokens_total",
                "Histogram of the number of tokens per engine step",
                &m.iteration_tokens,
            ),
        ];
        for (name, help, family) in histograms {
            r.register(name, help, slice(family, e.clone()));
        }
        let token_histograms = [
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed",
                &m.request_prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed",
                &m.request_generation_tokens,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter",
                &m.request_max_tokens,
            ),
        ];
        for (name, help, family) in token_histograms {
            r.register(name, help, slice(family, e.clone()));
        }
        let reasons = [FINISHED_LENGTH, "stop"].map(|finished_reason| FinishedLabel {
            model_name: m.model_name.clone(),
            engine: worker.0,
            finished_reason,
        });
        r.register(
            "vllm:request_success",
            "Requests that ran to their output limit",
            slice(&m.success, reasons),
        );
        r.register(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            slice(&m.cache_config_info, [cache_config_label(worker, config)]),
        );
        r.register(
            "vllm:lora_requests_info",
            "Running stats on lora requests",
            own.lora_info.clone(),
        );
        let w = [WorkerLabel::from(worker)];
        r.register(
            "servesim_router_requests",
            "Requests per worker, counted at first admission",
            slice(&m.routed, w.clone()),
        );
        r.register(
            "servesim_worker_busy_seconds",
            "Simulated seconds the worker spent in passes",
            slice(&m.worker_busy_seconds, w.clone()),
        );
        r.register(
            "servesim_g2_resident_blocks",
            "KV blocks held in the host-memory (G2) tier",
            slice(&m.g2_resident_blocks, w.clone()),
        );
        r.register(
            "servesim_g2_onboarded_blocks",
            "KV blocks brought back from the host-memory tier",
            slice(&m.g2_onboarded_blocks, w.clone()),
        );
        r.register(
            "servesim_kv_events_published",
            "KV-event batches published on ZeroMQ, per worker",
            slice(&m.kv_events_published, w.clone()),
        );
        r.register(
            "servesim_kv_events_dropped",
            "KV-event batches dropped for subscribers that fell behind, per worker",
            slice(&m.kv_events_dropped, w),
        );
        r.register(
            "servesim_http_requests",
            "HTTP generation requests received, by endpoint",
            own.http_requests.clone(),
        );
        r.register(
            "servesim_http_request_failures",
            "Requests answered with an error, before or during the stream",
            own.http_failures.clone(),
        );
        r.register(
            "servesim_http_requests_overloaded",
            "Requests refused with 429 because the waiting queue was full",
            own.overloaded.clone(),
        );
        r.register(
            "servesim_faults",
            "Faults injected, by type",
            own.faults.clone(),
        );
        r.register(
            "servesim_lora_requests",
            "Generation requests served under each LoRA adapter",
            own.lora_requests.clone(),
        );
        routing.register(r);
        WorkerMetrics {
            registry,
            engine: Arc::clone(engine),
        }
    }

    /// The exposition (OpenMetrics text).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `vllm:cache_config_info`'s labels of `worker`, as [`Metrics::set_cache_config`] sets them.
fn cache_config_label(worker: WorkerId, config: &EngineConfig) -> CacheConfigLabel {
    let num_cpu_blocks = config.g2.as_ref().map_or(0, |g2| g2.num_blocks);
    CacheConfigLabel {
        engine: worker.0,
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_shows_its_own_series_only() {
        let engine = Arc::new(Metrics::new());
        engine.init_workers(3);
        let config = EngineConfig::default();
        engine.set_cache_config(3, &config);
        let own = Metrics::new();
        let view = WorkerMetrics::new(
            &engine,
            &own,
            &RoutingMetrics::default(),
            WorkerId(1),
            &config,
        );
        engine
            .generation_tokens
            .get_or_create(&engine.engine(WorkerId(1)))
            .inc_by(7);
        engine
            .generation_tokens
            .get_or_create(&engine.engine(WorkerId(2)))
            .inc_by(5);
        own.http_failures.inc();
        let text = view.encode();
        assert!(
            text.contains("vllm:generation_tokens_total{model_name=\"mock-model\",engine=\"1\"} 7"),
            "{text}"
        );
        assert!(!text.contains("engine=\"2\""), "{text}");
        assert!(!text.contains("engine=\"0\""), "{text}");
        assert!(
            text.contains("servesim_http_request_failures_total 1"),
            "{text}"
        );
        assert!(
            text.contains("vllm:cache_config_info{engine=\"1\""),
            "{text}"
        );
        assert!(
            text.contains("servesim_routing_decisions_total 0"),
            "{text}"
        );
        // The same cache-config series as the engine's (no second one was created).
        let all = String::from_utf8(engine.encode().to_vec()).expect("utf-8");
        assert_eq!(all.matches("vllm:cache_config_info{").count(), 3, "{all}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
