//! What one worker sustains, from its latency model: the per-worker capacity the `load` policy
//! divides its predicted load by, offline (`mockserve replay --autoscale load`) and live
//! (`mockserve fleet --elastic --autoscale load`) alike ([`worker_capacity`]), and the share of
//! it a worker may use and still meet the SLO ([`slo_utilisation`], [`slo_capacity`]).

use crate::perf::{DecodeBatch, PrefillBatch};
use crate::scheduler::EngineConfig;
use crate::slo::Slo;

/// The decode step bound when no TPOT objective is set: 50 ms.
pub const DEFAULT_TPOT_MS: f64 = 50.0;

/// The share of requests the policies plan to let miss the TTFT objective through queueing:
/// 1 % (they provision for the 99th percentile).
pub const PLANNED_MISS: f64 = 0.01;

/// The largest utilisation `ρ` of a worker at which a request whose own prefill takes
/// `service_s` still gets its first token within `ttft_s` with probability `1 − miss`, the
/// worker's queue taken as M/M/1: its wait exceeds `t` with probability `ρ · e^(−(1−ρ) t / S)`,
/// and the wait it may have is `t = ttft − S` (0 when the prefill alone takes the objective:
/// then `ρ = miss`, the chance of finding the worker busy). Without a TTFT objective, 1.
pub fn slo_utilisation(service_s: f64, ttft_s: Option<f64>, miss: f64) -> f64 {
    let Some(ttft_s) = ttft_s else {
        return 1.0;
    };
    let miss = miss.clamp(0.0, 1.0);
    if !(service_s.is_finite() && service_s > 0.0) {
        return 1.0;
    }
    let slack = (ttft_s - service_s).max(0.0) / service_s;
    let late = |rho: f64| rho * (-(1.0 - rho) * slack).exp();
    // `late` rises with ρ from 0 to 1: bisect for late(ρ) = miss.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if late(mid) <= miss {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Why `--autoscale-isl` and `--autoscale-osl` (the lengths a worker's capacity is sized at)
/// are refused with an external policy, in `mockserve replay` and `mockserve fleet` alike.
pub const EXTERNAL_SIZES_ITSELF: &str = "--autoscale-isl and --autoscale-osl size the load and \
     saturation policies; an external policy sizes its workers itself";

/// One worker's capacity within an SLO, at mean prompt length `isl` and output length `osl`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SloCapacity {
    /// Prompt tokens per second at full use ([`worker_capacity`]).
    pub prefill_tokens_per_s: f64,
    /// Output tokens per second at full use, within the TPOT objective ([`worker_capacity`]).
    pub decode_tokens_per_s: f64,
    /// The share of that a worker may use ([`slo_utilisation`] at [`PLANNED_MISS`], the
    /// service time being one mean prompt's prefill).
    pub utilisation: f64,
    /// Requests per second one worker takes at that utilisation.
    pub requests_per_s: f64,
    /// Requests in flight on one worker at that rate (Little's law: the rate times a request's
    /// time on the worker, its prefill plus `osl` decode steps of a lone sequence).
    pub running: f64,
}

/// [`SloCapacity`] of a worker of `engine` under `slo` (TPOT 50 ms when none is set).
pub fn slo_capacity(engine: &EngineConfig, isl: usize, osl: usize, slo: &Slo) -> SloCapacity {
    let (prefill, decode) =
        worker_capacity(engine, isl, osl, slo.itl_ms.unwrap_or(DEFAULT_TPOT_MS));
    let isl = isl.max(1);
    let service_s = isl as f64 / prefill;
    let utilisation = slo_utilisation(service_s, slo.ttft_ms.map(|ms| ms / 1000.0), PLANNED_MISS);
    // One request's share of a worker: its prefill and its decode tokens.
    let busy_s = service_s + osl as f64 / decode;
    let requests_per_s = if busy_s > 0.0 {
        utilisation / busy_s
    } else {
        f64::MAX
    };
    let total_kv_tokens = engine.num_gpu_blocks * engine.block_size;
    let step_ms = engine.latency.decode_ms(&DecodeBatch {
        num_requests: 1,
        active_kv_tokens: isl + osl / 2,
        total_kv_tokens,
    });
    let stay_s = service_s + osl as f64 * step_ms / 1000.0;
    SloCapacity {
        prefill_tokens_per_s: prefill,
        decode_tokens_per_s: decode,
        utilisation,
        requests_per_s,
        running: requests_per_s * stay_s,
    }
}

