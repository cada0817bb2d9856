//! `mockserve replay TRACE`: the engine on a virtual clock over a Mooncake trace, or over an
//! agentic trace's request graph (`--trace-format`, detected by default), whose report then has
//! an `agentic` section (per play: makespan, critical path, time in the engine and in tool
//! waits, sub-agent fan-out), and with `--slo` an `slo` section (attainment and goodput, a
//! `trajectory_e2e` bound checked on each request's play). Instead of TRACE, synthetic load
//! (`--request-rate ...`, [`crate::synthetic`]) replays `loadgen bench`'s open loop.
//!
//! Requests the engine can never run are counted as rejected (`rejected_requests` in the
//! report) and listed by reason after it, with a warning; a run in which no request completes
//! is an error, after the report files are written.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use servesim::cluster::{Cluster, Output};
use servesim::ids::RequestId;
use servesim::replay::{
    replay, replay_graph, replay_observed, set_wall_time, AgenticReport, GraphReplay, ReplayConfig,
    ReplayObserver, ReplayOutcome, ReplayRejection,
};
use servesim::slo::SloFigures;
use servesim::time::SimTime;
use servesim::trace::{self, TraceOptions};
use servesim::trace::{RequestGraph, Trace, TraceFormat, TraceRequest};

use super::autoscale::AutoscaleArgs;
use crate::args::{EngineArgs, ReportArgs, TraceArgs};
use crate::kv_events::{JsonlSink, KvExport, KvSink};
use crate::synthetic::SyntheticArgs;
use servesim::replay::autoscale::{replay_elastic, AutoscaleReport};

/// Writes a replay's KV events as JSON lines: the prompts are the trace's synthesized tokens.
struct KvEventsJsonl {
    /// The file, until the run starts.
    file: Option<std::fs::File>,
    /// The export, once started.
    export: Option<KvExport>,
    /// Tokens per trace `hash_id`.
    trace_block_size: usize,
}

impl ReplayObserver for KvEventsJsonl {
    fn start(&mut self, cluster: &mut Cluster) {
        if let Some(file) = self.file.take() {
            let sink = KvSink::Jsonl(JsonlSink {
                out: std::io::BufWriter::new(file),
                error: None,
            });
            self.export = Some(KvExport::new(cluster, sink));
        }
    }

    fn submitted(&mut self, id: RequestId, turn: &TraceRequest) {
        if let Some(export) = &mut self.export {
            let tokens = turn.synthesize_tokens(self.trace_block_size);
            export.tokens.track(id, &tokens);
        }
    }

    fn outputs(&mut self, cluster: &mut Cluster, outputs: &[Output], now: SimTime) {
        let Some(export) = &mut self.export else {
            return;
        };
        export.after_advance(cluster, outputs, now, now.as_nanos() as f64 / 1e9);
        for output in outputs {
            if let Output::Finished { id, .. } | Output::Rejected { id, .. } = output {
                export.release(cluster, *id, now);
            }
        }
    }
}

/// Offline replay flags (Dynamo's offline_replay_bench flags and defaults).
#[derive(Args, Clone, Debug)]
pub struct ReplayArgs {
    /// Synthetic load instead of the trace (loadgen bench's open-loop flags). Read before
    /// the trace flags: it looks at which of them the command line gave.
    #[command(flatten)]
    pub synthetic: SyntheticArgs,

    /// The trace and how to read it.
    #[command(flatten)]
    pub trace: TraceArgs,

    /// Run the replay this many times in-process (the last run is reported).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub iterations: u32,

    /// Write every worker's KV events as `mockserve serve --kv-events-endpoint` publishes them,
    /// one decoded batch per JSON line (`ts` in virtual seconds).
    #[arg(long, value_name = "PATH")]
    pub kv_events_jsonl: Option<PathBuf>,

    /// Report files and progress.
    #[command(flatten)]
    pub report: ReportArgs,

    /// Autoscaling, rate profile and judge (issue 46).
    #[command(flatten)]
    pub autoscale: AutoscaleArgs,

