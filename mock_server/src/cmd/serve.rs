//! `mockserve serve`: flags ([`ServeArgs`], [`HttpArgs`]), the validated [`ServerConfig`] and
//! [`HttpLimits`], and [`serve`], which runs the HTTP API on a listener until a shutdown future
//! resolves, then drains open requests until `--shutdown-timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use servesim::cluster::{ClusterConfig, ServingMode};
use servesim::scheduler::ConfigError;
use tokio::net::TcpListener;

use crate::api::{app, AppState};
use crate::args::{show_number, EngineArgs};
use crate::cmd::shutdown;
use crate::config::{
    HttpLimits, ReasoningFormat, ServerConfig, DEFAULT_BODY_READ_TIMEOUT,
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STOP_PROBABILITY, DEFAULT_TOOL_CALL_PROBABILITY, MAX_SECONDS_FLAG,
};
use crate::connection::Edge;
use crate::fault::{FaultArgs, FaultConfig};
use crate::kv_events::{KvEventsArgs, KvEventsError};
use crate::output_length::{OutputLengthDist, DEFAULT_OUTPUT_LENGTH_DIST};
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

    /// Estimated memory (bytes) of the requests in flight at most: bodies, prompts, planned
    /// answers and log-probabilities. A request that does not fit is answered 503
    /// `server_overloaded` with `Retry-After: 1`; one larger than the bound runs alone. Up to
    /// 2^50 (which lifts the bound).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_INFLIGHT_BYTES)]
    pub max_inflight_bytes: u64,

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

    /// How long answers run without `ignore_eos`: `fixed[:LENGTH]`, `uniform:LO,HI` or
    /// `lognormal:MEAN,SIGMA`, where a LENGTH is a token count (64) or a share of the request's
    /// output limit (50%). `fixed` runs every answer to its limit; shorter answers end with
    /// finish_reason "stop".
    #[arg(long, value_name = "DIST", default_value = DEFAULT_OUTPUT_LENGTH_DIST)]
    pub output_length_dist: OutputLengthDist,

    /// Chance (0..=1) that an answer to a request with `stop` or `stop_token_ids` ends at one of
    /// them (its text then ends just before it) rather than at its end of sequence.
    #[arg(long, default_value_t = DEFAULT_STOP_PROBABILITY)]
    pub stop_probability: f64,

    /// Chance (0..=1) that an answer calls one of the request's tools under
    /// `tool_choice: "auto"` (the default when `tools` are given).
    #[arg(long, default_value_t = DEFAULT_TOOL_CALL_PROBABILITY)]
    pub tool_call_probability: f64,

    /// HuggingFace `tokenizer.json` for exact token counts of a real model, or an embedded
    /// tokenizer by name: `o200k_base` (the default), `cl100k_base`, `builtin` (word-level).
    /// Loaded and warmed before the server reports ready.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<std::path::PathBuf>,

    /// Simulated engine and routing flags.
    #[command(flatten)]
    pub engine: EngineArgs,

    /// Connection limits and timeouts of the HTTP server (its help heading holds for the
    /// flags after it).
    #[command(flatten)]
    pub http: HttpArgs,

    /// Injected failures for testing clients (last: its own help heading).
    #[command(flatten)]
    pub faults: FaultArgs,
}

/// `mockserve serve` flags that make it a drop-in vLLM worker behind outside routers: KV
/// events over ZeroMQ, LoRA adapters, a loading delay. Kept apart from [`ServeArgs`], which
/// embedders build field by field.
#[derive(Args, Clone, Debug, Default, PartialEq)]
#[command(next_help_heading = "vLLM worker")]
pub struct VllmArgs {
    /// LoRA adapters served as extra model names, comma-separated (`name` or vLLM's
    /// `name=path`; the path is never read): same latency as the base model, their KV blocks
    /// never shared with it.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub lora_modules: Vec<String>,

    /// LoRA adapters per batch, as reported in `vllm:lora_requests_info` (not simulated).
    #[arg(long, default_value_t = 1)]
    pub max_loras: usize,

    /// Seconds the server "loads the model" after binding: `/health` and `/ping` answer 503
    /// and generation requests are refused with 503 until then.
    #[arg(long, value_name = "SECONDS", default_value_t = 0.0)]
    pub startup_delay: f64,

    /// KV events published as vLLM does (last: its help heading holds for the flags after).
    #[command(flatten)]
    pub kv_events: KvEventsArgs,
}

/// `mockserve serve` flags for the HTTP connections: the defences against slow, idle and too
/// many clients, and the shutdown drain. [`HttpArgs::default`] is the flags' defaults.
#[derive(Args, Clone, Debug, PartialEq)]
#[command(next_help_heading = "HTTP connections")]
pub struct HttpArgs {
    /// Seconds a client has to send a request's headers, counted from the connection's accept
    /// (first request) or from the request's first byte (later requests); then the connection
    /// is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64())]
    pub header_read_timeout: f64,

