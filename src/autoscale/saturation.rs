//! `saturation`: KV-usage, queue and running-request thresholds with stabilisation windows, in
//! the manner of Kubernetes' HPA and llm-d's Workload Variant Autoscaler.
//!
//! Per pool, over its ready workers: `ratio = max(kv_usage / kv_target, running_per_worker /
//! running_target, waiting_per_worker / queue_target)`. KV usage stays low when prompts fit the
//! cache easily and a queue forms only once TTFT is lost; the requests running per worker rise
//! with the load before either, and their target comes from the SLO (the requests in flight on
//! a worker that takes the rate it serves within the SLO). Within `tolerance` of 1 the
//! recommendation is the current size, else `ceil(ready · ratio)` (at least 1 while anything is
//! running or waiting).
//!
//! Scale up fast, down slowly: a scale-up follows the latest scrape (the smallest
//! recommendation of the last `up_window_s`, HPA's 0 s by default); a scale-down follows the
//! signals averaged over the last `smooth_window_s` (point-sampled gauges are noisy), and waits
//! until the largest such recommendation of the last `down_window_s` is below the current
//! size, then removes one worker per decision (as WVA does). While workers of the pool are
//! still loading the pool is not shrunk (their capacity is not in the metrics yet).

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
    /// Target requests running per ready worker (a worker serving more at once than this is
    /// past the load it holds within the SLO); above 0. None: no such signal. `mockserve
    /// replay` derives it from the SLO ([`crate::autoscale::SloCapacity::running`]).
    pub running_target: Option<f64>,
    /// Seconds of scrapes the signals are averaged over before they are compared with their
    /// targets (as `avg_over_time` smooths point-sampled gauges); 0 = the latest scrape only.
    pub smooth_window_s: f64,
}

impl Default for SaturationPolicyConfig {
    fn default() -> Self {
        SaturationPolicyConfig {
            // WVA's saturation defaults: a KV threshold of 0.8 with a spare trigger of 0.1, a
            // queue threshold of 5 with a spare trigger of 3.
            kv_target: 0.7,
            queue_target: 2.0,
            // HPA's defaults: a 10% tolerance, scale-up at once, a 300 s scale-down window.
            tolerance: 0.1,
            up_window_s: 0.0,
            down_window_s: 300.0,
            running_target: None,
            // The gauges averaged over 2 minutes, the range of prometheus-adapter's usual rules.
            smooth_window_s: 120.0,
        }
    }
}

/// One scrape's signals of a pool: (time, KV usage, running per ready worker, waiting per
/// ready worker).
type Signals = (f64, f64, f64, f64);

/// One decision's raw recommendations: (time, from the latest scrape, from the averaged
/// signals).
type Recommendation = (f64, usize, usize);

