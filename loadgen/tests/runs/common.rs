//! Helpers shared by loadgen's end-to-end tests: the bound on every await, temporary
//! directories that remove themselves (no test leaves a path behind, failed or not), and the
//! command line parsed and run in-process as the binary runs it.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
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

/// Runs `loadgen ARGV...` in-process as the binary does (`loadgen::run_async`), for at most
/// `secs` seconds; it must fail, and its error is returned.
pub(crate) async fn run_err(secs: u64, argv: &[&str]) -> Result<loadgen::LoadgenError> {
    match within(secs, loadgen::run_async(cli(argv)?)).await? {
        Ok(()) => anyhow::bail!("{argv:?} ran"),
        Err(e) => Ok(e),
    }
}
