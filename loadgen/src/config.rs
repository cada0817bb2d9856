//! `loadgen multiturn` flags ([`MultiturnArgs`]) and the validated run description they become
//! ([`MultiturnConfig`]) before anything runs.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use mock_server::args::EngineArgs;
use mock_server::server::{ReasoningFormat, ServerConfig};
use serde_json::{json, Value};

use crate::error::LoadgenError;

/// Think time (ms) between turns when loadgen drives its embedded server and `--mean-delay-ms` is
/// not given: Dynamo's 5000 ms divided by the embedded default decode speed-up (10), so the first
/// run finishes in seconds while the answers still interleave.
pub const EMBEDDED_MEAN_DELAY_MS: u64 = 500;

/// Think time (ms) between turns against `--url` when `--mean-delay-ms` is not given (Dynamo's).
pub const URL_MEAN_DELAY_MS: u64 = 5000;

/// `loadgen multiturn`: Dynamo's `multiturn_bench` flags, plus the embedded server's settings.
#[derive(Args, Clone, Debug)]
pub struct MultiturnArgs {
    /// Base URL of an OpenAI-compatible frontend (chat URL = {url}/v1/chat/completions). Without
    /// it, loadgen starts mockserve in-process on 127.0.0.1 (a free port) and drives it.
    #[arg(long)]
    pub url: Option<String>,

    /// Model name to request (auto-detected from {url}/v1/models when absent).
    #[arg(long)]
    pub model: Option<String>,

    /// Concurrent users (one conversation each).
    #[arg(long, default_value_t = 10)]
    pub num_users: usize,

    /// Turns per user.
    #[arg(long, default_value_t = 5)]
    pub num_turns: usize,

    /// User-prompt tokens per turn (exact when the tokenizer is known, else ~0.8 words per token).
    #[arg(long, default_value_t = 128)]
    pub num_user_tokens: usize,

    /// Sent as max_completion_tokens.
    #[arg(long, default_value_t = 1000)]
    pub max_completion_tokens: u32,

    /// Send "ignore_eos": true (the default).
    #[arg(long, overrides_with = "no_ignore_eos")]
    pub ignore_eos: bool,

    /// Omit ignore_eos (the server may stop early).
    #[arg(long, overrides_with = "ignore_eos")]
    pub no_ignore_eos: bool,

    /// Mean of the exponential think time after each completed turn, in ms; 0 = none.
    /// [default: 5000 with --url, 500 for the embedded server]
    #[arg(long)]
    pub mean_delay_ms: Option<u64>,

    /// Ask the server to prefill the next turn's prefix after each answer
    /// ("nvext": {"agent_hints": {"speculative_prefill": true}}).
    #[arg(long)]
    pub speculative_prefill: bool,

    /// Write JSON results (Dynamo multiturn_bench keys plus loadgen's) to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,

    /// Print one line per turn and error bodies.
    #[arg(short, long)]
    pub verbose: bool,

    /// Smoke test: 1 user, 1 turn, 50 user tokens, 50 completion tokens, no delay, verbose.
    #[arg(long)]
    pub ping: bool,

    /// Fail (exit non-zero) when more than this share of requests fails.
    #[arg(long, default_value_t = 0.05)]
    pub max_failure_rate: f64,

    /// HuggingFace tokenizer.json of the target model, for exact user-turn token counts with --url.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Sent as "Authorization: Bearer KEY".
    #[arg(long)]
    pub api_key: Option<String>,

    /// Per-request timeout in seconds (Dynamo: 300).
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout_s: f64,

    /// Longest SSE line (and event data) accepted from the server, in bytes; a longer one fails
    /// its request ("SSE line longer than --max-line-bytes") and is never buffered whole.
    #[arg(long, default_value_t = crate::sse::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,

    /// Settings of the embedded server (ignored with --url); --seed also seeds the workload.
    #[command(flatten, next_help_heading = "Embedded server (without --url)")]
    pub server: EmbeddedArgs,
}

