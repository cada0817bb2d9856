//! The offline elastic fleet (issue 46): a replay whose workers come and go under an
//! autoscaling policy on the virtual clock, and the judge of its scaling decisions.
//!
//! The cluster is built at its largest size; each worker slot is off, loading, ready or
//! draining. Only ready workers take new requests ([`Cluster::set_accepting`]). Every `tick`
//! (at `k · tick`, k ≥ 1) the policy decides from the fleet as scraped `scrape_delay` earlier;
//! the decision, clamped to each pool's `min..=max`, is carried out at once:
//! - growing a pool switches off slots on (lowest index first): each loads its model for a
//!   delay drawn from [`LifecycleConfig::draw_load_delay`] (seeded), then serves with an empty
//!   KV cache;
//! - shrinking a pool first stops workers still loading (latest first), then drains ready
//!   workers (highest index first): they take no new requests, finish their in-flight ones and
//!   stop; their KV cache is dropped.
//!
//! A policy that gives no answer ([`crate::autoscale::PolicyError`]) holds every pool as it is;
//! the warning is kept in the report. Each worker costs one GPU from the moment it is switched
//! on until it has stopped.
//!
//! **The judge** ([`AutoscaleReport`]) cuts the run into windows of one tick, by arrival time.
//! A window's attainment is the share of its arrivals that completed within the SLO (none
//! arrived: 1); a window is *in violation* when its attainment is below the target (0.95).
//! The **oracle** knows the future: for each window, the fewest workers `n*` (within the
//! pool's `min..=max`) whose static fleet, replaying the same arrivals, meets the target in that
//! window (found by static replays at growing sizes; `max` where none does). A worker the
//! oracle needs in a window must have started loading one mean model-load delay before it, so
//! the oracle holds `max n*` over the windows that start within the next model-load delay.
//! `regret_gpu_seconds` sums, per window, the GPU-seconds the run spent above the oracle's;
//! `regret_slo_seconds` sums the windows the run had in violation and the oracle did not.
//! The oracle is computed for aggregated fleets only.

use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{replay_observed, ReplayConfig, ReplayError, ReplayObserver, ReplayOutcome};
use crate::autoscale::{
    slo_capacity, Decision, ExternalPolicy, LifecycleConfig, LifecycleError, LoadPolicy,
    LoadPolicyConfig, LoadTiming, Observation, Policy, PolicySpec, PoolObservation, PoolRole,
    SaturationPolicy, SaturationPolicyConfig, SloCapacity, WorkerObservation, WorkerState,
};
use crate::cluster::{Cluster, ClusterConfig, Output, ServingMode};
use crate::ids::RequestId;
use crate::slo::Slo;
use crate::time::{SimDuration, SimTime};
use crate::trace::{Trace, TraceRequest};

mod judge;

use judge::{judge, oracle_workers, run_end, JudgeInput, Windows};
pub use judge::{judge_run, RunSeries, ATTAINMENT_TARGET};

/// Mixed into `--seed` for the model-load draws, so that a live elastic fleet with the same
/// seed draws the same delays in the same order.
pub const LOAD_DELAY_SEED: u64 = 0x0a57_0ca1e;

/// How an elastic replay scales and is judged.
#[derive(Clone, Debug)]
pub struct AutoscaleSettings {
    /// The policy; None for a static fleet (judged all the same).
    pub policy: Option<PolicySpec>,
    /// Model-load delays and pool bounds.
    pub lifecycle: LifecycleConfig,
    /// Time between decisions (default 30 s).
    pub tick: SimDuration,
    /// How old the metrics a decision sees are (default 15 s; below the tick).
    pub scrape_delay: SimDuration,
    /// The objectives the judge holds requests to.
    pub slo: Slo,
    /// How long an external policy may take per answer (wall clock).
    pub external_timeout: Duration,
    /// Settings of the saturation policy (a running target of None is derived from the SLO:
    /// [`crate::autoscale::SloCapacity::running`]).
    pub saturation: SaturationPolicyConfig,
    /// Target utilisation of the load policy; None: derived from the SLO
    /// ([`crate::autoscale::SloCapacity::utilisation`]).
    pub load_utilisation: Option<f64>,
    /// The mean prompt length a worker's SLO capacity is sized at; None: the trace's mean.
    pub sizing_isl: Option<usize>,
    /// The mean output length a worker's SLO capacity is sized at; None: the trace's mean.
    pub sizing_osl: Option<usize>,
    /// Whether to run the oracle's static replays.
    pub oracle: bool,
}

