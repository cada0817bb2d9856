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

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::time::{SimDuration, SimTime};
use crate::tokens::{local_block_hash, local_block_hashes, LocalBlockHash, Token};

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
            .sum()
    }

    /// Turns whose row asked for more prompt tokens than its `hash_ids` cover (the prompt was
    /// cut to what they cover), in session order.
    pub fn clamped_turns(&self) -> impl Iterator<Item = &Turn> {
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
            .sum()
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
    pub turns: Vec<Turn>,
}

/// One request of a session.
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
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

impl Turn {
    /// The prompt as token ids: `trace_block_size` copies of `hash_id as u32` per hash id
    /// (u64 → u32 truncation, as Dynamo does), truncated to `input_length`.
    pub fn synthesize_tokens(&self, trace_block_size: usize) -> Vec<Token> {
        let mut tokens = Vec::with_capacity(self.input_length);
        for &id in &self.hash_ids {
            let remaining = self.input_length - tokens.len();
            if remaining == 0 {
                break;
            }
            let n = remaining.min(trace_block_size);
            tokens.extend(std::iter::repeat_n(id as Token, n));
        }
        tokens
    }

    /// Local hashes of every full engine block of the synthesized prompt: exactly
    /// `local_block_hashes(&self.synthesize_tokens(trace_block_size), cache.block_size())`.
    ///
    /// When `trace_block_size` is a multiple of the engine block size, every full engine block is
    /// `block_size` copies of one token, so its hash depends only on the hash id and is memoised
    /// in `cache`; no tokens are materialised. Otherwise this falls back to synthesizing tokens.
    pub fn engine_block_local_hashes(
        &self,
        trace_block_size: usize,
        cache: &mut LocalHashCache,
    ) -> Vec<LocalBlockHash> {
        let block_size = cache.block_size;
        if trace_block_size == 0 || trace_block_size % block_size != 0 {
            return local_block_hashes(&self.synthesize_tokens(trace_block_size), block_size);
        }
        let num_blocks = self.input_length / block_size;
        let per_trace_block = trace_block_size / block_size;
        let mut out = Vec::with_capacity(num_blocks);
        for &id in &self.hash_ids {
            if out.len() == num_blocks {
                break;
            }
            let hash = cache.uniform_block(id as Token);
            let n = per_trace_block.min(num_blocks - out.len());
            out.extend(std::iter::repeat_n(hash, n));
        }
        out
    }
}

/// Memoised local hashes of uniform engine blocks (`block_size` copies of one token).
///
/// Tied to one engine block size; share one across all turns of a replay.
#[derive(Clone, Debug)]
pub struct LocalHashCache {
    /// Engine block size the memoised hashes were computed for.
    block_size: usize,
    /// Token value -> local hash of a block made only of that token.
    hashes: HashMap<Token, LocalBlockHash>,
}

impl LocalHashCache {
    /// An empty cache for engine blocks of `block_size` tokens (values below 1 are treated as 1).
    pub fn new(block_size: usize) -> LocalHashCache {
        LocalHashCache {
            block_size: block_size.max(1),
            hashes: HashMap::new(),
        }
    }

    /// The engine block size this cache serves.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of distinct tokens memoised.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// True when nothing has been memoised yet.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    fn uniform_block(&mut self, token: Token) -> LocalBlockHash {
        let block_size = self.block_size;
        *self
            .hashes
            .entry(token)
            .or_insert_with(|| local_block_hash(&vec![token; block_size]))
    }
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

/// A row as written in the file; every field optional so missing ones get our own messages.
#[derive(Deserialize)]
struct RawRow {
    #[serde(default, alias = "created_time")]
    timestamp: Option<f64>,
    #[serde(default, alias = "input_tokens")]
    input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    session_id: Option<serde_json::Value>,
    #[serde(default, alias = "delay_ms")]
    delay: Option<f64>,
    #[serde(default)]
    request_id: Option<serde_json::Value>,
}

