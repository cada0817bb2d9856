//! `mockserve serve`: flags ([`ServeArgs`]) and the [`ServerConfig`] they build, and [`serve`],
//! which runs the HTTP API on a listener until a shutdown future resolves.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use clap::Args;
use servesim::scheduler::ConfigError;
use tokio::net::TcpListener;

use crate::api::{app, AppState};
use crate::args::EngineArgs;
use crate::config::{ReasoningFormat, ServerConfig, DEFAULT_MAX_BODY_BYTES};
use crate::text::TokenizerCodec;

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

// Built here, next to the flags, so that `config` (which the handlers import) knows no flags.
impl ServerConfig {
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
