//! What a live replay ends as: the [`ReplayRun`] (its report, with the prefix reuse the trace
//! predicts and the server reported), the keys it adds to the live report, and its console text
//! and files.

use serde_json::json;
use servesim::replay::autoscale::AutoscaleReport;
use servesim::replay::AgenticReport;

use crate::error::LoadgenError;
use crate::harness::Report;
use crate::observe::Observed;
use crate::replay::args::SessionMode;
use crate::report::replay_report::{self, LiveReport, RawSample, RequestInfo};
use mock_server::args::ReportArgs;

/// The outcome of a live replay.
#[derive(Debug)]
pub struct ReplayRun {
    /// The report.
    pub live: LiveReport,
    /// The session mode used.
    pub session_mode: SessionMode,
    /// Σ expected reused tokens / Σ prompt tokens.
    pub expected_prefix_reuse_ratio: f64,
    /// Prompts whose length the server counted otherwise than the trace's `input_length`.
    pub prompt_length_mismatches: usize,
    /// The report JSON as written.
    pub json: serde_json::Value,
    /// How late the server handed its tokens to clients, when it said.
    pub server_lateness: Option<crate::observe::scrape::Lateness>,
    /// For an agentic trace: the plays' outcomes and every node's times (µs since the run
    /// start), as `mockserve replay` reports them.
    pub agentic: Option<AgenticReport>,
    /// With `--fleet-lifecycle`: the elastic fleet's judge (the report's `autoscale`).
    pub autoscale: Option<AutoscaleReport>,
}

impl ReplayRun {
    /// Adds the judge's verdict (`--fleet-lifecycle`) to the run and its report JSON.
    pub(super) fn judged(&mut self, autoscale: Option<AutoscaleReport>) {
        if let (Some(a), Some(map)) = (&autoscale, self.json.as_object_mut()) {
            map.insert(
                "autoscale".into(),
                serde_json::to_value(a).unwrap_or(serde_json::Value::Null),
            );
        }
        self.autoscale = autoscale;
    }
}

/// Plays listed one per line on the console at most; the rest are counted (every play is in
/// the report's `agentic.plays`).
pub(crate) const MAX_CONSOLE_PLAYS: usize = 10;

/// `mockserve replay`'s agentic summary with its play lines cut at [`MAX_CONSOLE_PLAYS`]: a
/// trace of 40,000 plays prints a dozen lines, not 40,000.
fn agentic_lines(agentic: &AgenticReport) -> String {
    let full = mock_server::cmd::replay::agentic_summary(agentic);
    let lines: Vec<&str> = full.lines().collect();
    // The summary is its header lines, then one line per play.
    let header = lines.len().saturating_sub(agentic.plays.len());
    let shown = header + MAX_CONSOLE_PLAYS;
    if lines.len() <= shown {
        return full;
    }
    let mut s: String = lines[..shown].iter().map(|l| format!("{l}\n")).collect();
    s.push_str(&format!(
        "  ... and {} more plays (each in the report's agentic.plays)\n",
        lines.len() - shown
    ));
    s
}

/// A wait shorter than this (µs) is taking a free slot or an open turn, not waiting.
const WAIT_NOTED_US: u64 = 1_000;

/// The requests whose wait (`wait_us` of their raw record) was 1 ms or more: how many, and the
/// longest wait in ms; None when none waited.
fn waited(live: &LiveReport, wait_us: impl Fn(&RawSample) -> u64) -> Option<(usize, f64)> {
    let waits = live
        .records
        .iter()
        .map(|r| wait_us(&r.raw))
        .filter(|&w| w >= WAIT_NOTED_US);
    let (count, max_us) = waits.fold((0usize, 0u64), |(n, m), w| (n + 1, m.max(w)));
    (count > 0).then(|| (count, max_us as f64 / 1000.0))
}

/// How many requests waited for the in-flight cap, and how long at most: the part of the
/// schedule lag the cap explains (the lag line's "pacer alone" is the rest). Empty when none
/// waited.
fn cap_wait_line(live: &LiveReport) -> String {
    waited(live, |r| r.cap_wait_us).map_or_else(String::new, |(count, max_ms)| {
        format!(
            "In-flight cap: {count} of {} requests waited for a slot (up to {max_ms:.1} ms); \
             their latencies count from their scheduled times\n",
            live.records.len(),
        )
    })
}

/// How many tied requests waited for the one before them to be admitted, and how long at most
/// (`crate::run::driver::TIE_WAIT` bounds it): the part of the schedule lag that keeping tied
/// timestamps in trace order explains. Empty when none waited.
fn tie_wait_line(live: &LiveReport) -> String {
    waited(live, |r| r.tie_wait_us).map_or_else(String::new, |(count, max_ms)| {
        format!(
            "Tied timestamps: {count} of {} requests waited for the one before them to be \
             admitted (up to {max_ms:.1} ms; each goes after {} ms at the latest); their \
             latencies count from their scheduled times\n",
            live.records.len(),
            crate::run::driver::TIE_WAIT.as_millis()
        )
    })
}

/// `--slo`'s goodput, in `loadgen bench`'s keys: requests that succeeded and meet every
/// objective (an agentic trace's through their plays: `trajectory_e2e`), their share of all
/// requests (failures count as misses) and their rate over the run.
fn goodput(
    slo: &servesim::slo::Slo,
    live: &LiveReport,
    trajectories: Option<&servesim::slo::TrajectoryE2e>,
) -> serde_json::Value {
    let total = live.records.len();
    let good = live
        .records
        .iter()
        .filter(|r| r.error.is_none() && slo.met_in(&r.record, trajectories))
        .count();
    let duration_s = live.report.duration_ms / 1000.0;
    let share = if total > 0 {
        good as f64 / total as f64
    } else {
        0.0
    };
    let rate_rps = if duration_s > 0.0 {
        good as f64 / duration_s
    } else {
        0.0
    };
    json!({
        "good_requests": good,
        "total_requests": total,
        "share": share,
        "rate_rps": rate_rps,
    })
}

