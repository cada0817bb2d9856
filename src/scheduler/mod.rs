//! Continuous batching, one pass at a time, in three flavours (vLLM, SGLang, TRT-LLM).
//!
//! A [`Scheduler`] owns one worker's waiting and running queues and its [`KvPool`]. Each call to
//! [`Scheduler::start_pass`] decides what the next pass computes (running requests first, then
//! admissions from the head of the waiting queue), allocates KV blocks (preempting when they run
//! out), and returns the pass duration from the latency model. [`Scheduler::finish_pass`] then
//! emits one token for every request that was ready, and completes those that reached their
//! output limit.

mod admission;
mod config;
mod offload;
mod policy;
mod sglang;
pub use admission::RejectReason;
pub use config::{ConfigError, EngineConfig, SglangConfig, WorkerRole};
pub use policy::{BatchingPolicy, EngineType, Planner, PreemptionMode, VictimOrder};

use std::collections::{BTreeMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use offload::Offload;

use crate::ids::RequestId;
use crate::kv::{BlockId, BlockRef, KvEventData, KvPool, SequenceBlocks};
use crate::perf::{DecodeBatch, PrefillBatch};
use crate::request::EngineRequest;
use crate::time::{SimDuration, SimTime};
use crate::tokens::{BlockHashes, SequenceHash, Token};

/// Something a pass did that the outside world needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedulerEvent {
    /// The request was admitted (again, after a preemption) with this many prompt tokens served
    /// from the prefix cache.
    Admitted {
        /// The request.
        id: RequestId,
        /// Prompt tokens found in the cache and not recomputed (G1 hits, onboarded G2 included).
        reused_tokens: usize,
        /// Of those, tokens whose blocks were onboarded from the host tier (G2) for this
        /// admission.
        g2_reused_tokens: usize,
    },
    /// The request was preempted; it keeps its generated tokens and recomputes later.
    Preempted {
        /// The request.
        id: RequestId,
    },
    /// One output token.
    Token {
        /// The request.
        id: RequestId,
        /// The token id.
        token: Token,
        /// 1 for the first token.
        index: usize,
    },
    /// The request generated its last token; its blocks are released.
    Finished {
        /// The request.
        id: RequestId,
    },
    /// The request can never run here (prompt longer than the context or the KV pool).
    Rejected {
        /// The request.
        id: RequestId,
        /// Why.
        reason: RejectReason,
    },
}

/// The result of planning a pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassPlan {
    /// How long the pass takes (prefill then decode).
    pub duration: SimDuration,
    /// The same in microseconds before rounding, so that a worker running passes back to back
    /// keeps the fractions and its clock does not drift from the latency model's.
    pub exact_us: f64,
    /// New prompt tokens computed.
    pub prefill_tokens: usize,
    /// Requests that emit a token at the end of the pass.
    pub decoding: usize,
}

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

