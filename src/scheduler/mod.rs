//! Continuous batching, one pass at a time, in three flavours (vLLM, SGLang, TRT-LLM).
//!
//! A [`Scheduler`] owns one worker's waiting and running queues and its [`KvPool`]. Each call to
//! `Scheduler::start_pass` decides what the next pass computes (running requests first, then
//! admissions from the head of the waiting queue), allocates KV blocks (preempting when they run
//! out), and returns the pass duration from the latency model. `Scheduler::finish_pass` then
//! emits one token for every request that was ready, and completes those that reached their
//! output limit.

mod admission;
mod blocks;
mod config;
mod event;
mod offload;
mod pass;
mod policy;
mod reject;
mod sglang;
mod vllm;
pub use admission::RejectReason;
pub use config::{show_number, ConfigError, EngineConfig, SglangConfig, WorkerRole};
pub(crate) use event::PassPlan;
pub use event::{SchedulerEvent, SchedulerStats};
pub use policy::{BatchingPolicy, EngineType, PreemptionMode};

use std::collections::VecDeque;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use offload::Offload;

use crate::ids::RequestId;
use crate::kv::{BlockId, BlockRef, KvEventData, KvPool};
use crate::perf::PrefillBatch;
use crate::request::EngineRequest;
use crate::time::SimTime;
use crate::tokens::{BlockHashes, Token};

/// Where a request is in its life on this worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Running,
}

/// One request on this worker.
#[derive(Debug)]
struct Seq {
    id: RequestId,
    /// Hashes of every full block of prompt + generated tokens.
    hashes: BlockHashes,
    /// The pool's ids of the leading blocks of `hashes`, held until the request leaves. Taken
    /// when the request is first looked up for admission and extended before each allocation
    /// ([`Scheduler::intern_blocks`]), not on arrival: a long waiting queue holds no ids, so
    /// the pool's tables stay as small as what it caches and runs. Empty without prefix
    /// caching.
    ids: Vec<BlockId>,
    /// Tokens after the last full block.
    tail: Vec<Token>,
    prompt_len: usize,
    /// Tokens generated so far (kept across preemption).
    generated: usize,
    max_output: usize,
    /// Caller-chosen output ids, consumed in order.
    planned: Vec<Token>,
    /// Tokens whose KV is computed (or cached) on this worker.
    computed: usize,
    /// Tokens scheduled in the current pass.
    scheduled: usize,
    /// KV blocks held.
    blocks: Vec<BlockRef>,
    phase: Phase,
    /// The prefill-batch contribution of this pass, refunded if the request is preempted.
    prefill_isl: usize,
    prefill_prefix: usize,
    /// Preempted (SGLang: retracted) at least once.
    retracted: bool,
    /// Blocks `[start, end)` onboarded from G2 for the coming admission; None when none. Also
    /// stops a second onboard before the request is admitted.
    onboarded: Option<(usize, usize)>,
}

impl Seq {
    fn len(&self) -> usize {
        self.prompt_len + self.generated
    }

    fn push_token(&mut self, token: Token, block_size: usize) {
        self.tail.push(token);
        self.generated += 1;
        if self.tail.len() == block_size {
            self.hashes.push_block(&self.tail);
            self.tail.clear();
        }
    }

    fn remaining_output(&self) -> usize {
        self.max_output - self.generated
    }
}

/// One worker's batching scheduler and KV pool.
#[derive(Debug)]
pub struct Scheduler {
    /// Engine settings (validated).
    config: EngineConfig,
    /// The flavour's batching behaviour (from `config`).
    policy: BatchingPolicy,
    /// The worker's KV pool.
    pool: KvPool,
    /// Every request on this worker, by slot; `None` slots are free for reuse.
    seqs: Vec<Option<Seq>>,
    free_slots: Vec<usize>,
    /// Admission order (front first); holds slots.
    waiting: VecDeque<usize>,
    /// Scheduling order (front first); holds slots.
    running: Vec<usize>,
    /// Token ids for requests without planned output.
    rng: ChaCha8Rng,
    /// SGLang's adaptive share of each running request's remaining output reserved at admission.
    new_token_ratio: f64,
    /// Slots that emit a token when the current pass ends.
    ready: Vec<usize>,
    /// Scratch list of the slots that finish in `finish_pass` (kept for its capacity).
    finished: Vec<usize>,
    /// True between `start_pass` and `finish_pass`.
    in_pass: bool,
    preemptions: u64,
    /// Requests rejected as unschedulable on an idle worker (a defect counter).
    unschedulable: u64,
    /// Events produced while planning, drained by the worker.
    events: Vec<SchedulerEvent>,
    /// The latest time the worker reported (transfers start then).
    now: SimTime,
    /// Host tier, when configured.
    offload: Option<Offload>,
    /// Slots parked while an onboard is in flight (no blocks held).
    awaiting: Vec<usize>,
}

