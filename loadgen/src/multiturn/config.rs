//! `loadgen multiturn` flags ([`MultiturnArgs`]: the workload's, on top of every run command's
//! [`RunArgs`]) and the validated run description they become ([`MultiturnConfig`]) before
//! anything runs.

use clap::Args;
use mock_server::args::ReportArgs;
use mock_server::config::ReasoningFormat;
use serde_json::{json, Value};

use crate::error::LoadgenError;
use crate::harness::RunArgs;
use crate::limits;
use crate::multiturn::workload::WorkloadSpec;
use crate::observe::ObserveArgs;
use crate::run::target::{Api, EmbeddedOptions, TargetSpec};

/// `--tool-call-share` when only `--tool-wait-ms` is given.
pub(crate) const DEFAULT_TOOL_CALL_SHARE: f64 = 0.5;

/// Think time (ms) between turns when loadgen drives its embedded server and `--mean-delay-ms` is
/// not given: Dynamo's 5000 ms divided by the embedded default decode speed-up (10), so the first
/// run finishes in seconds while the answers still interleave.
pub(crate) const EMBEDDED_MEAN_DELAY_MS: u64 = 500;

/// Think time (ms) between turns against `--url` when `--mean-delay-ms` is not given (Dynamo's).
pub(crate) const URL_MEAN_DELAY_MS: u64 = 5000;

/// `loadgen multiturn`: Dynamo's `multiturn_bench` flags, plus every run command's [`RunArgs`]
/// (with multiturn's defaults: `--request-timeout-s 300`, `--seed 42`,
/// `--decode-speedup-ratio 10`, `--output` for the results file, and `/metrics` sampled only
/// when asked, so that the results keep Dynamo's keys).
#[derive(Args, Clone, Debug)]
#[command(
    mut_arg("request_timeout_s", |a| a
        .default_value("300")
        .help("Per-request timeout in seconds (Dynamo: 300)")),
    mut_arg("decode_speedup_ratio", |a| a
        .default_value("10")
        .help("Divides decode time further; the embedded default 10 keeps runs short while prefill (TTFT) runs at the profiled speed")),
    mut_arg("seed", |a| a
        .default_value("42")
        .help("Seed of the workload (think times, user text) and of the embedded server")),
    mut_arg("report_json", |a| a
        .long("output")
        .visible_alias("report-json")
        .help("Write JSON results (Dynamo multiturn_bench keys plus loadgen's) to this file")),
    mut_arg("per_request_jsonl", |a| a
        .help("Write one JSON line per request (the raw_results entries) to this file")),
    mut_arg("scrape_metrics", |a| a
        .help("Sample the target's Prometheus /metrics while the run lasts (running and waiting requests, KV usage, prefix-cache hit rate, preemptions, per worker) into the results' server_metrics [default: off in multiturn, on with --metrics-url or --max-server-lateness]")),
    mut_arg("html", |a| a
        .help("Write a self-contained HTML report (per-turn TTFT, latency CDFs, server metrics when sampled, the configuration) to this file")),
)]
pub struct MultiturnArgs {
    /// Concurrent users (one conversation each), 1 to 100000.
    #[arg(long, default_value_t = 10)]
    pub num_users: usize,

    /// Turns per user, 1 to 10000 (users x turns at most 10^7).
    #[arg(long, default_value_t = 5)]
    pub num_turns: usize,

    /// User-prompt tokens per turn (exact when the tokenizer is known, else ~0.8 words per token),
    /// at most 2^22.
    #[arg(long, default_value_t = 128)]
    pub num_user_tokens: usize,

    /// Sent as max_completion_tokens, 1 to 2^22.
    #[arg(long, default_value_t = 1000)]
    pub max_completion_tokens: u32,

    /// Send "ignore_eos": true (the default).
    #[arg(long, overrides_with = "no_ignore_eos")]
    pub ignore_eos: bool,

    /// Omit ignore_eos (the server may stop early).
    #[arg(long, overrides_with = "ignore_eos")]
    pub no_ignore_eos: bool,

    /// Mean of the exponential think time after each completed turn, in ms; 0 = none; at most
    /// 3600000 (one hour).
    /// [default: 5000 with --url, 500 for the embedded server]
    #[arg(long)]
    pub mean_delay_ms: Option<u64>,

