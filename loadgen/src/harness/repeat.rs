//! `--num-runs K` and `--lora-mix` ([`RepeatArgs`]), and what the harness does after K runs:
//! the aggregate across them, each run's per-request records in a file of its own, the one
//! report JSON holding every run's report and the aggregate.
//!
//! Every run repeats the same schedule: the same `--seed`, so the same arrivals, lengths,
//! prompts and adapters. Against the embedded mockserve each run starts a fresh server (same
//! seed, cold cache), so a deterministic server gives identical runs; against `--url` every run
//! goes to the same server, as AIPerf's `--num-profile-runs` does, and later runs may find the
//! prefix cache the earlier ones warmed.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::LoadgenError;
use crate::harness::{Report, Settings};
use crate::report::repeat;
use crate::run::lora::LoraMix;
use mock_server::args::ReportArgs;

/// Runs of one command at most (`--num-runs`): every run's records stay in memory until the
/// report is written.
pub(crate) const MAX_NUM_RUNS: usize = 100;

/// `--num-runs` and `--lora-mix` (`bench`, `replay`, `multiturn`).
#[derive(Args, Clone, Debug)]
pub struct RepeatArgs {
    /// Repeat the whole run K times (1 to 100) on the same schedule (same seed); each embedded
    /// run starts a fresh server. The report adds each headline figure's mean, standard
    /// deviation, CV and 95% confidence interval across the runs; per-request files get one
    /// file per run (PATH.runN.EXT).
    #[arg(long, default_value_t = 1)]
    pub num_runs: usize,

    /// Send a seeded mix of LoRA adapters as each request's model, NAME:WEIGHT,... (e.g.
    /// base:0.5,sql-lora:0.3; `base` = the base model). The embedded server loads the named
    /// adapters; the report breaks figures down per adapter.
    #[arg(long, value_name = "NAME:WEIGHT,...")]
    pub lora_mix: Option<String>,
}

impl RepeatArgs {
    /// `--num-runs`, checked.
    pub(crate) fn num_runs(&self) -> Result<usize, LoadgenError> {
        crate::limits::count("--num-runs", self.num_runs, 1, MAX_NUM_RUNS)
    }

    /// `--lora-mix`, parsed and checked.
    pub(crate) fn lora(&self) -> Result<Option<LoraMix>, LoadgenError> {
        self.lora_mix.as_deref().map(str::parse).transpose()
    }
}

/// Every run's records stay in memory until the report is written: `--num-runs` x the requests
/// of one run (`what` names them) is at most [`crate::limits::MAX_REQUESTS`].
pub(crate) fn check_records(
    num_runs: usize,
    requests: usize,
    what: &str,
) -> Result<(), LoadgenError> {
    crate::limits::product(
        &format!("--num-runs x {what}"),
        &[num_runs, requests],
        crate::limits::MAX_REQUESTS,
        "MAX_REQUESTS",
    )
}

/// `path` of run `run` (from 1): `requests.jsonl` → `requests.run2.jsonl`, `out` → `out.run2`.
pub(crate) fn run_path(path: &Path, run: usize) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.run{run}.{}", ext.to_string_lossy()),
        None => format!("{stem}.run{run}"),
    };
    path.with_file_name(name)
}

/// After K > 1 runs: prints the aggregate, writes each run's per-request file, the report JSON
/// (`runs` and `aggregate`) and the HTML report (one run per series).
pub(crate) fn finish<R: Report>(runs: &[R], settings: &Settings<'_>) -> Result<(), LoadgenError> {
    let jsons: Vec<_> = runs.iter().map(|r| r.html_json().1).collect();
    let figures = runs.first().map_or(repeat::LIVE_FIGURES, Report::figures);
    let spreads = repeat::spreads(
        &jsons.iter().map(|j| j.as_ref()).collect::<Vec<_>>(),
        figures,
    );
    if settings.console {
        crate::stdout::out!("{}", repeat::console(&spreads));
    }
    if let Some(path) = settings.report.per_request_jsonl.as_deref() {
        for (i, run) in runs.iter().enumerate() {
            let one = ReportArgs {
                report_json: None,
                per_request_jsonl: Some(run_path(path, i + 1)),
                quiet: settings.report.quiet,
            };
            run.write_files(&one)?;
        }
        crate::stdout::outln!(
            "Saved per-request records to {} ... {}",
            run_path(path, 1).display(),
            run_path(path, runs.len()).display()
        );
    }
    if let Some(path) = settings.report.report_json.as_deref() {
        let all = repeat::report_json(
            jsons.iter().map(|j| j.as_ref().clone()).collect(),
            repeat::aggregate_json(&spreads),
        );
        crate::write::json(path, &all)?;
        crate::stdout::outln!("Saved report of {} runs to {}", runs.len(), path.display());
    }
    if let Some(path) = settings.html {
        let views: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let (name, json) = r.html_json();
                crate::report::html::RunView::of(&format!("{name} {}", i + 1), &json)
            })
            .collect();
        crate::report::html::write(path, &views)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_paths() {
        assert_eq!(
            run_path(Path::new("/tmp/r.jsonl"), 2),
            Path::new("/tmp/r.run2.jsonl")
        );
        assert_eq!(run_path(Path::new("out"), 10), Path::new("out.run10"));
        assert_eq!(
            run_path(Path::new("a.b.json"), 1),
            Path::new("a.b.run1.json")
        );
    }
}
