//! Offline replay of an agentic [`RequestGraph`] on the virtual clock, and its
//! [`AgenticReport`].
//!
//! Each node is dispatched the instant [`Readiness`] makes it due (its floor, its dependencies
//! and their delays, its play's lane). A node that the engine rejects fails its play: the
//! play's nodes not yet dispatched are skipped (never sent, absent from the report), those in
//! flight finish.
//!
//! The loop is the Mooncake replay's (`drive`: pass ends first at each instant, then the
//! arrivals due, then idle workers start), the graph's [`Readiness`] being its arrivals, with
//! one collector on this thread: graph traces are small next to Mooncake's millions of rows.
//! A delay or a floor divided by the speed-up, and the end of a pass, fall between whole
//! microseconds; on the nanosecond clock they keep their order (a pass that ends just before
//! an arrival starts the next one without it, one that ends just after takes it), and
//! dependants are released from their sources' times with no rounding to add up.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::drive::{drive, Arrivals};
use super::Readiness;
use super::TrajectoryFigures;
use super::{
    add_topology_figures, engine_request, tell, Note, ReplayConfig, ReplayError, ReplayObserver,
    ReplayOutcome, ReplayRejection,
};
use crate::cluster::{Cluster, Output};
use crate::ids::RequestId;
use crate::metrics::Collector;
use crate::scheduler::RejectReason;
use crate::time::{SimDuration, SimTime};
use crate::trace::{LocalHashCache, Relation, RequestGraph, Trigger};

/// How a graph is replayed, beyond the cluster's settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraphReplay {
    /// Divides floors and dependency delays (finite, > 0; 1 = as recorded).
    pub speedup: f64,
    /// Plays run at once, each in a lane taken from a queue; None runs every play by its floors.
    pub lanes: Option<usize>,
}

impl Default for GraphReplay {
    fn default() -> Self {
        GraphReplay {
            speedup: 1.0,
            lanes: None,
        }
    }
}

/// What happened to one node of the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// It ran to its last token.
    Completed,
    /// The engine refused or rejected it (live: the request failed); its play failed.
    Rejected,
    /// Never sent: its play failed before it became ready.
    Skipped,
}

/// One node's times on the virtual clock (skipped nodes have none).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    /// The trace's `request_id`.
    pub request_id: String,
    /// The node's play.
    pub play_id: String,
    /// The node's conversation.
    pub session_id: String,
    /// The engine's id for it (the `request_id` of its per-request record), once dispatched.
    pub engine_id: Option<RequestId>,
    /// The source of its `spawn` dependency, if any.
    pub parent_id: Option<String>,
    /// When it was dispatched (its ready time).
    pub dispatched: Option<SimTime>,
    /// When its last token came.
    pub last_token: Option<SimTime>,
    /// When it ended (last token or rejection).
    pub(crate) terminal: Option<SimTime>,
    /// How it ended.
    pub status: NodeStatus,
}

/// How a play ended and where its time went.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlayOutcome {
    /// The play.
    pub play_id: String,
    /// `completed`, or `failed` when one of its nodes was rejected.
    pub status: &'static str,
    /// The first node that failed, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_request_id: Option<String>,
    /// How it failed: `rejected` offline; live, the failed request's class (`http`,
    /// `timeout`, `transport`, `cancelled`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_status: Option<&'static str>,
    /// Nodes dispatched.
    pub requests: usize,
    /// Nodes skipped after the failure.
    pub skipped_requests: usize,
    /// First dispatch of the play (ms).
    pub start_ms: f64,
    /// When its last dispatched node ended (ms).
    pub settled_at_ms: f64,
    /// `settled_at_ms - start_ms`.
    pub makespan_ms: f64,
    /// Nodes on the critical path: from the node that ended last, back through the dependency
    /// that set each node's ready time, to a node that waited only for its floor.
    pub critical_path_requests: usize,
    /// Of the makespan, time the critical path spent in the engine (dispatch to last token,
    /// queueing included).
    pub critical_path_model_ms: f64,
    /// Of the makespan, time the critical path spent in dependency delays (tool calls and
    /// other recorded waits).
    pub critical_path_tool_wait_ms: f64,
    /// Of the makespan, time the critical path's first node was held by its floor after the
    /// play's first dispatch. The three add up to the makespan.
    pub critical_path_floor_wait_ms: f64,
    /// The lane the play ran in (with lanes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<usize>,
    /// Spawn edges (sub-agents and worker streams started) in the play.
    pub spawn_edges: usize,
    /// Most spawn edges out of one node (the widest fan-out).
    pub(crate) max_fan_out: usize,
    /// KV cost of waits: over the play's dispatched nodes with a completion dependency, the
    /// prompt tokens the engine could have found cached from such a source (their common
    /// hash-id prefix, in full engine blocks, and short of the last block of a fully cached
    /// prompt, which the engine recomputes)...
    pub prefix_tokens_after_waits: u64,
    /// ...and of those, the tokens it did not find (evicted, or on another worker, while the
    /// play waited), recomputed.
    pub prefix_tokens_lost_in_waits: u64,
}

/// The `agentic` section of a graph replay's report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgenticReport {
    /// The trace format.
    pub input_format: String,
    /// Prompt tokens per hash id.
    pub block_size: usize,
    /// The divisor of floors and delays.
    pub speedup: f64,
    /// Lanes (plays at once), if the run had them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lanes: Option<usize>,
    /// The header's `source`, where the format has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) source: Option<serde_json::Value>,
    /// Nodes in the graph.
    pub node_count: usize,
    /// Nodes never sent (their play failed first).
    pub skipped_requests: usize,
    /// Plays in the graph.
    pub play_count: usize,
    /// Plays whose every node completed.
    pub completed_plays: usize,
    /// Plays with a rejected node.
    pub failed_plays: usize,
    /// Per play, in trace order.
    pub plays: Vec<PlayOutcome>,
    /// The plays as trajectories (AISimulate's `*_trajectories` and
    /// `*_trajectory_e2e_latency_ms` keys, flattened into this section); a report that drops
    /// plays recomputes it with [`TrajectoryFigures::of`].
    #[serde(flatten)]
    pub trajectory: TrajectoryFigures,
    /// Per node, in trace order (not in the report file: the per-request records hold the
    /// same times).
    #[serde(skip)]
    pub requests: Vec<NodeRecord>,
}

