//! The cluster: workers behind a router. Every driver (offline replay, live server, tests) owns
//! one and drives it with explicit times.
//!
//! ```text
//! cluster.submit(request, now) -> Result<RequestId, Rejection>  // refused, routed or parked
//! cluster.cancel(id, now)                     // the client went away: free its KV
//! cluster.next_event_time() -> Option<SimTime>
//! cluster.advance(now) -> Vec<Output>         // finish passes due by `now`, start new ones
//! cluster.snapshot() -> ClusterStats
//! ```
//!
//! `advance` is `finish_due` followed by `start_idle`; a driver that must release arrivals
//! between the two at the same instant (the replay's closed-loop sessions) calls them apart.
//!
//! **Disaggregated serving** ([`ServingMode::Disagg`]): workers `0..P` form the prefill pool
//! behind the configured router, workers `P..P+D` the decode pool behind a load-aware router
//! (overlap weight 0). A request is first run on a prefill worker with one output token; that
//! token is hidden (no `Token` or `Admitted` output). When it finishes, the decode router picks a
//! decode worker at once and the prompt's KV travels there in
//! `tokens * kv_bytes_per_token / (GB/s * 1e9)` seconds ([`Output::KvTransfer`]; not divided by
//! the speed-up ratio); the request then joins that worker's queue, is admitted with its prompt
//! KV already present (no prefill time) and decodes its full output. Its `Admitted` output is
//! the decode-side admission, carrying the prompt reuse seen at the prefill worker. Hand-offs
//! are timed events like pass ends: [`Cluster::next_event_time`] includes them.

mod disagg;

pub use disagg::{KvTransferConfig, KvTransferTimingMode, ServingMode};

use std::collections::BTreeMap;

use disagg::DecodePool;

use crate::ids::{RequestId, WorkerId};
use crate::kv::KvEvent;
use crate::request::EngineRequest;
use crate::router::{RouteRequest, Router, RouterConfig, RouterMode};
use crate::scheduler::{ConfigError, EngineConfig, RejectReason, SchedulerEvent, WorkerRole};
use crate::time::{SimDuration, SimTime};
use crate::worker::{Worker, WorkerStats};

/// Cluster settings.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Settings of every worker.
    pub engine: EngineConfig,
    /// Number of workers.
    pub num_workers: usize,
    /// Routing settings.
    pub router: RouterConfig,
    /// Seeds the router and the workers' token generators.
    pub seed: u64,
    /// Aggregated or disaggregated; in disaggregated mode `num_workers` is ignored.
    pub serving: ServingMode,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            engine: EngineConfig::default(),
            num_workers: 1,
            router: RouterConfig::default(),
            seed: 0,
            serving: ServingMode::Aggregated,
        }
    }
}

/// Workers in a pool at most (worker ids are `u32`; a larger pool is a typo, not a plan).
pub const MAX_WORKERS: usize = 1 << 16;

/// Largest `--overlap-score-weight`: beyond it the decode term of the KV cost vanishes anyway,
/// and weights near `f64::MAX` overflow the cost to infinity.
pub const MAX_OVERLAP_SCORE_WEIGHT: f64 = 1e6;