    /// Ask the server to prefill the next turn's prefix after each answer
    /// ("nvext": {"agent_hints": {"speculative_prefill": true}}).
    #[arg(long)]
    pub speculative_prefill: bool,

    /// Share of turns (all but the last; 0 to 1) whose answer is asked for as a tool call
    /// (every request then carries one tool; these send tool_choice "required", the others
    /// "none"); the next turn is the tool's result, sent --tool-wait-ms after the call arrived
    /// instead of a think time. [default: 0.5 with --tool-wait-ms]
    #[arg(long)]
    pub tool_call_share: Option<f64>,

    /// How long a tool runs before its result is sent, ms: fixed:MS, uniform:LO,HI, exp:MEAN or
    /// lognormal:MEAN,SIGMA (each from 0 to 3600000). Turns a share of the turns into tool
    /// calls (--tool-call-share).
    #[arg(long, value_name = "DIST")]
    pub tool_wait_ms: Option<crate::multiturn::workload::WaitDist>,

    /// The route each turn goes to: chat, responses (OpenAI Responses), messages (Anthropic
    /// Messages) or embeddings (the history's text embedded; no answer joins it).
    #[arg(long, value_enum, default_value_t = Api::Chat)]
    pub endpoint: Api,

    /// How a Responses conversation goes on (--endpoint responses): resend (the whole history
    /// each turn, as chat) or previous-id (only the new turn, with previous_response_id naming
    /// the last answer, so the server holds the history).
    #[arg(long, value_enum, default_value_t = ResponsesHistory::Resend)]
    pub responses_history: ResponsesHistory,

    /// Print one line per turn and error bodies.
    #[arg(short, long)]
    pub verbose: bool,

    /// Smoke test: 1 user, 1 turn, 50 user tokens, 50 completion tokens, no delay, verbose.
    #[arg(long)]
    pub ping: bool,

    /// Real conversations instead of synthetic ones (`--dataset`): user u runs the seed's
    /// conversation u, each human turn a user message, each turn asking for its reply's length.
    #[command(flatten, next_help_heading = "Dataset")]
    pub prompts: crate::dataset::DatasetArgs,

    /// Report files, observers, failure threshold, target and sharding: the flags every run
    /// command shares. Sharding: shard I runs the conversations of the users u with
    /// u % N == I (the workload is generated for every user first, so each conversation is the
    /// unsharded run's).
    #[command(flatten)]
    pub run: RunArgs,

    /// The embedded server's chat settings (ignored with --url).
    #[command(flatten, next_help_heading = "Embedded server (without --url)")]
    pub chat_server: ChatServerArgs,
}

/// The embedded mockserve's chat settings: the reasoning share (with a default that makes
/// speculative prefill visible) and the context length.
#[derive(Args, Clone, Debug)]
pub struct ChatServerArgs {
    /// Share of each answer's output limit streamed as reasoning first. Above 0, the next turn's
    /// prompt (reasoning stripped from history) misses the cache after the answer's start unless
    /// speculative prefill warmed it.
    #[arg(long, default_value_t = 0.005)]
    pub reasoning_ratio: f64,

    /// How reasoning is streamed: separate (reasoning_content) or inline (`<think>` in content).
    #[arg(long, value_enum, default_value_t = ReasoningFormat::Separate)]
    pub reasoning_format: ReasoningFormat,

    /// Context length of the embedded server (1 to 2^22).
    #[arg(long, default_value_t = 131072)]
    pub max_model_len: usize,
}

impl ChatServerArgs {
    /// The embedded server's options.
    pub(crate) fn options(&self) -> EmbeddedOptions {
        EmbeddedOptions {
            max_model_len: self.max_model_len,
            reasoning_ratio: self.reasoning_ratio,
            reasoning_format: self.reasoning_format,
            fit_context: false,
        }
    }
}

/// How a conversation over the Responses API goes on from turn to turn (`--responses-history`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ResponsesHistory {
    /// Every turn sends the whole history, as chat does.
    Resend,
    /// Every turn after the first sends only what came after the last answer, with
    /// `previous_response_id` naming it (the server holds the history).
    PreviousId,
}

