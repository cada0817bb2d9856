//! An elastic fleet (`mockserve fleet --elastic --min-workers A --max-workers B`): workers that
//! are provisioned, load their model and drain at run time.
//!
//! - [`ElasticArgs`] are the flags, [`ElasticConfig`] their validated value ([`ElasticError`]
//!   names the bad flag).
//! - [`Lifecycle`] owns every worker slot's [`Phase`] and the desired count; [`Lifecycle::scale`]
//!   sets the count (the admin listener's `PUT /fleet/scale` calls it), provisioning and
//!   draining slots until the fleet matches it.
//! - `gate` stands in front of each slot's API: a loading worker answers `/health` 503
//!   `loading` and generation requests 503 `model_loading`; a draining one answers `/health`
//!   503 `draining` at once and, after `--drain-grace`, generation requests 503
//!   `worker_draining`; it counts the generation requests in flight (until their bodies end) so
//!   a drain knows when its worker is idle.
//!
//! A slot's listener is bound at launch and kept open only while the slot is provisioned
//! (through the `down` worker state of `super::fault`: the listener is closed, connections
//! refused, the same port bound again on provisioning). A drained worker's KV cache is emptied
//! before its slot is free again: a later worker on that slot starts cold.
//!
//! Every change rewrites the manifest (`--fleet-manifest`, `GET /fleet/manifest`) and the
//! discovery file (`--discovery-file`, [`super::discovery`]) whole, listing only the workers
//! that take requests (ready), so that routers following either file add a worker once it has
//! loaded and remove it when its drain starts.
//!
//! The fleet runs on simulated time sped up by `--speedup-ratio` (see `config`): model loads
//! and the autoscaler's tick and scrape delay are divided by it. Its clock for the autoscaler
//! and the lifecycle record ([`LifecycleLog`], `--lifecycle-log`) starts at the first
//! generation request, as a replay's starts at its first arrival. `front` serves one endpoint
//! in front of the ready workers (`--front-port`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use servesim::ids::WorkerId;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::discovery::{write_whole, Endpoint, EndpointsFile};
use super::fault::{self, WorkerFaults, WorkerState};
use super::manifest::Manifest;
use crate::api::ApiError;
use crate::driver::EngineHandle;
use crate::metrics::Metrics;
pub use config::{ElasticArgs, ElasticConfig, ElasticError};
pub use log::{LifecycleLog, LogError, LoggedEvent};
pub use replica_metrics::ReplicaMetrics;

mod autoscaler;
mod config;
pub(crate) mod front;
mod log;
mod replica_metrics;

/// How long a drained worker's KV reset is retried while the engine still holds its blocks.
const KV_RESET_RETRY: Duration = Duration::from_millis(10);

/// A file of the fleet's that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// `--fleet-manifest`.
    #[error("--fleet-manifest {}: {error}", path.display())]
    Manifest {
        /// As given.
        path: PathBuf,
        /// The write's error.
        error: std::io::Error,
    },
    /// `--discovery-file`.
    #[error("--discovery-file {}: {error}", path.display())]
    Discovery {
        /// As given.
        path: PathBuf,
        /// The write's error.
        error: std::io::Error,
    },
    /// `--lifecycle-log`.
    #[error("--lifecycle-log {}: {error}", path.display())]
    Lifecycle {
        /// As given.
        path: PathBuf,
        /// The write's error.
        error: std::io::Error,
    },
}

/// Where a worker slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Not provisioned: its listener is closed.
    Absent,
    /// Provisioned, loading its model: its listener is open, `/health` answers 503.
    Loading,
    /// Serving.
    Ready,
    /// Scaled down: out of the manifest; new requests refused once `refusing`; goes when its
    /// requests in flight are done.
    Draining {
        /// The grace is over: new generation requests get 503.
        refusing: bool,
    },
}

impl Phase {
    /// The phase's name in `GET /fleet/scale`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Absent => "absent",
            Phase::Loading => "loading",
            Phase::Ready => "ready",
            Phase::Draining { .. } => "draining",
        }
    }

    /// Counts toward the desired replicas (provisioned and not leaving).
    fn is_live(self) -> bool {
        matches!(self, Phase::Loading | Phase::Ready)
    }
}

