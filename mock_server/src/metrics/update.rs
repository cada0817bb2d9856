//! How the series are fed outside the driver's per-output counting: per token sent, per worker
//! at start, from the engine's configuration, the running adapters and the cluster's snapshot.

use std::time::Duration;

use servesim::cluster::ClusterStats;
use servesim::ids::WorkerId;

use super::label::{
    CacheConfigLabel, EndpointLabel, FinishedLabel, LoraInfoLabel, PoolLabel, SkipLabel,
    WorkerLabel, FINISHED_LENGTH, SKIP_IN_FLIGHT, SKIP_QUEUE_FULL,
};
use super::Metrics;

impl Metrics {
    /// Records a token handed to its client `late` after its simulated time.
    pub(crate) fn token_sent(&self, late: Duration) {
        let secs = late.as_secs_f64();
        self.token_lateness.observe(secs);
        self.behind_schedule.set(secs);
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
        for endpoint in ["chat", "completions", "responses", "messages", "embeddings"] {
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
            .set(stats.kv_transfer_ns as f64 / 1e9);
        self.kv_transfers_in_flight
            .set(stats.kv_transfers_in_flight as i64);
        let mut pools: Vec<(String, f64)> = Vec::new();
        for w in &stats.workers {
            let label = WorkerLabel::from(w.worker);
            let busy = w.busy_ns as f64 / 1e9;
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
}
