//! The endpoint every mode drives: `--url`, or mockserve embedded in-process with the engine
//! flags (the same flags `mockserve serve` takes). [`TargetArgs`] are the flags, [`TargetSpec`]
//! the validated description (the embedded server's configuration built and checked before
//! anything connects), [`Connected`] the running target: base URL, model, HTTP endpoint and the
//! tokenizer that sizes prompts for it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mock_server::args::EngineArgs;
use mock_server::cmd::serve::ServeArgs;
use mock_server::config::{ReasoningFormat, ServerConfig};
use serde_json::Value;
use servesim::tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::LoadgenError;
use crate::limits;
use crate::run::client::{self, Endpoint, Wire};
use crate::run::prompt::PromptSynth;

/// Context length of the embedded server for `replay` and `bench`: large enough for any trace row.
pub(crate) const EMBEDDED_MAX_MODEL_LEN: usize = 1 << 22;

/// Request body limit of the embedded server: long multi-turn histories and trace prompts fit.
pub(crate) const EMBEDDED_MAX_BODY_BYTES: usize = 1 << 30;

/// The flags that say where requests go (every run command).
#[derive(clap::Args, Clone, Debug)]
pub struct TargetArgs {
    /// Base URL of an OpenAI-compatible server (multiturn sends to {url}/v1/chat/completions,
    /// replay and bench to {url}/v1/completions). Without it, mockserve runs in-process on
    /// 127.0.0.1 (a free port) with the engine flags below.
    #[arg(long)]
    pub url: Option<String>,

    /// Model name (auto-detected from {url}/v1/models when absent).
    #[arg(long)]
    pub model: Option<String>,

    /// HuggingFace tokenizer.json of the target model, or an embedded tokenizer by name
    /// (`o200k_base`, `cl100k_base`, `builtin`): exact prompt lengths with --url; the embedded
    /// server uses it too. Without it: the embedded server's tokenizer, or with --url a
    /// word-count heuristic.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Sent as "Authorization: Bearer KEY" (as "x-api-key: KEY" with --endpoint messages).
    #[arg(long)]
    pub api_key: Option<String>,

    /// Per-request timeout in seconds (above 0, at most 86400: one day).
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,

    /// Longest SSE line (and event data) accepted from the server, in bytes; a longer one fails
    /// its request ("SSE line longer than --max-line-bytes") and is never buffered whole
    /// (1 to 2^30).
    #[arg(long, default_value_t = crate::run::sse::DEFAULT_MAX_LINE_BYTES)]
    pub max_line_bytes: usize,

    /// Do not ask which worker served each request: replay and bench send no
    /// `nvext.extra_fields` (some routers treat a request with `nvext` differently:
    /// vllm-router 0.1.17's kv_aware then credits no cached prefix). Multiturn never asks.
    #[arg(long)]
    pub no_worker_id: bool,

    /// Engine, router and cluster settings of the embedded server (ignored with --url).
    #[command(flatten, next_help_heading = "Embedded server (without --url)")]
    pub engine: EngineArgs,
}

/// The embedded server's settings that are not engine flags; each mode picks its own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbeddedOptions {
    /// Context length.
    pub max_model_len: usize,
    /// Share of each answer streamed as reasoning first.
    pub reasoning_ratio: f64,
    /// How reasoning is streamed.
    pub reasoning_format: ReasoningFormat,
    /// Lower the context length to what one worker can serve (`servable_context`): the
    /// modes without a `--max-model-len` flag (`replay`, `bench`, `sweep`, `profile`), so that
    /// the server neither warns about a flag the user cannot set nor admits prompts its KV pool
    /// must refuse.
    pub fit_context: bool,
}

/// The longest context one worker of `engine` can serve, at most `max_model_len`: its KV pool
/// (`--num-gpu-blocks` x `--block-size`) and, when prompts cannot be chunked, one pass's token
/// budget (`--max-num-batched-tokens`).
pub(crate) fn servable_context(
    engine: &servesim::scheduler::EngineConfig,
    max_model_len: usize,
) -> usize {
    let mut len = max_model_len.min(engine.kv_capacity_tokens());
    if !engine.enable_chunked_prefill && engine.policy().honours_chunked_prefill_flag {
        len = len.min(engine.max_num_batched_tokens);
    }
    len.max(1)
}

