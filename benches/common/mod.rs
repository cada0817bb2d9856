//! The shared `main` of the Dynamo-compatible `cargo bench` entry points (`harness = false`):
//! each entry point includes this module with `mod common;`. It lives beside them rather than in
//! a library crate because it is glue for `cargo bench`, not an API: the replay and multiturn
//! entry points need no indexer benchmark, and the indexer benchmark needs no HTTP server.

use std::process::ExitCode;

/// A command line made of one flag group.
#[derive(clap::Parser)]
struct Flags<A: clap::Args> {
    #[command(flatten)]
    flags: A,
}

/// Parses the benchmark's flags (cargo's `--bench` removed) as `A` and runs them. A bare
/// `cargo bench` passes only `--bench`: the entry point then says so and exits 0, so a
/// workspace-wide `cargo bench` does not fail on it.
pub(crate) fn bench_main<A: clap::Args>(
    name: &str,
    run: impl FnOnce(A) -> anyhow::Result<()>,
) -> ExitCode {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.is_empty() {
        println!("{name}: skipping no-arg harness invocation");
        return ExitCode::SUCCESS;
    }
    let argv = std::iter::once(name.to_string()).chain(args);
    let parsed = match <Flags<A> as clap::Parser>::try_parse_from(argv) {
        Ok(parsed) => parsed.flags,
        Err(e) => e.exit(),
    };
    match run(parsed) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
