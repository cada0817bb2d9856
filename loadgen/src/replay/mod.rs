//! `loadgen replay TRACE`: a Mooncake trace sent live, on the trace's schedule.
//!
//! The trace is read by `servesim::trace` (the parser, timing normalisation and line-numbered
//! errors of `mockserve replay`). Each session is a driver [`Script`](crate::run::driver::Script): its first turn at the
//! session's (sped-up) arrival time, each later turn its `delay` after the previous turn
//! completed (closed loop), as the offline replay does. Prompts come from `PromptSynth` and go
//! out as raw `/v1/completions` prompts (no chat template: trace blocks stay aligned with KV
//! blocks), with `max_tokens = output_length` and `ignore_eos`.
//!
//! An agentic trace (`--trace-format`, detected as `mockserve replay` detects it) is read into
//! servesim's request graph and sent by `crate::replay::graph_driver`: each node when its dependencies
//! allow (dispatch edges on the source's send, completion edges on its end, plus `delay_ms /
//! speedup`), never before its floor; a failed request fails its play and skips the play's
//! nodes not yet sent. Its prompts are the node's hash ids as the lowering scoped them, sent as
//! they are. The report adds `mockserve replay`'s `agentic` section, from the same code.
//!
//! Sessions: rows are *cumulative* when each row's `hash_ids` extend the previous row's (the row
//! already holds the history; sent as is) or *incremental* when they do not (the row holds only
//! the new part; the previous rows' prompts are prepended). [`session_shape`] decides, the run
//! says which, and the history is never added twice.
//!
//! The modules: `args` holds the flags, `plan` the trace made ready to send (session shape,
//! prompt plans, expected reuse), `sessions` and `agentic` the two kinds of trace in the run
//! harness, `report` what a replay ends as, and `graph_driver` sends a request graph.

mod agentic;
mod args;
mod fleet;
pub(crate) mod graph_driver;
mod plan;
mod report;
mod sessions;

use std::sync::Arc;

use servesim::trace::{self, TraceFormat};

use crate::error::LoadgenError;
use crate::harness;
use crate::run::target::EmbeddedOptions;
pub use agentic::load_graph;
use agentic::replay_graph;
use args::settings;
pub use args::{ReplayArgs, SessionMode};
use plan::{check_prompt_lengths, expected_reuse};
pub use plan::{load_trace, plans, session_shape, PromptPlan, SessionShape};
pub use report::ReplayRun;
use sessions::SessionsMode;

/// Runs `loadgen replay`: prints the report and writes the requested files; with `--num-runs K`
/// the first run's report ([`replay_runs`] returns them all). The failure-rate
/// verdict is the caller's
/// ([`LiveReport::verdict`](crate::report::replay_report::LiveReport::verdict);
/// [`crate::run_async`] applies it).
pub async fn replay(args: &ReplayArgs) -> Result<ReplayRun, LoadgenError> {
    harness::first(replay_runs(args).await?)
}

/// Runs `loadgen replay` `--num-runs` times (the same schedule each time): every run, in order
/// (at least one), after printing each and the aggregate and writing the files.
pub async fn replay_runs(args: &ReplayArgs) -> Result<Vec<ReplayRun>, LoadgenError> {
    replay_with(args, true).await
}

/// The run's pass/fail verdict: fails when every request failed or the failure share is above
/// `--max-failure-rate`, or when the server fell behind by more than `--max-server-lateness`.
pub fn verdict(run: &ReplayRun, args: &ReplayArgs) -> Result<(), LoadgenError> {
    run.live.verdict(args.run.failures.max_failure_rate)?;
    crate::observe::lateness_verdict(run.server_lateness, &args.run.observe)
}

/// Runs a live replay `--num-runs` times; `console` says whether it prints (a sweep's points
/// do not). The report files of `args` are written either way.
pub(crate) async fn replay_with(
    args: &ReplayArgs,
    console: bool,
) -> Result<Vec<ReplayRun>, LoadgenError> {
    args.check()?;
    let format = trace::detect_format(args.trace.file(), args.trace.format)?;
    if format != TraceFormat::Mooncake {
        if args.rate_profile.is_some() {
            return Err(LoadgenError::Config(format!(
                "--rate-profile applies to Mooncake traces; {} is an agentic trace",
                args.trace.file().display()
            )));
        }
        return replay_graph(args, format, console).await;
    }
    if let Some(slo) = &args.slo {
        slo.check_trajectories(
            false,
            &format!("the plain Mooncake trace {}", args.trace.file().display()),
        )
        .map_err(|e| LoadgenError::Config(e.to_string()))?;
    }
    if args.trace.agentic_lanes.is_some() {
        return Err(LoadgenError::Config(format!(
            "--agentic-lanes needs an agentic trace; {} is plain Mooncake",
            args.trace.file().display()
        )));
    }
    let trace = load_trace(args)?;
    harness::repeat::check_records(
        args.run.runs.num_runs,
        trace.num_requests(),
        "the trace's requests",
    )?;
    let spec = args.run.spec(&EmbeddedOptions::default())?;
    let shape = session_shape(&trace, args.trace.block_size);
    let mode = match args.session_mode {
        SessionMode::Auto => shape.detected(),
        m => m,
    };
    if console {
        crate::stdout::outln!(
            "Trace {}: {} requests in {} sessions; {}",
            args.trace.file().display(),
            trace.num_requests(),
            trace.sessions.len(),
            shape.describe()
        );
        if args.session_mode != SessionMode::Auto {
            crate::stdout::outln!("Session mode forced: {mode:?}");
        }
    }
    let plans = plans(&trace, mode);
    check_prompt_lengths(&trace, &plans, &args.trace.file().display().to_string())?;
    let expected = expected_reuse(&trace, &plans, args.trace.block_size);
    let sessions = SessionsMode {
        args,
        spec: &spec,
        console,
        session_mode: mode,
        trace: Arc::new(trace),
        plans: Arc::new(plans),
        expected,
        owned: Vec::new(),
        lora: None,
    };
    harness::execute_runs(sessions, &spec, &settings(args, console)).await
}
