//! An agentic trace in the run harness: its request graph loaded and checked, sent by
//! [`graph_driver::drive_graph`], and the `agentic` section and per-request labels of its report.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use servesim::replay::{summarize, AgenticReport, GraphTimes, TrajectoryFigures};
use servesim::trace::{self, RequestGraph, TraceFormat};

use crate::error::LoadgenError;
use crate::harness::{self, Mode};
use crate::limits;
use crate::observe::Observed;
use crate::replay::args::{settings, ReplayArgs, SessionMode};
use crate::replay::graph_driver::{self, GraphPlan};
use crate::replay::plan::{prompts_line, SeenPrefixes};
use crate::replay::report::{ReplayKeys, ReplayRun};
use crate::report::replay_report::{self, RequestInfo};
use crate::run::driver::RunHooks;
use crate::run::target::{Api, Connected, EmbeddedOptions};

/// Loads an agentic trace (`format`, already detected) as a request graph, checked as
/// `mockserve replay` checks it: its schedule bounded unless `--allow-long-schedule`; the flags
/// that only mean something for plain Mooncake rows are refused.
pub fn load_graph(args: &ReplayArgs, format: TraceFormat) -> Result<RequestGraph, LoadgenError> {
    if args.max_requests.is_some() {
        return Err(LoadgenError::Config(format!(
            "--max-requests replays the first rows of a plain Mooncake trace; {} is an agentic \
             trace ({format}), replayed whole (its rows depend on each other)",
            args.trace.file().display()
        )));
    }
    if args.session_mode != SessionMode::Auto {
        return Err(LoadgenError::Config(format!(
            "--session-mode is for plain Mooncake traces; the prompts of an agentic trace \
             ({format}) are sent as its rows say"
        )));
    }
    if args.trace.agentic_lanes.is_some() && args.run.sharding.shard.is_some() {
        return Err(LoadgenError::Config(
            "--agentic-lanes and --shard do not go together: lanes queue every play of the \
             trace"
                .into(),
        ));
    }
    let graph = trace::load_graph(args.trace.file(), format, args.trace.block_size)?;
    graph.check_schedule(
        &args.trace.file().display().to_string(),
        args.trace.arrival_speedup_ratio,
        trace::ScheduleBound::of_flag(args.trace.allow_long_schedule),
    )?;
    Ok(graph)
}

/// The `agentic` section of a live run over the plays `owned` (all of them unsharded): the
/// other plays' nodes were neither sent nor skipped, and are left out.
fn agentic_section(times: &GraphTimes<'_>, owned: &[usize]) -> AgenticReport {
    let mut agentic = summarize(times);
    if owned.len() == times.graph.plays.len() {
        return agentic;
    }
    let mine: HashSet<&str> = owned
        .iter()
        .map(|&p| times.graph.plays[p].id.as_str())
        .collect();
    agentic.plays.retain(|p| mine.contains(p.play_id.as_str()));
    agentic
        .requests
        .retain(|r| mine.contains(r.play_id.as_str()));
    agentic.node_count = agentic.requests.len();
    agentic.play_count = agentic.plays.len();
    agentic.skipped_requests = agentic.plays.iter().map(|p| p.skipped_requests).sum();
    agentic.completed_plays = agentic
        .plays
        .iter()
        .filter(|p| p.status == "completed")
        .count();
    agentic.failed_plays = agentic.plays.len() - agentic.completed_plays;
    agentic.trajectory = TrajectoryFigures::of(
        agentic
            .plays
            .iter()
            .map(|p| (p.status == "completed", p.makespan_ms)),
    );
    agentic
}

/// A live replay of an agentic trace: its graph sent by [`graph_driver::drive_graph`], the
/// report with the live replay's keys plus the `agentic` section.
pub(super) async fn replay_graph(
    args: &ReplayArgs,
    format: TraceFormat,
    console: bool,
) -> Result<Vec<ReplayRun>, LoadgenError> {
    let graph = load_graph(args, format)?;
    harness::repeat::check_records(
        args.run.runs.num_runs,
        graph.nodes.len(),
        "the trace's requests",
    )?;
    let spec = args.run.spec(&EmbeddedOptions::default())?;
    let lanes = args.trace.agentic_lanes.map(|l| l as usize);
    if console {
        crate::stdout::outln!(
            "Trace {}: agentic ({format}), {} requests in {} plays, {} tokens per hash id, \
             speed-up {}{}, at most {} in flight{}",
            args.trace.file().display(),
            graph.nodes.len(),
            graph.plays.len(),
            graph.block_size,
            args.trace.arrival_speedup_ratio,
            lanes.map_or_else(String::new, |l| format!(", {l} lanes")),
            max_in_flight(args),
            if args.max_in_flight.is_none() {
                " (the default; --max-in-flight sets it)"
            } else {
                ""
            }
        );
    }
    let mode = GraphMode {
        args,
        spec: &spec,
        console,
        format,
        lanes,
        graph: Arc::new(graph),
        owned: Vec::new(),
        lora: None,
    };
    harness::execute_runs(mode, &spec, &settings(args, console)).await
}

/// The in-flight cap of an agentic replay: `--max-in-flight`, or
/// [`limits::DEFAULT_AGENTIC_MAX_IN_FLIGHT`].
pub(crate) fn max_in_flight(args: &ReplayArgs) -> usize {
    args.max_in_flight
        .unwrap_or(limits::DEFAULT_AGENTIC_MAX_IN_FLIGHT)
}