/// Why a scale request is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScaleError {
    /// Outside `[min, max]`.
    #[error("spec.replicas {given} is outside this fleet's bounds: between {min} and {max} (--min-workers, --max-workers)")]
    OutOfBounds {
        /// As asked.
        given: u64,
        /// `--min-workers`.
        min: usize,
        /// `--max-workers`.
        max: usize,
    },
}

/// One slot's counters, read without the lock.
#[derive(Debug, Default)]
struct SlotCount {
    /// Generation requests in flight (from the gate until their bodies end).
    inflight: AtomicUsize,
    /// Woken when `inflight` drops to 0.
    idle: Notify,
}

/// What changes under the lock.
#[derive(Debug)]
struct Slots {
    /// Workers asked for.
    desired: usize,
    /// Every slot's phase, by index.
    phases: Vec<Phase>,
    /// Bumped on every transition of a slot, so that a timer of an earlier one does nothing.
    epochs: Vec<u64>,
    /// Draws the load delays.
    rng: ChaCha8Rng,
    /// What changed when.
    record: log::Recorder,
}

/// Every slot of an elastic fleet, the desired count, and what follows their changes.
#[derive(Debug)]
pub struct Lifecycle {
    /// The validated flags.
    pub config: ElasticConfig,
    /// Phases; a std mutex held for short sections that never cross an `.await`.
    slots: Mutex<Slots>,
    /// Per slot, by index.
    counts: Vec<SlotCount>,
    /// Opens and closes each slot's listener (`down` closes it).
    faults: Arc<WorkerFaults>,
    /// The shared engine (a drained worker's KV is emptied).
    engine: EngineHandle,
    /// Every slot's address: the manifest of a fleet at its largest.
    all: Manifest,
    /// Where the manifest goes, if anywhere.
    manifest_path: Option<PathBuf>,
    /// The manifest `GET /fleet/manifest` answers, rewritten on each change.
    pub(crate) current_manifest: Arc<Mutex<Arc<str>>>,
    /// The replica series.
    pub metrics: ReplicaMetrics,
    /// The longest a drain waits for its requests before ending them (`--shutdown-timeout`).
    drain_timeout: Duration,
    /// Ends every timer and drain.
    stop: CancellationToken,
    /// Counts file writes that failed (their error is printed).
    pub(crate) write_failures: AtomicU64,
    /// Generation requests the gates let in (the autoscaler's request rate).
    pub(crate) arrivals: AtomicU64,
    /// When the fleet launched.
    launched: Instant,
    /// When the first generation request came: the fleet's clock starts there.
    zero: OnceLock<Instant>,
    /// Woken once, at the first request (the autoscaler waits for it).
    started: Notify,
    /// The settings the lifecycle log carries.
    log_settings: log::LogSettings,
    /// The front endpoint's URL (`--front-port`).
    pub front_url: Option<String>,
}

/// What [`Lifecycle::new`] needs besides the flags.
#[derive(Debug)]
pub(crate) struct LifecycleParts {
    /// Every slot's fault state (the listener switch).
    pub faults: Arc<WorkerFaults>,
    /// The shared engine.
    pub engine: EngineHandle,
    /// Every slot's address.
    pub all: Manifest,
    /// `--fleet-manifest`.
    pub manifest_path: Option<PathBuf>,
    /// `--shutdown-timeout`.
    pub drain_timeout: Duration,
    /// The fleet's stop token.
    pub stop: CancellationToken,
    /// The replica series (already registered).
    pub metrics: ReplicaMetrics,
    /// The engine's metrics (the autoscaler reads the output tokens).
    pub engine_metrics: Arc<Metrics>,
    /// Every worker's engine settings (the `load` policy's capacity).
    pub worker: servesim::scheduler::EngineConfig,
    /// The front endpoint's URL (`--front-port`), once bound.
    pub front_url: Option<String>,
}

/// A slot's line in `GET /fleet/scale`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SlotStatus {
    /// Its index.
    pub index: usize,
    /// Its base URL.
    pub url: String,
    /// Its phase's name.
    pub phase: &'static str,
}

