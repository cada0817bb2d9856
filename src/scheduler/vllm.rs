//! vLLM's and TRT-LLM's planning: running requests first, in order, under the token budget,
//! then FIFO admission from the head of the waiting queue (TRT-LLM reserving every admitted
//! request's full output).

use super::{PassState, Scheduler};

impl Scheduler {
    /// vLLM / TRT-LLM step 1: running requests in order, under the token budget.
    pub(super) fn schedule_running(&mut self, pass: &mut PassState) {
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

    /// vLLM / TRT-LLM step 2: FIFO admission from the head of the waiting queue.
    pub(super) fn admit_waiting(&mut self, pass: &mut PassState) {
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

    /// Blocks a running TRT-LLM request may still claim before it completes.
    pub(super) fn reserved_blocks(&self) -> usize {
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
}
