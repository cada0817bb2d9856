//! The HTML report: one self-contained file (inline SVG and CSS, a few lines of inline JS, no
//! network) drawn from report JSON alone, so a report written today can be drawn again later
//! and several can be drawn together (`loadgen compare --html`).
//!
//! The report JSON of a run carries what the charts need: `latency_cdf` (101 quantiles of TTFT,
//! ITL and E2E, [`latency_cdf`]), `timeline` (per-interval throughput and TTFT, [`timeline`]),
//! `server_metrics` (the scraped series), `config`; a multiturn result its `per_turn_ttft` and
//! `raw_results`; a sweep its `points` and `sweep` keys. [`RunView::of`] reads any of them
//! (missing keys leave charts out) and [`render`] draws the page.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};
use servesim::metrics::Distribution;

use crate::error::LoadgenError;
use crate::report::chart::{esc, short, Chart, Series};
use crate::report::replay_report::LiveReport;

/// Quantiles kept per latency in `latency_cdf` (0%, 1%, ..., 100%).
pub(crate) const CDF_POINTS: usize = 101;

/// Most intervals in a `timeline`.
pub(crate) const TIMELINE_BUCKETS: f64 = 60.0;

/// 101 quantiles of `v` (empty when `v` is), by the replay report's rank rule
/// (`servesim::metrics::Distribution::percentile`).
fn quantiles(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    (0..CDF_POINTS)
        .filter_map(|i| Distribution::percentile(&v, i as f64))
        .collect()
}

/// The `latency_cdf` key: 101 quantiles (ms) of TTFT, ITL (every gap between token chunks)
/// and E2E latency of the successful requests.
pub(crate) fn latency_cdf(live: &LiveReport) -> Value {
    let ok = || live.records.iter().filter(|r| r.error.is_none());
    let ttft: Vec<f64> = ok().filter_map(|r| r.record.ttft_ms).collect();
    let e2e: Vec<f64> = ok().filter_map(|r| r.record.e2e_latency_ms).collect();
    let itl: Vec<f64> = ok()
        .flat_map(|r| {
            r.raw
                .token_chunks_us
                .windows(2)
                .map(|w| (w[1] - w[0]) as f64 / 1000.0)
                .collect::<Vec<_>>()
        })
        .collect();
    json!({
        "ttft_ms": quantiles(ttft),
        "itl_ms": quantiles(itl),
        "e2e_ms": quantiles(e2e),
    })
}

/// A round interval (s) giving at most [`TIMELINE_BUCKETS`] intervals over `duration_s`.
fn bucket_s(duration_s: f64) -> f64 {
    let raw = (duration_s / TIMELINE_BUCKETS).max(0.01);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&b| b >= raw)
        .unwrap_or(10.0 * mag)
}

/// The `timeline` key: per interval from the run start, requests completed per second, output
/// tokens per second (at their chunks' times) and the median TTFT of the requests whose first
/// token came in it.
pub(crate) fn timeline(live: &LiveReport) -> Value {
    let base = live
        .records
        .iter()
        .map(|r| r.raw.scheduled_us)
        .min()
        .unwrap_or(0);
    let rel = |us: u64| us.saturating_sub(base) as f64 / 1e6;
    let end = live
        .records
        .iter()
        .map(|r| rel(r.raw.sent_us + r.raw.end_us))
        .fold(0.0, f64::max);
    let w = bucket_s(end);
    let n = ((end / w).floor() as usize + 1).min(10 * TIMELINE_BUCKETS as usize);
    let mut done = vec![0.0; n];
    let mut tokens = vec![0.0; n];
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); n];
    let slot = |t: f64| ((t / w).floor() as usize).min(n - 1);
    for r in &live.records {
        let raw = &r.raw;
        done[slot(rel(raw.sent_us + raw.end_us))] += 1.0;
        if r.error.is_some() {
            continue;
        }
        let chunks = &raw.token_chunks_us;
        for &c in chunks {
            tokens[slot(rel(raw.sent_us + c))] += 1.0;
        }
        // Tokens beyond one per chunk count at the last chunk.
        if let Some(&last) = chunks.last() {
            tokens[slot(rel(raw.sent_us + last))] +=
                raw.output_tokens.saturating_sub(chunks.len() as u64) as f64;
        }
        if let (Some(&first), Some(ttft)) = (chunks.first(), r.record.ttft_ms) {
            ttfts[slot(rel(raw.sent_us + first))].push(ttft);
        }
    }
    let median = |v: &Vec<f64>| {
        if v.is_empty() {
            return Value::Null;
        }
        let mut v = v.clone();
        v.sort_by(f64::total_cmp);
        json!(Distribution::percentile_multiturn(&v, 500))
    };
    json!({
        "bucket_s": w,
        "t_s": (0..n).map(|i| i as f64 * w).collect::<Vec<_>>(),
        "requests_per_s": done.iter().map(|d| d / w).collect::<Vec<_>>(),
        "output_tokens_per_s": tokens.iter().map(|d| d / w).collect::<Vec<_>>(),
        "ttft_p50_ms": ttfts.iter().map(median).collect::<Vec<_>>(),
    })
}

