//! The autoscaler inside a live elastic fleet (`--autoscale load|saturation|external:CMD`,
//! `--autoscale-tick`): every tick it scrapes the fleet into a
//! `servesim::autoscale::Observation`, asks the policy, and applies the answer through
//! [`Lifecycle::scale`], as `PUT /fleet/scale` does (clamped to `--min-workers`,
//! `--max-workers`). A policy that fails (an external one that hangs, crashes or answers
//! garbage) holds the current count, with a warning on stderr; the fleet keeps serving.
//!
//! The observation's clock is the fleet's simulated clock: seconds since the first generation
//! request, wall time multiplied by `--speedup-ratio`, so that a policy sees the rates and
//! intervals of `mockserve replay` at any speed-up. Tick `k` (k ≥ 1) decides at `k · tick` on
//! that clock from the scrape taken at `k · tick − scrape delay`, as the replay does. Its
//! request rate counts the generation requests the workers' gates let in between scrapes; its
//! ISL is the prompt tokens the engine received over them, its OSL the output tokens generated
//! over them.
//! `load` and `saturation` size a worker with the engine's
//! [`servesim::autoscale::slo_capacity`] for `--slo`, at a speed-up of 1 (in simulated time, as
//! the observation is), at the ISL and OSL of the first tick that saw requests (or at
//! `--autoscale-isl` and `--autoscale-osl`), with the settings of `mockserve replay
//! --autoscale`; they decide from that tick on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use servesim::autoscale::{
    Decision, ExternalPolicy, LoadPolicy, LoadPolicyConfig, LoadTiming, Observation, Policy,
    PolicyError, PolicySpec, PoolObservation, PoolRole, SaturationPolicy, SaturationPolicyConfig,
    WorkerObservation, WorkerState,
};
use servesim::ids::WorkerId;
use servesim::scheduler::EngineConfig;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Lifecycle, Phase};
use crate::driver::EngineHandle;
use crate::metrics::Metrics;

/// What the autoscaler task needs.
#[derive(Debug)]
pub(crate) struct Autoscaler {
    /// The policy named by `--autoscale`.
    pub spec: PolicySpec,
    /// `--autoscale-timeout`: an external policy's answer time.
    pub timeout: Duration,
    /// The fleet's slots.
    pub lifecycle: Arc<Lifecycle>,
    /// The engine (snapshots).
    pub engine: EngineHandle,
    /// The engine's metrics (output tokens generated).
    pub metrics: Arc<Metrics>,
    /// Every worker's engine settings (the `load` policy's capacity).
    pub worker: EngineConfig,
}

/// Counters at the previous scrape.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    arrivals: u64,
    prompt_tokens: u64,
    output_tokens: u64,
}

impl Autoscaler {
    /// Output tokens generated so far, every worker.
    fn output_tokens(&self) -> u64 {
        (0..self.lifecycle.config.max)
            .map(|i| {
                let w = WorkerId(u32::try_from(i).unwrap_or(u32::MAX));
                self.metrics
                    .generation_tokens
                    .get_or_create(&self.metrics.engine(w))
                    .get()
            })
            .sum()
    }