/// A string or integer identifier as a string; anything else names the field and what it got.
fn id_string(field: &str, value: serde_json::Value) -> Result<String, String> {
    use serde_json::Value;
    let got = match value {
        Value::String(s) => return Ok(s),
        Value::Number(n) if n.is_i64() || n.is_u64() => return Ok(n.to_string()),
        Value::Number(n) => format!("the number {n}"),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
        Value::Null => "null".to_string(),
    };
    Err(format!(
        "\"{field}\" must be a string or an integer, got {got}"
    ))
}

/// Session identity while grouping: named sessions merge, anonymous rows never do.
#[derive(Clone, PartialEq, Eq, Hash)]
enum SessionKey {
    Named(String),
    Anonymous(usize),
}

/// A validated row before timing normalisation (times still in trace milliseconds).
struct RowTurn {
    timestamp: Option<f64>,
    delay: Option<f64>,
    turn: Turn,
}

/// A session with its timing still in trace milliseconds (before normalisation).
struct StagedSession {
    id: String,
    first_ts_ms: f64,
    /// Each turn with its delay in trace milliseconds.
    turns: Vec<(Turn, f64)>,
}

/// Parses a Mooncake JSONL trace from `reader`; `source_name` labels errors (usually the path).
pub fn parse(
    reader: impl BufRead,
    source_name: &str,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    if opts.trace_block_size == 0 {
        return Err(TraceError::Options {
            message: "trace_block_size must be positive".to_string(),
        });
    }
    let ratio = opts.arrival_speedup_ratio;
    if !(ratio.is_finite() && ratio > 0.0) {
        return Err(TraceError::Options {
            message: format!("arrival_speedup_ratio must be finite and > 0, got {ratio}"),
        });
    }
    let line_err = |line: usize, message: String| TraceError::Line {
        source_name: source_name.to_string(),
        line,
        message,
    };

    let mut index: HashMap<SessionKey, usize> = HashMap::new();
    let mut groups: Vec<(String, Vec<RowTurn>)> = Vec::new();
    for (i, text) in reader.lines().enumerate() {
        let line = i + 1;
        let text = text.map_err(|source| TraceError::Io {
            path: PathBuf::from(source_name),
            source,
        })?;
        // Editors on some platforms start UTF-8 files with a byte order mark.
        let text = match line {
            1 => text.strip_prefix('\u{feff}').unwrap_or(&text),
            _ => &text,
        };
        if text.trim().is_empty() {
            continue;
        }
        let (key, row) =
            parse_row(text, line, opts.trace_block_size).map_err(|m| line_err(line, m))?;
        let slot = match index.get(&key) {
            Some(&slot) => slot,
            None => {
                let id = match &key {
                    SessionKey::Named(s) => s.clone(),
                    SessionKey::Anonymous(l) => format!("request_{l}"),
                };
                groups.push((id, Vec::new()));
                index.insert(key, groups.len() - 1);
                groups.len() - 1
            }
        };
        if let Some((_, rows)) = groups.get_mut(slot) {
            rows.push(row);
        }
    }
    if groups.is_empty() {
        return Err(TraceError::Empty {
            source_name: source_name.to_string(),
        });
    }

    // Per session: first-arrival timestamp (ms) and delays (ms), validated.
    let mut staged: Vec<StagedSession> = Vec::with_capacity(groups.len());
    for (id, rows) in groups {
        let mut first_ts = 0.0;
        let mut prev_ts: Option<f64> = None;
        let mut turns = Vec::with_capacity(rows.len());
        for (n, row) in rows.into_iter().enumerate() {
            let line = row.turn.line;
            let delay_ms = if n == 0 {
                let Some(ts) = row.timestamp else {
                    return Err(line_err(
                        line,
                        format!("first turn of session \"{id}\" has no \"timestamp\""),
                    ));
                };
                if let Some(d) = row.delay {
                    if d != 0.0 {
                        return Err(line_err(
                            line,
                            format!(
                                "first turn of session \"{id}\" must not have a delay (got {d})"
                            ),
                        ));
                    }
                }
                first_ts = ts;
                0.0
            } else if let Some(d) = row.delay {
                d
            } else if let Some(ts) = row.timestamp {
                let Some(prev) = prev_ts else {
                    return Err(line_err(
                        line,
                        format!(
                            "cannot derive the delay of turn {n} of session \"{id}\": \
                             the previous turn has no \"timestamp\""
                        ),
                    ));
                };
                let gap = ts - prev;
                if gap < 0.0 {
                    return Err(line_err(
                        line,
                        format!(
                            "timestamp {ts} is earlier than the previous turn's {prev} \
                             in session \"{id}\" (negative delay)"
                        ),
                    ));
                }
                gap
            } else {
                0.0
            };
            if !(delay_ms.is_finite() && delay_ms >= 0.0) {
                return Err(line_err(
                    line,
                    format!("delay must be finite and >= 0, got {delay_ms}"),
                ));
            }
            prev_ts = row.timestamp;
            turns.push((row.turn, delay_ms));
        }
        staged.push(StagedSession {
            id,
            first_ts_ms: first_ts,
            turns,
        });
    }

    let min_first = staged
        .iter()
        .map(|s| s.first_ts_ms)
        .fold(f64::INFINITY, f64::min);
    let sessions = staged
        .into_iter()
        .map(|s| Session {
            id: s.id,
            first_arrival: SimTime(
                SimDuration::from_millis_f64((s.first_ts_ms - min_first) / ratio).0,
            ),
            turns: s
                .turns
                .into_iter()
                .map(|(mut turn, delay_ms)| {
                    turn.delay = SimDuration::from_millis_f64(delay_ms / ratio);
                    turn
                })
                .collect(),
        })
        .collect();
    Ok(Trace { sessions })
}

