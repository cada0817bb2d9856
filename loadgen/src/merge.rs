//! `loadgen merge a.jsonl b.jsonl ...`: one report from the per-request records of several
//! `bench` or `replay` runs, e.g. several loadgen processes driving one endpoint.
//!
//! Each JSONL line's `raw` object ([`RawSample`]) holds what the driver measured, unrounded,
//! and the wall-clock start of its process. The merge shifts every process's times by its start
//! minus the earliest start (clocks aligned by wall-clock start), keeps the sessions of
//! different processes apart, and rebuilds the report with the same code a run uses
//! ([`replay_report::build`]): percentiles come from the raw samples, throughput from the union
//! of the windows (earliest scheduled send to last completion). Merging the halves of one run's
//! records gives that run's report.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::bench::Slo;
use crate::error::LoadgenError;
use crate::replay_report::{self, LiveReport, RawSample, RequestInfo};

/// `loadgen merge` flags.
#[derive(Args, Clone, Debug)]
pub struct MergeArgs {
    /// Per-request JSONL files written with --per-request-jsonl (bench or replay); each file
    /// once (the same file twice, or two copies of one, is refused).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,

    /// Write the merged report here.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<PathBuf>,

    /// Write the merged per-request JSONL here.
    #[arg(long, value_name = "PATH")]
    pub per_request_jsonl: Option<PathBuf>,

    /// Goodput against these objectives (as `bench --slo`).
    #[arg(long)]
    pub slo: Option<Slo>,

    /// Write the HTML report of the merged run here.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,
}

/// Reads the `raw` records of JSONL files (lines without one are skipped and counted). A file
/// given twice (the same file by any path, or a copy with the same records) is refused: its
/// records would count twice.
pub fn read(files: &[PathBuf]) -> Result<(Vec<RawSample>, usize), LoadgenError> {
    let mut out = Vec::new();
    let mut skipped = 0;
    // (canonical path, content hash, path) of the files read so far; a file whose hash matches
    // is read again to compare the bytes.
    let mut seen: Vec<(Option<PathBuf>, u64, &PathBuf)> = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(path).map_err(|source| LoadgenError::Io {
            path: path.clone(),
            source,
        })?;
        let canonical = std::fs::canonicalize(path).ok();
        let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
        for (other_canonical, other_hash, other) in &seen {
            if canonical.is_some() && canonical == *other_canonical {
                return Err(LoadgenError::Config(format!(
                    "{} and {} are the same file: its records would be counted twice",
                    other.display(),
                    path.display()
                )));
            }
            if !text.trim().is_empty()
                && hash == *other_hash
                && std::fs::read_to_string(other).is_ok_and(|t| t == text)
            {
                return Err(LoadgenError::Config(format!(
                    "{} and {} hold the same records (a copy?): they would be counted twice",
                    other.display(),
                    path.display()
                )));
            }
        }
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line).map_err(|e| {
                LoadgenError::Config(format!("{}:{}: not JSON: {e}", path.display(), n + 1))
            })?;
            match v
                .get("raw")
                .map(|r| serde_json::from_value::<RawSample>(r.clone()))
            {
                Some(Ok(raw)) => out.push(raw),
                Some(Err(e)) => {
                    return Err(LoadgenError::Config(format!(
                        "{}:{}: bad raw record: {e}",
                        path.display(),
                        n + 1
                    )))
                }
                None => skipped += 1,
            }
        }
        seen.push((canonical, hash, path));
    }
    Ok((out, skipped))
}

/// The report of `raws` (several processes' records): clocks aligned on the earliest
/// wall-clock start, sessions of each process kept apart.
pub fn merge(raws: &[RawSample]) -> LiveReport {
    let first_start = raws.iter().map(|r| r.run_start_unix_us).min().unwrap_or(0);
    // Session offsets per process (by run start), in start order.
    let mut bases: BTreeMap<u64, usize> = BTreeMap::new();
    let mut next = 0;
    let mut starts: Vec<u64> = raws.iter().map(|r| r.run_start_unix_us).collect();
    starts.sort_unstable();
    starts.dedup();
    for s in starts {
        bases.insert(s, next);
        next += raws
            .iter()
            .filter(|r| r.run_start_unix_us == s)
            .map(|r| r.session + 1)
            .max()
            .unwrap_or(0);
    }
    let pairs: Vec<(crate::driver::Sample, RequestInfo)> = raws
        .iter()
        .map(|r| {
            r.to_sample(
                r.run_start_unix_us - first_start,
                bases.get(&r.run_start_unix_us).copied().unwrap_or(0),
            )
        })
        .collect();
    let items: Vec<_> = pairs.iter().map(|(s, i)| (s, i)).collect();
    let window_us = pairs.iter().map(|(s, _)| s.end_us()).max().unwrap_or(0)
        - pairs.iter().map(|(s, _)| s.scheduled_us).min().unwrap_or(0);
    let mut live = replay_report::build(&items, std::time::Duration::from_micros(window_us));
    // The rebuilt records' times are relative to the earliest start: say so, so that the
    // merged JSONL can be merged again.
    for rec in &mut live.records {
        rec.raw.run_start_unix_us = first_start;
    }
    live
}

/// Checks before reading anything that the output files can be written.
pub fn check(args: &MergeArgs) -> Result<(), LoadgenError> {
    crate::limits::output_paths([
        ("--report-json", args.report_json.as_deref()),
        ("--per-request-jsonl", args.per_request_jsonl.as_deref()),
        ("--html", args.html.as_deref()),
    ])
}

/// Runs `loadgen merge`: prints and writes the merged report.
pub fn run(args: &MergeArgs) -> Result<LiveReport, LoadgenError> {
    check(args)?;
    let (raws, skipped) = read(&args.files)?;
    if raws.is_empty() {
        return Err(LoadgenError::Config(
            "no per-request records with a \"raw\" object in the given files".into(),
        ));
    }
    let processes = {
        let mut s: Vec<u64> = raws.iter().map(|r| r.run_start_unix_us).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    };
    let live = merge(&raws);
    let mode = format!(
        "merged: {} records from {} files ({} processes)",
        raws.len(),
        args.files.len(),
        processes
    );
    let mut json = crate::bench::bench_json(&live, &mode, 0, args.slo);
    crate::observe::Observed::default().annotate(
        &mut json,
        &live,
        Some(json!({
            "mode": mode,
            "files": args.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "processes": processes,
        })),
    );
    println!("Merged report: {mode}");
    if skipped > 0 {
        println!("({skipped} lines without a raw record skipped)");
    }
    print!("{}", live.report_lines());
    print!("{}", live.failure_lines());
    replay_report::write_files(
        &json,
        &live.records,
        args.report_json.as_deref(),
        args.per_request_jsonl.as_deref(),
    )?;
    if let Some(path) = &args.html {
        crate::html::write(path, &[crate::html::RunView::of("merged", &json)])?;
    }
    Ok(live)
}