/// Why an elastic replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum AutoscaleError {
    /// Bad lifecycle or tick settings.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The policy could not be built or started.
    #[error("{0}")]
    Policy(String),
    /// The replay itself failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// One scale event: a pool's target size changed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleEvent {
    /// Virtual time, seconds.
    pub time_s: f64,
    /// The pool.
    pub role: PoolRole,
    /// Size before.
    pub from: usize,
    /// Size after.
    pub to: usize,
}

/// One window of the judge's time series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowSample {
    /// Window start, seconds.
    pub start_s: f64,
    /// Mean GPUs held over the window (loading, ready and draining workers).
    pub gpus: f64,
    /// Ready workers at the window's end.
    pub ready: usize,
    /// Requests that arrived in the window, per second.
    pub request_rate: f64,
    /// Share of those requests that met the SLO (1 when none arrived).
    pub attainment: f64,
    /// The oracle's workers for the window (None without an oracle).
    pub oracle_workers: Option<usize>,
}

/// The judge's verdict on a run (the report's `autoscale` section).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoscaleReport {
    /// `load`, `saturation`, `external` or `static`.
    pub policy: String,
    /// GPU-seconds held over the run.
    pub gpu_seconds: f64,
    /// `gpu_seconds` over the run's length.
    pub mean_gpus: f64,
    /// Most GPUs held at once.
    pub peak_gpus: usize,
    /// Share of all requests that completed within the SLO.
    pub slo_attainment: f64,
    /// Seconds of windows in violation.
    pub violation_seconds: f64,
    /// Pool size changes.
    pub scale_events: usize,
    /// Scale events that reverse the pool's previous one within two model-load delays.
    pub oscillations: usize,
    /// GPU-seconds of the oracle (None without one).
    pub oracle_gpu_seconds: Option<f64>,
    /// GPU-seconds spent above the oracle, summed per window.
    pub regret_gpu_seconds: Option<f64>,
    /// Seconds of windows in violation that the oracle met.
    pub regret_slo_seconds: Option<f64>,
    /// Length of the run, seconds (to the last request's end).
    pub duration_s: f64,
    /// Window length, seconds (the tick).
    pub window_s: f64,
    /// The attainment a window must reach not to be in violation.
    pub attainment_target: f64,
    /// Every scale event.
    pub events: Vec<ScaleEvent>,
    /// Ticks at which the policy gave no answer and the fleet held (time and reason).
    pub warnings: Vec<String>,
    /// Per window: GPUs, ready workers, load, attainment, oracle workers.
    pub timeline: Vec<WindowSample>,
}

/// An elastic replay's results.
#[derive(Debug)]
pub struct ElasticOutcome {
    /// The replay's own outcome (report, records, rejections).
    pub outcome: ReplayOutcome,
    /// The judge's verdict.
    pub autoscale: AutoscaleReport,
}

/// Where a worker slot is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Off,
    Loading { until: SimTime },
    Ready,
    Draining,
}

/// A pool's slots and bounds.
#[derive(Clone, Debug)]
struct Pool {
    role: PoolRole,
    min: usize,
    max: usize,
    /// Global worker indices of the pool's slots.
    first: usize,
}

/// Arrivals since the last scrape.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    requests: usize,
    isl: usize,
    osl: usize,
}

