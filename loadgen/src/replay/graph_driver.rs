//! The scheduler of a live agentic replay: one task that holds a request graph's ready queue
//! and sends each node when its dependencies allow, on the wall clock.
//!
//! The rule is the offline replay's (`servesim::replay::replay_graph`), with milliseconds since
//! the run started in place of virtual time: a node is due at `max(floor, max over its
//! dependencies of T(source) + delay_ms / speedup)`, where `T` is the moment the source was
//! sent (dispatch trigger) or the moment its stream ended (completion trigger: its last token
//! and the end of the stream arrive together), and `floor = (not_before_ms - M) / speedup`.
//! Tool waits are real waits; sub-agents are requests in flight at once. A node whose request
//! fails (an HTTP error, a broken stream, a timeout, a cancellation) fails its play: the play's
//! nodes not yet sent are skipped, those in flight finish. With lanes, plays queue as offline
//! and a play that gets its lane at `S` has floors `S + (not_before_ms - R) / speedup`.
//!
//! Each request is a task of its own (so a slow stream never holds the queue), started a little
//! before the node is due ([`PACER_LEAD`], as the driver's pacer does) to build its body; it
//! tells the scheduler when it was sent and what came back, over a channel. Every request is
//! recorded as a driver [`Sample`] (scheduled = due time, sent, in-flight cap wait, response), so the live
//! report is built by the same code as for every other mode; [`GraphOutput::times`] holds what
//! `servesim::replay::summarize` needs for the `agentic` section.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use servesim::replay::NodeTimes;
use servesim::time::{SimDuration, SimTime};
use servesim::trace::{RequestGraph, Trigger};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use crate::client::{self, Endpoint};
use crate::driver::{aborted, is_aborted, DriverConfig, Sample, PACER_LEAD};
use crate::error::LoadgenError;
use crate::prompt::PromptSynth;
use crate::target::{request_body, Api};

/// What the requests of a graph are made of, beyond the graph itself.
#[derive(Clone)]
pub struct GraphPlan {
    /// The validated graph (prompts already scoped by the lowering).
    pub graph: Arc<RequestGraph>,
    /// Turns hash ids into prompt text (the graph's block size per id).
    pub synth: Arc<PromptSynth>,
    /// The model every request names.
    pub model: Arc<str>,
    /// The route requests go to.
    pub api: Api,
    /// Divides floors and dependency delays (finite, > 0).
    pub speedup: f64,
    /// Plays at once, each in a lane taken from a queue; None runs every play by its floors.
    pub lanes: Option<usize>,
    /// The plays to run (a shard's); the others are neither sent nor skipped.
    pub plays: Vec<usize>,
    /// Ask for the serving worker (`nvext.extra_fields`; off with `--no-worker-id`).
    pub ask_worker_id: bool,
}

/// What [`drive_graph`] returns.
#[derive(Debug)]
pub struct GraphOutput {
    /// One per request sent, in send order; `session` is the node's index in the graph and
    /// `turn` its position in its conversation.
    pub samples: Vec<Sample>,
    /// Per node, its times (µs since the run start); `engine_id` and `reused_input_tokens`
    /// are the caller's to fill from the report's records.
    pub times: Vec<NodeTimes>,
    /// Per play, its first failed node.
    pub failed: Vec<Option<usize>>,
    /// Per play, the lane it held (with lanes).
    pub lane_of: Vec<Option<usize>>,
    /// The wall-clock time of the run start.
    pub started_at: std::time::SystemTime,
    /// The run was stopped early through [`DriverConfig::abort`].
    pub aborted: bool,
}

/// What a request task tells the scheduler.
enum Event {
    /// The node's request was handed to the HTTP client at this offset (µs).
    Sent { node: usize, at_us: u64 },
    /// The node was not sent: its play failed (or the run stopped) while it waited for the
    /// in-flight cap.
    Skipped { node: usize },
    /// The node's request ended (completed or failed).
    Done { node: usize, sample: Box<Sample> },
}

/// State the request tasks share.
struct Shared {
    plan: GraphPlan,
    endpoint: Endpoint,
    /// `endpoint.url` parsed once (None: sent as text, reqwest reports it).
    url: Option<reqwest::Url>,
    start: Instant,
    cap: Option<Arc<Semaphore>>,
    seq: AtomicU64,
    /// Per play, whether it failed (a task waiting for the cap checks it before sending).
    play_failed: Vec<AtomicBool>,
    /// Per node, its position in its conversation.
    turn_of: Vec<usize>,
    config: DriverConfig,
}

