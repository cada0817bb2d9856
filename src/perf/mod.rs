//! Latency models: how long a pass takes, from the work scheduled in it.
//!
//! All models predict milliseconds of GPU time; [`ScaledLatency`] divides them by the configured
//! speed-up ratios and turns them into [`SimDuration`]s. The models: [`Polynomial`] (Dynamo's
//! default fit), [`Fixed`] constants, and [`Profiled`] tables measured on a real engine
//! (Dynamo mocker's `.npz` profiles; see [`profile`]).

pub mod profile;

pub use profile::{ProfileError, ProfileTables, Profiled};

use crate::time::SimDuration;

/// The prefill work of one pass, aggregated over the requests that scheduled prompt tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillBatch {
    /// Requests that scheduled prompt tokens in this pass.
    pub num_requests: usize,
    /// Sum over those requests of the prompt position reached after this pass's chunk.
    pub total_isl: usize,
    /// Sum over those requests of the prompt tokens already computed or cached before the chunk.
    pub total_prefix: usize,
}

impl PrefillBatch {
    /// New prompt tokens as the latency model sees them: `n * (mean isl - mean prefix)`, with the
    /// means taken by integer division (Dynamo's aggregation).
    pub(crate) fn new_tokens(&self) -> usize {
        if self.num_requests == 0 {
            return 0;
        }
        let isl = self.total_isl / self.num_requests;
        let prefix = self.total_prefix / self.num_requests;
        self.num_requests * isl.saturating_sub(prefix)
    }
}

/// The decode work of one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeBatch {
    /// Requests emitting a token at the end of this pass.
    pub num_requests: usize,
    /// Sum of those requests' logical context lengths.
    pub active_kv_tokens: usize,
    /// KV capacity of the worker in tokens (`num_gpu_blocks * block_size`).
    pub total_kv_tokens: usize,
}

/// A model of pass duration in milliseconds of unscaled GPU time.
pub trait LatencyModel: Send + Sync + std::fmt::Debug {
    /// Prefill time of a batch, 0 when it has no new tokens.
    fn prefill_ms(&self, batch: &PrefillBatch) -> f64;
    /// Decode time of one step over `batch`, 0 when nobody decodes.
    fn decode_ms(&self, batch: &DecodeBatch) -> f64;
    /// A short description for reports: the model and, for a profile, its file.
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

/// Dynamo's default polynomial fit (one H100-class profile, used for every engine type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Polynomial {
    /// Prefill coefficients `[a, b, c]` of `a*T^2 + b*T + c`, T = new prompt tokens.
    pub prefill: [f64; 3],
    /// Decode coefficients `[a, b, c]` of `a*u^2 + b*u + c`, u = KV utilisation in [0, 1].
    pub decode: [f64; 3],
}

impl Default for Polynomial {
    fn default() -> Self {
        Polynomial {
            prefill: [4.209989e-07, 1.518344e-02, 16.50142],
            decode: [-25.74, 54.01, 5.74],
        }
    }
}

impl LatencyModel for Polynomial {
    fn prefill_ms(&self, batch: &PrefillBatch) -> f64 {
        let t = batch.new_tokens() as f64;
        if t == 0.0 {
            return 0.0;
        }
        let [a, b, c] = self.prefill;
        (a * t * t + b * t + c).max(0.0)
    }

    fn decode_ms(&self, batch: &DecodeBatch) -> f64 {
        if batch.num_requests == 0 {
            return 0.0;
        }
        let u = if batch.total_kv_tokens == 0 {
            1.0
        } else {
            (batch.active_kv_tokens as f64 / batch.total_kv_tokens as f64).min(1.0)
        };
        let [a, b, c] = self.decode;
        (a * u * u + b * u + c).max(1.0)
    }

    fn describe(&self) -> String {
        format!(
            "polynomial prefill {:?} decode {:?}",
            self.prefill, self.decode
        )
    }
}

/// Constant times per pass: useful for tests and for checking a live server's timing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fixed {
    /// Time of any pass that prefills at least one token.
    pub prefill_ms: f64,
    /// Time of any decode step.
    pub decode_ms: f64,
}

impl LatencyModel for Fixed {
    fn prefill_ms(&self, batch: &PrefillBatch) -> f64 {
        if batch.new_tokens() == 0 {
            0.0
        } else {
            self.prefill_ms
        }
    }

    fn decode_ms(&self, batch: &DecodeBatch) -> f64 {
        if batch.num_requests == 0 {
            0.0
        } else {
            self.decode_ms
        }
    }

    fn describe(&self) -> String {
        format!(
            "fixed prefill {} ms decode {} ms",
            self.prefill_ms, self.decode_ms
        )
    }
}

/// A latency model plus the speed-up ratios that scale it to simulated time.
#[derive(Clone, Debug)]
pub struct ScaledLatency {
    /// The unscaled model.
    pub model: std::sync::Arc<dyn LatencyModel>,
    /// Divides prefill and decode time. Values <= 0 or non-finite leave times unscaled.
    pub speedup_ratio: f64,
    /// Divides decode time further (speculative decoding).
    pub decode_speedup_ratio: f64,
}

