//! Mooncake JSONL traces: parsing, session grouping, timing normalisation and token synthesis;
//! and agentic traces as request graphs.
//!
//! Agentic formats (`agentic_mooncake` v2 and legacy, `weka`, `dynamo` request traces,
//! `mooncake-delta`, `applied_compute_agentic`) are each lowered into one [`RequestGraph`]
//! ([`load_graph`], the format named or found by [`detect_format`]): nodes with dependencies
//! (dispatch or completion trigger, a delay), grouped into plays, checked before any replay
//! (unknown sources, cycles, edges across plays, relations that need a completion trigger), each
//! error naming its line. The rest of this page is about plain Mooncake traces.
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
//!
//! Every value is range-checked, so that no row can make a replay wait or allocate without
//! bound: a line holds at most [`MAX_TRACE_LINE_BYTES`] (a file read whole at most
//! [`MAX_TRACE_FILE_BYTES`], both counted after decompression), a timestamp is finite, non-negative and at most `MAX_TIMESTAMP_MS`, a delay at most
//! `MAX_TRACE_TIME_MS`; a row
//! asks for at most [`MAX_ROW_TOKENS`] prompt tokens with at most as many hash ids, and at
//! most [`MAX_ROW_OUTPUT_TOKENS`] output tokens; the block size is at most [`MAX_TRACE_BLOCK_SIZE`]. The schedule after the
//! speed-up (the last session's arrival, each session's arrival plus its delays) is at most
//! `MAX_TRACE_TIME_MS`, and with [`parse_with_bound`] / [`load_with_bound`] at most a
//! [`ScheduleBound`]: both replays ask for `DEFAULT_MAX_SCHEDULE` (seven days) unless
//! `--allow-long-schedule`; beyond it the row is a [`TraceError::LongSchedule`].

mod agentic;
mod applied;
mod blake3;
mod delta;
mod dynamo;
mod graph;
mod hash;
mod lines;
mod parse;
mod plain;
mod row;
pub mod synthetic;
mod weka;

pub use agentic::AGENTIC_MOONCAKE_SCHEMA;
#[cfg(test)]
pub(crate) use graph::min_scans::so_far as graph_min_scans;
pub(crate) use graph::Relation;
pub use graph::{
    detect_format, Dependency, GraphNode, Play, RequestGraph, TraceFormat, Trigger,
    MAX_GRAPH_HASH_IDS,
};
pub use hash::LocalHashCache;
pub use lines::{
    read_whole, BoundedReadError, TraceLines, MAX_TRACE_FILE_BYTES, MAX_TRACE_LINE_BYTES,
};

/// True when the parser's direct reader of plain rows (integer fields and an integer
/// `hash_ids` array) leaves `line` to serde_json or reads it exactly as serde_json does; the
/// fuzzing checkers assert it on every line they parse.
#[doc(hidden)]
pub fn plain_row_agrees(line: &str) -> bool {
    plain::agrees_with_serde_json(line)
}
pub use parse::{parse, parse_with_bound};

use std::path::{Path, PathBuf};

use crate::time::{SimDuration, SimTime};

/// Longest schedule a trace may describe, after the speed-up, unless the caller allows more
/// ([`ScheduleBound::Unbounded`]): seven days.
pub(crate) const DEFAULT_MAX_SCHEDULE: SimDuration =
    SimDuration::from_micros(7 * 86_400 * 1_000_000);

/// Largest time any timestamp, delay or schedule point may stand for, in ms, whatever the
/// bound: 10^12 ms (about 31.7 years), far inside what [`SimTime`] holds.
pub(crate) const MAX_TRACE_TIME_MS: f64 = 1e12;

/// Largest raw `timestamp`, in ms: 2^53, beyond which an f64 no longer holds whole
/// milliseconds (timestamps are absolute; the schedule starts at the earliest one).
pub(crate) const MAX_TIMESTAMP_MS: f64 = 9_007_199_254_740_992.0;

/// Most prompt tokens (after clamping to what `hash_ids` cover) a row may ask for, and most
/// hash ids it may hold: 2^22 (4,194,304).
pub const MAX_ROW_TOKENS: usize = 1 << 22;

/// Most output tokens a row may ask for: 2^30. Larger than any context, so that a row the
/// engine can never run is still read (and counted as rejected by the replay), yet bounded.
pub const MAX_ROW_OUTPUT_TOKENS: usize = 1 << 30;

/// Largest `trace_block_size`: 2^20 tokens per hash id.
pub const MAX_TRACE_BLOCK_SIZE: usize = 1 << 20;

