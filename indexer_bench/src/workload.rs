//! Workload preparation for the indexer benchmark: a trace becomes per-worker timelines of
//! lookups and KV events, produced by replaying each worker's share on a mock engine offline.
//!
//! The pipeline follows Dynamo's `mooncake_bench` (`common/replay.rs`): expand the hash prefix
//! depth, duplicate the hash space, partition sessions over workers with a seeded random
//! assignment, replay every worker's sessions on its own engine (virtual clock), and record the
//! request lookups (local block hashes at arrival) and the KV events (at the end of the pass that
//! produced them). `-d` then replays copies of every worker under distinct ids.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use servesim::ids::{RequestId, WorkerId};
use servesim::kv::{KvEvent, KvEventData};
use servesim::replay::engine_request;
use servesim::scheduler::{ConfigError, EngineConfig, SchedulerEvent};
use servesim::time::SimTime;
use servesim::tokens::{LocalBlockHash, SequenceHash};
use servesim::trace::{LocalHashCache, Session, Trace};
use servesim::worker::Worker;

/// How a trace is turned into a benchmark workload (Dynamo's corpus flags).
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Workers the sessions are partitioned over (`-n`, Dynamo default 1000).
    pub num_unique_workers: usize,
    /// Copies of every worker's timeline under distinct ids (`-d`, default 1).
    pub worker_duplication_factor: usize,
    /// Each hash id becomes this many consecutive ids, prompts this many times longer (default 1).
    pub trace_length_factor: usize,
    /// Copies of the whole trace in disjoint hash spaces (default 1).
    pub trace_duplication_factor: usize,
    /// Prompt tokens per trace hash id (512 in the public traces).
    pub trace_block_size: usize,
    /// The mock engine each worker replays on (its `block_size` is the indexer's block size).
    pub engine: EngineConfig,
    /// Seeds the session partition and the engines.
    pub seed: u64,
}

/// One thing the indexer is asked to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A request arrived: `find_matches` over its local block hashes.
    Lookup {
        /// Local hashes of the prompt's full blocks.
        local: Vec<LocalBlockHash>,
        /// Their sequence hashes (used by routing-decision writes in approximate mode).
        seq: Vec<SequenceHash>,
    },
    /// A KV event from the worker's engine.
    Event(KvEvent),
}

/// An operation at a simulated instant.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedOp {
    /// When it happened in the worker's simulated timeline.
    pub at: SimTime,
    /// What happened.
    pub op: Op,
}

/// Everything one worker sends the indexer, in order (lookups before events on ties).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerTimeline {
    /// The worker (distinct across `-d` copies).
    pub worker: WorkerId,
    /// Its operations in time order.
    pub ops: Vec<TimedOp>,
}

impl WorkerTimeline {
    /// Time between the first and the last operation.
    pub fn span(&self) -> u64 {
        match (self.ops.first(), self.ops.last()) {
            (Some(a), Some(b)) => b.at.as_micros() - a.at.as_micros(),
            _ => 0,
        }
    }
}

/// Operation and block counts of a workload (Dynamo's denominators).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkloadTotals {
    /// Lookups (one per request).
    pub requests: u64,
    /// KV events of every kind.
    pub events: u64,
    /// Stored events.
    pub stored_events: u64,
    /// Removed events.
    pub removed_events: u64,
    /// Cleared events.
    pub cleared_events: u64,
    /// Block hashes over all lookups.
    pub request_blocks: u64,
    /// Blocks over all Stored events.
    pub stored_blocks: u64,
    /// Hashes over all Removed events.
    pub removed_blocks: u64,
}

impl WorkloadTotals {
    /// Requests + Stored + Removed + Cleared.
    pub fn logical_ops(&self) -> u64 {
        self.requests + self.events
    }

    /// Request hashes + Stored blocks + Removed hashes (Cleared counts 0 blocks).
    pub fn block_ops(&self) -> u64 {
        self.request_blocks + self.stored_blocks + self.removed_blocks
    }