impl ScaledLatency {
    /// Scaled prefill duration of a batch.
    pub fn prefill(&self, batch: &PrefillBatch) -> SimDuration {
        SimDuration::from_millis_f64(self.prefill_ms(batch))
    }

    /// Scaled decode duration of one step.
    pub fn decode(&self, batch: &DecodeBatch) -> SimDuration {
        SimDuration::from_millis_f64(self.decode_ms(batch))
    }

    /// Scaled prefill time of a batch in milliseconds, not rounded; 0 when not a positive
    /// finite time.
    pub(crate) fn prefill_ms(&self, batch: &PrefillBatch) -> f64 {
        positive(scale(self.model.prefill_ms(batch), self.speedup_ratio))
    }

    /// Scaled decode time of one step in milliseconds, not rounded; 0 when not a positive
    /// finite time.
    pub(crate) fn decode_ms(&self, batch: &DecodeBatch) -> f64 {
        let ratio = self.speedup_ratio * self.decode_speedup_ratio;
        positive(scale(self.model.decode_ms(batch), ratio))
    }
}

/// `ms` when it is a positive finite time, else 0 (as [`SimDuration::from_millis_f64`] reads it).
fn positive(ms: f64) -> f64 {
    if ms.is_finite() && ms > 0.0 {
        ms
    } else {
        0.0
    }
}

/// Divides by the speed-up ratio; an infinite ratio means no delay at all, and a ratio that is
/// not positive leaves the time unscaled (Dynamo's behaviour; validation rejects those).
fn scale(ms: f64, ratio: f64) -> f64 {
    if ratio == f64::INFINITY {
        0.0
    } else if ratio.is_finite() && ratio > 0.0 {
        ms / ratio
    } else {
        ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(tokens: usize) -> PrefillBatch {
        PrefillBatch {
            num_requests: 1,
            total_isl: tokens,
            total_prefix: 0,
        }
    }

    fn decode(u: f64) -> DecodeBatch {
        let total = 1_000_000;
        DecodeBatch {
            num_requests: 1,
            active_kv_tokens: (u * total as f64) as usize,
            total_kv_tokens: total,
        }
    }

    #[test]
    fn polynomial_prefill_worked_values() {
        let p = Polynomial::default();
        assert!((p.prefill_ms(&prefill(1000)) - 32.105_858_9).abs() < 1e-6);
        assert!((p.prefill_ms(&prefill(8192)) - 169.136_918).abs() < 1e-5);
        assert_eq!(p.prefill_ms(&prefill(0)), 0.0);
    }

    #[test]
    fn polynomial_decode_worked_values() {
        let p = Polynomial::default();
        assert!((p.decode_ms(&decode(0.0)) - 5.74).abs() < 1e-9);
        assert!((p.decode_ms(&decode(0.5)) - 26.31).abs() < 1e-9);
        assert!((p.decode_ms(&decode(1.0)) - 34.01).abs() < 1e-9);
        // Utilisation is clamped to 1 and an empty batch costs nothing.
        let over = DecodeBatch {
            num_requests: 1,
            active_kv_tokens: 3,
            total_kv_tokens: 1,
        };
        assert!((p.decode_ms(&over) - 34.01).abs() < 1e-9);
        assert_eq!(p.decode_ms(&DecodeBatch::default()), 0.0);
    }

    #[test]
    fn batch_tokens_use_integer_means() {
        // Two requests: isl 100 and 51, prefixes 0 and 10: means 75 and 5 -> 2 * 70.
        let b = PrefillBatch {
            num_requests: 2,
            total_isl: 151,
            total_prefix: 10,
        };
        assert_eq!(b.new_tokens(), 140);
    }

    #[test]
    fn speedup_divides_and_decode_ratio_compounds() {
        let s = ScaledLatency {
            model: std::sync::Arc::new(Polynomial::default()),
            speedup_ratio: 2.0,
            decode_speedup_ratio: 2.0,
        };
        assert_eq!(
            s.prefill(&prefill(1000)),
            SimDuration::from_nanos(16_052_929)
        );
        assert_eq!(s.decode(&decode(0.0)), SimDuration::from_micros(1_435));
        let unscaled = ScaledLatency {
            speedup_ratio: 0.0,
            ..s.clone()
        };
        assert_eq!(
            unscaled.decode(&decode(0.0)),
            SimDuration::from_micros(5_740)
        );
    }

    #[test]
    fn fixed_model_ignores_sizes() {
        let f = Fixed {
            prefill_ms: 10.0,
            decode_ms: 2.0,
        };
        assert_eq!(f.prefill_ms(&prefill(5)), 10.0);
        assert_eq!(f.prefill_ms(&prefill(0)), 0.0);
        assert_eq!(f.decode_ms(&decode(0.9)), 2.0);
    }
}