/// One run as the page draws it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunView {
    /// Its name in legends.
    pub name: String,
    /// TTFT, ITL, E2E quantiles (ms).
    pub cdf: Vec<(String, Vec<f64>)>,
    /// One entry per interval.
    pub timeline: Vec<TimePoint>,
    /// Server series: name → (t s, value).
    pub server: Vec<(String, Vec<(f64, f64)>)>,
    /// Multiturn: (turn, p50 ms, p95 ms).
    pub per_turn: Vec<(f64, f64, f64)>,
    /// Sweep points: (label, load, req/s, tok/s, TTFT p50, TTFT p99, ITL p50, saturated).
    pub sweep: Vec<SweepPointView>,
    /// Index of the knee among `sweep`.
    pub knee: Option<usize>,
    /// SLO TTFT and ITL (ms).
    pub slo_ttft_ms: Option<f64>,
    /// SLO on the mean inter-token latency.
    pub slo_itl_ms: Option<f64>,
    /// The configuration block.
    pub config: Value,
    /// Headline figures: (name, value).
    pub headline: Vec<(String, String)>,
}

/// One interval of a run's timeline: (start s, req/s, output tok/s, TTFT p50 ms).
pub(crate) type TimePoint = (f64, f64, f64, Option<f64>);

/// One sweep point as drawn.
#[derive(Clone, Debug, Default)]
pub(crate) struct SweepPointView {
    /// `c=8`, `4 req/s`.
    pub label: String,
    /// The offered load (concurrency, req/s or speed-up): the curve's order.
    pub load: f64,
    /// Achieved req/s.
    pub rps: f64,
    /// Achieved output tok/s.
    pub tok_s: f64,
    /// TTFT p50, p99 (ms).
    pub ttft: (f64, f64),
    /// ITL p50, p99 (ms).
    pub itl: (f64, f64),
    /// Saturated.
    pub saturated: bool,
}

