//! `mockserve serve`: flags ([`ServeArgs`]), the validated [`ServerConfig`], and [`serve`], which
//! runs the HTTP API on a listener until a shutdown future resolves.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use clap::{Args, ValueEnum};
use servesim::cluster::ClusterConfig;
use servesim::scheduler::ConfigError;
use tokio::net::TcpListener;

use crate::api::{app, AppState};
use crate::args::EngineArgs;
use crate::text::{default_codec, TextCodec, TokenizerCodec};

/// Default `--max-body-bytes`: 8 MiB, room for a long multi-turn conversation.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// How reasoning tokens are streamed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ReasoningFormat {
    /// In `delta.reasoning_content` (DeepSeek / SGLang convention).
    #[default]
    Separate,
    /// In `delta.content`, between `<think>` and `</think>`.
    Inline,
}

/// `mockserve serve` flags.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Port to listen on (0 picks a free one; the bound address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Model name served (requests for another model get 404).
    #[arg(long, default_value = "mock-model")]
    pub model_name: String,

    /// Context length: prompt + output tokens at most.
    #[arg(long, default_value_t = 131072)]
    pub max_model_len: usize,

    /// Require `Authorization: Bearer KEY` on /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,

    /// Refuse requests (429) while this many are waiting for admission.
    #[arg(long)]
    pub max_waiting: Option<usize>,

    /// Refuse request bodies larger than this (413).
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,

    /// Share of each chat answer's output limit emitted as reasoning first (0..=1).
    #[arg(long, default_value_t = 0.0)]
    pub reasoning_ratio: f64,

    /// How reasoning is streamed.
    #[arg(long, value_enum, default_value_t = ReasoningFormat::Separate)]
    pub reasoning_format: ReasoningFormat,

    /// Output limit when a request sets neither max_completion_tokens nor max_tokens.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,

    /// HuggingFace `tokenizer.json` for exact token counts of a real model (default: the
    /// built-in tokenizer, no download).
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<std::path::PathBuf>,

    /// Simulated engine and routing flags.
    #[command(flatten)]
    pub engine: EngineArgs,
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
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            reasoning_ratio: 0.0,
            reasoning_format: ReasoningFormat::Separate,
            default_max_tokens: 256,
            codec: default_codec(),
        }
    }

    /// The configuration the flags describe.
    pub fn from_args(args: &ServeArgs) -> Result<ServerConfig, ConfigError> {
        let mut cluster = args.engine.cluster_config()?;
        cluster.engine.max_model_len = Some(args.max_model_len);
        let config = ServerConfig {
            model_name: args.model_name.clone(),
            api_key: args.api_key.clone(),
            max_waiting: args.max_waiting,
            max_body_bytes: args.max_body_bytes,
            reasoning_ratio: args.reasoning_ratio,
            reasoning_format: args.reasoning_format,
            default_max_tokens: args.default_max_tokens,
            ..ServerConfig::new(cluster)
        };
        let config = match &args.tokenizer {
            Some(path) => {
                let codec =
                    TokenizerCodec::from_file(path).map_err(|e| ConfigError(e.to_string()))?;
                ServerConfig {
                    codec: Arc::new(codec),
                    ..config
                }
            }
            None => config,
        };
        config.validate()?;
        Ok(config)
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
        if !(0.0..=1.0).contains(&self.reasoning_ratio) {
            return bad("--reasoning-ratio must be between 0 and 1");
        }
        if self.default_max_tokens == 0 {
            return bad("--default-max-tokens must be positive");
        }
        if self.max_body_bytes == 0 {
            return bad("--max-body-bytes must be positive");
        }
        if self.max_model_len == 0 {
            return bad("--max-model-len must be positive");
        }
        self.cluster.validate()
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then drains open connections.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::new(config)?;
    serve_state(listener, state, shutdown).await
}

/// [`serve`] over a state built beforehand (tests keep a clone to inspect the engine).
pub async fn serve_state(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = listener.tap_io(|stream| {
        // Without TCP_NODELAY, Nagle plus delayed ACK stalls streamed chunks by ~40 ms.
        let _ = stream.set_nodelay(true);
    });
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
        .context("serving HTTP")
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        // If the handler cannot be installed, never resolve from this branch.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

/// `mockserve serve`: binds, prints the address, serves until SIGINT/SIGTERM.
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let config = ServerConfig::from_args(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        println!("mockserve listening on http://{addr}");
        serve(listener, config, shutdown_signal()).await
    })
}
