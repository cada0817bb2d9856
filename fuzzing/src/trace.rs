//! The trace target: fuzzed bytes as a Mooncake JSONL trace, parsed by
//! [`servesim::trace::parse`] and, when small enough, replayed by [`servesim::replay::replay`].
//!
//! Properties, for every input:
//!
//! - parsing returns: a [`TraceError::Line`] naming a line of the input, [`TraceError::Empty`]
//!   for an input without a row, or a trace with one turn per non-blank line, every turn's
//!   prompt non-empty and within what its `hash_ids` cover, every session non-empty;
//! - a parsed trace within [`REPLAY_BUDGET`] replays on a tiny cluster ([`replay_config`]) to
//!   the end: one record per request, each completed with all its output tokens or rejected;
//! - a second replay gives the same records (the engine is deterministic);
//! - every line the parser's direct reader of plain rows takes reads as serde_json reads it
//!   ([`servesim::trace::plain_row_agrees`]).
//!
//! The replay has no step budget of its own, so larger traces are only parsed; hangs inside the
//! budget are caught by the runner's watchdog (or libFuzzer's `-timeout`).

use servesim::cluster::ClusterConfig;
use servesim::metrics::RequestStatus;
use servesim::replay::{replay, ReplayConfig};
use servesim::scheduler::EngineConfig;
use servesim::trace::{parse, plain_row_agrees, Trace, TraceError, TraceOptions};

/// Prompt tokens per `hash_ids` entry in fuzzed traces (small, so prompts stay small).
pub const TRACE_BLOCK_SIZE: usize = 16;

/// The largest trace replayed: requests, output tokens and prompt tokens over all requests.
#[derive(Clone, Copy, Debug)]
pub struct ReplayBudget {
    /// Requests at most.
    pub requests: usize,
    /// Output tokens at most (each is one simulated pass at least).
    pub output_tokens: u64,
    /// Prompt tokens at most.
    pub input_tokens: u64,
}

/// What [`trace_line`] replays; larger traces are only parsed.
pub const REPLAY_BUDGET: ReplayBudget = ReplayBudget {
    requests: 64,
    output_tokens: 4096,
    input_tokens: 1 << 16,
};

/// Two workers with 64 blocks of 16 tokens each (so long prompts are rejected), four running
/// requests and 128 tokens per pass (so prompts take several chunked passes).
pub fn replay_config() -> ReplayConfig {
    ReplayConfig {
        cluster: ClusterConfig {
            engine: EngineConfig {
                num_gpu_blocks: 64,
                block_size: 16,
                max_num_seqs: 4,
                max_num_batched_tokens: 128,
                ..EngineConfig::default()
            },
            num_workers: 2,
            ..ClusterConfig::default()
        },
        trace_block_size: TRACE_BLOCK_SIZE,
    }
}

/// Checks a trace (see the module docs for the properties).
pub fn trace_line(data: &[u8]) {
    let options = TraceOptions {
        trace_block_size: TRACE_BLOCK_SIZE,
        arrival_speedup_ratio: 1.0,
    };
    let lines = line_count(data);
    for line in data_lines(data) {
        assert!(
            plain_row_agrees(&line),
            "the plain-row reader and serde_json read {line:?} differently"
        );
    }
    match parse(data, "fuzz.jsonl", &options) {
        Ok(trace) => {
            if let Err(e) = check_trace(&trace, data) {
                panic!("parsed trace is inconsistent: {e}\n{trace:#?}");
            }
            if within_budget(&trace) {
                check_replay(&trace);
            }
        }
        Err(TraceError::Line { line, message, .. }) => {
            assert!(
                (1..=lines).contains(&line),
                "the error names line {line} of a {lines}-line input: {message}"
            );
        }
        Err(e @ TraceError::LongSchedule { line, .. }) => {
            assert!(
                (1..=lines).contains(&line),
                "the error names line {line} of a {lines}-line input: {e}"
            );
        }
        Err(TraceError::Empty { .. }) => {
            assert!(
                data_lines(data).all(|l| l.trim().is_empty()),
                "an input with rows is reported empty"
            );
        }
        Err(
            e @ (TraceError::Io { .. }
            | TraceError::Options { .. }
            | TraceError::Directory { .. }
            | TraceError::TooLarge { .. }),
        ) => {
            panic!(
                "the error names no line: {e} ({})",
                std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
            );
        }
    }
}

