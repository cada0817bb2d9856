//! Dynamo-compatible `offline_replay_bench` entry point: the same flags as `mockserve replay`.
//!
//! Run with:
//! `cargo bench --bench offline_replay_bench -- TRACE --engine-type sglang --num-workers 4
//!  --router-mode kv-router --arrival-speedup-ratio 4 --trace-block-size 512 --block-size 64`
//!
//! A bare `cargo bench` passes only `--bench`; the entry point then skips (exit 0).

mod common;

use std::process::ExitCode;

use mock_server::cmd::replay::ReplayArgs;

fn main() -> ExitCode {
    common::bench_main("offline_replay_bench", |args: ReplayArgs| {
        mock_server::cmd::replay::run(&args).map(|_| ())
    })
}
