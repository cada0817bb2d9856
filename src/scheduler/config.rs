//! Engine settings shared by every scheduler flavour.

use std::sync::Arc;

use super::policy::{BatchingPolicy, EngineType, Planner, PreemptionMode, VictimOrder};
use crate::kv::G2Config;
use crate::perf::{Polynomial, ScaledLatency};

/// What a worker does in the serving topology.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerRole {
    /// Prefill and decode (aggregated serving).
    #[default]
    Aggregated,
    /// Disaggregated prefill: runs prompts with one output token, then hands the KV over.
    Prefill,
    /// Disaggregated decode: never prefills; a prompt's KV arrives over the link and counts as
    /// computed on admission, so the request joins the decode batch at once.
    Decode,
}

impl std::fmt::Display for WorkerRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkerRole::Aggregated => "aggregated",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
        })
    }
}

/// SGLang scheduler constants.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SglangConfig {
    /// Prompt tokens admitted per pass at most.
    pub(crate) max_prefill_tokens: usize,
    /// Largest prefill chunk per pass.
    pub(crate) chunked_prefill_size: usize,
    /// Cap on a request's remaining output counted in the reservation.
    pub(crate) clip_max_new_tokens: usize,
    /// Initial reserved share of remaining output (before conservativeness).
    pub(crate) init_new_token_ratio: f64,
    /// Lowest ratio, as a fraction of the initial one.
    pub(crate) min_new_token_ratio_factor: f64,
    /// Passes to decay from the initial to the lowest ratio.
    pub(crate) new_token_ratio_decay_steps: u32,
    /// Multiplies the initial ratio.
    pub(crate) schedule_conservativeness: f64,
}

impl Default for SglangConfig {
    fn default() -> Self {
        SglangConfig {
            max_prefill_tokens: 16384,
            chunked_prefill_size: 8192,
            clip_max_new_tokens: 4096,
            init_new_token_ratio: 0.7,
            min_new_token_ratio_factor: 0.14,
            new_token_ratio_decay_steps: 600,
            schedule_conservativeness: 1.0,
        }
    }
}

impl SglangConfig {
    /// The ratio at start and after every retraction.
    pub(crate) fn init_new_token_ratio(&self) -> f64 {
        self.init_new_token_ratio * self.schedule_conservativeness
    }
}

/// Everything one simulated worker needs to know.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Batching flavour.
    pub engine_type: EngineType,
    /// KV blocks in the GPU pool.
    pub num_gpu_blocks: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Running requests at most.
    pub max_num_seqs: usize,
    /// Tokens scheduled per pass at most.
    pub max_num_batched_tokens: usize,
    /// Share full blocks by hash across requests.
    pub enable_prefix_caching: bool,
    /// Split long prompts over several passes.
    pub enable_chunked_prefill: bool,
    /// vLLM preemption order.
    pub preemption_mode: PreemptionMode,
    /// Context length limit (prompt + output), if any.
    pub max_model_len: Option<usize>,
    /// Pass timing.
    pub latency: ScaledLatency,
    /// SGLang constants (used with `EngineType::Sglang`).
    pub sglang: SglangConfig,
    /// Role in the serving topology (set by the cluster for disaggregated pools).
    pub role: WorkerRole,
    /// Host-memory KV tier (KVBM G2), if any.
    pub g2: Option<G2Config>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            engine_type: EngineType::Vllm,
            num_gpu_blocks: 16384,
            block_size: 64,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            preemption_mode: PreemptionMode::Lifo,
            max_model_len: None,
            latency: ScaledLatency {
                model: Arc::new(Polynomial::default()),
                speedup_ratio: 1.0,
                decode_speedup_ratio: 1.0,
            },
            sglang: SglangConfig::default(),
            role: WorkerRole::Aggregated,
            g2: None,
        }
    }
}

/// A setting that cannot work: an engine flag, or one of the HTTP server's or the KV-event
/// sockets' (the message names the flag, so the prefix says only that it is a setting).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid setting: {0}")]
pub struct ConfigError(pub String);

