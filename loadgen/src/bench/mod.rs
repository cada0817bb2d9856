//! `loadgen bench`: synthetic load, closed loop (`--concurrency N`), open loop (`--request-rate R`
//! with Poisson, constant or gamma arrivals), or both (the rate capped at N in flight), on the
//! same driver as `replay` and `multiturn`; goodput against `--slo`.
//!
//! The flags become a validated [`BenchPlan`] ([`Load`], [`Stop`], [`Lengths`], warmup, SLO)
//! before anything connects; every contradictory combination is refused there.
//!
//! Open loop precomputes every request's send offset from a seeded generator (vLLM's
//! `--burstiness`: gamma inter-arrival gaps with shape `burstiness` and mean `1 / rate`;
//! burstiness 1 is Poisson). Each request is then a one-request session at its absolute offset.
//! Closed loop runs `N` sessions that each send their next request as soon as the previous one
//! finished. `--seed` (the engine's) also seeds arrivals, lengths and text. Prompts: an optional shared prefix (`--shared-prefix-tokens`, one per prefix group,
//! request `k` in group `k % --num-prefix-groups`) followed by `--input-tokens` (normal with
//! `--input-tokens-stddev`, at least 1) unique tokens, exact for a known tokenizer.
//!
//! The modules: `args` holds the flags and their validation, `plan` the validated plan,
//! `schedule` the plan as driver scripts, `report` what a run ends as; `slo` counts goodput.
//! The open loop's send offsets and each request's lengths come from the engine's generator
//! (`servesim::trace::synthetic`), the one `mockserve replay` and `mockserve plan` replay the
//! same flags with.

mod args;
mod plan;
mod report;
mod schedule;
mod slo;

pub use args::BenchArgs;
pub use plan::{BenchPlan, Lengths, Load, Rate, Stop, Warmup};
pub use report::BenchRun;
pub(crate) use report::{bench_json, config_json};
pub use servesim::trace::synthetic::{arrival_offsets, Arrival};
pub use slo::{goodput, Goodput, Slo};

use std::time::Duration;

use indicatif::ProgressBar;

use crate::error::LoadgenError;
use crate::harness::{self, Mode, Settings};
use crate::observe::Observed;
use crate::run::driver::{self, RunHooks, Script};
use crate::run::target::{Api, Connected, EmbeddedOptions, TargetSpec};
use report::measure;
use schedule::{Schedule, Taken};

/// Runs `loadgen bench`: prints the report and writes the requested files; with `--num-runs K`
/// the first run's report ([`bench_runs`] returns them all). The failure-rate
/// verdict (over the measured requests, warmup excluded) is the caller's
/// ([`replay_report::LiveReport::verdict`](crate::report::replay_report::LiveReport::verdict);
/// [`crate::run_async`] applies it).
pub async fn bench(args: &BenchArgs) -> Result<BenchRun, LoadgenError> {
    harness::first(bench_runs(args).await?)
}

/// Runs `loadgen bench` `--num-runs` times (the same schedule each time): every run, in order
/// (at least one), after printing each and the aggregate and writing the files.
pub async fn bench_runs(args: &BenchArgs) -> Result<Vec<BenchRun>, LoadgenError> {
    let plan = args.plan()?;
    let spec = args.run.spec(&EmbeddedOptions::default())?;
    let mode = BenchMode {
        plan,
        spec: &spec,
        taken: Taken::default(),
        lora: None,
    };
    harness::execute_runs(mode, &spec, &Settings::of(&args.run)).await
}

/// `loadgen bench` in the harness: the plan's schedule, its report with the observers' series
/// and the plan as `config`.
struct BenchMode<'a> {
    plan: BenchPlan,
    spec: &'a TargetSpec,
    /// The closed loop's request indices, by user then turn (the schedule's).
    taken: Taken,
    /// `--lora-mix` against the target (the report's adapter per request).
    lora: Option<std::sync::Arc<crate::run::lora::LoraTraffic>>,
}

impl Mode for BenchMode<'_> {
    type Schedule = Vec<Box<dyn Script>>;
    type Driven = driver::DriverOutput;
    type Run = BenchRun;

    fn api(&self) -> Api {
        self.plan.api
    }

    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Vec<Box<dyn Script>>, Option<usize>), LoadgenError> {
        let schedule = Schedule::new(&self.plan, target);
        self.taken = schedule.taken;
        self.lora = target.lora.clone();
        let expected = self
            .plan
            .stop
            .max_requests()
            .map(|n| self.plan.shard.map_or(n, |s| s.share(n)));
        Ok((schedule.scripts, expected))
    }

    fn announce(&self, target: &Connected) {
        crate::stdout::outln!(
            "loadgen bench: {}; prompts {} ({})",
            self.plan.describe(),
            if target.synth(1).is_exact() {
                "exact"
            } else {
                "approximate"
            },
            target.url
        );
    }

    async fn drive(
        &mut self,
        scripts: Vec<Box<dyn Script>>,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<driver::DriverOutput, LoadgenError> {
        send(&self.plan, target, scripts, hooks).await
    }

    fn report(
        &mut self,
        driven: driver::DriverOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<BenchRun, LoadgenError> {
        let mut run = measure(&self.plan, self.lora.as_deref(), &self.taken, driven, wall);
        run.server_lateness = observed.lateness();
        crate::report::observed::annotate(
            &mut run.json,
            &run.live,
            observed,
            Some(config_json(&self.plan, self.spec)),
        );
        Ok(run)
    }
}

/// The run's pass/fail verdict: fails when every request failed or the failure share is above
/// `--max-failure-rate`, or when the server fell behind by more than `--max-server-lateness`.
pub fn verdict(run: &BenchRun, args: &BenchArgs) -> Result<(), LoadgenError> {
    run.live.verdict(args.run.failures.max_failure_rate)?;
    crate::observe::lateness_verdict(run.server_lateness, &args.run.observe)
}

/// Runs `plan` on a connected target and builds its report (nothing printed or written).
pub(crate) async fn run_plan(
    plan: &BenchPlan,
    target: &Connected,
    hooks: &RunHooks,
) -> Result<BenchRun, LoadgenError> {
    let schedule = Schedule::new(plan, target);
    let started = std::time::Instant::now();
    let out = send(plan, target, schedule.scripts, hooks.clone()).await?;
    Ok(measure(
        plan,
        target.lora.as_deref(),
        &schedule.taken,
        out,
        started.elapsed(),
    ))
}

/// Sends a plan's scripts: the open loop's in-flight cap, the stop time, `hooks` watching.
async fn send(
    plan: &BenchPlan,
    target: &Connected,
    scripts: Vec<Box<dyn Script>>,
    mut hooks: RunHooks,
) -> Result<driver::DriverOutput, LoadgenError> {
    let max_in_flight = match plan.load {
        Load::Open { max_in_flight, .. } => max_in_flight,
        Load::Closed { .. } => None,
    };
    let bar = hooks.bar.take().unwrap_or_else(ProgressBar::hidden);
    hooks.bar = Some(bar.clone());
    let config = hooks.driver_config(max_in_flight, plan.stop.duration());
    let result = driver::drive(target.endpoint.clone(), scripts, &config).await;
    bar.finish_and_clear();
    result
}
