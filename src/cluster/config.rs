//! The cluster's settings: pool sizes, the router, the serving topology (aggregated or
//! disaggregated with its KV link), and their validation.

use crate::router::{RouterConfig, RouterMode};
use crate::scheduler::{show_number, ConfigError, EngineConfig};
use crate::time::SimDuration;

/// Cluster settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Settings of every worker.
    pub engine: EngineConfig,
    /// Number of workers.
    pub num_workers: usize,
    /// Routing settings.
    pub router: RouterConfig,
    /// Seeds the router and the workers' token generators.
    pub seed: u64,
    /// Aggregated or disaggregated; in disaggregated mode `num_workers` is ignored.
    pub serving: ServingMode,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            engine: EngineConfig::default(),
            num_workers: 1,
            router: RouterConfig::default(),
            seed: 0,
            serving: ServingMode::Aggregated,
        }
    }
}

/// Workers in a pool at most (worker ids are `u32`; a larger pool is a typo, not a plan).
pub(crate) const MAX_WORKERS: usize = 1 << 16;

/// Largest `--overlap-score-weight`: beyond it the decode term of the KV cost vanishes anyway,
/// and weights near `f64::MAX` overflow the cost to infinity.
pub const MAX_OVERLAP_SCORE_WEIGHT: f64 = 1e6;

impl ClusterConfig {
    /// Checks that the settings can work together: the engine's
    /// ([`EngineConfig::validate`]), pool sizes within `1..=``MAX_WORKERS`, router weights
    /// finite and in range, bandwidths not negative. Run before anything starts; every driver's
    /// flags come through here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        self.engine.validate()?;
        if self.num_workers == 0 || self.num_workers > MAX_WORKERS {
            return bad("--num-workers must be between 1 and 65536");
        }
        if let ServingMode::Disagg {
            num_prefill_workers,
            num_decode_workers,
            kv_transfer,
        } = &self.serving
        {
            let pool = 1..=MAX_WORKERS;
            if !pool.contains(num_prefill_workers) || !pool.contains(num_decode_workers) {
                return bad(
                    "--num-prefill-workers and --num-decode-workers must be between 1 and 65536",
                );
            }
            if kv_transfer.bandwidth_gbps.is_nan() || kv_transfer.bandwidth_gbps < 0.0 {
                return bad("--kv-transfer-bandwidth must be >= 0 GB/s (0 disables the delay)");
            }
        }
        if self.router.queue_threshold.is_some() && self.router.mode != RouterMode::KvRouter {
            return bad("--router-queue-threshold needs --router-mode kv-router");
        }
        let weight = self.router.overlap_score_weight;
        if !(0.0..=MAX_OVERLAP_SCORE_WEIGHT).contains(&weight) {
            return Err(ConfigError(format!(
                "--overlap-score-weight must be a number between 0 and {MAX_OVERLAP_SCORE_WEIGHT:e}, got {}",
                show_number(weight)
            )));
        }
        let temperature = self.router.temperature;
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ConfigError(format!(
                "--router-temperature must be finite and >= 0, got {}",
                show_number(temperature)
            )));
        }
        if let Some(t) = self.router.queue_threshold {
            if !(t.is_finite() && t >= 0.0) {
                return Err(ConfigError(format!(
                    "--router-queue-threshold must be finite and >= 0, got {}",
                    show_number(t)
                )));
            }
        }
        Ok(())
    }

    /// Settings that are valid but make part of a run useless, as sentences for a warning:
    /// those of `EngineConfig::warnings`, plus router weights that the router mode ignores.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.engine.warnings();
        let defaults = RouterConfig::default();
        if self.router.mode != RouterMode::KvRouter
            && (self.router.overlap_score_weight != defaults.overlap_score_weight
                || self.router.temperature != defaults.temperature)
        {
            out.push(format!(
                "--overlap-score-weight and --router-temperature have no effect with \
                 --router-mode {}",
                self.router.mode
            ));
        }
        out
    }
}

/// Which prompt tokens a prefill→decode hand-off moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvTransferTimingMode {
    /// Every prompt token (Dynamo's default).
    #[default]
    FullPrompt,
    /// Only the prompt's full blocks not already cached at the decode worker, plus the tail.
    DestinationMissing,
}

impl std::str::FromStr for KvTransferTimingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full-prompt" | "full_prompt" => Ok(KvTransferTimingMode::FullPrompt),
            "destination-missing" | "destination_missing" => {
                Ok(KvTransferTimingMode::DestinationMissing)
            }
            _ => Err(format!(
                "unknown KV transfer timing mode {s:?} (expected full-prompt or destination-missing)"
            )),
        }
    }
}

/// How the KV of a prefilled prompt reaches its decode worker.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KvTransferConfig {
    /// KV bytes per token; None means the size is unknown and hand-offs take no time.
    pub kv_bytes_per_token: Option<u64>,
    /// Link bandwidth in GB/s (1e9 bytes); 0 disables the delay.
    pub bandwidth_gbps: f64,
    /// Which tokens are charged.
    pub timing_mode: KvTransferTimingMode,
}

impl Default for KvTransferConfig {
    fn default() -> Self {
        KvTransferConfig {
            kv_bytes_per_token: None,
            bandwidth_gbps: 64.0,
            timing_mode: KvTransferTimingMode::FullPrompt,
        }
    }
}

impl KvTransferConfig {
    /// Time to move `tokens` tokens of KV (Dynamo's `compute_prefill_handoff_delay_ms`), rounded
    /// to the nearest nanosecond.
    pub(crate) fn delay(&self, tokens: usize) -> SimDuration {
        match self.kv_bytes_per_token {
            Some(bytes) if self.bandwidth_gbps > 0.0 => {
                let us = tokens as f64 * bytes as f64 / (self.bandwidth_gbps * 1e3);
                SimDuration::from_micros_f64(us)
            }
            _ => SimDuration::ZERO,
        }
    }
}

/// The serving topology.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServingMode {
    /// `num_workers` workers that prefill and decode.
    #[default]
    Aggregated,
    /// Separate prefill and decode pools with a KV hand-off between them.
    Disagg {
        /// Prefill workers (behind the configured router).
        num_prefill_workers: usize,
        /// Decode workers (behind a load-aware router).
        num_decode_workers: usize,
        /// The prefill→decode link.
        kv_transfer: KvTransferConfig,
    },
}
