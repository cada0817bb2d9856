//! One run, whatever the mode: the harness every run command (`bench`, `replay`, `sweep`,
//! `multiturn`) goes through.
//!
//! The harness (`execute`) connects, waits for `--start-at`, starts the observers, drives, stops
//! them, builds the report, prints it and writes its files; a mode supplies only its schedule
//! and its report. [`RunArgs`] are the flags it reads, flattened into each mode's flags.
//! [`repeat`]: `--num-runs K` (the same run K times, then the aggregate across them) and the
//! `--lora-mix` flag. What a run runs on (the target, the driver, one request) is in
//! [`run`](mod@crate::run), below this layer; what it shows and writes is in
//! [`observe`](crate::observe) and [`report`](crate::report).

pub mod repeat;

use std::borrow::Cow;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::error::LoadgenError;
use crate::observe::{Observe, ObserveArgs, Observed};
use crate::run::driver::RunHooks;
use crate::run::failure::FailureArgs;
use crate::run::shard::ShardArgs;
use crate::run::target::{self, Api, Connected, TargetArgs, TargetSpec};
use mock_server::args::ReportArgs;

/// The flags of one run besides its schedule: report files, observers, failure threshold,
/// target and sharding (`bench`, `replay` and `multiturn`; `sweep` through `bench`'s).
#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// Report files and progress.
    #[command(flatten)]
    pub report: ReportArgs,
    /// Server metrics, HTML report.
    #[command(flatten)]
    pub observe: ObserveArgs,
    /// Failure threshold.
    #[command(flatten)]
    pub failures: FailureArgs,
    /// Where requests go.
    #[command(flatten)]
    pub target: TargetArgs,
    /// One run over N processes.
    #[command(flatten, next_help_heading = "Sharding (one run over N processes)")]
    pub sharding: ShardArgs,
    /// `--num-runs` and `--lora-mix`.
    #[command(flatten, next_help_heading = "Repeated runs and LoRA traffic")]
    pub runs: repeat::RepeatArgs,
}

impl RunArgs {
    /// The validated target ([`TargetArgs::spec`]) with `--lora-mix` on it (its adapters loaded
    /// by the embedded server), after `--num-runs` is checked.
    pub fn spec(&self, embedded: &target::EmbeddedOptions) -> Result<TargetSpec, LoadgenError> {
        if self.runs.num_runs()? > 1 && self.sharding.shard.is_some() {
            return Err(LoadgenError::Config(
                "--num-runs repeats a whole run and --shard splits one over processes: run the \
                 repetitions of a sharded run as separate sharded runs"
                    .into(),
            ));
        }
        let lora = self.runs.lora()?;
        let mut spec = self.target.spec(embedded)?;
        if let Some(mix) = lora {
            spec.set_lora(mix, self.target.engine.seed);
        }
        Ok(spec)
    }
}

/// What the harness reads besides the mode: the report files, what observes the run (None:
/// nothing, as in `multiturn` unless asked), the HTML report, `--start-at`, and whether anything
/// is printed.
#[derive(Clone, Copy)]
pub(crate) struct Settings<'a> {
    /// `--report-json` and `--per-request-jsonl`.
    pub report: &'a ReportArgs,
    /// The scraper's flags; None runs without observers.
    pub observe: Option<&'a ObserveArgs>,
    /// The live view (unless `--quiet`).
    pub live_view: bool,
    /// `--html`.
    pub html: Option<&'a Path>,
    /// `--start-at`.
    pub sharding: &'a ShardArgs,
    /// Print the report (a sweep's replay points do not; their files are written either way).
    pub console: bool,
    /// `--num-runs` (checked by [`RunArgs::spec`]).
    pub num_runs: usize,
}

impl<'a> Settings<'a> {
    /// The settings of a run with `args`' flags, printing its report.
    pub(crate) fn of(args: &'a RunArgs) -> Settings<'a> {
        Settings {
            report: &args.report,
            observe: Some(&args.observe),
            live_view: !args.report.quiet,
            html: args.observe.html.as_deref(),
            sharding: &args.sharding,
            console: true,
            num_runs: args.runs.num_runs,
        }
    }
}

/// What a run command supplies to [`execute`]: its schedule (built once connected, sent by
/// [`Mode::drive`]) and its report.
pub(crate) trait Mode {
    /// What [`Mode::prepare`] builds for [`Mode::drive`] to send.
    type Schedule;
    /// What the driver returns.
    type Driven;
    /// The finished run.
    type Run: Report;

    /// The route requests go to.
    fn api(&self) -> Api;

    /// Builds the schedule for the connected target and prints what the run will do; with it,
    /// the number of requests it will send, when known (the live view's total).
    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Self::Schedule, Option<usize>), LoadgenError>;

