//! Offline replay: a trace driven through a [`Cluster`] on a virtual clock.
//!
//! One loop drives every replay (`drive`): the clock jumps from event to event, pass ends and
//! arrivals, in whole nanoseconds. At each instant it first finishes the passes that end there
//! (a session's next turn becomes ready when its previous turn completes, plus the turn's
//! delay), then releases the arrivals that are due, then starts passes on idle workers. A
//! Mooncake trace's sessions ([`replay`]) and an agentic graph ([`replay_graph`]) are two
//! kinds of arrivals behind one trait; a Mooncake trace's arrivals at the same instant go in
//! order of (time, sequence number).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::cluster::{Cluster, ClusterConfig, ClusterStats, Output};
use crate::ids::{RequestId, WorkerId};
use crate::metrics::{Collector, DisaggFigures, G2Figures, ReplayReport, RequestRecord};
use crate::request::{EngineRequest, Prompt};
use crate::router::RouterThread;
use crate::scheduler::{ConfigError, RejectReason, WorkerRole};
use crate::side_thread::{Offloaded, Wait};
use crate::time::{SimDuration, SimTime};
use crate::tokens::{sequence_hashes, BlockHashes};
use crate::trace::{LocalHashCache, Trace, TraceRequest};

pub mod autoscale;
mod drive;
mod graph;
mod prepare;
mod readiness;
mod stop;
mod trajectory;

use drive::{drive, Arrivals};
pub use graph::{
    replay_graph, summarize, AgenticReport, GraphReplay, GraphTimes, NodeRecord, NodeStatus,
    NodeTimes, PlayOutcome,
};
use prepare::{Post, Prepared};
pub use readiness::{Readiness, Settled};
use stop::Judge;
pub use stop::{Miss, StopRule, Stopped};
pub use trajectory::TrajectoryFigures;

/// Why a replay could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The settings cannot work.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The simulation stopped with requests still in flight and nothing left to happen.
    #[error("replay reached a dead end at {time} with {in_flight} requests in flight")]
    DeadEnd {
        /// When it stopped.
        time: SimTime,
        /// Requests neither finished nor rejected.
        in_flight: usize,
    },
    /// The speed-up of an agentic replay is not finite and above 0.
    #[error("the speed-up must be finite and above 0, got {0}")]
    Speedup(f64),
    /// An agentic replay was asked for zero lanes.
    #[error("the number of agentic lanes must be at least 1")]
    Lanes,
}

/// The result of one replay.
#[derive(Debug)]
pub struct ReplayOutcome {
    /// Dynamo-compatible summary.
    pub report: ReplayReport,
    /// One record per request, in request-id order.
    pub records: Vec<RequestRecord>,
    /// Requests that never ran, with their reasons, in request-id order (refused at
    /// submission, or rejected by a worker).
    pub rejections: Vec<ReplayRejection>,
    /// For an agentic trace ([`replay_graph`]): the plays' outcomes and every node's times.
    pub agentic: Option<AgenticReport>,
}

/// A trace request the engine refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayRejection {
    /// The request.
    pub(crate) id: RequestId,
    /// 1-based line of its row in the trace.
    pub line: usize,
    /// Why it could not run.
    pub reason: RejectReason,
}

/// Replay settings beyond the cluster's.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// Workers, router and engine.
    pub cluster: ClusterConfig,
    /// Prompt tokens per trace `hash_id`.
    pub trace_block_size: usize,
}

/// Where a request came from in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Origin {
    session: usize,
    turn: usize,
}

/// Turns ready to arrive, earliest first; ties in order of readiness (a sequence number).
#[derive(Default)]
struct TurnQueue {
    heap: BinaryHeap<Reverse<(SimTime, u64, Origin)>>,
    next_seq: u64,
}

impl TurnQueue {
    fn push(&mut self, time: SimTime, origin: Origin) {
        self.heap.push(Reverse((time, self.next_seq, origin)));
        self.next_seq += 1;
    }

    fn next_time(&self) -> Option<SimTime> {
        self.heap.peek().map(|Reverse((t, ..))| *t)
    }