/// Counters a worker exposes for metrics and routing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SchedulerStats {
    /// Requests waiting for admission.
    pub waiting: usize,
    /// Requests admitted and not finished.
    pub running: usize,
    /// KV blocks held by running requests.
    pub active_blocks: usize,
    /// Cached blocks nobody holds.
    pub inactive_blocks: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Requests parked while their prefix is onboarded from G2.
    pub awaiting_onboard: usize,
    /// Blocks resident in the G2 tier.
    pub g2_resident_blocks: usize,
    /// Blocks offloaded to G2 so far (transfers completed).
    pub g2_offloaded_blocks: u64,
    /// Blocks onboarded from G2 so far (transfers completed).
    pub g2_onboarded_blocks: u64,
    /// Requests rejected because an idle worker could not schedule them
    /// ([`RejectReason::Unschedulable`]); always 0 unless the scheduler has a defect.
    pub unschedulable: u64,
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
    pub fn new(config: EngineConfig, seed: u64) -> Scheduler {
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
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Empties the prefix cache (vLLM's `reset_prefix_cache`; a `Cleared` KV event when events
    /// are recorded). False, changing nothing, during a pass or while a request holds blocks.
    pub fn reset_prefix_cache(&mut self) -> bool {
        !self.in_pass && self.pool.reset()
    }

    /// The KV pool (read only).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Makes room in the KV pool for `blocks` blocks ([`KvPool::reserve`]).
    pub fn reserve_pool(&mut self, blocks: usize) {
        self.pool.reserve(blocks);
    }

    /// Queues a request. Its prompt blocks must be hashed at this engine's block size.
    pub fn enqueue(&mut self, id: RequestId, request: EngineRequest) {
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
    pub fn cancel(&mut self, id: RequestId) -> bool {
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
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Whether `id` is scheduled in the pass in progress.
    pub fn in_current_pass(&self, id: RequestId) -> bool {
        self.in_pass && self.slot_of(id).is_some_and(|s| self.running.contains(&s))
    }

    /// Requests waiting for admission (what [`Scheduler::stats`] reports as `waiting`).
    pub fn num_waiting(&self) -> usize {
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
    pub fn drain_events(&mut self) -> Vec<SchedulerEvent> {
        std::mem::take(&mut self.events)
    }

    /// Takes the scheduler events produced so far by swapping them with `buf`, which must be
    /// empty: a driver that hands the same buffer back every time allocates nothing per pass.
    pub fn swap_events(&mut self, buf: &mut Vec<SchedulerEvent>) {
        debug_assert!(buf.is_empty(), "swap_events with a non-empty buffer");
        std::mem::swap(&mut self.events, buf);
    }

    /// Records KV events (the default), or not where nobody reads them.
    pub fn set_emit_kv_events(&mut self, on: bool) {
        self.pool.set_emit_events(on);
    }

    /// True when KV events are recorded.
    pub fn emits_kv_events(&self) -> bool {
        self.pool.emits_events()
    }

    /// Takes the KV events produced so far.
    pub fn drain_kv_events(&mut self) -> Vec<KvEventData> {
        self.pool.drain_events()
    }

    /// Plans the next pass: schedules running requests, admits waiting ones, allocates their KV,
    /// and returns the pass duration; `None` when there is nothing to do.
    pub fn start_pass(&mut self) -> Option<PassPlan> {
        debug_assert!(!self.in_pass, "start_pass during a pass");
        if !self.has_work() {
            return None;
        }
        let mut pass = PassState {
            budget: self.config.max_num_batched_tokens,
            batch: PrefillBatch::default(),
            preempted_any: false,
            scheduled_any: false,
        };
        match self.policy.planner {
            Planner::RunningThenFifo => {
                self.schedule_running(&mut pass);
                self.admit_waiting(&mut pass);
            }
            Planner::SglangExtend => self.schedule_sglang(&mut pass),
        }
        if self.offload.is_some() {
            self.offload_evicted();
        }
        if !pass.scheduled_any {
            // Preempting every running request leaves room that admission skipped this time.
            return if pass.preempted_any {
                self.start_pass()
            } else {
                None
            };
        }
        let prefill_ms = self.config.latency.prefill_ms(&pass.batch);
        // Requests whose KV covers their whole sequence after this pass emit a token at its end.
        let mut ready = std::mem::take(&mut self.ready);
        ready.clear();
        let mut active_kv_tokens = 0usize;
        let mut num_decoding = 0usize;
        for &slot in &self.running {
            let s = self.seq(slot);
            if s.scheduled > 0 && s.computed + s.scheduled >= s.len() {
                ready.push(slot);
                // A request that finished its prompt in this pass emits its first token with
                // the others but adds no decode work (Dynamo's timing: TTFT of a lone request is
                // its prefill time).
                if s.prefill_isl == 0 {
                    num_decoding += 1;
                    active_kv_tokens += s.len();
                }
            }
        }
        let total_kv_tokens = self.config.num_gpu_blocks * self.config.block_size;
        if self.policy.caps_decode_kv_at_pool {
            active_kv_tokens = active_kv_tokens.min(total_kv_tokens);
        }
        let decode_ms = self.config.latency.decode_ms(&DecodeBatch {
            num_requests: num_decoding,
            active_kv_tokens,
            total_kv_tokens,
        });
        let plan = PassPlan {
            duration: SimDuration::from_millis_f64(prefill_ms)
                + SimDuration::from_millis_f64(decode_ms),
            exact_us: (prefill_ms + decode_ms) * 1000.0,
            prefill_tokens: pass.batch.new_tokens(),
            decoding: ready.len(),
        };
        self.ready = ready;
        self.in_pass = true;
        if self.policy.adaptive_new_token_ratio {
            self.decay_new_token_ratio();
        }
        Some(plan)
    }

    /// Ends the pass planned by [`Scheduler::start_pass`]: commits computed tokens, emits one token
    /// per ready request and completes those that are done.
    pub fn finish_pass(&mut self) {
        if !self.in_pass {
            return;
        }
        self.in_pass = false;
        let block_size = self.config.block_size;
        for &slot in &self.running {
            let s = self.seqs[slot].as_mut().expect("running slot is live");
            s.computed += s.scheduled;
            s.scheduled = 0;
            s.prefill_isl = 0;
            s.prefill_prefix = 0;
        }
        let ready = std::mem::take(&mut self.ready);
        let mut finished = std::mem::take(&mut self.finished);
        for &slot in &ready {
            let s = self.seqs[slot].as_mut().expect("ready slot is live");
            let index = s.generated;
            let token = match s.planned.get(index) {
                Some(&t) => t,
                None => self.rng.gen(),
            };
            s.push_token(token, block_size);
            self.events.push(SchedulerEvent::Token {
                id: s.id,
                token,
                index: s.generated,
            });
            let at_limit = self.config.max_model_len.is_some_and(|m| s.len() >= m);
            if s.generated >= s.max_output || at_limit {
                finished.push(slot);
            }
        }
        self.ready = ready;
        if !finished.is_empty() {
            // One sweep for all of them (a pass finishes few requests).
            self.running.retain(|s| !finished.contains(s));
        }
        for &slot in &finished {
            let id = self.seq(slot).id;
            self.remove(slot);
            self.events.push(SchedulerEvent::Finished { id });
        }
        finished.clear();
        self.finished = finished;
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

    /// Tries to extend `slot`'s KV to `target` tokens, preempting (vLLM) or retracting (SGLang)
    /// others while the pool is exhausted. Returns false when `slot` itself was preempted or
    /// nothing could be freed.
    fn allocate_or_preempt(&mut self, slot: usize, target: usize, pass: &mut PassState) -> bool {
        let block_size = self.config.block_size;
        loop {
            self.intern_blocks(slot);
            let s = self.seqs[slot].as_mut().expect("slot is live");
            let seq = SequenceBlocks {
                ids: &s.ids,
                locals: &s.hashes.local,
            };
            if self
                .pool
                .allocate(&mut s.blocks, seq, target, block_size)
                .is_ok()
            {
                return true;
            }
            if !self.policy.preempts || self.seq(slot).phase == Phase::Waiting {
                return false;
            }
            let Some(victim) = self.pick_victim() else {
                return false;
            };
            self.preempt(victim, pass);
            if victim == slot {
                return false;
            }
        }
    }

    /// The running request to preempt: newest (LIFO) or oldest (FIFO) for vLLM, fewest generated
    /// tokens for SGLang.
    fn pick_victim(&self) -> Option<usize> {
        match self.policy.victim {
            VictimOrder::FewestGenerated => self
                .running
                .iter()
                .rev()
                .min_by_key(|&&s| self.seq(s).generated)
                .copied(),
            VictimOrder::Newest => self.running.last().copied(),
            VictimOrder::Oldest => self.running.first().copied(),
        }
    }

    fn preempt(&mut self, slot: usize, pass: &mut PassState) {
        self.running.retain(|&s| s != slot);
        let s = self.seqs[slot].as_mut().expect("victim is live");
        // Refund what it scheduled in this pass.
        pass.budget = pass.budget.saturating_add(s.scheduled);
        if s.prefill_isl > 0 {
            pass.batch.num_requests -= 1;
            pass.batch.total_isl -= s.prefill_isl;
            pass.batch.total_prefix -= s.prefill_prefix;
        }
        s.scheduled = 0;
        s.prefill_isl = 0;
        s.prefill_prefix = 0;
        s.computed = 0;
        s.phase = Phase::Waiting;
        s.retracted = true;
        let id = s.id;
        let mut blocks = std::mem::take(&mut s.blocks);
        self.pool.release(&mut blocks);
        self.waiting.push_front(slot);
        self.preemptions += 1;
        pass.preempted_any = true;
        if self.policy.adaptive_new_token_ratio {
            self.reset_new_token_ratio();
        }
        self.events.push(SchedulerEvent::Preempted { id });
    }

    /// Records `tokens` scheduled for `slot` starting at `before`, with the prefill accounting of
    /// the latency model.
    fn commit_schedule(&mut self, slot: usize, before: usize, tokens: usize, pass: &mut PassState) {
        let decode_only = self.config.role == WorkerRole::Decode;
        let s = self.seqs[slot].as_mut().expect("slot is live");
        s.scheduled = tokens;
        let prompt_before = before.min(s.prompt_len);
        let prompt_after = (before + tokens).min(s.prompt_len);
        if prompt_after > prompt_before && !decode_only {
            s.prefill_isl = prompt_after;
            s.prefill_prefix = prompt_before;
            pass.batch.num_requests += 1;
            pass.batch.total_isl += prompt_after;
            pass.batch.total_prefix += prompt_before;
        }
        pass.budget = pass.budget.saturating_sub(tokens);
        // A pass that schedules no token makes no progress and must not run (it would repeat).
        pass.scheduled_any |= tokens > 0;
    }

    /// The running index after `slot`, which was at index `i` before a step that may have
    /// preempted others (removing entries after it, or before it); `i` when `slot` itself left.
    fn index_after(&self, i: usize, slot: usize) -> usize {
        // Usually nothing moved: skip the scan (running requests are distinct).
        if self.running.get(i) == Some(&slot) {
            return i + 1;
        }
        self.running
            .iter()
            .position(|&s| s == slot)
            .map_or(i, |p| p + 1)
    }

    /// vLLM / TRT-LLM step 1: running requests in order, under the token budget.
    fn schedule_running(&mut self, pass: &mut PassState) {
        let mut i = 0;
        while i < self.running.len() && pass.budget > 0 {
            let slot = self.running[i];
            let s = self.seq(slot);
            let before = s.computed;
            let remaining = s.len() - before;
            if remaining == 0 {
                i += 1;
                continue;
            }
            let prompt_remaining = s.prompt_len.saturating_sub(before);
            if !self.config.enable_chunked_prefill && prompt_remaining > pass.budget {
                break;
            }
            let desired = remaining.min(pass.budget);
            if !self.allocate_or_preempt(slot, before + desired, pass) {
                // The request itself was preempted (or could not grow): the running list changed.
                if !self.running.contains(&slot) {
                    continue;
                }
                break;
            }
            self.commit_schedule(slot, before, desired, pass);
            // Preemptions remove later entries only (LIFO) or earlier ones (FIFO).
            i = self.index_after(i, slot);
        }
    }

    /// Prefix-cache hit for a request about to be admitted, after the vLLM rule that the last
    /// prompt token is always computed: a block-aligned, fully cached prompt recomputes its last
    /// block. Every engine flavour follows it (Dynamo's TRT-LLM model measurably does too).
    /// Returns (cached tokens, blocks already active).
    /// Interns `slot`'s blocks that have no id yet (see [`Seq::ids`]).
    fn intern_blocks(&mut self, slot: usize) {
        let s = self.seqs[slot].as_mut().expect("slot is live");
        if s.ids.len() < s.hashes.len() {
            self.pool
                .intern(&s.hashes.sequence[s.ids.len()..], &mut s.ids);
        }
    }

    /// Interns the blocks of `slot` (see [`Scheduler::intern_blocks`]), then looks up its
    /// prefix-cache hit ([`Scheduler::cached_prefix`]).
    fn intern_and_lookup(&mut self, slot: usize) -> (usize, usize) {
        self.intern_blocks(slot);
        self.cached_prefix(slot)
    }

    fn cached_prefix(&self, slot: usize) -> (usize, usize) {
        let s = self.seq(slot);
        let bs = self.config.block_size;
        let m = self.pool.lookup_prefix(&s.ids);
        if self.config.role == WorkerRole::Decode {
            // The KV arrived from the prefill worker: everything but the token being decoded
            // counts as computed.
            let cached = s.len().saturating_sub(1);
            return (cached, m.active_blocks.min(cached / bs));
        }
        let max_cached = (s.len().saturating_sub(1)) / bs * bs;
        let cached = (m.blocks * bs).min(max_cached);
        (cached, m.active_blocks.min(cached / bs))
    }

    /// Rejects the head of the waiting queue if it can never run here. Returns true if it did.
    fn reject_if_hopeless(&mut self, slot: usize) -> bool {
        let Some(reason) = self.reject_reason(slot) else {
            return false;
        };
        self.waiting.pop_front();
        let id = self.seq(slot).id;
        self.remove(slot);
        self.events.push(SchedulerEvent::Rejected { id, reason });
        true
    }

    /// Moves the head of the waiting queue to running with `cached` prompt tokens reused, and
    /// records the admission. A request SGLang retracted resumes without a new record (as
    /// Dynamo's SGLang model reports it): its reuse is what it found the first time.
    fn admit_head(&mut self, slot: usize, cached: usize) {
        let bs = self.config.block_size;
        let announce = self.policy.announces_readmission;
        self.waiting.pop_front();
        self.running.push(slot);
        let s = self.seq_mut(slot);
        s.computed = cached;
        s.phase = Phase::Running;
        let g2_reused_tokens = match s.onboarded.take() {
            Some((start, end)) => cached.min(end * bs).saturating_sub(start * bs),
            None => 0,
        };
        if !announce && s.retracted {
            return;
        }
        let id = s.id;
        self.events.push(SchedulerEvent::Admitted {
            id,
            reused_tokens: cached,
            g2_reused_tokens,
        });
    }

    fn reject_reason(&self, slot: usize) -> Option<RejectReason> {
        let s = self.seq(slot);
        if s.len() == 0 {
            return Some(RejectReason::EmptyPrompt);
        }
        if let Some(max) = self.config.max_model_len {
            if s.prompt_len >= max {
                return Some(RejectReason::ExceedsMaxModelLen {
                    prompt_tokens: s.prompt_len,
                    max_model_len: max,
                });
            }
        }
        let blocks_needed = s.len().div_ceil(self.config.block_size);
        if blocks_needed > self.config.num_gpu_blocks {
            return Some(RejectReason::ExceedsKvCapacity {
                blocks_needed,
                num_gpu_blocks: self.config.num_gpu_blocks,
            });
        }
        None
    }

    /// Blocks a running TRT-LLM request may still claim before it completes.
    fn reserved_blocks(&self) -> usize {
        let bs = self.config.block_size;
        self.running
            .iter()
            .map(|&slot| {
                let s = self.seq(slot);
                (s.prompt_len + s.max_output)
                    .div_ceil(bs)
                    .saturating_sub(s.blocks.len())
            })
            .sum()
    }

    /// vLLM / TRT-LLM step 2: FIFO admission from the head of the waiting queue.
    fn admit_waiting(&mut self, pass: &mut PassState) {
        let bs = self.config.block_size;
        while !pass.preempted_any
            && pass.budget > 0
            && self.running.len() < self.config.max_num_seqs
        {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            if self.reject_if_hopeless(slot) {
                continue;
            }
            if self.offload.is_some() && self.try_onboard(slot) {
                self.waiting.pop_front();
                self.awaiting.push(slot);
                continue;
            }
            let (cached, active_cached_blocks) = self.intern_and_lookup(slot);
            let s = self.seq(slot);
            let available = self.pool.capacity() - self.pool.num_active_blocks();
            let fits = if self.policy.reserves_full_output {
                let needed = (s.prompt_len + s.max_output).div_ceil(bs) - active_cached_blocks;
                needed <= available.saturating_sub(self.reserved_blocks())
            } else {
                s.len().div_ceil(bs) - active_cached_blocks <= available
            };
            if !fits {
                break;
            }
            let prompt_remaining = s.prompt_len.saturating_sub(cached);
            if !self.config.enable_chunked_prefill && prompt_remaining > pass.budget {
                break;
            }
            let desired = (s.len() - cached).min(pass.budget);
            if !self.allocate_or_preempt(slot, cached + desired, pass) {
                break;
            }
            self.admit_head(slot, cached);
            self.commit_schedule(slot, cached, desired, pass);
        }
    }

    /// Rejects the request that keeps this worker from starting a pass although it has work
    /// and nothing else can change its state (no pass, no onboard in flight): the head of the
    /// waiting queue, else the newest running request. Without this the request, and every
    /// one queued behind it, would wait forever. Requests that passed
    /// [`EngineConfig::check_request`] never get here; each rejection is counted in
    /// [`SchedulerStats::unschedulable`]. Returns false when there was nothing to reject.
    pub fn reject_unschedulable(&mut self) -> bool {
        let slot = match self.waiting.pop_front() {
            Some(slot) => slot,
            None => match self.running.pop() {
                Some(slot) => slot,
                None => return false,
            },
        };
        self.ready.retain(|&s| s != slot);
        let id = self.seq(slot).id;
        self.remove(slot);
        self.unschedulable += 1;
        self.events.push(SchedulerEvent::Rejected {
            id,
            reason: RejectReason::Unschedulable,
        });
        true
    }

    /// Checks the scheduler's bookkeeping and the pool's. Panics on a violation.
    pub fn assert_invariants(&self) {
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