/// The elastic fleet as a replay observer.
struct Fleet<'a> {
    inner: &'a mut dyn ReplayObserver,
    policy: Option<Box<dyn Policy>>,
    lifecycle: LifecycleConfig,
    pools: Vec<Pool>,
    slots: Vec<Slot>,
    rng: ChaCha8Rng,
    tick: SimDuration,
    next_tick: SimTime,
    next_scrape: SimTime,
    last_scrape: SimTime,
    window: Window,
    observation: Option<Observation>,
    /// GPU count change points.
    gpus: Vec<(SimTime, usize)>,
    /// Ready count change points.
    ready: Vec<(SimTime, usize)>,
    events: Vec<ScaleEvent>,
    warnings: Vec<String>,
    now: SimTime,
}

impl Fleet<'_> {
    fn target(&self, pool: &Pool) -> usize {
        self.slots[pool.first..pool.first + pool.max]
            .iter()
            .filter(|s| matches!(s, Slot::Ready | Slot::Loading { .. }))
            .count()
    }

    fn record(&mut self, now: SimTime) {
        let gpus = self.slots.iter().filter(|s| **s != Slot::Off).count();
        let ready = self.slots.iter().filter(|s| **s == Slot::Ready).count();
        for (series, value) in [(&mut self.gpus, gpus), (&mut self.ready, ready)] {
            match series.last_mut() {
                Some((t, v)) if *t == now => *v = value,
                Some((_, v)) if *v == value => {}
                _ => series.push((now, value)),
            }
        }
    }

    fn publish(&mut self, cluster: &mut Cluster) {
        let mask: Vec<bool> = self.slots.iter().map(|s| *s == Slot::Ready).collect();
        cluster.set_accepting(&mask);
    }

    fn scrape(&mut self, cluster: &Cluster, at: SimTime) {
        let stats = cluster.snapshot();
        let interval_s = at.saturating_since(self.last_scrape).as_micros() as f64 / 1e6;
        let w = std::mem::take(&mut self.window);
        let mut workers = Vec::new();
        let mut pools = Vec::new();
        for pool in &self.pools {
            let mut p = PoolObservation {
                role: pool.role,
                current: 0,
                ready: 0,
                loading: 0,
                draining: 0,
                min: pool.min,
                max: pool.max,
                kv_usage: 0.0,
                running: 0,
                waiting: 0,
            };
            for i in pool.first..pool.first + pool.max {
                let state = match self.slots[i] {
                    Slot::Off => continue,
                    Slot::Loading { .. } => WorkerState::Loading,
                    Slot::Ready => WorkerState::Ready,
                    Slot::Draining => WorkerState::Draining,
                };
                let s = &stats.workers[i];
                let kv_usage = s.scheduler.active_blocks as f64 / s.num_gpu_blocks.max(1) as f64;
                match state {
                    WorkerState::Loading => p.loading += 1,
                    WorkerState::Ready => {
                        p.ready += 1;
                        p.kv_usage += kv_usage;
                    }
                    WorkerState::Draining => p.draining += 1,
                }
                p.running += s.scheduler.running;
                p.waiting += s.scheduler.waiting;
                workers.push(WorkerObservation {
                    id: i as u32,
                    role: pool.role,
                    state,
                    kv_usage,
                    running: s.scheduler.running,
                    waiting: s.scheduler.waiting,
                });
            }
            p.current = p.ready + p.loading;
            if p.ready > 0 {
                p.kv_usage /= p.ready as f64;
            }
            pools.push(p);
        }
        let per = |x: usize| {
            if w.requests > 0 {
                x as f64 / w.requests as f64
            } else {
                0.0
            }
        };
        self.observation = Some(Observation {
            time_s: at.as_micros() as f64 / 1e6,
            interval_s,
            request_rate: if interval_s > 0.0 {
                w.requests as f64 / interval_s
            } else {
                0.0
            },
            mean_isl: per(w.isl),
            mean_osl: per(w.osl),
            queue: stats.parked
                + stats
                    .workers
                    .iter()
                    .map(|s| s.scheduler.waiting)
                    .sum::<usize>(),
            pools,
            workers,
        });
        self.last_scrape = at;
    }

    fn decide(&mut self, cluster: &mut Cluster, now: SimTime) {
        let (Some(policy), Some(obs)) = (self.policy.as_mut(), self.observation.as_ref()) else {
            return;
        };
        let answer = policy.decide(obs).and_then(|d| {
            let shape_ok = self.pools.iter().all(|p| d.count(p.role).is_some());
            if shape_ok {
                Ok(d)
            } else {
                Err(crate::autoscale::PolicyError::Shape {
                    decision: d,
                    shape: if self.pools.len() > 1 {
                        "a disaggregated"
                    } else {
                        "an aggregated"
                    },
                })
            }
        });
        let decision: Decision = match answer {
            Ok(d) => d,
            Err(e) => {
                self.warnings
                    .push(format!("t={:.0}s: {e}", now.as_micros() as f64 / 1e6));
                return;
            }
        };
        for k in 0..self.pools.len() {
            let pool = self.pools[k].clone();
            let want = decision
                .count(pool.role)
                .unwrap_or(0)
                .clamp(pool.min, pool.max);
            let have = self.target(&pool);
            if want == have {
                continue;
            }
            self.events.push(ScaleEvent {
                time_s: now.as_micros() as f64 / 1e6,
                role: pool.role,
                from: have,
                to: want,
            });
            let range = pool.first..pool.first + pool.max;
            if want > have {
                let mut missing = want - have;
                for i in range {
                    if missing == 0 {
                        break;
                    }
                    if self.slots[i] == Slot::Off {
                        let delay = self.lifecycle.draw_load_delay(&mut self.rng);
                        self.slots[i] = Slot::Loading { until: now + delay };
                        missing -= 1;
                    }
                }
            } else {
                let mut extra = have - want;
                // Loading workers first, latest to finish first; then ready ones from the top.
                let mut loading: Vec<(SimTime, usize)> = range
                    .clone()
                    .filter_map(|i| match self.slots[i] {
                        Slot::Loading { until } => Some((until, i)),
                        _ => None,
                    })
                    .collect();
                loading.sort_by(|a, b| b.cmp(a));
                for (_, i) in loading {
                    if extra == 0 {
                        break;
                    }
                    self.slots[i] = Slot::Off;
                    extra -= 1;
                }
                for i in range.rev() {
                    if extra == 0 {
                        break;
                    }
                    if self.slots[i] == Slot::Ready {
                        self.slots[i] = Slot::Draining;
                        extra -= 1;
                    }
                }
            }
        }
        self.publish(cluster);
    }

    /// Handles every lifecycle and policy event due by `now`, then stops idle draining workers.
    fn step(&mut self, cluster: &mut Cluster, now: SimTime) {
        self.now = self.now.max(now);
        let mut changed = false;
        for i in 0..self.slots.len() {
            if let Slot::Loading { until } = self.slots[i] {
                if until <= now {
                    // A new worker starts with an empty cache.
                    cluster.drop_worker_cache(i);
                    self.slots[i] = Slot::Ready;
                    changed = true;
                }
            }
        }
        if changed {
            self.publish(cluster);
        }
        if self.policy.is_some() {
            while self.next_scrape <= now || self.next_tick <= now {
                if self.next_scrape <= self.next_tick {
                    let at = self.next_scrape;
                    self.scrape(cluster, at);
                    self.next_scrape += self.tick;
                } else {
                    let at = self.next_tick;
                    self.decide(cluster, at);
                    self.next_tick += self.tick;
                }
            }
        }
        for i in 0..self.slots.len() {
            if self.slots[i] == Slot::Draining && cluster.worker_is_idle(i) {
                cluster.drop_worker_cache(i);
                self.slots[i] = Slot::Off;
            }
        }
        self.record(now);
    }
}