    /// The next turn due by `now`, with its ready time.
    fn pop_due(&mut self, now: SimTime) -> Option<(SimTime, Origin)> {
        match self.heap.peek() {
            Some(Reverse((t, _, origin))) if *t <= now => {
                let due = (*t, *origin);
                self.heap.pop();
                Some(due)
            }
            _ => None,
        }
    }
}

/// The replay's bookkeeping: where each request came from and what happened to it.
struct Ledger<'a> {
    trace: &'a Trace,
    collector: Metrics,
    /// The engine requests of the turns, built ahead where a thread has time for it.
    prepared: Prepared<'a>,
    /// Block hashes of the trace's `hash_id`s, memoised.
    hash_cache: LocalHashCache,
    origins: Vec<Origin>,
    arrivals: TurnQueue,
    rejections: Vec<ReplayRejection>,
    done: usize,
    /// Watches the requests against a stop rule ([`ReplayOptions::stop`]).
    judge: Option<Judge>,
    /// The instant of the step under way.
    now: SimTime,
}

/// What the metrics collector is told, in order: only what it reads, 24 bytes a note (tokens
/// are nearly all of them, and every note is written to memory on one core and read on the
/// other), with the rare large ones boxed.
#[derive(Debug)]
enum Note {
    /// A request became ready ([`Collector::on_arrival`]).
    Arrival(Box<Arrival>),
    /// A request was admitted ([`Collector::on_admit`], [`Collector::on_g2_reuse`]).
    Admitted(Box<Admission>),
    /// A token was produced ([`Collector::on_token`]).
    Token { id: RequestId, time: SimTime },
    /// A request finished ([`Collector::on_finish`]).
    Finished { id: RequestId, time: SimTime },
    /// A request was rejected, at submission or by a worker ([`Collector::on_reject`]).
    Rejected { id: RequestId, time: SimTime },
    /// A request's KV moved between workers ([`Collector::on_kv_transfer`]).
    KvTransfer {
        id: RequestId,
        duration: SimDuration,
    },
}

/// A [`Note::Arrival`].
#[derive(Debug)]
struct Arrival {
    id: RequestId,
    ready: SimTime,
    input_length: usize,
    output_length: usize,
    session: String,
    turn: usize,
}

/// A [`Note::Admitted`].
#[derive(Debug)]
struct Admission {
    id: RequestId,
    worker: WorkerId,
    time: SimTime,
    reused_tokens: usize,
    g2_reused_tokens: usize,
}

impl Note {
    /// The note for an output of the cluster; None for one the collector does not read.
    fn of(out: &Output) -> Option<Note> {
        Some(match *out {
            Output::Admitted {
                id,
                worker,
                time,
                reused_tokens,
                g2_reused_tokens,
            } => Note::Admitted(Box::new(Admission {
                id,
                worker,
                time,
                reused_tokens,
                g2_reused_tokens,
            })),
            Output::KvTransfer { id, duration, .. } => Note::KvTransfer { id, duration },
            Output::Token { id, time, .. } => Note::Token { id, time },
            Output::Finished { id, time } => Note::Finished { id, time },
            Output::Rejected { id, time, .. } => Note::Rejected { id, time },
            Output::Preempted { .. } => return None,
        })
    }
}

/// Notes the replay gathers before it hands them to the collector's thread as one job.
const NOTE_BATCH: usize = 4096;
/// Notes per job on the KV router's thread: small, as the router's next answer waits for it.
const BESIDE_BATCH: usize = 256;

/// The metrics collector: where a second core is available, on a thread of its own (fed in
/// batches; nobody waits for it until the report), or, when the KV router's bookkeeping has a
/// thread already, in that thread's idle time; else here.
enum Metrics {
    Inline(Collector),
    Offloaded {
        thread: Offloaded<Collector>,
        batch: Vec<Note>,
    },
    Beside {
        thread: RouterThread,
        collector: Arc<Mutex<Collector>>,
        batch: Vec<Note>,
    },
}

impl Metrics {
    /// A collector for `requests` requests.
    fn new(offload: bool, router_thread: Option<RouterThread>, requests: usize) -> Metrics {
        let collector = Collector::with_capacity(requests);
        if let Some(thread) = router_thread {
            return Metrics::Beside {
                thread,
                collector: Arc::new(Mutex::new(collector)),
                batch: Vec::with_capacity(BESIDE_BATCH),
            };
        }
        if !offload {
            return Metrics::Inline(collector);
        }
        match Offloaded::new("replay-metrics", collector, Wait::Block) {
            Ok(thread) => Metrics::Offloaded {
                thread,
                batch: Vec::with_capacity(NOTE_BATCH),
            },
            // No thread: the collector stays here.
            Err((_, collector)) => Metrics::Inline(collector),
        }
    }