impl AgenticReport {
    /// Per engine request id, its play's makespan (the trajectory E2E) when the play completed:
    /// what an `--slo` `trajectory_e2e` bound is checked against ([`crate::slo::Slo::met_in`]).
    pub fn trajectory_e2e_by_request(&self) -> crate::slo::TrajectoryE2e {
        let completed: HashMap<&str, f64> = self
            .plays
            .iter()
            .filter(|p| p.status == "completed")
            .map(|p| (p.play_id.as_str(), p.makespan_ms))
            .collect();
        self.requests
            .iter()
            .filter_map(|node| {
                let ms = completed.get(node.play_id.as_str())?;
                Some((node.engine_id?.0, *ms))
            })
            .collect()
    }

    /// Per engine request id, the node it was: `{request_id, play_id, conversation_id,
    /// parent_id?, lane_id?}` (AISimulate's per-request `agentic` object), as the offline and
    /// the live replay's per-request records carry it.
    pub fn request_labels(&self) -> HashMap<u64, serde_json::Value> {
        let lanes: HashMap<&str, usize> = self
            .plays
            .iter()
            .filter_map(|p| Some((p.play_id.as_str(), p.lane?)))
            .collect();
        self.requests
            .iter()
            .filter_map(|node| {
                let id = node.engine_id?;
                let mut label = serde_json::json!({
                    "request_id": node.request_id,
                    "play_id": node.play_id,
                    "conversation_id": node.session_id,
                });
                if let Some(parent) = &node.parent_id {
                    label["parent_id"] = serde_json::json!(parent);
                }
                if let Some(lane) = lanes.get(node.play_id.as_str()) {
                    label["lane_id"] = serde_json::json!(format!("lane:{lane}"));
                }
                Some((id.0, label))
            })
            .collect()
    }
}

/// The graph replay's bookkeeping: its arrivals.
struct Run<'a> {
    /// The graph replayed.
    graph: &'a RequestGraph,
    /// Which nodes are due, and every node's times.
    ready: Readiness<'a>,
    /// Per node, its position in its conversation, for the per-request records.
    turn_of: Vec<usize>,
    /// The engine's KV block size.
    block_size: usize,
    /// Block hashes of the graph's `hash_id`s, memoised.
    hash_cache: LocalHashCache,
    /// Per node, the engine's id, once dispatched.
    engine_ids: Vec<Option<RequestId>>,
    /// Engine id -> node.
    node_of: Vec<usize>,
    /// The report's metrics, told every output as the Mooncake replay tells it.
    collector: Collector,
    /// Nodes the engine refused or rejected.
    rejections: Vec<ReplayRejection>,
    /// Nodes ended, for progress.
    done: usize,
}

impl Run<'_> {
    fn rejected(&mut self, node: usize, time: SimTime, reason: RejectReason) {
        self.done += 1;
        if let Some(id) = self.engine_ids[node] {
            let line = self.graph.nodes[node].request.line;
            self.rejections.push(ReplayRejection { id, line, reason });
        }
        self.ready.failed(node, time, "rejected");
    }
}

impl Arrivals for Run<'_> {
    fn next_due(&self) -> Option<SimTime> {
        self.ready.next_due()
    }

    /// Dispatches every node due by `now` at `now`; its dispatch edges fire from there.
    fn release(&mut self, now: SimTime, cluster: &mut Cluster, observer: &mut dyn ReplayObserver) {
        let graph = self.graph;
        while let Some((n, ready)) = self.ready.pop_due(now) {
            let node = &graph.nodes[n];
            let request = engine_request(
                &node.request,
                graph.block_size,
                self.block_size,
                &mut self.hash_cache,
            );
            let submitted = cluster.submit(request, now);
            let id = match &submitted {
                Ok(id) => {
                    observer.submitted(*id, &node.request);
                    *id
                }
                Err(rejection) => rejection.id,
            };
            debug_assert_eq!(id, RequestId(self.node_of.len() as u64));
            self.node_of.push(n);
            self.engine_ids[n] = Some(id);
            self.collector.on_arrival(
                id,
                ready,
                node.request.input_length,
                node.request.output_length,
                Some(&node.session_id),
                self.turn_of[n],
            );
            self.ready.dispatched(n, now);
            if let Err(rejection) = submitted {
                self.collector.on_reject(id, now);
                self.rejected(n, now, rejection.reason);
            }
        }
    }

    fn take(&mut self, outputs: &mut Vec<Output>) {
        for out in outputs.drain(..) {
            match out {
                Output::Token { id, time, .. } => {
                    self.ready.token(self.node_of[id.0 as usize], time);
                }
                Output::Finished { id, time } => {
                    self.done += 1;
                    self.ready.completed(self.node_of[id.0 as usize], time);
                }
                Output::Rejected { id, time, reason } => {
                    self.rejected(self.node_of[id.0 as usize], time, reason);
                }
                Output::Admitted { .. } | Output::KvTransfer { .. } | Output::Preempted { .. } => {}
            }
            if let Some(note) = Note::of(&out) {
                tell(&mut self.collector, note);
            }
        }
    }

    fn ended(&self) -> usize {
        self.done
    }
}