/// The embedded mockserve's settings: engine and routing flags (as `mockserve serve`) and the
/// reasoning share, with defaults that make speculative prefill visible.
#[derive(Args, Clone, Debug)]
#[command(
    mut_arg("decode_speedup_ratio", |a| a
        .default_value("10")
        .help("Divides decode time further; the embedded default 10 keeps runs short while prefill (TTFT) runs at the profiled speed")),
    mut_arg("seed", |a| a
        .default_value("42")
        .help("Seed of the workload (think times, user text) and of the embedded server"))
)]
pub struct EmbeddedArgs {
    /// Share of each answer's output limit streamed as reasoning first. Above 0, the next turn's
    /// prompt (reasoning stripped from history) misses the cache after the answer's start unless
    /// speculative prefill warmed it.
    #[arg(long, default_value_t = 0.005)]
    pub reasoning_ratio: f64,

    /// How reasoning is streamed: separate (reasoning_content) or inline (<think> in content).
    #[arg(long, value_enum, default_value_t = ReasoningFormat::Separate)]
    pub reasoning_format: ReasoningFormat,

    /// Context length of the embedded server.
    #[arg(long, default_value_t = 131072)]
    pub max_model_len: usize,

    /// Engine and routing flags.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// What loadgen drives.
#[derive(Clone, Debug)]
pub enum Target {
    /// An endpoint at this base URL (no trailing slash added or removed).
    Url(String),
    /// mockserve started in-process with this configuration.
    Embedded(Box<ServerConfig>),
}

/// How user turns are sized.
#[derive(Clone, Debug)]
pub enum TokenizerChoice {
    /// The embedded server's own tokenizer: exact counts.
    Embedded,
    /// A tokenizer.json file: exact counts.
    File(PathBuf),
    /// Dynamo's heuristic: floor(tokens * 0.8) lorem words.
    Heuristic,
}

/// The workload's shape (pure input of [`crate::workload::Workload::generate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Users (conversations).
    pub num_users: usize,
    /// Turns per user.
    pub num_turns: usize,
    /// User tokens per turn.
    pub num_user_tokens: usize,
    /// Mean think time in ms, 0 = none.
    pub mean_delay_ms: u64,
    /// Seed of think times and text.
    pub seed: u64,
}

/// A validated `loadgen multiturn` run.
#[derive(Clone, Debug)]
pub struct MultiturnConfig {
    /// The endpoint (or the embedded server).
    pub target: Target,
    /// Model name; None = auto-detect.
    pub model: Option<String>,
    /// Conversations.
    pub workload: WorkloadSpec,
    /// max_completion_tokens.
    pub max_completion_tokens: u32,
    /// Send ignore_eos.
    pub ignore_eos: bool,
    /// Send the speculative-prefill hint.
    pub speculative_prefill: bool,
    /// JSON results file.
    pub output: Option<PathBuf>,
    /// Per-turn lines.
    pub verbose: bool,
    /// `--ping` was given.
    pub ping: bool,
    /// Allowed failure share.
    pub max_failure_rate: f64,
    /// How user turns are sized.
    pub tokenizer: TokenizerChoice,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// Longest SSE line accepted.
    pub max_line_bytes: usize,
}