    fn add(&mut self, op: &Op) {
        match op {
            Op::Lookup { local, .. } => {
                self.requests += 1;
                self.request_blocks += local.len() as u64;
            }
            Op::Event(e) => {
                self.events += 1;
                match &e.data {
                    KvEventData::Stored { blocks, .. } => {
                        self.stored_events += 1;
                        self.stored_blocks += blocks.len() as u64;
                    }
                    KvEventData::Removed { seq_hashes } => {
                        self.removed_events += 1;
                        self.removed_blocks += seq_hashes.len() as u64;
                    }
                    KvEventData::Cleared => self.cleared_events += 1,
                }
            }
        }
    }
}

/// The prepared benchmark input: one timeline per (duplicated) worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// Timelines ordered by worker id.
    pub workers: Vec<WorkerTimeline>,
    /// Counts over all timelines.
    pub totals: WorkloadTotals,
}

/// Why a workload could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The engine settings cannot work.
    #[error(transparent)]
    Engine(#[from] ConfigError),
    /// A corpus setting is out of range.
    #[error("{0}")]
    Setting(String),
}

/// Each hash id `h` becomes `h*f .. h*f+f-1` and every prompt gets `f` times longer
/// (Dynamo's `expand_hash_prefix_depth`).
pub fn expand_hash_prefix_depth(trace: &mut Trace, factor: usize) {
    if factor <= 1 {
        return;
    }
    let f = factor as u64;
    for turn in trace.sessions.iter_mut().flat_map(|s| &mut s.turns) {
        turn.hash_ids = turn
            .hash_ids
            .iter()
            .flat_map(|&h| (0..f).map(move |i| h.wrapping_mul(f).wrapping_add(i)))
            .collect();
        turn.input_length *= factor;
    }
}

/// `copies` copies of the trace, copy `k` with hash ids offset by `(max_id + 1) * k` and session
/// ids suffixed `:copy_k` (Dynamo's `duplicate_hash_space`).
pub fn duplicate_hash_space(trace: &Trace, copies: usize) -> Trace {
    if copies <= 1 {
        return trace.clone();
    }
    let max_id = trace
        .sessions
        .iter()
        .flat_map(|s| &s.turns)
        .flat_map(|t| &t.hash_ids)
        .copied()
        .max()
        .unwrap_or(0);
    let mut sessions = Vec::with_capacity(trace.sessions.len() * copies);
    for k in 0..copies as u64 {
        let offset = max_id.wrapping_add(1).wrapping_mul(k);
        for s in &trace.sessions {
            let mut s = s.clone();
            if k > 0 {
                s.id = format!("{}:copy_{k}", s.id);
                for t in &mut s.turns {
                    for h in &mut t.hash_ids {
                        *h = h.wrapping_add(offset);
                    }
                }
            }
            sessions.push(s);
        }
    }
    Trace { sessions }
}

/// Sessions assigned to `n` workers uniformly at random (seeded), in trace order within each.
pub fn partition_by_session(trace: &Trace, n: usize, seed: u64) -> Vec<Vec<Session>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut parts = vec![Vec::new(); n];
    for s in &trace.sessions {
        parts[rng.gen_range(0..n)].push(s.clone());
    }
    parts
}