/// How long a trace's schedule may run once sped up: the arrival of its last session, and each
/// session's arrival plus the sum of its delays. The replays, which wait for (or report) the
/// schedule, bound it by [`ScheduleBound::Default`] unless `--allow-long-schedule`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleBound {
    /// At most `DEFAULT_MAX_SCHEDULE` (the replays' default).
    Default,
    /// At most this long (itself at most `MAX_TRACE_TIME_MS`).
    AtMost(SimDuration),
    /// Any length up to `MAX_TRACE_TIME_MS` (`--allow-long-schedule`).
    Unbounded,
}

impl ScheduleBound {
    /// The bound in ms.
    pub(crate) fn millis(self) -> f64 {
        match self {
            ScheduleBound::Default => DEFAULT_MAX_SCHEDULE.as_millis_f64(),
            ScheduleBound::AtMost(d) => d.as_millis_f64().min(MAX_TRACE_TIME_MS),
            ScheduleBound::Unbounded => MAX_TRACE_TIME_MS,
        }
    }

    /// `--allow-long-schedule` given or not.
    pub fn of_flag(allow_long_schedule: bool) -> ScheduleBound {
        if allow_long_schedule {
            ScheduleBound::Unbounded
        } else {
            ScheduleBound::Default
        }
    }
}

/// A span of trace time in words: `12.5 days`, `3.2 hours`, `42 s` (never a 309-digit number).
pub(crate) fn describe_ms(ms: f64) -> String {
    let s = ms / 1e3;
    if !s.is_finite() {
        "an unbounded time".to_string()
    } else if s >= 365.25 * 86_400.0 {
        let years = s / (365.25 * 86_400.0);
        if years >= 1e6 {
            format!("{years:.1e} years")
        } else {
            format!("{years:.1} years")
        }
    } else if s >= 86_400.0 {
        format!("{:.1} days", s / 86_400.0)
    } else if s >= 3_600.0 {
        format!("{:.1} hours", s / 3_600.0)
    } else {
        format!("{s:.3} s")
    }
}

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
    #[cfg(test)]
    pub(crate) fn total_input_tokens(&self) -> u64 {
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
    #[cfg(test)]
    pub(crate) fn total_output_tokens(&self) -> u64 {
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
    /// A directory that cannot be read as a weka corpus.
    #[error("{}: {message}", path.display())]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A trace read whole is larger than [`MAX_TRACE_FILE_BYTES`] (after decompression).
    #[error(
        "{source_name}: the trace is larger than {cap} bytes, the most a trace read whole may \
         hold"
    )]
    TooLarge {
        /// The file name (or other label) of the trace.
        source_name: String,
        /// The cap, in bytes.
        cap: usize,
    },
    /// The trace has no rows.
    #[error("{source_name}: trace contains no requests")]
    Empty {
        /// The file name (or other label) of the trace.
        source_name: String,
    },
    /// A row's arrival or a session's end (arrival plus delays), after the speed-up, is later
    /// than the [`ScheduleBound`] allows.
    #[error(
        "{source_name}:{line}: {what} {} after the trace's start, beyond the {} a trace's \
         schedule may run; {}",
        describe_ms(*at_ms),
        describe_ms(*bound_ms),
        if *bound_ms < MAX_TRACE_TIME_MS {
            format!(
                "pass --allow-long-schedule to replay it anyway (up to {}), or a larger \
                 --arrival-speedup-ratio",
                describe_ms(MAX_TRACE_TIME_MS)
            )
        } else {
            "pass a larger --arrival-speedup-ratio".to_string()
        }
    )]
    LongSchedule {
        /// The file name (or other label) of the trace.
        source_name: String,
        /// 1-based line of the row that ends past the bound.
        line: usize,
        /// `the session "s" arrives` or `the session "s" ends at least`.
        what: String,
        /// When, in (sped-up) ms after the trace's start.
        at_ms: f64,
        /// The bound, ms.
        bound_ms: f64,
    },
    /// The options are invalid (block size zero or above [`MAX_TRACE_BLOCK_SIZE`], speedup ratio
    /// not finite and positive).
    #[error("invalid trace options: {message}")]
    Options {
        /// What is wrong.
        message: String,
    },
}

/// Reads and parses the trace at `path` (its schedule up to `MAX_TRACE_TIME_MS`, as
/// [`parse`]); errors name the file as given.
pub fn load(path: &Path, opts: &TraceOptions) -> Result<Trace, TraceError> {
    load_with_bound(path, opts, ScheduleBound::Unbounded)
}

