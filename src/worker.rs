//! One simulated worker: a scheduler with its KV pool (and host tier), run one pass at a time on
//! the caller's clock, tagging its KV events with the worker id and a per-worker sequence number.
//! Its role (aggregated, prefill or decode) comes from its engine config.

use crate::ids::{RequestId, WorkerId};
use crate::kv::KvEvent;
use crate::request::EngineRequest;
pub(crate) use crate::scheduler::WorkerRole;
use crate::scheduler::{EngineConfig, PassPlan, Scheduler, SchedulerEvent, SchedulerStats};
use crate::time::{SimDuration, SimTime};

/// A worker and the pass it is running, if any.
#[derive(Debug)]
pub struct Worker {
    /// This worker's id.
    id: WorkerId,
    /// Batching and KV state.
    scheduler: Scheduler,
    /// End of the pass in progress; None while idle.
    pass_end: Option<SimTime>,
    /// Next KV event id (per worker, from 0).
    next_event_id: u64,
    /// Passes run so far.
    passes: u64,
    /// Simulated time spent in passes, for utilisation.
    busy: SimDuration,
    /// Idle with work that cannot start a pass until an onboard in flight completes: the
    /// worker then needs no wake-up of its own (cleared by anything that changes its queues).
    stalled: bool,
}

impl Worker {
    /// An idle worker with an empty pool.
    pub fn new(id: WorkerId, config: EngineConfig, seed: u64) -> Worker {
        Worker {
            id,
            scheduler: Scheduler::new(config, seed),
            pass_end: None,
            next_event_id: 0,
            passes: 0,
            busy: SimDuration::ZERO,
            stalled: false,
        }
    }

    /// This worker's id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// The scheduler (read only).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Makes room in the worker's KV pool for `blocks` blocks ([`KvPool::reserve`]).
    ///
    /// [`KvPool::reserve`]: crate::kv::KvPool::reserve
    pub(crate) fn reserve_pool(&mut self, blocks: usize) {
        self.scheduler.reserve_pool(blocks);
    }

    /// End of the pass in progress.
    pub fn pass_end(&self) -> Option<SimTime> {
        self.pass_end
    }

    /// Aggregated, prefill or decode.
    pub(crate) fn role(&self) -> WorkerRole {
        self.scheduler.config().role
    }

    /// When the worker next needs the caller: the end of its pass or of a G2 onboard.
    pub(crate) fn next_timer(&self) -> Option<SimTime> {
        match (self.pass_end, self.scheduler.next_transfer_end()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the next G2 onboard completes.
    pub(crate) fn next_transfer_end(&self) -> Option<SimTime> {
        self.scheduler.next_transfer_end()
    }

    /// Completes the G2 transfers due by `now`.
    pub(crate) fn advance_transfers(&mut self, now: SimTime) {
        self.scheduler.advance_transfers(now);
        self.stalled = false;
    }

    /// True when idle with work queued that a pass could take: the caller should start a pass
    /// now.
    pub fn wants_pass(&self) -> bool {
        self.pass_end.is_none() && !self.stalled && self.scheduler.has_work()
    }

    /// Queues a request.
    pub fn enqueue(&mut self, id: RequestId, request: EngineRequest) {
        self.scheduler.enqueue(id, request);
        self.stalled = false;
    }

    /// Drops a request and frees its blocks at once.
    pub(crate) fn cancel(&mut self, id: RequestId) -> bool {
        self.stalled = false;
        self.scheduler.cancel(id)
    }

    /// Starts a pass at `now` if idle with work; returns its end time.
    ///
    /// Liveness: when work is queued but no pass can start, the worker either waits for an
    /// onboard in flight (it is then stalled until the transfer completes) or, with nothing in
    /// flight that could change its state, rejects the blocking request as
    /// [`RejectReason::Unschedulable`](crate::scheduler::RejectReason::Unschedulable) and tries
    /// again. So an idle worker never holds work it will not run.
    pub fn start_pass(&mut self, now: SimTime) -> Option<SimTime> {
        if self.pass_end.is_some() {
            return self.pass_end;
        }
        self.scheduler.advance_transfers(now);
        loop {
            if let Some(PassPlan { duration, .. }) = self.scheduler.start_pass() {
                let end = now + duration;
                self.stalled = false;
                self.pass_end = Some(end);
                self.passes += 1;
                self.busy += duration;
                return Some(end);
            }
            if !self.scheduler.has_work() {
                return None;
            }
            if self.scheduler.next_transfer_end().is_some() {
                self.stalled = true;
                return None;
            }
            if !self.scheduler.reject_unschedulable() {
                return None;
            }
        }
    }

    /// Ends the pass in progress (the caller has reached its end time).
    pub fn finish_pass(&mut self) {
        self.scheduler.finish_pass();
        self.pass_end = None;
    }

    /// Scheduler events since the last call.
    pub fn drain_events(&mut self) -> Vec<SchedulerEvent> {
        self.scheduler.drain_events()
    }

    /// Scheduler events since the last call, swapped with the empty `buf` (no allocation when
    /// the caller hands the same buffer back each time).
    pub(crate) fn swap_events(&mut self, buf: &mut Vec<SchedulerEvent>) {
        self.scheduler.swap_events(buf);
    }

    /// Records KV events (the default), or not where nobody reads them.
    pub(crate) fn set_emit_kv_events(&mut self, on: bool) {
        self.scheduler.set_emit_kv_events(on);
    }

    /// True when KV events are recorded.
    #[cfg(test)]
    pub(crate) fn emits_kv_events(&self) -> bool {
        self.scheduler.emits_kv_events()
    }

    /// Empties the prefix cache ([`Scheduler::reset_prefix_cache`]); false while busy.
    pub(crate) fn reset_prefix_cache(&mut self) -> bool {
        self.scheduler.reset_prefix_cache()
    }

    /// KV events since the last call, tagged with this worker's id and sequence numbers.
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.scheduler
            .drain_kv_events()
            .into_iter()
            .map(|data| {
                let event_id = self.next_event_id;
                self.next_event_id += 1;
                KvEvent {
                    worker: self.id,
                    event_id,
                    data,
                }
            })
            .collect()
    }

    /// Counters for metrics.
    pub(crate) fn stats(&self) -> WorkerStats {
        WorkerStats {
            worker: self.id,
            role: self.role(),
            scheduler: self.scheduler.stats(),
            num_gpu_blocks: self.scheduler.config().num_gpu_blocks,
            passes: self.passes,
            busy_ns: self.busy.as_nanos(),
        }
    }
}

/// A worker's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WorkerStats {
    /// The worker.
    pub worker: WorkerId,
    /// Its role in the topology.
    pub role: WorkerRole,
    /// Queue and KV counters.
    pub scheduler: SchedulerStats,
    /// Pool size.
    pub num_gpu_blocks: usize,
    /// Passes run.
    pub(crate) passes: u64,
    /// Simulated nanoseconds spent in passes.
    pub busy_ns: u64,
}
