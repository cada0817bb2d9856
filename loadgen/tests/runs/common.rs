//! Helpers shared by loadgen's end-to-end tests: the bound on every await, temporary
//! directories that remove themselves (no test leaves a path behind, failed or not), and the
//! command line parsed and run in-process as the binary runs it.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use loadgen::bench::BenchArgs;
use loadgen::calibrate::CalibrateArgs;
use loadgen::config::MultiturnArgs;
use loadgen::convert::{ConvertArgs, TraceArgs, TraceCommand};
use loadgen::profile::ProfileArgs;
use loadgen::replay::ReplayArgs;
use loadgen::sweep::SweepArgs;
use loadgen::{Cli, Command};

pub(crate) use mock_server::test_kit::TempDir;

/// Awaits `f` for at most `secs` seconds; past it, the error "timed out after Ns".
pub(crate) async fn within<T>(secs: u64, f: impl Future<Output = T>) -> Result<T> {
    mock_server::test_kit::within_for(Duration::from_secs(secs), f).await
}

/// A path as a flag value.
pub(crate) fn s(p: &Path) -> String {
    p.display().to_string()
}

/// `loadgen ARGV...` parsed as the binary parses it (`argv` without the program name).
pub(crate) fn cli(argv: &[&str]) -> Result<Cli> {
    Ok(Cli::try_parse_from(
        std::iter::once("loadgen").chain(argv.iter().copied()),
    )?)
}

/// The subcommand of `loadgen ARGV...`; panics on flags that do not parse (the test's own).
pub(crate) fn command(argv: &[&str]) -> Command {
    match cli(argv) {
        Ok(cli) => cli.command,
        Err(e) => panic!("{argv:?}: {e:#}"),
    }
}

/// The arguments of one subcommand, as [`args`] takes them out of a parsed command line.
pub(crate) trait SubArgs: Sized {
    /// The words that name the subcommand (`["trace", "convert"]`).
    const WORDS: &'static [&'static str];
    /// The arguments, when `command` is this subcommand.
    fn pick(command: Command) -> Option<Self>;
}

macro_rules! sub_args {
    ($($args:ty = [$($word:literal),+] $pat:pat => $a:ident;)+) => {$(
        impl SubArgs for $args {
            const WORDS: &'static [&'static str] = &[$($word),+];
            fn pick(command: Command) -> Option<Self> {
                match command {
                    $pat => Some($a),
                    _ => None,
                }
            }
        }
    )+};
}

sub_args! {
    BenchArgs = ["bench"] Command::Bench(a) => a;
    CalibrateArgs = ["calibrate"] Command::Calibrate(a) => a;
    MultiturnArgs = ["multiturn"] Command::Multiturn(a) => a;
    ProfileArgs = ["profile"] Command::Profile(a) => a;
    ReplayArgs = ["replay"] Command::Replay(a) => a;
    SweepArgs = ["sweep"] Command::Sweep(a) => a;
    ConvertArgs = ["trace", "convert"]
        Command::Trace(TraceArgs { command: TraceCommand::Convert(a) }) => a;
}

/// The arguments of `loadgen SUBCOMMAND FLAGS...` (the subcommand is `A`'s, `flags` follow
/// it); panics on flags that do not parse (the test's own).
pub(crate) fn args<A: SubArgs>(flags: &[&str]) -> A {
    let argv: Vec<&str> = A::WORDS.iter().chain(flags).copied().collect();
    match A::pick(command(&argv)) {
        Some(a) => a,
        None => panic!("{argv:?}: not `{}`", A::WORDS.join(" ")),
    }
}

/// The arguments of `loadgen SUBCOMMAND --quiet FLAGS...` (see [`args`]).
pub(crate) fn quiet_args<A: SubArgs>(flags: &[&str]) -> A {
    args(&[&["--quiet"], flags].concat())
}

/// Runs `loadgen ARGV...` in-process as the binary does (`loadgen::run_async`), for at most
/// `secs` seconds; it must succeed.
pub(crate) async fn run_ok(secs: u64, argv: &[&str]) -> Result<()> {
    within(secs, loadgen::run_async(cli(argv)?)).await??;
    Ok(())
}

/// Runs `loadgen ARGV...` in-process as the binary does (`loadgen::run_async`), for at most
/// `secs` seconds; it must fail, and its error is returned.
pub(crate) async fn run_err(secs: u64, argv: &[&str]) -> Result<loadgen::LoadgenError> {
    match within(secs, loadgen::run_async(cli(argv)?)).await? {
        Ok(()) => anyhow::bail!("{argv:?} ran"),
        Err(e) => Ok(e),
    }
}
