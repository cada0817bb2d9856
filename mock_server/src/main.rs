//! The `mockserve` binary: parse, run, map errors to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = mock_server::Cli::parse();
    match mock_server::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mockserve: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