    fn note(&mut self, note: Note) {
        match self {
            Metrics::Inline(c) => tell(c, note),
            Metrics::Offloaded { thread, batch } => {
                batch.push(note);
                if batch.len() >= NOTE_BATCH {
                    let notes = std::mem::replace(batch, Vec::with_capacity(NOTE_BATCH));
                    thread.post(move |c| notes.into_iter().for_each(|n| tell(c, n)));
                }
            }
            Metrics::Beside {
                thread,
                collector,
                batch,
            } => {
                batch.push(note);
                if batch.len() >= BESIDE_BATCH {
                    let notes = std::mem::replace(batch, Vec::with_capacity(BESIDE_BATCH));
                    tell_beside(thread, collector, notes);
                }
            }
        }
    }

    /// Posts jobs to the collector's own thread, if it has one.
    fn side(&self) -> Option<Post> {
        match self {
            Metrics::Offloaded { thread, .. } => {
                let beside = thread.beside()?;
                Some(Box::new(move |job| beside.post(job)))
            }
            Metrics::Inline(_) | Metrics::Beside { .. } => None,
        }
    }

    /// The collector, once it has been told everything.
    fn into_inner(self) -> Collector {
        match self {
            Metrics::Inline(c) => c,
            Metrics::Offloaded { thread, batch } => {
                thread.post(move |c| batch.into_iter().for_each(|n| tell(c, n)));
                thread.into_inner()
            }
            Metrics::Beside {
                thread,
                collector,
                batch,
            } => {
                tell_beside(&thread, &collector, batch);
                // Every job before this one has run once it answers.
                let (done, wait) = mpsc::sync_channel(1);
                let posted = thread.post(move || {
                    let _ = done.send(());
                });
                if !posted || wait.recv().is_err() {
                    router_thread_stopped();
                }
                match Arc::try_unwrap(collector) {
                    Ok(c) => c.into_inner().unwrap_or_else(PoisonError::into_inner),
                    Err(_) => router_thread_stopped(),
                }
            }
        }
    }
}

/// Tells `notes` to the collector on the router's thread (whose end, a panic there, stops the
/// replay: see [`router_thread_stopped`]).
fn tell_beside(thread: &RouterThread, collector: &Arc<Mutex<Collector>>, notes: Vec<Note>) {
    let shared = Arc::clone(collector);
    let job = move || {
        let mut c = shared.lock().unwrap_or_else(PoisonError::into_inner);
        notes.into_iter().for_each(|n| tell(&mut c, n));
    };
    if !thread.post(job) {
        router_thread_stopped();
    }
}

/// The KV router's thread panicked (its message is on stderr) with metrics notes in hand:
/// the replay stops here rather than report without them.
fn router_thread_stopped() -> ! {
    panic!("the KV router's thread stopped; the replay's metrics are incomplete")
}

/// Tells the collector one note.
fn tell(collector: &mut Collector, note: Note) {
    match note {
        Note::Arrival(a) => collector.on_arrival(
            a.id,
            a.ready,
            a.input_length,
            a.output_length,
            Some(&a.session),
            a.turn,
        ),
        Note::Admitted(a) => {
            collector.on_admit(a.id, a.time, a.reused_tokens, a.worker);
            collector.on_g2_reuse(a.id, a.g2_reused_tokens);
        }
        Note::Token { id, time } => collector.on_token(id, time),
        Note::Finished { id, time } => collector.on_finish(id, time),
        Note::Rejected { id, time } => collector.on_reject(id, time),
        Note::KvTransfer { id, duration } => collector.on_kv_transfer(id, duration),
    }
}

