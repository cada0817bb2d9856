//! Every SVG loadgen draws: the HTML report's line charts ([`Chart`]), `loadgen compare`'s
//! per-turn TTFT chart (`per_turn`) and `loadgen profile`'s prefill and decode panels
//! (`panels`), with the escaping, number and tick rules they share.

use std::fmt::Write as _;

/// A number in at most 4 significant digits (integers without decimals).
pub(crate) fn short(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let a = x.abs();
    if a >= 1000.0 {
        format!("{x:.0}")
    } else if a >= 100.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// Series colours (colour-blind safe).
const COLORS: [&str; 8] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000",
];

/// One line of a chart.
#[derive(Clone, Debug, Default)]
pub(crate) struct Series {
    /// Legend.
    pub name: String,
    /// (x, y) in data units.
    pub points: Vec<(f64, f64)>,
    /// Dashed line.
    pub dashed: bool,
    /// Draw dots with the given labels (tooltips) instead of only a line.
    pub dots: Vec<String>,
    /// Colour index.
    pub color: usize,
}

/// A chart: series, axes, horizontal reference lines, marked points.
#[derive(Clone, Debug, Default)]
pub(crate) struct Chart {
    /// Title above it.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Lines.
    pub series: Vec<Series>,
    /// Logarithmic x axis.
    pub log_x: bool,
    /// Horizontal reference lines: (y, label).
    pub hlines: Vec<(f64, String)>,
    /// Marked points: (x, y, label).
    pub marks: Vec<(f64, f64, String)>,
    /// Height in px.
    pub height: f64,
}

fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 && out.len() < 20 {
        out.push(t);
        t += step;
    }
    out
}

/// A tick label with as many decimals as the tick step needs.
fn tick_label(t: f64, ticks: &[f64]) -> String {
    let step = match ticks {
        [a, b, ..] => (b - a).abs(),
        _ => t.abs(),
    };
    let decimals = if step > 0.0 {
        (-step.log10().floor()).max(0.0) as usize
            + usize::from(step / 10f64.powf(step.log10().floor()) == 2.5)
    } else {
        0
    };
    format!("{t:.decimals$}")
}

/// `s` escaped for HTML and SVG text and attributes.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl Chart {
    /// The chart as an inline `<svg>`.
    pub(crate) fn svg(&self) -> String {
        let (w, h) = (
            720.0,
            if self.height > 0.0 {
                self.height
            } else {
                300.0
            },
        );
        let (ml, mr, mt, mb) = (64.0, 16.0, 28.0, 44.0);
        let fx = |x: f64| if self.log_x { x.max(1e-9).log10() } else { x };
        let all: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0))
            .chain(self.marks.iter().map(|(x, y, _)| (*x, *y)))
            .collect();
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<figure><figcaption>{}</figcaption><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" role="img">"#,
            esc(&self.title)
        );
        if all.is_empty() {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" class="empty">no data</text></svg></figure>"#,
                w / 2.0,
                h / 2.0
            );
            return s;
        }
        let (mut x0, mut x1) = all
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
                (a.min(fx(p.0)), b.max(fx(p.0)))
            });
        let mut y1 = all.iter().map(|p| p.1).fold(0.0, f64::max);
        for (y, _) in &self.hlines {
            y1 = y1.max(*y);
        }
        let y0 = all.iter().map(|p| p.1).fold(0.0, f64::min);
        if x1 <= x0 {
            x0 -= 0.5;
            x1 += 0.5;
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        y1 *= 1.05;
        let px = |x: f64| ml + (fx(x) - x0) / (x1 - x0) * (w - ml - mr);
        let py = |y: f64| h - mb - (y - y0) / (y1 - y0) * (h - mt - mb);
        // Axes and ticks.
        let _ = write!(
            s,
            r#"<line class="axis" x1="{ml}" y1="{}" x2="{}" y2="{}"/><line class="axis" x1="{ml}" y1="{mt}" x2="{ml}" y2="{}"/>"#,
            h - mb,
            w - mr,
            h - mb,
            h - mb
        );
        let yt = nice_ticks(y0, y1);
        for &t in &yt {
            let y = py(t);
            let _ = write!(
                s,
                r#"<line class="grid" x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}"/><text class="tick" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                w - mr,
                ml - 6.0,
                y + 4.0,
                tick_label(t, &yt)
            );
        }
        let xt = nice_ticks(x0, x1);
        for &t in &xt {
            let label = if self.log_x {
                short(10f64.powf(t))
            } else {
                tick_label(t, &xt)
            };
            let x = ml + (t - x0) / (x1 - x0) * (w - ml - mr);
            let _ = write!(
                s,
                r#"<text class="tick" x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
                h - mb + 16.0,
                label
            );
        }
        let _ = write!(
            s,
            r#"<text class="label" x="{}" y="{}" text-anchor="middle">{}</text><text class="label" transform="translate(14 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (ml + w - mr) / 2.0,
            h - 6.0,
            esc(&self.x_label),
            (mt + h - mb) / 2.0,
            esc(&self.y_label)
        );
        for (y, label) in &self.hlines {
            let yy = py(*y);
            let _ = write!(
                s,
                r#"<line class="slo" x1="{ml}" y1="{yy:.1}" x2="{}" y2="{yy:.1}"/><text class="slo-label" x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                w - mr,
                w - mr - 4.0,
                yy - 4.0,
                esc(label)
            );
        }
        // Series.
        for (k, series) in self.series.iter().enumerate() {
            let color = COLORS[series.color % COLORS.len()];
            let pts: Vec<String> = series
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.log_x || *x > 0.0))
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            if pts.len() > 1 {
                let _ = write!(
                    s,
                    r#"<polyline fill="none" stroke="{color}" stroke-width="2" {} points="{}"><title>{}</title></polyline>"#,
                    if series.dashed {
                        r#"stroke-dasharray="6 4""#
                    } else {
                        ""
                    },
                    pts.join(" "),
                    esc(&series.name)
                );
            }
            for (i, &(x, y)) in series.points.iter().enumerate() {
                if series.dots.is_empty() && pts.len() > 1 {
                    break;
                }
                let tip = series.dots.get(i).cloned().unwrap_or_default();
                let _ = write!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{color}"><title>{}</title></circle>"#,
                    px(x),
                    py(y),
                    esc(&tip)
                );
            }
            // Legend.
            let lx = ml + 10.0 + (k % 4) as f64 * 160.0;
            let ly = mt - 14.0 + (k / 4) as f64 * 14.0;
            let _ = write!(
                s,
                r#"<rect x="{lx}" y="{}" width="12" height="4" fill="{color}"/><text class="legend" x="{}" y="{}">{}</text>"#,
                ly - 4.0,
                lx + 16.0,
                ly,
                esc(&series.name)
            );
        }
        for (x, y, label) in &self.marks {
            let (cx, cy) = (px(*x), py(*y));
            // Labels near the right edge go to the left of the mark.
            let (lx, anchor) = if cx > w - 140.0 {
                (cx - 10.0, "end")
            } else {
                (cx + 10.0, "start")
            };
            let _ = write!(
                s,
                r#"<circle class="mark" cx="{cx:.1}" cy="{cy:.1}" r="8"/><text class="mark-label" x="{lx:.1}" y="{:.1}" text-anchor="{anchor}">{}</text>"#,
                cy - 10.0,
                esc(label)
            );
        }
        s.push_str("</svg></figure>");
        s
    }
}