impl Default for EmbeddedOptions {
    /// `replay` and `bench`: any prompt length, no reasoning.
    fn default() -> Self {
        EmbeddedOptions {
            max_model_len: EMBEDDED_MAX_MODEL_LEN,
            reasoning_ratio: 0.0,
            reasoning_format: ReasoningFormat::Separate,
            fit_context: true,
        }
    }
}

impl TargetArgs {
    /// The validated target: the URL checked, or the embedded server's configuration built
    /// (engine flags and `embedded` checked, `--tokenizer` loaded).
    pub fn spec(&self, embedded: &EmbeddedOptions) -> Result<TargetSpec, LoadgenError> {
        let request_timeout_s = limits::positive(
            "--request-timeout-s",
            self.request_timeout_s,
            limits::MAX_REQUEST_TIMEOUT_S,
        )?;
        limits::count(
            "--max-line-bytes",
            self.max_line_bytes,
            1,
            limits::MAX_LINE_BYTES,
        )?;
        let (url, server) = match &self.url {
            Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                return Err(LoadgenError::Config(
                    "--url must start with http:// (or https://)".into(),
                ))
            }
            Some(url) => (Some(url.trim_end_matches('/').to_string()), None),
            None => (
                None,
                Some(
                    ServerConfig::from_args(&ServeArgs {
                        host: "127.0.0.1".into(),
                        port: 0,
                        model_name: "mock-model".into(),
                        max_model_len: embedded.max_model_len,
                        api_key: self.api_key.clone(),
                        max_waiting: None,
                        // loadgen's own concurrency bounds what its embedded server runs.
                        max_inflight_bytes: mock_server::config::MAX_INFLIGHT_BYTES,
                        reasoning_ratio: embedded.reasoning_ratio,
                        reasoning_format: embedded.reasoning_format,
                        default_max_tokens: 256,
                        // Answers end early unless loadgen sends ignore_eos (its default).
                        output_length_dist: Default::default(),
                        stop_probability: mock_server::config::DEFAULT_STOP_PROBABILITY,
                        tool_call_probability: mock_server::config::DEFAULT_TOOL_CALL_PROBABILITY,
                        max_body_bytes: EMBEDDED_MAX_BODY_BYTES,
                        tokenizer: self.tokenizer.clone(),
                        engine: self.engine.clone(),
                        http: Default::default(),
                        faults: Default::default(),
                    })
                    .map(|mut config| {
                        if embedded.fit_context {
                            config.max_model_len =
                                servable_context(&config.cluster.engine, config.max_model_len);
                        }
                        config
                    })?,
                ),
            ),
        };
        Ok(TargetSpec {
            url,
            model: self.model.clone(),
            tokenizer: self.tokenizer.clone(),
            api_key: self.api_key.clone(),
            request_timeout: Duration::from_secs_f64(request_timeout_s),
            max_line_bytes: self.max_line_bytes,
            ask_worker_id: !self.no_worker_id,
            server,
            lora: None,
        })
    }
}

/// Where requests go, validated.
#[derive(Clone, Debug)]
pub struct TargetSpec {
    /// `--url` without a trailing slash; None = embedded.
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
    /// Whether requests ask for their serving worker (`nvext.extra_fields`; not `--no-worker-id`).
    pub ask_worker_id: bool,
    /// The embedded server's configuration (None with `--url`).
    pub server: Option<ServerConfig>,
    /// `--lora-mix` and the seed of its picks (`TargetSpec::set_lora`).
    pub lora: Option<(crate::run::lora::LoraMix, u64)>,
}

/// Which route requests go to (`--endpoint`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// `/v1/chat/completions` (multiturn).
    Chat,
    /// `/v1/completions` (replay and bench: raw prompts, no chat template).
    Completions,
    /// `/v1/responses` (OpenAI Responses, streamed).
    Responses,
    /// `/v1/messages` (Anthropic Messages, streamed).
    Messages,
    /// `/v1/embeddings` (not streamed: TTFT is the whole latency, no output tokens).
    Embeddings,
}

