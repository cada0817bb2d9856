//! The `loadgen replay` flags ([`ReplayArgs`], [`SessionMode`]), their range checks, and the
//! harness settings they give.

use clap::{Args, ValueEnum};

use crate::error::LoadgenError;
use crate::harness::{RunArgs, Settings};
use crate::limits;
use crate::run::target::Api;
use mock_server::args::TraceArgs;

/// `loadgen replay` flags (`mockserve replay`'s trace flags, plus the live ones).
#[derive(Args, Clone, Debug)]
#[command(
    mut_arg("arrival_speedup_ratio", |a| a.help(
        "Divides arrival timestamps and inter-turn delays (10^-6 to 10^6); for an agentic trace, \
         the floors (not_before_ms) and every dependency delay")),
    mut_arg("trace_block_size", |a| a.help("Prompt tokens per trace hash id (1 to 2^20)")),
    mut_arg("allow_long_schedule", |a| a.help(
        "Replay a trace whose schedule, sped up, runs longer than seven days of wall time (the \
         last arrival, or a session's arrival plus its delays): by default such a trace is \
         refused before anything is sent, naming the row past the bound")),
)]
pub struct ReplayArgs {
    /// The trace and how to read it (`mockserve replay`'s flags).
    #[command(flatten)]
    pub trace: TraceArgs,

    /// Replay only the first N rows of the file (like `head -n N`); at least 1.
    #[arg(long)]
    pub max_requests: Option<usize>,

    /// Requests in flight at most, 1 to 100000 (further ones wait; their latency still counts
    /// from their scheduled time). An agentic trace has a cap of 256 without it; a Mooncake
    /// trace has none.
    #[arg(long)]
    pub max_in_flight: Option<usize>,

    /// How session rows relate: auto (detect), cumulative (each row holds the whole prompt) or
    /// incremental (each row holds only the new part; earlier rows are prepended).
    #[arg(long, value_enum, default_value_t = SessionMode::Auto)]
    pub session_mode: SessionMode,

    /// The route requests go to: completions (the trace's prompt as is, the default), chat,
    /// responses or messages (the prompt as one user message, through the server's chat
    /// template: prompts grow by the template's tokens), or embeddings (the prompt embedded: no
    /// output tokens, TTFT is the whole latency).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub endpoint: Api,

    /// Scale the trace's arrival rate over (sped-up) time, open loop: each session's first
    /// arrival is moved, the delays between its turns stay (Mooncake traces only; the same
    /// grammar as `mockserve replay`): diurnal:period=600s,min=0.2,
    /// ramp:from=0.2,to=1,over=300s or steps:0s=1,120s=3,240s=0.5.
    #[arg(long, value_name = "SPEC")]
    pub rate_profile: Option<servesim::autoscale::RateProfile>,

    /// Judge the run as an elastic fleet's, with `mockserve replay --autoscale`'s judge: read
    /// the lifecycle `mockserve fleet --elastic --lifecycle-log PATH` wrote (at the same
    /// speed-up) once the run ends, and add the report's `autoscale` section, in trace time,
    /// against --slo.
    #[arg(long, value_name = "PATH", requires = "slo")]
    pub fleet_lifecycle: Option<std::path::PathBuf>,

    /// Objectives for goodput (the report's `slo` and `goodput`) and for --fleet-lifecycle's
    /// judge, in loadgen bench's grammar: ttft=2000ms,tpot=50ms,e2e=10s; for an agentic trace
    /// also trajectory_e2e=120s (a request meets it when its play completed within it).
    #[arg(long, value_name = "OBJECTIVES")]
    pub slo: Option<servesim::slo::Slo>,

    /// Report files, observers, failure threshold, target and sharding (shard I sends the
    /// trace sessions s with s % N == I, at their unsharded times).
    #[command(flatten)]
    pub run: RunArgs,
}

/// How session rows relate to each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SessionMode {
    /// Detect from the hash ids.
    Auto,
    /// Each row's hash ids hold the whole prompt, history included.
    Cumulative,
    /// Each row's hash ids hold only the new part.
    Incremental,
}

impl ReplayArgs {
    /// Checks every flag's range (and that the report files can be written) before the trace
    /// is read or anything connects.
    pub fn check(&self) -> Result<(), LoadgenError> {
        if self.trace.path.is_none() {
            return Err(LoadgenError::Config(
                "give the TRACE to replay (synthetic load is loadgen bench's)".into(),
            ));
        }
        limits::arrival_speedup(self.trace.arrival_speedup_ratio)?;
        limits::trace_block_size(self.trace.block_size)?;
        if self.max_requests == Some(0) {
            return Err(LoadgenError::OutOfRange {
                flag: "--max-requests".into(),
                got: "0".into(),
                allowed: "at least 1".into(),
            });
        }
        if let Some(n) = self.max_in_flight {
            limits::count("--max-in-flight", n, 1, limits::MAX_CONCURRENCY)?;
        }
        let run = &self.run;
        run.failures.max_failure_rate()?;
        run.observe.check()?;
        run.sharding.check()?;
        limits::output_paths([
            ("--report-json", run.report.report_json.as_deref()),
            (
                "--per-request-jsonl",
                run.report.per_request_jsonl.as_deref(),
            ),
            ("--html", run.observe.html.as_deref()),
        ])
    }
}

/// The harness settings of a live replay.
pub(super) fn settings(args: &ReplayArgs, console: bool) -> Settings<'_> {
    Settings {
        console,
        ..Settings::of(&args.run)
    }
}
