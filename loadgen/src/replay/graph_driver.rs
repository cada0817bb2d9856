//! The scheduler of a live agentic replay: one task that holds a request graph's ready queue
//! and sends each node when its dependencies allow, on the wall clock.
//!
//! When a node is due is `servesim::replay::Readiness`'s rule, the offline replay's, driven
//! here in microseconds since the run started: dispatch edges fire when a request is handed to
//! the HTTP client, completion edges when its stream ends (its last token and the end of the
//! stream arrive together); nodes due at the same instant go in `request_id` order, each sent
//! once the one before it has its response headers (a server that admits a request before
//! answering its headers, as mockserve does, has admitted it then) or after
//! [`crate::driver::TIE_WAIT`] at the latest, so the server admits them in the offline replay's
//! order without a server slow to answer headers sending them one at a time. Unstreamed
//! embeddings go unordered (their headers come with the whole answer).
//!
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use servesim::replay::{NodeTimes, Readiness};
use servesim::time::SimTime;
use servesim::trace::RequestGraph;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use crate::client::{self, Endpoint};
use crate::driver::{aborted, is_aborted, DriverConfig, Sample, TieOrder, PACER_LEAD};
use crate::error::LoadgenError;
use crate::run::prompt::PromptSynth;
use crate::target::{request_body, Api};

/// What the requests of a graph are made of, beyond the graph itself.
#[derive(Clone)]
pub(crate) struct GraphPlan {
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
    /// `--lora-mix`: play p's requests name `lora.model(p)` instead of `model`.
    pub lora: Option<Arc<crate::run::lora::LoraTraffic>>,
}

/// What [`drive_graph`] returns.
#[derive(Debug)]
pub(crate) struct GraphOutput {
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

/// A time on the run's clock (microseconds since it started) as [`Readiness`] takes it.
fn wall(us: u64) -> SimTime {
    SimTime::from_micros(us)
}

/// A time [`Readiness`] gave, to the nearest microsecond of the run's clock.
fn nearest_us(t: SimTime) -> u64 {
    t.as_nanos().saturating_add(500) / 1_000
}

/// Sends node `node` (due at `due_us`, after the node tied with it before it in `tie`) and
/// reports to the scheduler.
async fn send_node(
    shared: Arc<Shared>,
    node: usize,
    due_us: u64,
    mut tie: TieOrder,
    tx: mpsc::UnboundedSender<Event>,
) {
    let graph = &shared.plan.graph;
    let request = &graph.nodes[node].request;
    let play = graph.nodes[node].play;
    let text = shared
        .plan
        .synth
        .prompt(&request.hash_ids, request.input_length);
    let model = match &shared.plan.lora {
        Some(lora) => lora.model(play),
        None => &shared.plan.model,
    };
    let body = request_body(
        shared.plan.api,
        model,
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
    // A stopped run skips the node below (its admission is dropped: the next tied node goes).
    let tie_wait = tie.wait_turn(abort).await.unwrap_or_default();
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
                Some(url) => {
                    client::send_to(&shared.endpoint, url, &body, tie.admitted.take()).await
                }
                None => {
                    drop(tie.admitted.take());
                    client::send(&shared.endpoint, &body).await
                }
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
        tie_wait_us: tie_wait.as_micros() as u64,
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

/// Runs `plan` against `endpoint` to the end: every node of its plays sent when due, or
/// skipped after its play failed. `config`'s in-flight cap, progress bar, observer, abort and
/// sent counter apply as in [`crate::driver::drive`] (`stop_after` does not).
pub(crate) async fn drive_graph(
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
    let mut state = Readiness::new(&graph, speedup, plan.lanes, &plan.plays);
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
    // The due time and admission of the node last handed out: the next waits for it when tied.
    let mut previous: Option<(SimTime, oneshot::Receiver<()>)> = None;
    let ordered = shared.endpoint.wire.streams();
    loop {
        // Send everything due (a node of a failed play is skipped); a task starts up to
        // `PACER_LEAD` early to build its body, then waits for the exact time.
        let horizon = wall(since(start, Instant::now() + PACER_LEAD));
        while let Some((n, due)) = state.pop_due(horizon) {
            pending += 1;
            let tie = TieOrder::next(&mut previous, due, ordered);
            tasks.spawn(send_node(
                shared.clone(),
                n,
                nearest_us(due),
                tie,
                tx.clone(),
            ));
        }
        if state.is_drained() && pending == 0 {
            break;
        }
        let next_due = state.next_due().map(|due| {
            // The whole microsecond at or after it: the horizon then reaches it on waking.
            (start + Duration::from_micros(due.as_nanos().div_ceil(1_000)))
                .checked_sub(PACER_LEAD)
                .unwrap_or(start)
        });
        let event = tokio::select! {
            biased;
            _ = aborted(config.abort.clone()), if !stopped => {
                stopped = true;
                state.stop();
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
            Event::Sent { node, at_us } => state.dispatched(node, wall(at_us)),
            Event::Skipped { node } => {
                pending = pending.saturating_sub(1);
                state.skipped(node, wall(since(start, Instant::now())));
            }
            Event::Done { node, sample } => {
                pending = pending.saturating_sub(1);
                let end = wall(sample.end_us());
                match sample.response.failure.as_ref().map(|f| f.kind()) {
                    Some(kind) => {
                        let play = graph.nodes[node].play;
                        shared.play_failed[play].store(true, Ordering::Release);
                        state.failed(node, end, kind);
                    }
                    None => state.completed(node, end),
                }
                samples.push(*sample);
            }
        }
    }
    samples.sort_by_key(|s| s.seq);
    let settled = state.finish();
    Ok(GraphOutput {
        samples,
        times: settled.times,
        failed: settled.failed,
        lane_of: settled.lane_of,
        started_at,
    })
}
