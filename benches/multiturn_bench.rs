//! Dynamo-compatible `multiturn_bench` entry point: the flags of `loadgen multiturn`.
//!
//! Run with:
//! `cargo bench --bench multiturn_bench -- --ping` (embedded mockserve), or
//! `cargo bench --bench multiturn_bench -- --url http://localhost:8000 --num-users 10
//!  --num-turns 5 --num-user-tokens 128 --max-completion-tokens 256 --mean-delay-ms 5000
//!  [--speculative-prefill] --output baseline.json --verbose`
//!
//! A bare `cargo bench` passes only `--bench`; the entry point then skips (exit 0).

use std::process::ExitCode;

use clap::Parser;
use loadgen::config::MultiturnArgs;

/// Multi-turn chat benchmark.
#[derive(Parser, Debug)]
#[command(name = "multiturn_bench")]
struct BenchCli {
    /// Added by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,

    /// The multiturn flags.
    #[command(flatten)]
    multiturn: MultiturnArgs,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        println!("multiturn_bench: skipping no-arg harness invocation");
        return ExitCode::SUCCESS;
    }
    let cli = BenchCli::parse();
    let command = loadgen::Cli {
        command: loadgen::Command::Multiturn(cli.multiturn),
    };
    match loadgen::run(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("multiturn_bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}
