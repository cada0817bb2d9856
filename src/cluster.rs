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

use std::collections::BTreeMap;

use crate::ids::{RequestId, WorkerId};
use crate::request::EngineRequest;
use crate::router::{RouteRequest, Router, RouterConfig, RouterMode};
use crate::scheduler::{ConfigError, EngineConfig, RejectReason, SchedulerEvent, WorkerRole};
use crate::time::{SimDuration, SimTime};
use crate::worker::{Worker, WorkerStats};

/// Which prompt tokens a prefill→decode hand-off moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KvTransferTimingMode {
    /// Every prompt token (Dynamo's default).
    #[default]
    FullPrompt,
    /// Only the prompt's full blocks not already cached at the decode worker, plus the tail.
    DestinationMissing,
}

impl std::str::FromStr for KvTransferTimingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full-prompt" | "full_prompt" => Ok(KvTransferTimingMode::FullPrompt),
            "destination-missing" | "destination_missing" => {
                Ok(KvTransferTimingMode::DestinationMissing)
            }
            _ => Err(format!(
                "unknown KV transfer timing mode {s:?} (expected full-prompt or destination-missing)"
            )),
        }
    }
}

/// How the KV of a prefilled prompt reaches its decode worker.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KvTransferConfig {
    /// KV bytes per token; None means the size is unknown and hand-offs take no time.
    pub kv_bytes_per_token: Option<u64>,
    /// Link bandwidth in GB/s (1e9 bytes); 0 disables the delay.
    pub bandwidth_gbps: f64,
    /// Which tokens are charged.
    pub timing_mode: KvTransferTimingMode,
}

impl Default for KvTransferConfig {
    fn default() -> Self {
        KvTransferConfig {
            kv_bytes_per_token: None,
            bandwidth_gbps: 64.0,
            timing_mode: KvTransferTimingMode::FullPrompt,
        }
    }
}

impl KvTransferConfig {
    /// Time to move `tokens` tokens of KV (Dynamo's `compute_prefill_handoff_delay_ms`), rounded
    /// to the nearest microsecond.
    pub fn delay(&self, tokens: usize) -> SimDuration {
        match self.kv_bytes_per_token {
            Some(bytes) if self.bandwidth_gbps > 0.0 => {
                let us = tokens as f64 * bytes as f64 / (self.bandwidth_gbps * 1e3);
                SimDuration(us.round() as u64)
            }
            _ => SimDuration::ZERO,
        }
    }
}

/// The serving topology.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServingMode {
    /// `num_workers` workers that prefill and decode.
    #[default]
    Aggregated,
    /// Separate prefill and decode pools with a KV hand-off between them.
    Disagg {
        /// Prefill workers (behind the configured router).
        num_prefill_workers: usize,
        /// Decode workers (behind a load-aware router).
        num_decode_workers: usize,
        /// The prefill→decode link.
        kv_transfer: KvTransferConfig,
    },
}

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

/// A request between its prefill and its decode.
#[derive(Debug)]
struct PrefillState {
    /// The original request (full output), sent to the decode worker after the hand-off.
    request: EngineRequest,
    /// Prompt reuse at the latest prefill-side admission.
    reused_tokens: usize,
    /// Of those, tokens onboarded from G2.
    g2_reused_tokens: usize,
}

/// A hand-off in flight.
#[derive(Debug)]
struct Handoff {
    id: RequestId,
    /// Global index of the decode worker.
    worker: usize,
    request: EngineRequest,
}

