//! The cluster: workers behind a router. Every driver (offline replay, live server, tests) owns
//! one and drives it with explicit times.
//!
//! ```text
//! cluster.submit(request, now) -> RequestId   // routed at once, or parked at the router
//! cluster.cancel(id, now)                     // the client went away: free its KV
//! cluster.next_event_time() -> Option<SimTime>
//! cluster.advance(now) -> Vec<Output>         // finish passes due by `now`, start new ones
//! cluster.snapshot() -> ClusterStats
//! ```
//!
//! `advance` is `finish_due` followed by `start_idle`; a driver that must release arrivals
//! between the two at the same instant (the replay's closed-loop sessions) calls them apart.

use std::collections::BTreeMap;

use crate::ids::{RequestId, WorkerId};
use crate::request::EngineRequest;
use crate::router::{RouteRequest, Router, RouterConfig, RouterMode};
use crate::scheduler::{ConfigError, EngineConfig, RejectReason, SchedulerEvent};
use crate::time::SimTime;
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
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            engine: EngineConfig::default(),
            num_workers: 1,
            router: RouterConfig::default(),
            seed: 0,
        }
    }
}

impl ClusterConfig {
    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.engine.validate()?;
        if self.num_workers == 0 {
            return Err(ConfigError("--num-workers must be at least 1".into()));
        }
        if self.router.queue_threshold.is_some() && self.router.mode != RouterMode::KvRouter {
            return Err(ConfigError(
                "--router-queue-threshold needs --router-mode kv-router".into(),
            ));
        }
        if self.router.temperature.is_nan() || self.router.temperature < 0.0 {
            return Err(ConfigError("--router-temperature must be >= 0".into()));
        }
        if self
            .router
            .queue_threshold
            .is_some_and(|t| t.is_nan() || t < 0.0)
        {
            return Err(ConfigError("--router-queue-threshold must be >= 0".into()));
        }
        Ok(())
    }
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
        /// Prompt tokens not recomputed thanks to the prefix cache.
        reused_tokens: usize,
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
    /// The workers, indexed by `WorkerId`.
    workers: Vec<Worker>,
    /// The router.
    router: Router,
    /// Worker of every routed, unfinished request.
    placement: BTreeMap<RequestId, WorkerId>,
    /// Requests parked at the router, with their payload.
    parked: BTreeMap<RequestId, EngineRequest>,
    /// Next request id.
    next_id: u64,
    /// The latest time the cluster was driven to.
    now: SimTime,
    /// Block size (prompts must be hashed with it).
    block_size: usize,
}