impl Api {
    /// The flag value: `chat`, `completions`, `responses`, `messages` or `embeddings`.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
            Api::Embeddings => "embeddings",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
            Api::Embeddings => "/v1/embeddings",
        }
    }

    /// How the route's answers are read.
    pub(crate) fn wire(self) -> Wire {
        match self {
            Api::Chat | Api::Completions => Wire::OpenAi,
            Api::Responses => Wire::Responses,
            Api::Messages => Wire::Messages,
            Api::Embeddings => Wire::Embeddings,
        }
    }
}

/// A running embedded mockserve.
pub struct Embedded {
    /// Stops it.
    stop: oneshot::Sender<()>,
    /// The server task.
    task: JoinHandle<Result<(), String>>,
}

impl Embedded {
    /// Stops the server and waits (at most 5 s) for it to finish.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Starts mockserve on 127.0.0.1 (a free port); returns its base URL.
pub(crate) async fn start_embedded(
    config: &ServerConfig,
) -> Result<(String, Embedded), LoadgenError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| LoadgenError::Embedded(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LoadgenError::Embedded(e.to_string()))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let config = config.clone();
    let task = tokio::spawn(async move {
        mock_server::cmd::serve::serve(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| format!("{e:#}"))
    });
    Ok((format!("http://{addr}"), Embedded { stop, task }))
}

/// Resolves the model: the single model of `{url}/v1/models` (Dynamo's messages), LoRA
/// adapters (listed with a `parent`) left out.
pub(crate) async fn detect_model(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> Result<String, LoadgenError> {
    let models_url = format!("{url}/v1/models");
    crate::stdout::outln!("  Auto-detecting model from {models_url}...");
    let err = |message: String| LoadgenError::ModelDetection {
        url: models_url.clone(),
        message,
    };
    let mut request = client.get(&models_url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| err(e.to_string()))?;
    if !response.status().is_success() {
        return Err(err(format!(
            "Models endpoint returned status: {}",
            response.status()
        )));
    }
    let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
    let ids: Vec<String> = body
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| err("no \"data\" array in the response".into()))?
        .iter()
        // A LoRA adapter is listed with its base model as `parent` (vLLM, mockserve): the
        // model is the base.
        .filter(|m| m.get("parent").is_none_or(Value::is_null))
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    match ids.as_slice() {
        [] => Err(LoadgenError::NoModels { url: models_url }),
        [one] => {
            crate::stdout::outln!("  Auto-detected model: {one}");
            Ok(one.clone())
        }
        _ => {
            for id in &ids {
                crate::stdout::outln!("    - {id}");
            }
            Err(LoadgenError::MultipleModels {
                url: models_url,
                models: ids,
            })
        }
    }
}

/// A connected target.
pub struct Connected {
    /// Base URL.
    pub url: String,
    /// Model name.
    pub model: String,
    /// Where requests go.
    pub endpoint: Endpoint,
    /// The tokenizer prompts are sized with (None = heuristic).
    pub tokenizer: Option<Arc<dyn Tokenizer>>,
    /// Whether requests ask for their serving worker (`nvext.extra_fields`).
    pub ask_worker_id: bool,
    /// `--lora-mix` against this target's model: the `model` each request or session sends.
    pub lora: Option<Arc<crate::run::lora::LoraTraffic>>,
    /// The embedded server, to stop at the end.
    embedded: Option<Embedded>,
}

impl Connected {
    /// A prompt synthesizer for this target's tokenizer.
    pub(crate) fn synth(&self, block_size: usize) -> PromptSynth {
        match &self.tokenizer {
            Some(tok) => PromptSynth::exact(tok.as_ref(), block_size),
            None => PromptSynth::heuristic(block_size),
        }
    }

    /// Whether `/v1/completions` prompts may go as token ids: the embedded server, whose
    /// tokenizer is loadgen's, so the ids are those it would make of the text (it then does not
    /// tokenize every prompt again). A server behind `--url` always gets text.
    pub(crate) fn takes_token_prompts(&self) -> bool {
        self.embedded.is_some() && self.tokenizer.is_some()
    }

    /// Stops the embedded server, if any.
    pub async fn shutdown(self) {
        if let Some(e) = self.embedded {
            e.shutdown().await;
        }
    }
}

