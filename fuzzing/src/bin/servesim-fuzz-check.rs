//! `servesim-fuzz-check`: checks inputs with a fuzz target's checker in this process and prints
//! one verdict line per input (`NAME: ok ...` with what an HTTP body cost, or
//! `NAME: VIOLATION ...`, the violated property on stderr).
//!
//! It stops at the first violation and exits at once: a server that failed an input may still
//! be busy with it, and would spoil the figures of the next. An input whose heap grows past the
//! cost budget's ceiling aborts the process (see `servesim_fuzzing::meter`) before its verdict
//! line. The cost test (`fuzzing/tests/fuzz/cost.rs`) runs it again on the inputs after such a stop.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use clap::{Parser, Subcommand};
use servesim_fuzzing::cost::{Spent, BODY_BUDGET};
use servesim_fuzzing::costly::{costly_body, COSTLY_BODIES};
use servesim_fuzzing::http::{check_body, heap_growth, start_server, Endpoint, Limits};
use servesim_fuzzing::target;

/// Checks inputs with a fuzz target's checker; stops at the first violation (exit status 1).
#[derive(Debug, Parser)]
#[command(name = "servesim-fuzz-check")]
struct Cli {
    #[command(subcommand)]
    inputs: Inputs,
}

#[derive(Debug, Subcommand)]
enum Inputs {
    /// Checks files with a target's checker.
    Files {
        /// The target: chat_body, completions_body, trace_line, sse_stream, metrics_text,
        /// prompt_text, fleet_admin.
        target: String,
        /// The inputs, one file each.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Sends chat_body and completions_body inputs to a server with mockserve's default
        /// limits instead of the fuzzed server's small ones.
        #[arg(long)]
        default_limits: bool,
    },
    /// Checks the costly bodies of `servesim_fuzzing::costly` on a server with mockserve's
    /// default limits.
    Costly {
        /// The bodies (long_stop, many_stops, many_stop_token_ids, recursive_schema,
        /// tool_schema_min_items, many_choices_with_logprobs, prompt_batch,
        /// one_letter_prompt) [default: all].
        names: Vec<String>,
    },
}

/// How long past its time budget a checker may take to give its verdict.
const GRACE: Duration = Duration::from_secs(10);

fn main() {
    let code = match Cli::parse().inputs {
        Inputs::Files {
            target,
            files,
            default_limits,
        } => check_files(&target, &files, default_limits),
        Inputs::Costly { names } => check_costly(&names),
    };
    // Exits without waiting for threads a failed input may have left busy.
    std::process::exit(code)
}

fn check_files(name: &str, files: &[PathBuf], default_limits: bool) -> i32 {
    let Some(target) = target(name) else {
        eprintln!("error: no fuzz target is called {name:?}");
        return 2;
    };
    let endpoint = match name {
        "chat_body" => Some(Endpoint::Chat),
        "completions_body" => Some(Endpoint::Completions),
        _ => None,
    };
    let limits = match default_limits {
        true => Limits::Default,
        false => Limits::Fuzz,
    };
    for file in files {
        let data = match std::fs::read(file) {
            Ok(data) => data,
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", file.display());
                return 2;
            }
        };
        let shown = file.display().to_string();
        let passed = match endpoint {
            Some(endpoint) => check(&shown, data, Some((endpoint, limits)), move |data| {
                Some(check_body(endpoint, limits, data))
            }),
            None => {
                let checker = target.check;
                check(&shown, data, None, move |data| {
                    checker(data);
                    None
                })
            }
        };
        if !passed {
            return 1;
        }
    }
    0
}

fn check_costly(names: &[String]) -> i32 {
    let mut bodies = Vec::new();
    for name in names {
        match costly_body(name) {
            Some(costly) => bodies.push(costly),
            None => {
                eprintln!("error: no costly body is called {name:?}");
                return 2;
            }
        }
    }
    if names.is_empty() {
        bodies.extend(COSTLY_BODIES.iter());
    }
    for costly in bodies {
        let endpoint = costly.endpoint;
        let passed = check(
            costly.name,
            costly.body(),
            Some((endpoint, Limits::Default)),
            move |data| Some(check_body(endpoint, Limits::Default, data)),
        );
        if !passed {
            return 1;
        }
    }
    0
}

/// Runs `checker` on `data` and prints its verdict and, when known, its cost; whether it passed.
/// A body checker that gives no verdict within its time budget and [`GRACE`] is stuck in the
/// server (in work that does not yield to the budget's timer): a violation.
fn check(
    name: &str,
    data: Vec<u8>,
    body: Option<(Endpoint, Limits)>,
    checker: impl FnOnce(&[u8]) -> Option<Spent> + Send + 'static,
) -> bool {
    let len = data.len();
    if let Some((endpoint, limits)) = body {
        // The patience below is for the input, not for the server's start-up.
        if std::panic::catch_unwind(|| start_server(endpoint, limits)).is_err() {
            println!("{name}: VIOLATION ({len} bytes)");
            return false;
        }
    }
    let (verdict_tx, verdict) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("check".into())
        .spawn(move || {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| checker(&data)));
            let _ = verdict_tx.send(outcome.map_err(|_| ()));
        });
    if let Err(e) = spawned {
        eprintln!("error: cannot start a thread: {e}");
        return false;
    }
    let patience = BODY_BUDGET.time(len) + GRACE;
    match verdict.recv_timeout(patience) {
        Ok(Ok(spent)) => {
            let cost = spent.map_or(String::new(), |spent| {
                format!(
                    ": heap grew by {} bytes of {}, took {:.2?} of {:.1?}",
                    spent.peak_heap_bytes,
                    BODY_BUDGET.heap_bytes(len, spent.answer_bytes),
                    spent.elapsed,
                    BODY_BUDGET.time(len)
                )
            });
            println!("{name}: ok ({len} bytes){cost}");
            true
        }
        // The panic message is already on stderr.
        Ok(Err(())) | Err(RecvTimeoutError::Disconnected) => {
            println!("{name}: VIOLATION ({len} bytes)");
            false
        }
        Err(RecvTimeoutError::Timeout) => {
            let heap = body.map_or(String::new(), |(endpoint, limits)| {
                format!(
                    "; the heap had grown by {} bytes (budget {})",
                    heap_growth(endpoint, limits),
                    BODY_BUDGET.heap_bytes(len, 0)
                )
            });
            eprintln!(
                "the checker gave no verdict within {patience:.1?} (its time budget and \
                 {GRACE:?}): it is stuck in work the budget's timer cannot interrupt{heap}"
            );
            println!("{name}: VIOLATION ({len} bytes)");
            false
        }
    }
}
