//! `loadgen compare A.json B.json [MORE.json ...] [--svg chart.svg] [--html report.html]`:
//! per-turn TTFT of two multiturn runs side by side and a hand-written SVG line chart of it;
//! with `--html`, the HTML report of every run given (any mode's report JSON) drawn together.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::LoadgenError;
use crate::multiturn::report::{PerTurnStats, Results};
use crate::report::chart;

/// `loadgen compare` flags.
#[derive(Args, Clone, Debug)]
pub struct CompareArgs {
    /// Results of run A (the baseline), as written by --output.
    pub a: PathBuf,
    /// Results of run B.
    pub b: PathBuf,
    /// More runs, drawn in the --html report (the table compares A and B).
    pub more: Vec<PathBuf>,
    /// Also write a line chart of per-turn TTFT p50/p95 to this SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write the HTML report of every run, drawn together (latency CDFs, time series, sweep
    /// curves, per-turn TTFT; any mode's report JSON).
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
}

/// One turn of the comparison, in ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TurnRow {
    /// 0-based turn.
    pub turn: usize,
    /// A's p50 and p95 (None when A has no successes on this turn).
    pub a: Option<(f64, f64)>,
    /// B's.
    pub b: Option<(f64, f64)>,
}

/// Loads a results file (loadgen's or Dynamo multiturn_bench's), at most
/// `MAX_REPORT_FILE_BYTES` (`crate::capped`).
pub fn load(path: &Path) -> Result<Results, LoadgenError> {
    crate::capped::read_json(path)
}

fn find(rows: &[PerTurnStats], turn: usize) -> Option<(f64, f64)> {
    rows.iter()
        .find(|r| r.turn == turn)
        .map(|r| (r.p50_us as f64 / 1000.0, r.p95_us as f64 / 1000.0))
}

/// Per-turn TTFT rows of two runs.
pub fn rows(a: &Results, b: &Results) -> Vec<TurnRow> {
    let turns = a
        .per_turn_ttft
        .iter()
        .chain(&b.per_turn_ttft)
        .map(|r| r.turn + 1)
        .max()
        .unwrap_or(0);
    (0..turns)
        .map(|turn| TurnRow {
            turn,
            a: find(&a.per_turn_ttft, turn),
            b: find(&b.per_turn_ttft, turn),
        })
        .collect()
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.1}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0.0 => format!("{:.2}x", b / a),
        _ => "-".into(),
    }
}

/// The comparison table.
pub fn table(rows: &[TurnRow], a_name: &str, b_name: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Per-Turn TTFT: A = {a_name}, B = {b_name} (B/A < 1: B is faster)"
    );
    let _ = writeln!(
        o,
        "  {:>6} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
        "Turn", "A P50(ms)", "B P50(ms)", "B/A", "A P95(ms)", "B P95(ms)", "B/A"
    );
    let _ = writeln!(o, "  {}", "-".repeat(78));
    for r in rows {
        let (a50, a95) = (r.a.map(|v| v.0), r.a.map(|v| v.1));
        let (b50, b95) = (r.b.map(|v| v.0), r.b.map(|v| v.1));
        let _ = writeln!(
            o,
            "  {:>6} {:>12} {:>12} {:>8} {:>12} {:>12} {:>8}",
            r.turn + 1,
            cell(a50),
            cell(b50),
            ratio(a50, b50),
            cell(a95),
            cell(b95),
            ratio(a95, b95)
        );
    }
    o
}

/// A line chart of per-turn TTFT (p50 solid, p95 dashed) for both runs.
pub fn svg(rows: &[TurnRow], a_name: &str, b_name: &str) -> String {
    let turns: Vec<chart::TurnPoint> = rows
        .iter()
        .map(|r| chart::TurnPoint {
            turn: r.turn,
            runs: [r.a, r.b],
        })
        .collect();
    chart::per_turn(&turns, [a_name, b_name])
}

/// Runs `loadgen compare`; returns the printed table.
pub fn run(args: &CompareArgs) -> Result<String, LoadgenError> {
    let mut note = String::new();
    if let Some(path) = &args.html {
        let mut views = Vec::new();
        for file in [&args.a, &args.b].into_iter().chain(&args.more) {
            let json: serde_json::Value = crate::capped::read_json(file)?;
            let name = file.file_stem().map_or_else(
                || file.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            views.push(crate::report::html::RunView::of(&name, &json));
        }
        crate::report::html::write(path, &views)?;
        note = format!(
            "Saved HTML comparison of {} runs to {}\n",
            views.len(),
            path.display()
        );
        // Runs of other modes have no per-turn table.
        if load(&args.a).is_err() || load(&args.b).is_err() {
            return Ok(note);
        }
    }
    let (a, b) = (load(&args.a)?, load(&args.b)?);
    let (an, bn) = (args.a.display().to_string(), args.b.display().to_string());
    let rows = rows(&a, &b);
    let text = table(&rows, &an, &bn);
    if let Some(path) = &args.svg {
        crate::write::bytes(path, svg(&rows, &an, &bn))?;
    }
    Ok(text + &note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_svg_show_both_runs() {
        let rows = vec![
            TurnRow {
                turn: 0,
                a: Some((10.0, 12.0)),
                b: Some((10.0, 11.0)),
            },
            TurnRow {
                turn: 1,
                a: Some((20.0, 30.0)),
                b: Some((10.0, 15.0)),
            },
            TurnRow {
                turn: 2,
                a: None,
                b: Some((9.0, 9.5)),
            },
        ];
        let t = table(&rows, "a.json", "b.json");
        assert!(t.contains("0.50x"), "{t}");
        assert!(t.lines().nth(5).is_some_and(|l| l.contains(" - ")));
        let s = svg(&rows, "a<.json", "b.json");
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 4);
        assert!(s.contains("a&lt;.json"));
        assert_eq!(
            (s.len(), xxhash_rust::xxh3::xxh3_64(s.as_bytes())),
            (2847, 16105126307942792037)
        );
    }
}