/// The fleet's counts, as `GET /fleet/scale` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleStatus {
    /// Asked for.
    pub desired: usize,
    /// Loading or ready.
    pub replicas: usize,
    /// Ready.
    pub ready: usize,
    /// Loading.
    pub loading: usize,
    /// Draining.
    pub draining: usize,
    /// Every provisioned or draining slot.
    pub workers: Vec<SlotStatus>,
}

impl Lifecycle {
    /// Slots `0..min` ready, the rest absent (their listeners closed before anything serves).
    /// Writes the files; an error names the file that could not be written.
    pub(crate) fn new(
        config: ElasticConfig,
        parts: LifecycleParts,
    ) -> Result<Arc<Lifecycle>, PublishError> {
        let max = config.max;
        let phases = (0..max)
            .map(|i| {
                if i < config.min {
                    Phase::Ready
                } else {
                    Phase::Absent
                }
            })
            .collect();
        for i in config.min..max {
            parts.faults.switch(i, WorkerState::Down);
        }
        let lifecycle = Arc::new(Lifecycle {
            slots: Mutex::new(Slots {
                desired: config.min,
                phases,
                epochs: vec![0; max],
                rng: ChaCha8Rng::seed_from_u64(
                    config.seed ^ servesim::replay::autoscale::LOAD_DELAY_SEED,
                ),
                record: log::Recorder::default(),
            }),
            counts: (0..max).map(|_| SlotCount::default()).collect(),
            faults: parts.faults,
            engine: parts.engine,
            current_manifest: Arc::new(Mutex::new(Arc::from(parts.all.to_json()))),
            all: parts.all,
            manifest_path: parts.manifest_path,
            metrics: parts.metrics,
            drain_timeout: parts.drain_timeout,
            stop: parts.stop,
            write_failures: AtomicU64::new(0),
            arrivals: AtomicU64::new(0),
            launched: Instant::now(),
            zero: OnceLock::new(),
            started: Notify::new(),
            log_settings: log::LogSettings {
                policy: match &config.autoscale {
                    None => "manual".into(),
                    Some(servesim::autoscale::PolicySpec::External(_)) => "external".into(),
                    Some(spec) => spec.to_string(),
                },
                speedup: config.speedup,
                tick: config.autoscale_tick,
                model_load: config.model_load,
                min: config.min,
                max: config.max,
            },
            front_url: parts.front_url,
            config,
        });
        let mut slots = lifecycle.lock();
        lifecycle.count(&mut slots);
        lifecycle.publish(&slots)?;
        drop(slots);
        if let Some(spec) = lifecycle.config.autoscale.clone() {
            let autoscaler = autoscaler::Autoscaler {
                spec,
                timeout: lifecycle.config.autoscale_timeout,
                lifecycle: Arc::clone(&lifecycle),
                engine: lifecycle.engine.clone(),
                metrics: parts.engine_metrics,
                worker: parts.worker,
            };
            tokio::spawn(autoscaler.run(lifecycle.stop.clone()));
        }
        Ok(lifecycle)
    }

    /// The fleet's clock zero: its first generation request (None before one).
    pub(crate) fn zero(&self) -> Option<Instant> {
        self.zero.get().copied()
    }

    /// Waits for the first generation request; its instant.
    pub(crate) async fn first_request(&self) -> Instant {
        loop {
            let started = self.started.notified();
            if let Some(zero) = self.zero() {
                return zero;
            }
            started.await;
        }
    }

    /// Marks the first generation request (later calls do nothing).
    fn arrived(&self) {
        if self.zero.set(Instant::now()).is_ok() {
            self.started.notify_waiters();
            self.started.notify_one();
            let slots = self.lock();
            self.write_log(&slots);
        }
    }

    /// The lifecycle so far, in simulated seconds from the first request.
    pub fn lifecycle_log(&self) -> LifecycleLog {
        let slots = self.lock();
        self.log_of(&slots)
    }

    fn log_of(&self, slots: &Slots) -> LifecycleLog {
        let zero = self.zero();
        LifecycleLog::of(
            &slots.record,
            &self.log_settings,
            zero.unwrap_or(self.launched),
            zero.is_some(),
        )
    }

