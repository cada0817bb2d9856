//! Request routing over workers: round-robin, seeded random, or KV-aware (prefix overlap from the
//! workers' KV events plus each worker's active load).
//!
//! The KV-aware cost of worker `w` for a request of `isl` tokens whose first `overlap(w)` blocks
//! are cached on `w` is (lower wins)
//!
//! ```text
//! prefill_blocks(w) = (active_prefill_tokens(w) + isl - overlap(w) * block_size) / block_size
//! decode_blocks(w)  = active_blocks(w) + request blocks not already active on w
//! cost(w)           = overlap_score_weight * prefill_blocks(w) + decode_blocks(w)
//! ```

mod load;

pub(crate) use load::WorkerLoad;

use std::collections::VecDeque;

use load::ActiveBlocks;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::ids::{RequestId, WorkerId};
use crate::indexer::{ApproximateConfig, ApproximateIndexer, FlatIndex, KvIndexer};
use crate::kv::KvEvent;
use crate::side_thread::{Offloaded, Wait};
use crate::time::SimTime;
use crate::tokens::{LocalBlockHash, SequenceHash};

/// How requests are spread over workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterMode {
    /// Each worker in turn.
    RoundRobin,
    /// Uniformly at random (seeded).
    Random,
    /// Lowest KV-aware cost.
    #[default]
    KvRouter,
}

impl std::str::FromStr for RouterMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "round-robin" | "round_robin" => Ok(RouterMode::RoundRobin),
            "random" => Ok(RouterMode::Random),
            "kv-router" | "kv_router" | "kv" => Ok(RouterMode::KvRouter),
            _ => Err(format!(
                "unknown router mode {s:?} (expected round-robin, random or kv-router)"
            )),
        }
    }
}

impl std::fmt::Display for RouterMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RouterMode::RoundRobin => "round-robin",
            RouterMode::Random => "random",
            RouterMode::KvRouter => "kv-router",
        })
    }
}

/// Router settings.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RouterConfig {
    /// Routing policy.
    pub mode: RouterMode,
    /// Weight of prefill blocks against decode blocks in the KV cost.
    pub overlap_score_weight: f64,
    /// 0 picks the lowest cost; above 0 samples a softmax over normalised costs.
    pub temperature: f64,
    /// Queue at the router while every worker's active prefill tokens exceed this multiple of
    /// `max_num_batched_tokens`. None routes at once.
    pub queue_threshold: Option<f64>,
    /// Learn the workers' caches from their KV events (true), or assume each routed request's
    /// blocks stay cached on its worker for `approximate.ttl` (false: `--no-kv-events`).
    pub use_kv_events: bool,
    /// TTL and size cap of the approximate index (used without KV events).
    #[serde(skip)]
    pub approximate: ApproximateConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            mode: RouterMode::KvRouter,
            overlap_score_weight: 1.0,
            temperature: 0.0,
            queue_threshold: None,
            use_kv_events: true,
            approximate: ApproximateConfig::default(),
        }
    }
}

/// What the router needs to know about a request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RouteRequest<'a> {
    /// Prompt tokens.
    pub(crate) isl: usize,
    /// Local hashes of the prompt's full blocks.
    pub(crate) local_hashes: &'a [LocalBlockHash],
    /// Sequence hashes of the prompt's full blocks.
    pub(crate) seq_hashes: &'a [SequenceHash],
    /// When the request is routed (ages the approximate index).
    pub(crate) now: SimTime,
}

/// The routing decision for one request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Decision {
    /// Chosen worker.
    pub(crate) worker: WorkerId,
    /// Prompt blocks the indexer believed cached on that worker.
    pub(crate) overlap_blocks: usize,
}

