//! [`QuantileSketch`]: streaming percentiles with bounded relative error, for figures taken over
//! every token (no per-token memory).

use super::distribution::Distribution;

/// Relative accuracy of [`QuantileSketch`] quantiles (Dynamo's DDSketch setting).
pub(crate) const SKETCH_RELATIVE_ACCURACY: f64 = 0.001;

/// Positive values below this go to the sketch's zero bucket (bounds the number of bins).
const SKETCH_MIN_INDEXABLE: f64 = 1e-9;

/// Slots of the bin-index memo (a power of two).
const MEMO_SLOTS: usize = 1024;

/// A direct-mapped memo of `value bits -> bin index`: per-token figures repeat a small set of
/// values (gaps are sums of a few pass durations), and the memo spares their logarithm. A hit
/// returns exactly what [`QuantileSketch::bin_index`] computed for the same bits, so the sketch is
/// the same with or without it; it never takes part in equality.
#[derive(Clone, Default)]
struct BinMemo {
    /// `(value bits, bin index)`; allocated on first use. Key 0 (the value 0.0) never goes to a
    /// bin, so it marks an empty slot.
    slots: Vec<(u64, i64)>,
}

impl BinMemo {
    /// The bin of `x` (`x >= SKETCH_MIN_INDEXABLE`, finite), memoised.
    fn bin_index(&mut self, x: f64) -> i64 {
        if self.slots.is_empty() {
            self.slots = vec![(0, 0); MEMO_SLOTS];
        }
        let bits = x.to_bits();
        let slot = (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize & (MEMO_SLOTS - 1);
        let (key, index) = self.slots[slot];
        if key == bits {
            return index;
        }
        let index = QuantileSketch::bin_index(x);
        self.slots[slot] = (bits, index);
        index
    }
}

impl PartialEq for BinMemo {
    fn eq(&self, _: &BinMemo) -> bool {
        true
    }
}

impl std::fmt::Debug for BinMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BinMemo")
    }
}

/// Streaming quantiles with bounded relative error (DDSketch with unbounded logarithmic bins).
///
/// Values `x > 0` land in bin `ceil(log_gamma(x))` with `gamma = (1 + a) / (1 - a)`,
/// `a = `[`SKETCH_RELATIVE_ACCURACY`]; a bin's estimate `2 gamma^i / (gamma + 1)` is within `a` of
/// every value in it. Zero (and tiny positive) values have their own bucket. Count, min, max, mean
/// and std are exact (Welford). Negative inputs count as zero; non-finite inputs are ignored.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct QuantileSketch {
    /// Number of values in the zero bucket.
    zero_count: u64,
    /// Bin index of `bins[0]`.
    offset: i64,
    /// Counts of consecutive bins starting at `offset`.
    bins: Vec<u64>,
    /// Number of values added.
    count: u64,
    /// Exact smallest value (meaningless while `count == 0`).
    min: f64,
    /// Exact largest value (meaningless while `count == 0`).
    max: f64,
    /// Running mean (Welford).
    mean: f64,
    /// Running sum of squared deviations from the mean (Welford).
    m2: f64,
    /// Bin indices of recently added values (a cache, not state).
    memo: BinMemo,
}

impl Default for QuantileSketch {
    fn default() -> Self {
        QuantileSketch::new()
    }
}

impl QuantileSketch {
    /// An empty sketch.
    pub(crate) fn new() -> QuantileSketch {
        QuantileSketch {
            zero_count: 0,
            offset: 0,
            bins: Vec::new(),
            count: 0,
            min: 0.0,
            max: 0.0,
            mean: 0.0,
            m2: 0.0,
            memo: BinMemo::default(),
        }
    }

    fn gamma() -> f64 {
        (1.0 + SKETCH_RELATIVE_ACCURACY) / (1.0 - SKETCH_RELATIVE_ACCURACY)
    }

    fn bin_index(x: f64) -> i64 {
        (x.ln() / Self::gamma().ln()).ceil() as i64
    }

    fn bin_value(index: i64) -> f64 {
        let gamma = Self::gamma();
        2.0 * (index as f64 * gamma.ln()).exp() / (gamma + 1.0)
    }

