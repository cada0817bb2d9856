//! The calibration report: per metric the error figures of the matched pairs after the
//! warm-up, the same by load level (time windows), trajectory E2E for agentic traces, and its
//! console text.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Value};

use super::records::{Matched, Rec};
use super::stats::{self, Stat, Tost};

/// The metrics compared, in report order: (JSON key, console name, unit).
pub(crate) const METRICS: [(&str, &str, &str); 5] = [
    ("ttft", "TTFT", "ms"),
    ("itl", "ITL", "ms"),
    ("e2e", "E2E", "ms"),
    ("cached_tokens", "Cached tokens", "tokens"),
    ("trajectory_e2e", "Trajectory E2E", "ms"),
];

/// A request's value of metric `key`.
fn value(r: &Rec, key: &str) -> Option<f64> {
    match key {
        "ttft" => r.ttft_ms,
        "itl" => r.itl_ms,
        "e2e" => r.e2e_ms,
        "cached_tokens" => Some(r.cached_tokens),
        _ => None,
    }
}

/// What the figures are computed with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// TOST margin (fraction).
    pub margin: f64,
    /// Requests arriving (offline schedule) before this are excluded.
    pub warmup_ms: f64,
    /// Load-level windows after the warm-up.
    pub windows: usize,
    /// Bootstrap seed.
    pub seed: u64,
}

/// The error figures of one metric.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Figures {
    /// Pairs compared.
    pub n: usize,
    /// Pairs left out: in the warm-up, or without the metric on one side (ITL of a one-token
    /// answer).
    pub excluded: usize,
    /// `mean(|predicted - measured| / measured)`.
    pub mape: Option<f64>,
    /// `mean(measured) / mean(predicted) - 1`.
    pub bias: Option<f64>,
    /// Pearson r of predicted and measured.
    pub pearson_r: Option<f64>,
    /// Two-sample KS statistic of the two distributions.
    pub ks_stat: Option<f64>,
    /// Its asymptotic p-value.
    pub ks_p: Option<f64>,
    /// Both TOST verdicts pass (false when either could not be computed).
    pub tost_pass: bool,
    /// TOST on the mean.
    pub tost_mean: Option<Tost>,
    /// TOST on the 90th percentile.
    pub tost_p90: Option<Tost>,
    /// Mean, p50 and p90 of the predicted values.
    pub predicted: Summary,
    /// The same of the measured values.
    pub measured: Summary,
}

/// Mean, p50, p90 of a sample.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median (the replay report's rank rule).
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
}

fn summary(mut v: Vec<f64>) -> Summary {
    if v.is_empty() {
        return Summary::default();
    }
    v.sort_by(f64::total_cmp);
    let p = |q| servesim::metrics::Distribution::percentile(&v, q).unwrap_or(0.0);
    Summary {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        p50: p(50.0),
        p90: p(90.0),
    }
}

/// The figures of `pairs` (predicted, measured), `excluded` left out before.
pub(crate) fn figures(pairs: &[(f64, f64)], excluded: usize, s: &Settings) -> Figures {
    let (pred, meas): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    let ks = stats::ks_two_sample(&pred, &meas);
    let tost_mean = stats::tost(pairs, Stat::Mean, s.margin, s.seed);
    let tost_p90 = stats::tost(pairs, Stat::P90, s.margin, s.seed.wrapping_add(1));
    Figures {
        n: pairs.len(),
        excluded,
        mape: stats::mape(pairs),
        bias: stats::bias(pairs),
        pearson_r: stats::pearson(pairs),
        ks_stat: ks.map(|k| k.0),
        ks_p: ks.map(|k| k.1),
        tost_pass: tost_mean.is_some_and(|t| t.pass) && tost_p90.is_some_and(|t| t.pass),
        tost_mean,
        tost_p90,
        predicted: summary(pred),
        measured: summary(meas),
    }
}

/// Per-request pairs of metric `key` after the warm-up, and how many were left out.
fn request_pairs(m: &Matched, key: &str, warmup_ms: f64) -> (Vec<(f64, f64)>, usize) {
    let mut out = Vec::with_capacity(m.pairs.len());
    for (o, l) in &m.pairs {
        if o.arrival_ms < warmup_ms {
            continue;
        }
        if let (Some(p), Some(v)) = (value(o, key), value(l, key)) {
            out.push((p, v));
        }
    }
    let excluded = m.pairs.len() - out.len();
    (out, excluded)
}

