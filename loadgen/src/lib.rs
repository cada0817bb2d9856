//! loadgen: a load generator for OpenAI-compatible LLM endpoints: multi-turn conversations
//! (`multiturn`, Dynamo's `multiturn_bench`), a Mooncake or agentic trace replayed live on its
//! schedule (`replay`), and synthetic closed- or open-loop load with goodput (`bench`), all on
//! one driver with one TTFT definition and one failure report. Without `--url` it starts
//! mockserve in-process on 127.0.0.1 and drives it.
//!
//! [`Cli`] is the command line and [`run()`] / [`run_async`] execute it; a run whose failed
//! requests exceed `--max-failure-rate` returns [`LoadgenError::TooManyFailures`] (or
//! [`LoadgenError::AllFailed`]) after writing its reports.
//!
//! The folders, from the bottom layer up (a folder names only the folders below it;
//! `scripts/house.py` checks it):
//!
//! - `stdout`, [`error`] ([`LoadgenError`] and the exit status of each), `limits` (every flag's
//!   allowed range, caps as named constants, and the output-path check each mode's validation
//!   runs before anything connects), `capped` (bounded reads of the files loadgen reads back)
//!   and `write` (the one writer of every report file: serialisation and I/O errors returned).
//!   `stdout` is the one way loadgen prints to its console (a closed pipe ends the output
//!   quietly; the run goes on and writes its files).
//! - [`run`](mod@run): what a run runs on: [`run::target`] (where requests go), [`run::driver`]
//!   (the one driver loop, latencies counted from the scheduled send:
//!   `run::driver::Sample::ttft_us`), [`run::client`] and [`run::sse`] (one streamed request on
//!   the wire), `run::prompt`, `run::failure` (counts by reason, the `failures` key of every
//!   report) and `run::shard` (`--shard I/N`, `--start-at`).
//! - [`dataset`]: real prompts (`--dataset sharegpt:PATH` or `jsonl:PATH`) for `bench`,
//!   `sweep` and `multiturn`: read through caps, counted with the target's tokenizer, filtered,
//!   taken in a seeded order.
//! - [`observe`]: what a run shows besides its report: [`observe::scrape`] (the target's
//!   Prometheus metrics over time) and `observe::live` (the live view).
//! - [`report`]: [`report::replay_report`] (the `replay` and `bench` report, with `mockserve
//!   replay`'s keys, and the raw per-request record it can be rebuilt from) and `report::html`
//!   (the self-contained HTML report).
//! - [`harness`]: the one run harness every run command goes through (connect, observe, drive,
//!   report, write; a mode supplies only its schedule and its report, and
//!   [`harness::RunArgs`] are the flags it reads).
//! - The modes, each with its flags, its report and its verdict (a mode names no other):
//!   [`multiturn`]: the run, [`multiturn::config`] (flags → [`multiturn::config::MultiturnConfig`]),
//!   `multiturn::workload` (the seeded conversations), [`multiturn::report`] (Dynamo's
//!   statistics and keys) and [`multiturn::compare`] (results files side by side).
//!   [`replay`]: a Mooncake trace as sessions, or an agentic trace's request graph sent by
//!   `replay::graph_driver` (each node when its dependencies allow).
//!   [`bench`](mod@bench): flags → [`bench::BenchPlan`], arrivals, lengths, goodput.
//!   [`profile`](mod@profile): prefill and decode latency measured into a profile that
//!   `--perf-profile` reads.
//!   [`convert`](mod@convert): `trace convert`, multiturn records or an OpenAI request log into
//!   a Mooncake or agentic trace, hash ids from the real tokens.
//! - [`sweep`](mod@sweep) and [`merge`](mod@merge) (one report from several runs' records)
//!   stand on the modes above: a sweep is bench or replay over load points, or the
//!   max-goodput search, with saturation and the knee.
//!
//! The modules other crates, the benches and the tests name are also at the crate root
//! ([`driver`], [`client`], [`sse`], [`scrape`], [`config`], [`replay_report`], ...).
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
pub mod calibrate;
pub(crate) mod capped;
pub mod convert;
pub mod dataset;
pub mod error;
pub mod harness;
pub(crate) mod limits;
pub mod merge;
pub mod multiturn;
pub mod observe;
pub mod profile;
pub mod replay;
pub mod report;
pub mod run;
pub(crate) mod stdout;
pub mod sweep;
pub(crate) mod write;

