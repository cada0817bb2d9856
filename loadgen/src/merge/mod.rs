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
//!
//! Shards of one run (`--shard I/N`, records with `"shard": [I, N]`) keep their global
//! session indices; the shard set is checked first (`check_shards`): one N, every I of
//! `0..N` exactly once, no unsharded file among them (empty files, from shards that had
//! nothing to send, stand for as many missing shards).
//!
//! `multiturn`'s per-request records (its `raw_results`: `user_id`, no `raw` object) merge as
//! the shards of one run: a `--shard` run's records carry what the report pools
//! ([`ShardSample`]), and `merge_multiturn` rebuilds the whole run's [`Results`] with the
//! code a run uses. An unsharded multiturn run is one process already: its records are refused.

pub(crate) mod record_check;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::bench::Slo;
use crate::capped;
use crate::error::LoadgenError;
use crate::multiturn::report::{RawResult, Results, RunData, ShardSample};
use crate::report::replay_report::{self, LiveReport, RawSample, RequestInfo};

/// `loadgen merge` flags.
#[derive(Args, Clone, Debug)]
pub struct MergeArgs {
    /// Per-request JSONL files written with --per-request-jsonl (bench or replay); each file
    /// once (the same file twice, or two copies of one, is refused). The files of a --shard
    /// run must be its N shards, each once (a missing, duplicated or unsharded file is
    /// refused). Multiturn records merge only as the shards of one run.
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

/// The records of the files given to `loadgen merge`.
#[derive(Clone, Debug)]
pub enum Records {
    /// `bench` or `replay` records (their `raw` objects), and the count of lines without one.
    Live(Vec<RawSample>, usize),
    /// The records of a `multiturn --shard` run's shards.
    Multiturn(Vec<RawResult>),
}

/// Reads the `raw` records of `bench` or `replay` JSONL files (lines without one are skipped
/// and counted); multiturn records are refused (`read_records` takes both).
pub fn read(files: &[PathBuf]) -> Result<(Vec<RawSample>, usize), LoadgenError> {
    match read_records(files)? {
        Records::Live(raws, skipped) => Ok((raws, skipped)),
        Records::Multiturn(_) => Err(LoadgenError::Config(
            "multiturn records where bench or replay records were expected".into(),
        )),
    }
}

/// Reads the records of JSONL files: `bench`/`replay` ones (their `raw` objects; lines
/// without one are skipped and counted) or a multiturn run's shards, never both. A file given
/// twice (the same file by any path, or a copy with the same records) is refused: its records
/// would count twice.
pub(crate) fn read_records(files: &[PathBuf]) -> Result<Records, LoadgenError> {
    let mut out = Vec::new();
    let mut multiturn: Vec<RawResult> = Vec::new();
    let mut skipped = 0;
    // The shard of each file's records (None: unsharded; no entry: no records).
    let mut shards: Vec<(&PathBuf, Option<(u32, u32)>)> = Vec::new();
    // (canonical path, (length, content hash), path) of the files read so far; a file whose
    // length and hash match is compared byte for byte.
    let mut seen: Vec<(Option<PathBuf>, (u64, u64), &PathBuf)> = Vec::new();
    let mut buf = Vec::new();
    for path in files {
        let canonical = std::fs::canonicalize(path).ok();
        if let Some((_, _, other)) = seen
            .iter()
            .find(|(c, _, _)| canonical.is_some() && canonical == *c)
        {
            return Err(LoadgenError::Config(format!(
                "{} and {} are the same file: its records would be counted twice",
                other.display(),
                path.display()
            )));
        }
        let mut lines = capped::RecordLines::open(path)?;
        let mut file_shard: Option<Option<(u32, u32)>> = None;
        let mut has_text = false;
        while lines.next(&mut buf)? {
            let n = lines.line() - 1;
            let at = || format!("{}:{}", path.display(), n + 1);
            if buf.trim_ascii().is_empty() {
                continue;
            }
            has_text = true;
            let v: Value = serde_json::from_slice(&buf)
                .map_err(|e| LoadgenError::Config(format!("{}: not JSON: {e}", at())))?;
            if v.get("raw").is_none() && v.get("user_id").is_some() {
                let rec: RawResult = serde_json::from_value(v).map_err(|e| {
                    LoadgenError::Config(format!("{}: bad multiturn record: {e}", at()))
                })?;
                record_check::multiturn(&rec)
                    .map_err(|e| LoadgenError::Config(format!("{}: {e}", at())))?;
                if rec.shard.is_none() || rec.merge.is_none() {
                    return Err(LoadgenError::Config(format!(
                        "{}: a multiturn record of an unsharded run: multiturn records merge \
                         only as the shards of one run (multiturn --shard I/N)",
                        at()
                    )));
                }
                same_shard(&mut file_shard, rec.shard, &at)?;
                if !out.is_empty() {
                    return Err(mixed(path, n));
                }
                multiturn.push(rec);
                continue;
            }
            if !multiturn.is_empty() && v.get("raw").is_some() {
                return Err(mixed(path, n));
            }
            match v
                .get("raw")
                .map(|r| serde_json::from_value::<RawSample>(r.clone()))
            {
                Some(Ok(raw)) => {
                    record_check::raw(&raw)
                        .map_err(|e| LoadgenError::Config(format!("{}: raw {e}", at())))?;
                    same_shard(&mut file_shard, raw.shard, &at)?;
                    out.push(raw)
                }
                Some(Err(e)) => {
                    return Err(LoadgenError::Config(format!(
                        "{}: bad raw record: {e}",
                        at()
                    )))
                }
                None => skipped += 1,
            }
        }
        let digest = lines.digest();
        if has_text {
            if let Some((_, _, other)) = seen
                .iter()
                .find(|(_, d, other)| *d == digest && capped::same_bytes(other, path, digest.0))
            {
                return Err(LoadgenError::Config(format!(
                    "{} and {} hold the same records (a copy?): they would be counted twice",
                    other.display(),
                    path.display()
                )));
            }
        }
        seen.push((canonical, digest, path));
        if let Some(shard) = file_shard {
            shards.push((path, shard));
        }
    }
    let empty = files.len() - shards.len();
    check_shards(&shards, empty)?;
    Ok(if multiturn.is_empty() {
        Records::Live(out, skipped)
    } else {
        Records::Multiturn(multiturn)
    })
}

/// Records the shard of a file's first record; refuses a later record of another shard.
fn same_shard(
    file_shard: &mut Option<Option<(u32, u32)>>,
    shard: Option<(u32, u32)>,
    at: &dyn Fn() -> String,
) -> Result<(), LoadgenError> {
    match *file_shard {
        None => *file_shard = Some(shard),
        Some(first) if first != shard => {
            return Err(LoadgenError::Config(format!(
                "{}: shard {} in a file whose records are shard {}",
                at(),
                show_shard(shard),
                show_shard(first)
            )))
        }
        Some(_) => {}
    }
    Ok(())
}

fn mixed(path: &std::path::Path, line: usize) -> LoadgenError {
    LoadgenError::Config(format!(
        "{}:{}: multiturn and bench or replay records together: merge takes one run's kind",
        path.display(),
        line + 1
    ))
}

fn show_shard(shard: Option<(u32, u32)>) -> String {
    match shard {
        Some((i, n)) => format!("{i}/{n}"),
        None => "none (unsharded)".into(),
    }
}

/// Checks the shard set of the files (`(file, its records' shard)`; `empty` files had no
/// record): all unsharded, or shards `I/N` of one N with every `I` in `0..N` exactly once,
/// where the empty files (a shard with nothing to send writes no record) stand for the
/// missing shards when there are exactly as many of them.
pub(crate) fn check_shards(
    shards: &[(&PathBuf, Option<(u32, u32)>)],
    empty: usize,
) -> Result<(), LoadgenError> {
    let sharded: Vec<_> = shards
        .iter()
        .filter_map(|(p, s)| s.map(|s| (*p, s)))
        .collect();
    let Some(&(first_path, (first_index, n))) = sharded.first() else {
        return Ok(());
    };
    if let Some((p, _)) = shards.iter().find(|(_, s)| s.is_none()) {
        return Err(LoadgenError::Config(format!(
            "{} holds unsharded records and {} shard records: a run's shards merge only with \
             each other",
            p.display(),
            first_path.display()
        )));
    }
    if let Some((p, (i, m))) = sharded.iter().find(|(_, (_, m))| *m != n) {
        return Err(LoadgenError::Config(format!(
            "{} is shard {i}/{m} and {} is shard {first_index}/{n}: the shards of one run \
             share N",
            p.display(),
            first_path.display()
        )));
    }
    let mut by_index: BTreeMap<u32, &PathBuf> = BTreeMap::new();
    for &(p, (i, _)) in &sharded {
        if let Some(other) = by_index.insert(i, p) {
            return Err(LoadgenError::Config(format!(
                "shard {i}/{n} is given twice ({} and {})",
                other.display(),
                p.display()
            )));
        }
    }
    let missing: Vec<String> = (0..n)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| format!("{i}/{n}"))
        .collect();
    // A shard with nothing to send (fewer sessions or users than N) writes an empty file:
    // as many empty files as missing shards complete the set.
    if !missing.is_empty() && missing.len() != empty {
        let shown = if missing.len() > 10 {
            format!(
                "{} and {} more",
                missing[..10].join(", "),
                missing.len() - 10
            )
        } else {
            missing.join(", ")
        };
        return Err(LoadgenError::Config(format!(
            "shards missing: {shown} (given {} of {n}{})",
            by_index.len(),
            if empty > 0 {
                format!(
                    "; {empty} files hold no record, so their shard is unknown: as many as the \
                     missing shards would stand for them"
                )
            } else {
                String::new()
            }
        )));
    }
    Ok(())
}

