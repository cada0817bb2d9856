//! Rejections by the scheduler itself: the head of the waiting queue when it can never run on
//! this worker, and the request that keeps an idle worker from starting any pass.

use super::admission::RejectReason;
use super::event::SchedulerEvent;
use super::Scheduler;

impl Scheduler {
    /// Rejects the head of the waiting queue if it can never run here. Returns true if it did.
    pub(super) fn reject_if_hopeless(&mut self, slot: usize) -> bool {
        let Some(reason) = self.reject_reason(slot) else {
            return false;
        };
        self.waiting.pop_front();
        let id = self.seq(slot).id;
        self.remove(slot);
        self.events.push(SchedulerEvent::Rejected { id, reason });
        true
    }

    pub(super) fn reject_reason(&self, slot: usize) -> Option<RejectReason> {
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

    /// Rejects the request that keeps this worker from starting a pass although it has work
    /// and nothing else can change its state (no pass, no onboard in flight): the head of the
    /// waiting queue, else the newest running request. Without this the request, and every
    /// one queued behind it, would wait forever. Requests that passed
    /// [`EngineConfig::check_request`] never get here; each rejection is counted in
    /// [`SchedulerStats::unschedulable`]. Returns false when there was nothing to reject.
    pub(crate) fn reject_unschedulable(&mut self) -> bool {
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
}
