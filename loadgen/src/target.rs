//! The endpoint `replay` and `bench` drive: `--url`, or mockserve embedded in-process with the
//! given engine flags (the same flags `mockserve replay` takes), plus the tokenizer that sizes
//! prompts for it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mock_server::args::EngineArgs;
use mock_server::server::{ReasoningFormat, ServeArgs, ServerConfig};
use servesim::tokenizer::{BuiltinTokenizer, Tokenizer};

use crate::client::{self, Endpoint};
use crate::error::LoadgenError;
use crate::multiturn::{detect_model, start_embedded, Embedded};
use crate::prompt::PromptSynth;

/// Context length of the embedded server for `replay` and `bench`: large enough for any trace row.
pub const EMBEDDED_MAX_MODEL_LEN: usize = 1 << 22;

/// The flags that say where `replay` and `bench` send requests.
#[derive(clap::Args, Clone, Debug)]
pub struct TargetArgs {
    /// Base URL of an OpenAI-compatible server (prompts go to {url}/v1/completions). Without it,
    /// mockserve runs in-process with the engine flags below.
    #[arg(long)]
    pub url: Option<String>,

    /// Model name (auto-detected from {url}/v1/models when absent).
    #[arg(long)]
    pub model: Option<String>,

    /// HuggingFace tokenizer.json of the target model (exact prompt lengths with --url; the
    /// embedded server uses it too). Without it: the embedded server's tokenizer, or with --url
    /// about one lorem word per token.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Sent as "Authorization: Bearer KEY".
    #[arg(long)]
    pub api_key: Option<String>,

    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,

    /// Longest SSE line (and event data) accepted from the server, in bytes; a longer one fails
    /// its request ("SSE line longer than --max-line-bytes") and is never buffered whole.
    #[arg(long, default_value_t = crate::sse::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,

    /// Engine, router and cluster settings of the embedded server (ignored with --url).
    #[command(flatten, next_help_heading = "Embedded server (without --url)")]
    pub engine: EngineArgs,
}

impl TargetArgs {
    /// The validated target description.
    pub fn spec(&self) -> Result<TargetSpec, LoadgenError> {
        if !(self.request_timeout_s.is_finite() && self.request_timeout_s > 0.0) {
            return Err(LoadgenError::Config(
                "--request-timeout-s must be positive".into(),
            ));
        }
        if self.max_line_bytes == 0 {
            return Err(LoadgenError::Config(
                "--max-line-bytes must be positive".into(),
            ));
        }
        Ok(TargetSpec {
            url: self.url.clone(),
            model: self.model.clone(),
            tokenizer: self.tokenizer.clone(),
            api_key: self.api_key.clone(),
            request_timeout: Duration::from_secs_f64(self.request_timeout_s),
            max_line_bytes: self.max_line_bytes,
            engine: self.engine.clone(),
        })
    }
}

/// Where requests go, as the flags say.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// `--url`; None = embedded.
    pub url: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--tokenizer`.
    pub tokenizer: Option<PathBuf>,
    /// `--api-key`.
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// Longest SSE line accepted.
    pub max_line_bytes: usize,
    /// Engine flags of the embedded server.
    pub engine: EngineArgs,
}

/// A connected target.
pub struct Connected {
    /// Base URL.
    pub url: String,
    /// Model name.
    pub model: String,
    /// The `/v1/completions` endpoint.
    pub endpoint: Endpoint,
    /// The tokenizer prompts are sized with (None = heuristic).
    pub tokenizer: Option<Arc<dyn Tokenizer>>,
    /// The embedded server, to stop at the end.
    embedded: Option<Embedded>,
}

impl Connected {
    /// A prompt synthesizer for this target's tokenizer.
    pub fn synth(&self, block_size: usize) -> PromptSynth {
        match &self.tokenizer {
            Some(tok) => PromptSynth::exact(tok.as_ref(), block_size),
            None => PromptSynth::heuristic(block_size),
        }
    }

    /// Stops the embedded server, if any.
    pub async fn shutdown(self) {
        if let Some(e) = self.embedded {
            e.shutdown().await;
        }
    }
}

impl TargetSpec {
    /// Validates the URL and builds the embedded server's configuration.
    pub fn server_config(&self) -> Result<Option<ServerConfig>, LoadgenError> {
        match &self.url {
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => Err(
                LoadgenError::Config("--url must start with http:// (or https://)".into()),
            ),
            Some(_) => Ok(None),
            None => Ok(Some(ServerConfig::from_args(&ServeArgs {
                host: "127.0.0.1".into(),
                port: 0,
                model_name: "mock-model".into(),
                max_model_len: EMBEDDED_MAX_MODEL_LEN,
                api_key: self.api_key.clone(),
                max_waiting: None,
                reasoning_ratio: 0.0,
                reasoning_format: ReasoningFormat::Separate,
                default_max_tokens: 256,
                max_body_bytes: 1 << 30,
                tokenizer: self.tokenizer.clone(),
                engine: self.engine.clone(),
            })?)),
        }
    }

    /// Starts the embedded server if needed, loads the tokenizer and resolves the model.
    pub async fn connect(&self) -> Result<Connected, LoadgenError> {
        let server = self.server_config()?;
        let (url, embedded) = match (&self.url, &server) {
            (Some(url), _) => (url.trim_end_matches('/').to_string(), None),
            (None, Some(config)) => {
                let (url, e) = start_embedded(config).await?;
                println!("Embedded mockserve on {url}");
                (url, Some(e))
            }
            (None, None) => unreachable!("server_config builds a config without --url"),
        };
        let tokenizer: Option<Arc<dyn Tokenizer>> = match (&self.tokenizer, &embedded) {
            (Some(path), _) => Some(Arc::from(servesim::tokenizer::load_tokenizer(path)?)),
            (None, Some(_)) => Some(Arc::new(BuiltinTokenizer::new())),
            (None, None) => None,
        };
        let http = client::client(self.request_timeout)
            .map_err(|e| LoadgenError::Client(e.to_string()))?;
        let model = match &self.model {
            Some(m) => m.clone(),
            None => detect_model(&http, &url, self.api_key.as_deref()).await?,
        };
        Ok(Connected {
            endpoint: Endpoint {
                client: http,
                url: format!("{url}/v1/completions"),
                api_key: self.api_key.clone(),
                max_line_bytes: self.max_line_bytes,
            },
            url,
            model,
            tokenizer,
            embedded,
        })
    }
}

/// A streamed `/v1/completions` body: `max_tokens` tokens exactly (`ignore_eos`), usage included.
pub fn completion_body(model: &str, prompt: String, max_tokens: usize) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}
