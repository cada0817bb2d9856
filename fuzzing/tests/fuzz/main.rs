//! Fuzzing in the test suite: each target's seed corpus plus seeded mutants for a time budget,
//! and a replay of every saved input; and the cost budget on bodies known to be costly
//! ([`cost`]), which runs alone (see [`alone`]) so that no fuzzer's work counts against it.
//!
//! - `SERVESIM_FUZZ_SECS`: seconds of mutation per target (default 30 when `CI` is set, else 5).
//! - `SERVESIM_FUZZ_SEED`: the mutation seed (default 0), printed with any finding.
//!
//! The seeds are the files of `fuzz/corpus/<target>/` but the costly ones (`cost_*`), which
//! `cost` checks in child processes. A body that costs more than its budget
//! (`servesim_fuzzing::cost`) is a finding like any other; one whose heap passes the budget's
//! ceiling aborts this test binary with a message naming the target.
//!
//! A finding prints the seed, the iteration and the input, and saves the input under
//! `target/tmp/fuzz-findings/<target>/`; copy it into `fuzz/regressions/<target>/` to keep it.
//!
//! Saved inputs (`fuzz/regressions/<target>/`), each a defect found once, replayed every run:
//! - `completions_body/empty_*`: an empty `/v1/completions` prompt (`""`, `[""]`, `[[]]`) is a
//!   400 (it once made the engine's driver spin, and no request was answered again);
//! - `completions_body/prompt_batch_stream.json`: a streamed batch of prompts whose choices
//!   finish one after another (a checker once refused a choice starting after another's finish);
//! - `trace_line/output_length_zero.jsonl`: a row asking for no output token is refused, naming
//!   its line;
//! - `trace_line/invalid_utf8_on_line_2.jsonl`: a row that is not UTF-8 is an error naming its
//!   line.

mod cost;

use std::path::PathBuf;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use servesim_fuzzing::runner::{check_once, fuzz, load_corpus, FuzzError, FuzzOptions};
use servesim_fuzzing::sse::Outcome;
use servesim_fuzzing::{fuzz_dir, sse, target, TARGETS};

/// Longest one input may take (the HTTP checkers give up at their time budget themselves:
/// 5 s + 1 s per MiB of body, after a first server start of a few seconds).
const HANG_TIMEOUT: Duration = Duration::from_secs(20);

/// Held shared by every test that puts the machine to work, and alone by the cost tests, whose
/// time budgets must not be measured against the fuzzers' CPU.
static MACHINE: RwLock<()> = RwLock::new(());

/// A share of the machine, with the other fuzzers (a panicked holder does not poison it).
fn shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

/// The machine to this test alone.
fn alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

fn budget() -> Duration {
    let secs = std::env::var("SERVESIM_FUZZ_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0);
    let default = if std::env::var_os("CI").is_some() {
        30.0
    } else {
        5.0
    };
    Duration::from_secs_f64(secs.unwrap_or(default))
}

fn seed() -> u64 {
    std::env::var("SERVESIM_FUZZ_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn run(name: &str) {
    let _machine = shared();
    let target = target(name).expect("a known target");
    let options = FuzzOptions {
        seed: seed(),
        budget: budget(),
        max_iterations: None,
        hang_timeout: HANG_TIMEOUT,
        corpus_dir: fuzz_dir().join("corpus").join(name),
        findings_dir: Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-findings")),
    };
    match fuzz(target, &options) {
        Ok(stats) => eprintln!(
            "{name}: {} inputs ({} seeds) in {:.1?} (slowest {:.1?}), no violation",
            stats.iterations, stats.corpus, stats.elapsed, stats.slowest
        ),
        Err(FuzzError::Violation(finding)) => panic!("{finding}"),
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
fn chat_body() {
    run("chat_body");
}

/// Fails until empty completion prompts are refused (see the top of this file).
#[test]
fn completions_body() {
    run("completions_body");
}

/// Fails until traces that are not UTF-8 are refused naming a line (see the top of this file).
#[test]
fn trace_line() {
    run("trace_line");
}

#[test]
fn agentic_line() {
    run("agentic_line");
}

#[test]
fn weka_play() {
    run("weka_play");
}

#[test]
fn sse_stream() {
    run("sse_stream");
}

#[test]
fn metrics_text() {
    run("metrics_text");
}

#[test]
fn prompt_text() {
    run("prompt_text");
}

/// Fails until `--api-key` guards every admin route, admin errors are OpenAI-shaped and short,
/// and decision pages are bounded (issue 43).
#[test]
fn fleet_admin() {
    run("fleet_admin");
}

#[test]
fn zmtp_frames() {
    run("zmtp_frames");
}

/// Every file in `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` passes its checker.
/// Fails until the fixes listed at the top of this file are in.
#[test]
fn corpus_and_regressions() {
    let _machine = shared();
    let mut failures = Vec::new();
    let mut checked = 0;
    for kind in ["corpus", "regressions"] {
        for t in &TARGETS {
            let dir = fuzz_dir().join(kind).join(t.name);
            if !dir.is_dir() {
                assert_eq!(kind, "regressions", "no seed corpus for {}", t.name);
                continue;
            }
            for (path, input) in load_corpus(&dir).expect("readable corpus") {
                checked += 1;
                if let Err(message) = check_once(t, &input, HANG_TIMEOUT) {
                    failures.push(format!("{}: {message}", path.display()));
                }
            }
        }
    }
    let dirs = std::fs::read_dir(fuzz_dir().join("corpus")).expect("fuzz/corpus");
    for dir in dirs.flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        assert!(target(&name).is_some(), "fuzz/corpus/{name} is no target");
    }
    assert!(checked > 0);
    assert!(
        failures.is_empty(),
        "{} of {checked} saved inputs violate a property:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// loadgen reads SSE from any server; a line without an end must not grow its buffer without
/// bound. Fails until the parser bounds its line (it then refuses the stream).
#[test]
fn sse_parser_refuses_a_line_over_its_bound() {
    let mut parser = loadgen::sse::SseParser::new();
    let bound = sse::holding(&parser).map_or(4 << 20, |(_, limit)| limit);
    let piece = vec![b'a'; 64 << 10];
    let mut pushed = b"data: ".len();
    let mut refused = parser.push(b"data: ").into_outcome().is_err();
    while !refused && pushed <= 2 * bound {
        refused = parser.push(&piece).into_outcome().is_err();
        pushed += piece.len();
        if let Some((buffered, limit)) = sse::holding(&parser) {
            assert!(
                buffered <= 2 * limit,
                "{buffered} bytes held, bound {limit}"
            );
        }
    }
    assert!(
        refused,
        "the parser took a {pushed}-byte line without refusing it (bound {bound})"
    );
}
