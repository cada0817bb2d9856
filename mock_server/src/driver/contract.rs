//! The driver's contract with its callers: what a submission takes ([`SubmitOptions`]), what its
//! handler hears ([`Event`]), why one is refused ([`SubmitError`]), what a snapshot shows
//! ([`LiveStats`]) and who is told of each pinned arrival ([`ArrivalObserver`]).

use std::sync::Arc;

use servesim::cluster::{Cluster, ClusterStats, Output};
use servesim::ids::WorkerId;
use servesim::request::EngineRequest;
use servesim::scheduler::RejectReason;
use servesim::time::SimTime;

use crate::kv_events::tokens::LoraTag;
use crate::metrics::FINISHED_LENGTH;

/// What happened to one request, as its handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// One of the engine's outputs for this request, as the engine emitted it: its `time` is
    /// the simulated instant ([`SimClock`](super::SimClock) maps it to the wall clock). The channel closes after
    /// `Finished` or `Rejected`.
    Output(Output),
    /// The engine made no progress while this request was in flight (an engine defect caught
    /// by the driver's watchdog); the request was cancelled and its KV freed.
    Stalled,
}

/// Why a submission was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full (`--max-waiting`).
    #[error("the server is overloaded: {waiting} requests are already waiting")]
    Overloaded {
        /// Requests waiting when this one arrived.
        waiting: usize,
    },
    /// The engine can never run the request (empty prompt, longer than the context or the KV
    /// pool, ...).
    #[error("{0}")]
    Rejected(RejectReason),
    /// The request was pinned to a worker that does not exist.
    #[error("there is no worker {worker}: this server has {num_workers} (ids 0..{num_workers})")]
    NoSuchWorker {
        /// The requested worker.
        worker: u64,
        /// Workers in the cluster.
        num_workers: usize,
    },
    /// The driver task has stopped (the server is shutting down).
    #[error("the engine has shut down")]
    Stopped,
}

/// The driver's view of the cluster plus counters only the driver sees.
#[derive(Clone, Debug)]
pub struct LiveStats {
    /// The cluster's own snapshot.
    pub cluster: ClusterStats,
    /// Prompt tokens served from the prefix cache at first admission, summed.
    pub prefix_hit_tokens: u64,
    /// Prompt tokens of every submitted request, summed.
    pub prompt_tokens: u64,
    /// Requests cancelled because their client went away.
    pub cancelled: u64,
    /// LoRA adapters of admitted, unfinished requests (sorted, each once).
    pub lora_running: Vec<String>,
    /// LoRA adapters of requests not yet admitted (sorted, each once).
    pub lora_waiting: Vec<String>,
}

/// Told of every pinned submission as it arrives, with the cluster as it is just before the
/// request enters it, under the driver's lock: what the engine truly holds at each routing
/// decision (the fleet's routing judge, [`crate::fleet::judge`]). It runs on the submission's
/// path, so it must be quick.
pub trait ArrivalObserver: Send + Sync + std::fmt::Debug {
    /// `request` arrived at `now` and was pinned to `worker`.
    fn arrived(&self, cluster: &Cluster, request: &EngineRequest, worker: WorkerId, now: SimTime);
}

/// How a request is submitted, besides the engine request itself.
#[derive(Clone, Debug)]
pub struct SubmitOptions {
    /// Run on this worker instead of routing.
    pub pinned: Option<WorkerId>,
    /// The LoRA adapter it runs under, if any: counted under the adapter, and its KV events
    /// name it (its prompt is hashed with the adapter's salt by the caller).
    pub lora: Option<Arc<LoraTag>>,
    /// The `finished_reason` it is counted under when it finishes (`length`, `stop`, ...).
    pub finish_reason: &'static str,
    /// The client's output limit, counted in `vllm:request_params_max_tokens` (the engine
    /// request runs only the tokens the answer has).
    pub max_tokens: usize,
    /// When the server received the request, on the driver's clock ([`SimClock::now`](super::SimClock::now)): the
    /// engine takes it as the request's arrival, so the engine's TTFT starts where the
    /// client's does, not after the server has parsed and tokenized it. `None`: now. A time
    /// after now counts as now, one more than [`MAX_BACKDATE_US`] before now as that long
    /// before; the engine never goes back in time (a request that arrived before the engine's
    /// latest event starts no earlier than that event).
    pub received: Option<SimTime>,
}

impl SubmitOptions {
    /// Routed, no adapter, counted as `length` with the engine request's own output limit,
    /// arriving now.
    pub fn new(max_tokens: usize) -> SubmitOptions {
        SubmitOptions {
            pinned: None,
            lora: None,
            finish_reason: FINISHED_LENGTH,
            max_tokens,
            received: None,
        }
    }
}

/// How long before its submission a request's receipt may be taken as its arrival at most
/// (µs; see [`SubmitOptions::received`]): parsing and tokenizing an ordinary request takes far
/// less. A server that stalled longer between receipt and submission (a first request that
/// loads the tokenizer, a starved process) does not have the engine schedule the request in the
/// past, whose tokens would then come out late and in a burst.
pub(crate) const MAX_BACKDATE_US: u64 = 1_000;
