//! loadgen: a load generator for OpenAI-compatible LLM endpoints: multi-turn conversations
//! (`multiturn`, Dynamo's `multiturn_bench`), a Mooncake or agentic trace replayed live on its
//! schedule (`replay`), and synthetic closed- or open-loop load with goodput (`bench`), all on
//! one driver with one TTFT definition and one failure report. Without `--url` it starts
//! mockserve in-process on 127.0.0.1 and drives it.
//!
//! [`Cli`] is the command line and [`run`] / [`run_async`] execute it; a run whose failed
//! requests exceed `--max-failure-rate` returns [`LoadgenError::TooManyFailures`] (or
//! [`LoadgenError::AllFailed`]) after writing its reports. The modules:
//!
//! - [`target`]: where requests go ([`target::TargetArgs`] → [`target::TargetSpec`] →
//!   [`target::Connected`]): `--url` or the embedded mockserve, model detection, the tokenizer.
//! - [`driver`]: the one driver loop; each session is a [`driver::Script`] whose requests are due
//!   at absolute offsets (open loop) or after the previous answer (closed loop), latencies counted
//!   from the scheduled send ([`driver::Sample`], [`driver::Sample::ttft_us`]).
//! - [`client`]: one streamed request, its [`client::Timing`] (both TTFT figures,
//!   [`client::FirstToken`]) and outcome; [`sse`]: the bounded SSE parser it reads with.
//! - [`failure`]: why a request failed ([`failure::Failure`]), counts by reason
//!   ([`failure::FailureSummary`], the `failures` key of every report) and the verdict.
//! - `multiturn`: [`config`] (flags → [`config::MultiturnConfig`]), [`workload`] (the seeded
//!   conversations), [`multiturn`] (the run), [`multiturn_report`] (Dynamo's statistics and keys,
//!   [`multiturn_report::Results`]) and [`compare`] (two results files side by side).
//! - `replay`: [`replay`] (a Mooncake trace as sessions, or an agentic trace's request graph),
//!   [`graph_driver`] (the graph's scheduler: each node sent when its dependencies allow),
//!   [`prompt`] (prompts from hash ids).
//! - `bench`: [`bench`](mod@bench) (flags → [`bench::BenchPlan`], arrivals, lengths, goodput).
//! - [`replay_report`]: the `replay` and `bench` report, with `mockserve replay`'s keys, and the
//!   raw per-request record ([`replay_report::RawSample`]) it can be rebuilt from.
//! - `sweep`: [`sweep`](mod@sweep) (bench or replay over load points, or the max-goodput
//!   search; saturation and the knee); [`merge`] (one report from several runs' records).
//! - What a run shows besides its report ([`observe`]): [`scrape`] (the target's Prometheus
//!   metrics over time), [`html`] (the self-contained HTML report), [`live`] (the live view).
//! - `profile`: [`profile`](mod@profile) (prefill and decode latency measured into a profile
//!   that `--perf-profile` reads).
//! - `trace convert`: [`convert`](mod@convert) (multiturn records or an OpenAI request log into
//!   a Mooncake or agentic trace, hash ids from the real tokens).
//! - [`shard`]: `--shard I/N` and `--start-at`, one load split over N processes that
//!   [`merge`] puts back together.
//! - [`limits`]: every flag's allowed range (caps as named constants) and the output-path check
//!   each mode's validation runs before anything connects.
//! - [`error`]: [`LoadgenError`] and the exit status of each.
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
pub mod convert;
pub mod driver;
pub mod error;
pub mod failure;
pub mod graph_driver;
pub mod html;
pub mod limits;
pub mod live;
pub mod merge;
pub mod multiturn;
pub mod multiturn_report;
pub mod observe;
pub mod profile;
pub mod prompt;
pub mod replay;
pub mod replay_report;
pub mod scrape;
pub mod shard;
pub mod sse;
pub mod sweep;
pub mod target;
pub mod workload;

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
/// ([`limits`]), every combination, the output paths, and the embedded server's settings. The
/// run commands call the same checks on their own, so a run never starts on flags this refuses.
pub fn validate(command: &Command) -> Result<(), LoadgenError> {
    match command {
        Command::Multiturn(args) => args.config().map(|_| ()),
        Command::Replay(args) => {
            args.check()?;
            args.target
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Bench(args) => {
            args.plan()?;
            args.target
                .spec(&target::EmbeddedOptions::default())
                .map(|_| ())
        }
        Command::Sweep(args) => {
            args.plan()?;
            args.bench
                .target
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
            let results = multiturn::multiturn(&config).await?;
            multiturn::verdict(&results, config.max_failure_rate)
        }
        Command::Replay(args) => {
            let run = replay::replay(&args).await?;
            run.live.verdict(args.failures.max_failure_rate)?;
            observe::lateness_verdict(run.server_lateness, &args.observe)
        }
        Command::Bench(args) => {
            let run = bench::bench(&args).await?;
            run.live.verdict(args.failures.max_failure_rate)?;
            observe::lateness_verdict(run.server_lateness, &args.observe)
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
            print!("{}", compare::run(&args)?);
            Ok(())
        }
        Command::Profile(args) => profile::profile(&args).await.map(|_| ()),
        Command::Trace(args) => match &args.command {
            convert::TraceCommand::Convert(a) => convert::convert(a).map(|_| ()),
        },
        Command::Completions { shell } => {
            std::io::Write::write_all(&mut std::io::stdout(), &completions(shell)).map_err(
                |source| LoadgenError::Io {
                    path: "<stdout>".into(),
                    source,
                },
            )
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