/// An agentic trace's request graph in the harness, sent by [`graph_driver::drive_graph`].
struct GraphMode<'a> {
    args: &'a ReplayArgs,
    spec: &'a crate::run::target::TargetSpec,
    console: bool,
    format: TraceFormat,
    lanes: Option<usize>,
    graph: Arc<RequestGraph>,
    /// The plays this process sends (all of them unsharded).
    owned: Vec<usize>,
    /// `--lora-mix` against the target: play p is sent as `lora.model(p)`.
    lora: Option<Arc<crate::run::lora::LoraTraffic>>,
}

impl Mode for GraphMode<'_> {
    type Schedule = GraphPlan;
    type Driven = graph_driver::GraphOutput;
    type Run = ReplayRun;

    fn api(&self) -> Api {
        self.args.endpoint
    }

    fn prepare(&mut self, target: &Connected) -> Result<(GraphPlan, Option<usize>), LoadgenError> {
        let (args, graph) = (self.args, &self.graph);
        let synth = Arc::new(target.synth(graph.block_size));
        if self.console {
            crate::stdout::outln!("{}", prompts_line(args, &synth, graph.block_size));
        }
        // A shard's plays (all of them unsharded), at their unsharded times.
        let shard = args.run.sharding.shard;
        self.owned = (0..graph.plays.len())
            .filter(|&p| shard.is_none_or(|sh| sh.owns(p)))
            .collect();
        if let (Some(sh), true) = (shard, self.console) {
            crate::stdout::outln!(
                "Shard {}/{}: {} of the {} plays",
                sh.index,
                sh.count,
                self.owned.len(),
                graph.plays.len()
            );
        }
        let total: usize = self.owned.iter().map(|&p| graph.plays[p].nodes.len()).sum();
        let plan = GraphPlan {
            graph: graph.clone(),
            synth,
            model: Arc::from(target.model.as_str()),
            api: args.endpoint,
            speedup: args.trace.arrival_speedup_ratio,
            lanes: self.lanes,
            plays: self.owned.clone(),
            ask_worker_id: target.ask_worker_id,
            lora: target.lora.clone(),
        };
        self.lora = target.lora.clone();
        Ok((plan, Some(total)))
    }

    async fn drive(
        &mut self,
        plan: GraphPlan,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<graph_driver::GraphOutput, LoadgenError> {
        let config = hooks.driver_config(Some(max_in_flight(self.args)), None);
        graph_driver::drive_graph(target.endpoint.clone(), plan, &config).await
    }

    fn report(
        &mut self,
        mut out: graph_driver::GraphOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<ReplayRun, LoadgenError> {
        let (args, graph) = (self.args, &self.graph);
        let speedup = args.trace.arrival_speedup_ratio;
        // Expected reuse in the order the prompts were sent (samples are in send order).
        let mut seen = SeenPrefixes::default();
        let infos: Vec<RequestInfo> = out
            .samples
            .iter()
            .map(|s| {
                let node = &graph.nodes[s.session];
                let r = &node.request;
                RequestInfo {
                    input_length: r.input_length,
                    max_output: r.output_length,
                    session: Some(node.session_id.clone()),
                    turn: s.turn,
                    adapter: self.lora.as_ref().map(|l| l.label(node.play)),
                    expected_reused_tokens: Some(seen.add(
                        r.hash_ids.iter().copied(),
                        r.input_length,
                        graph.block_size,
                    )),
                }
            })
            .collect();
        let items: Vec<_> = out.samples.iter().zip(&infos).collect();
        let mut live = replay_report::build(&items, wall);
        live.set_started_at(out.started_at);
        for rec in &live.records {
            if let Some(t) = out.times.get_mut(rec.raw.session) {
                t.engine_id = Some(servesim::ids::RequestId(rec.record.request_id));
                t.reused_input_tokens = rec.record.reused_input_tokens;
            }
        }
        let engine_block_size = self
            .spec
            .server
            .as_ref()
            .map_or(graph.block_size, |s| s.cluster.engine.block_size);
        let agentic = agentic_section(
            &GraphTimes {
                graph,
                nodes: &out.times,
                failed: &out.failed,
                lane_of: &out.lane_of,
                speedup,
                lanes: self.lanes,
                engine_block_size,
            },
            &self.owned,
        );
        let labels = agentic.request_labels();
        for rec in &mut live.records {
            rec.agentic = labels.get(&rec.record.request_id).cloned();
        }
        let config = json!({
            "mode": "replay",
            "trace": args.trace.file().display().to_string(),
            "trace_format": self.format.name(),
            "endpoint": args.endpoint.name(),
            "arrival_speedup_ratio": speedup,
            "trace_block_size": graph.block_size,
            "agentic_lanes": self.lanes,
            "max_in_flight": max_in_flight(args),
            "target": self.spec.describe(),
        });
        let keys = ReplayKeys {
            first: ("trace_format", json!(self.format.name())),
            arrival_speedup_ratio: speedup,
            trace_block_size: graph.block_size,
            config,
            slo: args.slo,
        };
        Ok(keys.run(
            live,
            &items,
            Some(agentic),
            SessionMode::Cumulative,
            args.run.sharding.shard,
            observed,
        ))
    }
}
