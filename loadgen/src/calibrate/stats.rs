//! The statistics `loadgen calibrate` reports on matched (predicted, measured) pairs, written
//! out here because each must be exactly the stated formula: MAPE, signed bias, Pearson r, the
//! two-sample Kolmogorov–Smirnov statistic with its asymptotic p-value, and the TOST
//! equivalence verdict from a seeded paired bootstrap.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Mean absolute percentage error of the prediction against the measurement:
/// `mean(|predicted - measured| / measured)` over the pairs whose measurement is above zero
/// (a fraction, not a percentage). None when no pair qualifies.
pub(crate) fn mape(pairs: &[(f64, f64)]) -> Option<f64> {
    let terms: Vec<f64> = pairs
        .iter()
        .filter(|(_, m)| *m > 0.0)
        .map(|(p, m)| (p - m).abs() / m)
        .collect();
    (!terms.is_empty()).then(|| terms.iter().sum::<f64>() / terms.len() as f64)
}

/// Signed bias: `mean(measured) / mean(predicted) - 1`. Positive when the measured system is
/// slower (or larger) than predicted: a server whose decode steps take 25% longer shows +0.25
/// on ITL. None when the predicted mean is not above zero.
pub(crate) fn bias(pairs: &[(f64, f64)]) -> Option<f64> {
    let (p, m) = means(pairs)?;
    (p > 0.0).then(|| m / p - 1.0)
}

/// (mean predicted, mean measured); None when empty.
fn means(pairs: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pairs.is_empty() {
        return None;
    }
    let n = pairs.len() as f64;
    let p = pairs.iter().map(|x| x.0).sum::<f64>() / n;
    let m = pairs.iter().map(|x| x.1).sum::<f64>() / n;
    Some((p, m))
}

/// Pearson's correlation coefficient of predicted and measured. None with fewer than two pairs
/// or when either side is constant.
pub(crate) fn pearson(pairs: &[(f64, f64)]) -> Option<f64> {
    if pairs.len() < 2 {
        return None;
    }
    let (mp, mm) = means(pairs)?;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (p, m) in pairs {
        let (dx, dy) = (p - mp, m - mm);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    (sxx > 0.0 && syy > 0.0).then(|| sxy / (sxx * syy).sqrt())
}

/// The two-sample Kolmogorov–Smirnov statistic `D = sup_t |F_a(t) - F_b(t)|` over the empirical
/// CDFs of `a` and `b` (ties stepped together), and its asymptotic p-value
/// `Q_KS(sqrt(n m / (n + m)) D)` ([`kolmogorov_q`]; no small-sample correction). None when
/// either sample is empty.
pub(crate) fn ks_two_sample(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort_by(f64::total_cmp);
    b.sort_by(f64::total_cmp);
    let (n, m) = (a.len(), b.len());
    let (mut i, mut j, mut d) = (0usize, 0usize, 0.0f64);
    while i < n && j < m {
        let t = a[i].min(b[j]);
        while i < n && a[i] <= t {
            i += 1;
        }
        while j < m && b[j] <= t {
            j += 1;
        }
        d = d.max((i as f64 / n as f64 - j as f64 / m as f64).abs());
    }
    let en = (n as f64 * m as f64 / (n + m) as f64).sqrt();
    Some((d, kolmogorov_q(en * d)))
}

/// The Kolmogorov distribution's survival function `Q(λ) = P(K > λ) =
/// 2 Σ_{j≥1} (-1)^{j-1} exp(-2 j² λ²)`; below λ = 1.18 through the equivalent
/// `1 - sqrt(2π)/λ Σ_{j≥1} exp(-(2j-1)² π² / (8 λ²))`, which converges fast there.
pub(crate) fn kolmogorov_q(lambda: f64) -> f64 {
    if lambda <= 0.0 {
        return 1.0;
    }
    let q = if lambda < 1.18 {
        let y = -std::f64::consts::PI.powi(2) / (8.0 * lambda * lambda);
        let s: f64 = (1..=20)
            .map(|j| ((2 * j - 1) as f64).powi(2) * y)
            .map(f64::exp)
            .sum();
        1.0 - (2.0 * std::f64::consts::PI).sqrt() / lambda * s
    } else {
        let s: f64 = (1..=100)
            .map(|j| {
                let sign = if j % 2 == 1 { 1.0 } else { -1.0 };
                sign * (-2.0 * (j * j) as f64 * lambda * lambda).exp()
            })
            .sum();
        2.0 * s
    };
    q.clamp(0.0, 1.0)
}

/// The statistic a TOST verdict is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stat {
    /// The mean.
    Mean,
    /// The 90th percentile (the replay report's rank rule).
    P90,
}