    /// A tick at which the autoscaler held (kept in the log).
    pub(crate) fn warn(&self, text: String) {
        let mut slots = self.lock();
        slots.record.warning(Instant::now(), text);
        self.write_log(&slots);
    }

    /// Records the GPUs held and the ready workers now.
    fn count(&self, slots: &mut Slots) {
        let gpus = slots.phases.iter().filter(|p| **p != Phase::Absent).count();
        let ready = slots.phases.iter().filter(|p| **p == Phase::Ready).count();
        slots.record.counts(Instant::now(), gpus, ready);
    }

    /// Rewrites `--lifecycle-log` (a failure is counted and printed).
    fn write_log(&self, slots: &Slots) {
        let Some(path) = &self.config.lifecycle_log else {
            return;
        };
        let text = serde_json::to_string(&self.log_of(slots)).unwrap_or_default();
        if let Err(error) = write_whole(path, &text) {
            self.write_failures.fetch_add(1, Ordering::Relaxed);
            let e = PublishError::Lifecycle {
                path: path.clone(),
                error,
            };
            eprintln!("mockserve fleet: warning: {e}");
        }
    }

    /// Slots that take requests now, by index.
    pub(crate) fn ready_slots(&self) -> Vec<usize> {
        let slots = self.lock();
        (0..slots.phases.len())
            .filter(|&i| slots.phases[i] == Phase::Ready)
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // A panic under this lock leaves plain data; keep serving with it.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Slot `index`'s phase (Absent for an index beyond the fleet).
    pub fn phase(&self, index: usize) -> Phase {
        self.lock()
            .phases
            .get(index)
            .copied()
            .unwrap_or(Phase::Absent)
    }

    /// The counts now.
    pub fn status(&self) -> ScaleStatus {
        let slots = self.lock();
        self.status_of(&slots)
    }

    fn status_of(&self, slots: &Slots) -> ScaleStatus {
        let count = |f: fn(&Phase) -> bool| slots.phases.iter().filter(|p| f(p)).count();
        ScaleStatus {
            desired: slots.desired,
            replicas: count(|p| p.is_live()),
            ready: count(|p| *p == Phase::Ready),
            loading: count(|p| *p == Phase::Loading),
            draining: count(|p| matches!(p, Phase::Draining { .. })),
            workers: slots
                .phases
                .iter()
                .enumerate()
                .filter(|(_, p)| **p != Phase::Absent)
                .map(|(index, p)| SlotStatus {
                    index,
                    url: self.all.workers[index].url.clone(),
                    phase: p.name(),
                })
                .collect(),
        }
    }

    /// Asks for `replicas` workers: provisions absent slots (lowest index first) or drains
    /// provisioned ones (loading before ready, highest index first) until the live count
    /// matches. Returns the counts once the request is applied (loads and drains go on).
    pub fn scale(self: &Arc<Self>, replicas: u64) -> Result<ScaleStatus, ScaleError> {
        let (min, max) = (self.config.min, self.config.max);
        let n = match usize::try_from(replicas) {
            Ok(n) if (min..=max).contains(&n) => n,
            _ => {
                return Err(ScaleError::OutOfBounds {
                    given: replicas,
                    min,
                    max,
                })
            }
        };
        let mut slots = self.lock();
        if slots.desired != n {
            self.metrics.scale_events.inc();
            let live = slots.phases.iter().filter(|p| p.is_live()).count();
            slots.record.event(Instant::now(), live, n);
        }
        slots.desired = n;
        self.reconcile(&mut slots);
        Ok(self.status_of(&slots))
    }

    /// Moves slots toward the desired count, then rewrites the files.
    fn reconcile(self: &Arc<Self>, slots: &mut Slots) {
        let mut live = slots.phases.iter().filter(|p| p.is_live()).count();
        while live < slots.desired {
            // A slot still draining is not reused: the next drain's end provisions it.
            let Some(i) = slots.phases.iter().position(|p| *p == Phase::Absent) else {
                break;
            };
            self.provision(slots, i);
            live += 1;
        }
        while live > slots.desired {
            let victim = (0..slots.phases.len())
                .rev()
                .find(|&i| slots.phases[i] == Phase::Loading)
                .or_else(|| {
                    (0..slots.phases.len())
                        .rev()
                        .find(|&i| slots.phases[i] == Phase::Ready)
                });
            let Some(i) = victim else { break };
            slots.epochs[i] += 1;
            if slots.phases[i] == Phase::Loading {
                // Nothing ran on it: gone at once.
                slots.phases[i] = Phase::Absent;
                self.faults.switch(i, WorkerState::Down);
            } else {
                slots.phases[i] = Phase::Draining { refusing: false };
                tokio::spawn(Arc::clone(self).drain(i, slots.epochs[i]));
            }
            live -= 1;
        }
        self.count(slots);
        self.write_log(slots);
        if let Err(e) = self.publish(slots) {
            self.write_failures.fetch_add(1, Ordering::Relaxed);
            eprintln!("mockserve fleet: warning: rewriting the fleet's files failed: {e}");
        }
    }

    /// Slot `i` starts loading: its listener opens, it becomes ready after a drawn delay.
    fn provision(self: &Arc<Self>, slots: &mut Slots, i: usize) {
        // The draw of `mockserve replay --autoscale` (same seed, same sequence), in simulated
        // time, then on the wall clock.
        let lifecycle = servesim::autoscale::LifecycleConfig {
            model_load: self.config.model_load.into(),
            model_load_jitter: self.config.model_load_jitter.into(),
            seed: self.config.seed,
            pools: Vec::new(),
        };
        let delay = self
            .config
            .wall(lifecycle.draw_load_delay(&mut slots.rng).into());
        slots.epochs[i] += 1;
        slots.phases[i] = Phase::Loading;
        self.faults.switch(i, WorkerState::Ok);
        tokio::spawn(Arc::clone(self).load(i, slots.epochs[i], delay));
    }

    /// Slot `i`'s model load: ready after `delay` unless it changed meanwhile.
    async fn load(self: Arc<Self>, i: usize, epoch: u64, delay: Duration) {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
        let mut slots = self.lock();
        if slots.epochs[i] == epoch && slots.phases[i] == Phase::Loading {
            slots.phases[i] = Phase::Ready;
            self.reconcile(&mut slots);
        }
    }

    /// Slot `i`'s drain: the grace, then refusal, then its requests in flight end (or the
    /// drain timeout ends them), its KV is emptied and the slot is free.
    async fn drain(self: Arc<Self>, i: usize, epoch: u64) {
        tokio::select! {
            biased;
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep(self.config.drain_grace) => {}
        }
        {
            let mut slots = self.lock();
            if slots.epochs[i] != epoch {
                return;
            }
            slots.phases[i] = Phase::Draining { refusing: true };
        }
        let deadline = Instant::now() + self.drain_timeout;
        let count = &self.counts[i];
        loop {
            let idle = count.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if count.inflight.load(Ordering::SeqCst) == 0 {
                break;
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep_until(deadline) => {
                    eprintln!(
                        "mockserve fleet: worker {i}: {} requests still running after the \
                         drain timeout; ending them",
                        count.inflight.load(Ordering::SeqCst)
                    );
                    break;
                }
                () = &mut idle => {}
            }
        }
        // The listener closes and running generations end (none, unless the timeout hit).
        self.faults.switch(i, WorkerState::Down);
        let worker = WorkerId(u32::try_from(i).unwrap_or(u32::MAX));
        for _ in 0..1000 {
            match self.engine.reset_prefix_cache(Some(worker)).await {
                Ok(reset) if reset.iter().all(|(_, done)| *done) => break,
                Ok(_) => {}
                Err(_) => break,
            }
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(KV_RESET_RETRY) => {}
            }
        }
        let mut slots = self.lock();
        if slots.epochs[i] == epoch {
            slots.epochs[i] += 1;
            slots.phases[i] = Phase::Absent;
            self.reconcile(&mut slots);
        }
    }