/// The decode pool of a disaggregated cluster.
#[derive(Debug)]
struct DecodePool {
    /// Load-aware router over the decode workers (local ids `0..D`).
    router: Router,
    /// Global index of the first decode worker.
    first: usize,
    /// The prefill→decode link.
    transfer: KvTransferConfig,
    /// Requests prefilling or prefilled, by id.
    prefilling: BTreeMap<RequestId, PrefillState>,
    /// Hand-offs in flight by (arrival time, sequence number).
    handoffs: BTreeMap<(SimTime, u64), Handoff>,
    /// Where each in-flight hand-off is in `handoffs`.
    handoff_key: BTreeMap<RequestId, (SimTime, u64)>,
    /// Next hand-off sequence number.
    next_handoff: u64,
    /// Prefill-side reuse of requests on decode workers: (reused, g2 reused).
    reuse: BTreeMap<RequestId, (usize, usize)>,
    /// Hand-offs started so far.
    transfers: u64,
    /// Their summed duration.
    transfer_us: u64,
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
}

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
                // Dynamo's decode router: load only (overlap weight 0), no router queue.
                let router = Router::new(
                    RouterConfig {
                        overlap_score_weight: 0.0,
                        queue_threshold: None,
                        ..config.router.clone()
                    },
                    *num_decode_workers,
                    config.engine.block_size,
                    config.engine.max_num_batched_tokens,
                    config.seed ^ 0xdec0de,
                );
                let pool = DecodePool {
                    router,
                    first: *num_prefill_workers,
                    transfer: kv_transfer.clone(),
                    prefilling: BTreeMap::new(),
                    handoffs: BTreeMap::new(),
                    handoff_key: BTreeMap::new(),
                    next_handoff: 0,
                    reuse: BTreeMap::new(),
                    transfers: 0,
                    transfer_us: 0,
                };
                (*num_prefill_workers, Some(pool))
            }
        };
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
        Ok(Cluster {
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
        })
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
            self.route(id, request);
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

    fn route(&mut self, id: RequestId, request: EngineRequest) {
        let decision = self.router.route(
            id,
            RouteRequest {
                isl: request.prompt.len,
                local_hashes: &request.prompt.blocks.local,
                seq_hashes: &request.prompt.blocks.sequence,
                now: self.now,
            },
        );
        self.place(id, decision.worker, request);
    }

    /// Queues a routed request on its (front) worker; in disaggregated mode as the prompt-only
    /// prefill request, the full request kept for the hand-off.
    fn place(&mut self, id: RequestId, worker: WorkerId, request: EngineRequest) {
        self.placement.insert(id, worker);
        let request = match &mut self.decode {
            None => request,
            Some(pool) => {
                // The prefill request: the prompt with one (hidden) output token.
                let prefill = EngineRequest {
                    prompt: request.prompt.clone(),
                    max_output_tokens: 1,
                    output_tokens: Vec::new(),
                };
                pool.prefilling.insert(
                    id,
                    PrefillState {
                        request,
                        reused_tokens: 0,
                        g2_reused_tokens: 0,
                    },
                );
                prefill
            }
        };
        self.workers[worker.0 as usize].enqueue(id, request);
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
        if let Some(pool) = &mut self.decode {
            pool.prefilling.remove(&id);
            pool.reuse.remove(&id);
            if let Some(key) = pool.handoff_key.remove(&id) {
                pool.handoffs.remove(&key);
                pool.router.free(WorkerId((w - pool.first) as u32), id);
                return true;
            }
        }
        self.workers[w].cancel(id);
        if w < self.num_front {
            self.router.free(worker, id);
            self.unpark();
        } else if let Some(pool) = &mut self.decode {
            pool.router.free(WorkerId((w - pool.first) as u32), id);
        }
        true
    }

    /// When the cluster next needs `advance`: the earliest pass end, G2 onboard or hand-off, or
    /// the latest time it was driven to when an idle worker has work. None when idle.
    pub fn next_event_time(&self) -> Option<SimTime> {
        let workers = self
            .workers
            .iter()
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
        let workers = if self.has_g2 {
            self.workers.iter().filter_map(Worker::next_timer).min()
        } else {
            self.workers.iter().filter_map(Worker::pass_end).min()
        };
        min_opt(workers, self.next_handoff())
    }

    fn next_handoff(&self) -> Option<SimTime> {
        self.decode
            .as_ref()
            .and_then(|d| d.handoffs.keys().next().map(|k| k.0))
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
        self.now = self.now.max(now);
        let mut out = Vec::new();
        self.advance_timers(now);
        let mut due: Vec<(SimTime, usize)> = self
            .workers
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.pass_end().filter(|&e| e <= now).map(|e| (e, i)))
            .collect();
        due.sort_unstable();
        for (end, w) in due {
            self.workers[w].finish_pass();
            self.collect(w, end, &mut out);
        }
        // Hand-offs that took no time, or ended before `now`, started by those passes.
        self.advance_timers(now);
        out
    }

    /// G2 onboards and hand-offs due by `now`.
    fn advance_timers(&mut self, now: SimTime) {
        if self.has_g2 {
            for w in &mut self.workers {
                if w.next_transfer_end().is_some_and(|t| t <= now) {
                    w.advance_transfers(now);
                }
            }
        }
        let Some(pool) = &mut self.decode else {
            return;
        };
        while let Some(entry) = pool.handoffs.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let handoff = entry.remove();
            pool.handoff_key.remove(&handoff.id);
            self.workers[handoff.worker].enqueue(handoff.id, handoff.request);
        }
    }

    /// Starts a pass on every idle worker with work; passes that take no time finish at once and
    /// the loop repeats.
    pub fn start_idle(&mut self, now: SimTime) -> Vec<Output> {
        self.now = self.now.max(now);
        let mut out = Vec::new();
        loop {
            let mut instant = false;
            for w in 0..self.workers.len() {
                if !self.workers[w].wants_pass() {
                    continue;
                }
                let end = self.workers[w].start_pass(now);
                self.collect(w, now, &mut out);
                instant |= end == Some(now);
            }
            if !instant {
                return out;
            }
            out.extend(self.finish_due(now));
        }
    }

    /// Moves a worker's events into outputs and the router's bookkeeping.
    fn collect(&mut self, w: usize, time: SimTime, out: &mut Vec<Output>) {
        if w >= self.num_front {
            return self.collect_decode(w, time, out);
        }
        // KV events reach the router when the pass that produced them ends (Dynamo's pass-end
        // visibility): a worker in a pass keeps them until then.
        if self.workers[w].pass_end().is_none() {
            for event in self.workers[w].drain_kv_events() {
                self.router.apply_kv_event(&event);
            }
        }
        let worker = WorkerId(w as u32);
        let prefill = self.decode.is_some();
        let mut freed = false;
        for event in self.workers[w].drain_events() {
            match event {
                SchedulerEvent::Admitted {
                    id,
                    reused_tokens,
                    g2_reused_tokens,
                } => {
                    if let Some(pool) = &mut self.decode {
                        // Hidden: the decode-side admission is the request's admission.
                        if let Some(state) = pool.prefilling.get_mut(&id) {
                            state.reused_tokens = reused_tokens;
                            state.g2_reused_tokens = g2_reused_tokens;
                        }
                        continue;
                    }
                    out.push(Output::Admitted {
                        id,
                        worker,
                        time,
                        reused_tokens,
                        g2_reused_tokens,
                    });
                }
                SchedulerEvent::Preempted { id } => out.push(Output::Preempted { id, time }),
                SchedulerEvent::Token { id, token, index } => {
                    if index == 1 {
                        self.router.mark_prefill_completed(worker, id);
                        freed = true;
                    }
                    if prefill {
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
                    self.router.free(worker, id);
                    self.placement.remove(&id);
                    freed = true;
                    if prefill {
                        self.hand_off(id, worker, time, out);
                    } else {
                        out.push(Output::Finished { id, time });
                    }
                }
                SchedulerEvent::Rejected { id, reason } => {
                    self.router.free(worker, id);
                    self.placement.remove(&id);
                    if let Some(pool) = &mut self.decode {
                        pool.prefilling.remove(&id);
                    }
                    freed = true;
                    out.push(Output::Rejected { id, time, reason });
                }
            }
        }
        if freed {
            self.unpark();
        }
    }

    /// A prompt finished on prefill worker `from` at `time`: picks the decode worker and starts
    /// the KV transfer to it.
    fn hand_off(&mut self, id: RequestId, from: WorkerId, time: SimTime, out: &mut Vec<Output>) {
        let Some(pool) = &mut self.decode else {
            return;
        };
        let Some(state) = pool.prefilling.remove(&id) else {
            return;
        };
        let request = state.request;
        let decision = pool.router.route(
            id,
            RouteRequest {
                isl: request.prompt.len,
                local_hashes: &request.prompt.blocks.local,
                seq_hashes: &request.prompt.blocks.sequence,
                now: time,
            },
        );
        let worker = pool.first + decision.worker.0 as usize;
        let tokens = match pool.transfer.timing_mode {
            KvTransferTimingMode::FullPrompt => request.prompt.len,
            KvTransferTimingMode::DestinationMissing => {
                let pool_kv = self.workers[worker].scheduler().pool();
                let cached = pool_kv
                    .lookup_prefix(&request.prompt.blocks.sequence)
                    .blocks;
                request.prompt.len.saturating_sub(cached * self.block_size)
            }
        };
        let duration = pool.transfer.delay(tokens);
        pool.transfers += 1;
        pool.transfer_us += duration.as_micros();
        pool.reuse
            .insert(id, (state.reused_tokens, state.g2_reused_tokens));
        let to = WorkerId(worker as u32);
        self.placement.insert(id, to);
        out.push(Output::KvTransfer {
            id,
            from,
            to,
            time,
            tokens,
            duration,
        });
        let key = (time + duration, pool.next_handoff);
        pool.next_handoff += 1;
        pool.handoff_key.insert(id, key);
        pool.handoffs.insert(
            key,
            Handoff {
                id,
                worker,
                request,
            },
        );
    }

    /// [`Cluster::collect`] for a decode worker.
    fn collect_decode(&mut self, w: usize, time: SimTime, out: &mut Vec<Output>) {
        let Some(pool) = &mut self.decode else {
            return;
        };
        let local = WorkerId((w - pool.first) as u32);
        if self.workers[w].pass_end().is_none() {
            for mut event in self.workers[w].drain_kv_events() {
                event.worker = local;
                pool.router.apply_kv_event(&event);
            }
        }
        let worker = WorkerId(w as u32);
        for event in self.workers[w].drain_events() {
            match event {
                SchedulerEvent::Admitted { id, .. } => {
                    let (reused_tokens, g2_reused_tokens) =
                        pool.reuse.get(&id).copied().unwrap_or_default();
                    out.push(Output::Admitted {
                        id,
                        worker,
                        time,
                        reused_tokens,
                        g2_reused_tokens,
                    });
                }
                SchedulerEvent::Preempted { id } => out.push(Output::Preempted { id, time }),
                SchedulerEvent::Token { id, token, index } => {
                    if index == 1 {
                        pool.router.mark_prefill_completed(local, id);
                    }
                    out.push(Output::Token {
                        id,
                        token,
                        index,
                        time,
                    });
                }
                SchedulerEvent::Finished { id } => {
                    pool.router.free(local, id);
                    pool.reuse.remove(&id);
                    self.placement.remove(&id);
                    out.push(Output::Finished { id, time });
                }
                SchedulerEvent::Rejected { id, reason } => {
                    pool.router.free(local, id);
                    pool.reuse.remove(&id);
                    self.placement.remove(&id);
                    out.push(Output::Rejected { id, time, reason });
                }
            }
        }
    }

    /// Routes parked requests while some worker has room.
    fn unpark(&mut self) {
        while let Some(id) = self.router.unpark() {
            if let Some(request) = self.parked.remove(&id) {
                self.route(id, request);
            }
        }
    }

    /// Queue depths, KV usage and counters of every worker.
    pub fn snapshot(&self) -> ClusterStats {
        let (kv_transfers, kv_transfer_us, kv_transfers_in_flight) =
            self.decode.as_ref().map_or((0, 0, 0), |d| {
                (d.transfers, d.transfer_us, d.handoffs.len())
            });
        ClusterStats {
            workers: self.workers.iter().map(Worker::stats).collect(),
            parked: self.parked.len(),
            active_requests: self.placement.len() + self.parked.len(),
            kv_transfers,
            kv_transfer_us,
            kv_transfers_in_flight,
        }
    }

    /// Checks every worker's invariants. Panics on a violation.
    pub fn assert_invariants(&self) {
        for w in &self.workers {
            w.scheduler().assert_invariants();
        }
        assert_eq!(
            self.parked.len(),
            self.router.pending().len(),
            "parked requests match the router's queue"
        );
        if let Some(pool) = &self.decode {
            assert_eq!(pool.handoffs.len(), pool.handoff_key.len());
            for (key, h) in &pool.handoffs {
                assert_eq!(pool.handoff_key.get(&h.id), Some(key));
                assert_eq!(self.placement.get(&h.id), Some(&WorkerId(h.worker as u32)));
                assert!(h.worker >= pool.first, "hand-offs go to decode workers");
            }
            for id in pool.prefilling.keys() {
                let w = self.placement.get(id).map(|w| w.0 as usize);
                assert!(
                    w.is_some_and(|w| w < pool.first) || self.parked.contains_key(id),
                    "a prefilling request is on a prefill worker"
                );
            }
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
mod tests {
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::kv::G2Config;
    use crate::perf::Fixed;
    use crate::request::Prompt;

    const BS: usize = 4;

    fn engine(num_gpu_blocks: usize) -> EngineConfig {
        let mut e = EngineConfig {
            block_size: BS,
            num_gpu_blocks,
            ..EngineConfig::default()
        };
        e.latency.model = Arc::new(Fixed {
            prefill_ms: 20.0,
            decode_ms: 5.0,
        });
        e
    }

    fn disagg(bandwidth_gbps: f64, timing_mode: KvTransferTimingMode) -> ClusterConfig {
        ClusterConfig {
            engine: engine(64),
            serving: ServingMode::Disagg {
                num_prefill_workers: 1,
                num_decode_workers: 1,
                kv_transfer: KvTransferConfig {
                    // 1 MB per token at 1 GB/s: 1 ms per token.
                    kv_bytes_per_token: Some(1_000_000),
                    bandwidth_gbps,
                    timing_mode,
                },
            },
            ..ClusterConfig::default()
        }
    }

    fn request(tokens: &[u32], out: usize) -> EngineRequest {
        EngineRequest {
            prompt: Prompt::from_tokens(tokens, BS),
            max_output_tokens: out,
            output_tokens: Vec::new(),
        }
    }

    /// Drives the cluster from event to event until idle, checking invariants at every step.
    fn run(c: &mut Cluster) -> Vec<Output> {
        let mut out = Vec::new();
        while let Some(t) = c.next_event_time() {
            out.extend(c.advance(t));
            c.assert_invariants();
        }
        out
    }

    fn token_times(out: &[Output], id: RequestId) -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                Output::Token { id: i, time, .. } if *i == id => Some(time.as_micros() / 1000),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn disagg_adds_the_transfer_time_exactly_once() {
        // Prefill 20 ms (hidden token), 10 prompt tokens at 1 ms each over the link, then the
        // decode worker emits the first token after one 5 ms decode step: no prefill there.
        let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::FullPrompt)).unwrap();
        let id = c
            .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
            .expect("accepted");
        let out = run(&mut c);
        assert_eq!(token_times(&out, id), vec![20 + 10 + 5, 40, 45]);
        let transfers: Vec<&Output> = out
            .iter()
            .filter(|o| matches!(o, Output::KvTransfer { .. }))
            .collect();
        assert_eq!(
            transfers,
            vec![&Output::KvTransfer {
                id,
                from: WorkerId(0),
                to: WorkerId(1),
                time: SimTime(20_000),
                tokens: 10,
                duration: SimDuration(10_000),
            }]
        );
        let admitted: Vec<&Output> = out
            .iter()
            .filter(|o| matches!(o, Output::Admitted { .. }))
            .collect();
        assert_eq!(
            admitted.len(),
            1,
            "only the decode-side admission is visible"
        );
        assert!(matches!(
            admitted[0],
            Output::Admitted {
                worker: WorkerId(1),
                time: SimTime(30_000),
                ..
            }
        ));
        let stats = c.snapshot();
        assert_eq!((stats.kv_transfers, stats.kv_transfer_us), (1, 10_000));
        // The prefill worker ran one 20 ms pass; the decode worker only 5 ms decode steps.
        assert_eq!(stats.workers[0].busy_us, 20_000);
        assert_eq!(stats.workers[1].busy_us, 15_000);
        assert_eq!(stats.workers[1].passes, 3);
        assert_eq!(stats.active_requests, 0);

        // Bandwidth 0 disables the delay.
        let mut c = Cluster::new(disagg(0.0, KvTransferTimingMode::FullPrompt)).unwrap();
        let id = c
            .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
            .expect("accepted");
        assert_eq!(token_times(&run(&mut c), id), vec![25, 30, 35]);
    }

    #[test]
    fn destination_missing_charges_only_what_the_decode_worker_lacks() {
        let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::DestinationMissing)).unwrap();
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        c.submit(request(&prompt, 2), SimTime::ZERO)
            .expect("accepted");
        run(&mut c);
        let t = SimTime(100_000);
        let id = c.submit(request(&prompt, 2), t).expect("accepted");
        let out = run(&mut c);
        // Both full blocks are cached at the decode worker: only the 2 tail tokens move.
        assert!(out.contains(&Output::KvTransfer {
            id,
            from: WorkerId(0),
            to: WorkerId(1),
            time: SimTime(120_000),
            tokens: 2,
            duration: SimDuration(2_000),
        }));
        // The prefill worker reused its 8 cached tokens; that is the reported reuse.
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Admitted {
                reused_tokens: 8,
                ..
            }
        )));
    }

    #[test]
    fn cancel_during_the_hand_off_frees_everything() {
        let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::FullPrompt)).unwrap();
        let id = c
            .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
            .expect("accepted");
        c.advance(SimTime::ZERO);
        c.advance(SimTime(20_000));
        assert_eq!(c.snapshot().kv_transfers_in_flight, 1);
        assert!(c.cancel(id, SimTime(25_000)));
        c.assert_invariants();
        assert_eq!(c.snapshot().active_requests, 0);
        assert!(run(&mut c).is_empty());
        assert_eq!(
            c.decode_router()
                .unwrap()
                .load(WorkerId(0))
                .active_requests(),
            0
        );
    }

    fn with_g2(mut e: EngineConfig) -> EngineConfig {
        e.g2 = Some(G2Config {
            num_blocks: 16,
            // 4-token blocks of 250 kB per token: 1 MB per block, 1 ms per block at 1 GB/s.
            kv_bytes_per_token: 250_000,
            bandwidth_g1_to_g2_gbps: 1.0,
            bandwidth_g2_to_g1_gbps: 1.0,
        });
        e
    }

    #[test]
    fn a_prompt_evicted_to_g2_comes_back_at_the_modelled_cost() {
        let config = ClusterConfig {
            engine: with_g2(engine(4)),
            ..ClusterConfig::default()
        };
        let mut c = Cluster::new(config).unwrap();
        let a: Vec<u32> = (1..=12).collect();
        let b: Vec<u32> = (101..=112).collect();
        c.submit(request(&a, 1), SimTime::ZERO).expect("accepted");
        run(&mut c);
        // B needs 3 of the 4 blocks: A's two tail blocks are evicted and offloaded (2 ms).
        c.submit(request(&b, 1), SimTime(20_000)).expect("accepted");
        run(&mut c);
        let t = SimTime(40_000);
        let id = c.submit(request(&a, 1), t).expect("accepted");
        let out = run(&mut c);
        // G1 still has A's first block; the next one is onboarded from G2 (1 block, 1 ms), the
        // third cannot count as cached (the last prompt token is always computed).
        assert!(out.contains(&Output::Admitted {
            id,
            worker: WorkerId(0),
            time: SimTime(41_000),
            reused_tokens: 8,
            g2_reused_tokens: 4,
        }));
        assert_eq!(token_times(&out, id), vec![41 + 20]);
        let w = c.snapshot().workers[0].scheduler;
        assert_eq!((w.g2_offloaded_blocks, w.g2_onboarded_blocks), (2, 1));

        // Without G2 the same request only finds the first block and does not wait.
        let mut c = Cluster::new(ClusterConfig {
            engine: engine(4),
            ..ClusterConfig::default()
        })
        .unwrap();
        c.submit(request(&a, 1), SimTime::ZERO).expect("accepted");
        run(&mut c);
        c.submit(request(&b, 1), SimTime(20_000)).expect("accepted");
        run(&mut c);
        let id = c.submit(request(&a, 1), t).expect("accepted");
        let out = run(&mut c);
        assert!(out.contains(&Output::Admitted {
            id,
            worker: WorkerId(0),
            time: t,
            reused_tokens: 4,
            g2_reused_tokens: 0,
        }));
    }

    #[test]
    fn invariants_of_both_tiers_hold_over_many_random_operations() {
        for (seed, serving) in [
            (1, ServingMode::Aggregated),
            (
                2,
                ServingMode::Disagg {
                    num_prefill_workers: 2,
                    num_decode_workers: 2,
                    kv_transfer: KvTransferConfig {
                        kv_bytes_per_token: Some(100_000),
                        bandwidth_gbps: 1.0,
                        timing_mode: KvTransferTimingMode::DestinationMissing,
                    },
                },
            ),
        ] {
            let mut e = with_g2(engine(24));
            e.max_num_seqs = 6;
            e.max_num_batched_tokens = 32;
            e.g2.as_mut().unwrap().num_blocks = 20;
            let mut c = Cluster::new(ClusterConfig {
                engine: e,
                num_workers: 2,
                serving,
                seed,
                ..ClusterConfig::default()
            })
            .unwrap();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let families: Vec<Vec<u32>> = (0..5)
                .map(|f| (0..48).map(|i| f * 1000 + i).collect())
                .collect();
            let mut now = 0u64;
            let mut live: Vec<RequestId> = Vec::new();
            let mut ended = 0usize;
            for _ in 0..3000 {
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let f = &families[rng.gen_range(0..families.len())];
                        let mut tokens = f[..rng.gen_range(1..f.len())].to_vec();
                        tokens.extend((0..rng.gen_range(0..6)).map(|_| rng.gen_range(0..3)));
                        let id = c
                            .submit(request(&tokens, rng.gen_range(1..12)), SimTime(now))
                            .expect("accepted");
                        live.push(id);
                    }
                    4 if !live.is_empty() => {
                        let id = live.swap_remove(rng.gen_range(0..live.len()));
                        if c.cancel(id, SimTime(now)) {
                            ended += 1;
                        }
                    }
                    _ => {
                        now = match c.next_event_time() {
                            Some(t) if rng.gen_bool(0.7) => t.as_micros().max(now),
                            _ => now + rng.gen_range(0..8000),
                        };
                        for o in c.advance(SimTime(now)) {
                            if let Output::Finished { id, .. } | Output::Rejected { id, .. } = o {
                                live.retain(|&l| l != id);
                                ended += 1;
                            }
                        }
                    }
                }
                c.assert_invariants();
            }
            for o in run(&mut c) {
                if let Output::Finished { .. } | Output::Rejected { .. } = o {
                    ended += 1;
                }
            }
            let stats = c.snapshot();
            assert_eq!(stats.active_requests, 0, "seed {seed}");
            assert_eq!(ended as u64, c.next_id, "every request ended once");
            for w in &stats.workers {
                assert_eq!(w.scheduler.active_blocks, 0);
                assert_eq!(w.scheduler.awaiting_onboard, 0);
            }
            assert!(stats
                .workers
                .iter()
                .any(|w| w.scheduler.g2_onboarded_blocks > 0));
        }
    }
}

