//! The load points of a sweep ([`LoadPoint`]) and what each measured ([`Point`]).

use serde::Serialize;
use serde_json::Value;

use crate::bench::{self, BenchPlan, Load, Rate};

/// One load point.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadPoint {
    /// Closed loop with this many requests in flight.
    Concurrency(usize),
    /// Open loop at this many requests per second.
    RequestRate(f64),
    /// The sweep's trace replayed with its arrivals sped up by this factor.
    ArrivalSpeedup(f64),
}

impl LoadPoint {
    /// The load as a number (req/s or concurrency).
    pub fn value(self) -> f64 {
        match self {
            LoadPoint::Concurrency(n) => n as f64,
            LoadPoint::RequestRate(r) | LoadPoint::ArrivalSpeedup(r) => r,
        }
    }

    /// `c=8` or `8 req/s`.
    pub fn label(self) -> String {
        match self {
            LoadPoint::Concurrency(n) => format!("c={n}"),
            LoadPoint::RequestRate(r) => format!("{} req/s", trim(r)),
            LoadPoint::ArrivalSpeedup(x) => format!("replay x{}", trim(x)),
        }
    }

    /// The bench plan of this point: `base` with this load and seed.
    pub fn plan(self, base: &BenchPlan, seed: u64) -> BenchPlan {
        let mut plan = base.clone();
        plan.seed = seed;
        plan.load = match (self, base.load) {
            (LoadPoint::Concurrency(users), _) => Load::Closed { users },
            (
                LoadPoint::RequestRate(r),
                Load::Open {
                    arrival,
                    burstiness,
                    max_in_flight,
                    ..
                },
            ) => Load::Open {
                rate: Rate::PerSecond(r),
                arrival,
                burstiness,
                max_in_flight,
            },
            (LoadPoint::ArrivalSpeedup(_), load) => load,
            (LoadPoint::RequestRate(r), Load::Closed { .. }) => Load::Open {
                rate: Rate::PerSecond(r),
                arrival: bench::Arrival::Poisson,
                burstiness: 1.0,
                max_in_flight: None,
            },
        };
        plan
    }
}

/// `x` with at most 3 decimals and no trailing zeros after the point.
pub(super) fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    /// The load.
    pub load: LoadPoint,
    /// Its bench report JSON (the same keys as `bench`), plus the sweep's keys.
    pub json: Value,
    /// Why the point counts as saturated (empty when it does not).
    pub saturation: Vec<String>,
    /// Share of requests that met the SLO (None without one).
    pub attainment: Option<f64>,
    /// Its per-request records.
    pub records: Vec<crate::report::replay_report::LiveRecord>,
}

impl Point {
    /// A number of its report JSON (0 when absent).
    pub(super) fn f(&self, key: &str) -> f64 {
        self.json[key].as_f64().unwrap_or(0.0)
    }

    /// Achieved requests per second.
    pub fn rps(&self) -> f64 {
        self.f("request_throughput_rps")
    }

    /// True when it met the SLO (when there is one) and did not saturate.
    pub fn good(&self, min_attainment: f64) -> bool {
        self.saturation.is_empty() && self.attainment.is_none_or(|a| a >= min_attainment)
    }
}
