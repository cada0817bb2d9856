//! The validated [`ServerConfig`] of `mockserve serve` and the types it is made of. The HTTP
//! handlers and the server both import it; the flags that build it live in the `server` module.

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use servesim::cluster::ClusterConfig;
use servesim::scheduler::ConfigError;

use crate::fault::FaultConfig;
use crate::kv_events::KvEventsConfig;
use crate::output_length::OutputLengthDist;
use crate::text::{default_codec, TextCodec};

/// LoRA adapters loaded at once at most (`--lora-modules` and the loads at run time):
/// `/v1/load_lora_adapter` beyond it is a 400 (unload one first). Each is a model card in
/// `/v1/models` and, once it served a request, a `servesim_lora_requests` series in `/metrics`
/// (removed when it is unloaded).
pub const MAX_LORA_ADAPTERS: usize = 1024;

/// Default `--max-body-bytes`: 8 MiB, room for a long multi-turn conversation.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// Default `--header-read-timeout`.
pub(crate) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--body-read-timeout`.
pub(crate) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default `--idle-timeout`: 5 s, uvicorn's keep-alive (what vLLM's server runs), so idle
/// connections give their `--max-connections` slot back quickly.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest `--header-read-timeout`, `--body-read-timeout`, `--idle-timeout`,
/// `--shutdown-timeout` and `--startup-delay`: one day.
pub(crate) const MAX_SECONDS_FLAG: Duration = Duration::from_secs(86_400);
/// The largest `--max-body-bytes`: 1 GiB (bodies are held in memory).
pub(crate) const MAX_BODY_BYTES: usize = 1 << 30;
/// The largest `--max-model-len` and `--default-max-tokens`: 2^40 tokens, the engine's limit
/// on a worker's KV pool.
pub(crate) const MAX_TOKENS_FLAG: usize = 1 << 40;
/// Default `--max-inflight-bytes`: 2 GiB of estimated request memory (bodies, prompts,
/// planned answers, log-probabilities) in flight at once. 10,000 requests of a 4 KB prompt and
/// 256 output tokens fit; eight of the costliest accepted requests (about 300 MB each) do not.
pub const DEFAULT_MAX_INFLIGHT_BYTES: u64 = 2 << 30;
/// The largest `--max-inflight-bytes`: 2^50 bytes (1 PiB), which no request mix reaches: the
/// way to lift the bound.
pub const MAX_INFLIGHT_BYTES: u64 = 1 << 50;
/// Default `--max-connections`.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// Default `--shutdown-timeout`.
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Default `--stop-probability`.
pub const DEFAULT_STOP_PROBABILITY: f64 = 0.5;
/// Default `--tool-call-probability`.
pub const DEFAULT_TOOL_CALL_PROBABILITY: f64 = 0.5;

/// How reasoning tokens are streamed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReasoningFormat {
    /// In `delta.reasoning_content` (DeepSeek / SGLang convention).
    #[default]
    Separate,
    /// In `delta.content`, between `<think>` and `</think>`.
    Inline,
}

/// Everything the server needs, validated. Build it with [`ServerConfig::new`] (code) or
/// [`ServerConfig::from_args`] (flags).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The simulated cluster; the server sets its `engine.max_model_len` to `max_model_len`.
    pub cluster: ClusterConfig,
    /// Served model name.
    pub model_name: String,
    /// Context length.
    pub max_model_len: usize,
    /// Bearer token required on /v1 routes, if any.
    pub api_key: Option<String>,
    /// Queue bound (429 beyond it).
    pub max_waiting: Option<usize>,
    /// Estimated bytes of the requests in flight at most (503 `server_overloaded` beyond it),
    /// shared by every endpoint of the engine.
    pub max_inflight_bytes: u64,
    /// Largest accepted request body (413 beyond it).
    pub max_body_bytes: usize,
    /// Share of the output limit emitted as reasoning.
    pub reasoning_ratio: f64,
    /// Where reasoning goes.
    pub reasoning_format: ReasoningFormat,
    /// Output limit when the request has none.
    pub default_max_tokens: usize,
    /// Seeds answers of requests without `seed`.
    pub seed: u64,
    /// Tokenizer and chat template.
    pub codec: Arc<dyn TextCodec>,
    /// Connection limits, timeouts and the shutdown drain.
    pub http: HttpLimits,
    /// How long answers run without `ignore_eos`.
    pub output_length: OutputLengthDist,
    /// Chance that an answer of a request with stop strings or stop token ids ends at one.
    pub stop_probability: f64,
    /// Chance that an answer calls a tool under `tool_choice: "auto"`.
    pub tool_call_probability: f64,
    /// Injected failures (none by default).
    pub faults: FaultConfig,
    /// Publish KV events over ZeroMQ (`--kv-events-endpoint`), if set.
    pub kv_events: Option<KvEventsConfig>,
    /// LoRA adapters served from the start: `(name, path)`.
    pub lora_modules: Vec<(String, String)>,
    /// `--max-loras`, as reported in `vllm:lora_requests_info`.
    pub max_loras: usize,
    /// How long `/health` reports the server loading (503) after start.
    pub startup_delay: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig::new(ClusterConfig::default())
    }
}

impl ServerConfig {
    /// Defaults (as the flags') around a cluster configuration.
    pub fn new(mut cluster: ClusterConfig) -> ServerConfig {
        let max_model_len = cluster.engine.max_model_len.unwrap_or(131072);
        cluster.engine.max_model_len = Some(max_model_len);
        ServerConfig {
            seed: cluster.seed,
            cluster,
            model_name: "mock-model".into(),
            max_model_len,
            api_key: None,
            max_waiting: None,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            reasoning_ratio: 0.0,
            reasoning_format: ReasoningFormat::Separate,
            default_max_tokens: 256,
            codec: default_codec(),
            http: HttpLimits::default(),
            output_length: OutputLengthDist::default(),
            stop_probability: DEFAULT_STOP_PROBABILITY,
            tool_call_probability: DEFAULT_TOOL_CALL_PROBABILITY,
            faults: FaultConfig::default(),
            kv_events: None,
            lora_modules: Vec::new(),
            max_loras: 1,
            startup_delay: Duration::ZERO,
        }
    }

    /// The engine settings the live driver runs: the server's `max_model_len` copied in.
    pub fn live_cluster(&self) -> ClusterConfig {
        let mut cluster = self.cluster.clone();
        cluster.engine.max_model_len = Some(self.max_model_len);
        cluster
    }

    /// Checks the server settings (the cluster's are checked when it is built).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        if self.model_name.trim().is_empty() {
            return bad("--model-name must not be empty");
        }
        if self.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
            return bad("--api-key must not be empty (leave it out to serve without a key)");
        }
        if !(0.0..=1.0).contains(&self.reasoning_ratio) {
            return bad("--reasoning-ratio must be between 0 and 1");
        }
        if self.default_max_tokens == 0 || self.default_max_tokens > MAX_TOKENS_FLAG {
            return bad("--default-max-tokens must be between 1 and 2^40 (1099511627776)");
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_BODY_BYTES {
            return bad("--max-body-bytes must be between 1 and 2^30 (1 GiB)");
        }
        if self.max_inflight_bytes == 0 || self.max_inflight_bytes > MAX_INFLIGHT_BYTES {
            return bad("--max-inflight-bytes must be between 1 and 2^50 (1 PiB)");
        }
        if self.lora_modules.len() > MAX_LORA_ADAPTERS {
            return bad("--lora-modules names more than 1024 adapters (MAX_LORA_ADAPTERS)");
        }
        if !(0.0..=1.0).contains(&self.stop_probability) {
            return bad("--stop-probability must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.tool_call_probability) {
            return bad("--tool-call-probability must be between 0 and 1");
        }
        if self.max_model_len == 0 || self.max_model_len > MAX_TOKENS_FLAG {
            return bad("--max-model-len must be between 1 and 2^40 (1099511627776)");
        }
        if self.startup_delay > MAX_SECONDS_FLAG {
            return bad("--startup-delay must be at most 86400 seconds (one day)");
        }
        self.http.validate()?;
        self.cluster.validate()
    }
}

/// The HTTP connection limits, validated (see `mockserve serve --help` for what each one means).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// A request's headers must be in this long after the connection's accept (first request)
    /// or the request's first byte (later requests).
    pub header_read_timeout: Duration,
    /// A request's body must be in this long after its headers (408 beyond).
    pub body_read_timeout: Duration,
    /// A kept-alive connection without a request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// Open connections at most (503 beyond).
    pub max_connections: usize,
    /// How long open requests may run after shutdown begins.
    pub shutdown_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
        }
    }
}

impl HttpLimits {
    /// Checks what a hand-built value could get wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        if self.header_read_timeout.is_zero()
            || self.body_read_timeout.is_zero()
            || self.idle_timeout.is_zero()
        {
            return bad("HTTP read and idle timeouts must be positive");
        }
        let timeouts = [
            self.header_read_timeout,
            self.body_read_timeout,
            self.idle_timeout,
            self.shutdown_timeout,
        ];
        if timeouts.iter().any(|t| *t > MAX_SECONDS_FLAG) {
            return bad("HTTP timeouts must be at most 86400 seconds (one day)");
        }
        if self.max_connections == 0 || self.max_connections > tokio::sync::Semaphore::MAX_PERMITS {
            return bad("--max-connections must be positive (and below 2^61)");
        }
        Ok(())
    }
}