/// The router: policy state, and the core of KV-aware routing (the KV indexer and the
/// active load of each worker), kept here or on a thread of its own ([`Router::offload`]).
#[derive(Debug)]
pub(crate) struct Router {
    /// Settings.
    config: RouterConfig,
    /// Per-pass token budget of the workers, for the busy test.
    max_num_batched_tokens: usize,
    /// Workers routed over.
    num_workers: usize,
    /// Autoscaling hook (issue 46): the workers that take new requests; None = all of them
    /// (a copy is in the core for the KV router).
    eligible: Option<Vec<bool>>,
    /// Next worker for round-robin.
    rr_next: usize,
    /// Random choice (random mode; the core draws the KV router's tie-breaks).
    rng: ChaCha8Rng,
    /// Requests parked while every worker is busy, in arrival order.
    pending: VecDeque<RequestId>,
    /// Indexer, loads and active blocks.
    core: CoreHandle,
}

/// The router's indexer behind the [`KvIndexer`] trait: [`FlatIndex`] with KV events,
/// [`ApproximateIndexer`] (routing decisions with a TTL) without.
struct RouterIndex(Box<dyn KvIndexer + Send>);

impl std::fmt::Debug for RouterIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterIndex")
            .field("stats", &self.0.stats())
            .finish_non_exhaustive()
    }
}

/// What a worker's load amounts to, for the cost and for reports.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoadSummary {
    prefill_tokens: usize,
    blocks: usize,
    requests: usize,
}

#[cfg(test)]
impl LoadSummary {
    /// Prompt tokens routed to the worker and not yet prefilled.
    pub(crate) fn active_prefill_tokens(&self) -> usize {
        self.prefill_tokens
    }

    /// Distinct blocks of the worker's active requests.
    pub(crate) fn active_blocks(&self) -> usize {
        self.blocks
    }

    /// Active requests on the worker.
    pub(crate) fn active_requests(&self) -> usize {
        self.requests
    }
}

#[cfg(test)]
impl From<&WorkerLoad> for LoadSummary {
    fn from(load: &WorkerLoad) -> LoadSummary {
        LoadSummary {
            prefill_tokens: load.active_prefill_tokens(),
            blocks: load.active_blocks(),
            requests: load.active_requests(),
        }
    }
}

/// A [`RouteRequest`] with its hashes owned, so that it can travel to the core's thread.
#[derive(Clone, Debug)]
struct OwnedRequest {
    isl: usize,
    local_hashes: Vec<LocalBlockHash>,
    seq_hashes: Vec<SequenceHash>,
    now: SimTime,
}

impl OwnedRequest {
    fn new(request: RouteRequest<'_>) -> OwnedRequest {
        OwnedRequest {
            isl: request.isl,
            local_hashes: request.local_hashes.to_vec(),
            seq_hashes: request.seq_hashes.to_vec(),
            now: request.now,
        }
    }

    fn borrow(&self) -> RouteRequest<'_> {
        RouteRequest {
            isl: self.isl,
            local_hashes: &self.local_hashes,
            seq_hashes: &self.seq_hashes,
            now: self.now,
        }
    }
}

/// The state KV-aware routing reads and writes.
#[derive(Debug)]
struct Core {
    /// Settings (a copy of the router's).
    config: RouterConfig,
    /// Engine block size (the router hashes at the same granularity).
    block_size: usize,
    /// Tie-breaks and softmax draws of the KV router.
    rng: ChaCha8Rng,
    /// Which workers hold which blocks: from KV events, or from routing decisions.
    indexer: RouterIndex,
    /// Active requests per worker.
    loads: Vec<WorkerLoad>,
    /// The blocks of active requests and the workers holding each: one walk down its runs
    /// counts every worker's new blocks for a prompt, records or frees a request.
    active: ActiveBlocks,
    /// Autoscaling hook (issue 46): the workers that take new requests; None = all of them.
    /// Loading, draining and stopped workers of an elastic fleet are left out.
    eligible: Option<Vec<bool>>,
}

/// The thread of an offloaded router's core, for work that needs nothing of the core
/// ([`Router::beside`]).
pub(crate) struct RouterThread(crate::side_thread::Beside<Box<Core>>);