impl TargetSpec {
    /// Sends `mix` (picks seeded with `seed`); the embedded server loads its adapters at start
    /// (`--lora-modules`), with `--url` the server must serve them.
    pub(crate) fn set_lora(&mut self, mix: crate::run::lora::LoraMix, seed: u64) {
        if let Some(server) = &mut self.server {
            let model = server.model_name.clone();
            for name in mix.adapters(&model) {
                if !server.lora_modules.iter().any(|(n, _)| n == name) {
                    server
                        .lora_modules
                        .push((name.to_string(), "loadgen --lora-mix".to_string()));
                }
            }
        }
        self.lora = Some((mix, seed));
    }

    /// The target for a report's `config`: the URL, or the embedded server's settings.
    pub(crate) fn describe(&self) -> serde_json::Value {
        let mut target = self.describe_target();
        if let (Some((mix, _)), Some(map)) = (&self.lora, target.as_object_mut()) {
            map.insert("lora_mix".into(), crate::run::lora::describe(mix));
        }
        target
    }

    fn describe_target(&self) -> serde_json::Value {
        match (&self.url, &self.server) {
            (Some(url), _) => serde_json::json!({"url": url, "model": self.model}),
            (None, Some(s)) => {
                let e = &s.cluster.engine;
                serde_json::json!({
                    "embedded": true,
                    "num_workers": s.cluster.num_workers,
                    "engine_type": e.engine_type.to_string(),
                    "block_size": e.block_size,
                    "num_gpu_blocks": e.num_gpu_blocks,
                    "max_num_seqs": e.max_num_seqs,
                    "max_num_batched_tokens": e.max_num_batched_tokens,
                    "speedup_ratio": if e.latency.speedup_ratio.is_finite() {
                        serde_json::json!(e.latency.speedup_ratio)
                    } else {
                        serde_json::json!("inf")
                    },
                    "seed": s.cluster.seed,
                })
            }
            (None, None) => serde_json::Value::Null,
        }
    }

    /// True when loadgen runs mockserve itself.
    pub(crate) fn is_embedded(&self) -> bool {
        self.url.is_none()
    }

    /// How prompts are sized, for reports: the tokenizer file, `embedded`, or the heuristic.
    pub(crate) fn tokenizer_name(&self) -> String {
        match (&self.tokenizer, self.is_embedded()) {
            (Some(p), _) => p.display().to_string(),
            (None, true) => "embedded".into(),
            (None, false) => "heuristic".into(),
        }
    }

    /// Starts the embedded server if needed, loads the tokenizer and resolves the model
    /// (printing what it does, as Dynamo's benchmarks do); requests will go to `api`.
    pub async fn connect(&self, api: Api) -> Result<Connected, LoadgenError> {
        let (url, embedded) = match (&self.url, &self.server) {
            (Some(url), _) => (url.clone(), None),
            (None, Some(config)) => {
                let (url, e) = start_embedded(config).await?;
                let engine = &config.cluster.engine;
                crate::stdout::outln!(
                    "Embedded mockserve on {url}: {} workers, {} engine, speedup {}, reasoning ratio {}\n",
                    config.cluster.num_workers,
                    engine.engine_type,
                    engine.latency.speedup_ratio,
                    config.reasoning_ratio
                );
                (url, Some(e))
            }
            (None, None) => {
                return Err(LoadgenError::Config(
                    "no --url and no embedded server configuration".into(),
                ))
            }
        };
        let result = self.finish_connect(api, url, embedded.is_some()).await;
        match result {
            Ok(mut c) => {
                c.embedded = embedded;
                Ok(c)
            }
            Err(e) => {
                if let Some(e) = embedded {
                    e.shutdown().await;
                }
                Err(e)
            }
        }
    }