/// Replays one worker's sessions on its own engine (virtual clock) and records its lookups and
/// KV events. Turn `k + 1` of a session arrives its delay after turn `k` finishes.
pub fn simulate_worker(
    sessions: &[Session],
    worker: WorkerId,
    engine: &EngineConfig,
    trace_block_size: usize,
    seed: u64,
) -> Vec<TimedOp> {
    let mut w = Worker::new(worker, engine.clone(), seed);
    let mut cache = LocalHashCache::new(engine.block_size);
    // (arrival, sequence number, session, turn): the sequence number keeps ties in order.
    let mut arrivals: BinaryHeap<Reverse<(SimTime, u64, usize, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for (i, s) in sessions.iter().enumerate() {
        arrivals.push(Reverse((s.first_arrival, seq, i, 0)));
        seq += 1;
    }
    let mut origin: Vec<(usize, usize)> = Vec::new();
    let mut ops = Vec::new();
    let mut now = SimTime::ZERO;
    let mut settle = |w: &mut Worker,
                      now: SimTime,
                      ops: &mut Vec<TimedOp>,
                      arrivals: &mut BinaryHeap<_>,
                      origin: &[(usize, usize)]| {
        if w.pass_end().is_none() {
            // KV events become visible when the pass that produced them ends.
            ops.extend(w.drain_kv_events().into_iter().map(|e| TimedOp {
                at: now,
                op: Op::Event(e),
            }));
        }
        for e in w.drain_events() {
            if let SchedulerEvent::Finished { id } | SchedulerEvent::Rejected { id, .. } = e {
                let (s, t) = origin[id.0 as usize];
                if let Some(next) = sessions[s].turns.get(t + 1) {
                    arrivals.push(Reverse((now + next.delay, seq, s, t + 1)));
                    seq += 1;
                }
            }
        }
    };
    loop {
        let next_arrival = arrivals.peek().map(|Reverse((t, ..))| *t);
        let next = match (next_arrival, w.pass_end()) {
            (Some(a), Some(p)) => a.min(p),
            (Some(a), None) => a,
            (None, Some(p)) => p,
            (None, None) if w.wants_pass() => now,
            (None, None) => break,
        };
        now = now.max(next);
        if w.pass_end().is_some_and(|e| e <= now) {
            w.finish_pass();
            settle(&mut w, now, &mut ops, &mut arrivals, &origin);
        }
        while let Some(&Reverse((t, _, s, turn))) = arrivals.peek() {
            if t > now {
                break;
            }
            arrivals.pop();
            let request = engine_request(
                &sessions[s].turns[turn],
                trace_block_size,
                engine.block_size,
                &mut cache,
            );
            ops.push(TimedOp {
                at: t,
                op: Op::Lookup {
                    local: request.prompt.blocks.local.clone(),
                    seq: request.prompt.blocks.sequence.clone(),
                },
            });
            w.enqueue(RequestId(origin.len() as u64), request);
            origin.push((s, turn));
        }
        if w.wants_pass() {
            w.start_pass(now);
            settle(&mut w, now, &mut ops, &mut arrivals, &origin);
        }
    }
    // Lookups before events on ties; otherwise the order of production (stable).
    ops.sort_by_key(|o| (o.at, matches!(o.op, Op::Event(_))));
    ops
}

/// Prepares the benchmark workload from a loaded trace.
pub fn prepare(trace: &Trace, config: &WorkloadConfig) -> Result<Workload, WorkloadError> {
    config.engine.validate()?;
    let positive = [
        ("--num-unique-inference-workers", config.num_unique_workers),
        (
            "--inference-worker-duplication-factor",
            config.worker_duplication_factor,
        ),
        ("--trace-length-factor", config.trace_length_factor),
        (
            "--trace-duplication-factor",
            config.trace_duplication_factor,
        ),
        ("--trace-block-size", config.trace_block_size),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(WorkloadError::Setting(format!("{name} must be positive")));
    }
    let mut trace = trace.clone();
    expand_hash_prefix_depth(&mut trace, config.trace_length_factor);
    let trace = duplicate_hash_space(&trace, config.trace_duplication_factor);
    let parts = partition_by_session(&trace, config.num_unique_workers, config.seed);
    let n = config.num_unique_workers;
    let unique: Vec<Vec<TimedOp>> = parts
        .iter()
        .enumerate()
        .map(|(i, sessions)| {
            let seed = config.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64);
            simulate_worker(
                sessions,
                WorkerId(i as u32),
                &config.engine,
                config.trace_block_size,
                seed,
            )
        })
        .collect();
    let mut workers = Vec::with_capacity(n * config.worker_duplication_factor);
    let mut totals = WorkloadTotals::default();
    for copy in 0..config.worker_duplication_factor {
        for (i, ops) in unique.iter().enumerate() {
            let worker = WorkerId((copy * n + i) as u32);
            let ops: Vec<TimedOp> = ops
                .iter()
                .map(|o| {
                    let mut o = o.clone();
                    if let Op::Event(e) = &mut o.op {
                        e.worker = worker;
                    }
                    totals.add(&o.op);
                    o
                })
                .collect();
            workers.push(WorkerTimeline { worker, ops });
        }
    }
    Ok(Workload { workers, totals })
}
