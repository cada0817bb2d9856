//! `load`: a load-based planner in the manner of Dynamo's SLA planner. It predicts the load of
//! the interval a new worker would serve (request rate × ISL prefill tokens per second, request
//! rate × OSL decode tokens per second) and divides it by what one worker sustains within the
//! SLO.
//!
//! Per pool, with `r` the predicted request rate:
//! - prefill workers: `ceil(r · ISL / (prefill_tokens_per_s · target_utilisation))`;
//! - decode workers: `ceil(r · OSL / (decode_tokens_per_s · target_utilisation))`;
//! - aggregated workers share their GPU between the two, so their fractions add:
//!   `ceil((r · ISL / prefill_tokens_per_s + r · OSL / decode_tokens_per_s) / target_utilisation)`.
//!
//! The prediction fits a least-squares line through the request rates of the last `window`
//! scrapes: its level at the latest scrape, raised by its rising slope carried `lookahead_s`
//! ahead (a new worker serves only once its model has loaded); a falling slope is not carried
//! (a worker given up cannot be back within the lookahead). ISL and OSL are the window's
//! request-weighted means. Requests queued at the scrape add their prompts to the prefill load,
//! to be cleared within one `lookahead_s`.
//!
//! A pool grows at once; it shrinks only to the largest size the last `down_window` decisions
//! asked for, and never while it has workers loading (cancelling them would throw away the
//! load delay already paid).

use std::collections::VecDeque;

use super::capacity::SloCapacity;
use super::policy::{Decision, Observation, Policy, PolicyError, PoolRole};

/// Settings of the load-based policy.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadPolicyConfig {
    /// Prompt tokens per second one worker prefills within the TTFT objective.
    pub prefill_tokens_per_s: f64,
    /// Output tokens per second one worker decodes within the TPOT objective.
    pub decode_tokens_per_s: f64,
    /// The share of that capacity to plan for (headroom for bursts), in (0, 1].
    pub target_utilisation: f64,
    /// Scrapes the prediction averages over (at least 1).
    pub window: usize,
    /// How far ahead the trend is carried, seconds (the model-load delay is a good choice).
    pub lookahead_s: f64,
    /// Scrapes a scale-down waits out: a pool shrinks to the largest size any of the last
    /// `down_window` decisions asked for (1 = at once). It never shrinks while it has workers
    /// loading.
    pub down_window: usize,
}

/// The timing a load policy plans around, in seconds: its tick, the age of the metrics a
/// decision sees, and the model-load delay of a new worker (mean and jitter).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadTiming {
    /// Time between decisions.
    pub tick_s: f64,
    /// How old the scrape a decision sees is.
    pub scrape_delay_s: f64,
    /// Mean model-load delay.
    pub model_load_s: f64,
    /// The most a delay differs from the mean.
    pub model_load_jitter_s: f64,
}

impl LoadTiming {
    /// How far ahead the policy must look: from the middle of the interval its latest rate was
    /// measured over (half a tick before the scrape, which is `scrape_delay_s` old) to when a
    /// worker asked for at the next decision, a tick later, has loaded (the longest delay).
    pub fn lead_s(&self) -> f64 {
        self.tick_s / 2.0
            + self.scrape_delay_s
            + self.tick_s
            + self.model_load_s
            + self.model_load_jitter_s
    }
}

impl LoadPolicyConfig {
    /// The settings `mockserve replay --autoscale load` uses: the capacity and utilisation of
    /// `capacity`; the lead of `timing` as lookahead; the trend fitted over as long a past as
    /// it is carried into the future (`ceil(lead / tick)` scrapes, at least 2); a scale-down
    /// window of one model-load delay (`ceil(model_load / tick)` decisions: a worker removed
    /// now could not be back sooner).
    pub fn planned(capacity: &SloCapacity, timing: &LoadTiming) -> LoadPolicyConfig {
        let tick_s = if timing.tick_s > 0.0 {
            timing.tick_s
        } else {
            1.0
        };
        let lead_s = timing.lead_s();
        let scrapes = |s: f64| (s / tick_s).ceil().clamp(0.0, 1e6) as usize;
        LoadPolicyConfig {
            prefill_tokens_per_s: capacity.prefill_tokens_per_s,
            decode_tokens_per_s: capacity.decode_tokens_per_s,
            target_utilisation: capacity.utilisation,
            window: scrapes(lead_s).max(2),
            lookahead_s: lead_s,
            down_window: scrapes(timing.model_load_s).max(1),
        }
    }
}