fn since(start: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(start).as_micros() as u64
}

/// Sends node `node` (due at `due_us`) and reports to the scheduler.
async fn send_node(
    shared: Arc<Shared>,
    node: usize,
    due_us: u64,
    tx: mpsc::UnboundedSender<Event>,
) {
    let graph = &shared.plan.graph;
    let request = &graph.nodes[node].request;
    let play = graph.nodes[node].play;
    let text = shared
        .plan
        .synth
        .prompt(&request.hash_ids, request.input_length);
    let body = request_body(
        shared.plan.api,
        &shared.plan.model,
        text,
        request.output_length,
        shared.plan.ask_worker_id,
    );
    let abort = &shared.config.abort;
    // Spawned up to `PACER_LEAD` early: the body is built before the node is due.
    tokio::select! {
        biased;
        _ = aborted(abort.clone()) => {}
        _ = tokio::time::sleep_until(shared.start + Duration::from_micros(due_us)) => {}
    }
    let before_cap = Instant::now();
    let permit = match &shared.cap {
        Some(s) => tokio::select! {
            biased;
            _ = aborted(abort.clone()) => None,
            p = s.clone().acquire_owned() => p.ok(),
        },
        None => None,
    };
    if shared.play_failed[play].load(Ordering::Acquire) || is_aborted(abort) {
        let _ = tx.send(Event::Skipped { node });
        return;
    }
    let sent = Instant::now();
    let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
    if let Some(counter) = &shared.config.sent {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    let sent_us = since(shared.start, sent);
    // A closed channel means the scheduler is gone; the request is still measured.
    let _ = tx.send(Event::Sent {
        node,
        at_us: sent_us,
    });
    let mut response = tokio::select! {
        biased;
        _ = aborted(abort.clone()) => client::cancelled(sent),
        r = async {
            match &shared.url {
                Some(url) => client::send_to(&shared.endpoint, url, &body).await,
                None => client::send(&shared.endpoint, &body).await,
            }
        } => r,
    };
    drop(permit);
    response.content = String::new();
    let sample = Sample {
        session: node,
        turn: shared.turn_of[node],
        seq,
        scheduled_us: due_us,
        sent_us,
        cap_wait_us: sent.saturating_duration_since(before_cap).as_micros() as u64,
        response,
    };
    if let Some(bar) = &shared.config.bar {
        bar.inc(1);
    }
    if let Some(observe) = &shared.config.observer {
        observe(&sample);
    }
    let _ = tx.send(Event::Done {
        node,
        sample: Box::new(sample),
    });
}

/// The scheduler's bookkeeping (times in µs since the run start).
struct Graph<'a> {
    graph: &'a RequestGraph,
    speedup: f64,
    times: Vec<NodeTimes>,
    /// Per node, dependencies not yet fired.
    waiting: Vec<usize>,
    /// Per node, the (child, dependency index) edges its send and its end release.
    on_dispatch: Vec<Vec<(usize, usize)>>,
    on_completion: Vec<Vec<(usize, usize)>>,
    /// Nodes due at a time, earliest first; ties in the order they became due.
    ready: BinaryHeap<Reverse<(u64, u64, usize)>>,
    next_seq: u64,
    failed: Vec<Option<usize>>,
    queue: VecDeque<usize>,
    lane_of: Vec<Option<usize>>,
    in_flight: Vec<usize>,
    ended: Vec<usize>,
    settled: Vec<bool>,
}

