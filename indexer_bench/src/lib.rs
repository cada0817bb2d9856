//! The KV indexer benchmark (`mooncake_bench`): a Mooncake trace replayed on per-worker mock
//! engines into lookups and KV events, then issued open loop at deadlines against an indexer.
//!
//! - [`indexer`]: the benchmark's thread-safe indexers ([`ConcurrentRadixTreeCompressed`],
//!   [`BranchSharded`]) and [`IndexerKind`], which names them and the engine's own;
//! - [`workload::prepare`] turns a [`Trace`](servesim::trace::Trace) into a [`Workload`]
//!   (deterministic: same trace, settings and seed give the same operations);
//! - [`open_loop::run`] replays it against a fresh indexer in a wall-clock window and returns an
//!   [`OpenLoopResult`];
//! - [`sweep_windows`] gives Dynamo's log-spaced sweep windows;
//! - [`cli`] is the `mooncake_bench` command line (`cargo bench --bench mooncake_bench`).
//!
//! Unlike the engine, this crate reads the wall clock and starts threads: it measures.
//!
//! Building an indexer by kind and driving it through the engine's trait:
//!
//! ```
//! use indexer_bench::{IndexerConfig, IndexerKind};
//! use servesim::ids::WorkerId;
//! use servesim::kv::{KvEvent, KvEventData, StoredBlock};
//! use servesim::tokens::{sequence_hashes, LocalBlockHash};
//!
//! let local = vec![LocalBlockHash(1), LocalBlockHash(2)];
//! let blocks = local
//!     .iter()
//!     .zip(sequence_hashes(&local))
//!     .map(|(&local_hash, seq_hash)| StoredBlock { seq_hash, local_hash })
//!     .collect();
//! let kind: IndexerKind = "concurrent-radix-tree-compressed".parse()?;
//! let mut indexer = kind.build(&IndexerConfig::default());
//! indexer.apply(&KvEvent {
//!     worker: WorkerId(3),
//!     event_id: 0,
//!     data: KvEventData::Stored { parent: None, blocks },
//! });
//! assert_eq!(indexer.find_matches(&local).scores[&WorkerId(3)], 2);
//! # Ok::<(), indexer_bench::UnknownIndexer>(())
//! ```

pub mod cli;
pub mod indexer;
pub mod open_loop;
pub mod result;
pub mod workload;

pub use indexer::{
    BranchSharded, ConcurrentKvIndexer, ConcurrentRadixTreeCompressed, IndexerConfig, IndexerKind,
    Locked, UnknownIndexer,
};

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
