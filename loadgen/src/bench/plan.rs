//! A validated `loadgen bench` run ([`BenchPlan`]): the load (closed or open loop), when it
//! stops, the request lengths, the warmup, and the open loop's send offsets.

use std::str::FromStr;
use std::time::Duration;

use crate::bench::slo::Slo;
use crate::run::target::Api;
use servesim::trace::synthetic::{arrival_offsets, Arrival};

/// Request rate of the open loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Requests per second (finite, positive).
    PerSecond(f64),
    /// Every request at once (`--request-rate inf`).
    Unlimited,
}

/// How requests are offered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// `users` sessions, each sending its next request as soon as the previous one finished.
    Closed {
        /// Requests in flight.
        users: usize,
    },
    /// Requests at precomputed send offsets, whatever the responses do.
    Open {
        /// The mean rate.
        rate: Rate,
        /// Inter-arrival distribution.
        arrival: Arrival,
        /// Gamma shape (1 unless `arrival` is gamma).
        burstiness: f64,
        /// Requests in flight at most (later ones wait; their latency still counts from their
        /// scheduled time).
        max_in_flight: Option<usize>,
    },
}

/// When sending stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many requests.
    Requests(usize),
    /// No request due after this time.
    Duration(Duration),
    /// Whichever comes first.
    RequestsOrDuration {
        /// Most requests.
        requests: usize,
        /// Latest due time.
        duration: Duration,
    },
}

impl Stop {
    /// The request count limit, if any.
    pub(crate) fn max_requests(&self) -> Option<usize> {
        match *self {
            Stop::Requests(n) | Stop::RequestsOrDuration { requests: n, .. } => Some(n),
            Stop::Duration(_) => None,
        }
    }

    /// The time limit, if any.
    pub fn duration(&self) -> Option<Duration> {
        match *self {
            Stop::Duration(d) | Stop::RequestsOrDuration { duration: d, .. } => Some(d),
            Stop::Requests(_) => None,
        }
    }
}

/// Prompt and output lengths (the engine generator's: `servesim::trace::synthetic`).
pub use servesim::trace::synthetic::Lengths;

/// A validated `loadgen bench` run, built from the flags before anything connects (every
/// combination is checked here; the run itself never sees a contradictory flag).
#[derive(Clone, Debug, PartialEq)]
pub struct BenchPlan {
    /// Closed or open loop.
    pub load: Load,
    /// When sending stops.
    pub stop: Stop,
    /// Requests excluded from the statistics.
    pub warmup: Option<Warmup>,
    /// Lengths of the requests.
    pub lengths: Lengths,
    /// Goodput objectives.
    pub slo: Option<Slo>,
    /// Seeds arrivals, lengths and text (the engine's `--seed`).
    pub seed: u64,
    /// The failure threshold.
    pub max_failure_rate: f64,
    /// The route requests go to.
    pub api: Api,
    /// The part of the run this process sends (`--shard`; None: all of it).
    pub shard: Option<crate::run::shard::Shard>,
    /// The prompts of `--dataset` (None: synthetic prompts of [`Lengths`]).
    pub dataset: Option<std::sync::Arc<crate::dataset::Dataset>>,
}

/// Requests when neither `--num-requests` nor `--duration` is given.
pub(crate) const DEFAULT_NUM_REQUESTS: usize = 100;

impl BenchPlan {
    /// One line for the console and the report's `mode` key.
    pub(crate) fn describe(&self) -> String {
        match self.load {
            Load::Closed { users } => format!("closed loop: concurrency {users}"),
            Load::Open {
                rate,
                arrival,
                burstiness,
                max_in_flight,
            } => {
                let rate = match rate {
                    Rate::PerSecond(r) => format!("{r} req/s"),
                    Rate::Unlimited => "inf req/s".into(),
                };
                let cap = match max_in_flight {
                    Some(n) => format!("at most {n} in flight"),
                    None => "no in-flight cap".into(),
                };
                format!("open loop: {rate} ({arrival:?}, burstiness {burstiness}), {cap}")
            }
        }
    }

    /// Open-loop send offsets (seconds) for this plan; empty for a closed loop.
    pub(crate) fn arrival_offsets(&self) -> Vec<f64> {
        let Load::Open {
            rate,
            arrival,
            burstiness,
            ..
        } = self.load
        else {
            return Vec::new();
        };
        let rate = match rate {
            Rate::PerSecond(r) => r,
            Rate::Unlimited => f64::INFINITY,
        };
        let limit_s = self
            .stop
            .duration()
            .map_or(f64::INFINITY, |d| d.as_secs_f64());
        arrival_offsets(
            rate,
            arrival,
            burstiness,
            self.stop.max_requests(),
            limit_s,
            self.seed,
        )
    }
}

/// What `--warmup` excludes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Warmup {
    /// The first N requests sent.
    Requests(usize),
    /// Requests due in the first seconds.
    Seconds(f64),
}

impl FromStr for Warmup {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected N (requests) or Ns (seconds), got {s:?}");
        match s.strip_suffix('s') {
            Some(secs) => secs
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Warmup::Seconds)
                .ok_or_else(bad),
            None => s.parse().map(Warmup::Requests).map_err(|_| bad()),
        }
    }
}