/// A validated `loadgen multiturn` run.
#[derive(Clone, Debug)]
pub struct MultiturnConfig {
    /// The endpoint (or the embedded server).
    pub target: TargetSpec,
    /// The route (`--endpoint`).
    pub api: Api,
    /// How a Responses conversation goes on (`--responses-history`).
    pub responses_history: ResponsesHistory,
    /// Conversations.
    pub workload: WorkloadSpec,
    /// max_completion_tokens.
    pub max_completion_tokens: u32,
    /// Send ignore_eos.
    pub ignore_eos: bool,
    /// Send the speculative-prefill hint.
    pub speculative_prefill: bool,
    /// Per-turn lines.
    pub verbose: bool,
    /// `--ping` was given.
    pub ping: bool,
    /// Allowed failure share.
    pub max_failure_rate: f64,
    /// Results files and progress.
    pub report: ReportArgs,
    /// The observers' flags when `/metrics` is sampled (`--scrape-metrics`, `--metrics-url` or
    /// `--max-server-lateness`); None runs without.
    pub observe: Option<ObserveArgs>,
    /// The HTML report's path.
    pub html: Option<std::path::PathBuf>,
    /// `--shard` and `--start-at` (checked).
    pub sharding: crate::run::shard::ShardArgs,
    /// `--num-runs` (checked).
    pub num_runs: usize,
}