impl RouterThread {
    /// Runs `job` on the router's thread after everything sent there before it; false when
    /// the thread is gone (it panicked, and the router's next call says so).
    pub(crate) fn post(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.0.post(job)
    }
}

/// Where the [`Core`] lives.
#[derive(Debug)]
enum CoreHandle {
    /// In the router.
    Inline(Box<Core>),
    /// On a thread of its own.
    Offloaded(Offloaded<Box<Core>>),
}

impl CoreHandle {
    /// Runs `job` on the core without waiting for it where the core has a thread.
    fn post(&mut self, job: impl FnOnce(&mut Core) + Send + 'static) {
        match self {
            CoreHandle::Inline(core) => job(core),
            CoreHandle::Offloaded(core) => core.post(move |c| job(c)),
        }
    }

    /// Routes request `id` where `decide` says (worker, overlap there) and records it there;
    /// the decision. On the core's thread the answer comes back before the recording, which
    /// overlaps with the caller (and keeps the request's copied hashes); in the router nothing
    /// is sent.
    fn route(
        &mut self,
        id: RequestId,
        request: RouteRequest<'_>,
        decide: impl FnOnce(&mut Core, RouteRequest<'_>) -> (usize, usize) + Send + 'static,
        work: &mut dyn FnMut() -> bool,
    ) -> (usize, usize) {
        match self {
            CoreHandle::Inline(core) => {
                let (w, overlap) = decide(core, request);
                let prefill_tokens = core.note_route(w, request, overlap);
                core.add_load(w, id, request.seq_hashes.to_vec(), prefill_tokens);
                (w, overlap)
            }
            CoreHandle::Offloaded(core) => {
                let request = OwnedRequest::new(request);
                core.ask_while(
                    move |c, reply| {
                        let (w, overlap) = decide(c, request.borrow());
                        reply.send((w, overlap));
                        let prefill_tokens = c.note_route(w, request.borrow(), overlap);
                        c.add_load(w, id, request.seq_hashes, prefill_tokens);
                    },
                    work,
                )
            }
        }
    }

    /// Reads the core (waits for its thread's jobs first).
    fn read<R: Send + 'static>(&self, read: impl FnOnce(&Core) -> R + Send + 'static) -> R {
        match self {
            CoreHandle::Inline(core) => read(core),
            CoreHandle::Offloaded(core) => core.ask(move |c, reply| reply.send(read(c))),
        }
    }
}

impl Core {
    fn new(config: RouterConfig, num_workers: usize, block_size: usize, rng: ChaCha8Rng) -> Core {
        Core {
            block_size,
            rng,
            indexer: RouterIndex(if config.use_kv_events {
                Box::new(FlatIndex::new())
            } else {
                Box::new(ApproximateIndexer::new(config.approximate))
            }),
            loads: (0..num_workers).map(|_| WorkerLoad::default()).collect(),
            active: ActiveBlocks::default(),
            eligible: None,
            config,
        }
    }

    /// Leading prompt blocks cached on each worker, per the indexer.
    fn overlaps(&self, request: RouteRequest<'_>) -> Vec<usize> {
        let mut overlap = vec![0usize; self.loads.len()];
        let scores = self
            .indexer
            .0
            .match_scores_hashed(request.local_hashes, request.seq_hashes);
        for (w, s) in scores {
            if let Some(o) = overlap.get_mut(w.0 as usize) {
                *o = s as usize;
            }
        }
        overlap
    }