impl Ledger<'_> {
    /// A request ended (finished or rejected) at `time`: its session's next turn becomes ready
    /// after that turn's delay.
    fn end(&mut self, id: RequestId, time: SimTime) {
        self.done += 1;
        let o = self.origins[id.0 as usize];
        let turns = &self.trace.sessions[o.session].turns;
        if let Some(next) = turns.get(o.turn + 1) {
            self.arrivals.push(
                time + next.delay,
                Origin {
                    session: o.session,
                    turn: o.turn + 1,
                },
            );
            self.prepared.ask(o.session, o.turn + 1);
        }
    }

    /// A request was rejected at `time` (the collector learns it from the output, or from a
    /// [`Note::Rejected`] of its own when the cluster refused it at submission).
    fn reject(&mut self, id: RequestId, time: SimTime, reason: RejectReason) {
        let o = self.origins[id.0 as usize];
        let line = self.trace.sessions[o.session].turns[o.turn].line;
        self.rejections.push(ReplayRejection { id, line, reason });
        self.end(id, time);
    }
}

impl Arrivals for Ledger<'_> {
    fn next_due(&self) -> Option<SimTime> {
        self.arrivals.next_time()
    }

    /// Submits the turns due by `now`, each built ahead where it could be, building the next
    /// ones while the cluster waits for a routing decision.
    fn release(&mut self, now: SimTime, cluster: &mut Cluster, observer: &mut dyn ReplayObserver) {
        self.now = now;
        while let Some((ready, origin)) = self.arrivals.pop_due(now) {
            let session = &self.trace.sessions[origin.session];
            let turn = &session.turns[origin.turn];
            let request = self
                .prepared
                .take(origin.session, origin.turn, &mut self.hash_cache);
            let (prepared, hash_cache) = (&mut self.prepared, &mut self.hash_cache);
            let submitted =
                cluster.submit_while(request, now, &mut || prepared.build_ahead(hash_cache));
            let id = match submitted {
                Ok(id) => {
                    observer.submitted(id, turn);
                    id
                }
                Err(rejection) => rejection.id,
            };
            debug_assert_eq!(id, RequestId(self.origins.len() as u64));
            self.origins.push(origin);
            self.collector.note(Note::Arrival(Box::new(Arrival {
                id,
                ready,
                input_length: turn.input_length,
                output_length: turn.output_length,
                session: session.id.clone(),
                turn: origin.turn,
            })));
            if let Some(judge) = &mut self.judge {
                judge.arrival(id, ready);
                if submitted.is_err() {
                    judge.rejected(id);
                }
            }
            if let Err(rejection) = submitted {
                self.collector.note(Note::Rejected { id, time: now });
                self.reject(id, now, rejection.reason);
            }
        }
    }

    fn take(&mut self, outputs: &mut Vec<Output>) {
        for out in outputs.drain(..) {
            if let Some(judge) = &mut self.judge {
                judge.output(&out);
            }
            match out {
                Output::Finished { id, time } => self.end(id, time),
                Output::Rejected { id, time, reason } => self.reject(id, time, reason),
                _ => {}
            }
            if let Some(note) = Note::of(&out) {
                self.collector.note(note);
            }
        }
    }

    fn ended(&self) -> usize {
        self.done
    }

    /// Hands the turns asked for in this step to the thread that builds them ahead.
    fn step_done(&mut self) {
        self.prepared.flush();
        if let Some(judge) = &mut self.judge {
            judge.step_done(self.now);
        }
    }

    fn stopped(&self) -> bool {
        self.judge.as_ref().is_some_and(Judge::lost)
    }
}

/// Replays `trace` to the end. `progress` is called with (finished, total) requests now and then.
///
/// A request the cluster refuses (it could never run: see [`Cluster::submit`]) is counted as
/// rejected at its arrival, with its reason in [`ReplayOutcome::rejections`], and its session
/// goes on.
///
/// The replay reads no clock: the report's wall-clock figures (`wall_time_ms` and the
/// per-wall-second rates) are zero; a caller that timed the run fills them in with
/// [`set_wall_time`].
pub fn replay(
    trace: &Trace,
    config: &ReplayConfig,
    progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    replay_observed(trace, config, progress, &mut ())
}