/// Replays `graph` to the end, floors and delays divided by `how.speedup` (finite, > 0), plays
/// in `how.lanes` lanes if given (at least 1).
///
/// The report keeps the Mooncake replay's keys (over the dispatched nodes) and
/// [`ReplayOutcome::agentic`] holds the plays' outcomes and every node's times.
pub fn replay_graph(
    graph: &RequestGraph,
    config: &ReplayConfig,
    how: &GraphReplay,
    progress: impl FnMut(usize, usize),
    observer: &mut dyn ReplayObserver,
) -> Result<ReplayOutcome, ReplayError> {
    let speedup = how.speedup;
    if !(speedup.is_finite() && speedup > 0.0) {
        return Err(ReplayError::Speedup(speedup));
    }
    if how.lanes == Some(0) {
        return Err(ReplayError::Lanes);
    }
    let mut cluster = Cluster::new(config.cluster.clone())?;
    observer.start(&mut cluster);
    let block_size = cluster.block_size();
    let blocks = graph
        .nodes
        .iter()
        .map(|n| (n.request.input_length + n.request.output_length).div_ceil(block_size))
        .fold(0usize, usize::saturating_add);
    cluster.reserve_router_index(blocks);
    cluster.reserve_pools(blocks);
    let total = graph.nodes.len();
    // Each node's position in its conversation, for the per-request records.
    let mut turns: HashMap<&str, usize> = HashMap::new();
    let turn_of: Vec<usize> = graph
        .nodes
        .iter()
        .map(|n| {
            let t = turns.entry(n.session_id.as_str()).or_insert(0);
            *t += 1;
            *t - 1
        })
        .collect();
    let every_play: Vec<usize> = (0..graph.plays.len()).collect();
    let mut run = Run {
        graph,
        ready: Readiness::new(graph, speedup, how.lanes, &every_play),
        turn_of,
        block_size,
        hash_cache: LocalHashCache::new(block_size),
        engine_ids: vec![None; total],
        node_of: Vec::with_capacity(total),
        collector: Collector::with_capacity(total),
        rejections: Vec::new(),
        done: 0,
    };
    drive(&mut cluster, &mut run, observer, total, progress)?;
    let stats = cluster.snapshot();
    let (mut report, records) = std::mem::take(&mut run.collector).finish(Duration::ZERO);
    let reused: Vec<usize> = records.iter().map(|r| r.reused_input_tokens).collect();
    let agentic = summarize_run(graph, how, run.ready, &run.engine_ids, &reused, block_size);
    add_topology_figures(&mut report, &stats, config);
    let mut rejections = run.rejections;
    rejections.sort_by_key(|r| r.id);
    Ok(ReplayOutcome {
        report,
        records,
        rejections,
        agentic: Some(agentic),
    })
}

/// The plays' outcomes and every node's record, once the run is over.
fn summarize_run(
    graph: &RequestGraph,
    how: &GraphReplay,
    ready: Readiness<'_>,
    engine_ids: &[Option<RequestId>],
    reused: &[usize],
    block_size: usize,
) -> AgenticReport {
    let mut settled = ready.finish();
    for (times, &engine_id) in settled.times.iter_mut().zip(engine_ids) {
        times.engine_id = engine_id;
        times.reused_input_tokens = engine_id
            .and_then(|id| reused.get(id.0 as usize))
            .copied()
            .unwrap_or(0);
    }
    summarize(&GraphTimes {
        graph,
        nodes: &settled.times,
        failed: &settled.failed,
        lane_of: &settled.lane_of,
        speedup: how.speedup,
        lanes: how.lanes,
        engine_block_size: block_size,
    })
}

/// One node's times as a replay measured them (on the virtual clock offline; live, on the wall
/// clock since the run started): what [`summarize`] builds the `agentic` section from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeTimes {
    /// Its floor (with lanes, from its play's lane start).
    pub(crate) floor: SimTime,
    /// The latest `T(source) + delay` over its dependencies and the index of the dependency
    /// that set it (the critical path follows it back); None for a root.
    pub(crate) due: Option<(SimTime, usize)>,
    /// When it was dispatched (sent); None if it was skipped.
    pub(crate) dispatched: Option<SimTime>,
    /// When its completion edges fired: its last token (live, the end of its stream); None if
    /// it failed or never ran.
    pub(crate) last_token: Option<SimTime>,
    /// When it ended (completed or failed).
    pub(crate) terminal: Option<SimTime>,
    /// How it failed (`rejected` offline; live, the failure's class), None otherwise.
    pub(crate) failure: Option<&'static str>,
    /// The id of its per-request record, once dispatched.
    pub engine_id: Option<RequestId>,
    /// Prompt tokens found in the prefix cache at admission.
    pub reused_input_tokens: usize,
}

/// A finished run of a graph, as [`summarize`] reads it.
#[derive(Clone, Copy, Debug)]
pub struct GraphTimes<'a> {
    /// The graph that ran.
    pub graph: &'a RequestGraph,
    /// Per node (graph order), its times.
    pub nodes: &'a [NodeTimes],
    /// Per play, its first failed node.
    pub failed: &'a [Option<usize>],
    /// Per play, the lane it held (with lanes).
    pub lane_of: &'a [Option<usize>],
    /// The divisor of floors and delays.
    pub speedup: f64,
    /// Lanes, if the run had them.
    pub lanes: Option<usize>,
    /// The engine's KV block size (for the prefix tokens a wait could keep).
    pub engine_block_size: usize,
}