impl Scheduler {
    /// A scheduler with an empty pool. `seed` drives generated token ids.
    pub(crate) fn new(config: EngineConfig, seed: u64) -> Scheduler {
        let mut pool = KvPool::new(config.num_gpu_blocks, config.enable_prefix_caching);
        let new_token_ratio = config.sglang.init_new_token_ratio();
        let offload = config.g2.as_ref().map(|g2| {
            pool.track_evictions();
            Offload::new(g2, config.block_size)
        });
        Scheduler {
            policy: config.policy(),
            config,
            pool,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            new_token_ratio,
            ready: Vec::new(),
            finished: Vec::new(),
            in_pass: false,
            preemptions: 0,
            unschedulable: 0,
            events: Vec::new(),
            now: SimTime::ZERO,
            offload,
            awaiting: Vec::new(),
        }
    }

    /// The engine settings.
    pub(crate) fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Empties the prefix cache (vLLM's `reset_prefix_cache`; a `Cleared` KV event when events
    /// are recorded). False, changing nothing, during a pass or while a request holds blocks.
    pub(crate) fn reset_prefix_cache(&mut self) -> bool {
        !self.in_pass && self.pool.reset()
    }

    /// The KV pool (read only).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Makes room in the KV pool for `blocks` blocks ([`KvPool::reserve`]).
    pub(crate) fn reserve_pool(&mut self, blocks: usize) {
        self.pool.reserve(blocks);
    }

    /// Queues a request. Its prompt blocks must be hashed at this engine's block size.
    pub(crate) fn enqueue(&mut self, id: RequestId, request: EngineRequest) {
        let mut max_output = request.max_output_tokens;
        if self.policy.reserves_full_output {
            // Guaranteed-no-evict reserves to completion: the output cannot outgrow the pool
            // (requests the cluster accepted never need this cut).
            let capacity = self.config.num_gpu_blocks * self.config.block_size;
            max_output = max_output.min(capacity.saturating_sub(request.prompt.len));
        }
        let seq = Seq {
            id,
            hashes: request.prompt.blocks,
            ids: Vec::new(),
            tail: request.prompt.tail,
            prompt_len: request.prompt.len,
            generated: 0,
            max_output,
            planned: request.output_tokens,
            computed: 0,
            scheduled: 0,
            blocks: Vec::new(),
            phase: Phase::Waiting,
            prefill_isl: 0,
            prefill_prefix: 0,
            retracted: false,
            onboarded: None,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.seqs[s] = Some(seq);
                s
            }
            None => {
                self.seqs.push(Some(seq));
                self.seqs.len() - 1
            }
        };
        self.waiting.push_back(slot);
    }

    /// Removes a request (the client went away), releasing its blocks. Returns false when it is
    /// not here. Must not be called during a pass for a request in it; the worker defers those.
    pub(crate) fn cancel(&mut self, id: RequestId) -> bool {
        let Some(slot) = self.slot_of(id) else {
            return false;
        };
        self.waiting.retain(|&s| s != slot);
        self.running.retain(|&s| s != slot);
        self.ready.retain(|&s| s != slot);
        self.awaiting.retain(|&s| s != slot);
        self.remove(slot);
        true
    }