fn nums(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

fn quantiles_of_us(values: impl Iterator<Item = u64>) -> Vec<f64> {
    quantiles(values.map(|v| v as f64 / 1000.0).collect())
}

impl RunView {
    /// Reads a report JSON of any mode (bench, replay, sweep, multiturn, merge).
    pub(crate) fn of(name: &str, j: &Value) -> RunView {
        let mut v = RunView {
            name: name.to_string(),
            config: j.get("config").cloned().unwrap_or(Value::Null),
            ..RunView::default()
        };
        if let Some(c) = j.get("latency_cdf") {
            for (label, key) in [("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("E2E", "e2e_ms")] {
                v.cdf.push((label.into(), nums(&c[key])));
            }
        } else if let Some(raw) = j.get("raw_results").and_then(Value::as_array) {
            let ok = || raw.iter().filter(|r| r["success"].as_bool() == Some(true));
            v.cdf.push((
                "TTFT".into(),
                quantiles_of_us(ok().filter_map(|r| r["first_answer_us"].as_u64())),
            ));
            v.cdf.push((
                "E2E".into(),
                quantiles_of_us(ok().filter_map(|r| r["total_latency_us"].as_u64())),
            ));
        }
        if let Some(t) = j.get("timeline") {
            let ts = nums(&t["t_s"]);
            let rps = nums(&t["requests_per_s"]);
            let tok = nums(&t["output_tokens_per_s"]);
            let ttft = t["ttft_p50_ms"].as_array().cloned().unwrap_or_default();
            v.timeline = ts
                .iter()
                .enumerate()
                .map(|(i, &x)| {
                    (
                        x,
                        rps.get(i).copied().unwrap_or(0.0),
                        tok.get(i).copied().unwrap_or(0.0),
                        ttft.get(i).and_then(Value::as_f64),
                    )
                })
                .collect();
        }
        if let Some(samples) = j
            .pointer("/server_metrics/samples")
            .and_then(Value::as_array)
        {
            for key in ["running", "waiting", "kv_usage", "prefix_hit_rate"] {
                let pts: Vec<(f64, f64)> = samples
                    .iter()
                    .filter_map(|s| Some((s["t_ms"].as_f64()? / 1000.0, s[key].as_f64()?)))
                    .collect();
                if !pts.is_empty() {
                    v.server.push((key.into(), pts));
                }
            }
        }
        if let Some(turns) = j.get("per_turn_ttft").and_then(Value::as_array) {
            v.per_turn = turns
                .iter()
                .filter_map(|t| {
                    Some((
                        t["turn"].as_f64()?,
                        t["p50_us"].as_f64()? / 1000.0,
                        t["p95_us"].as_f64()? / 1000.0,
                    ))
                })
                .collect();
        }
        if let Some(points) = j.get("points").and_then(Value::as_array) {
            let f = |p: &Value, k: &str| p[k].as_f64().unwrap_or(0.0);
            v.sweep = points
                .iter()
                .map(|p| SweepPointView {
                    label: p["load_label"].as_str().unwrap_or("").to_string(),
                    load: p["load"]
                        .as_object()
                        .and_then(|o| o.values().find_map(Value::as_f64))
                        .unwrap_or(0.0),
                    rps: f(p, "request_throughput_rps"),
                    tok_s: f(p, "output_throughput_tok_s"),
                    ttft: (f(p, "median_ttft_ms"), f(p, "p99_ttft_ms")),
                    itl: (f(p, "median_itl_ms"), f(p, "p99_itl_ms")),
                    saturated: p["saturated"].as_bool().unwrap_or(false),
                })
                .collect();
            v.knee = j
                .pointer("/sweep/knee_index")
                .and_then(Value::as_u64)
                .map(|k| k as usize);
        }
        let slo = j
            .pointer("/sweep/slo")
            .or_else(|| j.get("slo"))
            .cloned()
            .unwrap_or(Value::Null);
        v.slo_ttft_ms = slo["ttft_ms"].as_f64();
        v.slo_itl_ms = slo["itl_ms"].as_f64();
        let head = |k: &str| j.get(k).and_then(Value::as_f64);
        for (label, key, unit) in [
            ("requests", "num_requests", ""),
            ("req/s", "request_throughput_rps", ""),
            ("output tok/s", "output_throughput_tok_s", ""),
            ("TTFT p50", "median_ttft_ms", " ms"),
            ("TTFT p99", "p99_ttft_ms", " ms"),
            ("ITL p50", "median_itl_ms", " ms"),
            ("E2E p50", "median_e2e_latency_ms", " ms"),
        ] {
            if let Some(x) = head(key) {
                v.headline
                    .push((label.into(), format!("{}{unit}", short(x))));
            }
        }
        if let Some(n) = j.pointer("/failures/total").and_then(Value::as_u64) {
            v.headline.push(("failed".into(), n.to_string()));
        }
        v
    }
}

pub(crate) const STYLE: &str = r#"
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1520px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.grid2{display:grid;grid-template-columns:repeat(auto-fill,minmax(720px,1fr));gap:12px}
figure{margin:0;background:#fafafa;border:1px solid #e4e4e4;border-radius:6px;padding:6px}
figcaption{font-weight:600;margin:2px 6px}
svg{max-width:100%;height:auto}
.axis{stroke:#444}.grid{stroke:#e4e4e4}.tick{font-size:11px;fill:#555}.label{font-size:12px;fill:#333}
.legend{font-size:12px;fill:#333}.slo{stroke:#d55e00;stroke-dasharray:4 3}.slo-label{font-size:11px;fill:#d55e00}
.mark{fill:none;stroke:#d55e00;stroke-width:2}.mark-label{font-size:12px;font-weight:600;fill:#d55e00}
.empty{font-size:13px;fill:#999}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f2f2f2}
td:first-child,th:first-child{text-align:left}
.kv{display:flex;flex-wrap:wrap;gap:8px}.kv div{background:#f4f7fb;border:1px solid #dde5f0;border-radius:6px;padding:6px 10px}
.kv b{display:block;font-size:16px}
pre{background:#f6f6f6;border:1px solid #e4e4e4;padding:8px;overflow:auto;font-size:12px}
"#;

/// The HTML page for one or more runs.
pub(crate) fn render(runs: &[RunView]) -> String {
    let title = match runs {
        [one] => format!("loadgen report: {}", one.name),
        many => format!(
            "loadgen comparison: {}",
            many.iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>()
                .join(" vs ")
        ),
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1><p>Generated by loadgen {}. Hover a line or point for its name and values.</p>",
        esc(&title),
        esc(&title),
        env!("CARGO_PKG_VERSION")
    );
    // Headline figures.
    for r in runs.iter().filter(|r| !r.headline.is_empty()) {
        let _ = write!(h, "<h2>{}</h2><div class=\"kv\">", esc(&r.name));
        for (k, v) in &r.headline {
            let _ = write!(h, "<div>{}<b>{}</b></div>", esc(k), esc(v));
        }
        h.push_str("</div>");
    }
    // Sweep.
    for (ri, r) in runs.iter().enumerate().filter(|(_, r)| !r.sweep.is_empty()) {
        let _ = write!(
            h,
            "<h2>Sweep: throughput vs latency ({})</h2><div class=\"grid2\">",
            esc(&r.name)
        );
        for (metric, pick, slo) in [
            ("TTFT", 0usize, r.slo_ttft_ms),
            ("ITL", 1usize, r.slo_itl_ms),
        ] {
            let get = |p: &SweepPointView| if pick == 0 { p.ttft } else { p.itl };
            let tip = |p: &SweepPointView| {
                format!(
                    "{}: {:.2} req/s, {:.0} tok/s, {metric} p50 {:.1} ms, p99 {:.1} ms{}",
                    p.label,
                    p.rps,
                    p.tok_s,
                    get(p).0,
                    get(p).1,
                    if p.saturated { " (saturated)" } else { "" }
                )
            };
            let mut order: Vec<usize> = (0..r.sweep.len()).collect();
            // In load order: past saturation the curve bends back (more load, less throughput).
            order.sort_by(|&a, &b| r.sweep[a].load.total_cmp(&r.sweep[b].load));
            let series = |name: &str, p99: bool, color: usize| Series {
                name: format!("{metric} {name}"),
                points: order
                    .iter()
                    .map(|&i| {
                        (
                            r.sweep[i].rps,
                            if p99 {
                                get(&r.sweep[i]).1
                            } else {
                                get(&r.sweep[i]).0
                            },
                        )
                    })
                    .collect(),
                dots: order.iter().map(|&i| tip(&r.sweep[i])).collect(),
                dashed: p99,
                color,
            };
            let mut chart = Chart {
                title: format!("{metric} vs achieved throughput"),
                x_label: "achieved requests/s".into(),
                y_label: format!("{metric} (ms)"),
                series: vec![
                    series("p50", false, 2 * ri),
                    series("p99", true, 2 * ri + 1),
                ],
                ..Chart::default()
            };
            if let Some(s) = slo {
                chart.hlines.push((s, format!("SLO {metric} {s} ms")));
            }
            if let Some(k) = r.knee.and_then(|k| r.sweep.get(k)) {
                chart
                    .marks
                    .push((k.rps, get(k).0, format!("knee ({})", k.label)));
            }
            h.push_str(&chart.svg());
        }
        h.push_str("</div><table><tr><th>load</th><th>req/s</th><th>tok/s</th><th>TTFT p50</th><th>TTFT p99</th><th>ITL p50</th><th>ITL p99</th><th></th></tr>");
        for (i, p) in r.sweep.iter().enumerate() {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{:.2}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.2}</td><td>{:.2}</td><td>{}</td></tr>",
                esc(&p.label), p.rps, p.tok_s, p.ttft.0, p.ttft.1, p.itl.0, p.itl.1,
                match (Some(i) == r.knee, p.saturated) {
                    (true, _) => "knee",
                    (false, true) => "saturated",
                    _ => "",
                }
            );
        }
        h.push_str("</table>");
    }
    // Latency CDFs.
    if runs
        .iter()
        .any(|r| r.cdf.iter().any(|(_, q)| !q.is_empty()))
    {
        h.push_str("<h2>Latency distributions (CDF)</h2><div class=\"grid2\">");
        for metric in ["TTFT", "ITL", "E2E"] {
            let series: Vec<Series> = runs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let q = &r.cdf.iter().find(|(m, _)| m == metric)?.1;
                    (!q.is_empty()).then(|| Series {
                        name: r.name.clone(),
                        points: q
                            .iter()
                            .enumerate()
                            .map(|(k, &v)| (v, k as f64 / (q.len() - 1).max(1) as f64))
                            .collect(),
                        color: i,
                        ..Series::default()
                    })
                })
                .collect();
            if series.is_empty() {
                continue;
            }
            h.push_str(
                &Chart {
                    title: format!("{metric} CDF"),
                    x_label: format!("{metric} (ms)"),
                    y_label: "share of requests".into(),
                    series,
                    height: 260.0,
                    ..Chart::default()
                }
                .svg(),
            );
        }
        h.push_str("</div>");
    }
    // Over time.
    if runs
        .iter()
        .any(|r| !r.timeline.is_empty() || !r.server.is_empty())
    {
        h.push_str("<h2>Over time</h2><div class=\"grid2\">");
        let over = |title: &str, y: &str, f: &dyn Fn(&TimePoint) -> Option<f64>| Chart {
            title: title.into(),
            x_label: "time since start (s)".into(),
            y_label: y.into(),
            series: runs
                .iter()
                .enumerate()
                .filter(|(_, r)| !r.timeline.is_empty())
                .map(|(i, r)| Series {
                    name: r.name.clone(),
                    points: r
                        .timeline
                        .iter()
                        .filter_map(|p| Some((p.0, f(p)?)))
                        .collect(),
                    color: i,
                    ..Series::default()
                })
                .collect(),
            height: 240.0,
            ..Chart::default()
        };
        if runs.iter().any(|r| !r.timeline.is_empty()) {
            h.push_str(&over("TTFT p50 over time", "TTFT p50 (ms)", &|p| p.3).svg());
            h.push_str(&over("Output tokens/s over time", "output tok/s", &|p| Some(p.2)).svg());
            h.push_str(&over("Completed requests/s over time", "req/s", &|p| Some(p.1)).svg());
        }
        for (key, title, y) in [
            ("running", "Server: requests running", "requests"),
            ("waiting", "Server: requests waiting", "requests"),
            ("kv_usage", "Server: KV-cache usage", "share of blocks"),
            (
                "prefix_hit_rate",
                "Server: prefix-cache hit rate",
                "hit rate",
            ),
        ] {
            let series: Vec<Series> = runs
                .iter()
                .enumerate()
                .filter_map(|(i, r)| {
                    let pts = &r.server.iter().find(|(k, _)| k == key)?.1;
                    Some(Series {
                        name: r.name.clone(),
                        points: pts.clone(),
                        color: i,
                        ..Series::default()
                    })
                })
                .collect();
            if !series.is_empty() {
                h.push_str(
                    &Chart {
                        title: title.into(),
                        x_label: "time since start (s)".into(),
                        y_label: y.into(),
                        series,
                        height: 200.0,
                        ..Chart::default()
                    }
                    .svg(),
                );
            }
        }
        h.push_str("</div>");
    }
    // Per turn.
    if runs.iter().any(|r| !r.per_turn.is_empty()) {
        h.push_str("<h2>Per-turn TTFT</h2>");
        let mut series = Vec::new();
        for (i, r) in runs
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.per_turn.is_empty())
        {
            series.push(Series {
                name: format!("{} p50", r.name),
                points: r.per_turn.iter().map(|t| (t.0 + 1.0, t.1)).collect(),
                dots: r
                    .per_turn
                    .iter()
                    .map(|t| format!("turn {}: p50 {:.1} ms", t.0 + 1.0, t.1))
                    .collect(),
                color: i,
                ..Series::default()
            });
            series.push(Series {
                name: format!("{} p95", r.name),
                points: r.per_turn.iter().map(|t| (t.0 + 1.0, t.2)).collect(),
                dashed: true,
                color: i,
                ..Series::default()
            });
        }
        h.push_str(
            &Chart {
                title: "TTFT by turn".into(),
                x_label: "turn".into(),
                y_label: "TTFT (ms)".into(),
                series,
                ..Chart::default()
            }
            .svg(),
        );
    }
    // Configuration.
    h.push_str("<h2>Configuration</h2>");
    for r in runs {
        let text = serde_json::to_string_pretty(&r.config).unwrap_or_default();
        let _ = write!(h, "<h3>{}</h3><pre>{}</pre>", esc(&r.name), esc(&text));
    }
    h.push_str("</body></html>\n");
    h
}

/// Writes the page for `runs` to `path`.
pub(crate) fn write(path: &Path, runs: &[RunView]) -> Result<(), LoadgenError> {
    crate::write::bytes(path, render(runs))?;
    crate::stdout::outln!("Saved HTML report to {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_round_and_bounded() {
        assert_eq!(bucket_s(12.0), 0.2);
        assert_eq!(bucket_s(100.0), 2.0);
        assert_eq!(bucket_s(0.0), 0.01);
    }

    /// A run, a sweep and a multiturn run: every chart of the page.
    fn views() -> Vec<RunView> {
        let run = json!({
            "num_requests": 3, "request_throughput_rps": 2.5, "median_ttft_ms": 12.0,
            "latency_cdf": {"ttft_ms": [1.0, 2.0, 3.0], "itl_ms": [0.5, 0.6], "e2e_ms": [10.0, 20.0]},
            "timeline": {"t_s": [0.0, 1.0], "requests_per_s": [1.0, 2.0], "output_tokens_per_s": [10.0, 20.0], "ttft_p50_ms": [1.0, null]},
            "server_metrics": {"samples": [{"t_ms": 0.0, "running": 1.0, "kv_usage": 0.2}, {"t_ms": 500.0, "running": 3.0, "kv_usage": 0.4}]},
            "config": {"mode": "closed loop: concurrency 4 <script>"},
            "failures": {"total": 0},
        });
        let sweep = json!({
            "sweep": {"knee_index": 1, "slo": {"ttft_ms": 100.0, "itl_ms": null}},
            "points": [
                {"load_label": "c=1", "request_throughput_rps": 1.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0, "saturated": false},
                {"load_label": "c=2", "request_throughput_rps": 2.0, "median_ttft_ms": 11.0, "p99_ttft_ms": 25.0, "saturated": false},
                {"load_label": "c=4", "request_throughput_rps": 2.1, "median_ttft_ms": 50.0, "p99_ttft_ms": 200.0, "saturated": true}
            ]
        });
        let multiturn = json!({"per_turn_ttft": [{"turn": 0, "p50_us": 1000, "p95_us": 2000}, {"turn": 1, "p50_us": 500, "p95_us": 900}],
            "raw_results": [{"success": true, "first_answer_us": 1000, "total_latency_us": 5000}]});
        vec![
            RunView::of("a", &run),
            RunView::of("sweep", &sweep),
            RunView::of("mt", &multiturn),
        ]
    }

    #[test]
    fn the_page_bytes_are_pinned() {
        let page = render(&views());
        assert_eq!(
            (page.len(), xxhash_rust::xxh3::xxh3_64(page.as_bytes())),
            (26117, 1684900529061468447)
        );
    }

    #[test]
    fn the_page_is_self_contained_and_has_every_section() {
        let page = render(&views());
        for needle in [
            "<!DOCTYPE html>",
            "TTFT CDF",
            "ITL CDF",
            "E2E CDF",
            "TTFT p50 over time",
            "Output tokens/s over time",
            "Server: requests running",
            "Server: KV-cache usage",
            "TTFT vs achieved throughput",
            "SLO TTFT 100 ms",
            "knee (c=2)",
            "TTFT by turn",
            "Configuration",
            "&lt;script&gt;",
        ] {
            assert!(page.contains(needle), "missing {needle}");
        }
        // Self-contained: nothing fetched from anywhere.
        for banned in [
            "src=\"http",
            "href=\"http",
            "<script src",
            "@import",
            "url(",
        ] {
            assert!(!page.contains(banned), "{banned}");
        }
        assert!(
            !page.contains("<script>"),
            "raw config text must be escaped"
        );
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
    }
}