impl Graph<'_> {
    fn schedule(&mut self, node: usize, at_us: u64) {
        self.ready.push(Reverse((at_us, self.next_seq, node)));
        self.next_seq += 1;
    }

    /// Dependency `dep` of `child` fired at `t` (its source's send or end).
    fn fire(&mut self, child: usize, dep: usize, t: SimTime) {
        let d = &self.graph.nodes[child].dependencies[dep];
        let due = t + SimDuration::from_millis_f64(d.delay_ms / self.speedup);
        let state = &mut self.times[child];
        if state.due.is_none_or(|(at, _)| due > at) {
            state.due = Some((due, dep));
        }
        self.waiting[child] = self.waiting[child].saturating_sub(1);
        if self.waiting[child] == 0 {
            let at = state.floor.max(state.due.map_or(due, |(at, _)| at));
            self.schedule(child, at.0);
        }
    }

    /// Play `play` gets lane `lane` at `now`: floors from `now`, roots scheduled.
    fn start_play(&mut self, play: usize, lane: usize, now: SimTime) {
        let graph = self.graph;
        let nodes = &graph.plays[play].nodes;
        self.lane_of[play] = Some(lane);
        let r = nodes
            .iter()
            .filter(|&&n| graph.nodes[n].dependencies.is_empty())
            .map(|&n| graph.nodes[n].not_before_ms)
            .fold(f64::INFINITY, f64::min);
        for &n in nodes {
            let offset = (graph.nodes[n].not_before_ms - r) / self.speedup;
            self.times[n].floor = now + SimDuration::from_millis_f64(offset);
            if graph.nodes[n].dependencies.is_empty() {
                self.schedule(n, self.times[n].floor.0);
            }
        }
    }

    fn sent(&mut self, node: usize, at: SimTime) {
        self.in_flight[self.graph.nodes[node].play] += 1;
        self.times[node].dispatched = Some(at);
        for k in 0..self.on_dispatch[node].len() {
            let (child, dep) = self.on_dispatch[node][k];
            self.fire(child, dep, at);
        }
    }

    /// Node `node` ended at `end` (failed with `failure`, if given).
    fn done(&mut self, node: usize, end: SimTime, failure: Option<&'static str>) {
        let play = self.graph.nodes[node].play;
        self.times[node].terminal = Some(end);
        match failure {
            Some(kind) => {
                self.times[node].failure = Some(kind);
                self.failed[play].get_or_insert(node);
            }
            None => {
                self.times[node].last_token = Some(end);
                for k in 0..self.on_completion[node].len() {
                    let (child, dep) = self.on_completion[node][k];
                    self.fire(child, dep, end);
                }
            }
        }
        self.in_flight[play] = self.in_flight[play].saturating_sub(1);
        self.ended[play] += 1;
        self.maybe_settle(play, end);
    }

    /// A node of `play` was skipped at the cap (never sent).
    fn skipped(&mut self, node: usize, now: SimTime) {
        let play = self.graph.nodes[node].play;
        self.maybe_settle(play, now);
    }

    /// When `play` has settled (every node ended, or after a failure none is in flight), its
    /// lane takes the next play waiting.
    fn maybe_settle(&mut self, play: usize, now: SimTime) {
        let all = self.ended[play] == self.graph.plays[play].nodes.len();
        let failed_and_idle = self.failed[play].is_some() && self.in_flight[play] == 0;
        if self.settled[play] || !(all || failed_and_idle) {
            return;
        }
        self.settled[play] = true;
        if let Some(lane) = self.lane_of[play] {
            if let Some(next) = self.queue.pop_front() {
                self.start_play(next, lane, now);
            }
        }
    }
}

