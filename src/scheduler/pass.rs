//! A pass's life on one worker: planning it with the flavour's planner and timing it with the
//! latency model, then ending it (one token per ready request, completions), and the
//! bookkeeping both planners share (scheduling a request's tokens, admitting the queue's head).

use rand::Rng;

use super::config::WorkerRole;
use super::event::{PassPlan, SchedulerEvent};
use super::policy::Planner;
use super::{PassState, Phase, Scheduler};
use crate::perf::{DecodeBatch, PrefillBatch};
use crate::time::SimDuration;

impl Scheduler {
    /// Plans the next pass: schedules running requests, admits waiting ones, allocates their KV,
    /// and returns the pass duration; `None` when there is nothing to do.
    pub(crate) fn start_pass(&mut self) -> Option<PassPlan> {
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
            // The latency model's fractional milliseconds meet the clock here, once.
            duration: SimDuration::from_millis_f64(prefill_ms + decode_ms),
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
    pub(crate) fn finish_pass(&mut self) {
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

    /// Records `tokens` scheduled for `slot` starting at `before`, with the prefill accounting of
    /// the latency model.
    pub(super) fn commit_schedule(
        &mut self,
        slot: usize,
        before: usize,
        tokens: usize,
        pass: &mut PassState,
    ) {
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
    pub(super) fn index_after(&self, i: usize, slot: usize) -> usize {
        // Usually nothing moved: skip the scan (running requests are distinct).
        if self.running.get(i) == Some(&slot) {
            return i + 1;
        }
        self.running
            .iter()
            .position(|&s| s == slot)
            .map_or(i, |p| p + 1)
    }

    /// Moves the head of the waiting queue to running with `cached` prompt tokens reused, and
    /// records the admission. A request SGLang retracted resumes without a new record (as
    /// Dynamo's SGLang model reports it): its reuse is what it found the first time.
    pub(super) fn admit_head(&mut self, slot: usize, cached: usize) {
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
}
