//! Dynamo-compatible `multiturn_bench` entry point: the flags of `loadgen multiturn`.
//!
//! Run with:
//! `cargo bench --bench multiturn_bench -- --ping` (embedded mockserve), or
//! `cargo bench --bench multiturn_bench -- --url http://localhost:8000 --num-users 10
//!  --num-turns 5 --num-user-tokens 128 --max-completion-tokens 256 --mean-delay-ms 5000
//!  [--speculative-prefill] --output baseline.json --verbose`
//!
//! A bare `cargo bench` passes only `--bench`; the entry point then skips (exit 0).

mod common;

use std::process::ExitCode;

use loadgen::config::MultiturnArgs;

fn main() -> ExitCode {
    common::bench_main("multiturn_bench", |args: MultiturnArgs| {
        let command = loadgen::Cli {
            command: loadgen::Command::Multiturn(args),
        };
        Ok(loadgen::run(command)?)
    })
}