/// Per play whose every request completed on both sides: (predicted, measured) trajectory E2E,
/// from the play's first arrival to its last request's end on each side; plays starting in the
/// warm-up are left out (counted with the broken ones as excluded).
fn trajectory_pairs(m: &Matched, warmup_ms: f64) -> (Vec<(f64, f64)>, usize) {
    #[derive(Default)]
    struct Span {
        start: [f64; 2],
        end: [f64; 2],
        any: bool,
    }
    let mut plays: BTreeMap<&str, Span> = BTreeMap::new();
    for (o, l) in &m.pairs {
        let Some(play) = o.play.as_deref() else {
            continue;
        };
        let span = plays.entry(play).or_insert_with(|| Span {
            start: [f64::INFINITY; 2],
            end: [f64::NEG_INFINITY; 2],
            any: false,
        });
        for (i, r) in [o, l].into_iter().enumerate() {
            span.start[i] = span.start[i].min(r.arrival_ms);
            span.end[i] = span.end[i].max(r.arrival_ms + r.e2e_ms.unwrap_or(0.0));
        }
        span.any = true;
    }
    let mut out = Vec::new();
    let mut excluded = m.broken_plays.len();
    for (play, span) in plays {
        if m.broken_plays.contains(play) {
            continue;
        }
        if !span.any || span.start[0] < warmup_ms {
            excluded += 1;
            continue;
        }
        out.push((span.end[0] - span.start[0], span.end[1] - span.start[1]));
    }
    (out, excluded)
}

/// One load-level window: requests arriving (offline schedule) in `[start_ms, end_ms)`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Window {
    /// Start, ms.
    pub start_ms: f64,
    /// End, ms.
    pub end_ms: f64,
    /// Offered load: requests arriving in the window per second.
    pub requests_per_s: f64,
    /// Per request metric: n, MAPE, bias.
    pub metrics: BTreeMap<&'static str, Value>,
}

/// The windows after the warm-up, `count` of equal length up to the last arrival.
fn windows(m: &Matched, s: &Settings) -> Vec<Window> {
    let last = m
        .pairs
        .iter()
        .map(|(o, _)| o.arrival_ms)
        .fold(f64::NEG_INFINITY, f64::max);
    if s.windows == 0 || !last.is_finite() || last < s.warmup_ms {
        return Vec::new();
    }
    let span = (last - s.warmup_ms).max(1e-3);
    let width = span / s.windows as f64;
    (0..s.windows)
        .map(|w| {
            let start = s.warmup_ms + w as f64 * width;
            let end = if w + 1 == s.windows {
                f64::INFINITY
            } else {
                start + width
            };
            let inside: Vec<&(Rec, Rec)> = m
                .pairs
                .iter()
                .filter(|(o, _)| o.arrival_ms >= start && o.arrival_ms < end)
                .collect();
            let mut metrics = BTreeMap::new();
            for (key, _, _) in &METRICS[..4] {
                let pairs: Vec<(f64, f64)> = inside
                    .iter()
                    .filter_map(|(o, l)| Some((value(o, key)?, value(l, key)?)))
                    .collect();
                metrics.insert(
                    *key,
                    json!({"n": pairs.len(), "mape": stats::mape(&pairs), "bias": stats::bias(&pairs)}),
                );
            }
            Window {
                start_ms: start,
                end_ms: start + width,
                requests_per_s: inside.len() as f64 / (width / 1000.0),
                metrics,
            }
        })
        .collect()
}

/// The whole calibration of one matched run: per metric figures, windows, counts, and the
/// pairs behind each metric (for the HTML scatter and CDFs).
#[derive(Debug)]
pub(crate) struct Calibration {
    /// Per metric key (those with at least one pair, trajectory E2E only for agentic traces).
    pub metrics: BTreeMap<&'static str, Figures>,
    /// The pairs of each metric.
    pub pairs: BTreeMap<&'static str, Vec<(f64, f64)>>,
    /// Load-level windows.
    pub windows: Vec<Window>,
    /// Counts of the matching.
    pub counts: Value,
    /// Where live differs from offline outside the engine's model, over the compared pairs:
    /// the share of requests served by the same worker, and what the client and the HTTP path
    /// add to TTFT (see [`live_path`]).
    pub live_path: Value,
}