/// The `agentic` section of a finished graph run: per play its outcome, makespan, critical
/// path and fan-out, and every node's record. The offline replay and `loadgen replay` build
/// their sections with it, so both report the same figures the same way.
pub fn summarize(run: &GraphTimes<'_>) -> AgenticReport {
    let graph = run.graph;
    let block_size = run.engine_block_size;
    let requests: Vec<NodeRecord> = graph
        .nodes
        .iter()
        .zip(run.nodes)
        .map(|(node, state)| NodeRecord {
            request_id: node.id().to_string(),
            play_id: graph.plays[node.play].id.clone(),
            session_id: node.session_id.clone(),
            engine_id: state.engine_id,
            parent_id: node
                .dependencies
                .iter()
                .find(|d| d.relation == Relation::Spawn)
                .map(|d| graph.nodes[d.source].id().to_string()),
            dispatched: state.dispatched,
            last_token: state.last_token,
            terminal: state.terminal,
            status: match (state.dispatched, state.failure) {
                (None, _) => NodeStatus::Skipped,
                (Some(_), Some(_)) => NodeStatus::Rejected,
                (Some(_), None) => NodeStatus::Completed,
            },
        })
        .collect();
    let ms = |t: SimTime| t.as_millis_f64();
    let plays: Vec<PlayOutcome> = graph
        .plays
        .iter()
        .enumerate()
        .map(|(p, play)| {
            let sent: Vec<usize> = play
                .nodes
                .iter()
                .copied()
                .filter(|&n| run.nodes[n].dispatched.is_some())
                .collect();
            let start = sent
                .iter()
                .filter_map(|&n| run.nodes[n].dispatched)
                .min()
                .unwrap_or(SimTime::ZERO);
            // The node that ended last (the earliest in the trace among equals).
            let end = sent
                .iter()
                .copied()
                .max_by_key(|&n| (run.nodes[n].terminal, Reverse(n)));
            let settled = end.and_then(|n| run.nodes[n].terminal).unwrap_or(start);
            let path = end
                .map(|n| critical_path(graph, run.nodes, n, start))
                .unwrap_or_default();
            let mut fan_out: HashMap<usize, usize> = HashMap::new();
            for &n in &play.nodes {
                for d in &graph.nodes[n].dependencies {
                    if d.relation == Relation::Spawn {
                        *fan_out.entry(d.source).or_insert(0) += 1;
                    }
                }
            }
            let (mut after_waits, mut lost) = (0u64, 0u64);
            for &n in &sent {
                let expected = resumable_prefix(graph, n, block_size);
                let found = run.nodes[n].reused_input_tokens;
                after_waits += expected as u64;
                lost += expected.saturating_sub(found) as u64;
            }
            let failure = run.failed.get(p).copied().flatten();
            PlayOutcome {
                play_id: play.id.clone(),
                status: if failure.is_some() {
                    "failed"
                } else {
                    "completed"
                },
                failure_request_id: failure.map(|n| graph.nodes[n].id().to_string()),
                failure_status: failure.map(|n| run.nodes[n].failure.unwrap_or("rejected")),
                requests: sent.len(),
                skipped_requests: play.nodes.len() - sent.len(),
                start_ms: ms(start),
                settled_at_ms: ms(settled),
                makespan_ms: settled.saturating_since(start).as_millis_f64(),
                critical_path_requests: path.requests,
                critical_path_model_ms: path.model.as_millis_f64(),
                critical_path_tool_wait_ms: path.tool_wait.as_millis_f64(),
                critical_path_floor_wait_ms: path.floor_wait.as_millis_f64(),
                lane: run.lane_of.get(p).copied().flatten(),
                spawn_edges: fan_out.values().sum(),
                max_fan_out: fan_out.values().copied().max().unwrap_or(0),
                prefix_tokens_after_waits: after_waits,
                prefix_tokens_lost_in_waits: lost,
            }
        })
        .collect();
    AgenticReport {
        input_format: graph.format.name().to_string(),
        block_size: graph.block_size,
        speedup: run.speedup,
        lanes: run.lanes,
        source: graph.source.clone(),
        node_count: graph.nodes.len(),
        skipped_requests: requests
            .iter()
            .filter(|r| r.status == NodeStatus::Skipped)
            .count(),
        play_count: graph.plays.len(),
        completed_plays: plays.iter().filter(|p| p.status == "completed").count(),
        failed_plays: plays.iter().filter(|p| p.status == "failed").count(),
        trajectory: TrajectoryFigures::of(
            plays
                .iter()
                .map(|p| (p.status == "completed", p.makespan_ms)),
        ),
        plays,
        requests,
    }
}

/// Prompt tokens of node `n` the engine could find cached from a completion dependency's
/// source: the longest common hash-id prefix over those sources, in tokens, cut to full engine
/// blocks and to the blocks before the prompt's last token (a fully cached prompt recomputes
/// its last block).
fn resumable_prefix(graph: &RequestGraph, n: usize, block_size: usize) -> usize {
    let node = &graph.nodes[n].request;
    let tokens = graph.nodes[n]
        .dependencies
        .iter()
        .filter(|d| d.trigger == Trigger::Completion)
        .map(|d| {
            let source = &graph.nodes[d.source].request;
            let common = node
                .hash_ids
                .iter()
                .zip(&source.hash_ids)
                .take_while(|(a, b)| a == b)
                .count();
            (common * graph.block_size)
                .min(node.input_length)
                .min(source.input_length)
        })
        .max()
        .unwrap_or(0);
    let block_size = block_size.max(1);
    let cacheable = node.input_length.saturating_sub(1) / block_size * block_size;
    (tokens / block_size * block_size).min(cacheable)
}

/// A play's critical path in parts that add up to its makespan.
#[derive(Default)]
struct CriticalPath {
    requests: usize,
    model: SimDuration,
    tool_wait: SimDuration,
    floor_wait: SimDuration,
}