impl Stat {
    fn of(self, sample: &mut [f64]) -> f64 {
        match self {
            Stat::Mean => sample.iter().sum::<f64>() / sample.len().max(1) as f64,
            Stat::P90 => {
                sample.sort_by(f64::total_cmp);
                servesim::metrics::Distribution::percentile(sample, 90.0).unwrap_or(0.0)
            }
        }
    }
}

/// Bootstrap resamples behind each TOST verdict.
pub(crate) const BOOTSTRAP_RESAMPLES: usize = 1000;

/// One TOST equivalence verdict: the ratio `stat(measured) / stat(predicted)`, its 90%
/// percentile-bootstrap interval from resampling the matched pairs, and whether the interval
/// lies within `[1 - margin, 1 + margin]` (two one-sided tests at α = 0.05 each, by the
/// interval-inclusion principle).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Tost {
    /// `stat(measured) / stat(predicted)` on the pairs themselves.
    pub ratio: f64,
    /// 5th percentile of the bootstrap ratios.
    pub ci_low: f64,
    /// 95th percentile of the bootstrap ratios.
    pub ci_high: f64,
    /// `1 - margin <= ci_low` and `ci_high <= 1 + margin`.
    pub pass: bool,
}

/// The TOST verdict on `stat` at `margin`, from [`BOOTSTRAP_RESAMPLES`] paired resamples drawn
/// with a ChaCha8 generator seeded with `seed` (same pairs and seed, same verdict). None with
/// fewer than two pairs or a predicted statistic not above zero.
pub(crate) fn tost(pairs: &[(f64, f64)], stat: Stat, margin: f64, seed: u64) -> Option<Tost> {
    if pairs.len() < 2 {
        return None;
    }
    let ratio_of = |sample: &[(f64, f64)], buf: &mut Vec<f64>| -> Option<f64> {
        buf.clear();
        buf.extend(sample.iter().map(|x| x.0));
        let p = stat.of(buf);
        buf.clear();
        buf.extend(sample.iter().map(|x| x.1));
        let m = stat.of(buf);
        (p > 0.0).then(|| m / p)
    };
    let mut buf = Vec::with_capacity(pairs.len());
    let ratio = ratio_of(pairs, &mut buf)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut resample = Vec::with_capacity(pairs.len());
    let mut ratios = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    for _ in 0..BOOTSTRAP_RESAMPLES {
        resample.clear();
        resample.extend((0..pairs.len()).map(|_| pairs[rng.gen_range(0..pairs.len())]));
        if let Some(r) = ratio_of(&resample, &mut buf) {
            ratios.push(r);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let ci_low = servesim::metrics::Distribution::percentile(&ratios, 5.0)?;
    let ci_high = servesim::metrics::Distribution::percentile(&ratios, 95.0)?;
    Some(Tost {
        ratio,
        ci_low,
        ci_high,
        pass: 1.0 - margin <= ci_low && ci_high <= 1.0 + margin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn mape_and_bias_by_hand() {
        // |110-100|/100 = 0.1, |180-200|/200 = 0.1; the zero measurement is left out of MAPE.
        let pairs = [(110.0, 100.0), (180.0, 200.0), (5.0, 0.0)];
        assert!(close(mape(&pairs).unwrap(), 0.1, 1e-12));
        // mean measured 100, mean predicted 98.333...: 100 / 98.333 - 1.
        assert!(close(bias(&pairs).unwrap(), 300.0 / 295.0 - 1.0, 1e-12));
        // A measurement 25% above the prediction everywhere is a bias of exactly +0.25.
        let slow: Vec<(f64, f64)> = (1..10).map(|i| (i as f64, 1.25 * i as f64)).collect();
        assert!(close(bias(&slow).unwrap(), 0.25, 1e-12));
        assert_eq!(mape(&[(1.0, 0.0)]), None);
        assert_eq!(bias(&[]), None);
    }

    #[test]
    fn pearson_on_exact_data() {
        let line: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, 2.0 * i as f64 + 1.0)).collect();
        assert!(close(pearson(&line).unwrap(), 1.0, 1e-12));
        let down: Vec<(f64, f64)> = (0..5).map(|i| (i as f64, -(i as f64))).collect();
        assert!(close(pearson(&down).unwrap(), -1.0, 1e-12));
        // x 1..5, y 2 4 5 4 5: Σdxdy = 6, Σdx² = 10, Σdy² = 6, r = 6 / sqrt(60) = sqrt(0.6).
        let pairs = [(1.0, 2.0), (2.0, 4.0), (3.0, 5.0), (4.0, 4.0), (5.0, 5.0)];
        assert!(close(pearson(&pairs).unwrap(), 0.6f64.sqrt(), 1e-12));
        assert_eq!(pearson(&[(1.0, 1.0), (1.0, 2.0)]), None, "constant side");
    }

    #[test]
    fn ks_statistic_by_hand() {
        // F_a steps at 1, 2, 3 (thirds), F_b at 2.5, 4, 5, 6 (quarters): at t = 3 F_a = 1 and
        // F_b = 1/4, the largest gap.
        let (d, _) = ks_two_sample(&[1.0, 2.0, 3.0], &[2.5, 4.0, 5.0, 6.0]).unwrap();
        assert!(close(d, 0.75, 1e-12));
        // Ties step together: at t = 2, F_a = 3/4 and F_b = 1/4.
        let (d, _) = ks_two_sample(&[1.0, 2.0, 2.0, 3.0], &[2.0, 3.0, 3.0, 4.0]).unwrap();
        assert!(close(d, 0.5, 1e-12));
        let (d, p) = ks_two_sample(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]).unwrap();
        assert_eq!((d, p), (0.0, 1.0));
        assert_eq!(ks_two_sample(&[], &[1.0]), None);
    }

    #[test]
    fn ks_p_value_is_the_kolmogorov_tail() {
        // Tabulated values of Q(λ) = P(K > λ).
        assert!(close(kolmogorov_q(1.0), 0.269_999_67, 1e-7));
        assert!(close(kolmogorov_q(1.36), 0.049_485_9, 1e-6));
        assert!(close(kolmogorov_q(0.5), 0.963_945, 1e-5));
        assert!(close(kolmogorov_q(1.63), 0.009_846_4, 1e-6));
        // Both branches agree where they meet.
        assert!(close(kolmogorov_q(1.179_999), kolmogorov_q(1.18), 1e-6));
        // n = m = 50, D = 0.3: λ = 5 × 0.3 = 1.5.
        let a: Vec<f64> = (0..50).map(f64::from).collect();
        let b: Vec<f64> = (15..65).map(f64::from).collect();
        let (d, p) = ks_two_sample(&a, &b).unwrap();
        assert!(close(d, 0.3, 1e-12));
        assert!(close(p, kolmogorov_q(1.5), 1e-12));
        assert!(close(p, 0.022_218_0, 1e-6));
    }

    #[test]
    fn tost_passes_inside_the_margin_and_fails_outside() {
        // Measured within ±2% of predicted, around a ratio of 1.
        let near: Vec<(f64, f64)> = (1..=200)
            .map(|i| {
                let p = 10.0 + (i % 17) as f64;
                (p, p * (1.0 + 0.02 * ((i % 5) as f64 - 2.0) / 2.0))
            })
            .collect();
        for stat in [Stat::Mean, Stat::P90] {
            let t = tost(&near, stat, 0.1, 7).unwrap();
            assert!(t.pass, "{stat:?} {t:?}");
            assert!(t.ci_low <= t.ratio && t.ratio <= t.ci_high, "{t:?}");
        }
        // 25% slower everywhere: the ratio is 1.25 and the interval is far outside ±10%.
        let slow: Vec<(f64, f64)> = near.iter().map(|&(p, _)| (p, 1.25 * p)).collect();
        let t = tost(&slow, Stat::Mean, 0.1, 7).unwrap();
        assert!(close(t.ratio, 1.25, 1e-12) && !t.pass, "{t:?}");
        // 5% slower: inside ±10% but outside ±3%.
        let five: Vec<(f64, f64)> = near.iter().map(|&(p, _)| (p, 1.05 * p)).collect();
        assert!(tost(&five, Stat::Mean, 0.1, 7).unwrap().pass);
        assert!(!tost(&five, Stat::Mean, 0.03, 7).unwrap().pass);
        // Seeded: the same pairs and seed, the same interval.
        assert_eq!(
            tost(&near, Stat::P90, 0.1, 3),
            tost(&near, Stat::P90, 0.1, 3)
        );
        assert_eq!(tost(&near[..1], Stat::Mean, 0.1, 7), None);
    }
}