/// The load-based policy (see the module doc).
#[derive(Clone, Debug)]
pub struct LoadPolicy {
    config: LoadPolicyConfig,
    /// Recent scrapes: (request rate, mean ISL, mean OSL), oldest first.
    history: VecDeque<(f64, f64, f64)>,
    /// Length of the latest scrape interval, seconds.
    interval_s: f64,
    /// Recent raw decisions, oldest first (for the scale-down window).
    recent: VecDeque<Decision>,
}

impl LoadPolicy {
    /// A load policy; capacities must be finite and above 0.
    pub fn new(config: LoadPolicyConfig) -> Result<LoadPolicy, String> {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if !positive(config.prefill_tokens_per_s) || !positive(config.decode_tokens_per_s) {
            return Err(format!(
                "load policy: per-worker capacities must be above 0 (prefill {} tokens/s, decode {} tokens/s)",
                config.prefill_tokens_per_s, config.decode_tokens_per_s
            ));
        }
        if !(config.target_utilisation > 0.0 && config.target_utilisation <= 1.0) {
            return Err(format!(
                "load policy: target utilisation {} is not in (0, 1]",
                config.target_utilisation
            ));
        }
        if !(config.lookahead_s.is_finite() && config.lookahead_s >= 0.0) {
            return Err(format!(
                "load policy: lookahead {} s is not a finite non-negative number",
                config.lookahead_s
            ));
        }
        Ok(LoadPolicy {
            config: LoadPolicyConfig {
                window: config.window.max(1),
                ..config
            },
            history: VecDeque::new(),
            interval_s: 0.0,
            recent: VecDeque::new(),
        })
    }

    /// The predicted (rate, ISL, OSL) for the next interval.
    fn predict(&self) -> (f64, f64, f64) {
        let n = self.history.len().max(1) as f64;
        let mean = |f: fn(&(f64, f64, f64)) -> f64| self.history.iter().map(f).sum::<f64>() / n;
        let rate = mean(|h| h.0);
        // Token lengths weighted by requests, so an empty interval does not drag them to 0.
        let requests: f64 = self.history.iter().map(|h| h.0).sum();
        let weighted = |f: fn(&(f64, f64, f64)) -> f64| {
            if requests > 0.0 {
                self.history.iter().map(|h| h.0 * f(h)).sum::<f64>() / requests
            } else {
                0.0
            }
        };
        let (isl, osl) = (weighted(|h| h.1), weighted(|h| h.2));
        // Least-squares line through the window's rates (scrape index against rate): its value
        // at the latest scrape is the level, its slope the trend per scrape.
        let len = self.history.len();
        let (level, slope) = if len >= 2 {
            let xm = (len - 1) as f64 / 2.0;
            let (mut sxy, mut sxx) = (0.0, 0.0);
            for (i, h) in self.history.iter().enumerate() {
                let dx = i as f64 - xm;
                sxy += dx * (h.0 - rate);
                sxx += dx * dx;
            }
            let slope = sxy / sxx;
            (rate + slope * xm, slope)
        } else {
            (rate, 0.0)
        };
        // Rising: the level carried to the end of the lead. Falling: the level now (a worker
        // given up cannot be back within the lead, so a fall is not anticipated).
        (
            level.max(0.0) + slope.max(0.0) * self.lookahead_scrapes(),
            isl,
            osl,
        )
    }

    /// The lookahead in scrapes (of the latest interval's length).
    fn lookahead_scrapes(&self) -> f64 {
        if self.interval_s > 0.0 {
            self.config.lookahead_s / self.interval_s
        } else {
            0.0
        }
    }

    /// Workers a pool needs for `load_fraction` of one worker's capacity.
    fn workers_for(&self, load_fraction: f64) -> usize {
        let n = (load_fraction / self.config.target_utilisation).ceil();
        if n.is_finite() && n > 0.0 {
            n.min(1e9) as usize
        } else {
            0
        }
    }
}

