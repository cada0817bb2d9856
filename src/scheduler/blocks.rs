//! A request's KV blocks on its worker: interning their hashes, the prefix-cache hit at
//! admission, and allocation that preempts (vLLM) or retracts (SGLang) others while the pool is
//! exhausted.

use super::config::WorkerRole;
use super::event::SchedulerEvent;
use super::policy::VictimOrder;
use super::{PassState, Phase, Scheduler};
use crate::kv::SequenceBlocks;

impl Scheduler {
    /// Tries to extend `slot`'s KV to `target` tokens, preempting (vLLM) or retracting (SGLang)
    /// others while the pool is exhausted. Returns false when `slot` itself was preempted or
    /// nothing could be freed.
    pub(super) fn allocate_or_preempt(
        &mut self,
        slot: usize,
        target: usize,
        pass: &mut PassState,
    ) -> bool {
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
    pub(super) fn pick_victim(&self) -> Option<usize> {
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

    pub(super) fn preempt(&mut self, slot: usize, pass: &mut PassState) {
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

    /// Interns `slot`'s blocks that have no id yet (see [`Seq::ids`]).
    pub(super) fn intern_blocks(&mut self, slot: usize) {
        let s = self.seqs[slot].as_mut().expect("slot is live");
        if s.ids.len() < s.hashes.len() {
            self.pool
                .intern(&s.hashes.sequence[s.ids.len()..], &mut s.ids);
        }
    }

    /// Interns the blocks of `slot` (see [`Scheduler::intern_blocks`]), then looks up its
    /// prefix-cache hit ([`Scheduler::cached_prefix`]).
    pub(super) fn intern_and_lookup(&mut self, slot: usize) -> (usize, usize) {
        self.intern_blocks(slot);
        self.cached_prefix(slot)
    }

    /// Prefix-cache hit for a request about to be admitted, after the vLLM rule that the last
    /// prompt token is always computed: a block-aligned, fully cached prompt recomputes its last
    /// block. Every engine flavour follows it (Dynamo's TRT-LLM model measurably does too).
    /// Returns (cached tokens, blocks already active).
    pub(super) fn cached_prefix(&self, slot: usize) -> (usize, usize) {
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
}
