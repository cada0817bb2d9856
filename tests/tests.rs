//! End-to-end tests of servesim, one test binary.
#![allow(clippy::unwrap_used)]
//!
//! - `autoscale`: `mockserve replay --autoscale` on an elastic fleet, its judge, the Python policy.
//! - `replay`: the offline replay through the library (determinism, hand-checked timings).
//! - `readme`: the README's paths exist in the repository and its cheap commands work; every
//!   module folder is named in docs/architecture.md.
//!
//! The crates' own end-to-end tests live with them: `mock_server/tests/serve/` (with `mockserve
//! replay`'s command line), `loadgen/tests/runs/`, `indexer_bench/tests/`.

mod autoscale;
mod readme;
mod replay;

/// Path of a file under `fixtures/`.
pub fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}