/// Parses and validates one non-empty line; the error is the message without location.
fn parse_row(
    text: &str,
    line: usize,
    trace_block_size: usize,
) -> Result<(SessionKey, RowTurn), String> {
    if !text.trim_start().starts_with('{') {
        return Err("invalid JSON row: expected a JSON object".to_string());
    }
    let raw: RawRow = serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let msg = full.strip_suffix(&suffix).unwrap_or(&full);
        format!("invalid JSON row: {msg} (column {})", e.column())
    })?;
    let hash_ids = raw
        .hash_ids
        .ok_or_else(|| "missing field \"hash_ids\"".to_string())?;
    if hash_ids.is_empty() {
        return Err("\"hash_ids\" must not be empty".to_string());
    }
    let output_length = raw
        .output_length
        .ok_or_else(|| "missing field \"output_length\"".to_string())?;
    let output_length = usize::try_from(output_length)
        .map_err(|_| format!("\"output_length\" {output_length} is too large"))?;
    if output_length == 0 {
        return Err(
            "\"output_length\" must be at least 1 (every request generates a token)".to_string(),
        );
    }
    for (name, value) in [("timestamp", raw.timestamp), ("delay", raw.delay)] {
        if let Some(v) = value {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("\"{name}\" must be finite and >= 0, got {v}"));
            }
        }
    }
    let capacity = hash_ids
        .len()
        .checked_mul(trace_block_size)
        .ok_or_else(|| "hash_ids.len() * trace_block_size overflows".to_string())?;
    let requested = match raw.input_length {
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => capacity,
    };
    if requested == 0 {
        return Err("\"input_length\" must be > 0".to_string());
    }
    let input_length = requested.min(capacity);
    let requested_input_length = (requested > capacity).then_some(requested);
    let key = match raw.session_id {
        Some(id) => SessionKey::Named(id_string("session_id", id)?),
        None => SessionKey::Anonymous(line),
    };
    let request_id = raw
        .request_id
        .map(|id| id_string("request_id", id))
        .transpose()?;
    Ok((
        key,
        RowTurn {
            timestamp: raw.timestamp,
            delay: raw.delay,
            turn: Turn {
                line,
                request_id,
                input_length,
                requested_input_length,
                output_length,
                hash_ids,
                delay: SimDuration::ZERO,
            },
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(tbs: usize, ratio: f64) -> TraceOptions {
        TraceOptions {
            trace_block_size: tbs,
            arrival_speedup_ratio: ratio,
        }
    }

    fn parse_str(s: &str, o: &TraceOptions) -> Result<Trace, TraceError> {
        parse(s.as_bytes(), "trace.jsonl", o)
    }

    fn err_of(s: &str) -> (usize, String) {
        match parse_str(s, &opts(4, 1.0)) {
            Err(TraceError::Line { line, message, .. }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn aliases_and_defaults() {
        let t = parse_str(
            "{\"created_time\": 5, \"input_tokens\": 6, \"output_tokens\": 3, \"hash_ids\": [1,2], \"extra\": true}\n\
             \n   \n\
             {\"timestamp\": 7.5, \"output_length\": 2, \"hash_ids\": [1,2,3], \"request_id\": 9}\n",
            &opts(4, 1.0),
        )
        .expect("parses");
        assert_eq!(t.sessions.len(), 2);
        assert_eq!(t.sessions[0].id, "request_1");
        assert_eq!(t.sessions[1].id, "request_4");
        let a = &t.sessions[0].turns[0];
        assert_eq!((a.input_length, a.output_length, a.line), (6, 3, 1));
        let b = &t.sessions[1].turns[0];
        // input_length defaults to capacity.
        assert_eq!((b.input_length, b.line), (12, 4));
        assert_eq!(b.request_id.as_deref(), Some("9"));
        assert_eq!(t.sessions[0].first_arrival, SimTime::ZERO);
        assert_eq!(t.sessions[1].first_arrival, SimTime(2_500));
        assert_eq!(t.num_requests(), 2);
        assert_eq!(t.total_input_tokens(), 18);
        assert_eq!(t.total_output_tokens(), 5);
    }

    #[test]
    fn input_length_is_clamped_to_capacity_and_the_row_is_listed() {
        let t = parse_str(
            "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [1,2]}\n\
             {\"timestamp\": 0, \"input_length\": 8, \"output_length\": 1, \"hash_ids\": [1,2]}",
            &opts(4, 1.0),
        )
        .expect("parses");
        let turns: Vec<&Turn> = t.sessions.iter().flat_map(|s| &s.turns).collect();
        assert_eq!(turns[0].input_length, 8);
        assert_eq!(turns[0].requested_input_length, Some(100));
        assert_eq!(
            turns[1].requested_input_length, None,
            "the full capacity is fine"
        );
        let clamped: Vec<usize> = t.clamped_turns().map(|t| t.line).collect();
        assert_eq!(clamped, [1]);
    }

    #[test]
    fn a_byte_order_mark_before_the_first_row_is_skipped() {
        let text = "\u{feff}{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n";
        let t = parse_str(text, &opts(4, 1.0)).expect("parses");
        assert_eq!(t.num_requests(), 1);
        // Elsewhere it is not whitespace: the row is not JSON.
        let text = format!("{{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}}\n{text}");
        assert_eq!(err_of(&text).0, 2);
    }

    #[test]
    fn sessions_and_delays() {
        let t = parse_str(
            r#"{"session_id": "a", "timestamp": 1000, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1100, "output_length": 1, "hash_ids": [9]}
{"session_id": "a", "delay_ms": 250, "timestamp": 1500, "output_length": 1, "hash_ids": [1, 2]}
{"session_id": 7, "timestamp": 900, "output_length": 1, "hash_ids": [3]}
{"session_id": "a", "timestamp": 2000, "output_length": 1, "hash_ids": [1, 2, 3]}
{"session_id": "7", "timestamp": 950.25, "delay": 0, "output_length": 1, "hash_ids": [3, 4]}
{"session_id": "a", "output_length": 1, "hash_ids": [1, 2, 3, 4]}
"#,
            &opts(4, 1.0),
        )
        .expect("parses");
        let ids: Vec<&str> = t.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "request_2", "7"]);
        let a = &t.sessions[0];
        assert_eq!(a.first_arrival, SimTime(100_000));
        let delays: Vec<u64> = a.turns.iter().map(|x| x.delay.as_micros()).collect();
        // turn 0: zero; explicit delay wins over the timestamp gap; gap 2000 - 1500; nothing: 0.
        assert_eq!(delays, [0, 250_000, 500_000, 0]);
        let lines: Vec<usize> = a.turns.iter().map(|x| x.line).collect();
        assert_eq!(lines, [1, 3, 5, 7]);
        assert_eq!(t.sessions[1].first_arrival, SimTime(200_000));
        let s7 = &t.sessions[2];
        assert_eq!(s7.first_arrival, SimTime::ZERO);
        // An explicit delay of 0 is used as is, not replaced by the timestamp gap.
        assert_eq!(s7.turns[1].delay, SimDuration::ZERO);
    }

    #[test]
    fn speedup_divides_arrivals_and_delays() {
        let text = r#"{"session_id": "s", "timestamp": 100, "output_length": 1, "hash_ids": [1]}
{"timestamp": 200, "output_length": 1, "hash_ids": [2]}
{"session_id": "s", "timestamp": 160.5, "output_length": 1, "hash_ids": [1]}
"#;
        let t = parse_str(text, &opts(4, 10.0)).expect("parses");
        assert_eq!(t.sessions[0].first_arrival, SimTime::ZERO);
        assert_eq!(t.sessions[1].first_arrival, SimTime(10_000));
        assert_eq!(t.sessions[0].turns[1].delay, SimDuration(6_050));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                parse_str(text, &opts(4, bad)),
                Err(TraceError::Options { .. })
            ));
        }
        assert!(matches!(
            parse_str(text, &opts(0, 1.0)),
            Err(TraceError::Options { .. })
        ));
    }

    #[test]
    fn errors_name_the_line() {
        let ok = r#"{"timestamp": 0, "output_length": 1, "hash_ids": [1]}"#;
        let cases: &[(&str, &str)] = &[
            ("{not json", "invalid JSON"),
            (
                r#"{"timestamp": 0, "output_length": 1}"#,
                "missing field \"hash_ids\"",
            ),
            (
                r#"{"timestamp": 0, "hash_ids": [1]}"#,
                "missing field \"output_length\"",
            ),
            (
                r#"{"timestamp": 0, "output_length": 1, "hash_ids": []}"#,
                "must not be empty",
            ),
            (
                r#"{"timestamp": 0, "output_length": -1, "hash_ids": [1]}"#,
                "invalid value",
            ),
            (
                r#"{"timestamp": 0, "output_length": 1, "hash_ids": ["x"]}"#,
                "invalid type",
            ),
            (
                r#"{"timestamp": -5, "output_length": 1, "hash_ids": [1]}"#,
                "\"timestamp\" must be finite and >= 0",
            ),
            (
                r#"{"timestamp": 0, "delay": -1, "session_id": "q", "output_length": 1, "hash_ids": [1]}"#,
                "\"delay\" must be",
            ),
            (
                r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}"#,
                "\"input_length\" must be > 0",
            ),
            (
                r#"{"timestamp": 0, "output_length": 0, "hash_ids": [1]}"#,
                "\"output_length\" must be at least 1",
            ),
            (
                r#"{"timestamp": 0, "session_id": {"user": 1}, "output_length": 1, "hash_ids": [1]}"#,
                "\"session_id\" must be a string or an integer, got an object",
            ),
            (
                r#"{"timestamp": 0, "request_id": 1.5, "output_length": 1, "hash_ids": [1]}"#,
                "\"request_id\" must be a string or an integer, got the number 1.5",
            ),
            (
                r#"{"output_length": 1, "hash_ids": [1]}"#,
                "has no \"timestamp\"",
            ),
            (
                r#"{"timestamp": 3, "delay": 2, "output_length": 1, "hash_ids": [1]}"#,
                "must not have a delay",
            ),
            (
                r#"{"timestamp": 1e999, "output_length": 1, "hash_ids": [1]}"#,
                "invalid JSON",
            ),
            (r#"[1, 2]"#, "invalid JSON"),
        ];
        for (row, want) in cases {
            let text = format!("{ok}\n\n{row}\n{ok}\n");
            let (line, message) = err_of(&text);
            assert_eq!(line, 3, "{row}: {message}");
            assert!(message.contains(want), "{row}: {message:?} lacks {want:?}");
        }
    }

    #[test]
    fn session_timing_errors() {
        let (line, msg) = err_of(
            r#"{"session_id": "s", "timestamp": 10, "output_length": 1, "hash_ids": [1]}
{"session_id": "s", "timestamp": 5, "output_length": 1, "hash_ids": [1]}"#,
        );
        assert_eq!(line, 2);
        assert!(msg.contains("negative delay"), "{msg}");
        let (line, msg) = err_of(
            r#"{"session_id": "s", "timestamp": 10, "output_length": 1, "hash_ids": [1]}
{"session_id": "s", "delay": 1, "output_length": 1, "hash_ids": [1]}
{"session_id": "s", "timestamp": 50, "output_length": 1, "hash_ids": [1]}"#,
        );
        assert_eq!(line, 3);
        assert!(msg.contains("previous turn has no"), "{msg}");
    }

    #[test]
    fn display_reads_file_colon_line() {
        let e = parse_str(
            "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 0, \"output_length\": 1}",
            &opts(4, 1.0),
        )
        .expect_err("fails");
        assert_eq!(e.to_string(), "trace.jsonl:2: missing field \"hash_ids\"");
    }

    #[test]
    fn empty_trace_is_an_error() {
        assert!(matches!(
            parse_str("\n  \n", &opts(4, 1.0)),
            Err(TraceError::Empty { .. })
        ));
    }

    #[test]
    fn synthesized_tokens_repeat_hash_ids() {
        let turn = Turn {
            line: 1,
            request_id: None,
            input_length: 6,
            requested_input_length: None,
            output_length: 1,
            hash_ids: vec![7, (1u64 << 32) + 3, 9],
            delay: SimDuration::ZERO,
        };
        assert_eq!(turn.synthesize_tokens(4), [7, 7, 7, 7, 3, 3]);
    }

    #[test]
    fn memoised_engine_hashes_match_materialised_tokens() {
        let shapes: &[(usize, usize, usize, usize)] = &[
            // (trace block, engine block, hash ids, input_length)
            (512, 64, 3, 1536),
            (512, 64, 3, 1500), // partial last engine block
            (512, 64, 3, 1000), // ends inside the second trace block
            (512, 512, 2, 700),
            (8, 4, 5, 39),
            (8, 1, 2, 16),
            (6, 4, 4, 23), // trace block not a multiple of the engine block
            (3, 4, 5, 15),
            (4, 8, 3, 12),
        ];
        for &(tbs, bs, n, input_length) in shapes {
            let turn = Turn {
                line: 1,
                request_id: None,
                input_length,
                requested_input_length: None,
                output_length: 1,
                hash_ids: (0..n as u64).map(|i| i * 0x1_0000_0001 + 5).collect(),
                delay: SimDuration::ZERO,
            };
            let mut cache = LocalHashCache::new(bs);
            let want = local_block_hashes(&turn.synthesize_tokens(tbs), bs);
            assert_eq!(
                turn.engine_block_local_hashes(tbs, &mut cache),
                want,
                "{tbs} {bs}"
            );
            // Second call served from the cache.
            assert_eq!(turn.engine_block_local_hashes(tbs, &mut cache), want);
        }
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