impl MultiturnArgs {
    /// Validates the flags into a run description (`--ping` overrides applied).
    pub fn config(&self) -> Result<MultiturnConfig, LoadgenError> {
        let run = &self.run;
        let max_failure_rate = run.failures.max_failure_rate()?;
        // Without --url the embedded server is the target.
        let mean_delay_ms = self.mean_delay_ms.unwrap_or(if run.target.url.is_none() {
            EMBEDDED_MEAN_DELAY_MS
        } else {
            URL_MEAN_DELAY_MS
        });
        let mut workload =
            WorkloadSpec {
                num_users: self.num_users,
                num_turns: self.num_turns,
                num_user_tokens: self.num_user_tokens,
                mean_delay_ms,
                seed: run.target.engine.seed,
                tools: match (self.tool_call_share, self.tool_wait_ms) {
                    (None, None) => None,
                    (Some(_), None) => return Err(LoadgenError::Config(
                        "--tool-call-share needs --tool-wait-ms: how long the tool runs before \
                         its result is sent"
                            .into(),
                    )),
                    (share, Some(wait)) => {
                        let share = share.unwrap_or(DEFAULT_TOOL_CALL_SHARE);
                        limits::within("--tool-call-share", share, 0.0, 1.0)?;
                        Some(crate::multiturn::workload::ToolTurns { share, wait })
                    }
                },
                dataset: None,
            };
        let mut max_completion_tokens = self.max_completion_tokens;
        if self.ping {
            workload.num_users = 1;
            workload.num_turns = 1;
            workload.num_user_tokens = 50;
            workload.mean_delay_ms = 0;
            workload.tools = None;
            max_completion_tokens = 50;
        }
        // The ranges first: the target (the embedded server, the tokenizer) is built after.
        let w = &workload;
        limits::count("--num-users", w.num_users, 1, limits::MAX_USERS)?;
        limits::count("--num-turns", w.num_turns, 1, limits::MAX_TURNS)?;
        limits::product(
            "--num-users x --num-turns",
            &[w.num_users, w.num_turns],
            limits::MAX_REQUESTS,
            "MAX_REQUESTS",
        )?;
        crate::harness::repeat::check_records(
            run.runs.num_runs,
            w.num_users * w.num_turns,
            "--num-users x --num-turns",
        )?;
        limits::count(
            "--num-user-tokens",
            w.num_user_tokens,
            0,
            limits::MAX_PROMPT_TOKENS,
        )?;
        if w.mean_delay_ms > limits::MAX_DELAY_MS {
            return Err(LoadgenError::OutOfRange {
                flag: "--mean-delay-ms".into(),
                got: w.mean_delay_ms.to_string(),
                allowed: format!("from 0 to {}", limits::MAX_DELAY_MS),
            });
        }
        limits::count(
            "--max-completion-tokens",
            max_completion_tokens as usize,
            1,
            limits::MAX_OUTPUT_TOKENS,
        )?;
        // Every user's conversation at its last turn: all its prompts and answers.
        limits::product(
            "--num-users x --num-turns x (--num-user-tokens + --max-completion-tokens)",
            &[
                w.num_users,
                w.num_turns,
                w.num_user_tokens + max_completion_tokens as usize,
            ],
            limits::MAX_TOKENS_IN_FLIGHT,
            "MAX_TOKENS_IN_FLIGHT",
        )?;
        if let Some(d) = self.prompts.load(&run.target)? {
            // Turns: the longest conversation the users take, at most --num-turns.
            let order = d.order(workload.seed);
            let picked = |u: usize| d.conversation(order[u % order.len()]);
            workload.num_turns = (0..workload.num_users)
                .map(|u| picked(u).turns.len().min(workload.num_turns))
                .max()
                .unwrap_or(1);
            // Every user's conversation at its last turn: its prompts and answers.
            let tokens = (0..workload.num_users).try_fold(0usize, |sum, u| {
                let turns = picked(u).turns.iter().take(workload.num_turns);
                let n: usize = turns
                    .map(|t| t.input_tokens + d.output_tokens(t, max_completion_tokens as usize))
                    .sum();
                sum.checked_add(n)
            });
            limits::product(
                "--num-users x the dataset conversations' tokens",
                &[tokens.unwrap_or(usize::MAX)],
                limits::MAX_TOKENS_IN_FLIGHT,
                "MAX_TOKENS_IN_FLIGHT",
            )?;
            workload.dataset = Some(d);
        }
        limits::within(
            "--reasoning-ratio",
            self.chat_server.reasoning_ratio,
            0.0,
            1.0,
        )?;
        limits::count(
            "--max-model-len",
            self.chat_server.max_model_len,
            1,
            limits::MAX_PROMPT_TOKENS,
        )?;
        run.observe.check()?;
        limits::output_paths([
            ("--output", run.report.report_json.as_deref()),
            (
                "--per-request-jsonl",
                run.report.per_request_jsonl.as_deref(),
            ),
            ("--html", run.observe.html.as_deref()),
        ])?;
        run.sharding.check()?;
        let o = &run.observe;
        let sampled =
            o.scrape_metrics || o.metrics_url.is_some() || o.max_server_lateness.is_some();
        if self.endpoint == Api::Completions {
            return Err(LoadgenError::Config(
                "--endpoint completions: multiturn sends conversations (chat, responses, messages \
                 or embeddings)"
                    .into(),
            ));
        }
        if self.responses_history == ResponsesHistory::PreviousId && self.endpoint != Api::Responses
        {
            return Err(LoadgenError::Config(
                "--responses-history previous-id needs --endpoint responses".into(),
            ));
        }
        Ok(MultiturnConfig {
            target: run.spec(&self.chat_server.options())?,
            api: self.endpoint,
            responses_history: self.responses_history,
            workload,
            max_completion_tokens,
            ignore_eos: !self.no_ignore_eos,
            speculative_prefill: self.speculative_prefill,
            verbose: self.verbose || self.ping,
            ping: self.ping,
            max_failure_rate,
            report: run.report.clone(),
            observe: (sampled && !o.no_scrape_metrics).then(|| o.clone()),
            html: o.html.clone(),
            sharding: run.sharding.clone(),
            num_runs: run.runs.num_runs,
        })
    }
}