/// What a replay shows an observer besides its report: the cluster before the run, every
/// submitted turn, and every batch of outputs with the virtual time it was produced at. A KV
/// event exporter uses it ([`Cluster::export_kv_events`]). `()` observes nothing.
pub trait ReplayObserver {
    /// Before the first arrival.
    fn start(&mut self, cluster: &mut Cluster) {
        let _ = cluster;
    }
    /// Turn `turn` was submitted as request `id` (accepted by the cluster).
    fn submitted(&mut self, id: RequestId, turn: &TraceRequest) {
        let _ = (id, turn);
    }
    /// The cluster emitted `outputs` at `now`.
    fn outputs(&mut self, cluster: &mut Cluster, outputs: &[Output], now: SimTime) {
        let _ = (cluster, outputs, now);
    }
    /// Autoscaling hook (issue 46): the next virtual time the observer must be called at
    /// (through [`ReplayObserver::outputs`], possibly with no outputs) while the run goes on:
    /// an autoscaler's ticks, scrapes and model loads. Never delays the end of the run.
    fn wake_at(&self) -> Option<SimTime> {
        None
    }
}

impl ReplayObserver for () {}

/// [`replay`] with an observer.
pub fn replay_observed(
    trace: &Trace,
    config: &ReplayConfig,
    progress: impl FnMut(usize, usize),
    observer: &mut dyn ReplayObserver,
) -> Result<ReplayOutcome, ReplayError> {
    match run_sessions(trace, config, &ReplayOptions::default(), progress, observer)? {
        Ended::Complete(outcome) => Ok(*outcome),
        // No stop rule, no stop.
        Ended::Stopped(s) => unreachable!("a replay without a stop rule stopped: {s:?}"),
    }
}

/// How [`replay_with`] runs, beyond the cluster's settings.
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Stop once the SLO is lost (see [`StopRule`]); None runs to the end.
    pub stop: Option<StopRule>,
    /// Run on this thread alone, as where only one core is available (a caller that runs
    /// replays on every core already has no core to give one replay's helper threads). The
    /// results are the same either way.
    pub one_thread: bool,
}

/// How a replay with a stop rule ended.
#[derive(Debug)]
pub enum Ended {
    /// It ran to the end.
    Complete(Box<ReplayOutcome>),
    /// It stopped once its SLO was lost: its partial run has no figures.
    Stopped(Stopped),
}

/// [`replay`] with options: a stop rule, one thread.
pub fn replay_with(
    trace: &Trace,
    config: &ReplayConfig,
    options: &ReplayOptions,
) -> Result<Ended, ReplayError> {
    run_sessions(trace, config, options, |_, _| {}, &mut ())
}

/// The Mooncake replay.
fn run_sessions(
    trace: &Trace,
    config: &ReplayConfig,
    options: &ReplayOptions,
    progress: impl FnMut(usize, usize),
    observer: &mut dyn ReplayObserver,
) -> Result<Ended, ReplayError> {
    let mut cluster = Cluster::new(config.cluster.clone())?;
    // With a second core, the KV router's bookkeeping runs beside the workers on a second
    // thread, and the metrics collector in that thread's idle time (a third busy thread would
    // take turns with the other two on two cores); where the router keeps no bookkeeping, the
    // collector has the second thread. On one core either would only add its jobs and waits.
    // Results are those of a single thread, which is also what stays if no thread can start.
    let second_core =
        !options.one_thread && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    let router_moved = second_core && cluster.offload_router().unwrap_or(false);
    observer.start(&mut cluster);
    let block_size = cluster.block_size();
    // The KV router's index makes room up front for every block the trace can store (at most
    // what the workers cache): growing it mid-replay rehashes the whole table, a pause of
    // milliseconds that the next routing decision would wait through.
    let trace_blocks = trace
        .sessions
        .iter()
        .flat_map(|s| &s.turns)
        .map(|t| (t.input_length + t.output_length).div_ceil(block_size))
        .fold(0usize, usize::saturating_add);
    cluster.reserve_router_index(trace_blocks);
    // So do the workers' pools, for the same reason and to touch fresh memory once.
    cluster.reserve_pools(trace_blocks);
    let total = trace.num_requests();
    let collector = Metrics::new(second_core && !router_moved, cluster.router_thread(), total);
    // Requests are built ahead on the collector's own thread, which has time to spare. The
    // KV router's thread has none (the router's answers wait for every job before them):
    // there the replay builds them itself while it waits for a routing decision.
    let side = collector.side();
    let mut prepared = Prepared::new(trace, config.trace_block_size, block_size, side);
    if router_moved {
        prepared = prepared.build_in_waits();
    }
    let mut ledger = Ledger {
        trace,
        collector,
        prepared,
        hash_cache: LocalHashCache::new(block_size),
        origins: Vec::with_capacity(total),
        arrivals: TurnQueue::default(),
        rejections: Vec::new(),
        done: 0,
        judge: options.stop.map(|rule| Judge::new(rule, total)),
        now: SimTime::ZERO,
    };
    for (s, session) in trace.sessions.iter().enumerate() {
        if !session.turns.is_empty() {
            ledger.arrivals.push(
                session.first_arrival,
                Origin {
                    session: s,
                    turn: 0,
                },
            );
        }
    }
    let end = drive(&mut cluster, &mut ledger, observer, total, progress)?;
    if let Some(judge) = ledger.judge.as_ref() {
        if let Some((id, miss, nth)) = judge.lost_by() {
            let o = ledger.origins[id.0 as usize];
            let session = &trace.sessions[o.session];
            return Ok(Ended::Stopped(Stopped {
                time: end,
                requests: total,
                missed: judge.missed(),
                ended: ledger.done,
                nth,
                line: session.turns[o.turn].line,
                session: session.id.clone(),
                turn: o.turn,
                miss,
            }));
        }
    }
    let stats = cluster.snapshot();
    let (mut report, records) = ledger.collector.into_inner().finish(Duration::ZERO);
    add_topology_figures(&mut report, &stats, config);
    let mut rejections = ledger.rejections;
    rejections.sort_by_key(|r| r.id);
    Ok(Ended::Complete(Box::new(ReplayOutcome {
        report,
        records,
        rejections,
        agentic: None,
    })))
}