impl ReplayObserver for Fleet<'_> {
    fn start(&mut self, cluster: &mut Cluster) {
        self.publish(cluster);
        self.record(SimTime::ZERO);
        self.inner.start(cluster);
    }

    fn submitted(&mut self, id: RequestId, turn: &TraceRequest) {
        self.window.requests += 1;
        self.window.isl += turn.input_length;
        self.window.osl += turn.output_length;
        self.inner.submitted(id, turn);
    }

    fn outputs(&mut self, cluster: &mut Cluster, outputs: &[Output], now: SimTime) {
        self.inner.outputs(cluster, outputs, now);
        self.step(cluster, now);
    }

    fn wake_at(&self) -> Option<SimTime> {
        let loads = self.slots.iter().filter_map(|s| match s {
            Slot::Loading { until } => Some(*until),
            _ => None,
        });
        let policy = self
            .policy
            .is_some()
            .then(|| self.next_tick.min(self.next_scrape));
        let inner = self.inner.wake_at();
        loads.chain(policy).chain(inner).min()
    }
}

/// One worker's capacity within the SLO ([`crate::autoscale::slo_capacity`]) at the
/// settings' sizing lengths, each defaulting to the trace's mean: what the `load` policy
/// divides its predicted load by and the `saturation` policy's running-requests target.
pub fn trace_slo_capacity(
    config: &ClusterConfig,
    trace: &Trace,
    settings: &AutoscaleSettings,
) -> SloCapacity {
    let turns = || trace.sessions.iter().flat_map(|s| &s.turns);
    let n = turns().count().max(1);
    let isl = settings
        .sizing_isl
        .unwrap_or_else(|| turns().map(|t| t.input_length).sum::<usize>() / n);
    let osl = settings
        .sizing_osl
        .unwrap_or_else(|| turns().map(|t| t.output_length).sum::<usize>() / n);
    slo_capacity(&config.engine, isl, osl, &settings.slo)
}

