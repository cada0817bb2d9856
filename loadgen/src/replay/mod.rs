//! `loadgen replay TRACE`: a Mooncake trace sent live, on the trace's schedule.
//!
//! The trace is read by `servesim::trace` (the parser, timing normalisation and line-numbered
//! errors of `mockserve replay`). Each session is a driver [`Script`]: its first turn at the
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

pub(crate) mod graph_driver;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::json;
use servesim::replay::{summarize, AgenticReport, GraphTimes};
use servesim::trace::{self, RequestGraph, Trace, TraceFormat, TraceOptions, TraceRequest};

use crate::error::LoadgenError;
use crate::limits;
use crate::observe::Observed;
use crate::report::replay_report::{self, LiveReport, RequestInfo};
use crate::run::client::Response;
use crate::run::driver::{self, Planned, RunHooks, Script, Start};
use crate::run::prompt::PromptSynth;
use crate::run::target::{request_body, Api, Connected, EmbeddedOptions};
use crate::run::{self, Mode, Report, RunArgs, Settings};
use graph_driver::GraphPlan;
use mock_server::args::{ReportArgs, TraceArgs};

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
    /// from their scheduled time).
    #[arg(long)]
    pub max_in_flight: Option<usize>,

    /// How session rows relate: auto (detect), cumulative (each row holds the whole prompt) or
    /// incremental (each row holds only the new part; earlier rows are prepended).
    #[arg(long, value_enum, default_value_t = SessionMode::Auto)]
    pub session_mode: SessionMode,

    /// The route requests go to: completions (the trace's prompt as is, the default) or chat
    /// (the prompt as one user message, through the server's chat template: prompts grow by
    /// the template's tokens).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub endpoint: Api,

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

/// What the rows of a trace's multi-turn sessions look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionShape {
    /// Consecutive row pairs whose later row extends the earlier one's hash ids.
    pub cumulative_pairs: usize,
    /// Other consecutive pairs.
    pub incremental_pairs: usize,
}

impl SessionShape {
    /// The mode `auto` resolves to: incremental only when no pair is cumulative.
    pub fn detected(&self) -> SessionMode {
        if self.incremental_pairs > 0 && self.cumulative_pairs == 0 {
            SessionMode::Incremental
        } else {
            SessionMode::Cumulative
        }
    }

    /// One line for the console.
    pub(crate) fn describe(&self) -> String {
        match (self.cumulative_pairs, self.incremental_pairs) {
            (0, 0) => "no multi-turn sessions".into(),
            (c, 0) => format!("sessions are cumulative ({c} of {c} follow-up rows extend the previous row's hash ids): rows sent as they are"),
            (0, i) => format!("sessions are incremental (none of {i} follow-up rows extends the previous row's hash ids): earlier rows are prepended"),
            (c, i) => format!("sessions are mixed ({c} follow-up rows extend the previous row, {i} do not): rows sent as they are (cumulative)"),
        }
    }
}

/// Classifies every consecutive pair of rows within each session. A later, longer row extends
/// the earlier one when it starts with all its hash ids, or with at least one full block's and
/// all but a last one that labels a partial block (of `trace_block_size` tokens), as `loadgen
/// trace convert` writes them.
pub fn session_shape(trace: &Trace, trace_block_size: usize) -> SessionShape {
    let mut shape = SessionShape {
        cumulative_pairs: 0,
        incremental_pairs: 0,
    };
    for s in &trace.sessions {
        for w in s.turns.windows(2) {
            let full = w[0]
                .hash_ids
                .len()
                .min(w[0].input_length / trace_block_size.max(1));
            let extends = w[1].hash_ids.starts_with(&w[0].hash_ids)
                || (full > 0
                    && w[1].input_length > w[0].input_length
                    && w[1].hash_ids.starts_with(&w[0].hash_ids[..full]));
            if w[1].hash_ids.len() >= w[0].hash_ids.len() && extends {
                shape.cumulative_pairs += 1;
            } else {
                shape.incremental_pairs += 1;
            }
        }
    }
    shape
}

