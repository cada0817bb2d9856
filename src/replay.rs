//! Offline replay: a trace driven through a [`Cluster`] on a virtual clock.
//!
//! The clock jumps from event to event: pass ends and arrivals. At each instant the replay first
//! finishes the passes that end there (a session's next turn becomes ready when its previous turn
//! completes, plus the turn's delay), then releases the arrivals that are due, then starts passes
//! on idle workers. Arrivals at the same instant go in order of (time, sequence number).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::cluster::{Cluster, ClusterConfig, ClusterStats, Output};
use crate::ids::RequestId;
use crate::metrics::{Collector, DisaggFigures, G2Figures, ReplayReport, RequestRecord};
use crate::request::{EngineRequest, Prompt};
use crate::scheduler::ConfigError;
use crate::scheduler::WorkerRole;
use crate::time::{SimDuration, SimTime};
use crate::tokens::{sequence_hashes, BlockHashes};
use crate::trace::{LocalHashCache, Trace, Turn};

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
}

/// The result of one replay.
#[derive(Debug)]
pub struct ReplayOutcome {
    /// Dynamo-compatible summary.
    pub report: ReplayReport,
    /// One record per request, in request-id order.
    pub records: Vec<RequestRecord>,
    /// Preemptions over all workers.
    pub preemptions: u64,
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
#[derive(Clone, Copy, Debug)]
struct Origin {
    session: usize,
    turn: usize,
}

/// Replays `trace` to the end. `progress` is called with (finished, total) requests now and then.
pub fn replay(
    trace: &Trace,
    config: &ReplayConfig,
    mut progress: impl FnMut(usize, usize),
) -> Result<ReplayOutcome, ReplayError> {
    let started = std::time::Instant::now();
    let mut cluster = Cluster::new(config.cluster.clone())?;
    let block_size = cluster.block_size();
    let total = trace.num_requests();
    let mut hash_cache = LocalHashCache::new(block_size);
    let mut collector = Collector::new();
    let mut origins: Vec<Origin> = Vec::with_capacity(total);
    // Ready turns: (time, sequence number) -> origin. The sequence number keeps ties in order.
    let mut arrivals: BinaryHeap<Reverse<(SimTime, u64, usize, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    for (s, session) in trace.sessions.iter().enumerate() {
        if !session.turns.is_empty() {
            arrivals.push(Reverse((session.first_arrival, seq, s, 0)));
            seq += 1;
        }
    }
    let mut done = 0usize;
    let mut now = SimTime::ZERO;
    let mut handle = |outputs: Vec<Output>,
                      collector: &mut Collector,
                      arrivals: &mut BinaryHeap<Reverse<(SimTime, u64, usize, usize)>>,
                      origins: &[Origin],
                      done: &mut usize| {
        for out in outputs {
            match out {
                Output::Admitted {
                    id,
                    worker,
                    time,
                    reused_tokens,
                    g2_reused_tokens,
                } => {
                    collector.on_admit(id, time, reused_tokens, worker);
                    collector.on_g2_reuse(id, g2_reused_tokens);
                }
                Output::KvTransfer { id, duration, .. } => collector.on_kv_transfer(id, duration),
                Output::Token { id, time, .. } => collector.on_token(id, time),
                Output::Preempted { .. } => {}
                Output::Finished { id, time } | Output::Rejected { id, time, .. } => {
                    if matches!(out, Output::Finished { .. }) {
                        collector.on_finish(id, time);
                    } else {
                        collector.on_reject(id, time);
                    }
                    *done += 1;
                    let o = origins[id.0 as usize];
                    let turns = &trace.sessions[o.session].turns;
                    if let Some(next) = turns.get(o.turn + 1) {
                        arrivals.push(Reverse((time + next.delay, seq, o.session, o.turn + 1)));
                        seq += 1;
                    }
                }
            }
        }
    };
    let mut last_progress = 0usize;
    loop {
        let next_arrival = arrivals.peek().map(|Reverse((t, ..))| *t);
        let next = match (next_arrival, cluster.next_pass_end()) {
            (Some(a), Some(p)) => a.min(p),
            (Some(a), None) => a,
            (None, Some(p)) => p,
            (None, None) => break,
        };
        now = now.max(next);
        let outs = cluster.finish_due(now);
        handle(outs, &mut collector, &mut arrivals, &origins, &mut done);
        while let Some(Reverse((t, _, s, turn_index))) = arrivals.peek().copied() {
            if t > now {
                break;
            }
            arrivals.pop();
            let turn = &trace.sessions[s].turns[turn_index];
            let request =
                engine_request(turn, config.trace_block_size, block_size, &mut hash_cache);
            let id = cluster.submit(request, now);
            debug_assert_eq!(id, RequestId(origins.len() as u64));
            origins.push(Origin {
                session: s,
                turn: turn_index,
            });
            collector.on_arrival(
                id,
                t,
                turn.input_length,
                turn.output_length,
                Some(&trace.sessions[s].id),
                turn_index,
            );
        }
        let outs = cluster.start_idle(now);
        handle(outs, &mut collector, &mut arrivals, &origins, &mut done);
        if done >= last_progress + 64 {
            last_progress = done;
            progress(done, total);
        }
    }
    progress(done, total);
    let in_flight = cluster.snapshot().active_requests;
    if in_flight > 0 {
        return Err(ReplayError::DeadEnd {
            time: now,
            in_flight,
        });
    }
    let stats = cluster.snapshot();
    let preemptions = stats.workers.iter().map(|w| w.scheduler.preemptions).sum();
    let (mut report, records) = collector.finish(started.elapsed());
    add_topology_figures(&mut report, &stats, config);
    Ok(ReplayOutcome {
        report,
        records,
        preemptions,
    })
}

/// Adds the disaggregation and host-tier figures (extra keys after Dynamo's) when those
/// features are on; an aggregated run without G2 keeps exactly Dynamo's keys.
fn add_topology_figures(report: &mut ReplayReport, stats: &ClusterStats, config: &ReplayConfig) {
    let duration_us = report.duration_ms * 1000.0;
    let utilization = |role: WorkerRole| {
        let busy: Vec<u64> = stats
            .workers
            .iter()
            .filter(|w| w.role == role)
            .map(|w| w.busy_us)
            .collect();
        if busy.is_empty() || duration_us <= 0.0 {
            return (busy.len() as u64, 0.0);
        }
        let total: u64 = busy.iter().sum();
        (
            busy.len() as u64,
            total as f64 / (busy.len() as f64 * duration_us),
        )
    };
    report.disagg = match config.cluster.serving {
        crate::cluster::ServingMode::Aggregated => None,
        crate::cluster::ServingMode::Disagg { .. } => {
            let (num_prefill_workers, prefill_pool_utilization) = utilization(WorkerRole::Prefill);
            let (num_decode_workers, decode_pool_utilization) = utilization(WorkerRole::Decode);
            let total_ms = SimDuration(stats.kv_transfer_us).as_millis_f64();
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
    turn: &Turn,
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
        },
        max_output_tokens: turn.output_length,
        output_tokens: Vec::new(),
    }
}
