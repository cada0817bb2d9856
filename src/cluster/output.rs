//! What the cluster reports: the [`Output`]s of its steps, the refusals of its submissions and
//! the [`ClusterStats`] snapshot.

use crate::ids::{RequestId, WorkerId};
use crate::scheduler::RejectReason;
use crate::time::{SimDuration, SimTime};
use crate::worker::WorkerStats;

/// A request [`Cluster::submit`](super::Cluster::submit) refused: it could never run to the end on this cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{id} refused: {reason}")]
pub struct Rejection {
    /// The id the request was given (spent; it never appears in outputs).
    pub(crate) id: RequestId,
    /// Why.
    pub reason: RejectReason,
}

/// Why [`Cluster::submit_to`](super::Cluster::submit_to) refused a pinned request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitToError {
    /// The worker is not one the router serves.
    #[error("there is no worker {worker} to pin to (workers 0..{num_workers})")]
    NoSuchWorker {
        /// The worker asked for.
        worker: WorkerId,
        /// Workers that can be pinned.
        num_workers: usize,
    },
    /// The request can never run here.
    #[error(transparent)]
    Rejected(Rejection),
}

/// Something that happened to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Admitted by a worker (again after a preemption), with prompt tokens served from cache.
    Admitted {
        /// The request.
        id: RequestId,
        /// The worker.
        worker: WorkerId,
        /// When.
        time: SimTime,
        /// Prompt tokens not recomputed thanks to the prefix cache (G2 hits included; in
        /// disaggregated mode, as seen at the prefill worker).
        reused_tokens: usize,
        /// Of those, tokens onboarded from the host tier (G2).
        g2_reused_tokens: usize,
    },
    /// Disaggregated mode: the prompt finished on a prefill worker and its KV started moving
    /// to the decode worker `to`; the request joins that worker's queue at `time + duration`.
    KvTransfer {
        /// The request.
        id: RequestId,
        /// The prefill worker.
        from: WorkerId,
        /// The decode worker.
        to: WorkerId,
        /// When the transfer started (end of the prefill pass).
        time: SimTime,
        /// Tokens moved (the whole prompt, or only what the destination missed).
        tokens: usize,
        /// How long it takes.
        duration: SimDuration,
    },
    /// One output token.
    Token {
        /// The request.
        id: RequestId,
        /// The token id.
        token: u32,
        /// 1-based position in the output.
        index: usize,
        /// When it was emitted (end of the pass).
        time: SimTime,
    },
    /// The last token was emitted.
    Finished {
        /// The request.
        id: RequestId,
        /// When.
        time: SimTime,
    },
    /// The request was preempted and will recompute.
    Preempted {
        /// The request.
        id: RequestId,
        /// When.
        time: SimTime,
    },
    /// The request can never run.
    Rejected {
        /// The request.
        id: RequestId,
        /// When.
        time: SimTime,
        /// Why.
        reason: RejectReason,
    },
}

/// A snapshot of the cluster's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClusterStats {
    /// Per-worker counters (each with its role).
    pub workers: Vec<WorkerStats>,
    /// Requests waiting at the router.
    pub parked: usize,
    /// Requests submitted and not finished, rejected or cancelled.
    pub active_requests: usize,
    /// Prefill→decode hand-offs started (disaggregated mode).
    pub kv_transfers: u64,
    /// Their summed transfer time, in simulated nanoseconds.
    pub kv_transfer_ns: u64,
    /// Hand-offs in flight.
    pub kv_transfers_in_flight: usize,
}
