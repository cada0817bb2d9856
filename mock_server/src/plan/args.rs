//! The command line of `mockserve plan TRACE --space SPACE.toml --slo ...` (the configuration
//! search) and of `mockserve plan merge LEDGER... --report-json R.json`.
//!
//! Every `mockserve replay` flag is accepted as a fixed value: the plan's command is the replay
//! command with `--perf-profile` made repeatable (`NAME=PATH:GPUS`), `--report-json` and
//! `--quiet` taken over by the plan, and the search flags added. The fixed flags are kept as the
//! strings given, and each candidate's replay is parsed from them as `mockserve replay` would.
//!
//! The input is a TRACE or synthetic load (`--request-rate` and the other `loadgen bench`
//! flags, [`crate::synthetic`]): the synthetic flags are replay flags, kept among the fixed
//! ones, so every printed command carries them; without `--arrival-speedup-ratio` the plan adds
//! `--arrival-speedup-ratio 1` (the rate as given) so that the commands reproduce it.

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches};
use servesim::slo::Slo;
use servesim::trace::{self, ScheduleBound, Trace, TraceFormat};

use super::PlanError;
use crate::cmd::replay::ReplayArgs;
use crate::synthetic::SyntheticArgs;

/// The plan's own flags (besides the replay's).
#[derive(Args, Clone, Debug)]
pub struct SearchArgs {
    /// The search space: a TOML file whose keys are `mockserve replay` flag names with
    /// underscores, each a list or `{min, max, step}`; a `[disaggregated]` table adds
    /// disaggregated candidates; a `[constraints]` table holds `max_gpus`.
    #[arg(long, value_name = "SPACE.toml")]
    pub space: PathBuf,

    /// Per-request bounds (the replay's `--slo` flag, read by the plan: see [`PlanArgs`]).
    #[arg(skip)]
    pub slo: Slo,

    /// goodput-per-gpu, goodput, fewest-gpus (at the trace's rate) or pareto (goodput per
    /// GPU against tokens/s per user).
    #[arg(long, default_value = "goodput-per-gpu")]
    pub objective: super::Objective,

    /// Share of requests that must meet every bound (0 to 1): candidates below it are ranked
    /// after those that reach it, and it defines the highest speed-up; 0.9 when not given.
    #[arg(long, value_name = "Q")]
    pub attainment: Option<f64>,

    /// grid (every candidate), random (--max-trials seeded draws) or halving (successive
    /// halving on growing trace prefixes).
    #[arg(long, default_value = "grid")]
    pub strategy: super::Strategy,

    /// The trial ledger (JSON lines), appended to as trials finish; a rerun skips the trials
    /// it already holds.
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,

    /// Candidates to try at most (random: the draws; halving: the first round); a space over
    /// the cap of 20,000 needs it.
    #[arg(long, value_name = "N")]
    pub max_trials: Option<usize>,

    /// Run every replay to the end, even once its SLO is lost. By default a step of the
    /// speed-up search, and with --attainment or fewest-gpus a trial, stops as soon as more
    /// requests have missed the SLOs than the attainment allows (a stopped trial is recorded
    /// without figures).
    #[arg(long)]
    pub no_early_stop: bool,

    /// Parallel trials [default: the cores available].
    #[arg(long, short = 'j', value_name = "N")]
    pub jobs: Option<usize>,

    /// Candidates in the console table and the report's `top`.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub top: usize,

    /// Bisection steps of the highest arrival speed-up meeting the SLOs, per candidate
    /// (0: not measured).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub speedup_steps: u32,

    /// Run shard I of N (0-based): candidate k belongs to shard k mod N; merge the ledgers
    /// with `mockserve plan merge`.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<super::Shard>,

    /// Write the ranking and the Pareto front as a self-contained HTML page.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,

    /// Check the best candidate live: `loadgen replay` (found beside this executable) sends the
    /// trace over HTTP to mockserve on 127.0.0.1 with the candidate's flags, at
    /// --verify-speedup, and the report's `verify` puts the measured SLO attainment and
    /// percentiles beside the offline replay's at the same speed-up.
    #[arg(long)]
    pub verify: bool,

    /// How many times faster than the candidate's replay the live check runs: on loopback its
    /// arrivals and its engine (--speedup-ratio) both, against --url its arrivals only; the
    /// prediction is the offline replay of the same flags.
    #[arg(long, default_value_t = 10.0, value_name = "S", requires = "verify")]
    pub verify_speedup: f64,

    /// With --verify: measure this deployment (an OpenAI-compatible base URL) instead of
    /// standing the candidate up on loopback; the difference is the prediction's error there.
    #[arg(long, value_name = "URL", requires = "verify")]
    pub url: Option<String>,