/// The report of `raws` (several processes' records): clocks aligned on the earliest
/// wall-clock start, sessions of each process kept apart (shards' records keep their global
/// session indices).
pub fn merge(raws: &[RawSample]) -> LiveReport {
    let first_start = raws.iter().map(|r| r.run_start_unix_us).min().unwrap_or(0);
    let sharded = raws.iter().any(|r| r.shard.is_some());
    // Session offsets per process (by run start), in start order: one pass for each process's
    // session count, one over the processes.
    let mut sessions: BTreeMap<u64, usize> = BTreeMap::new();
    for r in raws {
        let n = sessions.entry(r.run_start_unix_us).or_insert(0);
        *n = (*n).max(r.session + 1);
    }
    let mut bases: BTreeMap<u64, usize> = BTreeMap::new();
    let mut next = 0usize;
    for (start, count) in sessions {
        bases.insert(start, next);
        next = next.saturating_add(count);
    }
    let pairs: Vec<(crate::run::driver::Sample, RequestInfo)> = raws
        .iter()
        .map(|r| {
            r.to_sample(
                r.run_start_unix_us - first_start,
                if sharded {
                    0
                } else {
                    bases.get(&r.run_start_unix_us).copied().unwrap_or(0)
                },
            )
        })
        .collect();
    let items: Vec<_> = pairs.iter().map(|(s, i)| (s, i)).collect();
    let window_us = pairs
        .iter()
        .map(|(s, _)| s.end_us())
        .max()
        .unwrap_or(0)
        .saturating_sub(pairs.iter().map(|(s, _)| s.scheduled_us).min().unwrap_or(0));
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

/// The whole run's results from the records of a multiturn run's shards (a complete shard set,
/// as [`read_records`] checks): clocks aligned on the earliest wall-clock start, the records
/// in (user, turn) order without their shard data, as an unsharded run writes them.
pub(crate) fn merge_multiturn(
    records: Vec<RawResult>,
    config: Value,
) -> Result<Results, LoadgenError> {
    let shape = |m: &ShardSample| (m.num_users, m.num_turns, m.speculative_prefill);
    let Some(first) = records.iter().find_map(|r| r.merge.as_ref()).map(shape) else {
        return Err(LoadgenError::Config(
            "no multiturn shard records in the given files".into(),
        ));
    };
    let first_start = records
        .iter()
        .filter_map(|r| r.merge.as_ref().map(|m| m.run_start_unix_us))
        .min()
        .unwrap_or(0);
    let mut data = RunData::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut end_us = 0;
    for mut rec in records {
        let Some(m) = rec.merge.take() else {
            return Err(LoadgenError::Config(format!(
                "user {} turn {}: a multiturn record without its shard data",
                rec.user_id, rec.turn
            )));
        };
        let bad = |what: String| Err(LoadgenError::Config(what));
        if shape(&m) != first {
            return bad(format!(
                "records of two runs: {} users x {} turns (speculative prefill {}) and {} x {} \
                 ({}): the shards of one run share its settings",
                first.0, first.1, first.2, m.num_users, m.num_turns, m.speculative_prefill
            ));
        }
        if rec.user_id >= m.num_users || rec.turn >= m.num_turns {
            return bad(format!(
                "user {} turn {} is outside the run's {} users x {} turns",
                rec.user_id, rec.turn, m.num_users, m.num_turns
            ));
        }
        if let Some((i, n)) = rec.shard {
            if rec.user_id as u64 % u64::from(n) != u64::from(i) {
                return bad(format!(
                    "user {} is in a record of shard {i}/{n}, which does not own it",
                    rec.user_id
                ));
            }
        }
        if !seen.insert((rec.user_id, rec.turn)) {
            return bad(format!(
                "user {} turn {} appears twice: it would be counted twice",
                rec.user_id, rec.turn
            ));
        }
        end_us = end_us.max(m.run_start_unix_us - first_start + m.end_us);
        data.chunk_gaps_us.extend(m.chunk_gaps_us);
        data.output_tokens_per_s_per_user
            .extend(m.output_tokens_per_s);
        rec.shard = None;
        data.records.push(rec);
    }
    data.records.sort_by_key(|r| (r.user_id, r.turn));
    data.duration_s = std::time::Duration::from_micros(end_us).as_secs_f64();
    Ok(Results::build(data, first.0, first.1, first.2, config))
}

/// What `loadgen merge` rebuilt.
#[derive(Clone, Debug)]
pub enum Merged {
    /// A `bench` or `replay` report.
    Live(Box<LiveReport>),
    /// A multiturn run's results.
    Multiturn(Box<Results>),
}

/// Runs `loadgen merge`: prints and writes the merged report.
pub fn run(args: &MergeArgs) -> Result<Merged, LoadgenError> {
    check(args)?;
    if let Some(slo) = &args.slo {
        slo.check_trajectories(false, "loadgen merge's records (they carry no plays)")
            .map_err(|e| LoadgenError::Config(e.to_string()))?;
    }
    match read_records(&args.files)? {
        Records::Live(raws, skipped) => {
            run_live(args, raws, skipped).map(|l| Merged::Live(l.into()))
        }
        Records::Multiturn(records) => {
            run_multiturn(args, records).map(|r| Merged::Multiturn(r.into()))
        }
    }
}

fn run_multiturn(args: &MergeArgs, records: Vec<RawResult>) -> Result<Results, LoadgenError> {
    if args.slo.is_some() {
        return Err(LoadgenError::Config(
            "--slo applies to bench and replay records; these are a multiturn run's".into(),
        ));
    }
    let count = records.len();
    let shards = records.iter().find_map(|r| r.shard).map_or(0, |(_, n)| n);
    let mode = format!(
        "merged: {count} records from {} files (shards 0..{shards} of one multiturn run)",
        args.files.len()
    );
    let config = json!({
        "mode": mode,
        "files": args.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "shards": shards,
    });
    let results = merge_multiturn(records, config)?;
    crate::stdout::outln!("Merged report: {mode}");
    crate::stdout::out!("{}", results.console());
    crate::multiturn::write_results(
        &results,
        args.report_json.as_deref(),
        args.per_request_jsonl.as_deref(),
    )?;
    if let Some(path) = &args.html {
        let json = serde_json::to_value(&results).unwrap_or_default();
        crate::report::html::write(path, &[crate::report::html::RunView::of("merged", &json)])?;
    }
    Ok(results)
}

fn run_live(
    args: &MergeArgs,
    raws: Vec<RawSample>,
    skipped: usize,
) -> Result<LiveReport, LoadgenError> {
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
    let shards = raws.iter().find_map(|r| r.shard).map(|(_, n)| n);
    let mode = match shards {
        Some(n) => format!(
            "merged: {} records from {} files (shards 0..{n} of one run, {} processes)",
            raws.len(),
            args.files.len(),
            processes
        ),
        None => format!(
            "merged: {} records from {} files ({} processes)",
            raws.len(),
            args.files.len(),
            processes
        ),
    };
    let mut json = crate::bench::bench_json(&live, &mode, 0, args.slo);
    crate::report::observed::annotate(
        &mut json,
        &live,
        &crate::observe::Observed::default(),
        Some(json!({
            "mode": mode,
            "files": args.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "processes": processes,
        })),
    );
    crate::stdout::outln!("Merged report: {mode}");
    if skipped > 0 {
        crate::stdout::outln!("({skipped} lines without a raw record skipped)");
    }
    crate::stdout::out!("{}", live.report_lines());
    crate::stdout::out!("{}", live.failure_lines());
    replay_report::write_files(
        &json,
        &live.records,
        args.report_json.as_deref(),
        args.per_request_jsonl.as_deref(),
    )?;
    if let Some(path) = &args.html {
        crate::report::html::write(path, &[crate::report::html::RunView::of("merged", &json)])?;
    }
    Ok(live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_sets_are_complete_or_refused() {
        let files: Vec<PathBuf> = (0..4)
            .map(|i| PathBuf::from(format!("s{i}.jsonl")))
            .collect();
        let set = |shards: &[Option<(u32, u32)>]| -> Vec<(&PathBuf, Option<(u32, u32)>)> {
            files.iter().zip(shards.iter().copied()).collect()
        };
        check_shards(&set(&[Some((1, 3)), Some((0, 3)), Some((2, 3))]), 0).expect("complete");
        check_shards(&set(&[None, None]), 0).expect("unsharded");
        // A shard that had nothing to send wrote an empty file.
        check_shards(&set(&[Some((0, 3)), Some((2, 3))]), 1).expect("one empty file");
        let e = check_shards(&set(&[Some((0, 3)), Some((2, 3))]), 0).expect_err("missing");
        assert_eq!(
            e.to_string(),
            "invalid configuration: shards missing: 1/3 (given 2 of 3)"
        );
        let e = check_shards(&set(&[Some((0, 3))]), 1).expect_err("two missing, one empty");
        assert!(e.to_string().contains("shards missing: 1/3, 2/3"), "{e}");
        let e = check_shards(&set(&[Some((0, 3)), Some((1, 4))]), 0).expect_err("two N");
        assert_eq!(
            e.to_string(),
            "invalid configuration: s1.jsonl is shard 1/4 and s0.jsonl is shard 0/3: the \
             shards of one run share N"
        );
        let e = check_shards(&set(&[Some((0, 2)), Some((0, 2))]), 0).expect_err("twice");
        assert!(e.to_string().contains("shard 0/2 is given twice"), "{e}");
        let e = check_shards(&set(&[Some((0, 2)), None]), 0).expect_err("mixed");
        assert!(
            e.to_string().contains("s1.jsonl holds unsharded records"),
            "{e}"
        );
    }
}
