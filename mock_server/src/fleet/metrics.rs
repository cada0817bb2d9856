//! A fleet worker's `/metrics` ([`WorkerMetrics`]): its own slice of the engine's metrics,
//! under the same vLLM names and labels `serve` uses (`engine` is the worker's index) or
//! SGLang's names ([`MetricsDialect`]), its endpoint's own HTTP counters, and the routing
//! judge's `servesim_routing_*` series.
//!
//! The fleet's engine feeds one [`Metrics`] for every worker (the driver labels each series
//! with its worker). A worker's registry holds clones of that worker's series only (a
//! `prometheus-client` metric clone reads the same atomics), so a scrape encodes a few dozen
//! series whatever the fleet's size, instead of filtering the whole fleet's exposition.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use servesim::ids::WorkerId;
use servesim::scheduler::EngineConfig;

use crate::metrics::{
    CacheConfigLabel, FinishedLabel, KvFaultLabel, Metrics, WorkerLabel, FINISHED_LENGTH,
};

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

/// The metric names a fleet worker's `/metrics` speaks (`--metrics-dialect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsDialect {
    /// vLLM's `vllm:*` names, as `mockserve serve` writes them.
    #[default]
    Vllm,
    /// SGLang's `sglang:*` names for the figures SGLang reports (running and queued requests,
    /// token usage, cache hit rate, token counters, TTFT, inter-token and end-to-end latency).
    Sglang,
}

/// What every worker's `/metrics` is built from: the fleet's shared series and settings.
#[derive(Clone, Debug)]
pub(crate) struct FleetMetrics {
    /// The metrics the fleet's engine feeds, every worker's series (a scrape refreshes their
    /// gauges).
    pub engine: Arc<Metrics>,
    /// The routing judge's series.
    pub routing: RoutingMetrics,
    /// The workers' engine settings (for `vllm:cache_config_info`).
    pub config: EngineConfig,
    /// The names the workers speak.
    pub dialect: MetricsDialect,
}

/// SGLang's `sglang:cache_hit_rate`: a gauge set from the worker's prefix-cache counters at
/// each scrape.
#[derive(Debug)]
struct HitRate {
    /// The gauge shown.
    gauge: Gauge<f64, AtomicU64>,
    /// The worker's prefix-cache hits (tokens).
    hits: Counter,
    /// The worker's prefix-cache queries (tokens).
    queries: Counter,
}

/// What one fleet worker's `/metrics` shows (see the module docs).
#[derive(Debug)]
pub(crate) struct WorkerMetrics {
    /// The worker's series, sharing their atomics with the fleet's.
    registry: Registry,
    /// The engine's metrics, whose gauges a scrape refreshes.
    pub engine: Arc<Metrics>,
    /// Set at each scrape in the SGLang dialect.
    hit_rate: Option<HitRate>,
}

impl WorkerMetrics {
    /// Worker `worker`'s series of the fleet's, in the fleet's dialect, and the HTTP counters
    /// of its endpoint (`own`).
    pub(crate) fn new(fleet: &FleetMetrics, own: &Metrics, worker: WorkerId) -> WorkerMetrics {
        let mut registry = Registry::default();
        let hit_rate = match fleet.dialect {
            MetricsDialect::Vllm => {
                register_vllm(&mut registry, fleet, own, worker);
                None
            }
            MetricsDialect::Sglang => Some(register_sglang(&mut registry, fleet, worker)),
        };
        register_servesim(&mut registry, fleet, own, worker);
        WorkerMetrics {
            registry,
            engine: Arc::clone(&fleet.engine),
            hit_rate,
        }
    }