    /// A line printed once the observers run, just before the first request (none by default).
    fn announce(&self, _target: &Connected) {}

    /// Sends the schedule, `hooks` watching it.
    fn drive(
        &mut self,
        schedule: Self::Schedule,
        target: &Connected,
        hooks: RunHooks,
    ) -> impl Future<Output = Result<Self::Driven, LoadgenError>> + Send;

    /// The run's report from what the driver returned, the wall time it took, and what the
    /// observers saw (their series go into the report JSON here).
    fn report(
        &mut self,
        driven: Self::Driven,
        wall: Duration,
        observed: &Observed,
    ) -> Result<Self::Run, LoadgenError>;
}

/// A finished run as the harness prints and writes it.
pub(crate) trait Report {
    /// The console report (the server metrics' summary follows it).
    fn console_text(&self) -> String;

    /// Writes `--report-json` and `--per-request-jsonl` when given.
    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError>;

    /// The run's name in the HTML report and the report JSON it draws.
    fn html_json(&self) -> (&'static str, Cow<'_, Value>);

    /// The run's per-request report, when it has one: the server metrics' routing line counts
    /// its requests as the run's own.
    fn live(&self) -> Option<&crate::report::replay_report::LiveReport> {
        None
    }

    /// The figures `--num-runs` aggregates, and where they sit in the report JSON.
    fn figures(&self) -> &'static [crate::report::repeat::Figure] {
        crate::report::repeat::LIVE_FIGURES
    }
}

/// Runs `mode` on `spec` once (`--num-runs` is the caller's): see [`execute_runs`].
pub(crate) async fn execute<M: Mode>(
    mode: M,
    spec: &TargetSpec,
    settings: &Settings<'_>,
) -> Result<M::Run, LoadgenError> {
    let settings = Settings {
        num_runs: 1,
        ..*settings
    };
    first(execute_runs(mode, spec, &settings).await?)
}

/// The first of `runs` ([`execute_runs`] returns at least one).
pub(crate) fn first<R>(runs: Vec<R>) -> Result<R, LoadgenError> {
    runs.into_iter()
        .next()
        .ok_or_else(|| LoadgenError::Config("a run ended without a report".into()))
}

/// Runs `mode` on `spec` `settings.num_runs` times (at least once), each run: connect,
/// `--start-at` (the first), observers, drive, report, print; then the files: one run writes
/// its report files and HTML report, K runs write the aggregate ([`repeat::finish`]). The
/// target is shut down after each run, whether it succeeded or not.
pub(crate) async fn execute_runs<M: Mode>(
    mut mode: M,
    spec: &TargetSpec,
    settings: &Settings<'_>,
) -> Result<Vec<M::Run>, LoadgenError> {
    let k = settings.num_runs.max(1);
    let mut runs = Vec::with_capacity(k);
    for i in 0..k {
        if k > 1 && settings.console {
            crate::stdout::outln!("=== Run {} of {k} ===", i + 1);
        }
        runs.push(execute_once(&mut mode, spec, settings, i == 0).await?);
    }
    match runs.as_slice() {
        [run] => {
            run.write_files(settings.report)?;
            if let Some(path) = settings.html {
                let (name, json) = run.html_json();
                crate::report::html::write(path, &[crate::report::html::RunView::of(name, &json)])?;
            }
        }
        all => repeat::finish(all, settings)?,
    }
    Ok(runs)
}

/// One run: connect, `--start-at` when `first`, observers, drive, report, print.
async fn execute_once<M: Mode>(
    mode: &mut M,
    spec: &TargetSpec,
    settings: &Settings<'_>,
    first: bool,
) -> Result<M::Run, LoadgenError> {
    let target = spec.connect(mode.api()).await?;
    let (schedule, expected) = match mode.prepare(&target) {
        Ok(prepared) => prepared,
        Err(e) => {
            target.shutdown().await;
            return Err(e);
        }
    };
    if first {
        settings.sharding.wait_for_start().await;
    }
    let observe = match settings.observe {
        Some(args) => Some(Observe::start(args, settings.live_view, &target, expected).await),
        None => None,
    };
    if settings.console {
        mode.announce(&target);
    }
    let hooks = observe.as_ref().map(Observe::hooks).unwrap_or_default();
    let started = std::time::Instant::now();
    let driven = mode.drive(schedule, &target, hooks).await;
    let wall = started.elapsed();
    let observed = match observe {
        Some(o) => o.finish().await,
        None => Observed::default(),
    };
    target.shutdown().await;
    let run = mode.report(driven?, wall, &observed)?;
    if settings.console {
        crate::stdout::out!("{}", run.console_text());
        crate::stdout::out!(
            "{}",
            observed.console(
                run.live()
                    .map(crate::report::replay_report::LiveReport::own_routing)
            )
        );
    }
    Ok(run)
}