/// Prompt of one request: (hash ids, tokens) segments concatenated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptPlan {
    /// Segments, each `input_length` tokens of its hash ids' blocks.
    pub segments: Vec<(Vec<u64>, usize)>,
}

impl PromptPlan {
    /// Total tokens.
    pub(crate) fn len(&self) -> usize {
        self.segments.iter().map(|(_, n)| n).sum()
    }

    /// The text.
    pub(crate) fn text(&self, synth: &PromptSynth) -> String {
        self.segments
            .iter()
            .map(|(ids, n)| synth.prompt(ids, *n))
            .collect()
    }

    /// Hash ids in prompt order (block-level identity, for the expected reuse).
    fn ids(&self) -> Vec<u64> {
        self.segments
            .iter()
            .flat_map(|(ids, _)| ids.iter().copied())
            .collect()
    }
}

/// Every request's prompt plan, per session and turn, for `mode` (already resolved).
pub fn plans(trace: &Trace, mode: SessionMode) -> Vec<Vec<PromptPlan>> {
    trace
        .sessions
        .iter()
        .map(|s| {
            let mut history: Vec<(Vec<u64>, usize)> = Vec::new();
            s.turns
                .iter()
                .map(|t: &TraceRequest| {
                    let own = (t.hash_ids.clone(), t.input_length);
                    match mode {
                        SessionMode::Incremental => {
                            history.push(own);
                            PromptPlan {
                                segments: history.clone(),
                            }
                        }
                        _ => PromptPlan {
                            segments: vec![own],
                        },
                    }
                })
                .collect()
        })
        .collect()
}

/// Expected prefix reuse with an unbounded cache: per request (session, turn order) the tokens
/// of its leading blocks whose hash-id prefix an earlier request (in approximate arrival order:
/// session start plus delays) already had, capped at the prompt length.
pub(crate) fn expected_reuse(
    trace: &Trace,
    plans: &[Vec<PromptPlan>],
    block: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    for (si, s) in trace.sessions.iter().enumerate() {
        let mut t = s.first_arrival.0;
        for (ti, turn) in s.turns.iter().enumerate() {
            t += turn.delay.0;
            order.push((t, si, ti));
        }
    }
    order.sort();
    let mut seen = SeenPrefixes::default();
    let mut out: Vec<Vec<usize>> = plans.iter().map(|p| vec![0; p.len()]).collect();
    for (_, si, ti) in order {
        let plan = &plans[si][ti];
        out[si][ti] = seen.add(plan.ids(), plan.len(), block);
    }
    out
}

/// Hash-id prefixes of the prompts sent so far (an unbounded prefix cache).
#[derive(Default)]
struct SeenPrefixes {
    /// Chained hashes of every prefix seen.
    seen: HashSet<u64>,
}

impl SeenPrefixes {
    /// Adds a prompt (`ids`, `len` tokens, `block` tokens per id); returns its tokens whose
    /// hash-id prefix was seen before, capped at `len`.
    fn add(&mut self, ids: impl IntoIterator<Item = u64>, len: usize, block: usize) -> usize {
        let mut chain = 0xcbf2_9ce4_8422_2325u64;
        let mut hit_blocks = 0;
        let mut prefix_intact = true;
        for id in ids {
            chain = xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), chain);
            if prefix_intact && self.seen.contains(&chain) {
                hit_blocks += 1;
            } else {
                prefix_intact = false;
            }
            self.seen.insert(chain);
        }
        (hit_blocks * block).min(len)
    }
}

/// One session as a driver script.
struct SessionScript {
    trace: Arc<Trace>,
    plans: Arc<Vec<Vec<PromptPlan>>>,
    synth: Arc<PromptSynth>,
    model: Arc<str>,
    api: Api,
    /// Whether bodies ask for the serving worker.
    ask_worker_id: bool,
    session: usize,
    next_turn: usize,
}

