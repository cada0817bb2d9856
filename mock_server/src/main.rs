//! The `mockserve` binary: parse, run, map errors to an exit code.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc: the replay's hot paths allocate and free small vectors per request and per pass
/// (on two threads), where it is 12-18% faster than the system allocator (see README). It is
/// built without transparent huge pages (the `no_thp` feature): on a VM that hands freed memory
/// back to its host, a fresh huge page costs milliseconds to fault in, which doubled a replay
/// run after a memory-hungry process.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
