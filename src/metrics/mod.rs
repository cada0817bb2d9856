//! Latency distributions, a streaming quantile sketch, the request-lifecycle [`Collector`] and the
//! [`ReplayReport`] it produces (Dynamo's offline-replay report: same keys, same formulas).
//!
//! The collector keeps O(1) state per request; per-token gaps go straight into
//! `QuantileSketch`es, so millions of tokens cost no per-token memory. Every figure is a pure
//! function of the hook calls, except the wall-clock keys listed in [`WALL_CLOCK_KEYS`].

mod collector;
mod distribution;
mod report;
mod sketch;

pub use collector::Collector;
pub use distribution::Distribution;
pub use report::{
    DisaggFigures, G2Figures, ReplayReport, RequestRecord, RequestStatus, WALL_CLOCK_KEYS,
};