impl ClusterConfig {
    /// Checks that the settings can work together: the engine's
    /// ([`EngineConfig::validate`]), pool sizes within `1..=`[`MAX_WORKERS`], router weights
    /// finite and in range, bandwidths not negative. Run before anything starts; every driver's
    /// flags come through here.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        self.engine.validate()?;
        if self.num_workers == 0 || self.num_workers > MAX_WORKERS {
            return bad("--num-workers must be between 1 and 65536");
        }
        if let ServingMode::Disagg {
            num_prefill_workers,
            num_decode_workers,
            kv_transfer,
        } = &self.serving
        {
            let pool = 1..=MAX_WORKERS;
            if !pool.contains(num_prefill_workers) || !pool.contains(num_decode_workers) {
                return bad(
                    "--num-prefill-workers and --num-decode-workers must be between 1 and 65536",
                );
            }
            if kv_transfer.bandwidth_gbps.is_nan() || kv_transfer.bandwidth_gbps < 0.0 {
                return bad("--kv-transfer-bandwidth must be >= 0 GB/s (0 disables the delay)");
            }
        }
        if self.router.queue_threshold.is_some() && self.router.mode != RouterMode::KvRouter {
            return bad("--router-queue-threshold needs --router-mode kv-router");
        }
        let weight = self.router.overlap_score_weight;
        if !(0.0..=MAX_OVERLAP_SCORE_WEIGHT).contains(&weight) {
            return Err(ConfigError(format!(
                "--overlap-score-weight must be a number between 0 and {MAX_OVERLAP_SCORE_WEIGHT:e}, got {weight}"
            )));
        }
        let temperature = self.router.temperature;
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ConfigError(format!(
                "--router-temperature must be finite and >= 0, got {temperature}"
            )));
        }
        if let Some(t) = self.router.queue_threshold {
            if !(t.is_finite() && t >= 0.0) {
                return Err(ConfigError(format!(
                    "--router-queue-threshold must be finite and >= 0, got {t}"
                )));
            }
        }
        Ok(())
    }

    /// Settings that are valid but make part of a run useless, as sentences for a warning:
    /// those of [`EngineConfig::warnings`], plus router weights that the router mode ignores.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.engine.warnings();
        let defaults = RouterConfig::default();
        if self.router.mode != RouterMode::KvRouter
            && (self.router.overlap_score_weight != defaults.overlap_score_weight
                || self.router.temperature != defaults.temperature)
        {
            out.push(format!(
                "--overlap-score-weight and --router-temperature have no effect with \
                 --router-mode {}",
                self.router.mode
            ));
        }
        out
    }
}

/// A request [`Cluster::submit`] refused: it could never run to the end on this cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{id} refused: {reason}")]
pub struct Rejection {
    /// The id the request was given (spent; it never appears in outputs).
    pub id: RequestId,
    /// Why.
    pub reason: RejectReason,
}

/// Why [`Cluster::submit_to`] refused a pinned request.
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

/// Workers and router with their request bookkeeping.
#[derive(Debug)]
pub struct Cluster {
    /// The workers, indexed by `WorkerId`: in disaggregated mode prefill workers first.
    workers: Vec<Worker>,
    /// The router of the aggregated or prefill workers.
    router: Router,
    /// Workers behind `router` (all of them when aggregated).
    num_front: usize,
    /// Disaggregated mode: the decode pool and the hand-offs.
    decode: Option<DecodePool>,
    /// Whether any worker has a G2 tier (its onboards are timed events).
    has_g2: bool,
    /// Worker of every routed, unfinished request (the decode worker once handed off).
    placement: BTreeMap<RequestId, WorkerId>,
    /// Requests parked at the router, with their payload.
    parked: BTreeMap<RequestId, EngineRequest>,
    /// Next request id.
    next_id: u64,
    /// The latest time the cluster was driven to.
    now: SimTime,
    /// Block size (prompts must be hashed with it).
    block_size: usize,
    /// The validated settings; submissions are checked against `engine`.
    config: ClusterConfig,
    /// Copies of every worker's KV events (worker ids global) for [`Cluster::drain_kv_events`];
    /// None until [`Cluster::export_kv_events`] turns the export on.
    exported_kv_events: Option<Vec<KvEvent>>,
    /// Scratch buffer swapped with a worker's scheduler events in `collect` (kept for its
    /// capacity: no allocation per pass).
    events: Vec<SchedulerEvent>,
    /// Scratch list of the passes due in `finish_due`.
    due: Vec<(SimTime, usize)>,
    /// Workers that may have work, a pass or a timer (a superset: idle ones are dropped when
    /// next visited). The per-step scans visit only these, so a thousand mostly idle workers
    /// cost little more than the busy ones.
    active: ActiveSet,
}