impl Script for SessionScript {
    fn first_start(&self) -> Duration {
        Duration::from_micros(self.trace.sessions[self.session].first_arrival.0)
    }

    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let s = &self.trace.sessions[self.session];
        let turn = s.turns.get(self.next_turn)?;
        let start = if self.next_turn == 0 {
            Start::At(self.first_start())
        } else {
            Start::After(Duration::from_micros(turn.delay.0))
        };
        let text = self.plans[self.session][self.next_turn].text(&self.synth);
        self.next_turn += 1;
        Some(Planned {
            start,
            body: request_body(
                self.api,
                &self.model,
                text,
                turn.output_length,
                self.ask_worker_id,
            ),
        })
    }
}

impl ReplayArgs {
    /// Checks every flag's range (and that the report files can be written) before the trace
    /// is read or anything connects.
    pub fn check(&self) -> Result<(), LoadgenError> {
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

/// Every prompt of `plans` (incremental sessions repeat their history) is at most
/// `limits::MAX_PROMPT_TOKENS`; the error names the trace line of the first that is not.
pub(crate) fn check_prompt_lengths(
    trace: &Trace,
    plans: &[Vec<PromptPlan>],
    source_name: &str,
) -> Result<(), LoadgenError> {
    for (session, turns) in trace.sessions.iter().zip(plans) {
        for (turn, plan) in session.turns.iter().zip(turns) {
            if plan.len() > limits::MAX_PROMPT_TOKENS {
                return Err(LoadgenError::Trace(trace::TraceError::Line {
                    source_name: source_name.to_string(),
                    line: turn.line,
                    message: format!(
                        "with the earlier rows of session \"{}\" prepended (incremental), the \
                         prompt is {} tokens, more than the {} loadgen sends",
                        session.id,
                        plan.len(),
                        limits::MAX_PROMPT_TOKENS
                    ),
                }));
            }
        }
    }
    Ok(())
}

/// Loads the trace (the first `max_requests` rows when given), its schedule bounded unless
/// `--allow-long-schedule`.
pub fn load_trace(args: &ReplayArgs) -> Result<Trace, LoadgenError> {
    let options = TraceOptions {
        trace_block_size: args.trace.block_size,
        arrival_speedup_ratio: args.trace.arrival_speedup_ratio,
    };
    let bound = trace::ScheduleBound::of_flag(args.trace.allow_long_schedule);
    let name = args.trace.path.display().to_string();
    let trace = match args.max_requests {
        None => trace::load_with_bound(&args.trace.path, &options, bound)?,
        Some(n) => {
            let text =
                std::fs::read_to_string(&args.trace.path).map_err(|source| LoadgenError::Io {
                    path: args.trace.path.clone(),
                    source,
                })?;
            let mut kept = 0usize;
            let mut end = 0usize;
            for line in text.split_inclusive('\n') {
                if kept == n {
                    break;
                }
                if !line.trim().is_empty() {
                    kept += 1;
                }
                end += line.len();
            }
            trace::parse_with_bound(std::io::Cursor::new(&text[..end]), &name, &options, bound)?
        }
    };
    Ok(trace)
}

/// The outcome of a live replay.
#[derive(Debug)]
pub struct ReplayRun {
    /// The report.
    pub live: LiveReport,
    /// The session mode used.
    pub session_mode: SessionMode,
    /// Σ expected reused tokens / Σ prompt tokens.
    pub expected_prefix_reuse_ratio: f64,
    /// Prompts whose length the server counted otherwise than the trace's `input_length`.
    pub prompt_length_mismatches: usize,
    /// The report JSON as written.
    pub json: serde_json::Value,
    /// How late the server handed its tokens to clients, when it said.
    pub server_lateness: Option<crate::observe::scrape::Lateness>,
    /// For an agentic trace: the plays' outcomes and every node's times (µs since the run
    /// start), as `mockserve replay` reports them.
    pub agentic: Option<AgenticReport>,
}

/// Runs `loadgen replay`: prints the report and writes the requested files. The failure-rate
/// verdict is the caller's ([`LiveReport::verdict`]; [`crate::run_async`] applies it).
pub async fn replay(args: &ReplayArgs) -> Result<ReplayRun, LoadgenError> {
    replay_with(args, true).await
}

/// Runs a live replay; `console` says whether it prints (a sweep's points do not). The
/// report files of `args` are written either way.
pub(crate) async fn replay_with(
    args: &ReplayArgs,
    console: bool,
) -> Result<ReplayRun, LoadgenError> {
    args.check()?;
    let format = trace::detect_format(&args.trace.path, args.trace.format)?;
    if format != TraceFormat::Mooncake {
        return replay_graph(args, format, console).await;
    }
    if args.trace.agentic_lanes.is_some() {
        return Err(LoadgenError::Config(format!(
            "--agentic-lanes needs an agentic trace; {} is plain Mooncake",
            args.trace.path.display()
        )));
    }
    let trace = load_trace(args)?;
    let spec = args.run.target.spec(&EmbeddedOptions::default())?;
    let shape = session_shape(&trace, args.trace.block_size);
    let mode = match args.session_mode {
        SessionMode::Auto => shape.detected(),
        m => m,
    };
    if console {
        println!(
            "Trace {}: {} requests in {} sessions; {}",
            args.trace.path.display(),
            trace.num_requests(),
            trace.sessions.len(),
            shape.describe()
        );
        if args.session_mode != SessionMode::Auto {
            println!("Session mode forced: {mode:?}");
        }
    }
    let plans = plans(&trace, mode);
    check_prompt_lengths(&trace, &plans, &args.trace.path.display().to_string())?;
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
    };
    run::execute(sessions, &spec, &settings(args, console)).await
}

/// The harness settings of a live replay.
fn settings(args: &ReplayArgs, console: bool) -> Settings<'_> {
    Settings {
        console,
        ..Settings::of(&args.run)
    }
}