/// Tokens per second one worker sustains at mean prompt length `isl` and mean output length
/// `osl`: `(prefill, decode)`.
///
/// - prefill: the prompt tokens of one `isl`-token prompt (no cache hit) over the time the
///   latency model gives its prefill;
/// - decode: the output tokens per second of the largest batch at mean context `isl + osl / 2`
///   whose step stays within `tpot_ms` and whose context fits the KV cache (at least one
///   sequence: a worker always decodes one).
///
/// Times are the latency model's milliseconds, scaled by the engine's speed-up ratios and not
/// rounded; a model that answers 0 gives an unbounded (`f64::MAX`) capacity.
pub fn worker_capacity(engine: &EngineConfig, isl: usize, osl: usize, tpot_ms: f64) -> (f64, f64) {
    let isl = isl.max(1);
    let per_s = |tokens: usize, ms: f64| {
        if ms > 0.0 {
            tokens as f64 / (ms / 1000.0)
        } else {
            f64::MAX
        }
    };
    let prefill_ms = engine.latency.prefill_ms(&PrefillBatch {
        num_requests: 1,
        total_isl: isl,
        total_prefix: 0,
    });
    let context = isl + osl / 2;
    let total_kv_tokens = engine.num_gpu_blocks * engine.block_size;
    let mut decode = 0.0f64;
    for b in 1..=engine.max_num_seqs.max(1) {
        if b > 1 && b * context > total_kv_tokens {
            break;
        }
        let ms = engine.latency.decode_ms(&DecodeBatch {
            num_requests: b,
            active_kv_tokens: b * context,
            total_kv_tokens,
        });
        if b > 1 && ms > tpot_ms {
            break;
        }
        decode = per_s(b, ms);
    }
    (per_s(isl, prefill_ms), decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::Fixed;
    use std::sync::Arc;

    fn fixed(prefill_ms: f64, decode_ms: f64) -> EngineConfig {
        let mut engine = EngineConfig::default();
        engine.latency.model = Arc::new(Fixed {
            prefill_ms,
            decode_ms,
        });
        engine.latency.speedup_ratio = 1.0;
        engine.latency.decode_speedup_ratio = 1.0;
        engine
    }

    #[test]
    fn capacity_follows_the_latency_model_the_kv_cache_and_the_tpot_bound() {
        // A 1000-token prefill in 100 ms; a decode step of any batch in 10 ms, so the largest
        // batch that fits (max_num_seqs, KV permitting) sets the decode rate.
        let mut engine = fixed(100.0, 10.0);
        engine.max_num_seqs = 8;
        engine.num_gpu_blocks = 10_000;
        assert_eq!(worker_capacity(&engine, 1000, 100, 50.0), (10_000.0, 800.0));
        // Room for only two sequences of 1050 tokens: two decode at once.
        engine.num_gpu_blocks = 2 * 1050 / engine.block_size + 1;
        assert_eq!(worker_capacity(&engine, 1000, 100, 50.0).1, 200.0);
        // A step of 60 ms is over a 50 ms bound: one sequence only (a worker always decodes
        // one), 1 / 0.06 s.
        let mut slow = fixed(100.0, 60.0);
        slow.max_num_seqs = 8;
        let (_, decode) = worker_capacity(&slow, 1000, 100, DEFAULT_TPOT_MS);
        assert!((decode - 1.0 / 0.06).abs() < 1e-9, "{decode}");
        // Within a 100 ms bound all eight.
        let (_, decode) = worker_capacity(&slow, 1000, 100, 100.0);
        assert!((decode - 8.0 / 0.06).abs() < 1e-9, "{decode}");
        // The speed-up ratio scales both, unrounded: 1000 tokens in 100 / 3 ms.
        slow.latency.speedup_ratio = 3.0;
        let (prefill, _) = worker_capacity(&slow, 1000, 100, 100.0);
        assert!((prefill - 30_000.0).abs() < 1e-6, "{prefill}");
    }

    #[test]
    fn the_slo_utilisation_solves_the_m_m_1_wait_tail() {
        // Prefill 0.5 s, TTFT 2 s: slack 3 service times. At the solution the tail is `miss`.
        let rho = slo_utilisation(0.5, Some(2.0), 0.01);
        let tail = rho * (-(1.0 - rho) * 3.0).exp();
        assert!((tail - 0.01).abs() < 1e-9, "{rho} {tail}");
        assert!(rho > 0.13 && rho < 0.14, "{rho}");
        // A looser miss or objective allows more; a prefill as long as the objective allows
        // only the chance of finding the worker busy; no objective, all of it.
        assert!(slo_utilisation(0.5, Some(2.0), 0.05) > rho);
        assert!(slo_utilisation(0.5, Some(4.0), 0.01) > rho);
        assert!((slo_utilisation(2.0, Some(1.0), 0.01) - 0.01).abs() < 1e-9);
        assert_eq!(slo_utilisation(0.5, None, 0.01), 1.0);
    }

    #[test]
    fn the_slo_capacity_divides_the_planned_utilisation_by_a_request_s_work() {
        // Prefill 1000 tokens in 100 ms; decode steps of 10 ms, up to 8 at once: 800 tokens/s.
        let mut engine = fixed(100.0, 10.0);
        engine.max_num_seqs = 8;
        let slo: Slo = "ttft=1000ms,tpot=50ms".parse().unwrap();
        let c = slo_capacity(&engine, 1000, 80, &slo);
        assert_eq!(
            (c.prefill_tokens_per_s, c.decode_tokens_per_s),
            (10_000.0, 800.0)
        );
        assert_eq!(c.utilisation, slo_utilisation(0.1, Some(1.0), PLANNED_MISS));
        // A request's work: 0.1 s of prefill and 80 / 800 = 0.1 s of decode.
        assert!((c.requests_per_s - c.utilisation / 0.2).abs() < 1e-9);
        // It stays 0.1 s + 80 steps of 10 ms = 0.9 s.
        assert!((c.running - c.requests_per_s * 0.9).abs() < 1e-9);
    }

    #[test]
    fn the_polynomial_model_gives_its_worked_values() {
        // Default engine: 1000 tokens prefill in 32.1058589 ms (the model's worked value).
        let engine = EngineConfig::default();
        let (prefill, decode) = worker_capacity(&engine, 1000, 100, 50.0);
        assert!(
            (prefill - 1000.0 / 0.032_105_858_9).abs() < 1e-3,
            "{prefill}"
        );
        assert!(decode > 0.0 && decode.is_finite());
    }
}
