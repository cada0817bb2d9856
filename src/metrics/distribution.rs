//! [`Distribution`]: the summary every latency row shows, and the rank rules that read
//! percentiles from a sorted sample. Every percentile in the workspace (replay report, live
//! reports, multi-turn report, indexer benchmark) is read through this type.

use serde::Serialize;

/// Summary of a sample: what every latency row of the report shows.
///
/// Percentiles are the value at rank `round((n - 1) * p / 100)` of the sorted sample (Dynamo's
/// offline-replay rule, `Distribution::rank`); `std` is the population standard deviation. An
/// empty sample gives all zeros.
///
/// Two Dynamo benchmarks read ranks differently, and the tools that reproduce them keep their
/// rule as a named function of this type: [`Distribution::percentile_multiturn`] and
/// [`Distribution::percentile_mooncake`].
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
    pub(crate) p75: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 95th percentile.
    pub(crate) p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation (divides by n).
    pub(crate) std: f64,
}

impl Distribution {
    /// All zeros: the distribution of an empty sample.
    pub(crate) const ZERO: Distribution = Distribution {
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

    /// Index of percentile `p` (0..=100) among `n` sorted values by Dynamo's offline-replay rule:
    /// `round((n - 1) * p / 100)` (halves away from zero), clamped to `0..=n - 1` (0 when `n == 0`). The rule of every figure
    /// of the replay report, exact ([`Distribution::from_samples`]) or sketched
    /// ([`QuantileSketch`](super::QuantileSketch)).
    pub(crate) fn rank(n: usize, p: f64) -> usize {
        if n == 0 {
            return 0;
        }
        let r = ((n - 1) as f64 * p / 100.0).round();
        (r.max(0.0) as usize).min(n - 1)
    }

    /// Percentile `p` (0..=100) of an ascending-sorted sample by `Distribution::rank`; None when
    /// empty.
    pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
        sorted.get(Distribution::rank(sorted.len(), p)).copied()
    }

    /// Percentile `permille / 10` of an ascending-sorted sample by the rule of Dynamo's
    /// multi-turn benchmark (`LatencyStats`): index `n * permille / 1000` in integer arithmetic
    /// (`p50 = s[n / 2]`, `p95 = s[n * 95 / 100]`), clamped to the sample; None when empty.
    ///
    /// Not the replay rule: it counts from `n` instead of `n - 1` and rounds down, so it often
    /// reads one rank higher (n = 100: p99 is `s[99]`, the maximum, where the replay takes
    /// `s[98]`). `loadgen multiturn` keeps it so its figures are the ones Dynamo's bench prints.
    pub fn percentile_multiturn<T: Copy>(sorted: &[T], permille: usize) -> Option<T> {
        let n = sorted.len();
        let i = n.saturating_mul(permille) / 1000;
        sorted.get(i.min(n.checked_sub(1)?)).copied()
    }

    /// Percentile `permille / 10` of an ascending-sorted sample by the rule of Dynamo's KV-indexer
    /// benchmark (`mooncake_bench`, `latency_p99_us`): index `(n - 1) * permille / 1000` in integer
    /// arithmetic, i.e. the replay's rank rounded down instead of to nearest; None when empty.
    ///
    /// `indexer_bench` keeps it so its `p50_ns`/`p99_ns`/`p999_ns` read the same ranks as the
    /// bench it reproduces (n = 2: the median is `s[0]`, where the replay rule takes `s[1]`).
    pub fn percentile_mooncake<T: Copy>(sorted: &[T], permille: usize) -> Option<T> {
        let last = sorted.len().checked_sub(1)?;
        sorted
            .get((last.saturating_mul(permille) / 1000).min(last))
            .copied()
    }

    /// The exact distribution of `samples` (sorted in place; NaNs sort last).
    pub fn from_samples(samples: &mut [f64]) -> Distribution {
        let n = samples.len();
        if n == 0 {
            return Distribution::ZERO;
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        let at = |p: f64| samples[Distribution::rank(n, p)];
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

    #[test]
    fn percentile_reads_the_same_rank_as_from_samples() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(Distribution::percentile(&v, 50.0), Some(6));
        assert_eq!(Distribution::percentile(&v, 90.0), Some(9));
        assert_eq!(Distribution::percentile(&v, 100.0), Some(10));
        assert_eq!(Distribution::percentile(&v, 0.0), Some(1));
        assert_eq!(Distribution::percentile::<u64>(&[], 50.0), None);
        for n in 1..=40usize {
            let mut xs: Vec<f64> = (0..n).map(|i| (i * i) as f64).collect();
            let sorted = xs.clone();
            let d = Distribution::from_samples(&mut xs);
            for (p, got) in [
                (50.0, d.median),
                (75.0, d.p75),
                (95.0, d.p95),
                (99.0, d.p99),
            ] {
                assert_eq!(
                    Distribution::percentile(&sorted, p),
                    Some(got),
                    "n={n} p={p}"
                );
            }
        }
    }

    #[test]
    fn multiturn_rule_counts_from_n_and_rounds_down() {
        assert_eq!(
            Distribution::percentile_multiturn(&[1, 2, 3, 4, 5], 500),
            Some(3)
        );
        assert_eq!(
            Distribution::percentile_multiturn(&[1, 2, 3, 4, 5], 950),
            Some(5)
        );
        let v: Vec<u64> = (1..=100).collect();
        let at = |permille| Distribution::percentile_multiturn(&v, permille);
        assert_eq!(
            (at(500), at(950), at(990), at(1000)),
            (Some(51), Some(96), Some(100), Some(100))
        );
        // The replay rule reads one rank lower here.
        assert_eq!(Distribution::percentile(&v, 99.0), Some(99));
        assert_eq!(Distribution::percentile_multiturn::<u64>(&[], 500), None);
    }

    #[test]
    fn mooncake_rule_rounds_the_replay_rank_down() {
        assert_eq!(Distribution::percentile_mooncake(&[10, 20], 500), Some(10));
        assert_eq!(Distribution::percentile(&[10, 20], 50.0), Some(20));
        let v: Vec<u64> = (0..1000).collect();
        let at = |permille| Distribution::percentile_mooncake(&v, permille);
        // (999 * p) / 1000 rounded down.
        assert_eq!(
            (at(500), at(990), at(999), at(1000)),
            (Some(499), Some(989), Some(998), Some(999))
        );
        assert_eq!(Distribution::percentile_mooncake::<u64>(&[], 500), None);
        assert_eq!(Distribution::percentile_mooncake(&[7], 999), Some(7));
    }
}
