//! [`Metrics::for_model`]: every series created at zero and registered under its vLLM or
//! servesim name, with its help text.

use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::bucket::{
    buckets_1_2_5, e2e_histogram, iteration_histogram, itl_histogram, ttft_histogram, TokenBuckets,
    LATENESS_BUCKETS,
};
use super::Metrics;

impl Metrics {
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
            over_inflight_bound: Counter::default(),
            inflight_bytes: Gauge::default(),
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
            "servesim_http_requests_over_inflight_bound",
            "Requests refused with 503 because their estimated memory did not fit under \
             --max-inflight-bytes beside the requests in flight",
            m.over_inflight_bound.clone(),
        );
        r.register(
            "servesim_inflight_bytes",
            "Estimated memory of the requests in flight (bodies, prompts, planned answers, \
             log-probabilities), bounded by --max-inflight-bytes",
            m.inflight_bytes.clone(),
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
}
