//! Lifecycle parameters of an elastic fleet: how long a new worker takes to load its model, and
//! how few and how many workers each pool may have.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::policy::PoolRole;
use crate::time::SimDuration;

/// Why lifecycle settings were refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LifecycleError {
    /// `--min-workers` above `--max-workers`.
    #[error("--min-workers {min} is above --max-workers {max} for the {role} pool")]
    MinAboveMax {
        /// The pool.
        role: PoolRole,
        /// Its minimum.
        min: usize,
        /// Its maximum.
        max: usize,
    },
    /// A pool must keep at least one worker serving.
    #[error("--min-workers must be at least 1 for the {role} pool (a pool of 0 cannot serve)")]
    ZeroMin {
        /// The pool.
        role: PoolRole,
    },
    /// The initial size is outside min..=max.
    #[error("the {role} pool starts with {initial} workers, outside {min}..={max}")]
    Initial {
        /// The pool.
        role: PoolRole,
        /// Its initial size.
        initial: usize,
        /// Its minimum.
        min: usize,
        /// Its maximum.
        max: usize,
    },
    /// The jitter would draw negative delays.
    #[error(
        "--model-load-jitter {jitter} is above --model-load {load}: a delay would be negative"
    )]
    Jitter {
        /// The mean delay.
        load: SimDuration,
        /// The jitter.
        jitter: SimDuration,
    },
    /// A zero tick would never let time pass.
    #[error("--autoscale-tick must be above 0")]
    ZeroTick,
    /// The scrape must come before the tick it feeds (and not before the run).
    #[error("--scrape-delay {delay} must be shorter than --autoscale-tick {tick}")]
    ScrapeDelay {
        /// The scrape delay.
        delay: SimDuration,
        /// The tick.
        tick: SimDuration,
    },
}

/// The size limits of one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolBounds {
    /// The pool.
    pub role: PoolRole,
    /// Fewest workers (at least 1).
    pub min: usize,
    /// Most workers.
    pub max: usize,
    /// Workers ready at time 0 (already loaded).
    pub initial: usize,
}

/// How workers come and go.
#[derive(Clone, Debug, PartialEq)]
pub struct LifecycleConfig {
    /// Mean model-load delay of a new worker (default 240 s).
    pub model_load: SimDuration,
    /// Each delay is drawn uniformly from `model_load ± model_load_jitter` (default 30 s).
    pub model_load_jitter: SimDuration,
    /// Seed of the delay draws.
    pub seed: u64,
    /// Per pool: aggregated alone, or prefill then decode.
    pub pools: Vec<PoolBounds>,
}

/// Default model-load delay: 240 s.
pub const DEFAULT_MODEL_LOAD: SimDuration = SimDuration::from_micros(240_000_000);
/// Default jitter: 30 s.
pub const DEFAULT_MODEL_LOAD_JITTER: SimDuration = SimDuration::from_micros(30_000_000);

impl LifecycleConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), LifecycleError> {
        if self.model_load_jitter > self.model_load {
            return Err(LifecycleError::Jitter {
                load: self.model_load,
                jitter: self.model_load_jitter,
            });
        }
        for p in &self.pools {
            if p.min > p.max {
                return Err(LifecycleError::MinAboveMax {
                    role: p.role,
                    min: p.min,
                    max: p.max,
                });
            }
            if p.min == 0 {
                return Err(LifecycleError::ZeroMin { role: p.role });
            }
            if p.initial < p.min || p.initial > p.max {
                return Err(LifecycleError::Initial {
                    role: p.role,
                    initial: p.initial,
                    min: p.min,
                    max: p.max,
                });
            }
        }
        Ok(())
    }

    /// The bounds of `role`'s pool.
    pub fn pool(&self, role: PoolRole) -> Option<&PoolBounds> {
        self.pools.iter().find(|p| p.role == role)
    }

    /// One model-load delay, uniform in `model_load ± model_load_jitter` (whole microseconds).
    pub fn draw_load_delay(&self, rng: &mut ChaCha8Rng) -> SimDuration {
        let lo = self
            .model_load
            .as_nanos()
            .saturating_sub(self.model_load_jitter.as_nanos());
        let hi = self
            .model_load
            .as_nanos()
            .saturating_add(self.model_load_jitter.as_nanos());
        SimDuration::from_nanos(rng.gen_range(lo..=hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn config(min: usize, max: usize) -> LifecycleConfig {
        LifecycleConfig {
            model_load: DEFAULT_MODEL_LOAD,
            model_load_jitter: DEFAULT_MODEL_LOAD_JITTER,
            seed: 7,
            pools: vec![PoolBounds {
                role: PoolRole::Aggregated,
                min,
                max,
                initial: min,
            }],
        }
    }

    #[test]
    fn bad_bounds_and_delays_are_refused_by_name() {
        assert_eq!(config(1, 4).validate(), Ok(()));
        assert_eq!(
            config(5, 4).validate().unwrap_err().to_string(),
            "--min-workers 5 is above --max-workers 4 for the workers pool"
        );
        assert!(config(0, 4)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
        let mut c = config(1, 4);
        c.model_load_jitter = SimDuration::from_micros(300_000_000);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("would be negative"));
        let mut c = config(1, 4);
        c.pools[0].initial = 9;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("outside 1..=4"));
    }

    #[test]
    fn delays_are_seeded_and_within_the_jitter() {
        let c = config(1, 4);
        let draw = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..200)
                .map(|_| c.draw_load_delay(&mut rng))
                .collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1));
        assert_ne!(a, draw(2));
        assert!(a
            .iter()
            .all(|d| (210_000_000_000..=270_000_000_000).contains(&d.as_nanos())));
        let mean = a.iter().map(|d| d.as_micros() as f64).sum::<f64>() / a.len() as f64;
        assert!((mean - 240e6).abs() < 6e6, "mean {mean}");
    }
}