/// The saturation policy (see the module doc).
#[derive(Clone, Debug)]
pub struct SaturationPolicy {
    config: SaturationPolicyConfig,
    /// Per pool role, recent (time, recommendation from the latest scrape, recommendation from
    /// the averaged signals), oldest first.
    history: Vec<(PoolRole, VecDeque<Recommendation>)>,
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
        if let Some(target) = config.running_target {
            if !(target.is_finite() && target > 0.0) {
                return Err(format!(
                    "saturation policy: running target {target} must be above 0"
                ));
            }
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

    /// The raw recommendations for one pool at `time_s`: (from the latest scrape, from the
    /// signals averaged over `smooth_window_s`).
    fn recommend(&mut self, time_s: f64, pool: &PoolObservation) -> (usize, usize) {
        if pool.ready == 0 {
            return (pool.current, pool.current);
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
        let latest = (
            time_s,
            pool.kv_usage,
            pool.running as f64 / ready,
            pool.waiting as f64 / ready,
        );
        signals.push_back(latest);
        while signals
            .front()
            .is_some_and(|&(t, ..)| t < time_s - self.config.smooth_window_s)
        {
            signals.pop_front();
        }
        let n = signals.len() as f64;
        let mean = |f: fn(&Signals) -> f64| signals.iter().map(f).sum::<f64>() / n;
        let averaged = (time_s, mean(|s| s.1), mean(|s| s.2), mean(|s| s.3));
        let config = &self.config;
        let size = |&(_, kv, running, waiting): &Signals| {
            let ratio = (kv / config.kv_target)
                .max(config.running_target.map_or(0.0, |t| running / t))
                .max(waiting / config.queue_target);
            if (ratio - 1.0).abs() <= config.tolerance {
                return pool.current;
            }
            let busy = pool.running + pool.waiting > 0;
            ((ready * ratio).ceil() as usize).max(usize::from(busy))
        };
        (size(&latest), size(&averaged))
    }

    /// The stabilised size of one pool.
    fn stabilise(&mut self, time_s: f64, pool: &PoolObservation) -> usize {
        let (raw_up, raw_down) = self.recommend(time_s, pool);
        let idx = match self.history.iter().position(|(r, _)| *r == pool.role) {
            Some(i) => i,
            None => {
                self.history.push((pool.role, VecDeque::new()));
                self.history.len() - 1
            }
        };
        let keep = self.config.up_window_s.max(self.config.down_window_s);
        let history = &mut self.history[idx].1;
        history.push_back((time_s, raw_up, raw_down));
        while history.front().is_some_and(|&(t, ..)| t < time_s - keep) {
            history.pop_front();
        }
        let within = |w: f64| history.iter().filter(move |&&(t, ..)| t >= time_s - w);
        let up = within(self.config.up_window_s)
            .map(|h| h.1)
            .min()
            .unwrap_or(raw_up);
        let down = within(self.config.down_window_s)
            .map(|h| h.2)
            .max()
            .unwrap_or(raw_down);
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

    /// The KV and queue signals alone (queue target 1), unsmoothed.
    fn kv_queue() -> SaturationPolicyConfig {
        SaturationPolicyConfig {
            queue_target: 1.0,
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
    fn a_burst_scales_up_at_once_and_the_averaged_load_scales_down() {
        let mut p = SaturationPolicy::new(SaturationPolicyConfig {
            running_target: Some(1.5),
            down_window_s: 60.0,
            ..SaturationPolicyConfig::default()
        })
        .unwrap();
        // 2 workers, 1 running each (target 1.5): ratio 0.67 -> ceil(1.33) = 2, held.
        let mut obs = at(observation(2, 0.01, 0, 1.0), 0.0);
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(2)));
        // A burst of 6 running on each, read at once: ratio 4 -> 8.
        obs.time_s = 30.0;
        obs.pools[0].running = 12;
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(8)));
        // 8 workers, quiet again (1 running in all): the 120 s averages still hold the burst
        // (per worker: 1, 6, 0.125 -> mean 2.375, ratio 1.58 -> 13 from the averages), so the
        // fleet holds, though the latest scrape alone would ask for 1.
        let mut quiet = at(observation(8, 0.01, 0, 1.0), 60.0);
        quiet.pools[0].running = 1;
        assert_eq!(p.decide(&quiet), Ok(Decision::Workers(8)));
        // Once the burst has left the 120 s average and the 60 s window, one worker goes per
        // decision.
        for t in [90.0, 120.0, 150.0, 180.0] {
            quiet.time_s = t;
            assert_eq!(p.decide(&quiet), Ok(Decision::Workers(8)), "t={t}");
        }
        quiet.time_s = 210.0;
        assert_eq!(p.decide(&quiet), Ok(Decision::Workers(7)));
    }

    #[test]
    fn without_a_running_target_the_running_requests_do_not_count() {
        let mut p = SaturationPolicy::new(SaturationPolicyConfig::default()).unwrap();
        let mut obs = at(observation(2, 0.01, 0, 1.0), 0.0);
        obs.pools[0].running = 40;
        // KV usage 0.01 alone: ratio 0.014, down by one.
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(1)));
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
            running_target: Some(0.0),
            ..SaturationPolicyConfig::default()
        };
        assert!(SaturationPolicy::new(bad)
            .unwrap_err()
            .contains("running target"));
    }
}