/// Seconds of a duration.
fn secs(d: SimDuration) -> f64 {
    d.as_micros() as f64 / 1e6
}

/// The lifecycle timing the `load` policy plans around.
pub fn load_timing(settings: &AutoscaleSettings) -> LoadTiming {
    LoadTiming {
        tick_s: secs(settings.tick),
        scrape_delay_s: secs(settings.scrape_delay),
        model_load_s: secs(settings.lifecycle.model_load),
        model_load_jitter_s: secs(settings.lifecycle.model_load_jitter),
    }
}

fn build_policy(
    settings: &AutoscaleSettings,
    config: &ClusterConfig,
    trace: &Trace,
) -> Result<Option<Box<dyn Policy>>, AutoscaleError> {
    let Some(spec) = &settings.policy else {
        return Ok(None);
    };
    Ok(Some(match spec {
        PolicySpec::Load => {
            let c = trace_slo_capacity(config, trace, settings);
            let mut planned = LoadPolicyConfig::planned(&c, &load_timing(settings));
            if let Some(utilisation) = settings.load_utilisation {
                planned.target_utilisation = utilisation;
            }
            Box::new(LoadPolicy::new(planned).map_err(AutoscaleError::Policy)?)
        }
        PolicySpec::Saturation => {
            let mut saturation = settings.saturation.clone();
            if saturation.running_target.is_none() {
                saturation.running_target =
                    Some(trace_slo_capacity(config, trace, settings).running);
            }
            Box::new(SaturationPolicy::new(saturation).map_err(AutoscaleError::Policy)?)
        }
        PolicySpec::External(cmd) => Box::new(
            ExternalPolicy::spawn(cmd, settings.external_timeout)
                .map_err(|e| AutoscaleError::Policy(e.to_string()))?,
        ),
    }))
}

