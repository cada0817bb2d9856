//! The report of `--num-runs K`: each headline figure across the K runs (mean, sample standard
//! deviation, coefficient of variation and the 95% confidence interval of the mean), its
//! console table, and the report JSON holding every run's own report and the `aggregate`.
//!
//! The interval is Student's t with K - 1 degrees of freedom: `mean ± t(0.975, K-1) · s / √K`,
//! `s` the sample standard deviation (divides by K - 1). [`t_975`] holds the exact table for
//! 1 to 30 degrees of freedom and above that the Cornish-Fisher expansion of the t quantile in
//! the normal one (Abramowitz and Stegun 26.7.5), within 10⁻⁷ of the exact value from 30 on (3·10⁻⁸ at 30).

use serde_json::{json, Map, Value};

/// A figure's name in the aggregate and where it sits in one run's report JSON (a JSON
/// pointer).
pub(crate) type Figure = (&'static str, &'static str);

/// The headline figures of a `bench` or `replay` report (`mockserve replay`'s keys).
pub(crate) const LIVE_FIGURES: &[Figure] = &[
    ("num_requests", "/num_requests"),
    ("completed_requests", "/completed_requests"),
    ("failed_requests", "/failures/total"),
    ("total_input_tokens", "/total_input_tokens"),
    ("total_output_tokens", "/total_output_tokens"),
    ("request_throughput_rps", "/request_throughput_rps"),
    ("input_throughput_tok_s", "/input_throughput_tok_s"),
    ("output_throughput_tok_s", "/output_throughput_tok_s"),
    ("total_throughput_tok_s", "/total_throughput_tok_s"),
    ("mean_ttft_ms", "/mean_ttft_ms"),
    ("median_ttft_ms", "/median_ttft_ms"),
    ("p90_ttft_ms", "/p90_ttft_ms"),
    ("p99_ttft_ms", "/p99_ttft_ms"),
    ("mean_itl_ms", "/mean_itl_ms"),
    ("median_itl_ms", "/median_itl_ms"),
    ("p90_itl_ms", "/p90_itl_ms"),
    ("p99_itl_ms", "/p99_itl_ms"),
    ("mean_e2e_latency_ms", "/mean_e2e_latency_ms"),
    ("median_e2e_latency_ms", "/median_e2e_latency_ms"),
    ("p90_e2e_latency_ms", "/p90_e2e_latency_ms"),
    ("p99_e2e_latency_ms", "/p99_e2e_latency_ms"),
    ("goodput_requests", "/goodput/good_requests"),
    ("goodput_rps", "/goodput/rate_rps"),
];

/// The headline figures of a `multiturn` report (its results' keys; its statistics have p50,
/// p95 and p99, not p90).
pub(crate) const MULTITURN_FIGURES: &[Figure] = &[
    ("total_requests", "/total_requests"),
    ("successful_requests", "/successful_requests"),
    ("failed_requests", "/failed_requests"),
    ("output_tokens", "/throughput/output_tokens"),
    ("requests_per_s", "/throughput/requests_per_s"),
    ("output_tokens_per_s", "/throughput/output_tokens_per_s"),
    ("mean_ttft_us", "/aggregate_ttft/mean_us"),
    ("p50_ttft_us", "/aggregate_ttft/p50_us"),
    ("p95_ttft_us", "/aggregate_ttft/p95_us"),
    ("p99_ttft_us", "/aggregate_ttft/p99_us"),
    ("mean_inter_chunk_us", "/aggregate_inter_chunk/mean_us"),
    ("p50_inter_chunk_us", "/aggregate_inter_chunk/p50_us"),
    ("p99_inter_chunk_us", "/aggregate_inter_chunk/p99_us"),
    ("mean_latency_us", "/aggregate_latency/mean_us"),
    ("p50_latency_us", "/aggregate_latency/p50_us"),
    ("p95_latency_us", "/aggregate_latency/p95_us"),
    ("p99_latency_us", "/aggregate_latency/p99_us"),
];

/// `t(0.975, df)` for df = 1..=30 (the two-sided 95% critical value of Student's t).
const T_975: [f64; 30] = [
    12.706_204_736,
    4.302_652_730,
    3.182_446_305,
    2.776_445_105,
    2.570_581_836,
    2.446_911_851,
    2.364_624_252,
    2.306_004_135,
    2.262_157_163,
    2.228_138_852,
    2.200_985_160,
    2.178_812_830,
    2.160_368_656,
    2.144_786_688,
    2.131_449_546,
    2.119_905_299,
    2.109_815_578,
    2.100_922_040,
    2.093_024_054,
    2.085_963_447,
    2.079_613_845,
    2.073_873_068,
    2.068_657_610,
    2.063_898_562,
    2.059_538_553,
    2.055_529_439,
    2.051_830_516,
    2.048_407_142,
    2.045_229_642,
    2.042_272_456,
];