    /// With --verify: the longest the live run may take, in seconds; past it, loadgen is
    /// killed and the check fails.
    #[arg(
        long,
        default_value_t = 1800,
        value_name = "SECONDS",
        requires = "verify"
    )]
    pub verify_timeout_s: u64,
}

/// `mockserve plan merge`: the shards' ledgers into one report.
#[derive(Args, Clone, Debug)]
pub struct MergeArgs {
    /// The shards' ledgers.
    #[arg(required = true, value_name = "LEDGER")]
    pub ledgers: Vec<PathBuf>,

    /// Write the report as JSON.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<PathBuf>,

    /// Write the ranking and the front as HTML.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,

    /// Write the merged ledger (trials in candidate order).
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,

    /// Candidates in the console table and the report's `top`.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub top: usize,
}

/// `mockserve plan`: a search, or a merge of shards.
#[derive(Clone, Debug)]
pub enum PlanArgs {
    /// A search over a trace.
    Search(Box<SearchCommand>),
    /// A merge of shard ledgers.
    Merge(MergeArgs),
}

/// A search: the trace, the fixed replay flags as given, the profiles, and the search flags.
#[derive(Clone, Debug)]
pub struct SearchCommand {
    /// The trace as given (None: synthetic load, its flags among the fixed ones).
    pub trace: Option<PathBuf>,
    /// Every replay flag given on the command line, as `--flag [value]` strings, in the
    /// replay command's flag order.
    pub fixed: Vec<String>,
    /// `--perf-profile` values as given (`NAME=PATH:GPUS` or `PATH`).
    pub profiles: Vec<String>,
    /// The plan's report file.
    pub report_json: Option<PathBuf>,
    /// No progress bar.
    pub quiet: bool,
    /// The search flags.
    pub search: SearchArgs,
}

/// Replay flags that a search cannot take (they describe one run's outputs).
const NOT_FIXED: &[&str] = &["per_request_jsonl", "kv_events_jsonl", "iterations"];

/// The replay's elastic-fleet flags: a candidate is a static fleet, so a search refuses them
/// (and its `--help` hides them).
const ELASTIC: &[&str] = &[
    "autoscale",
    "min_workers",
    "max_workers",
    "model_load",
    "model_load_jitter",
    "autoscale_tick",
    "scrape_delay",
    "autoscale_timeout",
    "no_oracle",
    "autoscale_isl",
    "autoscale_osl",
];

/// The replay command's arguments, by id.
fn replay_command() -> Command {
    ReplayArgs::augment_args(Command::new("replay"))
}