/// The cluster at its largest size, and the pools' slots in it.
fn elastic_cluster(
    config: &ClusterConfig,
    lifecycle: &LifecycleConfig,
) -> (ClusterConfig, Vec<Pool>, Vec<Slot>) {
    let mut cluster = config.clone();
    let mut pools = Vec::new();
    let mut slots = Vec::new();
    let mut add = |role: PoolRole, pools: &mut Vec<Pool>| {
        let b = lifecycle.pool(role).copied();
        let (min, max, initial) = b.map_or((1, 1, 1), |b| (b.min, b.max, b.initial));
        pools.push(Pool {
            role,
            min,
            max,
            first: slots.len(),
        });
        slots.extend((0..max).map(|i| if i < initial { Slot::Ready } else { Slot::Off }));
        max
    };
    match &mut cluster.serving {
        ServingMode::Aggregated => {
            cluster.num_workers = add(PoolRole::Aggregated, &mut pools);
        }
        ServingMode::Disagg {
            num_prefill_workers,
            num_decode_workers,
            ..
        } => {
            *num_prefill_workers = add(PoolRole::Prefill, &mut pools);
            *num_decode_workers = add(PoolRole::Decode, &mut pools);
        }
    }
    (cluster, pools, slots)
}

/// Replays `trace` on an elastic fleet and judges it (see the module doc).
pub fn replay_elastic(
    trace: &Trace,
    config: &ReplayConfig,
    settings: &AutoscaleSettings,
    progress: impl FnMut(usize, usize),
    inner: &mut dyn ReplayObserver,
) -> Result<ElasticOutcome, AutoscaleError> {
    settings.lifecycle.validate()?;
    if settings.tick.as_micros() == 0 {
        return Err(LifecycleError::ZeroTick.into());
    }
    if settings.policy.is_some() && settings.scrape_delay >= settings.tick {
        return Err(LifecycleError::ScrapeDelay {
            delay: settings.scrape_delay,
            tick: settings.tick,
        }
        .into());
    }
    let (cluster, pools, slots) = elastic_cluster(&config.cluster, &settings.lifecycle);
    let run_config = ReplayConfig {
        cluster,
        trace_block_size: config.trace_block_size,
    };
    let policy = build_policy(settings, &run_config.cluster, trace)?;
    let policy_name = policy.as_ref().map_or("static", |p| p.name()).to_string();
    let first_tick = SimTime::ZERO + settings.tick;
    let mut fleet = Fleet {
        inner,
        policy,
        rng: ChaCha8Rng::seed_from_u64(settings.lifecycle.seed ^ LOAD_DELAY_SEED),
        lifecycle: settings.lifecycle.clone(),
        pools,
        slots,
        tick: settings.tick,
        next_tick: first_tick,
        next_scrape: SimTime::from_nanos(
            first_tick
                .as_nanos()
                .saturating_sub(settings.scrape_delay.as_nanos()),
        ),
        last_scrape: SimTime::ZERO,
        window: Window::default(),
        observation: None,
        gpus: Vec::new(),
        ready: Vec::new(),
        events: Vec::new(),
        warnings: Vec::new(),
        now: SimTime::ZERO,
    };
    let outcome = replay_observed(trace, &run_config, progress, &mut fleet)?;
    let end = run_end(&outcome.records).max(fleet.now);
    let windows = Windows::new(settings.tick, end);
    let attainment = windows.attainment(&outcome.records, &settings.slo);
    let aggregated = fleet.pools.len() == 1;
    let oracle = if settings.oracle && aggregated {
        let pool = &fleet.pools[0];
        Some(oracle_workers(
            trace,
            config,
            settings,
            &windows,
            (pool.min, pool.max),
        )?)
    } else {
        None
    };
    let report = judge(JudgeInput {
        policy: policy_name,
        windows: &windows,
        records: &outcome.records,
        slo: &settings.slo,
        attainment: &attainment,
        gpus: &fleet.gpus,
        ready: &fleet.ready,
        oracle: oracle.as_deref(),
        model_load: settings.lifecycle.model_load,
        min_workers: fleet.pools.iter().map(|p| p.min).sum(),
        events: std::mem::take(&mut fleet.events),
        warnings: std::mem::take(&mut fleet.warnings),
    });
    Ok(ElasticOutcome {
        outcome,
        autoscale: report,
    })
}