/// The keys a live replay's report adds to the live report's, and its `config`.
pub(super) struct ReplayKeys {
    /// `session_mode` (Mooncake) or `trace_format` (agentic).
    pub(super) first: (&'static str, serde_json::Value),
    pub(super) arrival_speedup_ratio: f64,
    pub(super) trace_block_size: usize,
    pub(super) config: serde_json::Value,
    /// `--slo`: the report's `slo` and `goodput` keys.
    pub(super) slo: Option<servesim::slo::Slo>,
}

impl ReplayKeys {
    /// The finished replay: the prefix reuse the trace predicts and the server reported, the
    /// report JSON with the observers' series, `config` and the shard.
    pub(super) fn run(
        self,
        mut live: LiveReport,
        items: &[(&crate::run::driver::Sample, &RequestInfo)],
        agentic: Option<AgenticReport>,
        session_mode: SessionMode,
        shard: Option<crate::run::shard::Shard>,
        observed: &Observed,
    ) -> ReplayRun {
        live.set_shard(shard);
        let ok =
            |(s, _): &&(&crate::run::driver::Sample, &RequestInfo)| s.response.failure.is_none();
        let expected_total: usize = items
            .iter()
            .filter(ok)
            .filter_map(|(_, i)| i.expected_reused_tokens)
            .sum();
        let input_total: usize = items.iter().filter(ok).map(|(_, i)| i.input_length).sum();
        let expected_ratio = if input_total > 0 {
            expected_total as f64 / input_total as f64
        } else {
            0.0
        };
        let mismatched = items
            .iter()
            .filter(|(s, i)| {
                s.response
                    .prompt_tokens
                    .is_some_and(|p| p as usize != i.input_length)
            })
            .count();
        let mut keys = vec![
            self.first,
            ("expected_prefix_reuse_ratio", json!(expected_ratio)),
            (
                "observed_prefix_reuse_ratio",
                json!(live.report.prefix_cache_reused_ratio),
            ),
            ("prompt_length_mismatches", json!(mismatched)),
            ("arrival_speedup_ratio", json!(self.arrival_speedup_ratio)),
            ("trace_block_size", json!(self.trace_block_size)),
        ];
        if let Some(agentic) = &agentic {
            keys.push((
                "agentic",
                serde_json::to_value(agentic).unwrap_or(serde_json::Value::Null),
            ));
        }
        if let Some(slo) = &self.slo {
            let trajectories = agentic.as_ref().map(|a| a.trajectory_e2e_by_request());
            keys.push(("slo", json!(slo)));
            keys.push(("goodput", goodput(slo, &live, trajectories.as_ref())));
        }
        let mut json = live.to_json(&keys);
        crate::report::observed::annotate(&mut json, &live, observed, Some(self.config));
        crate::run::shard::annotate(&mut json, shard);
        ReplayRun {
            live,
            session_mode,
            expected_prefix_reuse_ratio: expected_ratio,
            prompt_length_mismatches: mismatched,
            json,
            server_lateness: observed.lateness(),
            agentic,
            autoscale: None,
        }
    }
}

impl Report for ReplayRun {
    fn live(&self) -> Option<&crate::report::replay_report::LiveReport> {
        Some(&self.live)
    }

    fn console_text(&self) -> String {
        let mut s = String::from("Live replay report\n");
        s.push_str(&self.live.report_lines());
        if let Some(agentic) = &self.agentic {
            s.push_str(&agentic_lines(agentic));
        }
        s.push_str(&format!(
            "Prefix reuse: expected from the trace's hash ids {:.4}, reported by the server \
             (cached_tokens) {:.4}\n",
            self.expected_prefix_reuse_ratio, self.live.report.prefix_cache_reused_ratio
        ));
        // With --slo: the goodput line bench prints, from the report's `goodput`.
        if let Some(g) = self.json.get("goodput") {
            let f = |k: &str| g.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
            s.push_str(&format!(
                "Goodput: {}/{} requests met every SLO ({:.1}%), {:.2} req/s\n",
                f("good_requests"),
                f("total_requests"),
                100.0 * f("share"),
                f("rate_rps")
            ));
        }
        if self.prompt_length_mismatches > 0 {
            s.push_str(&format!(
                "WARNING: {} prompts did not have the trace's input_length (server \
                 usage.prompt_tokens)\n",
                self.prompt_length_mismatches
            ));
        }
        s.push_str(&self.live.failure_lines());
        s.push_str(&self.live.lag_lines());
        s.push_str(&cap_wait_line(&self.live));
        s.push_str(&tie_wait_line(&self.live));
        if let Some(a) = &self.autoscale {
            s.push_str(&mock_server::cmd::autoscale::summary(a));
        }
        s
    }

    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError> {
        replay_report::write_files(
            &self.json,
            &self.live.records,
            report.report_json.as_deref(),
            report.per_request_jsonl.as_deref(),
        )
    }

    fn html_json(&self) -> (&'static str, std::borrow::Cow<'_, serde_json::Value>) {
        ("run", std::borrow::Cow::Borrowed(&self.json))
    }
}
