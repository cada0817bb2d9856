//! SGLang's scheduling: in-progress chunked prefills continue first, waiting requests are
//! admitted while the pool holds their chunk plus a reserved share (the adaptive new-token
//! ratio) of every running request's remaining output, and only a pass that prefills nothing
//! decodes, retracting the requests with the fewest tokens while the pool is short.

use super::{PassState, Scheduler};

impl Scheduler {
    /// SGLang: continue chunked prefills, admit under the new-token-ratio reservation, and when
    /// nothing is prefilled decode every running request (retracting while the pool is short).
    pub(super) fn schedule_sglang(&mut self, pass: &mut PassState) {
        let bs = self.config.block_size;
        let cfg = self.config.sglang.clone();
        // SGLang bounds passes by its chunk and prefill sizes, not by max_num_batched_tokens.
        pass.budget = usize::MAX;
        let mut rem_chunk = cfg.chunked_prefill_size;
        let mut rem_input = cfg.max_prefill_tokens;
        // In-progress chunked prefills continue first.
        let mut i = 0;
        while i < self.running.len() {
            let slot = self.running[i];
            let s = self.seq(slot);
            let remaining_prompt = s.prompt_len.saturating_sub(s.computed);
            if remaining_prompt == 0 || rem_chunk < bs {
                i += 1;
                continue;
            }
            let before = s.computed;
            let chunk = if remaining_prompt <= rem_chunk {
                remaining_prompt
            } else {
                rem_chunk / bs * bs
            };
            // A request whose prompt is done also computes the tokens generated before a retraction.
            let chunk = if chunk == remaining_prompt {
                s.len() - before
            } else {
                chunk
            };
            pass.budget = usize::MAX;
            if !self.allocate_or_preempt(slot, before + chunk, pass) {
                i += 1;
                continue;
            }
            self.commit_schedule(slot, before, chunk, pass);
            rem_chunk = rem_chunk.saturating_sub(chunk.div_ceil(bs) * bs);
            rem_input = rem_input.saturating_sub(chunk);
            i += 1;
        }
        // Admission under the reservation for running requests' future output.
        let capacity_tokens = (self.pool.num_free_blocks() + self.pool.num_inactive_blocks()) * bs;
        let reserved: f64 = self
            .running
            .iter()
            .map(|&s| {
                self.seq(s).remaining_output().min(cfg.clip_max_new_tokens) as f64
                    * self.new_token_ratio
            })
            .sum();
        let mut rem_total = capacity_tokens as f64 - reserved;
        while self.running.len() < self.config.max_num_seqs {
            let Some(&slot) = self.waiting.front() else {
                break;
            };
            if self.reject_if_hopeless(slot) {
                continue;
            }
            let (cached, _) = self.intern_and_lookup(slot);
            let s = self.seq(slot);
            let extend = s.len() - cached;
            let chunk = if extend <= rem_chunk {
                extend
            } else {
                rem_chunk / bs * bs
            };
            if chunk == 0 {
                break;
            }
            let charged = chunk.div_ceil(bs) * bs;
            let reserve = if chunk == extend {
                s.remaining_output().min(cfg.clip_max_new_tokens) as f64
            } else {
                0.0
            };
            // The reservation protects running requests' future output; with nothing running
            // the head is admitted regardless (otherwise a request whose prompt plus reserved
            // output exceeds the free pool would wait forever on an idle worker).
            let reserved_out = !self.running.is_empty() && charged as f64 + reserve >= rem_total;
            if reserved_out || charged > rem_input || charged > rem_chunk {
                break;
            }
            pass.budget = usize::MAX;
            if !self.allocate_or_preempt(slot, cached + chunk, pass) {
                break;
            }
            self.admit_head(slot, cached);
            self.commit_schedule(slot, cached, chunk, pass);
            rem_total -= charged as f64 + reserve;
            rem_chunk -= charged;
            rem_input -= charged.min(rem_input);
        }
        if pass.batch.num_requests > 0 {
            return;
        }
        // Decode step: every running request whose prompt is done grows by one token.
        let mut i = 0;
        while i < self.running.len() {
            let slot = self.running[i];
            let s = self.seq(slot);
            let before = s.computed;
            let remaining = s.len() - before;
            if before < s.prompt_len || remaining == 0 {
                i += 1;
                continue;
            }
            if self.allocate_or_preempt(slot, before + remaining, pass) {
                self.commit_schedule(slot, before, remaining, pass);
            }
            i = self.index_after(i, slot);
        }
    }

    /// One pass later: the new-token ratio decays linearly to its floor.
    pub(super) fn decay_new_token_ratio(&mut self) {
        let s = &self.config.sglang;
        let min = s.init_new_token_ratio() * s.min_new_token_ratio_factor;
        let step = (s.init_new_token_ratio() - min) / s.new_token_ratio_decay_steps as f64;
        self.new_token_ratio = (self.new_token_ratio - step).max(min);
    }

    /// A retraction: the new-token ratio is back at its initial value.
    pub(super) fn reset_new_token_ratio(&mut self) {
        self.new_token_ratio = self.config.sglang.init_new_token_ratio();
    }
}