    /// True when a pass would do something.
    pub(crate) fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Requests waiting for admission (what [`Scheduler::stats`] reports as `waiting`).
    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Counters for metrics and routing.
    pub fn stats(&self) -> SchedulerStats {
        SchedulerStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            active_blocks: self.pool.num_active_blocks(),
            inactive_blocks: self.pool.num_inactive_blocks(),
            preemptions: self.preemptions,
            awaiting_onboard: self.awaiting.len(),
            g2_resident_blocks: self.offload.as_ref().map_or(0, Offload::resident_blocks),
            g2_offloaded_blocks: self.offload.as_ref().map_or(0, Offload::offloaded_blocks),
            g2_onboarded_blocks: self.offload.as_ref().map_or(0, |o| o.onboarded_blocks),
            unschedulable: self.unschedulable,
        }
    }

    /// Takes the scheduler events produced so far.
    pub(crate) fn drain_events(&mut self) -> Vec<SchedulerEvent> {
        std::mem::take(&mut self.events)
    }

    /// Takes the scheduler events produced so far by swapping them with `buf`, which must be
    /// empty: a driver that hands the same buffer back every time allocates nothing per pass.
    pub(crate) fn swap_events(&mut self, buf: &mut Vec<SchedulerEvent>) {
        debug_assert!(buf.is_empty(), "swap_events with a non-empty buffer");
        std::mem::swap(&mut self.events, buf);
    }

    /// Records KV events (the default), or not where nobody reads them.
    pub(crate) fn set_emit_kv_events(&mut self, on: bool) {
        self.pool.set_emit_events(on);
    }

    /// True when KV events are recorded.
    #[cfg(test)]
    pub(crate) fn emits_kv_events(&self) -> bool {
        self.pool.emits_events()
    }

    /// Takes the KV events produced so far.
    pub(crate) fn drain_kv_events(&mut self) -> Vec<KvEventData> {
        self.pool.drain_events()
    }

    fn seq(&self, slot: usize) -> &Seq {
        self.seqs[slot].as_ref().expect("slot is live")
    }

    fn seq_mut(&mut self, slot: usize) -> &mut Seq {
        self.seqs[slot].as_mut().expect("slot is live")
    }

    fn slot_of(&self, id: RequestId) -> Option<usize> {
        self.seqs
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.id == id))
    }

    fn remove(&mut self, slot: usize) {
        if let Some(mut s) = self.seqs[slot].take() {
            self.pool.release(&mut s.blocks);
            self.pool.forget(&s.ids);
            self.free_slots.push(slot);
        }
    }

    /// Checks the scheduler's bookkeeping and the pool's. Panics on a violation.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        use std::collections::BTreeMap;

        use crate::tokens::SequenceHash;

        self.pool.assert_invariants();
        // Each request holds the pool's id of each of its blocks, and nothing else does.
        let mut holds: BTreeMap<SequenceHash, u32> = BTreeMap::new();
        for s in self.seqs.iter().flatten() {
            if self.pool.prefix_caching() {
                assert!(s.ids.len() <= s.hashes.len(), "at most one id per block");
            } else {
                assert!(s.ids.is_empty(), "no ids without prefix caching");
            }
            for &h in &s.hashes.sequence[..s.ids.len()] {
                *holds.entry(h).or_default() += 1;
            }
        }
        let total: u64 = holds.values().map(|&n| u64::from(n)).sum();
        assert_eq!(self.pool.num_holds(), total, "no hold outlives its request");
        for (h, n) in holds {
            assert_eq!(self.pool.holds(h), n, "holds of block {h:?}");
        }
        let mut seen = vec![false; self.seqs.len()];
        for &slot in self.waiting.iter().chain(&self.running) {
            assert!(!seen[slot], "slot {slot} queued twice");
            seen[slot] = true;
            let s = self.seq(slot);
            assert!(s.generated <= s.max_output, "generated past the limit");
            assert_eq!(
                s.hashes.len(),
                s.len() / self.config.block_size,
                "hash chain length"
            );
            assert_eq!(
                s.tail.len(),
                s.len() % self.config.block_size,
                "tail length"
            );
        }
        for &slot in &self.awaiting {
            assert!(!seen[slot], "slot {slot} parked and queued");
            seen[slot] = true;
            let s = self.seq(slot);
            assert_eq!(s.phase, Phase::Waiting);
            assert!(
                s.blocks.is_empty(),
                "a request awaiting onboard holds no blocks"
            );
        }
        if let Some(off) = &self.offload {
            let parked: Vec<RequestId> = self.awaiting.iter().map(|&s| self.seq(s).id).collect();
            off.assert_invariants(&parked);
        } else {
            assert!(self.awaiting.is_empty());
        }
        for &slot in &self.waiting {
            let s = self.seq(slot);
            assert_eq!(s.phase, Phase::Waiting);
            assert!(s.blocks.is_empty(), "waiting request holds no blocks");
            assert_eq!(s.computed, 0);
        }
        for &slot in &self.running {
            let s = self.seq(slot);
            assert_eq!(s.phase, Phase::Running);
            assert!(
                s.computed + s.scheduled <= s.len(),
                "computed past the sequence"
            );
            assert!(s.blocks.len() >= (s.computed + s.scheduled).div_ceil(self.config.block_size));
        }
        assert!(
            self.running.len() <= self.config.max_num_seqs,
            "max_num_seqs exceeded"
        );
        let live = self.seqs.iter().filter(|s| s.is_some()).count();
        assert_eq!(
            live,
            self.waiting.len() + self.running.len() + self.awaiting.len(),
            "every live request is queued"
        );
    }
}

/// Per-pass accumulators.
struct PassState {
    budget: usize,
    batch: PrefillBatch,
    preempted_any: bool,
    scheduled_any: bool,
}

#[cfg(test)]
mod tests;