impl Args for PlanArgs {
    fn augment_args(cmd: Command) -> Command {
        let cmd = ELASTIC
            .iter()
            .fold(ReplayArgs::augment_args(cmd), |cmd, id| {
                cmd.mut_arg(*id, |a| a.hide(true))
            })
            .mut_arg("perf_profile", |a| {
                a.action(ArgAction::Append)
                    .value_name("NAME=PATH:GPUS")
                    .help(
                        "A latency profile, repeatable: NAME=PATH:GPUS names it (for the space's \
                         perf_profile key) with the GPUs one worker uses; a bare PATH is its \
                         file stem on 1 GPU",
                    )
            })
            // The replay's `--slo` (its autoscale judge's objectives) is the plan's SLO: it is
            // read into the search flags, never passed to the candidates' replays.
            .mut_arg("slo", |a| {
                a.value_name("SLO").help(
                    "Per-request bounds in loadgen's --slo grammar, e.g. ttft=2000ms,tpot=50ms \
                     (ttft, itl or tpot, e2e, and for agentic traces trajectory_e2e: a request \
                     meets it when its play completed within the bound; units us, ms, s)",
                )
            })
            .mut_arg("report_json", |a| {
                a.help("Write the plan's report (best, ranking, pareto, trials) as JSON")
            });
        SearchArgs::augment_args(cmd)
            .subcommand(MergeArgs::augment_args(Command::new("merge").about(
                "Merge shard ledgers into one report, the same bytes as an unsharded run",
            )))
            .args_conflicts_with_subcommands(true)
            .subcommand_negates_reqs(true)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for PlanArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        if let Some(("merge", sub)) = m.subcommand() {
            return Ok(PlanArgs::Merge(MergeArgs::from_arg_matches(sub)?));
        }
        let mut search = SearchArgs::from_arg_matches(m)?;
        if let Some(slo) = m.get_one::<Slo>("slo") {
            search.slo = *slo;
        }
        if search.verify && search.slo.trajectory_e2e_ms.is_some() {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "--verify measures the live requests one by one, not their plays: it cannot \
                 check --slo trajectory_e2e; verify without it, or compare with loadgen replay \
                 --slo\n",
            ));
        }
        let synthetic = SyntheticArgs::from_arg_matches(m)?.is_given();
        if synthetic && search.verify {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::ArgumentConflict,
                "--verify replays the TRACE live through loadgen replay; with synthetic load, \
                 check the best candidate with loadgen bench and the same load flags\n",
            ));
        }
        let raw = |id: &str| -> Vec<String> {
            m.get_raw(id)
                .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
                .unwrap_or_default()
        };
        let trace = raw("trace").into_iter().next().map(PathBuf::from);
        let mut fixed = Vec::new();
        for arg in replay_command().get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(
                id,
                "trace" | "perf_profile" | "report_json" | "quiet" | "slo"
            ) || m.value_source(id) != Some(ValueSource::CommandLine)
            {
                continue;
            }
            let Some(long) = arg.get_long() else {
                continue;
            };
            if ELASTIC.contains(&id) {
                return Err(clap::Error::raw(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "--{long} scales one replay's fleet; `mockserve plan` searches static \
                         fleets (num_workers, or num_prefill_workers and num_decode_workers in \
                         the space): judge an autoscaler with mockserve replay --autoscale\n"
                    ),
                ));
            }
            if NOT_FIXED.contains(&id) {
                return Err(clap::Error::raw(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "--{long} describes one replay's output; `mockserve plan` prints the \
                         replay command of each candidate, run it with --{long}\n"
                    ),
                ));
            }
            if arg.get_action().takes_values() {
                for value in raw(id) {
                    fixed.push(format!("--{long}"));
                    fixed.push(value);
                }
            } else {
                fixed.push(format!("--{long}"));
            }
        }
        if synthetic && m.value_source("arrival_speedup_ratio") != Some(ValueSource::CommandLine) {
            fixed.push("--arrival-speedup-ratio".into());
            fixed.push("1".into());
        }
        Ok(PlanArgs::Search(Box::new(SearchCommand {
            trace,
            fixed,
            profiles: raw("perf_profile"),
            report_json: m.get_one::<PathBuf>("report_json").cloned(),
            quiet: m.get_flag("quiet"),
            search,
        })))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// Checks the plan's input against its SLO: exactly one of TRACE and synthetic load, and a
/// `trajectory_e2e` bound only for an agentic trace (refused, naming `--slo`, for a plain
/// Mooncake trace or synthetic load, which have no trajectories).
pub fn check_input(slo: &Slo, replay: &ReplayArgs) -> Result<(), PlanError> {
    let flag = |e: String| PlanError::Flag(e);
    replay
        .synthetic
        .load(replay.trace.path.is_some(), replay.engine.seed)
        .map_err(|e| flag(e.to_string()))?;
    let (has_trajectories, input) = match &replay.trace.path {
        None => (false, "synthetic load".to_string()),
        Some(path) => {
            let format =
                trace::detect_format(path, replay.trace.format).map_err(|e| flag(e.to_string()))?;
            (
                format != TraceFormat::Mooncake,
                format!("the plain Mooncake trace {}", path.display()),
            )
        }
    };
    slo.check_trajectories(has_trajectories, &input)
        .map_err(|e| flag(e.to_string()))
}

/// The synthetic trace of a candidate's replay flags (None: it reads its TRACE), cut to its
/// first `prefix` requests when given; its arrivals divided by `--arrival-speedup-ratio`.
pub fn synthetic_trace(args: &ReplayArgs, prefix: Option<usize>) -> Result<Option<Trace>, String> {
    let Some(load) = args
        .synthetic
        .load(args.trace.path.is_some(), args.engine.seed)
        .map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    let bound = ScheduleBound::of_flag(args.trace.allow_long_schedule);
    let mut trace = load
        .trace(
            args.engine.block_size,
            args.trace.arrival_speedup_ratio,
            bound,
        )
        .map_err(|e| e.to_string())?;
    if let Some(k) = prefix {
        trace.sessions.truncate(k);
    }
    Ok(Some(trace))
}

/// What a loaded trace depends on beyond the trace flags: the synthetic load's flags, seed and
/// block size (empty for a trace file).
pub fn input_key(args: &ReplayArgs) -> String {
    if args.synthetic.is_given() {
        format!(
            "{:?} seed {} block {}",
            args.synthetic.flags, args.engine.seed, args.engine.block_size
        )
    } else {
        String::new()
    }
}

/// Prompt tokens per hash id of the replayed trace: the engine's block size for synthetic load
/// (its shared prefixes are whole KV blocks), else `--trace-block-size`.
pub fn trace_block_size(args: &ReplayArgs) -> usize {
    if args.synthetic.is_given() {
        args.engine.block_size
    } else {
        args.trace.block_size
    }
}