    /// Rewrites the manifest and discovery file (ready workers only) and the gauges.
    fn publish(&self, slots: &Slots) -> Result<(), PublishError> {
        let status = self.status_of(slots);
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.metrics.desired.set(gauge(status.desired));
        self.metrics.ready.set(gauge(status.ready));
        self.metrics.loading.set(gauge(status.loading));
        self.metrics.draining.set(gauge(status.draining));
        let ready: Vec<usize> = (0..slots.phases.len())
            .filter(|&i| slots.phases[i] == Phase::Ready)
            .collect();
        let manifest = Manifest {
            workers: ready.iter().map(|&i| self.all.workers[i].clone()).collect(),
            ..self.all.clone()
        };
        let json = manifest.to_json();
        *self
            .current_manifest
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Arc::from(json.as_str());
        if let Some(path) = &self.manifest_path {
            write_whole(path, &json).map_err(|error| PublishError::Manifest {
                path: path.clone(),
                error,
            })?;
        }
        if let Some(path) = &self.config.discovery_file {
            let endpoints = ready
                .iter()
                .filter_map(|&i| {
                    let url = &self.all.workers[i].url;
                    let addr = url.strip_prefix("http://")?.parse().ok()?;
                    Some(Endpoint::new(i, addr))
                })
                .collect();
            EndpointsFile { endpoints }
                .write(path)
                .map_err(|error| PublishError::Discovery {
                    path: path.clone(),
                    error,
                })?;
        }
        Ok(())
    }
}