    /// Seconds a client has to send a whole request body once its headers are in; then the
    /// answer is 408 and the connection is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_BODY_READ_TIMEOUT.as_secs_f64())]
    pub body_read_timeout: f64,

    /// Seconds a kept-alive connection may wait for its next request; then it is closed. The
    /// default is uvicorn's keep-alive (what vLLM runs), so idle clients give their
    /// `--max-connections` slot back quickly.
    #[arg(
        long,
        visible_alias = "idle-timeout-s",
        value_name = "SECONDS",
        default_value_t = DEFAULT_IDLE_TIMEOUT.as_secs_f64()
    )]
    pub idle_timeout: f64,

    /// Open connections at most; a connection beyond is answered 503 and closed.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Seconds open requests may run after SIGINT/SIGTERM; then each still-open stream ends
    /// with an error event and `data: [DONE]`, and the server exits. A second signal exits at
    /// once.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_SHUTDOWN_TIMEOUT.as_secs_f64())]
    pub shutdown_timeout: f64,

    /// Shut down as on SIGTERM once stdin reaches its end: a parent holding the write end of
    /// a pipe on mockserve's stdin (Python's `servesim.MockServer`) takes the server with it
    /// however it dies (SIGKILL included). Off by default: stdin is not read.
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
}

impl Default for HttpArgs {
    fn default() -> Self {
        HttpArgs {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64(),
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT.as_secs_f64(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT.as_secs_f64(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT.as_secs_f64(),
            exit_on_stdin_eof: false,
        }
    }
}

// Built here, next to the flags, so that `config` (which the handlers import) knows no flags.
impl HttpLimits {
    /// The limits the flags describe; timeouts must be positive (the shutdown one may be 0)
    /// and at most a day.
    pub fn from_args(args: &HttpArgs) -> Result<HttpLimits, ConfigError> {
        let limits = HttpLimits {
            header_read_timeout: seconds_flag(
                args.header_read_timeout,
                "header-read-timeout",
                false,
            )?,
            body_read_timeout: seconds_flag(args.body_read_timeout, "body-read-timeout", false)?,
            idle_timeout: seconds_flag(args.idle_timeout, "idle-timeout", false)?,
            max_connections: args.max_connections,
            shutdown_timeout: seconds_flag(args.shutdown_timeout, "shutdown-timeout", true)?,
        };
        limits.validate()?;
        Ok(limits)
    }
}

/// A flag of seconds as a [`Duration`]: finite, positive (or 0 with `allow_zero`) and at most
/// [`MAX_SECONDS_FLAG`]; the error names `--flag` and shows the value readably.
fn seconds_flag(value: f64, flag: &str, allow_zero: bool) -> Result<Duration, ConfigError> {
    let low_ok = value > 0.0 || (allow_zero && value == 0.0);
    if low_ok && value <= MAX_SECONDS_FLAG.as_secs_f64() {
        if let Ok(d) = Duration::try_from_secs_f64(value) {
            return Ok(d);
        }
    }
    let low = if allow_zero { "from 0" } else { "above 0" };
    Err(ConfigError(format!(
        "--{flag} must be a number of seconds {low} up to {} (one day), got {}",
        MAX_SECONDS_FLAG.as_secs(),
        show_number(value)
    )))
}

/// Why the flags of `mockserve serve` (or a fleet's worker) describe no server: a KV-events
/// flag is its own error, named by its flag, not an engine setting.
#[derive(Debug, thiserror::Error)]
pub enum ServeFlagsError {
    /// An engine, HTTP or worker setting.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A `--kv-events-*` flag.
    #[error(transparent)]
    KvEvents(#[from] KvEventsError),
}

impl ServerConfig {
    /// The configuration the flags describe, with the vLLM-worker flags.
    pub fn from_serve_args(
        args: &ServeArgs,
        vllm: &VllmArgs,
    ) -> Result<ServerConfig, ServeFlagsError> {
        let config = ServerConfig::from_args(args)?;
        let startup_delay = seconds_flag(vllm.startup_delay, "startup-delay", true)?;
        let mut lora_modules: Vec<(String, String)> = Vec::new();
        for module in &vllm.lora_modules {
            let (name, path) = module.split_once('=').unwrap_or((module, module));
            let (name, path) = (name.trim(), path.trim());
            if name.is_empty() {
                return Err(ConfigError(format!(
                    "--lora-modules: an empty adapter name in {module:?}"
                ))
                .into());
            }
            if name == config.model_name {
                return Err(ConfigError(format!(
                    "--lora-modules: the adapter name {name:?} is the base model's name \
                     (--model-name); give the adapter another name"
                ))
                .into());
            }
            if lora_modules.iter().any(|(n, _)| n == name) {
                return Err(ConfigError(format!(
                    "--lora-modules: the adapter name {name:?} is given twice"
                ))
                .into());
            }
            lora_modules.push((name.to_string(), path.to_string()));
        }
        if vllm.max_loras == 0 {
            return Err(ConfigError("--max-loras must be positive".into()).into());
        }
        let kv_events = vllm.kv_events.config()?;
        if let Some(kv_events) = &kv_events {
            kv_events.check_ports(num_workers(&config.cluster))?;
        }
        Ok(ServerConfig {
            kv_events,
            lora_modules,
            max_loras: vllm.max_loras,
            startup_delay,
            ..config
        })
    }

    /// The configuration the flags describe.
    pub fn from_args(args: &ServeArgs) -> Result<ServerConfig, ConfigError> {
        let mut cluster = args.engine.cluster_config()?;
        cluster.engine.max_model_len = Some(args.max_model_len);
        let config = ServerConfig {
            model_name: args.model_name.clone(),
            api_key: args.api_key.clone(),
            max_waiting: args.max_waiting,
            max_inflight_bytes: args.max_inflight_bytes,
            max_body_bytes: args.max_body_bytes,
            reasoning_ratio: args.reasoning_ratio,
            reasoning_format: args.reasoning_format,
            default_max_tokens: args.default_max_tokens,
            output_length: args.output_length_dist,
            stop_probability: args.stop_probability,
            tool_call_probability: args.tool_call_probability,
            http: HttpLimits::from_args(&args.http)?,
            faults: FaultConfig::from_args(&args.faults).map_err(ConfigError)?,
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

/// Workers `cluster` runs: one KV-event publisher (and port) each.
pub fn num_workers(cluster: &ClusterConfig) -> usize {
    match &cluster.serving {
        ServingMode::Aggregated => cluster.num_workers,
        ServingMode::Disagg {
            num_prefill_workers,
            num_decode_workers,
            ..
        } => num_prefill_workers.saturating_add(*num_decode_workers),
    }
}

/// Serves the API on `listener` until `shutdown` resolves, then stops accepting and drains:
/// idle connections close, open requests run until `config.http.shutdown_timeout`, then each
/// still-open stream ends with an error event and `data: [DONE]` and the future returns.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let state = AppState::start(config).await?;
    serve_state(listener, state, shutdown).await
}

/// [`serve`] over a state built beforehand (tests keep a clone to inspect the engine).
pub async fn serve_state(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let limits = state.config.http.clone();
    let stop_generations = state.stop_generations.clone();
    let edge = Edge {
        router: app(state),
        limits,
        stop_generations,
    };
    edge.run(listener, shutdown).await;
    Ok(())
}

/// `mockserve serve`: validates the flags (port ranges included), binds the HTTP listener and
/// every KV-event socket, and only then prints the address; serves until SIGINT/SIGTERM, then
/// drains for up to `--shutdown-timeout`; a second signal exits at once (an error). Any
/// failure before the address is printed is one error naming the flag.
pub fn run(args: &ServeArgs, vllm: &VllmArgs) -> anyhow::Result<()> {
    let config = ServerConfig::from_serve_args(args, vllm)?;
    shutdown::run(args.http.exit_on_stdin_eof, |mut shutdown| async move {
        let listener = TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| {
                format!(
                    "--host {} --port {}: cannot listen on {}:{}",
                    args.host, args.port, args.host, args.port
                )
            })?;
        let addr: SocketAddr = listener.local_addr()?;
        let drain = config.http.shutdown_timeout;
        // Every other socket (the KV-event ones) is bound here, before the address is printed:
        // a client that sees the address finds everything listening.
        let state = AppState::start(config).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve_state(listener, state, async {
            let _ = stopped.await;
        });
        let mut server = std::pin::pin!(server);
        shutdown::print_addresses(&format!("mockserve listening on http://{addr}\n"));
        tokio::select! {
            biased;
            result = &mut server => return result,
            () = shutdown.requested(drain) => {}
        }
        let _ = stop.send(());
        shutdown.drain(server).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_flag_defaults_are_the_default_limits() {
        assert_eq!(
            HttpLimits::from_args(&HttpArgs::default()),
            Ok(HttpLimits::default())
        );
    }

    #[test]
    fn http_limits_take_fractional_seconds_and_refuse_nonsense() {
        let args = |f: fn(&mut HttpArgs)| {
            let mut args = HttpArgs::default();
            f(&mut args);
            HttpLimits::from_args(&args)
        };
        let limits = args(|a| a.idle_timeout = 0.25);
        assert_eq!(
            limits.map(|l| l.idle_timeout),
            Ok(Duration::from_millis(250))
        );
        assert!(args(|a| a.shutdown_timeout = 0.0).is_ok());
        for bad in [
            args(|a| a.header_read_timeout = 0.0),
            args(|a| a.body_read_timeout = -1.0),
            args(|a| a.idle_timeout = f64::NAN),
            args(|a| a.idle_timeout = f64::INFINITY),
            args(|a| a.shutdown_timeout = -0.5),
            args(|a| a.max_connections = 0),
            args(|a| a.max_connections = usize::MAX),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
    }
}