/// A set of worker indices as a bitset, visited in increasing order.
#[derive(Clone, Debug, Default)]
struct ActiveSet {
    words: Vec<u64>,
}

impl ActiveSet {
    fn new(len: usize) -> ActiveSet {
        ActiveSet {
            words: vec![0; len.div_ceil(64)],
        }
    }

    fn insert(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    fn remove(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
    }

    /// The smallest member `>= from`.
    fn next_from(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        let mut bits = self.words.get(word)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.words.get(word)?;
        }
    }

    /// Members in increasing order.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        let mut next = self.next_from(0);
        std::iter::from_fn(move || {
            let i = next?;
            next = self.next_from(i + 1);
            Some(i)
        })
    }
}

/// The most blocks [`Cluster::reserve_router_index`] makes room for ahead of time (an index of
/// about 48 MB); a larger index grows as it fills.
pub const MAX_INDEX_RESERVE: usize = 1 << 20;

impl Cluster {
    /// A cluster of idle workers with empty pools.
    pub fn new(config: ClusterConfig) -> Result<Cluster, ConfigError> {
        config.validate()?;
        let seed_of = |i: usize| config.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64);
        let mut roles = Vec::new();
        let (num_front, decode) = match &config.serving {
            ServingMode::Aggregated => {
                roles.resize(config.num_workers, WorkerRole::Aggregated);
                (config.num_workers, None)
            }
            ServingMode::Disagg {
                num_prefill_workers,
                num_decode_workers,
                kv_transfer,
            } => {
                roles.resize(*num_prefill_workers, WorkerRole::Prefill);
                roles.resize(num_prefill_workers + num_decode_workers, WorkerRole::Decode);
                let pool = DecodePool::new(
                    &config,
                    *num_prefill_workers,
                    *num_decode_workers,
                    kv_transfer.clone(),
                );
                (*num_prefill_workers, Some(pool))
            }
        };
        let num_workers_total = roles.len();
        let workers = roles
            .iter()
            .enumerate()
            .map(|(i, &role)| {
                let engine = EngineConfig {
                    role,
                    ..config.engine.clone()
                };
                Worker::new(WorkerId(i as u32), engine, seed_of(i))
            })
            .collect();
        let router = Router::new(
            config.router.clone(),
            num_front,
            config.engine.block_size,
            config.engine.max_num_batched_tokens,
            config.seed,
        );
        let mut cluster = Cluster {
            workers,
            router,
            num_front,
            decode,
            has_g2: config.engine.g2.is_some(),
            placement: BTreeMap::new(),
            parked: BTreeMap::new(),
            next_id: 0,
            now: SimTime::ZERO,
            block_size: config.engine.block_size,
            config,
            exported_kv_events: None,
            events: Vec::new(),
            due: Vec::new(),
            active: ActiveSet::new(num_workers_total),
        };
        cluster.emit_kv_events_where_read();
        Ok(cluster)
    }

    /// Workers record KV events only where something reads them (their router's index, or
    /// the export): building events costs the replay's hot path a few percent.
    fn emit_kv_events_where_read(&mut self) {
        let export = self.exported_kv_events.is_some();
        for w in 0..self.workers.len() {
            let read = export || self.router_of(w).0.reads_kv_events();
            self.workers[w].set_emit_kv_events(read);
        }
    }

    /// From now on, keeps a copy of every KV event the workers emit (with the worker's global
    /// id, whatever router it reports to) for [`Cluster::drain_kv_events`]: what a publisher of
    /// KV events to an outside router needs. Events become visible when the pass that produced
    /// them ends, as they do to the cluster's own router.
    pub fn export_kv_events(&mut self) {
        self.exported_kv_events.get_or_insert_with(Vec::new);
        self.emit_kv_events_where_read();
    }

    /// The KV events emitted since the last call, in emission order (empty unless
    /// [`Cluster::export_kv_events`] was called).
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.exported_kv_events
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Moves the front router's KV bookkeeping to a thread of its own ([`Router::offload`]):
    /// the same decisions, with KV events and the loads of routed requests applied while the
    /// caller advances the workers. True when it moved (only the KV router does); an error only
    /// when the thread cannot start (the router then stays as it was).
    pub fn offload_router(&mut self) -> std::io::Result<bool> {
        self.router.offload()
    }

    /// Makes room in the front router's KV index ([`Router::reserve_index`]) for `blocks`
    /// blocks, or for what the front workers can cache at once if that is fewer (the index
    /// never holds more), and at most [`MAX_INDEX_RESERVE`]: a replay passes its trace's
    /// blocks, so that the index does not grow while the replay waits on it. Without prefix
    /// caching no block is ever stored there, and nothing is reserved.
    pub fn reserve_router_index(&mut self, blocks: usize) {
        let per_worker = self.workers.first().map_or(0, |w| {
            let config = w.scheduler().config();
            if config.enable_prefix_caching {
                config.num_gpu_blocks
            } else {
                0
            }
        });
        let cacheable = self.num_front.saturating_mul(per_worker);
        self.router
            .reserve_index(blocks.min(cacheable).min(MAX_INDEX_RESERVE));
    }

    /// Makes room in every worker's KV pool for an even share of `blocks` blocks (at most
    /// what the pool holds, [`Worker::reserve_pool`]): a replay passes its trace's blocks, so
    /// that the pools' tables do not grow while they fill.
    pub fn reserve_pools(&mut self, blocks: usize) {
        let share = blocks.div_ceil(self.workers.len().max(1));
        for worker in &mut self.workers {
            worker.reserve_pool(share);
        }
    }

    /// The front router's thread once offloaded ([`Cluster::offload_router`]), for work that
    /// fills its idle time.
    pub(crate) fn router_thread(&self) -> Option<crate::router::RouterThread> {
        self.router.beside()
    }

    /// Tokens per KV block: prompts must be hashed at this size.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The workers (in disaggregated mode prefill workers first, then decode workers).
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The router of the aggregated (or prefill) workers.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The decode pool's router, in disaggregated mode.
    pub fn decode_router(&self) -> Option<&Router> {
        self.decode.as_ref().map(|d| &d.router)
    }

    /// Routes a request (or parks it while every worker is busy) and returns its id.
    ///
    /// A request no worker could ever run to the end ([`EngineConfig::check_request`]: empty
    /// prompt, no output, longer than the context, the pass budget without chunking or the KV
    /// pool) is refused here with its reason and never enters the cluster; its id is spent all
    /// the same, so drivers can record it. Every request accepted finishes, unless cancelled.
    pub fn submit(&mut self, request: EngineRequest, now: SimTime) -> Result<RequestId, Rejection> {
        self.submit_while(request, now, &mut || false)
    }

    /// [`Cluster::submit`], doing `work` (short pieces of the caller's, until it returns false)
    /// while the KV router's thread, where it has one, decides where the request goes. The
    /// offline replay builds the requests of turns about to arrive there.
    pub fn submit_while(
        &mut self,
        request: EngineRequest,
        now: SimTime,
        work: &mut dyn FnMut() -> bool,
    ) -> Result<RequestId, Rejection> {
        self.now = self.now.max(now);
        let id = self.next_request_id();
        self.config
            .engine
            .check_request(&request)
            .map_err(|reason| Rejection { id, reason })?;
        if self.router.all_busy() {
            self.router.park(id);
            self.parked.insert(id, request);
        } else {
            self.route(id, request, work);
        }
        Ok(id)
    }

    /// Sends a request straight to `worker` (a client pinned it), bypassing worker selection and
    /// the router's queue; the router still counts it in that worker's load. Only the workers
    /// behind the router can be pinned (in disaggregated mode, the prefill workers: the request
    /// is then handed off to a decode worker as usual). Refused as [`Cluster::submit`] refuses,
    /// and when `worker` is out of range.
    pub fn submit_to(
        &mut self,
        request: EngineRequest,
        worker: WorkerId,
        now: SimTime,
    ) -> Result<RequestId, SubmitToError> {
        if worker.0 as usize >= self.num_front {
            return Err(SubmitToError::NoSuchWorker {
                worker,
                num_workers: self.num_front,
            });
        }
        self.now = self.now.max(now);
        let id = self.next_request_id();
        self.config
            .engine
            .check_request(&request)
            .map_err(|reason| SubmitToError::Rejected(Rejection { id, reason }))?;
        self.router.route_to(
            id,
            worker,
            RouteRequest {
                isl: request.prompt.len,
                local_hashes: &request.prompt.blocks.local,
                seq_hashes: &request.prompt.blocks.sequence,
                now: self.now,
            },
        );
        self.place(id, worker, request);
        Ok(id)
    }

    fn next_request_id(&mut self) -> RequestId {
        let id = RequestId(self.next_id);
        self.next_id += 1;
        id
    }

    fn route(&mut self, id: RequestId, request: EngineRequest, work: &mut dyn FnMut() -> bool) {
        let decision = self.router.route_while(
            id,
            RouteRequest {
                isl: request.prompt.len,
                local_hashes: &request.prompt.blocks.local,
                seq_hashes: &request.prompt.blocks.sequence,
                now: self.now,
            },
            work,
        );
        self.place(id, decision.worker, request);
    }

    /// Queues a routed request on its (front) worker; in disaggregated mode as the prompt-only
    /// prefill request, the full request kept for the hand-off.
    fn place(&mut self, id: RequestId, worker: WorkerId, request: EngineRequest) {
        self.placement.insert(id, worker);
        let request = match &mut self.decode {
            None => request,
            Some(pool) => pool.start_prefill(id, request),
        };
        self.workers[worker.0 as usize].enqueue(id, request);
        self.active.insert(worker.0 as usize);
    }

    /// The worker a request was routed to, if it is still active (the decode worker once its
    /// hand-off started).
    pub fn worker_of(&self, id: RequestId) -> Option<WorkerId> {
        self.placement.get(&id).copied()
    }

    /// Requests accepted and not yet finished, rejected or cancelled (parked ones included).
    pub fn active_requests(&self) -> usize {
        self.placement.len() + self.parked.len()
    }

    /// The settings the cluster was built with.
    pub fn config(&self) -> &ClusterConfig {
        &self.config
    }

    /// Drops a request wherever it is and frees its KV blocks. Returns false if unknown or done.
    pub fn cancel(&mut self, id: RequestId, now: SimTime) -> bool {
        self.now = self.now.max(now);
        if self.router.forget_parked(id) {
            self.parked.remove(&id);
            return true;
        }
        let Some(worker) = self.placement.remove(&id) else {
            return false;
        };
        let w = worker.0 as usize;
        if self
            .decode
            .as_mut()
            .is_some_and(|pool| pool.cancel_hand_off(id, w))
        {
            return true;
        }
        self.workers[w].cancel(id);
        let (router, local) = self.router_of(w);
        router.free(local, id);
        if w < self.num_front {
            self.unpark();
        }
        true
    }

    /// When the cluster next needs `advance`: the earliest pass end, G2 onboard or hand-off, or
    /// the latest time it was driven to when an idle worker has work. None when idle.
    pub fn next_event_time(&self) -> Option<SimTime> {
        let workers = self
            .active
            .iter()
            .map(|i| &self.workers[i])
            .filter_map(|w| match w.next_timer() {
                None if w.wants_pass() => Some(self.now),
                Some(t) if w.wants_pass() => Some(t.min(self.now)),
                t => t,
            })
            .min();
        min_opt(workers, self.next_handoff())
    }

    /// The earliest end of a pass in progress, G2 onboard or hand-off: the engine's own timers.
    pub fn next_pass_end(&self) -> Option<SimTime> {
        let active = self.active.iter().map(|i| &self.workers[i]);
        let workers = if self.has_g2 {
            active.filter_map(Worker::next_timer).min()
        } else {
            active.filter_map(Worker::pass_end).min()
        };
        min_opt(workers, self.next_handoff())
    }

    fn next_handoff(&self) -> Option<SimTime> {
        self.decode.as_ref().and_then(DecodePool::next_arrival)
    }

    /// Finishes every pass due by `now`, then starts passes on idle workers with work (again
    /// while passes take no time).
    pub fn advance(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = self.finish_due(now);
        out.extend(self.start_idle(now));
        out
    }

    /// Completes the G2 transfers and hand-offs due by `now`, then finishes the passes that end
    /// by `now`, in order of end time then worker id.
    pub fn finish_due(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = Vec::new();
        self.finish_due_into(now, &mut out);
        out
    }

    /// [`Cluster::finish_due`], appending to `out` (a driver reusing one buffer allocates
    /// nothing per step).
    pub fn finish_due_into(&mut self, now: SimTime, out: &mut Vec<Output>) {
        self.now = self.now.max(now);
        self.advance_timers(now);
        let mut due = std::mem::take(&mut self.due);
        let workers = &self.workers;
        due.extend(
            self.active
                .iter()
                .filter_map(|i| workers[i].pass_end().filter(|&e| e <= now).map(|e| (e, i))),
        );
        due.sort_unstable();
        for &(end, w) in &due {
            self.workers[w].finish_pass();
            self.collect(w, end, out);
        }
        due.clear();
        self.due = due;
        // Hand-offs that took no time, or ended before `now`, started by those passes.
        self.advance_timers(now);
    }

    /// G2 onboards and hand-offs due by `now`.
    fn advance_timers(&mut self, now: SimTime) {
        if self.has_g2 {
            for i in self.active.iter() {
                let w = &mut self.workers[i];
                if w.next_transfer_end().is_some_and(|t| t <= now) {
                    w.advance_transfers(now);
                }
            }
        }
        let Some(pool) = &mut self.decode else {
            return;
        };
        for (id, worker, request) in pool.arrivals_due(now) {
            self.workers[worker].enqueue(id, request);
            self.active.insert(worker);
        }
    }

    /// Starts a pass on every idle worker with work; passes that take no time finish at once and
    /// the loop repeats.
    pub fn start_idle(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = Vec::new();
        self.start_idle_into(now, &mut out);
        out
    }

    /// [`Cluster::start_idle`], appending to `out`.
    pub fn start_idle_into(&mut self, now: SimTime, out: &mut Vec<Output>) {
        self.now = self.now.max(now);
        loop {
            let mut instant = false;
            // In worker order, seeing workers that become active during the sweep (a request
            // unparked by an earlier worker's completion), as a scan of every worker would.
            let mut next = self.active.next_from(0);
            while let Some(w) = next {
                next = self.active.next_from(w + 1);
                if !self.workers[w].wants_pass() {
                    self.drop_if_idle(w);
                    continue;
                }
                let end = self.workers[w].start_pass(now);
                self.collect(w, now, out);
                self.drop_if_idle(w);
                instant |= end == Some(now);
                // Collecting may have activated workers after `w`.
                next = self.active.next_from(w + 1);
            }
            if !instant {
                return;
            }
            self.finish_due_into(now, out);
        }
    }

    /// Takes `w` out of the active set when it has no pass, no work and no timer.
    fn drop_if_idle(&mut self, w: usize) {
        let worker = &self.workers[w];
        if worker.pass_end().is_none()
            && !worker.scheduler().has_work()
            && worker.next_timer().is_none()
        {
            self.active.remove(w);
        }
    }

    /// The router that serves worker `w` and `w`'s id there: the front router for aggregated
    /// and prefill workers, the decode pool's router (local ids from 0) for decode workers.
    fn router_of(&mut self, w: usize) -> (&mut Router, WorkerId) {
        match &mut self.decode {
            Some(pool) if w >= self.num_front => {
                let local = pool.local_id(w);
                (&mut pool.router, local)
            }
            _ => (&mut self.router, WorkerId(w as u32)),
        }
    }

    /// Hands worker `w`'s KV events to the export (when on) and to its router.
    fn forward_kv_events(&mut self, w: usize) {
        let mut events = self.workers[w].drain_kv_events();
        if events.is_empty() {
            return;
        }
        if let Some(exported) = &mut self.exported_kv_events {
            exported.extend_from_slice(&events);
        }
        let (router, local) = self.router_of(w);
        for event in &mut events {
            event.worker = local;
        }
        router.apply_kv_events(events);
    }

    /// Empties worker `w`'s prefix cache (vLLM's `POST /reset_prefix_cache`) when nothing holds
    /// its blocks; its `Cleared` event reaches its router and the export at once (the worker
    /// is idle). False, changing nothing, when `w` is in a pass, holds blocks or is no worker.
    pub fn reset_prefix_cache(&mut self, w: usize) -> bool {
        let Some(worker) = self.workers.get_mut(w) else {
            return false;
        };
        if worker.pass_end().is_some() || !worker.reset_prefix_cache() {
            return false;
        }
        self.forward_kv_events(w);
        true
    }

    /// Moves a worker's events into outputs and its router's bookkeeping. A prefill worker's
    /// admission and token are hidden (the decode side's are the request's), and its finished
    /// requests are handed off; a decode worker's admission carries the prefill-side reuse.
    fn collect(&mut self, w: usize, time: SimTime, out: &mut Vec<Output>) {
        let role = self.workers[w].role();
        // KV events reach the router when the pass that produced them ends (Dynamo's pass-end
        // visibility): a worker in a pass keeps them until then.
        if self.workers[w].pass_end().is_none() {
            self.forward_kv_events(w);
        }
        let worker = WorkerId(w as u32);
        let mut freed = false;
        let mut events = std::mem::take(&mut self.events);
        self.workers[w].swap_events(&mut events);
        for event in events.drain(..) {
            match event {
                SchedulerEvent::Admitted {
                    id,
                    reused_tokens,
                    g2_reused_tokens,
                } => {
                    let reuse = match (role, &mut self.decode) {
                        (WorkerRole::Prefill, Some(pool)) => {
                            pool.note_prefill_reuse(id, reused_tokens, g2_reused_tokens);
                            continue;
                        }
                        (WorkerRole::Decode, Some(pool)) => pool.prefill_reuse(id),
                        _ => (reused_tokens, g2_reused_tokens),
                    };
                    out.push(Output::Admitted {
                        id,
                        worker,
                        time,
                        reused_tokens: reuse.0,
                        g2_reused_tokens: reuse.1,
                    });
                }
                SchedulerEvent::Preempted { id } => out.push(Output::Preempted { id, time }),
                SchedulerEvent::Token { id, token, index } => {
                    if index == 1 {
                        let (router, local) = self.router_of(w);
                        router.mark_prefill_completed(local, id);
                        freed = true;
                    }
                    if role == WorkerRole::Prefill {
                        // The prefill worker's token is not a client token.
                        continue;
                    }
                    out.push(Output::Token {
                        id,
                        token,
                        index,
                        time,
                    });
                }
                SchedulerEvent::Finished { id } => {
                    let (router, local) = self.router_of(w);
                    router.free(local, id);
                    self.placement.remove(&id);
                    freed = true;
                    if role == WorkerRole::Prefill {
                        self.hand_off(id, worker, time, out);
                    } else {
                        if let Some(pool) = &mut self.decode {
                            pool.forget(id);
                        }
                        out.push(Output::Finished { id, time });
                    }
                }
                SchedulerEvent::Rejected { id, reason } => {
                    let (router, local) = self.router_of(w);
                    router.free(local, id);
                    self.placement.remove(&id);
                    if let Some(pool) = &mut self.decode {
                        pool.forget(id);
                    }
                    freed = true;
                    out.push(Output::Rejected { id, time, reason });
                }
            }
        }
        self.events = events;
        if freed && w < self.num_front {
            self.unpark();
        }
    }

    /// Routes parked requests while some worker has room.
    fn unpark(&mut self) {
        while let Some(id) = self.router.unpark() {
            if let Some(request) = self.parked.remove(&id) {
                self.route(id, request, &mut || false);
            }
        }
    }

    /// Queue depths, KV usage and counters of every worker.
    pub fn snapshot(&self) -> ClusterStats {
        let (kv_transfers, kv_transfer_us, kv_transfers_in_flight) = self
            .decode
            .as_ref()
            .map_or((0, 0, 0), DecodePool::transfer_counts);
        ClusterStats {
            workers: self.workers.iter().map(Worker::stats).collect(),
            parked: self.parked.len(),
            active_requests: self.placement.len() + self.parked.len(),
            kv_transfers,
            kv_transfer_us,
            kv_transfers_in_flight,
        }
    }

    /// Requests waiting for admission: parked at the router plus every worker's queue (the sum
    /// of what [`Cluster::snapshot`] reports, without building it).
    pub fn num_waiting(&self) -> usize {
        self.parked.len()
            + self
                .workers
                .iter()
                .map(|w| w.scheduler().num_waiting())
                .sum::<usize>()
    }

    /// Checks every worker's invariants. Panics on a violation.
    pub fn assert_invariants(&self) {
        let active: Vec<usize> = self.active.iter().collect();
        for (i, w) in self.workers.iter().enumerate() {
            w.scheduler().assert_invariants();
            let busy =
                w.pass_end().is_some() || w.scheduler().has_work() || w.next_timer().is_some();
            assert!(
                !busy || active.binary_search(&i).is_ok(),
                "worker {i} has work, a pass or a timer but is not in the active set"
            );
        }
        assert_eq!(
            self.parked.len(),
            self.router.pending().len(),
            "parked requests match the router's queue"
        );
        let stats = self.snapshot();
        assert_eq!(
            self.num_waiting(),
            stats.parked
                + stats
                    .workers
                    .iter()
                    .map(|w| w.scheduler.waiting)
                    .sum::<usize>(),
            "the waiting count matches the snapshot"
        );
        if let Some(pool) = &self.decode {
            pool.assert_invariants(&self.placement, &self.parked);
        }
    }
}

fn min_opt(a: Option<SimTime>, b: Option<SimTime>) -> Option<SimTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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
    /// Their summed transfer time, in simulated microseconds.
    pub kv_transfer_us: u64,
    /// Hand-offs in flight.
    pub kv_transfers_in_flight: usize,
}

#[cfg(test)]
mod active_set_tests {
    use super::ActiveSet;

    #[test]
    fn active_set_visits_members_in_order() {
        let mut set = ActiveSet::new(200);
        for i in [0, 5, 63, 64, 65, 130, 199] {
            set.insert(i);
        }
        set.remove(5);
        set.insert(63);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 63, 64, 65, 130, 199]);
        assert_eq!(set.next_from(66), Some(130));
        assert_eq!(set.next_from(200), None);
        assert_eq!(ActiveSet::new(0).next_from(0), None);
    }
}

#[cfg(test)]
mod liveness_tests;
#[cfg(test)]
mod tests;