/// Decrements a slot's in-flight count when dropped (a refused request, or a body's end).
struct Inflight {
    lifecycle: Arc<Lifecycle>,
    index: usize,
}

impl Drop for Inflight {
    fn drop(&mut self) {
        let count = &self.lifecycle.counts[self.index];
        if count.inflight.fetch_sub(1, Ordering::SeqCst) == 1 {
            count.idle.notify_waiters();
        }
    }
}

/// The 503 of a request a slot does not take in `phase`.
fn refused(index: usize, phase: Phase) -> ApiError {
    let (message, code) = match phase {
        Phase::Loading => return crate::api::vllm::loading(),
        Phase::Draining { .. } => (
            format!(
                "Worker {index} is draining (scaled down); send new requests to another worker."
            ),
            "worker_draining",
        ),
        Phase::Absent | Phase::Ready => (
            format!("Worker {index} is not provisioned (scaled down)."),
            "worker_not_provisioned",
        ),
    };
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message,
        kind: "server_error",
        param: None,
        code: Some(code),
    }
}

/// The middleware in front of slot `index`'s API (see the module docs).
pub(crate) async fn gate(
    State((lifecycle, index)): State<(Arc<Lifecycle>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    match fault::route(request.uri().path()) {
        fault::Route::Other => next.run(request).await,
        fault::Route::Health => match lifecycle.phase(index) {
            Phase::Ready => next.run(request).await,
            phase => {
                let body = Json(json!({"status": phase.name()}));
                (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
            }
        },
        fault::Route::Generation => {
            // Counted before the phase is read: a drain that sees 0 after refusing cannot miss
            // a request that read an earlier phase.
            lifecycle.counts[index]
                .inflight
                .fetch_add(1, Ordering::SeqCst);
            let guard = Inflight {
                lifecycle: Arc::clone(&lifecycle),
                index,
            };
            match lifecycle.phase(index) {
                Phase::Ready | Phase::Draining { refusing: false } => {
                    lifecycle.arrived();
                    lifecycle.arrivals.fetch_add(1, Ordering::Relaxed);
                    let response = next.run(request).await;
                    let (parts, body) = response.into_parts();
                    let body = body.into_data_stream().map(move |chunk| {
                        let _held = &guard;
                        chunk
                    });
                    Response::from_parts(parts, Body::from_stream(body))
                }
                phase => refused(index, phase).into_response(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_have_names_and_liveness() {
        assert_eq!(Phase::Loading.name(), "loading");
        assert_eq!(Phase::Draining { refusing: true }.name(), "draining");
        assert!(Phase::Loading.is_live() && Phase::Ready.is_live());
        assert!(!Phase::Absent.is_live() && !Phase::Draining { refusing: false }.is_live());
    }
}
