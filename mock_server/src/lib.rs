//! mockserve: an OpenAI-compatible server and an offline replay over the servesim engine.
//!
//! [`Cli`] is the command line; [`run`] executes it. The engine flags ([`args::EngineArgs`]) are
//! shared by every subcommand.

pub mod args;
pub mod replay_cmd;

use clap::{Parser, Subcommand};

/// mockserve: a simulated LLM serving backend.
#[derive(Parser, Debug)]
#[command(name = "mockserve", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Replay a Mooncake trace on a virtual clock and report Dynamo-compatible metrics.
    Replay(replay_cmd::ReplayArgs),
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => replay_cmd::run(&args).map(|_| ()),
    }
}
