//! Reading Mooncake JSONL: each line checked into a [`TraceRequest`] (errors carry the 1-based
//! line), rows grouped into sessions, delays derived and times normalised.

use std::collections::HashMap;
use std::io::BufRead;

use super::lines::TraceLines;
use super::plain::plain_row;
use super::row::RawRow;
use super::{
    describe_ms, ScheduleBound, Session, Trace, TraceError, TraceOptions, TraceRequest,
    MAX_ROW_OUTPUT_TOKENS, MAX_ROW_TOKENS, MAX_TIMESTAMP_MS, MAX_TRACE_BLOCK_SIZE,
    MAX_TRACE_TIME_MS,
};
use crate::time::{SimDuration, SimTime};

/// A string or integer identifier as a string; anything else names the field and what it got.
pub(super) fn id_string(field: &str, value: serde_json::Value) -> Result<String, String> {
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
#[derive(Debug)]
enum SessionKey {
    Named(String),
    Anonymous(usize),
}

/// A validated row before timing normalisation (times still in trace milliseconds).
struct RowTurn {
    timestamp: Option<f64>,
    delay: Option<f64>,
    turn: TraceRequest,
}

/// A session with its timing still in trace milliseconds (before normalisation).
struct StagedSession {
    id: String,
    first_ts_ms: f64,
    /// Each turn with its delay in trace milliseconds.
    turns: Vec<(TraceRequest, f64)>,
}

/// `x` for a message: scientific notation for very large or very small magnitudes (never a
/// 309-digit number).
pub(super) fn show(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// Parses a Mooncake JSONL trace from `reader`; `source_name` labels errors (usually the
/// path). The schedule may run up to `MAX_TRACE_TIME_MS`: a caller that waits for it bounds it
/// further with [`parse_with_bound`].
pub fn parse(
    reader: impl BufRead,
    source_name: &str,
    opts: &TraceOptions,
) -> Result<Trace, TraceError> {
    parse_with_bound(reader, source_name, opts, ScheduleBound::Unbounded)
}

/// [`parse`] with a schedule bound of the caller's: the sped-up arrival of every session and
/// its arrival plus its delays are at most `bound`.
pub fn parse_with_bound(
    reader: impl BufRead,
    source_name: &str,
    opts: &TraceOptions,
    bound: ScheduleBound,
) -> Result<Trace, TraceError> {
    if !(1..=MAX_TRACE_BLOCK_SIZE).contains(&opts.trace_block_size) {
        return Err(TraceError::Options {
            message: format!(
                "the trace block size must be from 1 to {MAX_TRACE_BLOCK_SIZE}, got {}",
                opts.trace_block_size
            ),
        });
    }
    let ratio = opts.arrival_speedup_ratio;
    if !(ratio.is_finite() && ratio > 0.0) {
        return Err(TraceError::Options {
            message: format!(
                "the arrival speed-up ratio must be finite and > 0, got {}",
                show(ratio)
            ),
        });
    }
    let bound_ms = bound.millis();
    let line_err = |line: usize, message: String| TraceError::Line {
        source_name: source_name.to_string(),
        line,
        message,
    };

    // Named sessions by id, to their group.
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<(String, Vec<RowTurn>)> = Vec::new();
    // Split on bytes, not `lines()`: invalid UTF-8 is then an error of its own line, not an
    // I/O error of the whole file. One buffer serves every line, each at most
    // `MAX_TRACE_LINE_BYTES`.
    let mut lines = TraceLines::new(reader);
    while let Some((line, bytes)) = lines.next_line().map_err(|e| e.in_trace(source_name))? {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            let column = e.valid_up_to() + 1;
            line_err(
                line,
                format!("not UTF-8 text (invalid byte at column {column})"),
            )
        })?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        // Editors on some platforms start UTF-8 files with a byte order mark.
        let text = match line {
            1 => text.strip_prefix('\u{feff}').unwrap_or(text),
            _ => text,
        };
        if text.trim().is_empty() {
            continue;
        }
        let (key, row) =
            parse_row(text, line, opts.trace_block_size).map_err(|m| line_err(line, m))?;
        match key {
            // A row without a session is a session of its own: nothing to look up.
            SessionKey::Anonymous(l) => groups.push((format!("request_{l}"), vec![row])),
            SessionKey::Named(id) => match index.get(&id) {
                Some(&slot) => groups[slot].1.push(row),
                None => {
                    index.insert(id.clone(), groups.len());
                    groups.push((id, vec![row]));
                }
            },
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
                                "first turn of session \"{id}\" must not have a delay (got {})",
                                show(d)
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
                            "timestamp {} is earlier than the previous turn's {} \
                             in session \"{id}\" (negative delay)",
                            show(ts),
                            show(prev)
                        ),
                    ));
                }
                gap
            } else {
                0.0
            };
            if !(delay_ms.is_finite() && (0.0..=MAX_TRACE_TIME_MS).contains(&delay_ms)) {
                return Err(line_err(
                    line,
                    format!(
                        "delay must be finite, >= 0 and at most {} ms ({}), got {}",
                        show(MAX_TRACE_TIME_MS),
                        describe_ms(MAX_TRACE_TIME_MS),
                        show(delay_ms)
                    ),
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
    // The schedule once sped up, in f64 ms (no overflow, no saturation): every session's
    // arrival, then its arrival plus each delay, against the bound.
    for s in &staged {
        let long = |line: usize, what: String, at_ms: f64| TraceError::LongSchedule {
            source_name: source_name.to_string(),
            line,
            what,
            at_ms,
            bound_ms,
        };
        let first_line = s.turns.first().map_or(0, |(t, _)| t.line);
        let mut at_ms = (s.first_ts_ms - min_first) / ratio;
        if at_ms.is_nan() || at_ms > bound_ms {
            return Err(long(
                first_line,
                format!("session \"{}\" arrives", s.id),
                at_ms,
            ));
        }
        for (n, (turn, delay_ms)) in s.turns.iter().enumerate().skip(1) {
            at_ms += delay_ms / ratio;
            if at_ms.is_nan() || at_ms > bound_ms {
                return Err(long(
                    turn.line,
                    format!(
                        "turn {n} of session \"{}\" is due (its arrival plus its delays) at least",
                        s.id
                    ),
                    at_ms,
                ));
            }
        }
    }
    let sessions = staged
        .into_iter()
        .map(|s| Session {
            id: s.id,
            first_arrival: SimTime::from_millis_f64((s.first_ts_ms - min_first) / ratio),
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

/// A row read by serde_json (any shape JSON allows); the error names the column.
fn serde_row(text: &str) -> Result<RawRow, String> {
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let msg = full.strip_suffix(&suffix).unwrap_or(&full);
        format!("invalid JSON row: {msg} (column {})", e.column())
    })
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
    let raw = match plain_row(text) {
        Some(raw) => raw,
        None => serde_row(text)?,
    };
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
        .ok()
        .filter(|&n| n <= MAX_ROW_OUTPUT_TOKENS)
        .ok_or_else(|| {
            format!(
                "\"output_length\" must be at most {MAX_ROW_OUTPUT_TOKENS}, got {output_length}"
            )
        })?;
    if hash_ids.len() > MAX_ROW_TOKENS {
        return Err(format!(
            "\"hash_ids\" holds {} ids, more than the {MAX_ROW_TOKENS} a row may hold",
            hash_ids.len()
        ));
    }
    if output_length == 0 {
        return Err(
            "\"output_length\" must be at least 1 (every request generates a token)".to_string(),
        );
    }
    for (name, value, max) in [
        ("timestamp", raw.timestamp, MAX_TIMESTAMP_MS),
        ("delay", raw.delay, MAX_TRACE_TIME_MS),
    ] {
        if let Some(v) = value {
            if !(v.is_finite() && (0.0..=max).contains(&v)) {
                return Err(format!(
                    "\"{name}\" must be finite, >= 0 and at most {} ms, got {}",
                    show(max),
                    show(v)
                ));
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
    if input_length > MAX_ROW_TOKENS {
        return Err(format!(
            "the prompt is {input_length} tokens ({}), more than the {MAX_ROW_TOKENS} a row \
             may ask for",
            if raw.input_length.is_some() {
                "\"input_length\""
            } else {
                "hash_ids.len() x trace block size"
            }
        ));
    }
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
            turn: TraceRequest {
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

    /// A Mooncake row of exactly `MAX_TRACE_LINE_BYTES` is read; a line one byte longer is
    /// refused with the file, its line and the cap, after reading at most the cap and a byte of
    /// it (issue 43: a 1 GiB line aborted the replay on a failed allocation).
    #[test]
    fn a_line_one_byte_over_the_cap_is_refused_with_its_line() {
        use crate::trace::MAX_TRACE_LINE_BYTES;
        let row =
            "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}";
        let padded = |len: usize| format!("{row}{}", " ".repeat(len - row.len()));
        let at_cap = format!("{row}\n{}\n", padded(MAX_TRACE_LINE_BYTES));
        let t = parse_str(&at_cap, &opts(4, 1.0)).expect("a line at the cap is read");
        assert_eq!(t.num_requests(), 2);
        let over = format!("{row}\n{}\n{row}\n", padded(MAX_TRACE_LINE_BYTES + 1));
        let e = parse_str(&over, &opts(4, 1.0)).expect_err("one byte over");
        assert_eq!(
            e.to_string(),
            "trace.jsonl:2: the line is longer than 16777216 bytes, the most a trace line may hold"
        );
        // An endless line (no newline ever) ends too.
        let endless = std::io::BufReader::new(std::io::Read::chain(
            &b"{\"timestamp\": "[..],
            std::io::repeat(b'1'),
        ));
        let e = parse(endless, "zero", &opts(4, 1.0)).expect_err("endless");
        assert!(matches!(e, TraceError::Line { line: 1, .. }), "{e}");
    }

    #[test]
    fn invalid_utf8_names_its_line_and_crlf_is_accepted() {
        let row =
            "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 1, \"hash_ids\": [1]}";
        let mut bytes = format!("{row}\r\n").into_bytes();
        bytes.extend_from_slice(b"{\"timestamp\": 1, \xff}\n");
        match parse(&bytes[..], "trace.jsonl", &opts(4, 1.0)) {
            Err(TraceError::Line { line, message, .. }) => {
                assert_eq!(line, 2);
                assert!(
                    message.contains("not UTF-8") && message.contains("column 18"),
                    "{message}"
                );
            }
            other => panic!("expected a line error, got {other:?}"),
        }
        let crlf = format!("{row}\r\n{row}\r\n");
        let trace = parse_str(&crlf, &opts(4, 1.0)).expect("CRLF rows parse");
        assert_eq!(trace.total_output_tokens(), 2);
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
        assert_eq!(t.sessions[1].first_arrival, SimTime::from_micros(2_500));
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
        let turns: Vec<&TraceRequest> = t.sessions.iter().flat_map(|s| &s.turns).collect();
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
        assert_eq!(a.first_arrival, SimTime::from_micros(100_000));
        let delays: Vec<u64> = a.turns.iter().map(|x| x.delay.as_micros()).collect();
        // turn 0: zero; explicit delay wins over the timestamp gap; gap 2000 - 1500; nothing: 0.
        assert_eq!(delays, [0, 250_000, 500_000, 0]);
        let lines: Vec<usize> = a.turns.iter().map(|x| x.line).collect();
        assert_eq!(lines, [1, 3, 5, 7]);
        assert_eq!(t.sessions[1].first_arrival, SimTime::from_micros(200_000));
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
        assert_eq!(t.sessions[1].first_arrival, SimTime::from_micros(10_000));
        assert_eq!(
            t.sessions[0].turns[1].delay,
            SimDuration::from_micros(6_050)
        );
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
                "\"timestamp\" must be finite, >= 0",
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
            (
                r#"{"timestamp": 1e300, "output_length": 1, "hash_ids": [1]}"#,
                "\"timestamp\" must be finite, >= 0 and at most 9.007199254740992e15 ms, got 1e300",
            ),
            (
                r#"{"timestamp": 0, "session_id": "q", "delay": 1e18, "output_length": 1, "hash_ids": [1]}"#,
                "\"delay\" must be finite, >= 0 and at most 1e12 ms, got 1e18",
            ),
            (
                r#"{"timestamp": 0, "output_length": 1073741825, "hash_ids": [1]}"#,
                "\"output_length\" must be at most 1073741824, got 1073741825",
            ),
            (
                r#"{"timestamp": 0, "output_length": 18446744073709551615, "hash_ids": [1]}"#,
                "\"output_length\" must be at most 1073741824",
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

    /// Timestamps and delays far in the future are refused with the row's line, before any
    /// replay could wait for them; a long schedule passes when the caller lifts the bound.
    #[test]
    fn the_schedule_is_bounded() {
        let week = ScheduleBound::Default;
        let week_ms = 7.0 * 86_400_000.0;
        let far = format!(
            "{{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}}\n\
             {{\"timestamp\": {}, \"output_length\": 1, \"hash_ids\": [1]}}\n",
            week_ms + 1.0
        );
        match parse_with_bound(far.as_bytes(), "trace.jsonl", &opts(4, 1.0), week) {
            Err(TraceError::LongSchedule {
                line,
                at_ms,
                bound_ms,
                ..
            }) => {
                assert_eq!(line, 2);
                assert_eq!(at_ms, week_ms + 1.0);
                assert_eq!(bound_ms, week_ms);
            }
            other => panic!("expected a long schedule, got {other:?}"),
        }
        let e =
            parse_with_bound(far.as_bytes(), "trace.jsonl", &opts(4, 1.0), week).expect_err("long");
        assert_eq!(
            e.to_string(),
            "trace.jsonl:2: session \"request_2\" arrives 7.0 days after the trace's start, \
             beyond the 7.0 days a trace's schedule may run; pass --allow-long-schedule to \
             replay it anyway (up to 31.7 years), or a larger --arrival-speedup-ratio"
        );
        // The speed-up applies first: at 2x the same rows fit.
        let t = parse_with_bound(far.as_bytes(), "t", &opts(4, 2.0), week).expect("fits at 2x");
        assert_eq!(
            t.sessions[1].first_arrival.as_micros(),
            (week_ms + 1.0) as u64 * 500
        );
        let t = parse_str(&far, &opts(4, 1.0)).expect("parse leaves the schedule to the caller");
        assert_eq!(
            t.sessions[1].first_arrival.as_micros(),
            (week_ms + 1.0) as u64 * 1000
        );
        // Delays add up: each is short, the session is not.
        let day = 86_400_000.0;
        let mut text = String::from(
            "{\"session_id\": \"s\", \"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n",
        );
        for _ in 0..8 {
            text.push_str(&format!(
                "{{\"session_id\": \"s\", \"delay\": {day}, \"output_length\": 1, \"hash_ids\": [1]}}\n"
            ));
        }
        match parse_with_bound(text.as_bytes(), "t", &opts(4, 1.0), week) {
            Err(TraceError::LongSchedule { line, at_ms, .. }) => {
                assert_eq!((line, at_ms), (9, 8.0 * day));
            }
            other => panic!("expected a long schedule, got {other:?}"),
        }
        let bounded = ScheduleBound::AtMost(SimDuration::from_millis(1000));
        match parse_with_bound(far.as_bytes(), "t", &opts(4, 1e5), bounded) {
            Err(TraceError::LongSchedule { line: 2, .. }) => {}
            other => panic!("expected a long schedule, got {other:?}"),
        }
        // A tiny speed-up stretches the schedule past any bound without overflowing.
        let e = parse_with_bound(
            far.as_bytes(),
            "t",
            &opts(4, 1e-290),
            ScheduleBound::Unbounded,
        )
        .expect_err("stretched");
        assert_eq!(
            e.to_string(),
            "t:2: session \"request_2\" arrives 1.9e288 years after the trace's start, beyond \
             the 31.7 years a trace's schedule may run; pass a larger --arrival-speedup-ratio"
        );
    }

    /// Prompt sizes, hash ids and the block size are capped; the messages name the row.
    #[test]
    fn token_counts_are_bounded() {
        let big = opts(MAX_TRACE_BLOCK_SIZE, 1.0);
        let row = r#"{"timestamp": 0, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]}"#;
        match parse_str(row, &big) {
            Err(TraceError::Line { line, message, .. }) => {
                assert_eq!(line, 1);
                assert!(message.contains("more than the 4194304"), "{message}");
            }
            other => panic!("expected a line error, got {other:?}"),
        }
        let row = r#"{"timestamp": 0, "input_length": 4194304, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]}"#;
        assert_eq!(
            parse_str(row, &big)
                .expect("at the cap")
                .total_input_tokens(),
            1 << 22
        );
        for tbs in [0, MAX_TRACE_BLOCK_SIZE + 1, 1 << 32] {
            let e = parse_str(row, &opts(tbs, 1.0)).expect_err("bad block size");
            assert!(
                matches!(&e, TraceError::Options { message } if message.contains(&tbs.to_string())),
                "{e}"
            );
        }
        let e = parse_str(row, &opts(4, f64::MAX * 10.0)).expect_err("inf");
        assert!(e.to_string().contains("got inf"), "{e}");
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
}
