//! End-to-end tests of servesim, one test binary.
#![allow(clippy::unwrap_used)]
//!
//! - `autoscale`: `mockserve replay --autoscale` on an elastic fleet, its judge, the Python policy.
//! - `replay`: the offline replay through the library (determinism, hand-checked timings).
//! - `replay_cli`: `mockserve replay` parsed and run in-process (flags, files, errors).
//! - `mooncake_bench`: the indexer benchmark end to end on a fixture trace (counts, JSON, sweep).
//! - `readme`: the README's paths exist in the repository and its cheap commands work.

mod autoscale;
mod mooncake_bench;
mod readme;
mod replay;
mod replay_cli;

/// Path of a file under `fixtures/`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}
