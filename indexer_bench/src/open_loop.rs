//! The deadline-driven open loop: issuer threads publish every operation at its deadline to the
//! indexer's own threads, and timing ends when all queued work has drained.
//!
//! Each worker's timeline is normalised to start at 0 and rescaled to the benchmark window, then
//! the operations are dealt to issuer threads by worker (so one worker's events keep their order)
//! and stable-sorted by (deadline, queries before writes, worker, source order). The indexer runs
//! on threads of its own:
//! - single-threaded indexers (`radix-tree`, `approximate`): one owner thread applies everything
//!   in arrival order;
//! - concurrent indexers (`concurrent-radix-tree-compressed`, `branch-sharded`): `query_lanes`
//!   threads run lookups (dealt round-robin) while `event_workers` threads apply events, worker
//!   `w` always on lane `w % event_workers` (per-worker FIFO).
//!
//! In approximate mode there are no KV events: each lookup is followed by a write of the routing
//! decision (the request's blocks on its worker, at the request's simulated time).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use servesim::ids::WorkerId;
use servesim::indexer::{IndexerStats, KvIndexer};
use servesim::kv::{KvEvent, KvEventData};
use servesim::time::SimTime;
use servesim::tokens::{LocalBlockHash, SequenceHash};

use crate::indexer::{
    BranchSharded, ConcurrentKvIndexer, ConcurrentRadixTreeCompressed, IndexerConfig, IndexerKind,
};
use crate::result::{Distribution, OpenLoopResult, RunTotals};
use crate::workload::{Op, Workload};

/// Threads and timing of one open-loop run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// The window every worker's timeline is compressed into.
    pub benchmark_duration: Duration,
    /// Threads publishing operations at their deadlines.
    pub issuer_threads: usize,
    /// Lookup threads of concurrent indexers.
    pub query_lanes: usize,
    /// Event threads of concurrent indexers.
    pub event_workers: usize,
    /// Issuers sleep until this long before a deadline, then spin (0: sleep only; spinning
    /// steals cores from the indexer on small machines).
    pub issuer_spin: Duration,
    /// An operation issued later than this after its deadline counts as delayed.
    pub issue_lag_threshold: Duration,
}

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig {
            benchmark_duration: Duration::from_secs(60),
            issuer_threads: 1,
            query_lanes: 2,
            event_workers: 2,
            issuer_spin: Duration::ZERO,
            issue_lag_threshold: Duration::from_micros(50),
        }
    }
}

/// Work handed to the indexer's threads.
#[derive(Debug)]
enum Job {
    Query(Vec<LocalBlockHash>),
    Event(KvEvent),
    Routing {
        worker: WorkerId,
        local: Vec<LocalBlockHash>,
        seq: Vec<SequenceHash>,
        now: SimTime,
    },
}

impl Job {
    fn is_read(&self) -> bool {
        matches!(self, Job::Query(_))
    }
}

/// A job with its deadline (ns after the start), in an issuer's list.
#[derive(Debug)]
struct Scheduled {
    deadline_ns: u64,
    worker: WorkerId,
    job: Job,
}

/// A job in flight: when it was due and when it was handed over.
#[derive(Debug)]
struct Msg {
    job: Job,
    deadline_ns: u64,
    issued: Instant,
}

/// Where issuers send jobs.
#[derive(Clone)]
enum Sink {
    Exclusive(Sender<Msg>),
    Shared {
        queries: Vec<Sender<Msg>>,
        events: Vec<Sender<Msg>>,
    },
}

/// What one indexer thread measured.
#[derive(Default)]
struct LaneStats {
    query_queue_wait: Vec<u64>,
    query_service: Vec<u64>,
    query_scheduled_to_finished: Vec<u64>,
    update_accepted_to_finished: Vec<u64>,
    update_scheduled_to_finished: Vec<u64>,
    failures: u64,
    last_end: Option<Instant>,
}