/// One turn of [`per_turn`]: its index and each run's (p50, p95), when it had the turn.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TurnPoint {
    /// The turn (0-based; labelled from 1).
    pub turn: usize,
    /// Run A's and run B's (p50, p95) in ms.
    pub runs: [Option<(f64, f64)>; 2],
}

/// A line chart of per-turn TTFT (p50 solid, p95 dashed) for two runs named `names`
/// (`loadgen compare --svg`).
pub(crate) fn per_turn(rows: &[TurnPoint], names: [&str; 2]) -> String {
    let [a_name, b_name] = names;
    let (w, h) = (720.0, 420.0);
    let (left, right, top, bottom) = (70.0, 200.0, 40.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max_y = rows
        .iter()
        .flat_map(|r| r.runs)
        .flatten()
        .map(|(_, p95)| p95)
        .fold(0.0_f64, f64::max);
    let max_y = nice_ceiling(max_y);
    let n = rows.len().max(1);
    let x = |turn: usize| {
        if n == 1 {
            left + pw / 2.0
        } else {
            left + pw * turn as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| top + ph - ph * v / max_y;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Per-turn TTFT (ms)</text>"#,
        left + pw / 2.0
    );
    for i in 0..=5 {
        let v = max_y * i as f64 / 5.0;
        let yy = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            yy + 4.0,
            trim_num(v)
        );
    }
    for r in rows {
        let xx = x(r.turn);
        let _ = writeln!(
            o,
            r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            top + ph + 18.0,
            r.turn + 1
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">turn</text>"#,
        left + pw / 2.0,
        h - 10.0
    );
    let _ = writeln!(
        o,
        r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="#333"/><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##,
        top + ph,
        top + ph,
        left + pw,
        top + ph
    );
    let series: [TurnLine; 4] = [
        ("#1f77b4", "A p50", false, |r| r.runs[0].map(|v| v.0)),
        ("#1f77b4", "A p95", true, |r| r.runs[0].map(|v| v.1)),
        ("#d62728", "B p50", false, |r| r.runs[1].map(|v| v.0)),
        ("#d62728", "B p95", true, |r| r.runs[1].map(|v| v.1)),
    ];
    for (i, (color, label, dashed, get)) in series.iter().enumerate() {
        let points: Vec<String> = rows
            .iter()
            .filter_map(|r| get(r).map(|v| format!("{:.1},{:.1}", x(r.turn), y(v))))
            .collect();
        let dash = if *dashed {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            o,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            points.join(" ")
        );
        for p in &points {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(o, r#"<circle cx="{px}" cy="{py}" r="3" fill="{color}"/>"#);
        }
        let ly = top + 10.0 + 20.0 * i as f64;
        let lx = left + pw + 15.0;
        let _ = writeln!(
            o,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{label}</text>"#,
            lx + 25.0,
            lx + 30.0,
            ly + 4.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" font-size="11">A: {}</text><text x="{}" y="{}" font-size="11">B: {}</text>"#,
        left + pw + 15.0,
        top + 100.0,
        esc(a_name),
        left + pw + 15.0,
        top + 116.0,
        esc(b_name)
    );
    o.push_str("</svg>\n");
    o
}

/// A line of [`per_turn`]: colour, label, dashed, value of a turn.
type TurnLine = (
    &'static str,
    &'static str,
    bool,
    fn(&TurnPoint) -> Option<f64>,
);

/// The smallest 1/2/5 x 10^k at or above `v` (1 for v <= 0).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

/// `v` with at most 2 decimals, trailing zeros dropped.
fn trim_num(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One line of a [`Panel`]: its label, colour and points.
pub(crate) type Curve = (String, &'static str, Vec<(f64, f64)>);

/// The colours of a [`Panel`]'s lines, in order.
pub(crate) const PROFILE_COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// One panel of [`panels`]: lines through a profile's table points and its measured points as
/// dots.
pub(crate) struct Panel {
    /// Above the panel.
    pub title: &'static str,
    /// The x axis (the y axis is ms).
    pub x_label: &'static str,
    /// Lines through the table's points.
    pub lines: Vec<Curve>,
    /// Measured points.
    pub dots: Vec<(f64, f64)>,
}

/// Panels side by side, each 460 x 320 px (`loadgen profile`'s SVG: prefill left, decode
/// right).
pub(crate) fn panels(panels: &[Panel]) -> String {
    const W: f64 = 460.0;
    const H: f64 = 320.0;
    const PAD: f64 = 50.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
        panels.len() as f64 * W,
        H
    );
    let panel = |out: &mut String,
                 x0: f64,
                 title: &str,
                 xlabel: &str,
                 lines: &[Curve],
                 dots: &[(f64, f64)]| {
        let all = lines.iter().flat_map(|l| l.2.iter()).chain(dots.iter());
        let (mut xmax, mut ymax) = (0.0f64, 0.0f64);
        for &(x, y) in all {
            xmax = xmax.max(x);
            ymax = ymax.max(y);
        }
        let (xmax, ymax) = (xmax.max(1e-9) * 1.05, ymax.max(1e-9) * 1.1);
        let sx = |x: f64| x0 + PAD + x / xmax * (W - 1.5 * PAD);
        let sy = |y: f64| H - PAD - y / ymax * (H - 2.0 * PAD);
        out.push_str(&format!(
            "<text x=\"{}\" y=\"20\" font-size=\"13\">{title}</text>\n",
            x0 + PAD
        ));
        out.push_str(&format!(
            "<line x1=\"{a}\" y1=\"{b}\" x2=\"{c}\" y2=\"{b}\" stroke=\"black\"/><line x1=\"{a}\" y1=\"{b}\" x2=\"{a}\" y2=\"{d}\" stroke=\"black\"/>\n",
            a = sx(0.0),
            b = sy(0.0),
            c = sx(xmax),
            d = sy(ymax)
        ));
        out.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{xlabel} (max {:.0})</text>\n<text x=\"{}\" y=\"{}\">ms (max {:.1})</text>\n",
            sx(xmax),
            H - PAD + 30.0,
            xmax / 1.05,
            x0 + 5.0,
            PAD - 10.0,
            ymax / 1.1
        ));
        for (i, (label, color, pts)) in lines.iter().enumerate() {
            let path: Vec<String> = pts
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            out.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
                path.join(" ")
            ));
            if !label.is_empty() {
                out.push_str(&format!(
                    "<text x=\"{}\" y=\"{}\" fill=\"{color}\">{label}</text>\n",
                    x0 + W - 1.4 * PAD,
                    PAD + 14.0 * i as f64
                ));
            }
        }
        for &(x, y) in dots {
            out.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"black\"/>\n",
                sx(x),
                sy(y)
            ));
        }
    };
    for (i, p) in panels.iter().enumerate() {
        panel(
            &mut out,
            i as f64 * W,
            p.title,
            p.x_label,
            &p.lines,
            &p.dots,
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_ceilings_are_round() {
        assert_eq!(tick_label(0.5, &[0.0, 0.25, 0.5]), "0.50");
        assert_eq!(tick_label(20.0, &[0.0, 20.0]), "20");
        assert_eq!(tick_label(0.002, &[0.0, 0.001, 0.002]), "0.002");
        assert_eq!(nice_ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.2), 5.0);
        assert_eq!(nice_ceiling(12.0), 20.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }
}