/// Sets the report's wall-clock figures from the host time the run took: `wall_time_ms` and
/// the processed tokens (all, and output) per wall-clock second.
pub fn set_wall_time(report: &mut ReplayReport, wall: Duration) {
    let wall_ms = wall.as_secs_f64() * 1000.0;
    let per_wall_s = |n: u64| {
        if wall_ms > 0.0 {
            n as f64 / wall_ms * 1000.0
        } else {
            0.0
        }
    };
    report.wall_time_ms = wall_ms;
    report.processed_tokens_per_s = per_wall_s(report.processed_tokens);
    report.processed_output_tokens_per_s = per_wall_s(report.total_output_tokens);
}

/// Adds the disaggregation and host-tier figures (extra keys after Dynamo's) when those
/// features are on; an aggregated run without G2 keeps exactly Dynamo's keys.
fn add_topology_figures(report: &mut ReplayReport, stats: &ClusterStats, config: &ReplayConfig) {
    let duration_ns = report.duration_ms * 1e6;
    let utilization = |role: WorkerRole| {
        let busy: Vec<u64> = stats
            .workers
            .iter()
            .filter(|w| w.role == role)
            .map(|w| w.busy_ns)
            .collect();
        if busy.is_empty() || duration_ns <= 0.0 {
            return (busy.len() as u64, 0.0);
        }
        let total: u64 = busy.iter().sum();
        (
            busy.len() as u64,
            total as f64 / (busy.len() as f64 * duration_ns),
        )
    };
    report.disagg = match config.cluster.serving {
        crate::cluster::ServingMode::Aggregated => None,
        crate::cluster::ServingMode::Disagg { .. } => {
            let (num_prefill_workers, prefill_pool_utilization) = utilization(WorkerRole::Prefill);
            let (num_decode_workers, decode_pool_utilization) = utilization(WorkerRole::Decode);
            let total_ms = SimDuration::from_nanos(stats.kv_transfer_ns).as_millis_f64();
            Some(DisaggFigures {
                kv_transfers: stats.kv_transfers,
                mean_kv_transfer_ms: if stats.kv_transfers > 0 {
                    total_ms / stats.kv_transfers as f64
                } else {
                    0.0
                },
                total_kv_transfer_ms: total_ms,
                num_prefill_workers,
                num_decode_workers,
                prefill_pool_utilization,
                decode_pool_utilization,
            })
        }
    };
    let g2_reused = report.g2.take().unwrap_or_default();
    report.g2 = config.cluster.engine.g2.as_ref().map(|_| G2Figures {
        g2_offloaded_blocks: stats
            .workers
            .iter()
            .map(|w| w.scheduler.g2_offloaded_blocks)
            .sum(),
        g2_onboarded_blocks: stats
            .workers
            .iter()
            .map(|w| w.scheduler.g2_onboarded_blocks)
            .sum(),
        ..g2_reused
    });
}