impl Policy for LoadPolicy {
    fn name(&self) -> &'static str {
        "load"
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        self.interval_s = obs.interval_s;
        self.history
            .push_back((obs.request_rate, obs.mean_isl, obs.mean_osl));
        while self.history.len() > self.config.window {
            self.history.pop_front();
        }
        let (rate, isl, osl) = self.predict();
        let horizon = self.config.lookahead_s.max(obs.interval_s).max(1.0);
        let backlog_isl = if obs.queue > 0 {
            obs.queue as f64 * isl / horizon
        } else {
            0.0
        };
        let prefill = (rate * isl + backlog_isl) / self.config.prefill_tokens_per_s;
        let decode = rate * osl / self.config.decode_tokens_per_s;
        let raw = if obs.pool(PoolRole::Prefill).is_some() {
            Decision::Disagg {
                prefill: self.workers_for(prefill),
                decode: self.workers_for(decode),
            }
        } else {
            Decision::Workers(self.workers_for(prefill + decode))
        };
        self.recent.push_back(raw);
        while self.recent.len() > self.config.down_window.max(1) {
            self.recent.pop_front();
        }
        // Per pool: grow at once; shrink only to the largest recent ask, and not while loading.
        let size = |role: PoolRole| -> usize {
            let want = raw.count(role).unwrap_or(0);
            let Some(pool) = obs.pool(role) else {
                return want;
            };
            if want >= pool.current {
                return want;
            }
            if pool.loading > 0 {
                return pool.current;
            }
            let recent = self.recent.iter().filter_map(|d| d.count(role)).max();
            recent.unwrap_or(want).min(pool.current)
        };
        Ok(match raw {
            Decision::Disagg { .. } => Decision::Disagg {
                prefill: size(PoolRole::Prefill),
                decode: size(PoolRole::Decode),
            },
            Decision::Workers(_) => Decision::Workers(size(PoolRole::Aggregated)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscale::policy::tests::observation;
    use crate::autoscale::policy::{PoolObservation, PoolRole};

    fn config() -> LoadPolicyConfig {
        LoadPolicyConfig {
            prefill_tokens_per_s: 10_000.0,
            decode_tokens_per_s: 1_000.0,
            target_utilisation: 1.0,
            window: 1,
            lookahead_s: 0.0,
            down_window: 1,
        }
    }

    #[test]
    fn workers_follow_load_over_capacity() {
        let mut p = LoadPolicy::new(config()).unwrap();
        // 4 req/s x 1000 ISL = 4000 tok/s = 0.4 of a worker; x 100 OSL = 400 tok/s = 0.4.
        let obs = observation(3, 0.1, 0, 4.0);
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(1)));
        // 12 req/s: 1.2 + 1.2 = 2.4 -> 3.
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 12.0)),
            Ok(Decision::Workers(3))
        );
        // Planning for 60% utilisation: 2.4 / 0.6 = 4.
        let mut p = LoadPolicy::new(LoadPolicyConfig {
            target_utilisation: 0.6,
            ..config()
        })
        .unwrap();
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 12.0)),
            Ok(Decision::Workers(4))
        );
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 0.0)),
            Ok(Decision::Workers(0))
        );
    }

    #[test]
    fn disaggregated_pools_are_sized_apart() {
        let mut p = LoadPolicy::new(config()).unwrap();
        let mut obs = observation(2, 0.1, 0, 25.0);
        let pool = |role| PoolObservation {
            role,
            ..obs.pools[0].clone()
        };
        obs.pools = vec![pool(PoolRole::Prefill), pool(PoolRole::Decode)];
        // prefill 25 x 1000 / 10000 = 2.5 -> 3; decode 25 x 100 / 1000 = 2.5 -> 3.
        obs.mean_osl = 300.0; // decode 7.5 -> 8
        assert_eq!(
            p.decide(&obs),
            Ok(Decision::Disagg {
                prefill: 3,
                decode: 8
            })
        );
    }

    #[test]
    fn a_rising_rate_is_carried_ahead_and_a_queue_adds_load() {
        let mut p = LoadPolicy::new(LoadPolicyConfig {
            window: 4,
            lookahead_s: 60.0,
            ..config()
        })
        .unwrap();
        for rate in [2.0, 4.0, 6.0] {
            p.decide(&observation(1, 0.1, 0, rate)).unwrap();
        }
        // Window 2,4,6,8: the fitted line rises 2 per scrape and stands at 8 at the latest;
        // carried 60 s / 30 s = 2 scrapes: 8 + 4 = 12 req/s -> 1.2 + 1.2 = 2.4 -> 3.
        assert_eq!(
            p.decide(&observation(1, 0.1, 0, 8.0)),
            Ok(Decision::Workers(3))
        );
        // Falling 14, 12, 10, 8: the level is 8 (below the window's mean of 11), not carried
        // further down: 8 req/s -> 0.8 + 0.8 = 1.6 -> 2.
        let mut f = LoadPolicy::new(LoadPolicyConfig {
            window: 4,
            lookahead_s: 60.0,
            ..config()
        })
        .unwrap();
        for rate in [14.0, 12.0, 10.0] {
            f.decide(&observation(3, 0.1, 0, rate)).unwrap();
        }
        assert_eq!(
            f.decide(&observation(3, 0.1, 0, 8.0)),
            Ok(Decision::Workers(2))
        );
        // 9 req/s alone: 0.9 + 0.9 = 1.8 -> 2 workers. A queue of 90 requests x 1000 tokens
        // to clear within one 30 s interval adds 3000 tok/s = 0.3 of a worker: 2.1 -> 3.
        let mut q = LoadPolicy::new(config()).unwrap();
        assert_eq!(
            q.decide(&observation(1, 0.1, 0, 9.0)),
            Ok(Decision::Workers(2))
        );
        assert_eq!(
            q.decide(&observation(1, 0.1, 90, 9.0)),
            Ok(Decision::Workers(3))
        );
    }

    #[test]
    fn a_scale_down_waits_out_its_window_and_never_cancels_loading_workers() {
        let mut p = LoadPolicy::new(LoadPolicyConfig {
            down_window: 3,
            ..config()
        })
        .unwrap();
        // 12 req/s: 2.4 -> 3 workers; then 4 req/s: 0.8 -> 1, held until the 3 leaves.
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 12.0)),
            Ok(Decision::Workers(3))
        );
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 4.0)),
            Ok(Decision::Workers(3))
        );
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 4.0)),
            Ok(Decision::Workers(3))
        );
        assert_eq!(
            p.decide(&observation(3, 0.1, 0, 4.0)),
            Ok(Decision::Workers(1))
        );
        // A pool with a worker loading keeps it.
        let mut obs = observation(3, 0.1, 0, 4.0);
        obs.pools[0].loading = 1;
        obs.pools[0].current = 4;
        assert_eq!(p.decide(&obs), Ok(Decision::Workers(4)));
    }

    #[test]
    fn the_planned_settings_follow_the_lifecycle_timing() {
        let capacity = SloCapacity {
            prefill_tokens_per_s: 44_000.0,
            decode_tokens_per_s: 2_000.0,
            utilisation: 0.29,
            requests_per_s: 0.69,
            running: 0.91,
        };
        let timing = LoadTiming {
            tick_s: 30.0,
            scrape_delay_s: 15.0,
            model_load_s: 240.0,
            model_load_jitter_s: 30.0,
        };
        // 15 + 15 + 30 + 240 + 30 = 330 s: 11 scrapes; 240 s: 8 decisions.
        assert_eq!(timing.lead_s(), 330.0);
        assert_eq!(
            LoadPolicyConfig::planned(&capacity, &timing),
            LoadPolicyConfig {
                prefill_tokens_per_s: 44_000.0,
                decode_tokens_per_s: 2_000.0,
                target_utilisation: 0.29,
                window: 11,
                lookahead_s: 330.0,
                down_window: 8,
            }
        );
    }

    #[test]
    fn bad_capacities_are_refused() {
        let bad = LoadPolicyConfig {
            prefill_tokens_per_s: 0.0,
            ..config()
        };
        assert!(LoadPolicy::new(bad).unwrap_err().contains("above 0"));
        let bad = LoadPolicyConfig {
            target_utilisation: 1.5,
            ..config()
        };
        assert!(LoadPolicy::new(bad).unwrap_err().contains("utilisation"));
    }
}