impl Cluster {
    /// A cluster of idle workers with empty pools.
    pub fn new(config: ClusterConfig) -> Result<Cluster, ConfigError> {
        config.validate()?;
        let workers = (0..config.num_workers)
            .map(|i| {
                let seed = config.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i as u64);
                Worker::new(WorkerId(i as u32), config.engine.clone(), seed)
            })
            .collect();
        let router = Router::new(
            config.router.clone(),
            config.num_workers,
            config.engine.block_size,
            config.engine.max_num_batched_tokens,
            config.seed,
        );
        Ok(Cluster {
            workers,
            router,
            placement: BTreeMap::new(),
            parked: BTreeMap::new(),
            next_id: 0,
            now: SimTime::ZERO,
            block_size: config.engine.block_size,
        })
    }

    /// Tokens per KV block: prompts must be hashed at this size.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The workers.
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// The router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Routes a request (or parks it while every worker is busy) and returns its id.
    pub fn submit(&mut self, request: EngineRequest, now: SimTime) -> RequestId {
        self.now = self.now.max(now);
        let id = RequestId(self.next_id);
        self.next_id += 1;
        if self.router.all_busy() {
            self.router.park(id);
            self.parked.insert(id, request);
        } else {
            self.route(id, request);
        }
        id
    }

    /// Sends a request straight to `worker` (a client pinned it), bypassing worker selection and
    /// the router's queue; the router still counts it in that worker's load. None when `worker`
    /// is out of range.
    pub fn submit_to(
        &mut self,
        request: EngineRequest,
        worker: WorkerId,
        now: SimTime,
    ) -> Option<RequestId> {
        if worker.0 as usize >= self.workers.len() {
            return None;
        }
        self.now = self.now.max(now);
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.router.route_to(
            id,
            worker,
            RouteRequest {
                isl: request.prompt.len,
                seq_hashes: &request.prompt.blocks.sequence,
            },
        );
        self.placement.insert(id, worker);
        self.workers[worker.0 as usize].enqueue(id, request);
        Some(id)
    }

    fn route(&mut self, id: RequestId, request: EngineRequest) {
        let decision = self.router.route(
            id,
            RouteRequest {
                isl: request.prompt.len,
                seq_hashes: &request.prompt.blocks.sequence,
            },
        );
        self.placement.insert(id, decision.worker);
        self.workers[decision.worker.0 as usize].enqueue(id, request);
    }

    /// The worker a request was routed to, if it is still active.
    pub fn worker_of(&self, id: RequestId) -> Option<WorkerId> {
        self.placement.get(&id).copied()
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
        self.workers[worker.0 as usize].cancel(id);
        self.router.free(worker, id);
        self.unpark();
        true
    }

    /// When the cluster next needs `advance`: the earliest pass end, or the latest time it was
    /// driven to when an idle worker has work. None when idle.
    pub fn next_event_time(&self) -> Option<SimTime> {
        self.workers
            .iter()
            .filter_map(|w| match w.pass_end() {
                Some(end) => Some(end),
                None if w.wants_pass() => Some(self.now),
                None => None,
            })
            .min()
    }

    /// The earliest end of a pass in progress.
    pub fn next_pass_end(&self) -> Option<SimTime> {
        self.workers.iter().filter_map(Worker::pass_end).min()
    }

    /// Finishes every pass due by `now`, then starts passes on idle workers with work (again
    /// while passes take no time).
    pub fn advance(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = self.finish_due(now);
        out.extend(self.start_idle(now));
        out
    }

    /// Finishes the passes that end by `now`, in order of end time then worker id.
    pub fn finish_due(&mut self, now: SimTime) -> Vec<Output> {
        self.now = self.now.max(now);
        let mut out = Vec::new();
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
        out
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
        // KV events reach the router when the pass that produced them ends (Dynamo's pass-end
        // visibility): a worker in a pass keeps them until then.
        if self.workers[w].pass_end().is_none() {
            for event in self.workers[w].drain_kv_events() {
                self.router.apply_kv_event(&event);
            }
        }
        let worker = WorkerId(w as u32);
        let mut freed = false;
        for event in self.workers[w].drain_events() {
            match event {
                SchedulerEvent::Admitted { id, reused_tokens } => {
                    out.push(Output::Admitted {
                        id,
                        worker,
                        time,
                        reused_tokens,
                    });
                }
                SchedulerEvent::Preempted { id } => out.push(Output::Preempted { id, time }),
                SchedulerEvent::Token { id, token, index } => {
                    if index == 1 {
                        self.router.mark_prefill_completed(worker, id);
                        freed = true;
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
                    out.push(Output::Finished { id, time });
                }
                SchedulerEvent::Rejected { id, reason } => {
                    self.router.free(worker, id);
                    self.placement.remove(&id);
                    freed = true;
                    out.push(Output::Rejected { id, time, reason });
                }
            }
        }
        if freed {
            self.unpark();
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
        ClusterStats {
            workers: self.workers.iter().map(Worker::stats).collect(),
            parked: self.parked.len(),
            active_requests: self.placement.len() + self.parked.len(),
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
    }
}

/// A snapshot of the cluster's state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ClusterStats {
    /// Per-worker counters.
    pub workers: Vec<WorkerStats>,
    /// Requests waiting at the router.
    pub parked: usize,
    /// Requests submitted and not finished, rejected or cancelled.
    pub active_requests: usize,
}
