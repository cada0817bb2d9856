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

mod active;
mod config;
mod disagg;
mod lifecycle;
mod output;
mod step;

pub use config::{
    ClusterConfig, KvTransferConfig, KvTransferTimingMode, ServingMode, MAX_OVERLAP_SCORE_WEIGHT,
};
pub use output::{ClusterStats, Output, Rejection, SubmitToError};

use std::collections::BTreeMap;

use active::ActiveSet;
use disagg::DecodePool;

use crate::ids::{RequestId, WorkerId};
use crate::kv::KvEvent;
use crate::request::EngineRequest;
use crate::router::{RouteRequest, Router};
use crate::scheduler::{ConfigError, EngineConfig, SchedulerEvent, WorkerRole};
use crate::time::SimTime;
use crate::worker::Worker;

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

/// The most blocks [`Cluster::reserve_router_index`] makes room for ahead of time (an index of
/// about 48 MB); a larger index grows as it fills.
pub(crate) const MAX_INDEX_RESERVE: usize = 1 << 20;

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
    pub(crate) fn offload_router(&mut self) -> std::io::Result<bool> {
        self.router.offload()
    }

    /// Makes room in the front router's KV index ([`Router::reserve_index`]) for `blocks`
    /// blocks, or for what the front workers can cache at once if that is fewer (the index
    /// never holds more), and at most [`MAX_INDEX_RESERVE`]: a replay passes its trace's
    /// blocks, so that the index does not grow while the replay waits on it. Without prefix
    /// caching no block is ever stored there, and nothing is reserved.
    pub(crate) fn reserve_router_index(&mut self, blocks: usize) {
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
    pub(crate) fn reserve_pools(&mut self, blocks: usize) {
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

    /// The decode pool's router, in disaggregated mode.
    #[cfg(test)]
    pub(crate) fn decode_router(&self) -> Option<&Router> {
        self.decode.as_ref().map(|d| &d.router)
    }

    /// Routes a request (or parks it while every worker is busy) and returns its id.
    ///
    /// A request no worker could ever run to the end (`EngineConfig::check_request`: empty
    /// prompt, no output, longer than the context, the pass budget without chunking or the KV
    /// pool) is refused here with its reason and never enters the cluster; its id is spent all
    /// the same, so drivers can record it. Every request accepted finishes, unless cancelled.
    pub fn submit(&mut self, request: EngineRequest, now: SimTime) -> Result<RequestId, Rejection> {
        self.submit_while(request, now, &mut || false)
    }

    /// [`Cluster::submit`], doing `work` (short pieces of the caller's, until it returns false)
    /// while the KV router's thread, where it has one, decides where the request goes. The
    /// offline replay builds the requests of turns about to arrive there.
    pub(crate) fn submit_while(
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
        let (kv_transfers, kv_transfer_ns, kv_transfers_in_flight) = self
            .decode
            .as_ref()
            .map_or((0, 0, 0), DecodePool::transfer_counts);
        ClusterStats {
            workers: self.workers.iter().map(Worker::stats).collect(),
            parked: self.parked.len(),
            active_requests: self.placement.len() + self.parked.len(),
            kv_transfers,
            kv_transfer_ns,
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
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
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

#[cfg(test)]
mod liveness_tests;
#[cfg(test)]
mod tests;
