//! The `loadgen` binary: parse, run, map errors to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = loadgen::Cli::parse();
    match loadgen::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: error: {e}");
            ExitCode::FAILURE
        }
    }
}