/// [`load`] with a schedule bound of the caller's.
pub fn load_with_bound(
    path: &Path,
    opts: &TraceOptions,
    bound: ScheduleBound,
) -> Result<Trace, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_with_bound(
        std::io::BufReader::new(file),
        &path.display().to_string(),
        opts,
        bound,
    )
}

/// Reads the agentic trace at `path` (a file, or a directory of weka files) as `format` into a
/// validated [`RequestGraph`];
/// `trace_block_size` is the tokens per hash id for formats whose file does not name it (legacy
/// agentic Mooncake). [`TraceFormat::Auto`] detects the format first ([`detect_format`]); plain
/// Mooncake is not a graph (read it with [`load`]).
pub fn load_graph(
    path: &Path,
    format: TraceFormat,
    trace_block_size: usize,
) -> Result<RequestGraph, TraceError> {
    let format = detect_format(path, format)?;
    if path.is_dir() {
        return match format {
            TraceFormat::Weka => weka::parse_corpus(path),
            other => Err(TraceError::Directory {
                path: path.to_path_buf(),
                message: format!("a directory is read only as a weka corpus, not as {other}"),
            }),
        };
    }
    parse_graph(
        graph::open(path)?,
        &path.display().to_string(),
        format,
        trace_block_size,
    )
}

/// [`load_graph`] over a reader (`Auto` reads it all to detect the format); `source_name`
/// labels errors.
pub fn parse_graph(
    mut reader: impl std::io::BufRead,
    source_name: &str,
    format: TraceFormat,
    trace_block_size: usize,
) -> Result<RequestGraph, TraceError> {
    if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&trace_block_size) {
        return Err(TraceError::Options {
            message: format!(
                "the trace block size must be from 1 to {MAX_TRACE_BLOCK_SIZE}, got \
                 {trace_block_size}"
            ),
        });
    }
    if format == TraceFormat::Auto {
        let bytes =
            read_whole(&mut reader, MAX_TRACE_FILE_BYTES).map_err(|e| e.in_trace(source_name))?;
        let format = graph::detect_in(&bytes[..], source_name)?;
        return parse_graph(&bytes[..], source_name, format, trace_block_size);
    }
    match format {
        TraceFormat::Auto | TraceFormat::AgenticMooncake => {
            agentic::parse(reader, source_name, trace_block_size)
        }
        TraceFormat::Weka => weka::parse(reader, source_name),
        TraceFormat::Dynamo => dynamo::parse(reader, source_name),
        TraceFormat::AppliedComputeAgentic => applied::parse(reader, source_name, trace_block_size),
        TraceFormat::MooncakeDelta => delta::parse(reader, source_name, trace_block_size),
        TraceFormat::Mooncake => Err(TraceError::Options {
            message: format!("the {format} format is not a request graph this replay reads"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzipped_request_traces_are_read() {
        use std::io::Write;
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/agentic");
        let text = std::fs::read(dir.join("dynamo_request_trace.jsonl")).expect("fixture");
        let path =
            std::env::temp_dir().join(format!("servesim-trace-{}.jsonl.gz", std::process::id()));
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).expect("temp file"),
            flate2::Compression::fast(),
        );
        gz.write_all(&text).expect("writes");
        gz.finish().expect("finishes");
        let g = load_graph(&path, TraceFormat::Auto, 512).expect("reads");
        assert_eq!((g.format, g.nodes.len()), (TraceFormat::Dynamo, 3));
        std::fs::remove_file(&path).ok();
    }

    /// A small `.jsonl.gz` that inflates to one line over `MAX_TRACE_LINE_BYTES` is refused
    /// with the file, the line and the cap, as the format is detected and as it is parsed,
    /// without inflating more than the cap (issue 43: 2 MB inflating to a 2 GiB line aborted).
    #[test]
    fn a_gzipped_line_over_the_cap_is_refused_with_its_line() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!(
            "servesim-long-line-{}.jsonl.gz",
            std::process::id()
        ));
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).expect("temp file"),
            flate2::Compression::fast(),
        );
        gz.write_all(b"{\"timestamp\":").expect("writes");
        gz.write_all(&vec![b'1'; MAX_TRACE_LINE_BYTES])
            .expect("writes");
        gz.finish().expect("finishes");
        let want = format!(
            "{}:1: the line is longer than 16777216 bytes, the most a trace line may hold",
            path.display()
        );
        for format in [TraceFormat::Auto, TraceFormat::Dynamo] {
            let e = load_graph(&path, format, 64).expect_err("too long a line");
            assert_eq!(e.to_string(), want, "{format}");
        }
        std::fs::remove_file(&path).ok();
    }

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