/// Lines as `BufRead::lines` counts them: a last line without its newline counts.
pub(crate) fn line_count(data: &[u8]) -> usize {
    let newlines = data.iter().filter(|&&b| b == b'\n').count();
    newlines + usize::from(!data.is_empty() && !data.ends_with(b"\n"))
}

/// The lines of a UTF-8 input (lossy otherwise), a byte order mark before the first dropped.
fn data_lines(data: &[u8]) -> impl Iterator<Item = String> + '_ {
    data.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, line)| {
            let text = String::from_utf8_lossy(line);
            let text = text.strip_suffix('\r').unwrap_or(&text);
            match i {
                0 => text.strip_prefix('\u{feff}').unwrap_or(text).to_string(),
                _ => text.to_string(),
            }
        })
        .take(line_count(data))
}

fn check_trace(trace: &Trace, data: &[u8]) -> Result<(), String> {
    let rows = data_lines(data).filter(|l| !l.trim().is_empty()).count();
    if trace.num_requests() != rows {
        return Err(format!(
            "{} requests from {rows} non-blank lines",
            trace.num_requests()
        ));
    }
    let lines = line_count(data);
    for session in &trace.sessions {
        let Some(first) = session.turns.first() else {
            return Err(format!("session {:?} has no turns", session.id));
        };
        if first.delay.as_micros() != 0 {
            return Err(format!("session {:?} starts with a delay", session.id));
        }
        for turn in &session.turns {
            let capacity = turn.hash_ids.len().saturating_mul(TRACE_BLOCK_SIZE);
            if turn.input_length == 0 || turn.input_length > capacity {
                return Err(format!(
                    "line {}: input_length {} outside 1..={capacity}",
                    turn.line, turn.input_length
                ));
            }
            if !(1..=lines).contains(&turn.line) {
                return Err(format!("a turn names line {} of {lines}", turn.line));
            }
        }
    }
    Ok(())
}

fn within_budget(trace: &Trace) -> bool {
    // Summed here with saturation: a row may ask for up to u64::MAX output tokens.
    let sum = |tokens: fn(&servesim::trace::TraceRequest) -> usize| {
        trace
            .sessions
            .iter()
            .flat_map(|s| &s.turns)
            .fold(0u64, |sum, turn| sum.saturating_add(tokens(turn) as u64))
    };
    trace.num_requests() <= REPLAY_BUDGET.requests
        && sum(|t| t.output_length) <= REPLAY_BUDGET.output_tokens
        && sum(|t| t.input_length) <= REPLAY_BUDGET.input_tokens
}

fn check_replay(trace: &Trace) {
    let config = replay_config();
    let outcome = match replay(trace, &config, |_, _| {}) {
        Ok(outcome) => outcome,
        Err(e) => panic!("the replay did not finish: {e}"),
    };
    assert_eq!(
        outcome.records.len(),
        trace.num_requests(),
        "one record per request"
    );
    for record in &outcome.records {
        match record.status {
            RequestStatus::Completed => assert_eq!(
                record.output_length, record.max_output_tokens as u64,
                "request {} completed without all its tokens: {record:?}",
                record.request_id
            ),
            RequestStatus::Rejected => {}
            RequestStatus::Incomplete => {
                panic!("request {} never finished: {record:?}", record.request_id)
            }
        }
    }
    let again = match replay(trace, &config, |_, _| {}) {
        Ok(outcome) => outcome,
        Err(e) => panic!("the second replay did not finish: {e}"),
    };
    // Debug text compares NaN fields as equal, as they should be here.
    assert_eq!(
        format!("{:?}", outcome.records),
        format!("{:?}", again.records),
        "two replays of one trace differ"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_like_bufread() {
        assert_eq!(line_count(b""), 0);
        assert_eq!(line_count(b"a"), 1);
        assert_eq!(line_count(b"a\n"), 1);
        assert_eq!(line_count(b"a\nb"), 2);
        assert_eq!(line_count(b"\n\n"), 2);
        assert_eq!(
            data_lines(b"a\r\n\xef\xbb\xbfb\n").collect::<Vec<_>>(),
            ["a", "\u{feff}b"]
        );
    }

    #[test]
    fn fixtures_pass() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");
        for name in [
            "trace_small.jsonl",
            "sessions_incremental.jsonl",
            "bad/negative_gap.jsonl",
        ] {
            let data = std::fs::read(format!("{dir}/{name}")).expect("fixture");
            trace_line(&data);
        }
    }
}
