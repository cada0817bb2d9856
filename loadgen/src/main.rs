//! The `loadgen` binary: parse, run, map errors to an exit code (0 success, 1 error, 2 bad
//! flags, 3 too many failed requests, 4 a failed `calibrate --gate`).

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = loadgen::Cli::parse();
    match loadgen::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stderr must not turn the error into a panic (exit 101).
            let _ = writeln!(
                std::io::stderr(),
                "loadgen: error: {}",
                loadgen::error::chain(&e)
            );
            ExitCode::from(e.exit_code())
        }
    }
}
