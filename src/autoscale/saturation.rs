//! `saturation`: KV-usage and queue thresholds with stabilisation windows, in the manner of
//! Kubernetes' HPA and llm-d's Workload Variant Autoscaler.
//!
//! Per pool, over its ready workers: `ratio = max(kv_usage / kv_target, running_per_worker /
//! running_target, waiting_per_worker / queue_target)`, each signal the mean of the scrapes of
//! the last `smooth_window_s` (point-sampled gauges are noisy); KV usage stays low when prompts
//! fit the cache easily and a queue forms only once TTFT is lost, while the requests running
//! per worker (running-batch saturation) rise with the load before either. Within `tolerance`
//! of 1 the recommendation is the current size, else `ceil(ready · ratio)` (at least 1 while
//! anything is running or waiting). As HPA does, a scale-up takes the smallest recommendation
//! of the last `up_window` and a scale-down the largest of the last `down_window`, so one quiet scrape does not drop workers that the next
//! burst needs; a scale-down then removes one worker per decision (HPA's scale-down policies
//! limit the rate the same way). While workers of the pool are still loading the pool is not
//! shrunk (their capacity is not in the metrics yet).

use std::collections::VecDeque;

use super::policy::{Decision, Observation, Policy, PolicyError, PoolObservation, PoolRole};

/// Settings of the saturation policy.
#[derive(Clone, Debug, PartialEq)]
pub struct SaturationPolicyConfig {
    /// Target mean KV usage of the ready workers, in (0, 1].
    pub kv_target: f64,
    /// Target requests waiting per ready worker (above 0).
    pub queue_target: f64,
    /// No change while the ratio is within this of 1 (HPA's default is 0.1).
    pub tolerance: f64,
    /// Seconds of recommendations a scale-up takes the minimum of (HPA: 0).
    pub up_window_s: f64,
    /// Seconds of recommendations a scale-down takes the maximum of (HPA: 300).
    pub down_window_s: f64,
    /// Target requests running per ready worker (running-batch saturation: a worker serving
    /// more at once than this is near the load it holds within the SLO); above 0.
    pub running_target: f64,
    /// Seconds of scrapes the signals are averaged over before they are compared with their
    /// targets (as `avg_over_time` smooths point-sampled gauges); 0 = the latest scrape only.
    pub smooth_window_s: f64,
}

impl Default for SaturationPolicyConfig {
    fn default() -> Self {
        SaturationPolicyConfig {
            kv_target: 0.7,
            queue_target: 1.0,
            tolerance: 0.1,
            up_window_s: 0.0,
            down_window_s: 240.0,
            running_target: 1.5,
            smooth_window_s: 90.0,
        }
    }
}

/// One scrape's signals of a pool: (time, KV usage, running per ready worker, waiting per
/// ready worker).
type Signals = (f64, f64, f64, f64);

/// The saturation policy (see the module doc).
#[derive(Clone, Debug)]
pub struct SaturationPolicy {
    config: SaturationPolicyConfig,
    /// Per pool role, recent (time, recommendation), oldest first.
    history: Vec<(PoolRole, VecDeque<(f64, usize)>)>,
    /// Per pool role, recent scrapes' signals, oldest first.
    signals: Vec<(PoolRole, VecDeque<Signals>)>,
}

impl SaturationPolicy {
    /// A saturation policy; targets must be above 0.
    pub fn new(config: SaturationPolicyConfig) -> Result<SaturationPolicy, String> {
        if !(config.kv_target > 0.0 && config.kv_target <= 1.0) {
            return Err(format!(
                "saturation policy: KV target {} is not in (0, 1]",
                config.kv_target
            ));
        }
        if !(config.queue_target.is_finite() && config.queue_target > 0.0) {
            return Err(format!(
                "saturation policy: queue target {} must be above 0",
                config.queue_target
            ));
        }
        let finite = |x: f64| x.is_finite() && x >= 0.0;
        if !finite(config.tolerance) || !finite(config.up_window_s) || !finite(config.down_window_s)
        {
            return Err("saturation policy: tolerance and windows must be finite and >= 0".into());
        }
        if !(config.running_target.is_finite() && config.running_target > 0.0) {
            return Err(format!(
                "saturation policy: running target {} must be above 0",
                config.running_target
            ));
        }
        if !(config.smooth_window_s.is_finite() && config.smooth_window_s >= 0.0) {
            return Err("saturation policy: smoothing window must be finite and >= 0".into());
        }
        Ok(SaturationPolicy {
            config,
            history: Vec::new(),
            signals: Vec::new(),
        })
    }

