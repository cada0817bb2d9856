//! Dynamo-compatible `offline_replay_bench` entry point: the same flags as `mockserve replay`.
//!
//! Run with:
//! `cargo bench --bench offline_replay_bench -- TRACE --engine-type sglang --num-workers 4
//!  --router-mode kv-router --arrival-speedup-ratio 4 --trace-block-size 512 --block-size 64`
//!
//! A bare `cargo bench` passes only `--bench`; the entry point then skips (exit 0).

use std::process::ExitCode;

use clap::Parser;
use mock_server::replay_cmd::ReplayArgs;

/// Offline replay benchmark (virtual time).
#[derive(Parser, Debug)]
#[command(name = "offline_replay_bench")]
struct BenchCli {
    /// Added by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,

    /// The replay flags.
    #[command(flatten)]
    replay: ReplayArgs,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        println!("offline_replay_bench: skipping no-arg harness invocation");
        return ExitCode::SUCCESS;
    }
    let cli = BenchCli::parse();
    match mock_server::replay_cmd::run(&cli.replay) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("offline_replay_bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