/// The `live_path` section: over the pairs compared (after the warm-up), how many ran on the
/// same worker live as offline (of those whose worker both sides name), and the live TTFT less
/// the server's own TTFT from its engine's arrival (`engine_ttft_ms`): the time from the
/// scheduled send until the engine had the request (client lateness, HTTP, parsing and
/// tokenizing beyond what the server dates back) plus the first token's way back to the client.
fn live_path(m: &Matched, warmup_ms: f64) -> Value {
    let compared = || m.pairs.iter().filter(|(o, _)| o.arrival_ms >= warmup_ms);
    let placed: Vec<bool> = compared()
        .filter_map(|(o, l)| Some(o.worker? == l.worker?))
        .collect();
    let overhead: Vec<f64> = compared()
        .filter_map(|(_, l)| Some(l.ttft_ms? - l.engine_ttft_ms?))
        .collect();
    let n = overhead.len();
    let overhead = (n > 0).then(|| summary(overhead));
    json!({
        "workers_compared": placed.len(),
        "same_worker": placed.iter().filter(|same| **same).count(),
        "ttft_overhead_n": n,
        "ttft_overhead_ms": overhead,
    })
}

/// The predicted side's mean, p50 and p90 of each per-request metric over the pairs compared
/// (for the prediction's spread across jittered replays, [`super::spread`]).
pub(crate) fn predicted(m: &Matched, s: &Settings) -> BTreeMap<&'static str, Summary> {
    METRICS[..4]
        .iter()
        .map(|(key, _, _)| {
            let (pairs, _) = request_pairs(m, key, s.warmup_ms);
            (*key, summary(pairs.into_iter().map(|(p, _)| p).collect()))
        })
        .collect()
}

/// Computes the calibration of `m`.
pub(crate) fn calibrate(m: &Matched, s: &Settings, agentic: bool) -> Calibration {
    let mut metrics = BTreeMap::new();
    let mut pairs_of = BTreeMap::new();
    for (key, _, _) in METRICS {
        let (pairs, excluded) = if key == "trajectory_e2e" {
            if !agentic {
                continue;
            }
            trajectory_pairs(m, s.warmup_ms)
        } else {
            request_pairs(m, key, s.warmup_ms)
        };
        metrics.insert(key, figures(&pairs, excluded, s));
        pairs_of.insert(key, pairs);
    }
    let warm = m
        .pairs
        .iter()
        .filter(|(o, _)| o.arrival_ms < s.warmup_ms)
        .count();
    Calibration {
        metrics,
        pairs: pairs_of,
        windows: windows(m, s),
        live_path: live_path(m, s.warmup_ms),
        counts: json!({
            "live_records": m.live,
            "offline_records": m.offline,
            "matched": m.pairs.len(),
            "compared": m.pairs.len() - warm,
            "warmup_excluded": warm,
            "failed_live": m.failed_live,
            "failed_offline": m.failed_offline,
            "missing_live": m.missing_live,
        }),
    }
}

/// A fraction as a signed percentage, or `-`.
fn pct(x: Option<f64>, signed: bool) -> String {
    match x {
        Some(v) if signed => format!("{:+.1}%", 100.0 * v),
        Some(v) => format!("{:.1}%", 100.0 * v),
        None => "-".into(),
    }
}