impl MultiturnArgs {
    /// Validates the flags into a run description (`--ping` overrides applied).
    pub fn config(&self) -> Result<MultiturnConfig, LoadgenError> {
        let bad = |m: &str| Err(LoadgenError::Config(m.to_string()));
        let target = match &self.url {
            Some(url) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return bad("--url must start with http:// (or https://)");
                }
                Target::Url(url.trim_end_matches('/').to_string())
            }
            None => {
                let server = ServerConfig::from_args(&mock_server::server::ServeArgs {
                    host: "127.0.0.1".into(),
                    port: 0,
                    model_name: "mock-model".into(),
                    max_model_len: self.server.max_model_len,
                    api_key: self.api_key.clone(),
                    max_waiting: None,
                    reasoning_ratio: self.server.reasoning_ratio,
                    reasoning_format: self.server.reasoning_format,
                    default_max_tokens: 256,
                    max_body_bytes: mock_server::server::DEFAULT_MAX_BODY_BYTES,
                    tokenizer: self.tokenizer.clone(),
                    engine: self.server.engine.clone(),
                })?;
                Target::Embedded(Box::new(server))
            }
        };
        let tokenizer = match (&self.tokenizer, &target) {
            (Some(path), _) => TokenizerChoice::File(path.clone()),
            (None, Target::Embedded(_)) => TokenizerChoice::Embedded,
            (None, Target::Url(_)) => TokenizerChoice::Heuristic,
        };
        let mean_delay_ms = self.mean_delay_ms.unwrap_or(match target {
            Target::Url(_) => URL_MEAN_DELAY_MS,
            Target::Embedded(_) => EMBEDDED_MEAN_DELAY_MS,
        });
        let mut config = MultiturnConfig {
            target,
            model: self.model.clone(),
            workload: WorkloadSpec {
                num_users: self.num_users,
                num_turns: self.num_turns,
                num_user_tokens: self.num_user_tokens,
                mean_delay_ms,
                seed: self.server.engine.seed,
            },
            max_completion_tokens: self.max_completion_tokens,
            ignore_eos: !self.no_ignore_eos,
            speculative_prefill: self.speculative_prefill,
            output: self.output.clone(),
            verbose: self.verbose,
            ping: self.ping,
            max_failure_rate: self.max_failure_rate,
            tokenizer,
            api_key: self.api_key.clone(),
            request_timeout: Duration::from_secs_f64(self.request_timeout_s.max(0.0)),
            max_line_bytes: self.max_line_bytes,
        };
        if self.ping {
            config.workload.num_users = 1;
            config.workload.num_turns = 1;
            config.workload.num_user_tokens = 50;
            config.workload.mean_delay_ms = 0;
            config.max_completion_tokens = 50;
            config.verbose = true;
        }
        if config.workload.num_users == 0 || config.workload.num_turns == 0 {
            return bad("--num-users and --num-turns must be positive");
        }
        if config.max_completion_tokens == 0 {
            return bad("--max-completion-tokens must be positive");
        }
        crate::failure::check_rate(config.max_failure_rate)?;
        if config.max_line_bytes == 0 {
            return bad("--max-line-bytes must be positive");
        }
        if !(self.request_timeout_s.is_finite() && self.request_timeout_s > 0.0) {
            return bad("--request-timeout-s must be positive");
        }
        Ok(config)
    }
}

impl MultiturnConfig {
    /// The `config` block of the JSON results: every setting and the target.
    pub fn to_json(&self, model: &str, target_url: &str) -> Value {
        let server = match &self.target {
            Target::Url(_) => Value::Null,
            Target::Embedded(s) => {
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
                    "latency_model": format!("{:?}", e.latency.model),
                    "reasoning_ratio": s.reasoning_ratio,
                    "reasoning_format": format!("{:?}", s.reasoning_format).to_lowercase(),
                    "max_model_len": s.max_model_len,
                    "seed": s.cluster.seed,
                })
            }
        };
        json!({
            "target": match self.target { Target::Url(_) => "url", Target::Embedded(_) => "embedded" },
            "url": target_url,
            "model": model,
            "num_users": self.workload.num_users,
            "num_turns": self.workload.num_turns,
            "num_user_tokens": self.workload.num_user_tokens,
            "user_tokens_exact": !matches!(self.tokenizer, TokenizerChoice::Heuristic),
            "tokenizer": match &self.tokenizer {
                TokenizerChoice::Embedded => "embedded".to_string(),
                TokenizerChoice::File(p) => p.display().to_string(),
                TokenizerChoice::Heuristic => "heuristic (0.8 words per token)".to_string(),
            },
            "max_completion_tokens": self.max_completion_tokens,
            "ignore_eos": self.ignore_eos,
            "mean_delay_ms": self.workload.mean_delay_ms,
            "speculative_prefill": self.speculative_prefill,
            "seed": self.workload.seed,
            "ping": self.ping,
            "max_failure_rate": self.max_failure_rate,
            "request_timeout_s": self.request_timeout.as_secs_f64(),
            "max_line_bytes": self.max_line_bytes,
            "embedded_server": server,
        })
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
