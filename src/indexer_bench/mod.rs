//! The KV indexer benchmark (`mooncake_bench`): a Mooncake trace replayed on per-worker mock
//! engines into lookups and KV events, then issued open loop at deadlines against an indexer.
//!
//! - [`workload::prepare`] turns a [`Trace`](crate::trace::Trace) into a [`Workload`]
//!   (deterministic: same trace, settings and seed give the same operations);
//! - [`open_loop::run`] replays it against a fresh indexer in a wall-clock window and returns an
//!   [`OpenLoopResult`];
//! - [`sweep_windows`] gives Dynamo's log-spaced sweep windows.
//!
//! Unlike the engine, this module reads the wall clock and starts threads: it measures.

pub mod open_loop;
pub mod result;
pub mod workload;

pub use open_loop::{run, RunConfig};
pub use result::{Distribution, OpenLoopResult, Provenance, RunTotals};
pub use workload::{prepare, Op, TimedOp, WorkerTimeline, Workload, WorkloadConfig, WorkloadError};

/// Sweep windows in ms, longest first: `round(exp(ln max * (1 - t) + ln min * t))` for
/// `t = i / (steps - 1)` (Dynamo's `compute_sweep_durations`); one step gives `max`.
pub fn sweep_windows(min_ms: u64, max_ms: u64, steps: usize) -> Vec<u64> {
    let (lo, hi) = (min_ms.max(1) as f64, max_ms.max(1) as f64);
    if steps <= 1 {
        return vec![max_ms.max(1)];
    }
    (0..steps)
        .map(|i| {
            let t = i as f64 / (steps - 1) as f64;
            (hi.ln() * (1.0 - t) + lo.ln() * t).exp().round() as u64
        })
        .collect()
}

#[cfg(test)]
mod tests;