impl LaneStats {
    fn record(
        &mut self,
        t0: Instant,
        read: bool,
        deadline_ns: u64,
        issued: Instant,
        (start, end): (Instant, Instant),
    ) {
        let deadline = t0 + Duration::from_nanos(deadline_ns);
        let sched = ns(end.saturating_duration_since(deadline));
        if read {
            self.query_queue_wait
                .push(ns(start.saturating_duration_since(issued)));
            self.query_service.push(ns(end - start));
            self.query_scheduled_to_finished.push(sched);
        } else {
            self.update_accepted_to_finished
                .push(ns(end.saturating_duration_since(issued)));
            self.update_scheduled_to_finished.push(sched);
        }
        self.last_end = Some(self.last_end.map_or(end, |e| e.max(end)));
    }

    fn merge(&mut self, other: LaneStats) {
        self.query_queue_wait.extend(other.query_queue_wait);
        self.query_service.extend(other.query_service);
        self.query_scheduled_to_finished
            .extend(other.query_scheduled_to_finished);
        self.update_accepted_to_finished
            .extend(other.update_accepted_to_finished);
        self.update_scheduled_to_finished
            .extend(other.update_scheduled_to_finished);
        self.failures += other.failures;
        self.last_end = match (self.last_end, other.last_end) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What one issuer measured.
#[derive(Default)]
struct IssuerStats {
    read_issue_lag: Vec<u64>,
    update_issue_lag: Vec<u64>,
    delayed_reads: u64,
    delayed_updates: u64,
    send_failures: u64,
    last_issue: Option<Instant>,
    cpu_busy: Duration,
}

impl IssuerStats {
    fn merge(&mut self, other: IssuerStats) {
        self.read_issue_lag.extend(other.read_issue_lag);
        self.update_issue_lag.extend(other.update_issue_lag);
        self.delayed_reads += other.delayed_reads;
        self.delayed_updates += other.delayed_updates;
        self.send_failures += other.send_failures;
        self.cpu_busy += other.cpu_busy;
        self.last_issue = match (self.last_issue, other.last_issue) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The indexer under test, ready to be moved onto its threads.
enum Backend {
    Exclusive(Box<dyn KvIndexer + Send>),
    Shared(Arc<dyn ConcurrentKvIndexer>),
}

impl Backend {
    fn build(kind: IndexerKind, config: &IndexerConfig) -> Backend {
        match kind {
            IndexerKind::ConcurrentRadixTreeCompressed => {
                Backend::Shared(Arc::new(ConcurrentRadixTreeCompressed::new()))
            }
            IndexerKind::BranchSharded => Backend::Shared(Arc::new(BranchSharded::new(
                config.num_shards,
                config.prefix_depth,
            ))),
            IndexerKind::RadixTree | IndexerKind::Approximate | IndexerKind::Flat => {
                Backend::Exclusive(kind.build(config))
            }
        }
    }
}

/// Deals the workload to `issuers` lists of jobs with deadlines in the window.
fn schedule(
    workload: &Workload,
    kind: IndexerKind,
    window: Duration,
    issuers: usize,
) -> Vec<Vec<Scheduled>> {
    let window_ns = ns(window);
    let mut lists: Vec<Vec<Scheduled>> = (0..issuers).map(|_| Vec::new()).collect();
    for (i, timeline) in workload.workers.iter().enumerate() {
        let Some(first) = timeline.ops.first() else {
            continue;
        };
        let t0 = first.at.as_micros();
        let span = timeline.span();
        let list = &mut lists[i % issuers];
        for op in &timeline.ops {
            let offset = op.at.as_micros() - t0;
            let deadline_ns = if span == 0 {
                0
            } else {
                (u128::from(offset) * u128::from(window_ns) / u128::from(span)) as u64
            };
            let worker = timeline.worker;
            match (&op.op, kind.uses_kv_events()) {
                (Op::Lookup { local, .. }, true) => list.push(Scheduled {
                    deadline_ns,
                    worker,
                    job: Job::Query(local.clone()),
                }),
                (Op::Lookup { local, seq }, false) => {
                    list.push(Scheduled {
                        deadline_ns,
                        worker,
                        job: Job::Query(local.clone()),
                    });
                    list.push(Scheduled {
                        deadline_ns,
                        worker,
                        job: Job::Routing {
                            worker,
                            local: local.clone(),
                            seq: seq.clone(),
                            now: op.at,
                        },
                    });
                }
                (Op::Event(e), true) => list.push(Scheduled {
                    deadline_ns,
                    worker,
                    job: Job::Event(e.clone()),
                }),
                (Op::Event(_), false) => {}
            }
        }
    }
    for list in &mut lists {
        list.sort_by_key(|s| (s.deadline_ns, !s.job.is_read(), s.worker));
    }
    lists
}

/// Counts of what a schedule will issue.
fn run_totals(lists: &[Vec<Scheduled>]) -> RunTotals {
    let mut t = RunTotals::default();
    for s in lists.iter().flatten() {
        match &s.job {
            Job::Query(local) => {
                t.requests += 1;
                t.request_blocks += local.len() as u64;
            }
            Job::Event(e) => {
                t.events += 1;
                match &e.data {
                    KvEventData::Stored { blocks, .. } => {
                        t.stored_events += 1;
                        t.stored_blocks += blocks.len() as u64;
                    }
                    KvEventData::Removed { seq_hashes } => {
                        t.removed_events += 1;
                        t.removed_blocks += seq_hashes.len() as u64;
                    }
                    KvEventData::Cleared => t.cleared_events += 1,
                }
            }
            Job::Routing { local, .. } => {
                t.routing_writes += 1;
                t.routing_blocks += local.len() as u64;
            }
        }
    }
    t.logical_ops = t.requests + t.events + t.routing_writes;
    t.block_ops = t.request_blocks + t.stored_blocks + t.removed_blocks + t.routing_blocks;
    t
}

fn issue(list: Vec<Scheduled>, sink: Sink, t0: Instant, config: &RunConfig) -> IssuerStats {
    let mut stats = IssuerStats::default();
    let mut next_query = 0usize;
    let threshold = ns(config.issue_lag_threshold);
    for s in list {
        let target = t0 + Duration::from_nanos(s.deadline_ns);
        loop {
            let now = Instant::now();
            if now >= target {
                break;
            }
            let left = target - now;
            if left > config.issuer_spin {
                thread::sleep(left - config.issuer_spin);
            } else {
                std::hint::spin_loop();
            }
        }
        let busy_from = Instant::now();
        let read = s.job.is_read();
        let lag = ns(busy_from.saturating_duration_since(target));
        if read {
            stats.read_issue_lag.push(lag);
            stats.delayed_reads += u64::from(lag > threshold);
        } else {
            stats.update_issue_lag.push(lag);
            stats.delayed_updates += u64::from(lag > threshold);
        }
        let tx = match &sink {
            Sink::Exclusive(tx) => tx,
            Sink::Shared { queries, events } => {
                if read {
                    next_query = (next_query + 1) % queries.len();
                    &queries[next_query]
                } else {
                    &events[s.worker.0 as usize % events.len()]
                }
            }
        };
        let msg = Msg {
            job: s.job,
            deadline_ns: s.deadline_ns,
            issued: busy_from,
        };
        if tx.send(msg).is_err() {
            stats.send_failures += 1;
        }
        let done = Instant::now();
        stats.cpu_busy += done - busy_from;
        stats.last_issue = Some(done);
    }
    stats
}

/// Runs jobs from `rx` until every sender is gone; `run` returns false when a job failed.
fn serve(rx: Receiver<Msg>, t0: Instant, mut run: impl FnMut(Job) -> bool) -> LaneStats {
    let mut stats = LaneStats::default();
    while let Ok(msg) = rx.recv() {
        let start = Instant::now();
        let read = msg.job.is_read();
        let ok = run(msg.job);
        let end = Instant::now();
        stats.failures += u64::from(!ok);
        stats.record(t0, read, msg.deadline_ns, msg.issued, (start, end));
    }
    stats
}

/// An indexer thread's measurements, and the indexer's counters when it owned the indexer.
type LaneHandle = thread::JoinHandle<(LaneStats, Option<IndexerStats>)>;

/// Starts the indexer's threads; returns where to send jobs, the threads, and (for shared
/// indexers) a handle to read the counters after the run.
fn start_backend(
    backend: Backend,
    config: &RunConfig,
    t0: Instant,
) -> (Sink, Vec<LaneHandle>, Option<Arc<dyn ConcurrentKvIndexer>>) {
    match backend {
        Backend::Exclusive(mut idx) => {
            let (tx, rx) = channel::<Msg>();
            let owner = thread::spawn(move || {
                let stats = serve(rx, t0, |job| match job {
                    Job::Query(local) => {
                        std::hint::black_box(idx.find_matches(&local));
                        true
                    }
                    Job::Event(e) => {
                        idx.apply(&e);
                        true
                    }
                    Job::Routing {
                        worker,
                        local,
                        seq,
                        now,
                    } => idx.record_routing(worker, &local, &seq, now).is_ok(),
                });
                (stats, Some(idx.stats()))
            });
            (Sink::Exclusive(tx), vec![owner], None)
        }
        Backend::Shared(idx) => {
            let mut lanes: Vec<LaneHandle> = Vec::new();
            let mut queries = Vec::new();
            let mut events = Vec::new();
            for _ in 0..config.query_lanes.max(1) {
                let (tx, rx) = channel::<Msg>();
                let idx = Arc::clone(&idx);
                queries.push(tx);
                lanes.push(thread::spawn(move || {
                    let stats = serve(rx, t0, |job| match job {
                        Job::Query(local) => {
                            std::hint::black_box(idx.find_matches(&local));
                            true
                        }
                        _ => false,
                    });
                    (stats, None)
                }));
            }
            for _ in 0..config.event_workers.max(1) {
                let (tx, rx) = channel::<Msg>();
                let idx = Arc::clone(&idx);
                events.push(tx);
                lanes.push(thread::spawn(move || {
                    let stats = serve(rx, t0, |job| match job {
                        Job::Event(e) => {
                            idx.apply(&e);
                            true
                        }
                        _ => false,
                    });
                    (stats, None)
                }));
            }
            (Sink::Shared { queries, events }, lanes, Some(idx))
        }
    }
}

/// Replays `workload` against a fresh indexer of `kind` compressed into
/// `config.benchmark_duration`, and measures it.
pub fn run(
    workload: &Workload,
    kind: IndexerKind,
    indexer: &IndexerConfig,
    config: &RunConfig,
) -> OpenLoopResult {
    let issuers = config.issuer_threads.max(1);
    let lists = schedule(workload, kind, config.benchmark_duration, issuers);
    let totals = run_totals(&lists);
    let backend = Backend::build(kind, indexer);
    // Leave the threads time to start before the first deadline.
    let t0 = Instant::now() + Duration::from_millis(20);
    let (sink, lanes, shared) = start_backend(backend, config, t0);
    let issuer_handles: Vec<thread::JoinHandle<IssuerStats>> = lists
        .into_iter()
        .map(|list| {
            let sink = sink.clone();
            let config = config.clone();
            thread::spawn(move || issue(list, sink, t0, &config))
        })
        .collect();
    // Issuers hold the only senders now: the lanes stop once they finish and the queues drain.
    drop(sink);
    let mut issued = IssuerStats::default();
    let mut failure_reasons = Vec::new();
    for h in issuer_handles {
        match h.join() {
            Ok(s) => issued.merge(s),
            Err(_) => failure_reasons.push("an issuer thread panicked".to_string()),
        }
    }
    let mut served = LaneStats::default();
    let mut indexer_stats = None;
    for h in lanes {
        match h.join() {
            Ok((s, stats)) => {
                served.merge(s);
                indexer_stats = indexer_stats.or(stats);
            }
            Err(_) => failure_reasons.push("an indexer thread panicked".to_string()),
        }
    }
    let indexer_stats = indexer_stats
        .or_else(|| shared.map(|idx| idx.stats()))
        .unwrap_or_default();
    let window_ns = ns(config.benchmark_duration).max(1);
    let last_issue = issued.last_issue.unwrap_or(t0);
    let end = served.last_end.unwrap_or(last_issue).max(last_issue);
    let issue_span_ns = ns(last_issue.saturating_duration_since(t0));
    let total_ns = ns(end.saturating_duration_since(t0)).max(1);
    let drain_ns = ns(end.saturating_duration_since(last_issue));
    let completed = (served.query_service.len() + served.update_accepted_to_finished.len()) as u64;
    if completed != totals.logical_ops {
        failure_reasons.push(format!(
            "{completed} of {} operations completed",
            totals.logical_ops
        ));
    }
    if issued.send_failures > 0 {
        failure_reasons.push(format!(
            "{} operations could not be sent",
            issued.send_failures
        ));
    }
    if served.failures > 0 {
        failure_reasons.push(format!("{} operations failed", served.failures));
    }
    if issue_span_ns as f64 > 1.01 * window_ns as f64 {
        failure_reasons.push(format!(
            "issuing took {:.3} s, more than 1.01 x the window",
            issue_span_ns as f64 / 1e9
        ));
    }
    let generator_valid = failure_reasons.is_empty();
    let kept_up = generator_valid && total_ns as f64 <= 1.10 * window_ns as f64;
    let per_sec = |ops: u64, span_ns: u64| ops as f64 * 1e9 / span_ns.max(1) as f64;
    OpenLoopResult {
        schema_version: 1,
        backend: kind.name().to_string(),
        timer: "std::thread::sleep + spin".to_string(),
        benchmark_duration_ms: config.benchmark_duration.as_secs_f64() * 1e3,
        issuer_threads: issuers,
        query_lanes: if shared_kind(kind) {
            config.query_lanes.max(1)
        } else {
            1
        },
        event_workers: if shared_kind(kind) {
            config.event_workers.max(1)
        } else {
            0
        },
        issuer_spin_us: config.issuer_spin.as_micros() as u64,
        totals,
        offered_logical_ops_per_sec: per_sec(totals.logical_ops, window_ns),
        actual_issue_logical_ops_per_sec: per_sec(totals.logical_ops, issue_span_ns),
        achieved_logical_ops_per_sec: per_sec(totals.logical_ops, total_ns),
        offered_block_ops_per_sec: per_sec(totals.block_ops, window_ns),
        actual_issue_block_ops_per_sec: per_sec(totals.block_ops, issue_span_ns),
        achieved_block_ops_per_sec: per_sec(totals.block_ops, total_ns),
        read_issue_lag: Distribution::of(issued.read_issue_lag),
        update_issue_lag: Distribution::of(issued.update_issue_lag),
        query_queue_wait: Distribution::of(served.query_queue_wait),
        query_service: Distribution::of(served.query_service),
        query_scheduled_to_finished: Distribution::of(served.query_scheduled_to_finished),
        update_accepted_to_finished: Distribution::of(served.update_accepted_to_finished),
        update_scheduled_to_finished: Distribution::of(served.update_scheduled_to_finished),
        delayed_reads: issued.delayed_reads,
        delayed_updates: issued.delayed_updates,
        issuer_cpu_ns: ns(issued.cpu_busy),
        issue_span_ns,
        drain_ns,
        total_ns,
        generator_valid,
        kept_up,
        failure_reasons,
        indexer_stats: indexer_stats.into(),
        provenance: None,
    }
}

/// True for the kinds that run on query lanes and event workers.
fn shared_kind(kind: IndexerKind) -> bool {
    matches!(
        kind,
        IndexerKind::ConcurrentRadixTreeCompressed | IndexerKind::BranchSharded
    )
}