/// The 0.975 quantile of the standard normal.
const Z_975: f64 = 1.959_963_984_540_054;

/// `t(0.975, df)`: the table up to 30 degrees of freedom, the Cornish-Fisher expansion above
/// (df 0 has no interval: infinity).
pub(crate) fn t_975(df: usize) -> f64 {
    match df {
        0 => f64::INFINITY,
        1..=30 => T_975[df - 1],
        _ => {
            let (z, n) = (Z_975, df as f64);
            let (z3, z5, z7, z9) = (z.powi(3), z.powi(5), z.powi(7), z.powi(9));
            let g1 = (z3 + z) / 4.0;
            let g2 = (5.0 * z5 + 16.0 * z3 + 3.0 * z) / 96.0;
            let g3 = (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / 384.0;
            let g4 = (79.0 * z9 + 776.0 * z7 + 1482.0 * z5 - 1920.0 * z3 - 945.0 * z) / 92160.0;
            z + g1 / n + g2 / n.powi(2) + g3 / n.powi(3) + g4 / n.powi(4)
        }
    }
}

/// One figure across runs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Spread {
    /// Each run's value, in run order.
    pub values: Vec<f64>,
    /// Their mean.
    pub mean: f64,
    /// Sample standard deviation (divides by K - 1; 0 for one run).
    pub std: f64,
    /// `std / mean`; 0 when every value is 0, None when the mean is 0 but the values differ.
    pub cv: Option<f64>,
    /// Half the 95% interval: `t(0.975, K-1) · std / √K` (infinite for one run).
    pub half_width: f64,
}

impl Spread {
    /// The spread of `values` (at least one).
    pub(crate) fn of(values: Vec<f64>) -> Spread {
        let k = values.len().max(1) as f64;
        let mean = values.iter().sum::<f64>() / k;
        let ss: f64 = values.iter().map(|x| (x - mean) * (x - mean)).sum();
        let std = if values.len() > 1 {
            (ss / (k - 1.0)).sqrt()
        } else {
            0.0
        };
        let cv = if mean != 0.0 {
            Some(std / mean.abs())
        } else if std == 0.0 {
            Some(0.0)
        } else {
            None
        };
        let half_width = if std == 0.0 && values.len() > 1 {
            0.0
        } else {
            t_975(values.len().saturating_sub(1)) * std / k.sqrt()
        };
        Spread {
            values,
            mean,
            std,
            cv,
            half_width,
        }
    }

    /// The interval's bounds.
    pub(crate) fn interval(&self) -> (f64, f64) {
        (self.mean - self.half_width, self.mean + self.half_width)
    }

    fn to_json(&self) -> Value {
        let (low, high) = self.interval();
        json!({
            "values": self.values,
            "mean": self.mean,
            "std": self.std,
            "cv": self.cv,
            "ci95_low": low,
            "ci95_high": high,
            "ci95_half_width": self.half_width,
        })
    }
}

/// Every figure of `figures` that each run's report has as a number, across the runs.
pub(crate) fn spreads(runs: &[&Value], figures: &[Figure]) -> Vec<(&'static str, Spread)> {
    figures
        .iter()
        .filter_map(|&(name, pointer)| {
            let values: Option<Vec<f64>> = runs
                .iter()
                .map(|r| r.pointer(pointer).and_then(Value::as_f64))
                .collect();
            values
                .filter(|v| !v.is_empty())
                .map(|v| (name, Spread::of(v)))
        })
        .collect()
}