impl MultiturnConfig {
    /// The `config` block of the JSON results: every setting and the target.
    pub(crate) fn to_json(&self, model: &str, target_url: &str) -> Value {
        let server = match &self.target.server {
            None => Value::Null,
            Some(s) => {
                let e = &s.cluster.engine;
                json!({
                    "num_workers": s.cluster.num_workers,
                    "engine_type": format!("{:?}", e.engine_type).to_lowercase(),
                    "router_mode": format!("{:?}", s.cluster.router.mode),
                    "block_size": e.block_size,
                    "num_gpu_blocks": e.num_gpu_blocks,
                    "max_num_seqs": e.max_num_seqs,
                    "max_num_batched_tokens": e.max_num_batched_tokens,
                    "enable_prefix_caching": e.enable_prefix_caching,
                    "speedup_ratio": json_f64(e.latency.speedup_ratio),
                    "decode_speedup_ratio": json_f64(e.latency.decode_speedup_ratio),
                    "latency_model": e.latency.model.describe(),
                    "reasoning_ratio": s.reasoning_ratio,
                    "reasoning_format": format!("{:?}", s.reasoning_format).to_lowercase(),
                    "max_model_len": s.max_model_len,
                    "seed": s.cluster.seed,
                })
            }
        };
        let tokenizer = match self.target.tokenizer_name().as_str() {
            "heuristic" => "heuristic (0.8 words per token)".to_string(),
            other => other.to_string(),
        };
        let mut config = json!({
            "target": if self.target.is_embedded() { "embedded" } else { "url" },
            "url": target_url,
            "model": model,
            "num_users": self.workload.num_users,
            "num_turns": self.workload.num_turns,
            "num_user_tokens": self.workload.num_user_tokens,
            "user_tokens_exact": self.target.is_embedded() || self.target.tokenizer.is_some(),
            "tokenizer": tokenizer,
            "max_completion_tokens": self.max_completion_tokens,
            "ignore_eos": self.ignore_eos,
            "mean_delay_ms": self.workload.mean_delay_ms,
            "speculative_prefill": self.speculative_prefill,
            "seed": self.workload.seed,
            "ping": self.ping,
            "max_failure_rate": self.max_failure_rate,
            "request_timeout_s": self.target.request_timeout.as_secs_f64(),
            "max_line_bytes": self.target.max_line_bytes,
            "embedded_server": server,
        });
        if let (Some(d), Some(map)) = (&self.workload.dataset, config.as_object_mut()) {
            map.insert("dataset".into(), d.describe());
        }
        if let (true, Some(map)) = (self.api != Api::Chat, config.as_object_mut()) {
            map.insert("endpoint".into(), json!(self.api.name()));
        }
        if let (Api::Responses, Some(map)) = (self.api, config.as_object_mut()) {
            let history = match self.responses_history {
                ResponsesHistory::Resend => "resend",
                ResponsesHistory::PreviousId => "previous-id",
            };
            map.insert("responses_history".into(), json!(history));
        }
        if let (Some(t), Some(map)) = (self.workload.tools, config.as_object_mut()) {
            map.insert("tool_call_share".into(), json!(t.share));
            map.insert("tool_wait_ms".into(), json!(t.wait.to_string()));
        }
        config
    }
}

