//! Mooncake JSONL traces: parsing, session grouping, timing normalisation and token synthesis.
//!
//! One JSON object per line (empty lines are skipped, unknown fields ignored, a UTF-8 byte order
//! mark before the first line is skipped):
//!
//! | field | type | notes |
//! |---|---|---|
//! | `timestamp` | f64 ms | alias `created_time`; arrival offset of the row |
//! | `input_length` | int | alias `input_tokens`; > 0; defaults to and is clamped at `hash_ids.len() * trace_block_size` |
//! | `output_length` | int | alias `output_tokens`; required, >= 1 |
//! | `hash_ids` | u64[] | required, non-empty; one id per `trace_block_size` prompt tokens |
//! | `session_id` | string or int | rows sharing it form one multi-turn session |
//! | `delay` | f64 ms | alias `delay_ms`; wait after the previous turn completes |
//! | `request_id` | string or int | kept for per-request records |
//!
//! A row whose `input_length` is beyond what its `hash_ids` cover keeps the prompt they cover
//! (there are no tokens for the rest); it is not silent: [`Trace::clamped_turns`] lists such
//! rows and the replay warns about them, since it usually means the trace block size is wrong
//! (Mooncake traces use 512).
//!
//! [`parse`] groups rows into [`Session`]s (file order), computes each later turn's delay (explicit
//! `delay`, else the timestamp gap to the previous turn), subtracts the earliest first arrival and
//! divides arrivals and delays by `arrival_speedup_ratio`, as Dynamo's offline replay does. Every
//! malformed line is a [`TraceError::Line`] naming the file and the 1-based line.

mod hash;
mod parse;
mod plain;

pub use hash::LocalHashCache;

/// True when the parser's direct reader of plain rows (integer fields and an integer
/// `hash_ids` array) leaves `line` to serde_json or reads it exactly as serde_json does; the
/// fuzzing checkers assert it on every line they parse.
#[doc(hidden)]
pub fn plain_row_agrees(line: &str) -> bool {
    plain::agrees_with_serde_json(line)
}
pub use parse::parse;

use std::path::{Path, PathBuf};

use crate::time::{SimDuration, SimTime};

/// How to interpret a trace file.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceOptions {
    /// Prompt tokens per `hash_ids` entry (512 in the public Mooncake traces).
    pub trace_block_size: usize,
    /// Arrival times and inter-turn delays are divided by this (finite, > 0; 1.0 = as recorded).
    pub arrival_speedup_ratio: f64,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            trace_block_size: 512,
            arrival_speedup_ratio: 1.0,
        }
    }
}

/// A loaded trace: every session, in order of first appearance in the file.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Sessions in order of first appearance; single-row sessions for rows without `session_id`.
    pub sessions: Vec<Session>,
}

impl Trace {
    /// Number of requests (turns over all sessions).
    pub fn num_requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Sum of the (clamped) input lengths of every turn.
    pub fn total_input_tokens(&self) -> u64 {
        self.sessions
            .iter()
            .flat_map(|s| &s.turns)
            .map(|t| t.input_length as u64)
            .fold(0, u64::saturating_add)
    }

    /// Turns whose row asked for more prompt tokens than its `hash_ids` cover (the prompt was
    /// cut to what they cover), in session order.
    pub fn clamped_turns(&self) -> impl Iterator<Item = &TraceRequest> {
        self.sessions
            .iter()
            .flat_map(|s| &s.turns)
            .filter(|t| t.requested_input_length.is_some())
    }

    /// Sum of the requested output lengths of every turn.
    pub fn total_output_tokens(&self) -> u64 {
        self.sessions
            .iter()
            .flat_map(|s| &s.turns)
            .map(|t| t.output_length as u64)
            .fold(0, u64::saturating_add)
    }
}

/// A closed-loop conversation: turn `n + 1` is sent `delay` after turn `n` completes.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// The row's `session_id`, or `request_{line}` for a row without one.
    pub id: String,
    /// When the first turn arrives (normalised and sped up).
    pub first_arrival: SimTime,
    /// Turns in file order; never empty.
    pub turns: Vec<TraceRequest>,
}

/// One request of a session as the trace describes it (a turn of the conversation), before it
/// becomes an [`EngineRequest`](crate::request::EngineRequest).
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    /// 1-based line of the row in the trace file, for error messages and records.
    pub line: usize,
    /// The row's `request_id`, if any.
    pub request_id: Option<String>,
    /// Prompt length in tokens, at most `hash_ids.len() * trace_block_size`; always > 0.
    pub input_length: usize,
    /// The row's `input_length` when it was beyond what `hash_ids` cover (`input_length` is
    /// then their capacity); None otherwise.
    pub requested_input_length: Option<usize>,
    /// Number of tokens to generate (the row's `output_length`).
    pub output_length: usize,
    /// Prompt identity, one label per trace block; rows sharing a leading run share a prefix.
    pub hash_ids: Vec<u64>,
    /// Wait after the previous turn completes (sped up); zero for turn 0.
    pub delay: SimDuration,
}

/// Why a trace could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {}", path.display())]
    Io {
        /// The file (or source name) being read.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A row is malformed or inconsistent with its session.
    #[error("{source_name}:{line}: {message}")]
    Line {
        /// The file name (or other label) of the trace.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the row.
        message: String,
    },
    /// The trace has no rows.
    #[error("{source_name}: trace contains no requests")]
    Empty {
        /// The file name (or other label) of the trace.
        source_name: String,
    },
    /// The options are invalid (block size zero, speedup ratio not finite and positive).
    #[error("invalid trace options: {message}")]
    Options {
        /// What is wrong.
        message: String,
    },
}

/// Reads and parses the trace at `path`; errors name the file as given.
pub fn load(path: &Path, opts: &TraceOptions) -> Result<Trace, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(
        std::io::BufReader::new(file),
        &path.display().to_string(),
        opts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let t = load(&dir.join("trace_small.jsonl"), &TraceOptions::default()).expect("loads");
        assert_eq!(t.num_requests(), 20);
        assert!(t.sessions.iter().any(|s| s.turns.len() == 3));
        let bad_dir = dir.join("bad");
        let mut names: Vec<_> = std::fs::read_dir(&bad_dir)
            .expect("bad fixtures")
            .map(|e| e.expect("entry").path())
            .collect();
        names.sort();
        assert!(!names.is_empty());
        for path in names {
            let e = load(&path, &TraceOptions::default()).expect_err("bad fixture fails");
            assert!(
                matches!(e, TraceError::Line { .. }),
                "{}: {e}",
                path.display()
            );
        }
        let missing = load(&dir.join("nope.jsonl"), &TraceOptions::default());
        assert!(matches!(missing, Err(TraceError::Io { .. })));
    }
}