    /// The raw recommendation for one pool at `time_s`.
    fn recommend(&mut self, time_s: f64, pool: &PoolObservation) -> usize {
        if pool.ready == 0 {
            return pool.current;
        }
        let ready = pool.ready as f64;
        let idx = match self.signals.iter().position(|(r, _)| *r == pool.role) {
            Some(i) => i,
            None => {
                self.signals.push((pool.role, VecDeque::new()));
                self.signals.len() - 1
            }
        };
        let signals = &mut self.signals[idx].1;
        signals.push_back((
            time_s,
            pool.kv_usage,
            pool.running as f64 / ready,
            pool.waiting as f64 / ready,
        ));
        while signals
            .front()
            .is_some_and(|&(t, ..)| t < time_s - self.config.smooth_window_s)
        {
            signals.pop_front();
        }
        let n = signals.len() as f64;
        let mean = |f: fn(&Signals) -> f64| signals.iter().map(f).sum::<f64>() / n;
        let (kv, running, waiting) = (mean(|s| s.1), mean(|s| s.2), mean(|s| s.3));
        let ratio = (kv / self.config.kv_target)
            .max(running / self.config.running_target)
            .max(waiting / self.config.queue_target);
        if (ratio - 1.0).abs() <= self.config.tolerance {
            return pool.current;
        }
        let busy = pool.running + pool.waiting > 0;
        let n = (ready * ratio).ceil() as usize;
        n.max(usize::from(busy))
    }

    /// The stabilised size of one pool.
    fn stabilise(&mut self, time_s: f64, pool: &PoolObservation) -> usize {
        let raw = self.recommend(time_s, pool);
        let idx = match self.history.iter().position(|(r, _)| *r == pool.role) {
            Some(i) => i,
            None => {
                self.history.push((pool.role, VecDeque::new()));
                self.history.len() - 1
            }
        };
        let keep = self.config.up_window_s.max(self.config.down_window_s);
        let history = &mut self.history[idx].1;
        history.push_back((time_s, raw));
        while history.front().is_some_and(|&(t, _)| t < time_s - keep) {
            history.pop_front();
        }
        let within = |w: f64| history.iter().filter(move |&&(t, _)| t >= time_s - w);
        let up = within(self.config.up_window_s)
            .map(|h| h.1)
            .min()
            .unwrap_or(raw);
        let down = within(self.config.down_window_s)
            .map(|h| h.1)
            .max()
            .unwrap_or(raw);
        if up > pool.current {
            up
        } else if down < pool.current && pool.loading == 0 {
            // As HPA's default scale-down policy limits the rate: one worker per decision.
            pool.current - 1
        } else {
            pool.current
        }
    }
}