/// JSON has no infinity: write it as the string "inf".
fn json_f64(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!("inf")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> MultiturnArgs {
        let mut argv = vec!["loadgen", "multiturn"];
        argv.extend_from_slice(flags);
        match crate::Cli::try_parse_from(argv)
            .expect("valid flags")
            .command
        {
            crate::Command::Multiturn(a) => a,
            _ => unreachable!(),
        }
    }

    /// `--endpoint` takes the conversation routes; `previous-id` only goes with Responses, and
    /// the route shows in the results' config (chat's keys stay Dynamo's).
    #[test]
    fn endpoints_and_responses_history() {
        let c = args(&[]).config().expect("chat");
        assert_eq!(
            (c.api, c.responses_history),
            (Api::Chat, ResponsesHistory::Resend)
        );
        assert!(c.to_json("m", "u").get("endpoint").is_none());
        let flags = [
            "--endpoint",
            "responses",
            "--responses-history",
            "previous-id",
        ];
        let c = args(&flags).config().expect("chain");
        let json = c.to_json("m", "u");
        assert_eq!(
            (&json["endpoint"], &json["responses_history"]),
            (&json!("responses"), &json!("previous-id"))
        );
        for (flags, message) in [
            (
                &["--endpoint", "completions"][..],
                "--endpoint completions: multiturn sends conversations",
            ),
            (
                &[
                    "--endpoint",
                    "messages",
                    "--responses-history",
                    "previous-id",
                ],
                "--responses-history previous-id needs --endpoint responses",
            ),
        ] {
            let e = args(flags).config().expect_err("refused");
            assert!(e.to_string().contains(message), "{flags:?}: {e}");
        }
    }

    /// The defaults of the README's multiturn table.
    #[test]
    fn readme_defaults() {
        let c = args(&[]).config().expect("defaults");
        let w = &c.workload;
        assert_eq!(
            (w.num_users, w.num_turns, w.num_user_tokens, w.seed),
            (10, 5, 128, 42)
        );
        assert_eq!(w.mean_delay_ms, EMBEDDED_MEAN_DELAY_MS);
        assert_eq!(c.max_completion_tokens, 1000);
        assert!(c.ignore_eos && !c.speculative_prefill && !c.verbose && !c.ping);
        assert_eq!(c.max_failure_rate, 0.05);
        assert_eq!(
            c.target.request_timeout,
            std::time::Duration::from_secs(300)
        );
        let server = c.target.server.as_ref().expect("embedded");
        assert_eq!(server.reasoning_ratio, 0.005);
        assert_eq!(server.reasoning_format, ReasoningFormat::Separate);
        assert_eq!(server.max_model_len, 131072);
        assert_eq!(server.cluster.engine.latency.decode_speedup_ratio, 10.0);
        let c = args(&["--url", "http://h:1"]).config().expect("url");
        assert_eq!(c.workload.mean_delay_ms, URL_MEAN_DELAY_MS);
        assert!(c.target.server.is_none());
    }

    /// Every flag of the README's multiturn table parses and lands where it should.
    #[test]
    fn readme_flags() {
        let c = args(&[
            "--url",
            "http://h:1/",
            "--model",
            "m",
            "--num-users",
            "2",
            "--num-turns",
            "3",
            "--num-user-tokens",
            "16",
            "--max-completion-tokens",
            "8",
            "--no-ignore-eos",
            "--mean-delay-ms",
            "7",
            "--speculative-prefill",
            "--output",
            "out.json",
            "-v",
            "--seed",
            "5",
            "--max-failure-rate",
            "0.5",
            "--api-key",
            "k",
            "--request-timeout-s",
            "9",
            "--reasoning-ratio",
            "0.1",
            "--reasoning-format",
            "inline",
            "--max-model-len",
            "4096",
        ])
        .config()
        .expect("valid");
        assert_eq!(c.target.url.as_deref(), Some("http://h:1"));
        assert_eq!(c.target.model.as_deref(), Some("m"));
        assert_eq!(c.target.api_key.as_deref(), Some("k"));
        assert_eq!(
            (
                c.workload.num_users,
                c.workload.num_turns,
                c.workload.num_user_tokens
            ),
            (2, 3, 16)
        );
        assert_eq!((c.workload.mean_delay_ms, c.workload.seed), (7, 5));
        assert_eq!(c.max_completion_tokens, 8);
        assert!(!c.ignore_eos && c.speculative_prefill && c.verbose);
        assert_eq!(
            c.report.report_json.as_deref(),
            Some(std::path::Path::new("out.json"))
        );
        assert_eq!(c.max_failure_rate, 0.5);
        assert_eq!(c.target.request_timeout, std::time::Duration::from_secs(9));
        let alias = args(&["--report-json", "r.json", "--ignore-eos", "--ping"])
            .config()
            .expect("valid");
        assert_eq!(
            alias.report.report_json.as_deref(),
            Some(std::path::Path::new("r.json"))
        );
        assert!(alias.ping && alias.ignore_eos && alias.workload.num_users == 1);
        let embedded = args(&["--reasoning-format", "inline", "--max-model-len", "4096"])
            .config()
            .expect("valid");
        let server = embedded.target.server.expect("embedded");
        assert_eq!(
            (server.reasoning_format, server.max_model_len),
            (ReasoningFormat::Inline, 4096)
        );
        for bad in [
            &["--num-users", "0"][..],
            &["--max-completion-tokens", "0"],
            &["--max-failure-rate", "1.5"],
            &["--request-timeout-s", "0"],
            &["--url", "h:1"],
        ] {
            assert!(args(bad).config().is_err(), "{bad:?}");
        }
    }
}