    fn costs_given(&self, request: RouteRequest<'_>, overlap: &[usize]) -> Vec<f64> {
        let bs = self.block_size as f64;
        // Every worker's `WorkerLoad::new_blocks`, from one lookup per prompt block.
        let mut new_blocks = vec![request.seq_hashes.len(); self.loads.len()];
        self.active.count_new(request.seq_hashes, &mut new_blocks);
        self.loads
            .iter()
            .zip(overlap)
            .zip(new_blocks)
            .map(|((load, &o), new)| {
                let new_tokens = request.isl.saturating_sub(o * self.block_size);
                let prefill_blocks = (load.active_prefill_tokens() + new_tokens) as f64 / bs;
                let decode_blocks = load.active_blocks() + new;
                self.config.overlap_score_weight * prefill_blocks + decode_blocks as f64
            })
            .collect()
    }

    /// The KV router's choice for a request: the worker and its overlap.
    fn choose(&mut self, request: RouteRequest<'_>) -> (usize, usize) {
        if !self.config.use_kv_events {
            self.indexer.0.expire(request.now);
        }
        let overlap = self.overlaps(request);
        let costs = self.costs_given(request, &overlap);
        // Autoscaling hook (issue 46): choose among the eligible workers only.
        let w = match eligible_indices(self.eligible.as_deref()) {
            Some(indices) => {
                let sub: Vec<f64> = indices.iter().map(|&i| costs[i]).collect();
                indices[self.select(&sub)]
            }
            None => self.select(&costs),
        };
        (w, overlap[w])
    }

    /// The overlap of a request on a worker chosen for it.
    fn overlap_on(&mut self, worker: usize, request: RouteRequest<'_>) -> usize {
        if !self.config.use_kv_events {
            self.indexer.0.expire(request.now);
        }
        self.overlaps(request)[worker]
    }

    /// Notes a request routed to `worker`, with `overlap` blocks cached there, where the index
    /// needs it (without KV events, the approximate index remembers the decision); the prompt
    /// tokens the worker has to prefill. The caller then adds the request to the worker's load
    /// ([`Core::add_load`]).
    fn note_route(&mut self, worker: usize, request: RouteRequest<'_>, overlap: usize) -> usize {
        if !self.config.use_kv_events {
            // The lengths agree for requests hashed by the engine; a mismatch only skips the
            // record (the index then under-estimates this worker's cache).
            let _ = self.indexer.0.record_routing(
                WorkerId(worker as u32),
                request.local_hashes,
                request.seq_hashes,
                request.now,
            );
        }
        request.isl.saturating_sub(overlap * self.block_size)
    }

    /// Adds a request to `worker`'s load and its blocks to the active blocks.
    fn add_load(
        &mut self,
        worker: usize,
        id: RequestId,
        hashes: Vec<SequenceHash>,
        prefill_tokens: usize,
    ) {
        self.active.add(
            &mut self.loads[worker],
            worker as u32,
            id,
            hashes,
            prefill_tokens,
        );
    }

    /// Argmin with a seeded uniform tie-break at temperature 0, else softmax sampling.
    ///
    /// Total over any costs: NaN counts as the worst cost, infinite costs tie with each other
    /// (and fall back to the argmin rule), so a choice is always made.
    fn select(&mut self, costs: &[f64]) -> usize {
        let cost = |i: usize| {
            let c = costs[i];
            if c.is_nan() {
                f64::INFINITY
            } else {
                c
            }
        };
        let min = (0..costs.len()).map(cost).fold(f64::INFINITY, f64::min);
        let max = (0..costs.len()).map(cost).fold(f64::NEG_INFINITY, f64::max);
        let finite = min.is_finite() && max.is_finite();
        if self.config.temperature <= 0.0
            || !finite
            || max - min <= f64::EPSILON * max.abs().max(1.0)
        {
            let tied: Vec<usize> = (0..costs.len())
                .filter(|&i| cost(i) == min || cost(i) - min <= 1e-9 * min.abs().max(1.0))
                .collect();
            return match tied.len() {
                0 => 0,
                1 => tied[0],
                n => tied[self.rng.gen_range(0..n)],
            };
        }
        let weights: Vec<f64> = (0..costs.len())
            .map(|i| (-(cost(i) - min) / ((max - min) * self.config.temperature)).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut draw = self.rng.gen::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if draw < *w {
                return i;
            }
            draw -= w;
        }
        costs.len() - 1
    }
}