/// Walks back from `end` through the dependency that set each node's ready time: the engine's
/// time of each node up to the point its successor waited on (its last token, or its dispatch
/// for a dispatch trigger), the delays between, and the floor wait of the first node.
fn critical_path(
    graph: &RequestGraph,
    nodes: &[NodeTimes],
    end: usize,
    start: SimTime,
) -> CriticalPath {
    let mut path = CriticalPath::default();
    let mut node = end;
    let Some(mut until) = nodes[end].terminal else {
        return path;
    };
    loop {
        path.requests += 1;
        let state = &nodes[node];
        let Some(dispatched) = state.dispatched else {
            return path;
        };
        path.model += until.saturating_since(dispatched);
        let floor = state.floor;
        match state.due {
            Some((due, k)) if due >= floor => {
                let Some(dep) = graph.nodes[node].dependencies.get(k) else {
                    return path;
                };
                let source = &nodes[dep.source];
                let t = match dep.trigger {
                    Trigger::Dispatch => source.dispatched,
                    Trigger::Completion => source.last_token,
                };
                let Some(t) = t else {
                    return path;
                };
                path.tool_wait += dispatched.saturating_since(t);
                until = t;
                node = dep.source;
            }
            _ => {
                path.floor_wait = dispatched.saturating_since(start);
                return path;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ClusterConfig;
    use crate::trace::{parse_graph, TraceFormat};

    /// One aggregated worker with the mocker's defaults (polynomial timing, KV block 64), as in
    /// the reference's worked example.
    fn config() -> ReplayConfig {
        ReplayConfig {
            cluster: ClusterConfig {
                num_workers: 1,
                ..ClusterConfig::default()
            },
            trace_block_size: 64,
        }
    }

    fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/agentic/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).expect("fixture")
    }

    fn run(text: &str, format: TraceFormat, speedup: f64) -> ReplayOutcome {
        let graph = parse_graph(text.as_bytes(), "t.jsonl", format, 512).expect("parses");
        let how = GraphReplay {
            speedup,
            lanes: None,
        };
        replay_graph(&graph, &config(), &how, |_, _| {}, &mut ()).expect("replays")
    }

    /// (dispatch, last token) of each node, in ns.
    fn times_ns(outcome: &ReplayOutcome) -> Vec<(String, u64, u64)> {
        let agentic = outcome.agentic.as_ref().expect("an agentic section");
        agentic
            .requests
            .iter()
            .map(|r| {
                (
                    r.request_id.clone(),
                    r.dispatched.expect("dispatched").as_nanos(),
                    r.last_token.expect("completed").as_nanos(),
                )
            })
            .collect()
    }

    /// (dispatch, last token) of each node, in whole µs (rounded down).
    fn times(outcome: &ReplayOutcome) -> Vec<(String, u64, u64)> {
        let agentic = outcome.agentic.as_ref().expect("an agentic section");
        agentic
            .requests
            .iter()
            .map(|r| {
                (
                    r.request_id.clone(),
                    r.dispatched.expect("dispatched").as_micros(),
                    r.last_token.expect("completed").as_micros(),
                )
            })
            .collect()
    }

    /// Nodes ready at the same instant are sent in `request_id` order, not file order, as
    /// AISimulate sends them (round-robin placement follows that order).
    #[test]
    fn nodes_ready_together_are_sent_in_request_id_order() {
        let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64,"hash_id_scope":"local","source":{"format":"hand","digest":"x"}}"#;
        let row = |id: &str, len: usize, first_hash: u64| {
            let hashes: Vec<String> = (0..len.div_ceil(64) as u64)
                .map(|h| (first_hash + h).to_string())
                .collect();
            format!(
                r#"{{"request_id":"{id}","play_id":"p{id}","session_id":"s","model":"M","input_length":{len},"output_length":2,"hash_ids":[{}],"not_before_ms":0,"dependencies":[]}}"#,
                hashes.join(",")
            )
        };
        let text = [header.to_string(), row("b", 128, 10), row("a", 64, 20)].join("\n");
        let outcome = run(&text, TraceFormat::Auto, 1.0);
        let sent: Vec<usize> = outcome.records.iter().map(|r| r.input_length).collect();
        assert_eq!(sent, vec![64, 128], "a (64 tokens) first, then b");
    }

    /// The reference's section 2: r1 starts exactly 500 ms after r0's last token.
    #[test]
    fn a_completion_edge_releases_its_node_exactly_delay_after_the_last_token() {
        let outcome = run(
            &fixture("agentic_mooncake_v2.jsonl"),
            TraceFormat::Auto,
            1.0,
        );
        let t = times_ns(&outcome);
        assert_eq!(t[0].1, 0);
        // Our polynomial puts r0's last token at 60.689703 ms, as AISimulate's built-in engine
        // with polynomial timing does (its h200 engine model: 60.970771 ms); the rule on top of
        // it is the same, to the nanosecond.
        assert_eq!(t[0].2, 60_689_703);
        assert_eq!(t[1].1, t[0].2 + 500_000_000);
        // The per-request records agree: r1 arrives (and is sent) 500 ms after r0's last token.
        let r0 = &outcome.records[0];
        let r1 = &outcome.records[1];
        assert_eq!(r1.arrival_ms, r0.last_token_ms.expect("r0 ends") + 500.0);
        let agentic = outcome.agentic.as_ref().expect("agentic");
        let p0 = &agentic.plays[0];
        assert_eq!(
            (p0.status, p0.requests, p0.critical_path_requests),
            ("completed", 2, 2)
        );
        assert_eq!(p0.critical_path_tool_wait_ms, 500.0);
        assert_eq!(
            p0.critical_path_model_ms
                + p0.critical_path_tool_wait_ms
                + p0.critical_path_floor_wait_ms,
            p0.makespan_ms
        );
        assert_eq!(p0.makespan_ms, outcome.report.duration_ms);
    }

    /// The reference's section 10, start by start: spawn on dispatch, a floor that holds a
    /// dependent node back, a join, and a second play whose prompt reuses the first's blocks.
    #[test]
    fn the_worked_example_starts_every_node_at_its_ready_time() {
        let outcome = run(
            &fixture("worked_example.jsonl"),
            TraceFormat::AgenticMooncake,
            1.0,
        );
        let t = times(&outcome);
        let at = |id: &str| {
            t.iter()
                .find(|(n, ..)| n == id)
                .map(|(_, d, l)| (*d, *l))
                .expect(id)
        };
        let (r0, r1, r2, r3, q0) = (at("r0"), at("r1"), at("r2"), at("r3"), at("q0"));
        assert_eq!(r0.0, 0);
        assert_eq!(r1.0, 100_000, "dispatch(r0) + 100");
        assert_eq!(q0.0, 300_000, "floor 300");
        assert_eq!(r2.0, 1_000_000, "max(last(r0) + 200, floor 1000)");
        assert_eq!(
            r3.0,
            r2.1.max(r1.1 + 50_000),
            "max(last(r2) + 0, last(r1) + 50)"
        );
        assert_eq!(r3.0, r2.1);
        let q0_record = outcome
            .records
            .iter()
            .find(|r| r.arrival_ms == 300.0)
            .expect("q0's record");
        assert_eq!(q0_record.reused_input_tokens, 192, "ids are file-global");
        let agentic = outcome.agentic.as_ref().expect("agentic");
        assert_eq!((agentic.completed_plays, agentic.failed_plays), (2, 0));
        let p0 = &agentic.plays[0];
        assert_eq!(p0.makespan_ms, outcome.report.duration_ms);
        assert_eq!((p0.spawn_edges, p0.max_fan_out), (1, 1));
        // r3 <- r2 <- (floor): r2 was held by its floor, 1000 ms after the play's start.
        assert_eq!(p0.critical_path_requests, 2);
        assert_eq!(p0.critical_path_floor_wait_ms, 1000.0);
        assert_eq!(p0.critical_path_tool_wait_ms, 0.0);
        assert_eq!(agentic.requests[1].parent_id.as_deref(), Some("r0"));
        // Speed-up 2 halves floors and delays: r1 at 50, q0 at 150, r2 at 500.
        let fast = times(&run(
            &fixture("worked_example.jsonl"),
            TraceFormat::AgenticMooncake,
            2.0,
        ));
        let starts: Vec<u64> = fast.iter().map(|(_, d, _)| *d).collect();
        assert_eq!(&starts[..3], &[0, 50_000, 500_000]);
        assert_eq!(starts[4], 150_000);
    }

    /// At speed-up 2, `c` is released 23.013 / 2 = 11.5065 ms after `s`'s last token, which
    /// comes between 27,159.5 and 27,160 µs: at 38,666.0 to 38,666.5 µs, just before the end of
    /// a pass of `l` in the same microsecond. On the nanosecond clock `c` is queued first and
    /// the pass that starts at that end takes it. Released from times rounded to the
    /// microsecond (27,160 + 11,506.5 rounded up: 38,667 µs), it came after that pass had
    /// started and waited for the next one.
    #[test]
    fn a_release_just_before_a_pass_end_in_the_same_microsecond_joins_the_pass_after_it() {
        let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64,"hash_id_scope":"local","source":{"format":"hand","digest":"x"}}"#;
        let row = |id: &str, play: &str, len: usize, out: usize, hashes: &str, deps: &str| {
            format!(
                r#"{{"request_id":"{id}","play_id":"{play}","session_id":"s","model":"M","input_length":{len},"output_length":{out},"hash_ids":[{hashes}],"not_before_ms":0,"dependencies":[{deps}]}}"#
            )
        };
        let text = [
            header.to_string(),
            row("l", "pl", 256, 64, "1,2,3,4", ""),
            row("s", "ps", 64, 2, "10", ""),
            row(
                "c",
                "ps",
                64,
                2,
                "20",
                r#"{"request_id":"s","trigger":"completion","relation":"sequence","delay_ms":23.013}"#,
            ),
        ]
        .join("\n");
        let outcome = run(&text, TraceFormat::AgenticMooncake, 2.0);
        let t = times_ns(&outcome);
        assert!(
            (27_159_500..27_160_000).contains(&t[1].2),
            "s's last token: {t:?}"
        );
        assert_eq!(t[2].1, t[1].2 + 11_506_500, "c is due 11,506.5 µs after it");
        let c = &outcome.records[2];
        let admitted = c.first_admit_ms.expect("admitted");
        assert!(
            admitted > c.arrival_ms && admitted < 38.667,
            "admitted by the pass that starts when l's pass ends, in the same microsecond: {c:?}"
        );
    }

    /// A node the engine rejects fails its play: the play's nodes not yet sent are skipped,
    /// and the other play runs on.
    #[test]
    fn a_rejected_node_fails_its_play_and_skips_the_rest() {
        let mut graph = parse_graph(
            fixture("worked_example.jsonl").as_bytes(),
            "t",
            TraceFormat::AgenticMooncake,
            64,
        )
        .expect("parses");
        // r2 asks for more output than any context holds.
        graph.nodes[2].request.output_length = 1 << 30;
        let outcome = replay_graph(
            &graph,
            &config(),
            &GraphReplay::default(),
            |_, _| {},
            &mut (),
        )
        .expect("replays");
        let agentic = outcome.agentic.as_ref().expect("agentic");
        let status: Vec<NodeStatus> = agentic.requests.iter().map(|r| r.status).collect();
        assert_eq!(
            status,
            [
                NodeStatus::Completed,
                NodeStatus::Completed,
                NodeStatus::Rejected,
                NodeStatus::Skipped,
                NodeStatus::Completed
            ]
        );
        let p0 = &agentic.plays[0];
        assert_eq!(p0.status, "failed");
        assert_eq!(p0.failure_request_id.as_deref(), Some("r2"));
        assert_eq!((p0.requests, p0.skipped_requests), (3, 1));
        assert_eq!((agentic.completed_plays, agentic.failed_plays), (1, 1));
        assert_eq!(
            outcome.report.num_requests, 4,
            "skipped nodes are not requests"
        );
        assert_eq!(outcome.rejections.len(), 1);
        assert_eq!(outcome.rejections[0].line, 4);
    }

    /// The reference's weka example: with no `api_time` the recorded gap (1 s) is counted from
    /// the first request's start, so the second starts 1000 ms after the first one's last token.
    #[test]
    fn a_weka_request_waits_for_its_predecessor_plus_the_recorded_gap() {
        let outcome = run(&fixture("weka.jsonl"), TraceFormat::Weka, 1.0);
        let t = times(&outcome);
        assert_eq!(t[0].1, 0);
        assert_eq!(t[0].2, 60_689, "60.689703 ms");
        assert_eq!(
            times_ns(&outcome)[1].1,
            times_ns(&outcome)[0].2 + 1_000_000_000
        );
        let auto = run(&fixture("weka.jsonl"), TraceFormat::Auto, 1.0);
        assert_eq!(times(&auto), t, "detected as weka");
        // Sub-agents, worker streams and joins run to the end; every play completes.
        let outcome = run(&fixture("weka_subagent.json"), TraceFormat::Auto, 1.0);
        let agentic = outcome.agentic.as_ref().expect("agentic");
        assert_eq!(agentic.input_format, "weka");
        assert_eq!((agentic.completed_plays, agentic.node_count), (2, 6));
        assert_eq!(agentic.plays[0].spawn_edges, 2);
        assert_eq!(agentic.plays[1].start_ms, 0.0, "every play starts at 0");
    }

    /// A request trace: the child session starts 50 ms after the parent's first request is
    /// sent; the parent's next request waits 300 ms after its predecessor's last token and
    /// 100 ms after the child's.
    #[test]
    fn a_dynamo_request_trace_replays_its_sessions_spawns_and_joins() {
        let outcome = run(
            &fixture("dynamo_request_trace.jsonl"),
            TraceFormat::Auto,
            1.0,
        );
        let t = times(&outcome);
        assert_eq!(t[0].1, 0);
        assert_eq!(t[1].1, 50_000);
        assert_eq!(t[2].1, (t[0].2 + 300_000).max(t[1].2 + 100_000));
        let agentic = outcome.agentic.as_ref().expect("agentic");
        assert_eq!(agentic.input_format, "dynamo");
        assert_eq!(agentic.requests[1].parent_id.as_deref(), Some("ps"));
    }

    /// The reference's lanes example: with one lane, p0 runs as without lanes and q0 waits
    /// for p0 to settle, ignoring its floor; with two, each play starts at 0.
    #[test]
    fn with_one_lane_the_second_play_starts_when_the_first_settles() {
        let text = fixture("worked_example.jsonl");
        let graph = parse_graph(text.as_bytes(), "w", TraceFormat::Auto, 64).expect("parses");
        let free = times(&run(&text, TraceFormat::Auto, 1.0));
        let lanes = |n: usize| {
            let how = GraphReplay {
                speedup: 1.0,
                lanes: Some(n),
            };
            replay_graph(&graph, &config(), &how, |_, _| {}, &mut ()).expect("replays")
        };
        let one = lanes(1);
        let t = times(&one);
        assert_eq!(t[..4], free[..4], "p0 is unchanged");
        assert_eq!(t[4].1, t[3].2, "q0 starts when r3, p0's last node, ends");
        let agentic = one.agentic.as_ref().expect("agentic");
        assert_eq!(agentic.lanes, Some(1));
        assert_eq!(
            (agentic.plays[0].lane, agentic.plays[1].lane),
            (Some(0), Some(0))
        );
        let two = times(&lanes(2));
        assert_eq!(two[4].1, 0, "q0's floor counts from its lane's start");
        // source_play_ordinal puts p1 first: q0 starts at 0, p0 when q0 ends.
        let ordered = text
            .replace(
                "\"play_id\":\"p0\",",
                "\"play_id\":\"p0\",\"source_play_ordinal\":1,",
            )
            .replace(
                "\"play_id\":\"p1\",",
                "\"play_id\":\"p1\",\"source_play_ordinal\":0,",
            );
        let graph = parse_graph(ordered.as_bytes(), "w", TraceFormat::Auto, 64).expect("parses");
        let how = GraphReplay {
            speedup: 1.0,
            lanes: Some(1),
        };
        let outcome = replay_graph(&graph, &config(), &how, |_, _| {}, &mut ()).expect("replays");
        let t = times(&outcome);
        assert_eq!(t[4].1, 0);
        assert_eq!(t[0].1, t[4].2, "r0 starts when q0 ends");
        let zero = GraphReplay {
            speedup: 1.0,
            lanes: Some(0),
        };
        assert!(matches!(
            replay_graph(&graph, &config(), &zero, |_, _| {}, &mut ()),
            Err(ReplayError::Lanes)
        ));
    }

    /// An applied-compute session: each turn starts its tool call's latency after the last
    /// token of the turn before, and reuses that turn's prompt blocks.
    #[test]
    fn an_applied_compute_session_waits_for_each_tool_call() {
        let text = fixture("applied_compute_agentic.jsonl");
        let graph = parse_graph(text.as_bytes(), "a", TraceFormat::Auto, 64).expect("parses");
        let outcome = replay_graph(
            &graph,
            &config(),
            &GraphReplay::default(),
            |_, _| {},
            &mut (),
        )
        .expect("replays");
        let t = times(&outcome);
        assert_eq!(t[0].1, 0);
        assert_eq!(t[1].1, t[0].2 + 500_000);
        assert_eq!(t[2].1, t[1].2 + 1_250_000);
        let reused: Vec<usize> = outcome
            .records
            .iter()
            .map(|r| r.reused_input_tokens)
            .collect();
        assert_eq!(reused, [0, 256, 320]);
    }

    /// The KV cost of a wait: r1 shares r0's four blocks, but while p0 waits 500 ms another
    /// play fills the eight-block cache and evicts them: r1 recomputes them.
    #[test]
    fn blocks_evicted_during_a_wait_are_counted() {
        let text = fixture("agentic_mooncake_v2.jsonl");
        let evictor = r#"{"request_id":"x0","play_id":"p1","session_id":"x","model":"M","input_length":448,"output_length":8,"hash_ids":[70,71,72,73,74,75,76],"not_before_ms":100,"dependencies":[]}"#;
        let graph = parse_graph(
            format!("{text}{evictor}\n").as_bytes(),
            "t",
            TraceFormat::Auto,
            64,
        )
        .expect("parses");
        let mut small = config();
        small.cluster.engine.num_gpu_blocks = 8;
        let outcome = replay_graph(&graph, &small, &GraphReplay::default(), |_, _| {}, &mut ())
            .expect("replays");
        let p0 = &outcome.agentic.as_ref().expect("agentic").plays[0];
        assert_eq!(p0.prefix_tokens_after_waits, 256);
        assert_eq!(p0.prefix_tokens_lost_in_waits, 256);
        // With room for everything, nothing is lost.
        let outcome = replay_graph(
            &graph,
            &config(),
            &GraphReplay::default(),
            |_, _| {},
            &mut (),
        )
        .expect("replays");
        let p0 = &outcome.agentic.as_ref().expect("agentic").plays[0];
        assert_eq!(
            (p0.prefix_tokens_after_waits, p0.prefix_tokens_lost_in_waits),
            (256, 0)
        );
    }

    /// The reference's delta example: turn 2 (238 tokens) finds turn 1's three full blocks
    /// (192 tokens) cached; each turn starts its delay after the last token of the one before.
    #[test]
    fn mooncake_delta_turns_reuse_the_history_they_repeat() {
        let text = fixture("mooncake_delta.jsonl");
        let graph =
            parse_graph(text.as_bytes(), "d", TraceFormat::MooncakeDelta, 64).expect("parses");
        let outcome = replay_graph(
            &graph,
            &config(),
            &GraphReplay::default(),
            |_, _| {},
            &mut (),
        )
        .expect("replays");
        let inputs: Vec<usize> = outcome.records.iter().map(|r| r.input_length).collect();
        assert_eq!(inputs, [128, 200, 238]);
        let reused: Vec<usize> = outcome
            .records
            .iter()
            .map(|r| r.reused_input_tokens)
            .collect();
        assert_eq!(reused, [0, 128, 192]);
        let t = times(&outcome);
        assert_eq!(t[1].1, t[0].2 + 100_000);
        assert_eq!(t[2].1, t[1].2 + 250_000);
    }

    /// Seeded mutations of every agentic fixture (bytes dropped, digits changed, spans
    /// repeated) read as every graph format: an error or a graph, never a panic; and every
    /// small graph that reads replays to the end.
    #[test]
    fn mutated_traces_are_errors_or_graphs_that_replay() {
        use rand::{Rng, SeedableRng};
        let dir = format!("{}/fixtures/agentic", env!("CARGO_MANIFEST_DIR"));
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("fixtures")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        let formats = [
            TraceFormat::Auto,
            TraceFormat::AgenticMooncake,
            TraceFormat::Weka,
            TraceFormat::Dynamo,
            TraceFormat::AppliedComputeAgentic,
            TraceFormat::MooncakeDelta,
        ];
        let (mut graphs, mut errors) = (0, 0);
        for (k, path) in names.iter().enumerate() {
            let text = std::fs::read(path).expect("fixture");
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(k as u64);
            for _ in 0..60 {
                let mut bytes = text.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let at = rng.gen_range(0..bytes.len());
                    match rng.gen_range(0..4) {
                        0 => {
                            bytes.remove(at);
                        }
                        1 => bytes[at] = b"0123456789-.e"[rng.gen_range(0..13)],
                        2 => {
                            let end = (at + rng.gen_range(1..40)).min(bytes.len());
                            let span = bytes[at..end].to_vec();
                            bytes.splice(at..at, span);
                        }
                        _ => bytes[at] = b"{}[],:\"\n "[rng.gen_range(0..9)],
                    }
                }
                for format in formats {
                    match parse_graph(&bytes[..], "m", format, 64) {
                        Ok(graph) => {
                            graphs += 1;
                            let tokens: usize =
                                graph.nodes.iter().map(|n| n.request.input_length).sum();
                            if tokens > 20_000 {
                                continue;
                            }
                            let outcome = replay_graph(
                                &graph,
                                &config(),
                                &GraphReplay::default(),
                                |_, _| {},
                                &mut (),
                            )
                            .expect("a graph that reads replays");
                            let agentic = outcome.agentic.expect("agentic");
                            assert_eq!(
                                agentic.completed_plays + agentic.failed_plays,
                                agentic.play_count
                            );
                        }
                        Err(_) => errors += 1,
                    }
                }
            }
        }
        assert!(
            graphs > 100 && errors > 100,
            "{graphs} graphs, {errors} errors"
        );
    }

    #[test]
    fn the_same_graph_gives_the_same_report() {
        let text = fixture("worked_example.jsonl");
        let a = run(&text, TraceFormat::Auto, 1.0);
        let b = run(&text, TraceFormat::Auto, 1.0);
        assert_eq!(a.report, b.report);
        assert_eq!(a.agentic, b.agentic);
    }
}