impl Policy for SaturationPolicy {
    fn name(&self) -> &'static str {
        "saturation"
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        let mut sizes = Vec::with_capacity(obs.pools.len());
        for pool in &obs.pools {
            sizes.push((pool.role, self.stabilise(obs.time_s, pool)));
        }
        let size = |role| sizes.iter().find(|(r, _)| *r == role).map(|s| s.1);
        match (size(PoolRole::Prefill), size(PoolRole::Decode)) {
            (Some(prefill), Some(decode)) => Ok(Decision::Disagg { prefill, decode }),
            _ => Ok(Decision::Workers(size(PoolRole::Aggregated).unwrap_or(0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale::policy::tests::observation;

    /// The KV and queue signals alone, unsmoothed (the running signal far off).
    fn kv_queue() -> SaturationPolicyConfig {
        SaturationPolicyConfig {
            running_target: 100.0,
            smooth_window_s: 0.0,
            ..SaturationPolicyConfig::default()
        }
    }

    fn at(mut obs: Observation, t: f64) -> Observation {
        obs.time_s = t;
        obs
    }

    #[test]
    fn kv_and_queue_pressure_scale_up_at_once() {
        let mut p = SaturationPolicy::new(kv_queue()).unwrap();
        // 4 workers at 0.7 KV: on target, hold.
        assert_eq!(
            p.decide(&at(observation(4, 0.7, 0, 1.0), 0.0)),
            Ok(Decision::Workers(4))
        );
        // KV 0.91 -> ratio 1.3 -> ceil(5.2) = 6.
        assert_eq!(
            p.decide(&at(observation(4, 0.91, 0, 1.0), 30.0)),
            Ok(Decision::Workers(6))
        );
        // Two waiting per worker (target 1): ratio 2 -> 8.
        let mut q = SaturationPolicy::new(kv_queue()).unwrap();
        assert_eq!(
            q.decide(&at(observation(4, 0.1, 2, 1.0), 0.0)),
            Ok(Decision::Workers(8))
        );
    }

    #[test]
    fn scale_down_waits_out_the_stabilisation_window() {
        let mut p = SaturationPolicy::new(SaturationPolicyConfig {
            down_window_s: 90.0,
            ..kv_queue()
        })
        .unwrap();
        // Busy at t=0 (recommends 4), quiet after (KV 0.35 -> ratio 0.5 -> 2).
        assert_eq!(
            p.decide(&at(observation(4, 0.7, 0, 1.0), 0.0)),
            Ok(Decision::Workers(4))
        );
        for t in [30.0, 60.0, 90.0] {
            assert_eq!(
                p.decide(&at(observation(4, 0.35, 0, 1.0), t)),
                Ok(Decision::Workers(4)),
                "t={t}"
            );
        }
        // The busy recommendation left the 90 s window: one worker goes per decision.
        assert_eq!(
            p.decide(&at(observation(4, 0.35, 0, 1.0), 120.0)),
            Ok(Decision::Workers(3))
        );
        assert_eq!(
            p.decide(&at(observation(3, 0.35, 0, 1.0), 150.0)),
            Ok(Decision::Workers(2))
        );
    }

    #[test]
    fn loading_workers_block_a_scale_down_and_idle_pools_shrink_one_at_a_time() {
        let mut p = SaturationPolicy::new(SaturationPolicyConfig {
            down_window_s: 0.0,
            ..kv_queue()
        })
        .unwrap();
        let mut obs = observation(4, 0.0, 0, 0.0);
        obs.pools[0].running = 0;
        obs.pools[0].loading = 2;
        obs.pools[0].current = 6;
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(6)));
        obs.pools[0].loading = 0;
        obs.pools[0].current = 4;
        obs.time_s += 30.0;
        // Nothing running: down by one (the driver clamps to the minimum).
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(3)));
    }

    #[test]
    fn running_requests_per_worker_are_averaged_then_scale_up() {
        let mut p = SaturationPolicy::new(SaturationPolicyConfig::default()).unwrap();
        // 2 workers, 1 running each (target 1.5): ratio 0.67 -> ceil(1.33) = 2, held.
        let mut obs = at(observation(2, 0.01, 0, 1.0), 0.0);
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(2)));
        // A burst of 6 running on each: the 90 s mean over the two scrapes is 3.5 per worker,
        // ratio 2.33 -> ceil(4.67) = 5.
        obs.time_s = 30.0;
        obs.pools[0].running = 12;
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(5)));
        // Without smoothing the same burst reads 6 per worker: ratio 4 -> 8.
        let mut q = SaturationPolicy::new(SaturationPolicyConfig {
            smooth_window_s: 0.0,
            ..SaturationPolicyConfig::default()
        })
        .unwrap();
        assert_eq!(q.decide(&obs), Ok(Decision::Workers(8)));
    }

    #[test]
    fn bad_targets_are_refused() {
        let bad = SaturationPolicyConfig {
            kv_target: 0.0,
            ..SaturationPolicyConfig::default()
        };
        assert!(SaturationPolicy::new(bad)
            .unwrap_err()
            .contains("KV target"));
        let bad = SaturationPolicyConfig {
            running_target: 0.0,
            ..SaturationPolicyConfig::default()
        };
        assert!(SaturationPolicy::new(bad)
            .unwrap_err()
            .contains("running target"));
    }
}