fn num(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

fn tost_cell(t: Option<Tost>) -> String {
    t.map_or_else(
        || "-".into(),
        |t| {
            format!(
                "{} {:.3} [{:.3}, {:.3}]",
                if t.pass { "pass" } else { "FAIL" },
                t.ratio,
                t.ci_low,
                t.ci_high
            )
        },
    )
}

/// The console table.
pub(crate) fn console(c: &Calibration, s: &Settings) -> String {
    let mut out = format!(
        "Calibration: measured (live) against predicted (offline), {} matched, warm-up {:.0} ms \
         excluded; TOST at ±{:.0}% (90% paired bootstrap interval of measured/predicted)\n",
        c.counts["matched"],
        s.warmup_ms,
        100.0 * s.margin
    );
    out.push_str(&format!(
        "  {:<15} {:>6} {:>6} {:>8} {:>8} {:>7} {:>7} {:>9}  {:<28} {:<28}\n",
        "metric", "n", "excl", "MAPE", "bias", "r", "KS D", "KS p", "TOST mean", "TOST p90"
    ));
    for (key, name, _) in METRICS {
        let Some(f) = c.metrics.get(key) else {
            continue;
        };
        out.push_str(&format!(
            "  {:<15} {:>6} {:>6} {:>8} {:>8} {:>7} {:>7} {:>9}  {:<28} {:<28}\n",
            name,
            f.n,
            f.excluded,
            pct(f.mape, false),
            pct(f.bias, true),
            num(f.pearson_r),
            num(f.ks_stat),
            f.ks_p.map_or_else(|| "-".into(), |p| format!("{p:.2e}")),
            tost_cell(f.tost_mean),
            tost_cell(f.tost_p90),
        ));
    }
    if !c.windows.is_empty() {
        out.push_str(
            "  By load level (offline arrival windows): req/s, then TTFT, ITL, E2E bias\n",
        );
        for w in &c.windows {
            let b = |k: &str| pct(w.metrics.get(k).and_then(|v| v["bias"].as_f64()), true);
            out.push_str(&format!(
                "    {:>10.0}-{:<10.0} ms {:>8.2} req/s  TTFT {:>7}  ITL {:>7}  E2E {:>7}\n",
                w.start_ms,
                w.end_ms,
                w.requests_per_s,
                b("ttft"),
                b("itl"),
                b("e2e")
            ));
        }
    }
    let p = &c.live_path;
    if p["workers_compared"].as_u64().unwrap_or(0) > 0 {
        out.push_str(&format!(
            "  Placement: {} of {} requests on the same worker live as offline\n",
            p["same_worker"], p["workers_compared"]
        ));
    }
    if let Some(o) = p["ttft_overhead_ms"].as_object() {
        let ms = |k: &str| o.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        out.push_str(&format!(
            "  Live TTFT less the server's engine TTFT (client, HTTP, tokenizing): mean {:.2} \
             ms, p50 {:.2} ms, p90 {:.2} ms\n",
            ms("mean"),
            ms("p50"),
            ms("p90")
        ));
    }
    let failed = c.counts["failed_live"].as_u64().unwrap_or(0);
    if failed > 0 {
        out.push_str(&format!(
            "WARNING: {failed} live requests failed: counted, and excluded from every figure\n"
        ));
    }
    let missing = c.counts["missing_live"].as_u64().unwrap_or(0);
    if missing > 0 {
        out.push_str(&format!(
            "WARNING: {missing} requests of the trace have no live record (excluded)\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::records::{match_up, of_values};

    #[test]
    fn identical_sides_have_no_error_and_pass() {
        let recs = |side| {
            of_values(
                (0..40).map(|i| {
                    json!({"session_id": format!("s{i}"), "turn_index": 0,
                           "arrival_ms": 10.0 * i as f64, "ttft_ms": 5.0 + (i % 7) as f64,
                           "itl_ms": 1.0 + (i % 3) as f64, "e2e_latency_ms": 50.0 + i as f64,
                           "reused_input_tokens": 64 * (i % 2), "max_output_tokens": 9,
                           "status": "completed"})
                }),
                side,
            )
            .expect("records")
        };
        let m = match_up(recs("offline"), recs("live"), "t").expect("match");
        let s = Settings {
            margin: 0.1,
            warmup_ms: 100.0,
            windows: 3,
            seed: 1,
        };
        let c = calibrate(&m, &s, false);
        let e2e = &c.metrics["e2e"];
        assert_eq!((e2e.n, e2e.excluded), (30, 10));
        assert_eq!((e2e.mape, e2e.bias), (Some(0.0), Some(0.0)));
        assert_eq!(e2e.ks_stat, Some(0.0));
        assert!(e2e.tost_pass);
        assert!(!c.metrics.contains_key("trajectory_e2e"));
        assert_eq!(c.windows.len(), 3);
        assert_eq!(c.counts["warmup_excluded"], 10);
        let n: u64 = c
            .windows
            .iter()
            .map(|w| w.metrics["ttft"]["n"].as_u64().unwrap())
            .sum();
        assert_eq!(n, 30, "every compared request is in one window");
        let text = console(&c, &s);
        assert!(text.contains("E2E"), "{text}");
    }
}