// The flat paths other crates, the benches and the tests use; each module lives in its folder.
pub use multiturn::{compare, config, report as multiturn_report};
pub use observe::scrape;
pub use report::replay_report;
pub use run::{client, driver, sse, target};

use clap::{Parser, Subcommand};

pub use error::LoadgenError;

/// loadgen: drive an OpenAI-compatible endpoint (or an embedded mockserve) and measure TTFT.
#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SERVESIM_GIT_COMMIT"), ")"),
    about
)]
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
    /// Bench over a list of load points, or search the highest load meeting an SLO; marks the
    /// knee.
    Sweep(sweep::SweepArgs),
    /// Rebuild one report from the per-request JSONL of several runs (loadgen processes).
    Merge(merge::MergeArgs),
    /// Compare the per-turn TTFT of two results files.
    Compare(compare::CompareArgs),
    /// Put servesim's offline replay of a trace beside a live run of it, request by request:
    /// MAPE, bias, Pearson r, KS and TOST per metric.
    Calibrate(calibrate::CalibrateArgs),
    /// Measure an endpoint's prefill and decode latency and write a profile (Dynamo mocker's
    /// .npz, a JSON twin and an SVG) that `--perf-profile` reads.
    Profile(profile::ProfileArgs),
    /// Work on trace files: `loadgen trace convert` turns multiturn records or a log of OpenAI
    /// chat requests into a Mooncake or agentic_mooncake trace.
    Trace(convert::TraceArgs),
    /// Print a shell completion script on stdout, e.g. `loadgen completions bash`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// Checks a command's flags as its run does first, without running anything: every range
/// (`limits`), every combination, the output paths, and the embedded server's settings. The
/// run commands call the same checks on their own, so a run never starts on flags this refuses.
pub fn validate(command: &Command) -> Result<(), LoadgenError> {
    match command {
        Command::Multiturn(args) => args.config().map(|_| ()),
        Command::Replay(args) => {
            args.check()?;
            args.run
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Bench(args) => {
            args.plan()?;
            args.run
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Sweep(args) => {
            args.plan()?;
            args.bench
                .run
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Profile(args) => {
            args.plan()?;
            args.target
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Merge(args) => merge::check(args),
        Command::Calibrate(args) => {
            args.check()?;
            args.replay
                .run
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Trace(args) => match &args.command {
            convert::TraceCommand::Convert(a) => a.check(),
        },
        Command::Compare(_) | Command::Completions { .. } => Ok(()),
    }
}

/// The completion script of `loadgen` for `shell`.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut script = Vec::new();
    let mut command = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut command, "loadgen", &mut script);
    script
}

/// Runs a parsed command line on the current tokio runtime. A run (multiturn, replay or bench)
/// that completes but fails the failure-rate check returns [`LoadgenError::AllFailed`] or
/// [`LoadgenError::TooManyFailures`] after printing and writing its report.
pub async fn run_async(cli: Cli) -> Result<(), LoadgenError> {
    match cli.command {
        Command::Multiturn(args) => {
            let config = args.config()?;
            for results in multiturn::multiturn_runs(&config).await? {
                multiturn::verdict(&results, &config)?;
            }
            Ok(())
        }
        // With --num-runs K, every run meets the failure threshold and the lateness bound.
        Command::Replay(args) => {
            for run in replay::replay_runs(&args).await? {
                replay::verdict(&run, &args)?;
            }
            Ok(())
        }
        Command::Bench(args) => {
            for run in bench::bench_runs(&args).await? {
                bench::verdict(&run, &args)?;
            }
            Ok(())
        }
        Command::Sweep(args) => {
            sweep::sweep(&args).await?;
            Ok(())
        }
        Command::Merge(args) => {
            merge::run(&args)?;
            Ok(())
        }
        Command::Compare(args) => {
            crate::stdout::out!("{}", compare::run(&args)?);
            Ok(())
        }
        Command::Profile(args) => profile::profile(&args).await.map(|_| ()),
        Command::Calibrate(args) => calibrate::calibrate(&args).await.map(|_| ()),
        Command::Trace(args) => match &args.command {
            convert::TraceCommand::Convert(a) => convert::convert(a).map(|_| ()),
        },
        Command::Completions { shell } => {
            stdout::print(&String::from_utf8_lossy(&completions(shell)));
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
