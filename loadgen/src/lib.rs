//! loadgen: a multi-turn load generator for OpenAI-compatible chat endpoints.
//!
//! - [`Cli`] is the command line and [`run`] / [`run_async`] execute it.
//! - [`config::MultiturnArgs`] (Dynamo `multiturn_bench`'s flags) becomes a validated
//!   [`config::MultiturnConfig`]; [`multiturn::multiturn`] runs it: without `--url` it starts
//!   mockserve in-process on 127.0.0.1 and drives it.
//! - [`workload::Workload`] is the seeded, pre-generated conversation script;
//!   [`client::send`] streams one request and stamps its times ([`sse::SseParser`] reads the
//!   stream); [`report::Results`] holds Dynamo's statistics and JSON keys plus loadgen's.
//! - [`compare`] puts two results files side by side (table and SVG chart).
//!
//! A ping of the embedded server, in-process:
//!
//! ```
//! use clap::Parser;
//! # fn main() -> Result<(), loadgen::LoadgenError> {
//! let cli = loadgen::Cli::try_parse_from(["loadgen", "multiturn", "--ping", "--speedup-ratio", "inf"])
//!     .expect("valid flags");
//! loadgen::run(cli)?;
//! # Ok(())
//! # }
//! ```

pub mod bench;
pub mod client;
pub mod compare;
pub mod config;
pub mod driver;
pub mod error;
pub mod failure;
pub mod multiturn;
pub mod multiturn_report;
pub mod prompt;
pub mod replay;
pub mod replay_report;
pub mod sse;
pub mod target;
pub mod workload;

use clap::{Parser, Subcommand};

pub use error::LoadgenError;

/// loadgen: drive an OpenAI-compatible endpoint (or an embedded mockserve) and measure TTFT.
#[derive(Parser, Debug)]
#[command(name = "loadgen", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Built once per process by the parser: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Concurrent multi-turn conversations; per-turn TTFT and latency (Dynamo multiturn_bench).
    Multiturn(config::MultiturnArgs),
    /// Replay a Mooncake trace live on its schedule; report with `mockserve replay`'s keys.
    Replay(replay::ReplayArgs),
    /// Synthetic load: closed loop, open loop (Poisson, constant, gamma) or both; goodput.
    Bench(bench::BenchArgs),
    /// Compare the per-turn TTFT of two results files.
    Compare(compare::CompareArgs),
}

/// Runs a parsed command line on the current tokio runtime. A run (multiturn, replay or bench)
/// that completes but fails the failure-rate check returns [`LoadgenError::AllFailed`] or
/// [`LoadgenError::TooManyFailures`] after printing and writing its report.
pub async fn run_async(cli: Cli) -> Result<(), LoadgenError> {
    match cli.command {
        Command::Multiturn(args) => {
            let config = args.config()?;
            let results = multiturn::multiturn(&config).await?;
            multiturn::verdict(&results, config.max_failure_rate)
        }
        Command::Replay(args) => {
            let run = replay::replay(&args).await?;
            run.live.verdict(args.failures.max_failure_rate)
        }
        Command::Bench(args) => {
            let run = bench::bench(&args).await?;
            run.live.verdict(args.failures.max_failure_rate)
        }
        Command::Compare(args) => {
            print!("{}", compare::run(&args)?);
            Ok(())
        }
    }
}

/// Runs a parsed command line on a new multi-threaded tokio runtime.
pub fn run(cli: Cli) -> Result<(), LoadgenError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(LoadgenError::Runtime)?;
    runtime.block_on(run_async(cli))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
