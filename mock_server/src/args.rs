//! Engine, router and cluster flags shared by `mockserve serve` and `mockserve replay`, and their
//! conversion into a validated [`ClusterConfig`].

use std::sync::Arc;

use clap::Args;
use servesim::cluster::ClusterConfig;
use servesim::perf::{Fixed, LatencyModel, Polynomial, ScaledLatency};
use servesim::router::{RouterConfig, RouterMode};
use servesim::scheduler::{ConfigError, EngineConfig, EngineType, PreemptionMode, SglangConfig};

/// Simulated engine and routing flags.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Number of simulated workers (aggregated serving).
    #[arg(long, default_value_t = 4)]
    pub num_workers: usize,

    /// Batching behaviour to simulate: vllm, sglang or trtllm.
    #[arg(long, default_value = "vllm")]
    pub engine_type: EngineType,

    /// How requests are spread over workers: round-robin, random or kv-router.
    #[arg(long, default_value = "kv-router")]
    pub router_mode: RouterMode,

    /// KV block size in tokens (engine and router).
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,

    /// KV blocks per worker.
    #[arg(long, default_value_t = 16384)]
    pub num_gpu_blocks: usize,

    /// Running requests per worker at most.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,

    /// Tokens scheduled per pass at most.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,

    /// Divides prefill and decode time ("inf" = no delays).
    #[arg(long, default_value_t = 1.0)]
    pub speedup_ratio: f64,

    /// Divides decode time further (speculative decoding).
    #[arg(long, default_value_t = 1.0)]
    pub decode_speedup_ratio: f64,

    /// Which running request to preempt when KV blocks run out (vllm): lifo or fifo.
    #[arg(long, default_value = "lifo")]
    pub preemption_mode: PreemptionMode,

    /// Turn off prefix caching (every block private, no KV events).
    #[arg(long)]
    pub no_prefix_caching: bool,

    /// Turn off chunked prefill (a prompt must fit one pass's token budget).
    #[arg(long)]
    pub no_chunked_prefill: bool,

    /// Weight of prefill blocks in the KV router's cost.
    #[arg(long, default_value_t = 1.0)]
    pub overlap_score_weight: f64,

    /// KV router temperature: 0 picks the cheapest worker, above 0 samples a softmax.
    #[arg(long, default_value_t = 0.0)]
    pub router_temperature: f64,

    /// Park requests at the router while every worker's pending prefill exceeds this multiple of
    /// --max-num-batched-tokens (off by default).
    #[arg(long)]
    pub router_queue_threshold: Option<f64>,

    /// KV router without KV events: it remembers its own routing decisions for 120 s
    /// (Dynamo's approximate mode) instead of indexing the workers' KV events.
    #[arg(long)]
    pub no_kv_events: bool,

    /// Replace the polynomial latency model by constant times: PREFILL_MS,DECODE_MS.
    #[arg(long, value_name = "PREFILL_MS,DECODE_MS", value_parser = parse_fixed)]
    pub fixed_latency: Option<Fixed>,

    /// Seed of the router's tie-breaks and the generated token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn parse_fixed(s: &str) -> Result<Fixed, String> {
    let (p, d) = s.split_once(',').ok_or("expected PREFILL_MS,DECODE_MS")?;
    let num = |v: &str| v.trim().parse::<f64>().map_err(|e| format!("{v:?}: {e}"));
    let (prefill_ms, decode_ms) = (num(p)?, num(d)?);
    if !(prefill_ms >= 0.0 && decode_ms >= 0.0 && prefill_ms.is_finite() && decode_ms.is_finite()) {
        return Err("times must be finite and >= 0".into());
    }
    Ok(Fixed {
        prefill_ms,
        decode_ms,
    })
}

impl EngineArgs {
    /// The validated cluster configuration these flags describe.
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        let model: Arc<dyn LatencyModel> = match self.fixed_latency {
            Some(f) => Arc::new(f),
            None => Arc::new(Polynomial::default()),
        };
        let config = ClusterConfig {
            engine: EngineConfig {
                engine_type: self.engine_type,
                num_gpu_blocks: self.num_gpu_blocks,
                block_size: self.block_size,
                max_num_seqs: self.max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                enable_prefix_caching: !self.no_prefix_caching,
                enable_chunked_prefill: !self.no_chunked_prefill,
                preemption_mode: self.preemption_mode,
                max_model_len: None,
                latency: ScaledLatency {
                    model,
                    speedup_ratio: self.speedup_ratio,
                    decode_speedup_ratio: self.decode_speedup_ratio,
                },
                sglang: SglangConfig::default(),
            },
            num_workers: self.num_workers,
            router: RouterConfig {
                mode: self.router_mode,
                overlap_score_weight: self.overlap_score_weight,
                temperature: self.router_temperature,
                queue_threshold: self.router_queue_threshold,
                use_kv_events: !self.no_kv_events,
                ..RouterConfig::default()
            },
            seed: self.seed,
        };
        config.validate()?;
        Ok(config)
    }
}
