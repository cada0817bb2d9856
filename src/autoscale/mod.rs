//! Autoscaling: rate profiles that make a trace need scaling, the policies that scale a fleet,
//! and the lifecycle parameters of its workers.
//!
//! - [`RateProfile`]: `--rate-profile SPEC`, a multiplier on a trace's arrival rate over time
//!   (open loop), applied by mapping every arrival time ([`RateProfile::map_time`]).
//! - [`Observation`] → [`Policy::decide`] → [`Decision`]: at each tick the driver shows the
//!   policy the fleet as scraped and gets the desired pool sizes back. [`LoadPolicy`] (predicted
//!   load over per-worker capacity), [`SaturationPolicy`] (KV and queue thresholds with
//!   stabilisation windows) and [`ExternalPolicy`] (a process speaking JSON lines) implement it.
//!   A [`PolicyError`] means "hold the current count" with a warning, never a stopped run.
//! - [`worker_capacity`]: what one worker sustains within a TPOT bound, from its latency
//!   model (the `load` policy's capacity, offline and live).
//! - [`LifecycleConfig`]: model-load delays (240 ± 30 s by default, seeded) and per-pool
//!   minimum and maximum sizes.
//!
//! ```
//! use servesim::autoscale::{RateProfile, SaturationPolicy, SaturationPolicyConfig};
//! use servesim::time::SimTime;
//!
//! let profile: RateProfile = "steps:0s=1,120s=3".parse().unwrap();
//! // 150 s of trace: 120 s at rate 1, then 30 s at three times the rate.
//! assert_eq!(
//!     profile.map_time(SimTime::from_micros(150_000_000)),
//!     SimTime::from_micros(130_000_000)
//! );
//! let _policy = SaturationPolicy::new(SaturationPolicyConfig::default()).unwrap();
//! ```

mod capacity;
mod external;
mod lifecycle;
mod load;
mod policy;
mod profile;
mod saturation;

pub use capacity::{
    slo_capacity, slo_utilisation, worker_capacity, SloCapacity, DEFAULT_TPOT_MS,
    EXTERNAL_SIZES_ITSELF, PLANNED_MISS,
};
pub use external::ExternalPolicy;
pub use lifecycle::{
    LifecycleConfig, LifecycleError, PoolBounds, DEFAULT_MODEL_LOAD, DEFAULT_MODEL_LOAD_JITTER,
};
pub use load::{LoadPolicy, LoadPolicyConfig, LoadTiming};
pub use policy::{
    Decision, Observation, Policy, PolicyError, PolicySpec, PoolObservation, PoolRole,
    WorkerObservation, WorkerState,
};
pub use profile::{parse_duration, RateProfile, RateProfileError};
pub use saturation::{SaturationPolicy, SaturationPolicyConfig};