/// Runs `plan` against `endpoint` to the end: every node of its plays sent when due, or
/// skipped after its play failed. `config`'s in-flight cap, progress bar, observer, abort and
/// sent counter apply as in [`crate::driver::drive`] (`stop_after` does not).
pub async fn drive_graph(
    endpoint: Endpoint,
    plan: GraphPlan,
    config: &DriverConfig,
) -> Result<GraphOutput, LoadgenError> {
    if config.max_in_flight == Some(0) {
        return Err(LoadgenError::Config(
            "the in-flight cap must be positive".into(),
        ));
    }
    if plan.lanes == Some(0) {
        return Err(LoadgenError::Config(
            "the number of lanes must be positive".into(),
        ));
    }
    let speedup = plan.speedup;
    if !(speedup.is_finite() && speedup > 0.0) {
        return Err(LoadgenError::Config(format!(
            "the speed-up must be finite and above 0, got {speedup}"
        )));
    }
    let graph = plan.graph.clone();
    let total = graph.nodes.len();
    let mut on_dispatch = vec![Vec::new(); total];
    let mut on_completion = vec![Vec::new(); total];
    let mut waiting = vec![0; total];
    for (child, node) in graph.nodes.iter().enumerate() {
        waiting[child] = node.dependencies.len();
        for (k, dep) in node.dependencies.iter().enumerate() {
            match dep.trigger {
                Trigger::Dispatch => on_dispatch[dep.source].push((child, k)),
                Trigger::Completion => on_completion[dep.source].push((child, k)),
            }
        }
    }
    let mut turns: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let turn_of: Vec<usize> = graph
        .nodes
        .iter()
        .map(|n| {
            let t = turns.entry(n.session_id.as_str()).or_insert(0);
            *t += 1;
            *t - 1
        })
        .collect();
    let plays = graph.plays.len();
    let mut state = Graph {
        graph: &graph,
        speedup,
        times: (0..total)
            .map(|n| NodeTimes {
                floor: SimTime::ZERO + graph.floor(n, speedup),
                ..NodeTimes::default()
            })
            .collect(),
        waiting,
        on_dispatch,
        on_completion,
        ready: BinaryHeap::new(),
        next_seq: 0,
        failed: vec![None; plays],
        queue: VecDeque::new(),
        lane_of: vec![None; plays],
        in_flight: vec![0; plays],
        ended: vec![0; plays],
        settled: vec![false; plays],
    };
    let mut owned = plan.plays.clone();
    owned.retain(|&p| p < plays);
    match plan.lanes {
        None => {
            for &p in &owned {
                for &n in &graph.plays[p].nodes {
                    if graph.nodes[n].dependencies.is_empty() {
                        state.schedule(n, state.times[n].floor.0);
                    }
                }
            }
        }
        Some(lanes) => {
            owned.sort_by(|&a, &b| {
                let (a, b) = (&graph.plays[a], &graph.plays[b]);
                (a.ordinal, &a.id).cmp(&(b.ordinal, &b.id))
            });
            state.queue = owned.into();
            for lane in 0..lanes {
                let Some(play) = state.queue.pop_front() else {
                    break;
                };
                state.start_play(play, lane, SimTime::ZERO);
            }
        }
    }
    let start = Instant::now();
    let started_at = std::time::SystemTime::now();
    let shared = Arc::new(Shared {
        url: reqwest::Url::parse(&endpoint.url).ok(),
        endpoint,
        start,
        cap: config.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
        seq: AtomicU64::new(0),
        play_failed: (0..plays).map(|_| AtomicBool::new(false)).collect(),
        turn_of,
        config: config.clone(),
        plan,
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    // The request tasks: a task lost to a panic (it never reports) ends the run with an error.
    let mut tasks = tokio::task::JoinSet::new();
    let mut pending = 0usize;
    let mut samples: Vec<Sample> = Vec::new();
    let mut stopped = false;
    loop {
        // Send everything due (a node of a failed play is skipped); a task starts up to
        // `PACER_LEAD` early to build its body, then waits for the exact time.
        let horizon_us = since(start, Instant::now() + PACER_LEAD);
        while let Some(&Reverse((due, _, n))) = state.ready.peek() {
            if due > horizon_us {
                break;
            }
            state.ready.pop();
            if state.failed[graph.nodes[n].play].is_some() {
                continue;
            }
            pending += 1;
            tasks.spawn(send_node(shared.clone(), n, due, tx.clone()));
        }
        if state.ready.is_empty() && pending == 0 {
            break;
        }
        let next_due = state.ready.peek().map(|Reverse((due, ..))| {
            (start + Duration::from_micros(*due))
                .checked_sub(PACER_LEAD)
                .unwrap_or(start)
        });
        let event = tokio::select! {
            biased;
            _ = aborted(config.abort.clone()), if !stopped => {
                stopped = true;
                state.ready.clear();
                continue;
            }
            event = rx.recv() => event,
            Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = joined {
                    return Err(LoadgenError::Embedded(format!(
                        "a request task of the graph replay failed: {e}"
                    )));
                }
                continue;
            }
            _ = async {
                match next_due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending::<()>().await,
                }
            } => continue,
        };
        // The scheduler holds a sender: the channel never closes under it.
        let Some(event) = event else { break };
        match event {
            Event::Sent { node, at_us } => state.sent(node, SimTime(at_us)),
            Event::Skipped { node } => {
                pending = pending.saturating_sub(1);
                state.skipped(node, SimTime(since(start, Instant::now())));
            }
            Event::Done { node, sample } => {
                pending = pending.saturating_sub(1);
                let failure = sample.response.failure.as_ref().map(|f| f.kind());
                let end = SimTime(sample.end_us());
                if failure.is_some() {
                    let play = graph.nodes[node].play;
                    shared.play_failed[play].store(true, Ordering::Release);
                }
                state.done(node, end, failure);
                samples.push(*sample);
            }
        }
    }
    samples.sort_by_key(|s| s.seq);
    Ok(GraphOutput {
        samples,
        times: state.times,
        failed: state.failed,
        lane_of: state.lane_of,
        started_at,
        aborted: is_aborted(&config.abort),
    })
}
