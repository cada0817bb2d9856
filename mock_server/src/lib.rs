//! mockserve: an OpenAI-compatible server and an offline replay over the servesim engine.
//!
//! - [`Cli`] is the command line and [`run`] executes it; bare `mockserve` means `mockserve serve`.
//! - [`cmd::serve::serve`] runs the HTTP API on a listener with a [`config::ServerConfig`] until a
//!   shutdown future resolves, then drains; [`api::app`] is the axum router (for `oneshot`
//!   tests); `connection::Edge` is the accept loop under it (connection limits and timeouts
//!   from [`config::HttpLimits`], graceful drain).
//! - `driver::EngineHandle` is the live driver: one task owning the simulated cluster, woken
//!   on time by a [`timer::PreciseTimer`].
//! - [`fleet`] runs N workers in one process, each its own vLLM-like endpoint, and judges the
//!   routing decisions made in front of them (`mockserve fleet`).
//! - [`fault`] injects seeded failures (`--fault-rate`, `x-servesim-fault`) for testing clients.
//! - [`metrics::Metrics`] holds the Prometheus metrics (vLLM names per worker, `servesim_*`).
//! - [`text::TextCodec`] turns messages into prompt ids and answer ids into text (servesim's
//!   built-in tokenizer, or a HuggingFace `tokenizer.json`).
//!
//! Embedding the server in-process:
//!
//! ```
//! # fn main() -> anyhow::Result<()> {
//! use mock_server::config::ServerConfig;
//! use mock_server::cmd::serve::serve;
//! let rt = tokio::runtime::Runtime::new()?;
//! rt.block_on(async {
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//!     let addr = listener.local_addr()?;
//!     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//!     let server = tokio::spawn(serve(listener, ServerConfig::default(), async {
//!         let _ = stopped.await;
//!     }));
//!     println!("serving on http://{addr}");
//!     let _ = stop.send(());
//!     server.await??;
//!     anyhow::Ok(())
//! })
//! # }
//! ```

pub mod api;
pub mod args;
pub mod cmd;
pub mod config;
pub(crate) mod connection;
pub(crate) mod driver;
pub use servesim::duration;
pub mod fault;
pub mod fleet;
pub mod kv_events;
pub mod metrics;
pub mod output_length;
pub mod plan;
pub(crate) mod stdout;
pub mod synthetic;
#[cfg(feature = "test-kit")]
pub mod test_kit;
pub mod text;
pub mod timer;

use clap::{Parser, Subcommand};

/// mockserve: a simulated LLM serving backend. Without a subcommand it serves.
#[derive(Parser, Debug)]
#[command(
    name = "mockserve",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SERVESIM_GIT_COMMIT"), ")"),
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// What to run (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Serve flags when no subcommand is given.
    #[command(flatten)]
    pub serve: cmd::serve::ServeArgs,

    /// vLLM-worker flags when no subcommand is given.
    #[command(flatten)]
    pub vllm: cmd::serve::VllmArgs,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the OpenAI-compatible API over the simulated engine (the default).
    Serve(Box<ServeCommand>),
    /// N simulated vLLM-like workers in one process, each its own endpoint (HTTP, metrics, KV
    /// events), for routers in front of them; a judge scores every routing decision.
    Fleet(Box<cmd::fleet::FleetArgs>),
    /// Replay a trace (Mooncake or agentic), or synthetic load (--request-rate ...), on a
    /// virtual clock and report Dynamo-compatible metrics.
    Replay(Box<cmd::replay::ReplayArgs>),
    /// Search engine and fleet configurations for the one that serves a trace (or synthetic
    /// load) within SLOs for
    /// the fewest GPUs (replays on every core); `mockserve plan merge` joins shard ledgers.
    Plan(Box<plan::args::PlanArgs>),
    /// Print a shell completion script on stdout, e.g. `mockserve completions bash`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// `mockserve serve` flags: the server's and the vLLM-worker ones.
#[derive(clap::Args, Debug)]
pub struct ServeCommand {
    /// Server flags.
    #[command(flatten)]
    pub serve: cmd::serve::ServeArgs,
    /// vLLM-worker flags.
    #[command(flatten)]
    pub vllm: cmd::serve::VllmArgs,
}

/// The completion script of `mockserve` for `shell`.
pub fn completions(shell: clap_complete::Shell) -> Vec<u8> {
    let mut script = Vec::new();
    let mut command = <Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut command, "mockserve", &mut script);
    script
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None => cmd::serve::run(&cli.serve, &cli.vllm),
        Some(Command::Serve(args)) => cmd::serve::run(&args.serve, &args.vllm),
        Some(Command::Fleet(args)) => cmd::fleet::run(&args),
        Some(Command::Replay(args)) => cmd::replay::run(&args).map(|_| ()),
        Some(Command::Plan(args)) => plan::run(&args),
        Some(Command::Completions { shell }) => {
            stdout::write(&completions(shell))?;
            Ok(())
        }
    }
}