/// A Mooncake trace's sessions in the harness: one driver script per session this process
/// owns.
struct SessionsMode<'a> {
    args: &'a ReplayArgs,
    spec: &'a crate::run::target::TargetSpec,
    console: bool,
    session_mode: SessionMode,
    trace: Arc<Trace>,
    plans: Arc<Vec<Vec<PromptPlan>>>,
    /// Expected reused tokens, by session then turn.
    expected: Vec<Vec<usize>>,
    /// The sessions this process sends, by global index (all of them unsharded).
    owned: Vec<usize>,
}

impl Mode for SessionsMode<'_> {
    type Schedule = Vec<Box<dyn Script>>;
    type Driven = driver::DriverOutput;
    type Run = ReplayRun;

    fn api(&self) -> Api {
        self.args.endpoint
    }

    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Vec<Box<dyn Script>>, Option<usize>), LoadgenError> {
        let args = self.args;
        let synth = Arc::new(target.synth(args.trace.block_size));
        if self.console {
            println!("{}", prompts_line(args, &synth, args.trace.block_size));
        }
        let trace = &self.trace;
        let shard = args.run.sharding.shard;
        self.owned = (0..trace.sessions.len())
            .filter(|&s| shard.is_none_or(|sh| sh.owns(s)))
            .collect();
        if let (Some(sh), true) = (shard, self.console) {
            println!(
                "Shard {}/{}: {} of the {} sessions",
                sh.index,
                sh.count,
                self.owned.len(),
                trace.sessions.len()
            );
        }
        let total = self
            .owned
            .iter()
            .map(|&s| trace.sessions[s].turns.len())
            .sum::<usize>();
        let model: Arc<str> = Arc::from(target.model.as_str());
        let scripts = self
            .owned
            .iter()
            .map(|&session| {
                Box::new(SessionScript {
                    trace: trace.clone(),
                    plans: self.plans.clone(),
                    synth: synth.clone(),
                    model: model.clone(),
                    api: args.endpoint,
                    ask_worker_id: target.ask_worker_id,
                    session,
                    next_turn: 0,
                }) as Box<dyn Script>
            })
            .collect();
        Ok((scripts, Some(total)))
    }

    async fn drive(
        &mut self,
        scripts: Vec<Box<dyn Script>>,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<driver::DriverOutput, LoadgenError> {
        let config = hooks.driver_config(self.args.max_in_flight, None);
        driver::drive(target.endpoint.clone(), scripts, &config).await
    }

    fn report(
        &mut self,
        mut out: driver::DriverOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<ReplayRun, LoadgenError> {
        let args = self.args;
        // Local session j ran global session owned[j]: records carry the global index.
        for s in &mut out.samples {
            s.session = self.owned[s.session];
        }
        let infos: Vec<Vec<RequestInfo>> = self
            .trace
            .sessions
            .iter()
            .enumerate()
            .map(|(si, s)| {
                s.turns
                    .iter()
                    .enumerate()
                    .map(|(ti, t)| RequestInfo {
                        input_length: self.plans[si][ti].len(),
                        max_output: t.output_length,
                        session: Some(s.id.clone()),
                        turn: ti,
                        expected_reused_tokens: Some(self.expected[si][ti]),
                    })
                    .collect()
            })
            .collect();
        let items: Vec<_> = out
            .samples
            .iter()
            .map(|s| (s, &infos[s.session][s.turn]))
            .collect();
        let mut live = replay_report::build(&items, wall);
        live.set_started_at(out.started_at);
        let mode = format!("{:?}", self.session_mode).to_lowercase();
        let config = json!({
            "mode": "replay",
            "trace": args.trace.path.display().to_string(),
            "endpoint": args.endpoint.name(),
            "arrival_speedup_ratio": args.trace.arrival_speedup_ratio,
            "trace_block_size": args.trace.block_size,
            "max_requests": args.max_requests,
            "max_in_flight": args.max_in_flight,
            "session_mode": mode,
            "target": self.spec.describe(),
        });
        let keys = ReplayKeys {
            first: ("session_mode", json!(mode)),
            arrival_speedup_ratio: args.trace.arrival_speedup_ratio,
            trace_block_size: args.trace.block_size,
            config,
        };
        Ok(keys.run(
            live,
            &items,
            None,
            self.session_mode,
            args.run.sharding.shard,
            observed,
        ))
    }
}

/// The "Prompts:" line of a live replay.
fn prompts_line(args: &ReplayArgs, synth: &PromptSynth, block_size: usize) -> String {
    format!(
        "Prompts: {} tokens per hash id, {} ({})",
        block_size,
        if synth.is_exact() {
            "exact"
        } else {
            "approximate: ~1 lorem word per token"
        },
        if args.run.target.url.is_some() {
            "target"
        } else {
            "embedded server's tokenizer"
        }
    )
}

/// The keys a live replay's report adds to the live report's, and its `config`.
struct ReplayKeys {
    /// `session_mode` (Mooncake) or `trace_format` (agentic).
    first: (&'static str, serde_json::Value),
    arrival_speedup_ratio: f64,
    trace_block_size: usize,
    config: serde_json::Value,
}

impl ReplayKeys {
    /// The finished replay: the prefix reuse the trace predicts and the server reported, the
    /// report JSON with the observers' series, `config` and the shard.
    fn run(
        self,
        mut live: LiveReport,
        items: &[(&crate::run::driver::Sample, &RequestInfo)],
        agentic: Option<AgenticReport>,
        session_mode: SessionMode,
        shard: Option<crate::run::shard::Shard>,
        observed: &Observed,
    ) -> ReplayRun {
        live.set_shard(shard);
        let ok =
            |(s, _): &&(&crate::run::driver::Sample, &RequestInfo)| s.response.failure.is_none();
        let expected_total: usize = items
            .iter()
            .filter(ok)
            .filter_map(|(_, i)| i.expected_reused_tokens)
            .sum();
        let input_total: usize = items.iter().filter(ok).map(|(_, i)| i.input_length).sum();
        let expected_ratio = if input_total > 0 {
            expected_total as f64 / input_total as f64
        } else {
            0.0
        };
        let mismatched = items
            .iter()
            .filter(|(s, i)| {
                s.response
                    .prompt_tokens
                    .is_some_and(|p| p as usize != i.input_length)
            })
            .count();
        let mut keys = vec![
            self.first,
            ("expected_prefix_reuse_ratio", json!(expected_ratio)),
            (
                "observed_prefix_reuse_ratio",
                json!(live.report.prefix_cache_reused_ratio),
            ),
            ("prompt_length_mismatches", json!(mismatched)),
            ("arrival_speedup_ratio", json!(self.arrival_speedup_ratio)),
            ("trace_block_size", json!(self.trace_block_size)),
        ];
        if let Some(agentic) = &agentic {
            keys.push((
                "agentic",
                serde_json::to_value(agentic).unwrap_or(serde_json::Value::Null),
            ));
        }
        let mut json = live.to_json(&keys);
        observed.annotate(&mut json, &live, Some(self.config));
        crate::run::shard::annotate(&mut json, shard);
        ReplayRun {
            live,
            session_mode,
            expected_prefix_reuse_ratio: expected_ratio,
            prompt_length_mismatches: mismatched,
            json,
            server_lateness: observed.lateness(),
            agentic,
        }
    }
}

impl Report for ReplayRun {
    fn console_text(&self) -> String {
        let mut s = String::from("Live replay report\n");
        s.push_str(&self.live.report_lines());
        if let Some(agentic) = &self.agentic {
            s.push_str(&mock_server::cmd::replay::agentic_summary(agentic));
        }
        s.push_str(&format!(
            "Prefix reuse: expected from the trace's hash ids {:.4}, reported by the server \
             (cached_tokens) {:.4}\n",
            self.expected_prefix_reuse_ratio, self.live.report.prefix_cache_reused_ratio
        ));
        if self.prompt_length_mismatches > 0 {
            s.push_str(&format!(
                "WARNING: {} prompts did not have the trace's input_length (server \
                 usage.prompt_tokens)\n",
                self.prompt_length_mismatches
            ));
        }
        s.push_str(&self.live.failure_lines());
        s.push_str(&self.live.lag_lines());
        s
    }

    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError> {
        replay_report::write_files(
            &self.json,
            &self.live.records,
            report.report_json.as_deref(),
            report.per_request_jsonl.as_deref(),
        )
    }

    fn html_json(&self) -> (&'static str, std::borrow::Cow<'_, serde_json::Value>) {
        ("run", std::borrow::Cow::Borrowed(&self.json))
    }
}

/// Loads an agentic trace (`format`, already detected) as a request graph, checked as
/// `mockserve replay` checks it: its schedule bounded unless `--allow-long-schedule`; the flags
/// that only mean something for plain Mooncake rows are refused.
pub fn load_graph(args: &ReplayArgs, format: TraceFormat) -> Result<RequestGraph, LoadgenError> {
    if args.max_requests.is_some() {
        return Err(LoadgenError::Config(format!(
            "--max-requests replays the first rows of a plain Mooncake trace; {} is an agentic \
             trace ({format}), replayed whole (its rows depend on each other)",
            args.trace.path.display()
        )));
    }
    if args.session_mode != SessionMode::Auto {
        return Err(LoadgenError::Config(format!(
            "--session-mode is for plain Mooncake traces; the prompts of an agentic trace \
             ({format}) are sent as its rows say"
        )));
    }
    if args.trace.agentic_lanes.is_some() && args.run.sharding.shard.is_some() {
        return Err(LoadgenError::Config(
            "--agentic-lanes and --shard do not go together: lanes queue every play of the \
             trace"
                .into(),
        ));
    }
    let graph = trace::load_graph(&args.trace.path, format, args.trace.block_size)?;
    graph.check_schedule(
        &args.trace.path.display().to_string(),
        args.trace.arrival_speedup_ratio,
        trace::ScheduleBound::of_flag(args.trace.allow_long_schedule),
    )?;
    Ok(graph)
}

/// The `agentic` section of a live run over the plays `owned` (all of them unsharded): the
/// other plays' nodes were neither sent nor skipped, and are left out.
fn agentic_section(times: &GraphTimes<'_>, owned: &[usize]) -> AgenticReport {
    let mut agentic = summarize(times);
    if owned.len() == times.graph.plays.len() {
        return agentic;
    }
    let mine: HashSet<&str> = owned
        .iter()
        .map(|&p| times.graph.plays[p].id.as_str())
        .collect();
    agentic.plays.retain(|p| mine.contains(p.play_id.as_str()));
    agentic
        .requests
        .retain(|r| mine.contains(r.play_id.as_str()));
    agentic.node_count = agentic.requests.len();
    agentic.play_count = agentic.plays.len();
    agentic.skipped_requests = agentic.plays.iter().map(|p| p.skipped_requests).sum();
    agentic.completed_plays = agentic
        .plays
        .iter()
        .filter(|p| p.status == "completed")
        .count();
    agentic.failed_plays = agentic.plays.len() - agentic.completed_plays;
    agentic
}

/// Per-request labels of a graph run, by the record's `request_id`: the node it was
/// (`request_id`, `play_id`, `conversation_id`, `parent_id` of a spawn, `lane_id`), as
/// `mockserve replay --per-request-jsonl` writes them.
fn agentic_labels(agentic: &AgenticReport) -> HashMap<u64, serde_json::Value> {
    let lanes: HashMap<&str, usize> = agentic
        .plays
        .iter()
        .filter_map(|p| Some((p.play_id.as_str(), p.lane?)))
        .collect();
    agentic
        .requests
        .iter()
        .filter_map(|node| {
            let id = node.engine_id?;
            let mut label = json!({
                "request_id": node.request_id,
                "play_id": node.play_id,
                "conversation_id": node.session_id,
            });
            if let Some(parent) = &node.parent_id {
                label["parent_id"] = json!(parent);
            }
            if let Some(lane) = lanes.get(node.play_id.as_str()) {
                label["lane_id"] = json!(format!("lane:{lane}"));
            }
            Some((id.0, label))
        })
        .collect()
}

/// A live replay of an agentic trace: its graph sent by [`graph_driver::drive_graph`], the
/// report with the live replay's keys plus the `agentic` section.
async fn replay_graph(
    args: &ReplayArgs,
    format: TraceFormat,
    console: bool,
) -> Result<ReplayRun, LoadgenError> {
    let graph = load_graph(args, format)?;
    let spec = args.run.target.spec(&EmbeddedOptions::default())?;
    let lanes = args.trace.agentic_lanes.map(|l| l as usize);
    if console {
        println!(
            "Trace {}: agentic ({format}), {} requests in {} plays, {} tokens per hash id, \
             speed-up {}{}",
            args.trace.path.display(),
            graph.nodes.len(),
            graph.plays.len(),
            graph.block_size,
            args.trace.arrival_speedup_ratio,
            lanes.map_or_else(String::new, |l| format!(", {l} lanes"))
        );
    }
    let mode = GraphMode {
        args,
        spec: &spec,
        console,
        format,
        lanes,
        graph: Arc::new(graph),
        owned: Vec::new(),
    };
    run::execute(mode, &spec, &settings(args, console)).await
}

/// An agentic trace's request graph in the harness, sent by [`graph_driver::drive_graph`].
struct GraphMode<'a> {
    args: &'a ReplayArgs,
    spec: &'a crate::run::target::TargetSpec,
    console: bool,
    format: TraceFormat,
    lanes: Option<usize>,
    graph: Arc<RequestGraph>,
    /// The plays this process sends (all of them unsharded).
    owned: Vec<usize>,
}

impl Mode for GraphMode<'_> {
    type Schedule = GraphPlan;
    type Driven = graph_driver::GraphOutput;
    type Run = ReplayRun;

    fn api(&self) -> Api {
        self.args.endpoint
    }

    fn prepare(&mut self, target: &Connected) -> Result<(GraphPlan, Option<usize>), LoadgenError> {
        let (args, graph) = (self.args, &self.graph);
        let synth = Arc::new(target.synth(graph.block_size));
        if self.console {
            println!("{}", prompts_line(args, &synth, graph.block_size));
        }
        // A shard's plays (all of them unsharded), at their unsharded times.
        let shard = args.run.sharding.shard;
        self.owned = (0..graph.plays.len())
            .filter(|&p| shard.is_none_or(|sh| sh.owns(p)))
            .collect();
        if let (Some(sh), true) = (shard, self.console) {
            println!(
                "Shard {}/{}: {} of the {} plays",
                sh.index,
                sh.count,
                self.owned.len(),
                graph.plays.len()
            );
        }
        let total: usize = self.owned.iter().map(|&p| graph.plays[p].nodes.len()).sum();
        let plan = GraphPlan {
            graph: graph.clone(),
            synth,
            model: Arc::from(target.model.as_str()),
            api: args.endpoint,
            speedup: args.trace.arrival_speedup_ratio,
            lanes: self.lanes,
            plays: self.owned.clone(),
            ask_worker_id: target.ask_worker_id,
        };
        Ok((plan, Some(total)))
    }

    async fn drive(
        &mut self,
        plan: GraphPlan,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<graph_driver::GraphOutput, LoadgenError> {
        let config = hooks.driver_config(self.args.max_in_flight, None);
        graph_driver::drive_graph(target.endpoint.clone(), plan, &config).await
    }

    fn report(
        &mut self,
        mut out: graph_driver::GraphOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<ReplayRun, LoadgenError> {
        let (args, graph) = (self.args, &self.graph);
        let speedup = args.trace.arrival_speedup_ratio;
        // Expected reuse in the order the prompts were sent (samples are in send order).
        let mut seen = SeenPrefixes::default();
        let infos: Vec<RequestInfo> = out
            .samples
            .iter()
            .map(|s| {
                let node = &graph.nodes[s.session];
                let r = &node.request;
                RequestInfo {
                    input_length: r.input_length,
                    max_output: r.output_length,
                    session: Some(node.session_id.clone()),
                    turn: s.turn,
                    expected_reused_tokens: Some(seen.add(
                        r.hash_ids.iter().copied(),
                        r.input_length,
                        graph.block_size,
                    )),
                }
            })
            .collect();
        let items: Vec<_> = out.samples.iter().zip(&infos).collect();
        let mut live = replay_report::build(&items, wall);
        live.set_started_at(out.started_at);
        for rec in &live.records {
            if let Some(t) = out.times.get_mut(rec.raw.session) {
                t.engine_id = Some(servesim::ids::RequestId(rec.record.request_id));
                t.reused_input_tokens = rec.record.reused_input_tokens;
            }
        }
        let engine_block_size = self
            .spec
            .server
            .as_ref()
            .map_or(graph.block_size, |s| s.cluster.engine.block_size);
        let agentic = agentic_section(
            &GraphTimes {
                graph,
                nodes: &out.times,
                failed: &out.failed,
                lane_of: &out.lane_of,
                speedup,
                lanes: self.lanes,
                engine_block_size,
            },
            &self.owned,
        );
        let labels = agentic_labels(&agentic);
        for rec in &mut live.records {
            rec.agentic = labels.get(&rec.record.request_id).cloned();
        }
        let config = json!({
            "mode": "replay",
            "trace": args.trace.path.display().to_string(),
            "trace_format": self.format.name(),
            "endpoint": args.endpoint.name(),
            "arrival_speedup_ratio": speedup,
            "trace_block_size": graph.block_size,
            "agentic_lanes": self.lanes,
            "max_in_flight": args.max_in_flight,
            "target": self.spec.describe(),
        });
        let keys = ReplayKeys {
            first: ("trace_format", json!(self.format.name())),
            arrival_speedup_ratio: speedup,
            trace_block_size: graph.block_size,
            config,
        };
        Ok(keys.run(
            live,
            &items,
            Some(agentic),
            SessionMode::Cumulative,
            args.run.sharding.shard,
            observed,
        ))
    }
}