    /// Number of values added.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Adds one value.
    pub(crate) fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        let x = x.max(0.0);
        if x < SKETCH_MIN_INDEXABLE {
            self.zero_count += 1;
        } else {
            let index = self.memo.bin_index(x);
            self.add_to_bin(index, 1);
        }
        if self.count == 0 {
            self.min = x;
            self.max = x;
        } else {
            // Plain comparisons: neither side is NaN here (`f64::min` would also check that).
            if x < self.min {
                self.min = x;
            }
            if x > self.max {
                self.max = x;
            }
        }
        self.count += 1;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
    }

    fn add_to_bin(&mut self, index: i64, n: u64) {
        // The usual case: a bin inside the current range.
        if let Some(bin) = usize::try_from(index.wrapping_sub(self.offset))
            .ok()
            .and_then(|pos| self.bins.get_mut(pos))
        {
            *bin += n;
            return;
        }
        if self.bins.is_empty() {
            self.offset = index;
            self.bins.push(0);
        } else if index < self.offset {
            let grow = (self.offset - index) as usize;
            self.bins.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = index;
        }
        let pos = (index - self.offset) as usize;
        if pos >= self.bins.len() {
            self.bins.resize(pos + 1, 0);
        }
        self.bins[pos] += n;
    }

    /// Adds every value of `other` to this sketch.
    #[cfg(test)]
    pub(crate) fn merge(&mut self, other: &QuantileSketch) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        self.zero_count += other.zero_count;
        for (k, &c) in other.bins.iter().enumerate() {
            if c > 0 {
                self.add_to_bin(other.offset + k as i64, c);
            }
        }
        let n_a = self.count as f64;
        let n_b = other.count as f64;
        let n = n_a + n_b;
        let delta = other.mean - self.mean;
        self.mean += delta * n_b / n;
        self.m2 += other.m2 + delta * delta * n_a * n_b / n;
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Estimated percentile `p` (0..=100) by the same rank rule as [`Distribution`]; rank 0 and
    /// the last rank are the exact min and max. Zero when empty.
    pub(crate) fn quantile(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let n = usize::try_from(self.count).unwrap_or(usize::MAX);
        let rank = Distribution::rank(n, p) as u64;
        if rank == 0 {
            return self.min;
        }
        if rank + 1 >= self.count {
            return self.max;
        }
        if rank < self.zero_count {
            return 0.0_f64.clamp(self.min, self.max);
        }
        let mut seen = self.zero_count;
        for (k, &c) in self.bins.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Self::bin_value(self.offset + k as i64).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// The summary of every value added (percentiles estimated, the rest exact).
    pub(crate) fn distribution(&self) -> Distribution {
        if self.count == 0 {
            return Distribution::ZERO;
        }
        Distribution {
            mean: self.mean,
            min: self.min,
            max: self.max,
            median: self.quantile(50.0),
            p75: self.quantile(75.0),
            p90: self.quantile(90.0),
            p95: self.quantile(95.0),
            p99: self.quantile(99.0),
            std: (self.m2 / self.count as f64).max(0.0).sqrt(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn sketch_matches_exact_percentiles_within_relative_accuracy() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for round in 0..4 {
            let n = [1, 3, 1000, 100_000][round];
            let mut xs: Vec<f64> = (0..n)
                .map(|i| {
                    if i % 17 == 3 {
                        0.0
                    } else {
                        // log-uniform over six decades plus a bulk around 20 ms
                        if rng.gen_bool(0.5) {
                            10f64.powf(rng.gen_range(-3.0..3.0))
                        } else {
                            rng.gen_range(15.0..25.0)
                        }
                    }
                })
                .collect();
            let mut sketch = QuantileSketch::new();
            for &x in &xs {
                sketch.add(x);
            }
            let exact = Distribution::from_samples(&mut xs);
            let approx = sketch.distribution();
            for ((name, e), (_, a)) in exact.named().into_iter().zip(approx.named()) {
                let tol = if name == "mean" || name == "std" {
                    1e-9 * e.abs().max(1.0)
                } else {
                    (SKETCH_RELATIVE_ACCURACY + 1e-9) * e.abs()
                };
                assert!((a - e).abs() <= tol, "n={n} {name}: sketch {a} exact {e}");
            }
            assert_eq!(sketch.count(), n as u64);
        }
    }

    #[test]
    fn memoised_bins_equal_computed_bins() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut memo = BinMemo::default();
        // Few distinct values (many hits) and many (collisions in the direct-mapped memo).
        for distinct in [7u64, 100_000] {
            for _ in 0..20_000 {
                let x = rng.gen_range(1..=distinct) as f64 / 1000.0;
                assert_eq!(memo.bin_index(x), QuantileSketch::bin_index(x), "x={x}");
            }
        }
    }

    #[test]
    fn sketch_merge_equals_single_sketch() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let xs: Vec<f64> = (0..5000).map(|_| rng.gen_range(0.0..500.0)).collect();
        let mut whole = QuantileSketch::new();
        let (mut a, mut b) = (QuantileSketch::new(), QuantileSketch::new());
        for &x in &xs {
            whole.add(x);
        }
        for (i, &x) in xs.iter().enumerate() {
            if i < 1234 {
                a.add(x);
            } else {
                b.add(x);
            }
        }
        a.merge(&b);
        let (m, w) = (a.distribution(), whole.distribution());
        assert_eq!(a.bins, whole.bins, "same bins, memoised or not");
        assert_eq!(
            (m.median, m.p90, m.p99, m.min, m.max),
            (w.median, w.p90, w.p99, w.min, w.max)
        );
        assert!(close(m.mean, w.mean) && close(m.std, w.std));
        let mut empty = QuantileSketch::new();
        empty.merge(&whole);
        assert_eq!(empty.distribution(), w);
    }
}