/// `x` for an error message: as written when it is of a sane size, in scientific notation when
/// it is huge or tiny (`1e308`, not 309 digits; `1e-300`, not 300 zeros).
pub fn show_number(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-6..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// KV tokens per worker at most (`num_gpu_blocks * block_size`): far beyond any GPU, and low
/// enough that token arithmetic never overflows.
pub(crate) const MAX_KV_TOKENS: usize = 1 << 40;

impl EngineConfig {
    /// The batching behaviour these settings select.
    pub fn policy(&self) -> BatchingPolicy {
        BatchingPolicy::of(self.engine_type, self.preemption_mode)
    }

    /// Checks that the settings can work together: sizes positive and the pool within
    /// `MAX_KV_TOKENS` (2^40 tokens), speed-up ratios positive (infinity allowed), SGLang's chunk a
    /// positive multiple of the block size within its per-pass prefill budget, and a host tier
    /// only where it is modelled.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        if self.block_size == 0 {
            return bad("--block-size must be positive");
        }
        if self.num_gpu_blocks == 0 {
            return bad("--num-gpu-blocks must be positive");
        }
        if self
            .num_gpu_blocks
            .checked_mul(self.block_size)
            .is_none_or(|t| t > MAX_KV_TOKENS)
        {
            return bad("--num-gpu-blocks x --block-size must be at most 2^40 tokens");
        }
        if self.max_num_seqs == 0 {
            return bad("--max-num-seqs must be positive");
        }
        if self.max_num_batched_tokens == 0 {
            return bad("--max-num-batched-tokens must be positive");
        }
        let ratios = [
            self.latency.speedup_ratio,
            self.latency.decode_speedup_ratio,
        ];
        if ratios.iter().any(|r| r.is_nan() || *r <= 0.0) {
            return bad("speed-up ratios must be positive (inf means no delay)");
        }
        if self.policy().planner == Planner::SglangExtend {
            let s = &self.sglang;
            if s.chunked_prefill_size == 0 || s.chunked_prefill_size % self.block_size != 0 {
                return bad(
                    "SGLang's chunked prefill size must be a positive multiple of --block-size",
                );
            }
            if s.max_prefill_tokens < s.chunked_prefill_size {
                return bad(
                    "SGLang's max prefill tokens must be at least its chunked prefill size",
                );
            }
            let ratios = [
                s.init_new_token_ratio,
                s.min_new_token_ratio_factor,
                s.schedule_conservativeness,
            ];
            if ratios.iter().any(|r| !(r.is_finite() && *r >= 0.0))
                || s.new_token_ratio_decay_steps == 0
            {
                return bad("SGLang's new-token ratios must be finite and >= 0, with at least one decay step");
            }
        }
        if self.max_model_len == Some(0) {
            return bad("--max-model-len must be positive");
        }
        if let Some(g2) = &self.g2 {
            if self.engine_type != EngineType::Vllm {
                return bad(
                    "--num-g2-blocks needs --engine-type vllm (as in Dynamo's KVBM mocker)",
                );
            }
            if !self.enable_prefix_caching {
                return bad("--num-g2-blocks needs prefix caching (drop --no-prefix-caching)");
            }
            if g2.num_blocks == 0 {
                return bad("--num-g2-blocks must be positive");
            }
            if g2.kv_bytes_per_token == 0 {
                return bad(
                    "--num-g2-blocks needs --kv-bytes-per-token (or --model-config) to time transfers",
                );
            }
            if g2
                .kv_bytes_per_token
                .checked_mul(self.block_size as u64)
                .is_none()
            {
                return bad("--kv-bytes-per-token x --block-size overflows 64 bits");
            }
            let bws = [g2.bandwidth_g1_to_g2_gbps, g2.bandwidth_g2_to_g1_gbps];
            if bws.iter().any(|b| b.is_nan() || *b < 0.0) {
                return bad("--bandwidth-g1-to-g2-gbps and --bandwidth-g2-to-g1-gbps must be >= 0 (0 = instant)");
            }
        }
        Ok(())
    }

    /// KV tokens one worker's pool holds.
    pub fn kv_capacity_tokens(&self) -> usize {
        self.num_gpu_blocks.saturating_mul(self.block_size)
    }

    /// Settings that are valid but make part of a run useless, as sentences for a warning:
    /// flags the flavour ignores, and limits under which requests the context length allows
    /// are refused at submission.
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let policy = self.policy();
        if !self.enable_chunked_prefill && !policy.honours_chunked_prefill_flag {
            out.push(
                "--no-chunked-prefill has no effect with --engine-type sglang (it prefills in \
                 chunks of its own size)"
                    .to_string(),
            );
        }
        let victim_from_flag = policy.preempts && policy.victim != VictimOrder::FewestGenerated;
        if self.preemption_mode != PreemptionMode::Lifo && !victim_from_flag {
            out.push(format!(
                "--preemption-mode has no effect with --engine-type {}",
                self.engine_type
            ));
        }
        if let Some(max_model_len) = self.max_model_len {
            if !self.enable_chunked_prefill
                && policy.honours_chunked_prefill_flag
                && self.max_num_batched_tokens < max_model_len
            {
                out.push(format!(
                    "without chunked prefill, prompts longer than --max-num-batched-tokens ({}) \
                     are refused, although --max-model-len is {max_model_len}",
                    self.max_num_batched_tokens
                ));
            }
            let capacity = self.kv_capacity_tokens();
            if capacity < max_model_len {
                out.push(format!(
                    "a worker's KV pool holds {capacity} tokens (--num-gpu-blocks {} x \
                     --block-size {}), less than --max-model-len {max_model_len}: requests \
                     needing more are refused",
                    self.num_gpu_blocks, self.block_size
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;

    #[test]
    fn errors_write_huge_numbers_compactly_and_call_themselves_settings() {
        assert_eq!(show_number(1e308), "1e308");
        assert_eq!(show_number(-1e308), "-1e308");
        assert_eq!(show_number(1e-300), "1e-300");
        assert_eq!(show_number(0.5), "0.5");
        assert_eq!(show_number(f64::INFINITY), "inf");
        let mut config = ClusterConfig::default();
        config.router.overlap_score_weight = 1e308;
        let e = config.validate().expect_err("out of range");
        assert_eq!(
            e.to_string(),
            "invalid setting: --overlap-score-weight must be a number between 0 and 1e6, got 1e308"
        );
        let mut config = ClusterConfig::default();
        config.router.temperature = -1e308;
        let e = config.validate().expect_err("negative");
        assert!(e.to_string().ends_with("got -1e308"), "{e}");
    }
}