    /// The fleet as it is now (`start` is the fleet's clock zero).
    async fn observe(&self, start: Instant, last: &mut (Instant, Totals)) -> Option<Observation> {
        let live = self.engine.snapshot().await.ok()?;
        let now = Instant::now();
        let speedup = self.lifecycle.config.speedup;
        let totals = Totals {
            arrivals: self.lifecycle.arrivals.load(Ordering::Relaxed),
            prompt_tokens: live.prompt_tokens,
            output_tokens: self.output_tokens(),
        };
        let interval_s = ((now - last.0).as_secs_f64() * speedup).max(1e-6);
        let arrived = totals.arrivals.saturating_sub(last.1.arrivals);
        let per = |d: u64| {
            if arrived == 0 {
                0.0
            } else {
                d as f64 / arrived as f64
            }
        };
        let mean_isl = per(totals.prompt_tokens.saturating_sub(last.1.prompt_tokens));
        let mean_osl = per(totals.output_tokens.saturating_sub(last.1.output_tokens));
        *last = (now, totals);
        let status = self.lifecycle.status();
        let mut workers = Vec::new();
        for slot in &status.workers {
            let state = match self.lifecycle.phase(slot.index) {
                Phase::Loading => WorkerState::Loading,
                Phase::Ready => WorkerState::Ready,
                Phase::Draining { .. } => WorkerState::Draining,
                Phase::Absent => continue,
            };
            let Some(w) = live.cluster.workers.get(slot.index) else {
                continue;
            };
            workers.push(WorkerObservation {
                id: w.worker.0,
                role: PoolRole::Aggregated,
                state,
                kv_usage: w.scheduler.active_blocks as f64 / w.num_gpu_blocks.max(1) as f64,
                running: w.scheduler.running,
                waiting: w.scheduler.waiting,
            });
        }
        let ready: Vec<&WorkerObservation> = workers
            .iter()
            .filter(|w| w.state == WorkerState::Ready)
            .collect();
        let kv_usage = if ready.is_empty() {
            0.0
        } else {
            ready.iter().map(|w| w.kv_usage).sum::<f64>() / ready.len() as f64
        };
        let running = workers.iter().map(|w| w.running).sum();
        let waiting: usize = workers.iter().map(|w| w.waiting).sum();
        Some(Observation {
            time_s: (now - start).as_secs_f64() * speedup,
            interval_s,
            request_rate: arrived as f64 / interval_s,
            mean_isl,
            mean_osl,
            queue: waiting,
            pools: vec![PoolObservation {
                role: PoolRole::Aggregated,
                current: status.replicas,
                ready: status.ready,
                loading: status.loading,
                draining: status.draining,
                min: self.lifecycle.config.min,
                max: self.lifecycle.config.max,
                kv_usage,
                running,
                waiting,
            }],
            workers,
        })
    }

    /// The policy, once it can be built: `load` and `saturation` size a worker at the ISL and
    /// OSL of the first tick that saw requests (or `--autoscale-isl`, `--autoscale-osl`), for
    /// `--slo`, with the settings of `mockserve replay --autoscale` (which sizes it at the
    /// trace's means).
    fn build(&self, observation: &Observation) -> Result<Option<Box<dyn Policy>>, String> {
        let config = &self.lifecycle.config;
        let capacity = || {
            // Simulated time, as the observation's rates.
            let mut worker = self.worker.clone();
            worker.latency.speedup_ratio = 1.0;
            let (isl, osl) = sizing_lengths(config, observation);
            servesim::autoscale::slo_capacity(&worker, isl, osl, &config.slo)
        };
        Ok(Some(match &self.spec {
            PolicySpec::External(command) => {
                Box::new(ExternalPolicy::spawn(command, self.timeout).map_err(|e| e.to_string())?)
            }
            _ if observation.request_rate <= 0.0 => return Ok(None),
            PolicySpec::Saturation => Box::new(SaturationPolicy::new(SaturationPolicyConfig {
                running_target: Some(capacity().running),
                ..SaturationPolicyConfig::default()
            })?),
            PolicySpec::Load => {
                let timing = LoadTiming {
                    tick_s: config.autoscale_tick.as_secs_f64(),
                    scrape_delay_s: config.scrape_delay.as_secs_f64(),
                    model_load_s: config.model_load.as_secs_f64(),
                    model_load_jitter_s: config.model_load_jitter.as_secs_f64(),
                };
                Box::new(LoadPolicy::new(LoadPolicyConfig::planned(
                    &capacity(),
                    &timing,
                ))?)
            }
        }))
    }

    /// Sleeps until `at`; false when `stop` came first.
    async fn sleep_until(stop: &CancellationToken, at: Instant) -> bool {
        tokio::select! {
            biased;
            () = stop.cancelled() => false,
            () = tokio::time::sleep_until(at) => true,
        }
    }

