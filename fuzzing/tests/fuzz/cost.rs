//! The cost budget on bodies known to be costly: the full-size bodies of
//! `servesim_fuzzing::costly` on a server with mockserve's default limits, and the scaled-down
//! seeds `fuzz/corpus/{chat,completions}_body/cost_*.json` on the fuzzed server.
//!
//! Each must be refused with a 400 or answered within the budget (see `servesim_fuzzing::cost`).
//! They run in `servesim-fuzz-check` child processes, one after another: a child stops at its
//! first violation (a server over budget may still be busy with it) or aborts at the heap
//! ceiling, and the next child goes on with the inputs after that one, so every input gets its
//! own verdict.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use servesim_fuzzing::costly::{is_costly_seed, COSTLY_BODIES};
use servesim_fuzzing::fuzz_dir;

use crate::alone;

/// The checker binary of this package.
const CHECKER: &str = env!("CARGO_BIN_EXE_servesim-fuzz-check");

/// Longest a child may take to give one verdict: server start-up in a debug build (the
/// tokenizer's tables), the input's time budget (12 s at most here) and the checker's grace.
const VERDICT_WAIT: Duration = Duration::from_secs(180);

/// Bytes of a child's stderr shown with a violation (its start).
const SHOWN_STDERR: usize = 3000;

/// One input's verdict: `Ok` with the checker's line, or `Err` with why.
type Verdict = (String, Result<String, String>);

/// Checks `inputs` with `servesim-fuzz-check ARGS... INPUTS...`, starting a new child after
/// each violation with the inputs after it.
fn check_all(args: &[&str], inputs: &[String]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    let mut rest = inputs;
    while let Some(first) = rest.first() {
        let mut child = Command::new(CHECKER)
            .args(args)
            .args(rest)
            .env("RUST_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("servesim-fuzz-check starts");
        let (lines_tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let mut done = 0;
        let failure = loop {
            let Some(input) = rest.get(done) else {
                break None;
            };
            match lines.recv_timeout(VERDICT_WAIT) {
                Ok(line) if line.starts_with(&format!("{input}: ok")) => {
                    verdicts.push((input.clone(), Ok(line)));
                    done += 1;
                }
                Ok(line) if line.starts_with(&format!("{input}: VIOLATION")) => {
                    break Some(line);
                }
                Ok(line) => panic!("{input}: unexpected checker output {line:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    break Some("the checker ended without a verdict".to_string())
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    break Some(format!("no verdict within {VERDICT_WAIT:?}; killed"));
                }
            }
        };
        let status = child.wait().expect("the checker ends");
        let stderr = stderr.join().expect("stderr read");
        let Some(failure) = failure else {
            assert!(
                status.success(),
                "{first}: the checker failed: {status}\n{stderr}"
            );
            break;
        };
        // The first lines: the violation, or the abort message before the input it shows.
        let said: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.starts_with("mockserve: warning"))
            .collect();
        let mut said = said.join("\n");
        if said.len() > SHOWN_STDERR {
            let mut end = SHOWN_STDERR;
            while !said.is_char_boundary(end) {
                end -= 1;
            }
            said.truncate(end);
            said.push_str(" [...]");
        }
        let input = &rest[done];
        let why = format!("{failure} ({status}):\n{said}");
        verdicts.push((input.clone(), Err(why)));
        rest = &rest[done + 1..];
    }
    verdicts
}

/// The costly seeds of a body target, as paths.
fn costly_seeds(target: &str) -> Vec<String> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the corpus directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| is_costly_seed(path))
        .collect();
    seeds.sort();
    seeds.iter().map(|p| p.display().to_string()).collect()
}

/// Fails until mockserve refuses or bounds every costly body: a long stop string, many stop
/// strings or stop token ids, a recursive response schema, nested `minItems` in tool
/// parameters, many choices with log probabilities, a large prompt batch, a long one-letter
/// prompt.
#[test]
fn costly_bodies_stay_within_budget() {
    let _machine = alone();
    let names: Vec<String> = COSTLY_BODIES.iter().map(|b| b.name.to_string()).collect();
    let chat = costly_seeds("chat_body");
    let completions = costly_seeds("completions_body");
    assert!(
        !chat.is_empty() && !completions.is_empty(),
        "no costly seeds"
    );
    // One child at a time, so that one input's work does not slow another's.
    let mut verdicts = check_all(&["costly"], &names);
    verdicts.extend(check_all(&["files", "chat_body"], &chat));
    verdicts.extend(check_all(&["files", "completions_body"], &completions));
    assert_eq!(verdicts.len(), names.len() + chat.len() + completions.len());
    let mut failures = Vec::new();
    for (input, verdict) in &verdicts {
        match verdict {
            Ok(line) => eprintln!("{line}"),
            Err(why) if why.starts_with(input.as_str()) => failures.push(why.clone()),
            Err(why) => failures.push(format!("{input}: {why}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} costly bodies cost more than their budget or broke a property:\n\n{}",
        failures.len(),
        verdicts.len(),
        failures.join("\n\n")
    );
}

/// The checker binary passes a cheap input and names a violating one, and a child that stops
/// at a violation is followed by one for the inputs after it.
#[test]
fn every_input_gets_its_own_verdict() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cost-verdicts");
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("written");
        path.display().to_string()
    };
    // One of a stream's events split over two lines holds both: the SSE checker's property.
    let good = write("good.sse", "data: a\n\ndata: [DONE]\n\n");
    let inputs = vec![
        good.clone(),
        dir.join("missing").display().to_string(),
        good,
    ];
    let verdicts = check_all(&["files", "sse_stream"], &inputs);
    assert_eq!(verdicts.len(), 3, "{verdicts:?}");
    assert!(verdicts[0].1.as_ref().is_ok_and(|l| l.contains(": ok (")));
    let missing = verdicts[1].1.as_ref().expect_err("unreadable");
    assert!(missing.contains("cannot read"), "{missing}");
    assert!(verdicts[2].1.is_ok(), "{verdicts:?}");
}