/// The engine request for a trace turn: block hashes computed without materialising the prompt.
pub fn engine_request(
    turn: &TraceRequest,
    trace_block_size: usize,
    block_size: usize,
    cache: &mut LocalHashCache,
) -> EngineRequest {
    let local = turn.engine_block_local_hashes(trace_block_size, cache);
    let sequence = sequence_hashes(&local);
    let full = local.len() * block_size;
    let tail = (full..turn.input_length)
        .map(|pos| turn.hash_ids[pos / trace_block_size] as u32)
        .collect();
    EngineRequest {
        prompt: Prompt {
            len: turn.input_length,
            blocks: BlockHashes { local, sequence },
            tail,
            tokens: None,
        },
        max_output_tokens: turn.output_length,
        output_tokens: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::{Router, RouterConfig};

    /// The notes of `n` requests: arrival, admission, 5 tokens, a preemption (no note) and the
    /// finish each, spread over more than one batch of either kind.
    fn notes(n: u64) -> Vec<Note> {
        let mut notes = Vec::new();
        for i in 0..n {
            let (id, t) = (RequestId(i), i * 1_000);
            notes.push(Note::Arrival(Box::new(Arrival {
                id,
                ready: SimTime::from_micros(t),
                input_length: 100 + i as usize % 7,
                output_length: 5,
                session: format!("s{}", i % 13),
                turn: (i / 13) as usize,
            })));
            let outputs = [Output::Admitted {
                id,
                worker: WorkerId(0),
                time: SimTime::from_micros(t + 10 + i % 5),
                reused_tokens: i as usize % 3 * 16,
                g2_reused_tokens: 0,
            }]
            .into_iter()
            .chain((1..=5).map(|index| Output::Token {
                id,
                token: 0,
                index,
                time: SimTime::from_micros(t + 500 + index as u64 * (40 + i % 11)),
            }))
            .chain([
                Output::Preempted {
                    id,
                    time: SimTime::from_micros(t + 600),
                },
                Output::Finished {
                    id,
                    time: SimTime::from_micros(t + 500 + 5 * (40 + i % 11)),
                },
            ]);
            notes.extend(outputs.filter_map(|out| Note::of(&out)));
        }
        notes
    }

    /// A note is 24 bytes: three to a cache line where an output is one.
    #[test]
    fn a_note_is_small() {
        assert_eq!(std::mem::size_of::<Note>(), 24);
        let out = Output::Preempted {
            id: RequestId(1),
            time: SimTime::from_micros(2),
        };
        assert!(
            Note::of(&out).is_none(),
            "the collector does not read preemptions"
        );
    }

    /// Wherever the collector runs (here, on a thread of its own, or in an offloaded KV
    /// router's idle time) it is told the same notes in the same order: the reports are equal.
    #[test]
    fn the_report_does_not_depend_on_where_the_collector_runs() {
        let mut router = Router::new(RouterConfig::default(), 2, 16, 1024, 0);
        assert!(router.offload().expect("a thread starts"));
        let report = |mut metrics: Metrics| {
            notes(1_500).into_iter().for_each(|n| metrics.note(n));
            let (report, records) = metrics.into_inner().finish(Duration::ZERO);
            assert_eq!(records.len(), 1_500);
            serde_json::to_string(&report).expect("serialises")
        };
        // (Room made for more, fewer or no requests changes nothing.)
        let beside = Metrics::new(false, router.beside(), 0);
        assert!(matches!(beside, Metrics::Beside { .. }));
        let own = Metrics::new(true, None, 1_500);
        assert!(matches!(own, Metrics::Offloaded { .. }));
        let here = report(Metrics::new(false, None, 10));
        assert_eq!(report(own), here);
        assert_eq!(report(beside), here);
        assert!(here.contains("\"completed_requests\":1500"), "{here}");
    }
}
