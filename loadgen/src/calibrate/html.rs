//! The calibration's HTML page: the figures table, and per metric a predicted-against-measured
//! scatter (with the line of perfect agreement) and the two CDFs, in the house report's style.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::report::{Calibration, METRICS};
use crate::error::LoadgenError;
use crate::report::chart::{esc, short, Chart, Series};

/// Points drawn per scatter or CDF at most (evenly thinned beyond): the page stays small.
const MAX_POINTS: usize = 2000;

fn thin<T: Copy>(v: &[T]) -> Vec<T> {
    if v.len() <= MAX_POINTS {
        return v.to_vec();
    }
    (0..MAX_POINTS)
        .map(|i| v[i * (v.len() - 1) / (MAX_POINTS - 1)])
        .collect()
}

/// A scatter of (predicted, measured) with the diagonal, as an inline `<svg>`.
fn scatter(title: &str, unit: &str, pairs: &[(f64, f64)]) -> String {
    let (w, h, m) = (420.0, 420.0, 56.0);
    let hi = pairs
        .iter()
        .flat_map(|&(p, v)| [p, v])
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.05;
    let px = |x: f64| m + x / hi * (w - m - 12.0);
    let py = |y: f64| h - m - y / hi * (h - m - 12.0);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<figure><figcaption>{}</figcaption><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" role="img">"#,
        esc(title)
    );
    let _ = write!(
        s,
        r#"<line class="axis" x1="{m}" y1="{}" x2="{}" y2="{}"/><line class="axis" x1="{m}" y1="12" x2="{m}" y2="{}"/>"#,
        h - m,
        w - 12.0,
        h - m,
        h - m
    );
    let _ = write!(
        s,
        r#"<line class="slo" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"><title>measured = predicted</title></line>"#,
        px(0.0),
        py(0.0),
        px(hi),
        py(hi)
    );
    for i in 0..=4 {
        let t = hi * i as f64 / 4.0;
        let _ = write!(
            s,
            r#"<text class="tick" x="{:.1}" y="{}" text-anchor="middle">{}</text><text class="tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            px(t),
            h - m + 16.0,
            short(t),
            m - 6.0,
            py(t) + 4.0,
            short(t)
        );
    }
    let _ = write!(
        s,
        r#"<text class="label" x="{}" y="{}" text-anchor="middle">predicted ({unit})</text><text class="label" transform="translate(14 {}) rotate(-90)" text-anchor="middle">measured ({unit})</text>"#,
        (m + w) / 2.0,
        h - 8.0,
        (h - m) / 2.0
    );
    for (p, v) in thin(pairs) {
        let _ = write!(
            s,
            r##"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="#0072b2" fill-opacity="0.5"><title>predicted {} measured {}</title></circle>"##,
            px(p),
            py(v),
            short(p),
            short(v)
        );
    }
    s.push_str("</svg></figure>");
    s
}

/// The two empirical CDFs as a [`Chart`].
fn cdfs(title: &str, unit: &str, pairs: &[(f64, f64)]) -> String {
    let cdf = |mut v: Vec<f64>| -> Vec<(f64, f64)> {
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let pts: Vec<(f64, f64)> = v
            .iter()
            .enumerate()
            .map(|(i, &x)| (x, (i + 1) as f64 / n))
            .collect();
        thin(&pts)
    };
    let chart = Chart {
        title: title.into(),
        x_label: unit.into(),
        y_label: "fraction of requests".into(),
        series: vec![
            Series {
                name: "predicted (offline)".into(),
                points: cdf(pairs.iter().map(|x| x.0).collect()),
                color: 0,
                ..Series::default()
            },
            Series {
                name: "measured (live)".into(),
                points: cdf(pairs.iter().map(|x| x.1).collect()),
                color: 1,
                dashed: true,
                ..Series::default()
            },
        ],
        height: 420.0,
        ..Chart::default()
    };
    chart.svg()
}

fn cell(v: &Value, pct: bool) -> String {
    match v.as_f64() {
        Some(x) if pct => format!("{:+.2}%", 100.0 * x),
        Some(x) => format!("{x:.4}"),
        None => match v {
            Value::Bool(b) => if *b { "pass" } else { "FAIL" }.into(),
            Value::Null => "-".into(),
            other => other.to_string(),
        },
    }
}

/// The page.
pub(crate) fn render(json: &Value, c: &Calibration) -> String {
    let mut h = String::new();
    let title = format!(
        "loadgen calibrate: {}",
        json["trace"].as_str().unwrap_or_default()
    );
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{}</style></head><body><h1>{t}</h1><p>Measured: {}. Predicted: servesim's offline replay with the same engine flags. Bias = mean(measured) / mean(predicted) &minus; 1; TOST at &plusmn;{}% on the mean and p90 (90% paired bootstrap interval).</p>",
        crate::report::html::STYLE,
        esc(json["live"].as_str().unwrap_or_default()),
        100.0 * json["margin"].as_f64().unwrap_or(0.0),
        t = esc(&title),
    );
    h.push_str("<h2>Figures</h2><table><tr><th>metric</th><th>n</th><th>excluded</th><th>MAPE</th><th>bias</th><th>Pearson r</th><th>KS D</th><th>KS p</th><th>TOST</th></tr>");
    for (key, name, _) in METRICS {
        let m = &json["metrics"][key];
        if m.is_null() {
            continue;
        }
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            m["n"],
            m["excluded"],
            cell(&m["mape"], true),
            cell(&m["bias"], true),
            cell(&m["pearson_r"], false),
            cell(&m["ks_stat"], false),
            cell(&m["ks_p"], false),
            cell(&m["tost_pass"], false)
        );
    }
    h.push_str("</table>");
    for (key, name, unit) in METRICS {
        let Some(pairs) = c.pairs.get(key) else {
            continue;
        };
        let _ = write!(h, "<h2>{}</h2><div class=\"grid2\">", esc(name));
        h.push_str(&scatter(
            &format!("{name}: measured against predicted, per request"),
            unit,
            pairs,
        ));
        h.push_str(&cdfs(&format!("{name}: CDFs"), unit, pairs));
        h.push_str("</div>");
    }
    h.push_str("</body></html>\n");
    h
}

/// Writes the page to `path`.
pub(crate) fn write(path: &Path, json: &Value, c: &Calibration) -> Result<(), LoadgenError> {
    std::fs::write(path, render(json, c)).map_err(|source| LoadgenError::Io {
        path: path.to_path_buf(),
        source,
    })
}