    /// Engine, router and cluster settings.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// A trace as the replay runs it.
enum Loaded {
    /// Plain Mooncake sessions.
    Sessions(Trace),
    /// An agentic request graph.
    Graph(RequestGraph),
}

/// Runs the replay, prints the report and writes the requested files.
pub fn run(args: &ReplayArgs) -> anyhow::Result<ReplayOutcome> {
    run_judged(args).map(|(outcome, _)| outcome)
}

/// [`run`], also returning the judge's verdict when `--autoscale` or `--slo` asked for it.
pub fn run_judged(args: &ReplayArgs) -> anyhow::Result<(ReplayOutcome, Option<AutoscaleReport>)> {
    let cluster = args.engine.cluster_config()?;
    let elastic = args.autoscale.settings(
        &cluster,
        args.engine.num_workers.is_some(),
        args.engine.seed,
    )?;
    if !(1..=trace::MAX_TRACE_BLOCK_SIZE).contains(&args.trace.block_size) {
        anyhow::bail!(
            "--trace-block-size must be from 1 to {}, got {}",
            trace::MAX_TRACE_BLOCK_SIZE,
            args.trace.block_size
        );
    }
    let ratio = args
        .synthetic
        .arrival_speedup(args.trace.arrival_speedup_ratio);
    if !(ratio.is_finite() && ratio > 0.0) {
        anyhow::bail!(
            "--arrival-speedup-ratio must be finite and above 0, got {}",
            if ratio.is_finite() && !(1e-4..1e9).contains(&ratio.abs()) {
                format!("{ratio:e}")
            } else {
                format!("{ratio}")
            }
        );
    }
    for warning in cluster.warnings() {
        eprintln!("mockserve: warning: {warning}");
    }
    let options = TraceOptions {
        trace_block_size: args.trace.block_size,
        arrival_speedup_ratio: ratio,
    };
    // Exactly one input: the trace, or synthetic load (whose prompts are in engine blocks).
    let synthetic = args
        .synthetic
        .load(args.trace.path.is_some(), args.engine.seed)?;
    let input = match &args.trace.path {
        Some(path) => format!("the trace {}", path.display()),
        None => "synthetic load".to_string(),
    };
    let engine_block_size = cluster.engine.block_size;
    // Output files are opened before the run, so a bad path fails fast instead of after it.
    let create = |path: &std::path::Path| {
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))
    };
    let report_file = args.report.report_json.as_deref().map(create).transpose()?;
    let records_file = args
        .report
        .per_request_jsonl
        .as_deref()
        .map(create)
        .transpose()?;
    let mut kv_events = args
        .kv_events_jsonl
        .as_deref()
        .map(create)
        .transpose()?
        .map(|file| KvEventsJsonl {
            file: Some(file),
            export: None,
            trace_block_size: args.trace.block_size,
        });
    let bound = trace::ScheduleBound::of_flag(args.trace.allow_long_schedule);
    let detected = match &synthetic {
        Some(_) => TraceFormat::Mooncake,
        None => trace::detect_format(args.trace.file(), args.trace.format)?,
    };
    let loaded = match detected {
        TraceFormat::Mooncake => {
            let trace = match &synthetic {
                Some(load) => load.trace(engine_block_size, ratio, bound)?,
                None => trace::load_with_bound(args.trace.file(), &options, bound)?,
            };
            if let Some(warning) = clamped_warning(&trace, args.trace.block_size) {
                eprintln!("mockserve: warning: {warning}");
            }
            let mut trace = trace;
            if let Some(profile) = &args.autoscale.rate_profile {
                profile.apply(&mut trace);
            }
            Loaded::Sessions(trace)
        }
        format => {
            let graph = trace::load_graph(args.trace.file(), format, args.trace.block_size)?;
            graph.check_schedule(&args.trace.file().display().to_string(), ratio, bound)?;
            Loaded::Graph(graph)
        }
    };
    if let Loaded::Graph(_) = &loaded {
        let flags = [
            ("--autoscale", args.autoscale.autoscale.is_some()),
            ("--rate-profile", args.autoscale.rate_profile.is_some()),
        ];
        if let Some((flag, _)) = flags.iter().find(|(_, given)| *given) {
            anyhow::bail!("{flag} applies to Mooncake traces; {input} is an agentic trace");
        }
    }
    // A trajectory bound needs plays: refused where there are none, never ignored.
    if let Some(slo) = &args.autoscale.slo {
        slo.check_trajectories(matches!(loaded, Loaded::Graph(_)), &input)?;
    }
    if let (Loaded::Sessions(_), Some(_)) = (&loaded, args.trace.agentic_lanes) {
        anyhow::bail!("--agentic-lanes needs an agentic trace; {input} is plain Mooncake");
    }
    let how = GraphReplay {
        speedup: ratio,
        lanes: args.trace.agentic_lanes.map(|l| l as usize),
    };
    let (trace_block_size, num_requests) = match &loaded {
        Loaded::Sessions(trace) if synthetic.is_some() => (engine_block_size, trace.num_requests()),
        Loaded::Sessions(trace) => (args.trace.block_size, trace.num_requests()),
        Loaded::Graph(graph) => (graph.block_size, graph.nodes.len()),
    };
    if let Some(kv) = kv_events.as_mut() {
        kv.trace_block_size = trace_block_size;
    }
    let config = ReplayConfig {
        cluster,
        trace_block_size,
    };
    let show_progress = args.report.show_progress();
    let mut outcome = None;
    let mut judged = None;
    for _ in 0..args.iterations {
        let bar = show_progress.then(|| {
            let bar = indicatif::ProgressBar::new(num_requests as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "replay {bar:40} {pos}/{len} requests {elapsed}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        // The engine reads no clock; the command times the run.
        let started = std::time::Instant::now();
        let progress = |done: usize, _: usize| {
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
        };
        // KV events are written for the first iteration (the others are identical).
        let mut inner = kv_events.as_mut().filter(|k| k.file.is_some());
        // Autoscaling hook (issue 46): an elastic or judged run goes through the fleet driver.
        if let (Loaded::Sessions(trace), Some(settings)) = (&loaded, &elastic) {
            let observer: &mut dyn ReplayObserver = match inner.as_mut() {
                Some(o) => *o,
                None => &mut (),
            };
            let run = replay_elastic(trace, &config, settings, progress, observer);
            let wall = started.elapsed();
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let mut run = run?;
            set_wall_time(&mut run.outcome.report, wall);
            judged = Some(run.autoscale);
            outcome = Some(run.outcome);
            continue;
        }
        let result = match (&loaded, inner) {
            (Loaded::Sessions(trace), Some(observer)) => {
                replay_observed(trace, &config, progress, observer)
            }
            (Loaded::Sessions(trace), None) => replay(trace, &config, progress),
            (Loaded::Graph(graph), Some(observer)) => {
                replay_graph(graph, &config, &how, progress, observer)
            }
            (Loaded::Graph(graph), None) => replay_graph(graph, &config, &how, progress, &mut ()),
        };
        let wall = started.elapsed();
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let mut run = result?;
        set_wall_time(&mut run.report, wall);
        outcome = Some(run);
    }
    let outcome = outcome.context("no iteration ran")?;
    if let (
        Some(KvEventsJsonl {
            export: Some(export),
            ..
        }),
        Some(path),
    ) = (kv_events.as_mut(), &args.kv_events_jsonl)
    {
        if let KvSink::Jsonl(sink) = &mut export.sink {
            sink.finish()
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let mut text = format!(
        "Offline replay report\nLatency model: {}\n{}",
        config.cluster.engine.latency.model.describe(),
        outcome.report
    );
    if let Some(agentic) = &outcome.agentic {
        text.push_str(&agentic_summary(agentic));
    }
    // An agentic trace's --slo: attainment and goodput, trajectories counted.
    let slo = match (&args.autoscale.slo, &outcome.agentic) {
        (Some(slo), Some(agentic)) => Some(slo.figures(
            &outcome.records,
            Some(&agentic.trajectory_e2e_by_request()),
            outcome.report.duration_ms,
        )),
        _ => None,
    };
    if let Some(f) = &slo {
        text.push_str(&slo_summary(f));
    }
    if let Some(judged) = &judged {
        text.push_str(&super::autoscale::summary(judged));
    }
    let rejected = rejection_summary(&outcome.rejections);
    if !rejected.is_empty() {
        text.push_str("Rejected requests (never ran)\n");
        text.push_str(&rejected);
    }
    // A closed stdout (`| head`) drops the rest of the console output; the files are still
    // written and the verdict below still holds.
    let console = crate::stdout::write(text.as_bytes()).context("writing the report to stdout")?;
    if let (Some(file), Some(path)) = (report_file, &args.report.report_json) {
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer_pretty(
            &mut w,
            &WithConfig {
                autoscale: judged.as_ref(),
                slo: slo.as_ref(),
                ..with_config(&outcome.report, &config, outcome.agentic.as_ref())
            },
        )?;
        w.write_all(b"\n")?;
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        if console {
            crate::stdout::write(format!("Saved report to {}\n", path.display()).as_bytes())
                .context("writing to stdout")?;
        }
    }
    if let (Some(file), Some(path)) = (records_file, &args.report.per_request_jsonl) {
        let mut w = std::io::BufWriter::new(file);
        let labels = outcome
            .agentic
            .as_ref()
            .map(AgenticReport::request_labels)
            .unwrap_or_default();
        for record in &outcome.records {
            match labels.get(&record.request_id) {
                Some(agentic) => serde_json::to_writer(
                    &mut w,
                    &AgenticRecord {
                        record,
                        agentic: agentic.clone(),
                    },
                )?,
                None => serde_json::to_writer(&mut w, record)?,
            }
            w.write_all(b"\n")?;
        }
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let report = &outcome.report;
    if report.completed_requests == 0 && report.num_requests > 0 {
        anyhow::bail!(
            "no request completed: {} of {} were rejected by the engine (reasons above); check \
             the engine flags against the trace",
            report.rejected_requests,
            report.num_requests
        );
    }
    if report.rejected_requests > 0 {
        eprintln!(
            "mockserve: warning: {} of {} requests were rejected by the engine and never ran \
             (reasons in the report)",
            report.rejected_requests, report.num_requests
        );
    }
    Ok((outcome, judged))
}

/// A warning when some rows' `input_length` is beyond what their `hash_ids` cover (their
/// prompts are cut), naming the first such row.
pub fn clamped_warning(trace: &trace::Trace, trace_block_size: usize) -> Option<String> {
    let mut clamped = trace.clamped_turns();
    let first = clamped.next()?;
    let count = 1 + clamped.count();
    Some(format!(
        "{count} trace rows have an input_length beyond what their hash_ids cover at \
         --trace-block-size {trace_block_size}; their prompts are cut (first: line {}, {} -> {} \
         tokens). Is the trace block size right?",
        first.line,
        first.requested_input_length.unwrap_or(first.input_length),
        first.input_length
    ))
}

/// A per-request record of an agentic replay: the record, then the node it was.
#[derive(serde::Serialize)]
struct AgenticRecord<'a> {
    #[serde(flatten)]
    record: &'a servesim::metrics::RequestRecord,
    agentic: serde_json::Value,
}

/// The agentic section in words: the plays' outcomes, and per play its makespan split along
/// the critical path.
pub fn agentic_summary(agentic: &AgenticReport) -> String {
    let mut out = format!(
        "Agentic trace ({}, block size {}, speed-up {}{})\n  plays {} ({} completed, {} failed), \
         requests {} ({} skipped)\n",
        agentic.input_format,
        agentic.block_size,
        agentic.speedup,
        agentic
            .lanes
            .map_or_else(String::new, |l| format!(", {l} lanes")),
        agentic.play_count,
        agentic.completed_plays,
        agentic.failed_plays,
        agentic.node_count,
        agentic.skipped_requests
    );
    let t = &agentic.trajectory;
    out.push_str(&format!(
        "  trajectory E2E over {} completed of {} ({} incomplete): mean {:.3} ms, p50 {:.3}, \
         p90 {:.3}, p99 {:.3}, min {:.3}, max {:.3}, std {:.3} ms\n",
        t.completed_trajectories,
        t.total_trajectories,
        t.incomplete_trajectories,
        t.mean_trajectory_e2e_latency_ms,
        t.p50_trajectory_e2e_latency_ms,
        t.p90_trajectory_e2e_latency_ms,
        t.p99_trajectory_e2e_latency_ms,
        t.min_trajectory_e2e_latency_ms,
        t.max_trajectory_e2e_latency_ms,
        t.std_trajectory_e2e_latency_ms
    ));
    for play in &agentic.plays {
        out.push_str(&format!(
            "  {} {}: makespan {:.3} ms, critical path {} requests ({:.3} ms model, {:.3} ms \
             tool waits, {:.3} ms floors), {} spawn edges, {} of {} prefix tokens lost in \
             waits\n",
            play.play_id,
            play.status,
            play.makespan_ms,
            play.critical_path_requests,
            play.critical_path_model_ms,
            play.critical_path_tool_wait_ms,
            play.critical_path_floor_wait_ms,
            play.spawn_edges,
            play.prefix_tokens_lost_in_waits,
            play.prefix_tokens_after_waits
        ));
    }
    out
}

/// An agentic trace's `--slo` figures in words.
pub fn slo_summary(f: &SloFigures) -> String {
    let bound = |name: &str, v: Option<f64>| v.map(|ms| format!("{name}={ms}ms"));
    let bounds: Vec<String> = [
        bound("ttft", f.slo.ttft_ms),
        bound("tpot", f.slo.itl_ms),
        bound("e2e", f.slo.e2e_ms),
        bound("trajectory_e2e", f.slo.trajectory_e2e_ms),
    ]
    .into_iter()
    .flatten()
    .collect();
    format!(
        "SLO {}: {} of {} requests met it (attainment {:.4}), goodput {:.3} tok/s\n",
        bounds.join(","),
        f.good_requests,
        f.num_requests,
        f.slo_attainment,
        f.goodput_tok_s
    )
}

/// Rejections grouped by kind: count, the first reason in full, and the first trace lines.
pub fn rejection_summary(rejections: &[ReplayRejection]) -> String {
    const LINES_SHOWN: usize = 5;
    let mut by_code: BTreeMap<&str, Vec<&ReplayRejection>> = BTreeMap::new();
    for r in rejections {
        by_code.entry(r.reason.code()).or_default().push(r);
    }
    let mut out = String::new();
    for (code, group) in by_code {
        let mut lines: Vec<String> = group
            .iter()
            .take(LINES_SHOWN)
            .map(|r| r.line.to_string())
            .collect();
        if group.len() > LINES_SHOWN {
            lines.push("...".into());
        }
        out.push_str(&format!(
            "  {code:<24} {:>6}  e.g. {} (trace lines {})\n",
            group.len(),
            group[0].reason,
            lines.join(", ")
        ));
    }
    out
}

/// The report with a `config` block after Dynamo's keys, naming what timed the run: the latency
/// model (for a profile, its file) and the speed-up ratios applied to it.
#[derive(serde::Serialize)]
struct WithConfig<'a> {
    #[serde(flatten)]
    report: &'a servesim::metrics::ReplayReport,
    config: serde_json::Value,
    /// Agentic traces only.
    #[serde(skip_serializing_if = "Option::is_none")]
    agentic: Option<&'a AgenticReport>,
    /// With --autoscale or --slo: the judge's verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    autoscale: Option<&'a AutoscaleReport>,
    /// An agentic trace with --slo: attainment and goodput under it.
    #[serde(skip_serializing_if = "Option::is_none")]
    slo: Option<&'a SloFigures>,
}

fn with_config<'a>(
    report: &'a servesim::metrics::ReplayReport,
    config: &ReplayConfig,
    agentic: Option<&'a AgenticReport>,
) -> WithConfig<'a> {
    let latency = &config.cluster.engine.latency;
    WithConfig {
        report,
        agentic,
        autoscale: None,
        slo: None,
        config: serde_json::json!({
            "latency_model": latency.model.describe(),
            "speedup_ratio": latency.speedup_ratio,
            "decode_speedup_ratio": latency.decode_speedup_ratio,
            "num_workers": config.cluster.num_workers,
            "block_size": config.cluster.engine.block_size,
            "trace_block_size": config.trace_block_size,
        }),
    }
}