    /// The exposition (OpenMetrics text).
    pub(crate) fn encode(&self) -> String {
        if let Some(h) = &self.hit_rate {
            let queries = h.queries.get();
            let rate = if queries == 0 {
                0.0
            } else {
                h.hits.get() as f64 / queries as f64
            };
            h.gauge.set(rate);
        }
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Worker `worker`'s `vllm:*` series, labelled as `serve` labels them.
fn register_vllm(r: &mut Registry, fleet: &FleetMetrics, own: &Metrics, worker: WorkerId) {
    let m = fleet.engine.as_ref();
    let config = &fleet.config;
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
}

/// SGLang's label set: the served model.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SglangLabel {
    /// The served (base) model.
    model_name: String,
}

/// Worker `worker`'s figures under SGLang's `sglang:*` names; the hit-rate gauge to set at
/// each scrape.
fn register_sglang(r: &mut Registry, fleet: &FleetMetrics, worker: WorkerId) -> HitRate {
    let m = fleet.engine.as_ref();
    let e = m.engine(worker);
    let label = SglangLabel {
        model_name: m.model_name.clone(),
    };
    // The worker's series of a shared family, under SGLang's label set.
    fn one<L, M, C>(family: &Family<L, M, C>, of: &L, label: &SglangLabel) -> Slice<SglangLabel, M>
    where
        L: Clone + std::hash::Hash + Eq,
        M: Clone,
        C: MetricConstructor<M>,
    {
        Slice(vec![(label.clone(), family.get_or_create(of).clone())])
    }
    r.register(
        "sglang:num_running_reqs",
        "The number of running requests",
        one(&m.running, &e, &label),
    );
    r.register(
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue",
        one(&m.waiting, &e, &label),
    );
    r.register(
        "sglang:token_usage",
        "The token usage",
        one(&m.kv_usage, &e, &label),
    );
    let hit_rate = HitRate {
        gauge: Gauge::default(),
        hits: m.prefix_hits.get_or_create(&e).clone(),
        queries: m.prefix_queries.get_or_create(&e).clone(),
    };
    r.register(
        "sglang:cache_hit_rate",
        "The cache hit rate",
        Slice(vec![(label.clone(), hit_rate.gauge.clone())]),
    );
    r.register(
        "sglang:prompt_tokens",
        "Number of prefill tokens processed",
        one(&m.prompt_tokens, &e, &label),
    );
    r.register(
        "sglang:generation_tokens",
        "Number of generation tokens processed",
        one(&m.generation_tokens, &e, &label),
    );
    r.register(
        "sglang:cached_tokens",
        "Number of cached prompt tokens",
        one(&m.prefix_hits, &e, &label),
    );
    r.register(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds",
        one(&m.ttft, &e, &label),
    );
    r.register(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds",
        one(&m.itl, &e, &label),
    );
    r.register(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        one(&m.e2e, &e, &label),
    );
    hit_rate
}

/// Worker `worker`'s `servesim_*` series, its endpoint's HTTP counters and the judge's series.
fn register_servesim(r: &mut Registry, fleet: &FleetMetrics, own: &Metrics, worker: WorkerId) {
    let m = fleet.engine.as_ref();
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
        "servesim_kv_events_faults",
        "KV-event batches that met an injected fault (--kv-events-faults), per worker and fault",
        slice(
            &m.kv_events_faults,
            ["drop", "duplicate", "reorder", "delay"].map(|fault| KvFaultLabel {
                worker: worker.0,
                fault,
            }),
        ),
    );
    r.register(
        "servesim_token_lateness_seconds",
        "Per token sent, how long after its simulated time the server handed it to the client",
        own.token_lateness.clone(),
    );
    r.register(
        "servesim_behind_schedule_seconds",
        "Lateness of the last token sent against its simulated time",
        own.behind_schedule.clone(),
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
    fleet.routing.register(r);
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

    fn fleet(dialect: MetricsDialect) -> FleetMetrics {
        let engine = Arc::new(Metrics::new());
        engine.init_workers(3);
        let config = EngineConfig::default();
        engine.set_cache_config(3, &config);
        FleetMetrics {
            engine,
            routing: RoutingMetrics::default(),
            config,
            dialect,
        }
    }

    #[test]
    fn a_worker_shows_its_own_series_only() {
        let fleet = fleet(MetricsDialect::Vllm);
        let engine = &fleet.engine;
        let own = Metrics::new();
        let view = WorkerMetrics::new(&fleet, &own, WorkerId(1));
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

    #[test]
    fn the_sglang_dialect_names_the_figures_as_sglang_does() {
        let fleet = fleet(MetricsDialect::Sglang);
        let engine = &fleet.engine;
        let view = WorkerMetrics::new(&fleet, &Metrics::new(), WorkerId(2));
        let label = engine.engine(WorkerId(2));
        engine.prefix_queries.get_or_create(&label).inc_by(200);
        engine.prefix_hits.get_or_create(&label).inc_by(50);
        engine.running.get_or_create(&label).set(3);
        engine
            .running
            .get_or_create(&engine.engine(WorkerId(0)))
            .set(9);
        let text = view.encode();
        for line in [
            "sglang:num_running_reqs{model_name=\"mock-model\"} 3",
            "sglang:cache_hit_rate{model_name=\"mock-model\"} 0.25",
            "sglang:cached_tokens_total{model_name=\"mock-model\"} 50",
            "servesim_router_requests_total{worker=\"2\"} 0",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert!(!text.contains("vllm:"), "{text}");
    }
}