    async fn finish_connect(
        &self,
        api: Api,
        url: String,
        embedded: bool,
    ) -> Result<Connected, LoadgenError> {
        let tokenizer: Option<Arc<dyn Tokenizer>> = match (&self.tokenizer, embedded) {
            (Some(path), _) => Some(Arc::from(servesim::tokenizer::load_tokenizer(path)?)),
            // The embedded server's default codec is servesim's default tokenizer.
            (None, true) => Some(Arc::new(servesim::tokenizer::default_tokenizer()?)),
            (None, false) => None,
        };
        let http = client::client(self.request_timeout)
            .map_err(|e| LoadgenError::Client(e.to_string()))?;
        crate::stdout::outln!("Model Detection:");
        let model = match &self.model {
            Some(m) => {
                crate::stdout::outln!("  Using model: {m}");
                m.clone()
            }
            None => detect_model(&http, &url, self.api_key.as_deref()).await?,
        };
        crate::stdout::outln!();
        let lora = self
            .lora
            .as_ref()
            .map(|(mix, seed)| Arc::new(crate::run::lora::LoraTraffic::new(mix, *seed, &model)));
        Ok(Connected {
            endpoint: Endpoint {
                client: http,
                url: format!("{url}{}", api.path()),
                wire: api.wire(),
                api_key: self.api_key.clone(),
                max_line_bytes: self.max_line_bytes,
            },
            url,
            model,
            tokenizer,
            ask_worker_id: self.ask_worker_id,
            lora,
            embedded: None,
        })
    }
}

/// A body for `api` with `prompt`: a `/v1/completions` body, or a chat body whose one user
/// message is the prompt (for Responses, Messages and embeddings, that chat body in their form,
/// [`Wire::body`]). Streamed ones ask for `max_tokens` exactly (`ignore_eos`), usage, and, with
/// `ask_worker_id`, the serving worker (`nvext.extra_fields`, which mockserve and Dynamo answer
/// and others ignore).
pub(crate) fn request_body(
    api: Api,
    model: &str,
    prompt: String,
    max_tokens: usize,
    ask_worker_id: bool,
) -> serde_json::Value {
    let mut body = match api {
        Api::Completions => completion_body(model, prompt, max_tokens),
        Api::Chat | Api::Responses | Api::Messages | Api::Embeddings => serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        }),
    };
    if ask_worker_id {
        body["nvext"] = serde_json::json!({"extra_fields": ["worker_id", "timing"]});
    }
    api.wire().body(body)
}

/// [`request_body`] of a `/v1/completions` prompt given as token ids (the server's tokenizer's
/// ids of the prompt text: see [`Connected::takes_token_prompts`]).
pub(crate) fn token_request_body(
    model: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
    ask_worker_id: bool,
) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if ask_worker_id {
        body["nvext"] = serde_json::json!({"extra_fields": ["worker_id", "timing"]});
    }
    body
}

/// A streamed `/v1/completions` body: `max_tokens` tokens exactly (`ignore_eos`), usage included.
pub(crate) fn completion_body(model: &str, prompt: String, max_tokens: usize) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        target: TargetArgs,
    }

    fn spec(flags: &[&str]) -> Result<TargetSpec, LoadgenError> {
        let mut argv = vec!["t"];
        argv.extend_from_slice(flags);
        Flags::try_parse_from(argv)
            .expect("valid flags")
            .target
            .spec(&EmbeddedOptions::default())
    }

    #[test]
    fn no_worker_id_leaves_nvext_out() {
        let asked = request_body(Api::Completions, "m", "p".into(), 3, true);
        assert_eq!(asked["nvext"]["extra_fields"][0], "worker_id");
        let plain = request_body(Api::Chat, "m", "p".into(), 3, false);
        assert!(plain.get("nvext").is_none(), "{plain}");
        assert!(spec(&["--url", "http://x", "--no-worker-id"]).is_ok_and(|s| !s.ask_worker_id));
        assert!(spec(&["--url", "http://x"]).is_ok_and(|s| s.ask_worker_id));
    }

    #[test]
    fn specs_are_validated_before_connecting() {
        let s = spec(&["--url", "http://h:1/"]).expect("url");
        assert_eq!(s.url.as_deref(), Some("http://h:1"));
        assert!(s.server.is_none() && !s.is_embedded());
        let s = spec(&["--num-workers", "3"]).expect("embedded");
        assert_eq!(s.server.as_ref().map(|c| c.cluster.num_workers), Some(3));
        assert_eq!(s.tokenizer_name(), "embedded");
        assert!(spec(&["--url", "h:1"]).is_err());
        assert!(spec(&["--request-timeout-s", "0"]).is_err());
        assert!(spec(&["--max-line-bytes", "0"]).is_err());
        assert!(spec(&["--block-size", "0"]).is_err());
    }
}