    /// Decides every tick from the first request on, until `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let start = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            zero = self.lifecycle.first_request() => zero,
        };
        let config = &self.lifecycle.config;
        let tick = config.wall(config.autoscale_tick);
        let delay = config.wall(config.scrape_delay);
        let mut last = (start, Totals::default());
        let mut policy: Option<Box<dyn Policy>> = None;
        let mut k: u32 = 0;
        loop {
            k = k.saturating_add(1);
            let decide_at = start + tick * k;
            // A tick missed (the runtime was late) is skipped, not run twice.
            if decide_at + tick < Instant::now() {
                continue;
            }
            if !Self::sleep_until(&stop, decide_at.checked_sub(delay).unwrap_or(start)).await {
                return;
            }
            let Some(observation) = self.observe(start, &mut last).await else {
                return;
            };
            if !Self::sleep_until(&stop, decide_at).await {
                return;
            }
            if policy.is_none() {
                match self.build(&observation) {
                    Ok(built) => policy = built,
                    Err(e) => {
                        let text = format!("--autoscale {}: {e}; holding", self.spec);
                        eprintln!("mockserve fleet: warning: {text}");
                        self.lifecycle.warn(text);
                        continue;
                    }
                }
            }
            let Some(mut p) = policy.take() else {
                continue;
            };
            // An external policy blocks up to its timeout: off the runtime's threads.
            let seen = observation.clone();
            let decided = tokio::task::spawn_blocking(move || {
                let decision = p.decide(&seen);
                (p, decision)
            });
            let (p, decision) = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                joined = decided => match joined {
                    Ok(done) => done,
                    Err(_) => return,
                },
            };
            policy = Some(p);
            let n = match decision {
                Ok(Decision::Workers(n)) => n,
                Ok(other) => {
                    let e = PolicyError::Shape {
                        decision: other,
                        shape: "aggregated",
                    };
                    eprintln!("mockserve fleet: warning: {e}");
                    self.lifecycle.warn(e.to_string());
                    continue;
                }
                Err(e) => {
                    eprintln!("mockserve fleet: warning: {e}");
                    self.lifecycle.warn(e.to_string());
                    continue;
                }
            };
            let (min, max) = (self.lifecycle.config.min, self.lifecycle.config.max);
            let n = n.clamp(min, max) as u64;
            // Within the bounds: always accepted.
            let _ = self.lifecycle.scale(n);
            self.lifecycle.metrics.decisions.inc();
        }
    }
}

/// The mean prompt and output lengths a worker is sized at: `--autoscale-isl` and
/// `--autoscale-osl` where given, else the observation's means, rounded.
fn sizing_lengths(config: &super::ElasticConfig, observation: &Observation) -> (usize, usize) {
    (
        config
            .sizing_isl
            .unwrap_or(observation.mean_isl.round() as usize),
        config
            .sizing_osl
            .unwrap_or(observation.mean_osl.round() as usize),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::elastic::{ElasticArgs, ElasticConfig};

    #[test]
    fn a_worker_is_sized_at_the_given_lengths_else_at_the_observed_means() {
        let args = |isl: Option<u32>, osl: Option<u32>| ElasticArgs {
            elastic: true,
            max_workers: Some(2),
            model_load: "240s".into(),
            model_load_jitter: "30s".into(),
            drain_grace: "2s".into(),
            autoscale: Some(PolicySpec::Load),
            autoscale_tick: "30s".into(),
            autoscale_timeout: "10s".into(),
            autoscale_isl: isl,
            autoscale_osl: osl,
            ..ElasticArgs::default()
        };
        let config = |isl, osl| {
            ElasticConfig::from_args(&args(isl, osl), 0, 1.0, "127.0.0.1")
                .expect("valid")
                .expect("elastic")
        };
        let observation = Observation {
            time_s: 30.0,
            interval_s: 30.0,
            request_rate: 2.0,
            mean_isl: 23_795.6,
            mean_osl: 148.4,
            queue: 0,
            pools: Vec::new(),
            workers: Vec::new(),
        };
        assert_eq!(
            sizing_lengths(&config(None, None), &observation),
            (23_796, 148)
        );
        assert_eq!(
            sizing_lengths(&config(Some(15_325), Some(149)), &observation),
            (15_325, 149)
        );
        assert_eq!(
            sizing_lengths(&config(Some(15_325), None), &observation),
            (15_325, 148)
        );
    }
}
