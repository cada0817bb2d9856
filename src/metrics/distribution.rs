//! [`Distribution`]: the summary every latency row shows, and the rank rule that reads
//! percentiles from a sorted sample (Dynamo's offline-replay rule).

use serde::Serialize;

/// Index of the element reported as percentile `p` of `n` sorted values.
pub(super) fn percentile_rank(n: usize, p: f64) -> usize {
    if n == 0 {
        return 0;
    }
    let r = ((n - 1) as f64 * p / 100.0).round();
    (r.max(0.0) as usize).min(n - 1)
}

/// Summary of a sample: what every latency row of the report shows.
///
/// Percentiles are the value at rank `round((n - 1) * p / 100)` of the sorted sample; `std` is the
/// population standard deviation. An empty sample gives all zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// 50th percentile.
    pub median: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation (divides by n).
    pub std: f64,
}

impl Distribution {
    /// All zeros: the distribution of an empty sample.
    pub const ZERO: Distribution = Distribution {
        mean: 0.0,
        min: 0.0,
        max: 0.0,
        median: 0.0,
        p75: 0.0,
        p90: 0.0,
        p95: 0.0,
        p99: 0.0,
        std: 0.0,
    };

    /// The exact distribution of `samples` (sorted in place; NaNs sort last).
    pub fn from_samples(samples: &mut [f64]) -> Distribution {
        let n = samples.len();
        if n == 0 {
            return Distribution::ZERO;
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        let at = |p: f64| samples[percentile_rank(n, p)];
        Distribution {
            mean,
            min: samples[0],
            max: samples[n - 1],
            median: at(50.0),
            p75: at(75.0),
            p90: at(90.0),
            p95: at(95.0),
            p99: at(99.0),
            std: var.sqrt(),
        }
    }

    /// The values in report order, with their key stems (`median` is `median`, not `p50`).
    pub(super) fn named(&self) -> [(&'static str, f64); 9] {
        [
            ("mean", self.mean),
            ("min", self.min),
            ("max", self.max),
            ("median", self.median),
            ("p75", self.p75),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("std", self.std),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn exact_distribution_uses_rounded_rank_and_population_std() {
        let mut xs: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let d = Distribution::from_samples(&mut xs);
        assert_eq!((d.min, d.max, d.mean), (1.0, 10.0, 5.5));
        // rank round(9 * 0.5) = round(4.5) = 5 -> 6; round(6.75) = 7 -> 8; round(8.1) = 8 -> 9.
        assert_eq!(
            (d.median, d.p75, d.p90, d.p95, d.p99),
            (6.0, 8.0, 9.0, 10.0, 10.0)
        );
        assert!(close(d.std, 8.25f64.sqrt()));
        assert_eq!(Distribution::from_samples(&mut []), Distribution::ZERO);
        let one = Distribution::from_samples(&mut [4.0]);
        assert_eq!((one.median, one.p99, one.std), (4.0, 4.0, 0.0));
    }
}