#[cfg(test)]
mod random_ops_tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::perf::{Fixed, ScaledLatency};
    use crate::request::Prompt;
    use crate::scheduler::EngineType;

    fn small(engine_type: EngineType, mode: RouterMode) -> ClusterConfig {
        ClusterConfig {
            engine: EngineConfig {
                engine_type,
                num_gpu_blocks: 48,
                block_size: 8,
                max_num_seqs: 6,
                max_num_batched_tokens: 64,
                latency: ScaledLatency {
                    model: Arc::new(Fixed {
                        prefill_ms: 2.0,
                        decode_ms: 1.0,
                    }),
                    speedup_ratio: 1.0,
                    decode_speedup_ratio: 1.0,
                },
                sglang: crate::scheduler::SglangConfig {
                    chunked_prefill_size: 64,
                    max_prefill_tokens: 128,
                    ..Default::default()
                },
                ..EngineConfig::default()
            },
            num_workers: 3,
            router: RouterConfig {
                mode,
                queue_threshold: (mode == RouterMode::KvRouter).then_some(2.0),
                ..RouterConfig::default()
            },
            seed: 5,
            ..ClusterConfig::default()
        }
    }

    /// Random submissions, cancellations and clock jumps on every engine and router: invariants
    /// after every step; every request not cancelled ends with all its tokens (or a rejection).
    #[test]
    fn invariants_hold_over_random_operations() {
        for engine_type in [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm] {
            for mode in [
                RouterMode::KvRouter,
                RouterMode::RoundRobin,
                RouterMode::Random,
            ] {
                let mut cluster = Cluster::new(small(engine_type, mode)).unwrap();
                let mut rng = ChaCha8Rng::seed_from_u64(17);
                let mut want: BTreeMap<RequestId, usize> = BTreeMap::new();
                let mut got: BTreeMap<RequestId, usize> = BTreeMap::new();
                let mut ended: BTreeMap<RequestId, bool> = BTreeMap::new();
                let mut now = SimTime::ZERO;
                for step in 0..3000 {
                    match rng.gen_range(0..10) {
                        0..=3 if step < 2000 => {
                            let family = rng.gen_range(0..4u32);
                            let len = rng.gen_range(1..120);
                            let tokens: Vec<u32> = (0..len)
                                .map(|i| {
                                    if i < 60 {
                                        family * 100 + i
                                    } else {
                                        rng.gen_range(0..9)
                                    }
                                })
                                .collect();
                            let out = rng.gen_range(1..20);
                            let request = EngineRequest {
                                prompt: Prompt::from_tokens(&tokens, 8),
                                max_output_tokens: out,
                                output_tokens: Vec::new(),
                            };
                            let id = cluster.submit(request, now).expect("accepted");
                            want.insert(id, out);
                        }
                        4 if !want.is_empty() => {
                            let id = RequestId(rng.gen_range(0..want.len() as u64));
                            if cluster.cancel(id, now) {
                                ended.insert(id, false);
                            }
                        }
                        _ => {
                            now = cluster.next_event_time().map_or(now, |t| t.max(now));
                        }
                    }
                    for out in cluster.advance(now) {
                        match out {
                            Output::Token { id, index, .. } => {
                                let n = got.entry(id).or_default();
                                *n += 1;
                                assert_eq!(*n, index, "tokens in order");
                            }
                            Output::Finished { id, .. } | Output::Rejected { id, .. } => {
                                assert!(ended.insert(id, true).is_none(), "{id} ends once");
                            }
                            _ => {}
                        }
                    }
                    cluster.assert_invariants();
                }
                while let Some(t) = cluster.next_event_time() {
                    now = t.max(now);
                    for out in cluster.advance(now) {
                        match out {
                            Output::Token { id, .. } => *got.entry(id).or_default() += 1,
                            Output::Finished { id, .. } | Output::Rejected { id, .. } => {
                                ended.insert(id, true);
                            }
                            _ => {}
                        }
                    }
                    cluster.assert_invariants();
                }
                assert_eq!(
                    cluster.snapshot().active_requests,
                    0,
                    "{engine_type} {mode}: all done"
                );
                for (id, out) in &want {
                    match ended.get(id) {
                        Some(true) => assert!(
                            got.get(id).is_none_or(|n| n == out),
                            "{engine_type} {mode} {id}: {got:?} of {out}"
                        ),
                        Some(false) => {}
                        None => panic!("{engine_type} {mode}: {id} never ended"),
                    }
                }
                for w in cluster.snapshot().workers {
                    assert_eq!(w.scheduler.active_blocks, 0, "blocks released");
                }
            }
        }
    }
}

#[cfg(test)]
mod liveness_tests;
