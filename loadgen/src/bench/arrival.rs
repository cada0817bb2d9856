//! Open-loop arrivals: the inter-arrival distribution and the seeded send offsets (vLLM's
//! `--burstiness`: gamma gaps with shape `burstiness` and mean `1 / rate`; 1 is Poisson).

use clap::ValueEnum;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::limits;

/// Open-loop inter-arrival distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Equal gaps.
    Constant,
    /// Gamma gaps with shape --burstiness.
    Gamma,
}

/// A standard normal draw (Box-Muller).
pub(super) fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A gamma draw with `shape` and scale 1 (Marsaglia and Tsang).
fn gamma(rng: &mut ChaCha8Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = 1.0 - rng.gen::<f64>();
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = 1.0 - rng.gen::<f64>();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// Open-loop send offsets (seconds): request 0 at 0, then gaps, at most `count` offsets (at
/// most `limits::MAX_REQUESTS` when None) and none past `limit_s`. An infinite rate needs a
/// `count`.
pub fn arrival_offsets(
    rate: f64,
    arrival: Arrival,
    burstiness: f64,
    count: Option<usize>,
    limit_s: f64,
    seed: u64,
) -> Vec<f64> {
    let count = match count {
        Some(n) => n,
        None if rate.is_infinite() || limit_s.is_infinite() => return Vec::new(),
        None => limits::MAX_REQUESTS,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xA11_1FA1);
    let mut out = Vec::new();
    let mut t = 0.0;
    while out.len() < count && t <= limit_s {
        out.push(t);
        if rate.is_infinite() {
            continue;
        }
        let mean = 1.0 / rate;
        t += match arrival {
            Arrival::Constant => mean,
            Arrival::Poisson => -(1.0 - rng.gen::<f64>()).ln() * mean,
            Arrival::Gamma => gamma(&mut rng, burstiness) * mean / burstiness,
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_requested_rate() {
        for arrival in [Arrival::Poisson, Arrival::Constant, Arrival::Gamma] {
            let t = arrival_offsets(100.0, arrival, 0.5, Some(4001), f64::INFINITY, 1);
            assert_eq!(t.len(), 4001);
            let rate = 4000.0 / t[4000];
            assert!((rate - 100.0).abs() < 8.0, "{arrival:?} {rate}");
        }
        assert!(
            arrival_offsets(f64::INFINITY, Arrival::Poisson, 1.0, Some(5), 1.0, 1)
                .iter()
                .all(|&t| t == 0.0)
        );
        assert_eq!(
            arrival_offsets(10.0, Arrival::Constant, 1.0, Some(100), 0.35, 1).len(),
            4
        );
    }
}
