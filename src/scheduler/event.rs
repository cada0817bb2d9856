//! What a scheduler reports: the [`SchedulerEvent`]s of its passes, the [`PassPlan`] of the
//! pass it starts and the [`SchedulerStats`] counters.

use super::admission::RejectReason;
use crate::ids::RequestId;
use crate::time::SimDuration;
use crate::tokens::Token;

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
pub(crate) struct PassPlan {
    /// How long the pass takes (prefill then decode), the latency model's sum rounded to the
    /// nanosecond.
    pub(crate) duration: SimDuration,
    /// New prompt tokens computed.
    pub(crate) prefill_tokens: usize,
    /// Requests that emit a token at the end of the pass.
    pub(crate) decoding: usize,
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
    pub(crate) preemptions: u64,
    /// Requests parked while their prefix is onboarded from G2.
    pub(crate) awaiting_onboard: usize,
    /// Blocks resident in the G2 tier.
    pub g2_resident_blocks: usize,
    /// Blocks offloaded to G2 so far (transfers completed).
    pub(crate) g2_offloaded_blocks: u64,
    /// Blocks onboarded from G2 so far (transfers completed).
    pub g2_onboarded_blocks: u64,
    /// Requests rejected because an idle worker could not schedule them
    /// ([`RejectReason::Unschedulable`]); always 0 unless the scheduler has a defect.
    pub(crate) unschedulable: u64,
}
