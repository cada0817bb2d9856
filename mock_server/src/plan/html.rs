//! The plan as a self-contained HTML page: every trial plotted as goodput per GPU against
//! tokens/s per user (an inline SVG), the Pareto front joined by a line, and the top table.

use super::ledger::{Header, TrialRecord};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Up to six round tick values covering `0..=max`.
fn ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0];
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (0..=6)
        .map(|k| k as f64 * step)
        .take_while(|v| *v <= max + step * 1e-9)
        .collect()
}

/// The page.
pub(super) fn page(
    header: &Header,
    full: &[TrialRecord],
    ranked: &[usize],
    pareto: &[usize],
    top: usize,
) -> String {
    const W: f64 = 720.0;
    const H: f64 = 420.0;
    const L: f64 = 70.0;
    const B: f64 = 50.0;
    let points: Vec<(usize, f64, f64)> = full
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.figures
                .as_ref()
                .map(|f| (i, f.tok_s_per_user, f.goodput_per_gpu_tok_s))
        })
        .collect();
    let xmax = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.05;
    let ymax = points.iter().map(|p| p.2).fold(0.0, f64::max) * 1.05;
    let (xt, yt) = (ticks(xmax), ticks(ymax));
    let xmax = xt.last().copied().unwrap_or(1.0).max(xmax).max(1e-9);
    let ymax = yt.last().copied().unwrap_or(1.0).max(ymax).max(1e-9);
    let sx = |x: f64| L + x / xmax * (W - L - 20.0);
    let sy = |y: f64| H - B - y / ymax * (H - B - 20.0);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    for t in &xt {
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"20\" x2=\"{x:.1}\" y2=\"{y0:.1}\" stroke=\"#eee\"/>\
             <text x=\"{x:.1}\" y=\"{ty:.1}\" text-anchor=\"middle\">{t}</text>\n",
            x = sx(*t),
            y0 = H - B,
            ty = H - B + 15.0
        ));
    }
    for t in &yt {
        svg.push_str(&format!(
            "<line x1=\"{L}\" y1=\"{y:.1}\" x2=\"{x1:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\" text-anchor=\"end\">{t}</text>\n",
            y = sy(*t),
            x1 = W - 20.0,
            tx = L - 6.0,
            ty = sy(*t) + 4.0
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">output tokens/s per user (1000 / \
         mean TPOT)</text>\n<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" \
         transform=\"rotate(-90 16 {:.1})\">goodput tokens/s per GPU</text>\n",
        (L + W - 20.0) / 2.0,
        H - 12.0,
        H / 2.0,
        H / 2.0
    ));
    for (i, x, y) in &points {
        let r = &full[*i];
        svg.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#9aa\"><title>#{} {} GPUs: {:.1} \
             tok/s/GPU, {:.1} tok/s/user</title></circle>\n",
            sx(*x),
            sy(*y),
            r.index,
            r.gpus,
            y,
            x
        ));
    }
    let mut front: Vec<(f64, f64, usize)> = pareto
        .iter()
        .filter_map(|&i| {
            full[i]
                .figures
                .as_ref()
                .map(|f| (f.tok_s_per_user, f.goodput_per_gpu_tok_s, i))
        })
        .collect();
    front.sort_by(|a, b| a.0.total_cmp(&b.0));
    let line: Vec<String> = front
        .iter()
        .map(|(x, y, _)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
        .collect();
    svg.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#d33\" stroke-width=\"1.5\"/>\n",
        line.join(" ")
    ));
    for (x, y, i) in &front {
        svg.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4.5\" fill=\"#d33\"><title>front #{}: {} \
             GPUs</title></circle>\n",
            sx(*x),
            sy(*y),
            full[*i].index,
            full[*i].gpus
        ));
    }
    svg.push_str("</svg>\n");
    let mut rows = String::new();
    for (k, &i) in ranked.iter().take(top).enumerate() {
        let r = &full[i];
        let Some(f) = &r.figures else { continue };
        let knobs: Vec<String> = r
            .knobs
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    v.as_str().map_or_else(|| v.to_string(), str::to_string)
                )
            })
            .collect();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.2}</td><td>{:.1}%</td>\
             <td>{}</td><td>{}</td></tr>\n",
            k + 1,
            r.gpus,
            esc(&r.mode),
            f.goodput_per_gpu_tok_s,
            f.goodput_tok_s,
            f.slo_attainment * 100.0,
            f.max_speedup
                .map_or_else(|| "-".into(), |m| format!("{m:.2}")),
            esc(&knobs.join(" "))
        ));
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>mockserve plan</title>\
         <style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head><body>\n\
         <h1>mockserve plan</h1>\n<p>Trace {}; objective {}; {} candidates, {} trials; \
         Pareto front in red.</p>\n{svg}<h2>Top {}</h2>\n<table><tr><th>rank</th><th>GPUs</th>\
         <th>mode</th><th>goodput/GPU</th><th>goodput</th><th>attainment</th><th>max \
         speed-up</th><th>candidate</th></tr>\n{rows}</table>\n</body></html>\n",
        esc(&header.trace),
        esc(&header.objective),
        header.candidates,
        full.len(),
        top.min(ranked.len())
    )
}