/// The eligible workers' indices under `mask`; None when every worker is eligible (no mask,
/// or a mask without any worker marked).
fn eligible_indices(mask: Option<&[bool]>) -> Option<Vec<usize>> {
    let mask = mask?;
    let indices: Vec<usize> = (0..mask.len()).filter(|&i| mask[i]).collect();
    (!indices.is_empty() && indices.len() < mask.len()).then_some(indices)
}

impl Router {
    /// A router over `num_workers` workers.
    pub(crate) fn new(
        config: RouterConfig,
        num_workers: usize,
        block_size: usize,
        max_num_batched_tokens: usize,
        seed: u64,
    ) -> Router {
        let rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_f047_e400);
        let core = Core::new(config.clone(), num_workers, block_size, rng.clone());
        Router {
            max_num_batched_tokens,
            num_workers,
            eligible: None,
            rr_next: 0,
            rng,
            pending: VecDeque::new(),
            core: CoreHandle::Inline(Box::new(core)),
            config,
        }
    }

    /// Moves the KV router's indexer and loads to a thread of their own, where applying KV
    /// events and recording and freeing requests run while the caller goes on; the caller
    /// waits only for routing decisions and reads. Decisions are exactly those of a router that
    /// keeps them (the same work in the same order). For the KV router without a queue
    /// threshold (the busy test would wait on every submission); other routers stay as they
    /// are. True when the core now runs on its own thread; an error only when the thread
    /// cannot be started (the router is unchanged then).
    pub(crate) fn offload(&mut self) -> std::io::Result<bool> {
        if self.config.mode != RouterMode::KvRouter || self.config.queue_threshold.is_some() {
            return Ok(false);
        }
        let CoreHandle::Inline(core) = &mut self.core else {
            return Ok(true);
        };
        let placeholder = Core::new(self.config.clone(), 0, 0, self.rng.clone());
        let core = std::mem::replace(core, Box::new(placeholder));
        match Offloaded::new("kv-router", core, Wait::Spin) {
            Ok(thread) => {
                self.core = CoreHandle::Offloaded(thread);
                Ok(true)
            }
            Err((e, core)) => {
                self.core = CoreHandle::Inline(core);
                Err(e)
            }
        }
    }

    /// Makes room in the KV router's index for about `blocks` blocks ahead of time
    /// ([`KvIndexer::reserve`]), so that it does not stop to grow its table while KV events
    /// come in (on the core's thread, a routing decision would wait through that). Other
    /// routers keep no index.
    pub(crate) fn reserve_index(&mut self, blocks: usize) {
        if self.config.mode == RouterMode::KvRouter {
            self.core.post(move |c| c.indexer.0.reserve(blocks));
        }
    }

    /// Where the core runs on a thread of its own, a handle that runs other work there, in
    /// order with the core's jobs (see [`Router::offload`]).
    pub(crate) fn beside(&self) -> Option<RouterThread> {
        match &self.core {
            CoreHandle::Inline(_) => None,
            CoreHandle::Offloaded(core) => core.beside().map(RouterThread),
        }
    }

    /// Active load of a worker.
    #[cfg(test)]
    pub(crate) fn load(&self, worker: WorkerId) -> LoadSummary {
        self.core
            .read(move |c| LoadSummary::from(&c.loads[worker.0 as usize]))
    }

    /// Requests parked at the router.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> &VecDeque<RequestId> {
        &self.pending
    }

    /// True when the request must wait at the router (queueing on and every worker busy).
    pub(crate) fn all_busy(&self) -> bool {
        let Some(threshold) = self.config.queue_threshold else {
            return false;
        };
        let limit = threshold * self.max_num_batched_tokens as f64;
        self.core.read(move |c| {
            // Autoscaling hook (issue 46): only the eligible workers can take a request.
            let eligible = c.eligible.as_deref();
            c.loads
                .iter()
                .enumerate()
                .filter(|&(i, _)| eligible.is_none_or(|e| e.get(i).copied().unwrap_or(true)))
                .all(|(_, l)| l.active_prefill_tokens() as f64 > limit)
        })
    }

    /// Autoscaling hook (issue 46): from now on only the workers marked true take new
    /// requests (None: all of them). Requests already routed stay where they are. A mask with
    /// no worker marked is ignored (every worker is eligible), so a request is always placed.
    pub(crate) fn set_eligible(&mut self, mask: Option<Vec<bool>>) {
        let mask = mask.filter(|m| m.iter().any(|&e| e));
        self.eligible = mask.clone();
        self.core.post(move |c| c.eligible = mask);
    }

    /// Parks a request until a worker has room.
    pub(crate) fn park(&mut self, id: RequestId) {
        self.pending.push_back(id);
    }

    /// The next parked request, if a worker has room for it.
    pub(crate) fn unpark(&mut self) -> Option<RequestId> {
        if self.all_busy() {
            return None;
        }
        self.pending.pop_front()
    }

    /// Forgets a parked request (cancelled before routing).
    pub(crate) fn forget_parked(&mut self, id: RequestId) -> bool {
        let before = self.pending.len();
        self.pending.retain(|&p| p != id);
        before != self.pending.len()
    }

    /// Leading prompt blocks cached on each worker, per the indexer.
    #[cfg(test)]
    pub(crate) fn overlaps(&self, request: RouteRequest<'_>) -> Vec<usize> {
        let request = OwnedRequest::new(request);
        self.core.read(move |c| c.overlaps(request.borrow()))
    }

    /// The KV-aware cost of every worker for a request (lower is better).
    #[cfg(test)]
    pub(crate) fn costs(&self, request: RouteRequest<'_>) -> Vec<f64> {
        let request = OwnedRequest::new(request);
        self.core.read(move |c| {
            let overlap = c.overlaps(request.borrow());
            c.costs_given(request.borrow(), &overlap)
        })
    }

    /// Chooses a worker for a request and records it as active there.
    pub(crate) fn route(&mut self, id: RequestId, request: RouteRequest<'_>) -> Decision {
        self.route_while(id, request, &mut || false)
    }

    /// [`Router::route`], doing `work` (short pieces of the caller's, until it returns false)
    /// while the router's thread decides, where it has one.
    pub(crate) fn route_while(
        &mut self,
        id: RequestId,
        request: RouteRequest<'_>,
        work: &mut dyn FnMut() -> bool,
    ) -> Decision {
        let n = self.num_workers;
        let eligible = eligible_indices(self.eligible.as_deref());
        let worker = match (self.config.mode, eligible) {
            // Autoscaling hook (issue 46): round-robin skips the workers not taking requests.
            (RouterMode::RoundRobin, Some(indices)) => {
                let w = indices
                    .iter()
                    .copied()
                    .find(|&i| i >= self.rr_next)
                    .unwrap_or(indices[0]);
                self.rr_next = (w + 1) % n;
                w
            }
            (RouterMode::RoundRobin, None) => {
                let w = self.rr_next;
                self.rr_next = (self.rr_next + 1) % n;
                w
            }
            (RouterMode::Random, Some(indices)) => indices[self.rng.gen_range(0..indices.len())],
            (RouterMode::Random, None) => self.rng.gen_range(0..n),
            (RouterMode::KvRouter, _) => {
                let (w, overlap) = self.core.route(id, request, Core::choose, work);
                return Decision {
                    worker: WorkerId(w as u32),
                    overlap_blocks: overlap,
                };
            }
        };
        // Load-blind policies keep no index and no per-worker block sets.
        self.add_load(worker, id, &[], request.isl);
        Decision {
            worker: WorkerId(worker as u32),
            overlap_blocks: 0,
        }
    }

    /// Adds a request to `worker`'s load and its blocks to the active blocks.
    fn add_load(
        &mut self,
        worker: usize,
        id: RequestId,
        hashes: &[SequenceHash],
        prefill_tokens: usize,
    ) {
        let hashes = hashes.to_vec();
        self.core
            .post(move |c| c.add_load(worker, id, hashes, prefill_tokens));
    }

    /// How many of `hashes` are not blocks of an active request on `worker` (the request's
    /// new blocks there, in the KV cost).
    #[cfg(test)]
    pub(crate) fn new_blocks(&self, worker: WorkerId, hashes: &[SequenceHash]) -> usize {
        let hashes = hashes.to_vec();
        self.core
            .read(move |c| c.active.new_blocks(worker.0, &hashes))
    }

    /// Records a request as active on a worker the caller chose (a pinned request), exactly as
    /// [`Router::route`] records its own choice. `worker` must be in range.
    pub(crate) fn route_to(
        &mut self,
        id: RequestId,
        worker: WorkerId,
        request: RouteRequest<'_>,
    ) -> Decision {
        let w = worker.0 as usize;
        if self.config.mode != RouterMode::KvRouter {
            self.add_load(w, id, &[], request.isl);
            return Decision {
                worker,
                overlap_blocks: 0,
            };
        }
        let (_, overlap) = self.core.route(
            id,
            request,
            move |c, r| (w, c.overlap_on(w, r)),
            &mut || false,
        );
        Decision {
            worker,
            overlap_blocks: overlap,
        }
    }

    /// The request produced its first token: its prompt no longer loads the worker's prefill.
    pub(crate) fn mark_prefill_completed(&mut self, worker: WorkerId, id: RequestId) {
        self.core
            .post(move |c| c.loads[worker.0 as usize].mark_prefill_completed(id));
    }

    /// The request finished or was cancelled.
    pub(crate) fn free(&mut self, worker: WorkerId, id: RequestId) {
        self.core.post(move |c| {
            c.active.free(&mut c.loads[worker.0 as usize], worker.0, id);
        });
    }

    /// True when the router reads its workers' KV events (the KV router with KV events on).
    pub(crate) fn reads_kv_events(&self) -> bool {
        self.config.mode == RouterMode::KvRouter && self.config.use_kv_events
    }

    /// Applies a worker's KV event to the indexer (ignored without KV events).
    #[cfg(test)]
    pub(crate) fn apply_kv_event(&mut self, event: KvEvent) {
        if !self.reads_kv_events() {
            return;
        }
        self.core.post(move |c| c.indexer.0.apply(&event));
    }

    /// Applies KV events to the indexer in order (ignored without KV events): one job on the
    /// router's thread for all of them.
    pub(crate) fn apply_kv_events(&mut self, events: Vec<KvEvent>) {
        if !self.reads_kv_events() || events.is_empty() {
            return;
        }
        self.core.post(move |c| {
            for event in &events {
                c.indexer.0.apply(event);
            }
        });
    }

    /// Runs `f` on the core (tests reach the core's internals this way).
    #[cfg(test)]
    fn with_core<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Core) -> R + Send + 'static,
    ) -> R {
        match &mut self.core {
            CoreHandle::Inline(core) => f(core),
            CoreHandle::Offloaded(core) => core.ask(move |c, reply| reply.send(f(c))),
        }
    }

    /// Blocks each worker holds per the indexer.
    #[cfg(test)]
    pub(crate) fn tree_sizes(&self) -> Vec<usize> {
        self.core.read(|c| {
            let mut sizes = vec![0; c.loads.len()];
            for (w, n) in c.indexer.0.find_matches(&[]).tree_sizes {
                if let Some(s) = sizes.get_mut(w.0 as usize) {
                    *s = n;
                }
            }
            sizes
        })
    }
}

#[cfg(test)]
mod tests;