/// The `aggregate` object: the number of runs, the t value used and each figure's spread.
pub(crate) fn aggregate_json(spreads: &[(&'static str, Spread)]) -> Value {
    let k = spreads.first().map_or(0, |(_, s)| s.values.len());
    let figures: Map<String, Value> = spreads
        .iter()
        .map(|(name, s)| ((*name).to_string(), s.to_json()))
        .collect();
    json!({
        "num_runs": k,
        "confidence": 0.95,
        "t_critical": t_975(k.saturating_sub(1)),
        "std_definition": "sample standard deviation (divides by K - 1)",
        "interval_definition": "mean ± t(0.975, K-1) · std / sqrt(K)",
        "figures": figures,
    })
}

/// The report JSON of K runs: `num_runs`, `runs` (each run's own report) and `aggregate`.
pub(crate) fn report_json(runs: Vec<Value>, aggregate: Value) -> Value {
    json!({
        "num_runs": runs.len(),
        "runs": runs,
        "aggregate": aggregate,
    })
}

/// A number for the console table: integers plainly, others with 4 significant decimals.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.4}")
    }
}

/// The console table: one line per figure with its mean, standard deviation, CV and interval.
pub(crate) fn console(spreads: &[(&'static str, Spread)]) -> String {
    let k = spreads.first().map_or(0, |(_, s)| s.values.len());
    let mut s = format!(
        "Across {k} runs: mean, sample std, CV, 95% confidence interval of the mean (Student t, \
         {} df, t = {:.3})\n",
        k.saturating_sub(1),
        t_975(k.saturating_sub(1))
    );
    let width = spreads.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, sp) in spreads {
        let (low, high) = sp.interval();
        let cv = sp.cv.map_or("-".to_string(), |c| format!("{c:.4}"));
        s.push_str(&format!(
            "  {name:<width$}  mean {}  std {}  CV {cv}  95% CI [{}, {}]\n",
            num(sp.mean),
            num(sp.std),
            num(low),
            num(high),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K = 5, values 10, 12, 11, 13, 14: mean 12, squared deviations sum to 10, s² = 10 / 4,
    /// s = 1.58114, CV = 0.131762, half width = 2.776445 · 1.58114 / √5 = 1.963243.
    #[test]
    fn t_interval_of_a_known_sample() {
        let s = Spread::of(vec![10.0, 12.0, 11.0, 13.0, 14.0]);
        assert_eq!(s.mean, 12.0);
        assert!((s.std - 2.5f64.sqrt()).abs() < 1e-12);
        assert!((s.cv.expect("mean above 0") - 0.131_762).abs() < 1e-6);
        assert!((s.half_width - 1.963_243).abs() < 1e-6, "{}", s.half_width);
        let (lo, hi) = s.interval();
        assert!((lo - 10.036_757).abs() < 1e-6 && (hi - 13.963_243).abs() < 1e-6);
        // K = 2: t(0.975, 1) = 12.706; values 1, 3: s = √2, half = 12.706 · √2 / √2.
        let s = Spread::of(vec![1.0, 3.0]);
        assert!((s.half_width - 12.706_204_736).abs() < 1e-9);
        // Identical runs: no spread at all.
        let s = Spread::of(vec![7.0; 5]);
        assert_eq!((s.std, s.cv, s.interval()), (0.0, Some(0.0), (7.0, 7.0)));
        // All zero: CV 0; mean 0 with spread: no CV.
        assert_eq!(Spread::of(vec![0.0; 3]).cv, Some(0.0));
        assert_eq!(Spread::of(vec![-1.0, 1.0]).cv, None);
    }

    #[test]
    fn t_quantiles_past_the_table() {
        // The expansion against exact values past the table.
        for (df, exact) in [(40, 2.021_075_39), (60, 2.000_297_82), (120, 1.979_930_41)] {
            assert!((t_975(df) - exact).abs() < 1e-7, "{df}: {}", t_975(df));
        }
        assert!((t_975(4) - 2.776_445_105).abs() < 1e-12);
        assert!(t_975(0).is_infinite());
        // Decreasing towards the normal quantile.
        assert!((1..200).all(|d| t_975(d) > t_975(d + 1) && t_975(d + 1) > Z_975));
    }

    #[test]
    fn figures_missing_from_a_run_are_left_out() {
        let a = json!({"num_requests": 10, "failures": {"total": 0}, "goodput": null});
        let b = json!({"num_requests": 10, "failures": {"total": 1}, "goodput": null});
        let s = spreads(&[&a, &b], LIVE_FIGURES);
        let names: Vec<&str> = s.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["num_requests", "failed_requests"]);
        let agg = aggregate_json(&s);
        assert_eq!(agg["num_runs"], 2);
        assert_eq!(agg["figures"]["num_requests"]["cv"], 0.0);
        assert_eq!(
            agg["figures"]["failed_requests"]["values"],
            json!([0.0, 1.0])
        );
        assert!(console(&s).contains("num_requests"));
    }
}
