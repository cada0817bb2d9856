//! What a bench run ends as: the [`BenchRun`] (the report with warmup excluded, goodput), its
//! JSON and `config` block, and its console text and files.

use std::time::Duration;

use serde_json::json;

use crate::bench::plan::{BenchPlan, Load, Warmup};
use crate::bench::schedule::{info, picks, Taken};
use crate::bench::slo::{goodput, Goodput, Slo};
use crate::error::LoadgenError;
use crate::harness::Report;
use crate::report::replay_report::{self, RequestInfo};
use crate::run::driver;
use mock_server::args::ReportArgs;

/// The outcome of a bench run.
#[derive(Debug)]
pub struct BenchRun {
    /// The report (warmup excluded).
    pub live: replay_report::LiveReport,
    /// Goodput, when `--slo` was given.
    pub goodput: Option<Goodput>,
    /// Requests excluded as warmup.
    pub warmup_requests: usize,
    /// The report JSON.
    pub json: serde_json::Value,
    /// The run was stopped early (its in-flight requests count as cancelled).
    pub aborted: bool,
    /// How late the server handed its tokens to clients, when it said.
    pub server_lateness: Option<crate::observe::scrape::Lateness>,
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

impl Report for BenchRun {
    fn live(&self) -> Option<&crate::report::replay_report::LiveReport> {
        Some(&self.live)
    }

    fn console_text(&self) -> String {
        format!(
            "Bench report ({} warmup requests excluded)\n{}",
            self.warmup_requests,
            self.console()
        )
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

/// The `config` block of a bench report: the plan and the target.
pub(crate) fn config_json(
    plan: &BenchPlan,
    spec: &crate::run::target::TargetSpec,
) -> serde_json::Value {
    json!({
        "mode": plan.describe(),
        "endpoint": plan.api.name(),
        "stop": format!("{:?}", plan.stop),
        "warmup": plan.warmup.map(|w| format!("{w:?}")),
        "input_tokens": plan.lengths.input_tokens,
        "input_tokens_stddev": plan.lengths.input_tokens_stddev,
        "output_tokens": plan.lengths.output_tokens,
        "output_tokens_stddev": plan.lengths.output_tokens_stddev,
        "shared_prefix_tokens": plan.lengths.shared_prefix_tokens,
        "num_prefix_groups": plan.lengths.num_prefix_groups,
        "slo": plan.slo,
        "seed": plan.seed,
        "dataset": plan.dataset.as_ref().map(|d| d.describe()),
        "target": spec.describe(),
    })
}

impl BenchRun {
    /// The console report: latencies, token lengths, goodput, failures, schedule lag.
    pub fn console(&self) -> String {
        let mut s = self.live.report_lines();
        let j = &self.json;
        let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
        s.push_str(&format!(
            "Tokens per request: input {:.1} ± {:.1}, output {:.1} ± {:.1}\n",
            f("input_tokens_mean"),
            f("input_tokens_std"),
            f("output_tokens_mean"),
            f("output_tokens_std")
        ));
        if let Some(g) = &self.goodput {
            s.push_str(&format!(
                "Goodput: {}/{} requests met every SLO ({:.1}%), {:.2} req/s\n",
                g.good_requests,
                g.total_requests,
                100.0 * g.share,
                g.rate_rps
            ));
        }
        s.push_str(&self.live.failure_lines());
        s.push_str(&self.live.lag_lines());
        s
    }
}

/// The report of a run of `plan` (warmup excluded), sent with `lora`'s adapters; `taken` maps
/// closed-loop samples to their request indices.
pub(super) fn measure(
    plan: &BenchPlan,
    lora: Option<&crate::run::lora::LoraTraffic>,
    taken: &Taken,
    mut out: driver::DriverOutput,
    wall: Duration,
) -> BenchRun {
    let shard = plan.shard;
    // Request index of each sample: open loop one per session (the local session j is the
    // global arrival I + j * N); closed loop the index the user took for that turn.
    let open_loop = matches!(plan.load, Load::Open { .. });
    let taken = taken.lock().map(|t| t.clone()).unwrap_or_default();
    let ks: Vec<usize> = out
        .samples
        .iter()
        .map(|s| {
            if open_loop {
                crate::run::shard::global(shard, s.session)
            } else {
                taken
                    .get(s.session)
                    .and_then(|t| t.get(s.turn))
                    .copied()
                    .unwrap_or(s.seq as usize)
            }
        })
        .collect();
    // Records carry the global arrival or user index.
    for s in &mut out.samples {
        s.session = crate::run::shard::global(shard, s.session);
    }
    let picks = picks(plan);
    let infos: Vec<RequestInfo> = ks
        .iter()
        .map(|&k| RequestInfo {
            adapter: lora.map(|l| l.label(k)),
            ..info(plan, picks.as_ref(), k)
        })
        .collect();
    let measured: Vec<_> = out
        .samples
        .iter()
        .zip(ks.iter().zip(&infos))
        .filter(|(s, (&k, _))| match plan.warmup {
            None => true,
            // Sharded, the first N requests of the whole run (by request index).
            Some(Warmup::Requests(n)) if shard.is_some() => k >= n,
            Some(Warmup::Requests(n)) => s.seq >= n as u64,
            Some(Warmup::Seconds(x)) => (s.scheduled_us as f64) >= x * 1e6,
        })
        .map(|(s, (_, info))| (s, info))
        .collect();
    let warmup_requests = out.samples.len() - measured.len();
    let mut live = replay_report::build(&measured, wall);
    live.set_started_at(out.started_at);
    live.set_shard(shard);
    let mut json = bench_json(&live, &plan.describe(), warmup_requests, plan.slo);
    crate::run::shard::annotate(&mut json, shard);
    let goodput = plan
        .slo
        .map(|slo| goodput(&slo, &live.records, live.report.duration_ms / 1000.0));
    BenchRun {
        live,
        goodput,
        warmup_requests,
        json,
        aborted: out.aborted,
        server_lateness: None,
    }
}

/// The bench report JSON of `live`: its keys, then the mode, warmup, token lengths and goodput.
pub(crate) fn bench_json(
    live: &replay_report::LiveReport,
    mode: &str,
    warmup_requests: usize,
    slo: Option<Slo>,
) -> serde_json::Value {
    let duration_s = live.report.duration_ms / 1000.0;
    let goodput = slo.map(|slo| goodput(&slo, &live.records, duration_s));
    let inputs: Vec<f64> = live
        .records
        .iter()
        .filter_map(|r| r.prompt_tokens)
        .map(|n| n as f64)
        .collect();
    let outputs: Vec<f64> = live
        .records
        .iter()
        .map(|r| r.record.output_length as f64)
        .collect();
    let (in_mean, in_std) = mean_std(&inputs);
    let (out_mean, out_std) = mean_std(&outputs);
    live.to_json(&[
        ("mode", json!(mode)),
        ("warmup_requests", json!(warmup_requests)),
        ("input_tokens_mean", json!(in_mean)),
        ("input_tokens_std", json!(in_std)),
        ("output_tokens_mean", json!(out_mean)),
        ("output_tokens_std", json!(out_std)),
        ("slo", json!(slo)),
        ("goodput", json!(goodput)),
    ])
}
