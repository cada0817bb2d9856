//! Reading what `loadgen trace convert` converts into [`Request`]s: loadgen's own multiturn
//! records ([`InputFormat::Records`]) or a JSONL log of OpenAI chat requests
//! ([`InputFormat::OpenaiLog`]); every malformed line is a [`ConvertError::Line`].

use std::collections::HashMap;
use std::io::BufRead;

use clap::ValueEnum;
use serde::Deserialize;
use serde_json::Value;
use servesim::trace::{BoundedReadError, TraceLines, MAX_TRACE_LINE_BYTES};

use crate::error::convert::ConvertError;
use crate::run::blocks::{ChatPrompts, PromptBlocks};

/// What the input file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// `loadgen multiturn --per-request-jsonl` records (one `raw_results` entry a line).
    Records,
    /// One OpenAI chat request a line: `{"timestamp": MS, "request": {...}, ...}`.
    OpenaiLog,
}

impl InputFormat {
    /// The name `--from` takes.
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Records => "records",
            InputFormat::OpenaiLog => "openai-log",
        }
    }
}

/// One request read from the input: who sent it, when, and its prompt as block hashes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Request {
    /// 1-based input line (for messages).
    pub line: usize,
    /// Its id in the trace.
    pub request_id: String,
    /// Its conversation; `None` stands alone.
    pub session: Option<String>,
    /// The model it asked for, when the input says.
    pub model: Option<String>,
    /// Send time, µs (any origin: the trace counts from the earliest).
    pub start_us: u64,
    /// End of its answer, µs (same origin), when known.
    pub end_us: Option<u64>,
    /// Output tokens.
    pub output_length: u64,
    /// The prompt.
    pub prompt: PromptBlocks,
    /// The server counted other prompt tokens (`usage.prompt_tokens`) than the prompt holds.
    pub usage_differs: bool,
}

/// What reading left out or noticed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadNotes {
    /// Records of failed requests (not converted; their time stays in the next turn's delay).
    pub failed: usize,
}

/// Calls `row` with each non-blank line (1-based number, text without the line end; a UTF-8
/// byte order mark on line 1 is dropped) until it returns `Ok(false)`. Invalid UTF-8 is an
/// error of its line.
fn for_each_line(
    reader: impl BufRead,
    source_name: &str,
    mut row: impl FnMut(usize, &str) -> Result<bool, String>,
) -> Result<(), ConvertError> {
    // Each line within the engine's `MAX_TRACE_LINE_BYTES`, as a trace's.
    let mut lines = TraceLines::new(reader);
    loop {
        let (line, bytes) = match lines.next_line() {
            Ok(Some(next)) => next,
            Ok(None) => return Ok(()),
            Err(BoundedReadError::LongLine { line, .. }) => {
                return Err(ConvertError::Line {
                    source_name: source_name.to_string(),
                    line,
                    message: format!(
                        "the line is longer than {MAX_TRACE_LINE_BYTES} bytes, the most a \
                         line may hold"
                    ),
                })
            }
            Err(BoundedReadError::Io(source)) => {
                return Err(ConvertError::Read {
                    source_name: source_name.to_string(),
                    source,
                })
            }
            // Lines are read one by one: no whole read to refuse.
            Err(e @ BoundedReadError::LargeFile { .. }) => {
                return Err(ConvertError::Read {
                    source_name: source_name.to_string(),
                    source: std::io::Error::other(e),
                })
            }
        };
        let at = |message: String| ConvertError::Line {
            source_name: source_name.to_string(),
            line,
            message,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            at(format!(
                "not UTF-8 text (invalid byte at column {})",
                e.valid_up_to() + 1
            ))
        })?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        let text = match line {
            1 => text.strip_prefix('\u{feff}').unwrap_or(text),
            _ => text,
        };
        if text.trim().is_empty() {
            continue;
        }
        if !row(line, text).map_err(at)? {
            return Ok(());
        }
    }
}

/// A line as a JSON object, or a message naming the column.
fn json_object(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err("expected a JSON object".to_string()),
        Err(e) => Err(format!(
            "invalid JSON: {} (column {})",
            strip_location(&e),
            e.column()
        )),
    }
}

/// serde_json's message without its " at line L column C" suffix.
fn strip_location(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    full.strip_suffix(&suffix).unwrap_or(&full).to_string()
}

/// The format of the first non-blank line: a `request` object makes an OpenAI log, `user_id`
/// and `turn` a record; `None` for an empty input.
pub(crate) fn detect(
    reader: impl BufRead,
    source_name: &str,
) -> Result<Option<InputFormat>, ConvertError> {
    let mut found = None;
    let result = for_each_line(reader, source_name, |_, text| {
        let map = json_object(text)?;
        found = Some(if map.get("request").is_some_and(Value::is_object) {
            InputFormat::OpenaiLog
        } else if map.contains_key("user_id") && map.contains_key("turn") {
            InputFormat::Records
        } else {
            return Err(
                "cannot tell the input format: neither an OpenAI log line (a \
                        \"request\" object) nor a loadgen multiturn record (\"user_id\" and \
                        \"turn\"); name it with --from"
                    .to_string(),
            );
        });
        Ok(false)
    });
    result.map(|()| found)
}

/// The fields of a multiturn record that a conversion reads.
#[derive(Deserialize)]
struct RecordRow {
    user_id: usize,
    turn: usize,
    total_latency_us: u64,
    success: bool,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    start_us: Option<u64>,
    #[serde(default)]
    prompt_blocks: Option<PromptBlocks>,
    #[serde(default)]
    merge: Option<RecordShard>,
}

/// The part of a sharded record's `merge` object that aligns the shards' clocks.
#[derive(Deserialize)]
struct RecordShard {
    run_start_unix_us: u64,
}

/// Reads multiturn records: each successful request becomes one [`Request`] of the session
/// `user-U` (failed ones are counted and left out).
pub(crate) fn read_records(
    reader: impl BufRead,
    source_name: &str,
) -> Result<(Vec<Request>, ReadNotes), ConvertError> {
    let mut out = Vec::new();
    let mut notes = ReadNotes::default();
    let mut seen: HashMap<(usize, usize), usize> = HashMap::new();
    // Some(true) once a sharded record was read, Some(false) once an unsharded one was.
    let mut sharded: Option<bool> = None;
    for_each_line(reader, source_name, |line, text| {
        json_object(text)?;
        let row: RecordRow = serde_json::from_str(text).map_err(|e| {
            format!(
                "not a loadgen multiturn record: {} (column {})",
                strip_location(&e),
                e.column()
            )
        })?;
        if let Some(first) = seen.insert((row.user_id, row.turn), line) {
            return Err(format!(
                "user {} turn {} again (first on line {first}): records of one run only",
                row.user_id, row.turn
            ));
        }
        let this_sharded = row.merge.is_some();
        if *sharded.get_or_insert(this_sharded) != this_sharded {
            return Err(
                "sharded and unsharded records mixed: convert one run's records".to_string(),
            );
        }
        if !row.success {
            notes.failed += 1;
            return Ok(true);
        }
        let start_us = row.start_us.ok_or_else(|| {
            "the record has no \"start_us\" (written by a loadgen before `trace convert`)"
                .to_string()
        })?;
        let prompt = row.prompt_blocks.ok_or_else(|| {
            "the record has no \"prompt_blocks\": the run had no tokenizer (with --url, give \
             multiturn --tokenizer)"
                .to_string()
        })?;
        if prompt.block_size == 0 || prompt.hashes.len() != prompt.tokens / prompt.block_size {
            return Err(format!(
                "\"prompt_blocks\" is inconsistent: {} hashes for {} tokens in blocks of {}",
                prompt.hashes.len(),
                prompt.tokens,
                prompt.block_size
            ));
        }
        let origin = row.merge.map_or(0, |m| m.run_start_unix_us);
        let start_us = origin
            .checked_add(start_us)
            .ok_or_else(|| "\"start_us\" is out of range".to_string())?;
        out.push(Request {
            line,
            request_id: format!("user-{}-turn-{}", row.user_id, row.turn),
            session: Some(format!("user-{}", row.user_id)),
            model: None,
            start_us,
            end_us: start_us.checked_add(row.total_latency_us),
            output_length: row.output_tokens,
            usage_differs: row.prompt_tokens.is_some_and(|p| p != prompt.tokens as u64),
            prompt,
        });
        Ok(true)
    })?;
    Ok((out, notes))
}

/// Reads an OpenAI request log: each line `{"timestamp": MS, "request": {chat body}}` with
/// optional `session_id` (or `conversation_id`), `request_id`, `latency_ms`, and the output
/// length from `output_tokens`, else `response.usage.completion_tokens`, else the request's
/// `max_completion_tokens` (or `max_tokens`). Prompts are tokenized with `prompts` and hashed
/// in blocks of `block_size`.
pub(crate) fn read_openai_log(
    reader: impl BufRead,
    source_name: &str,
    prompts: &ChatPrompts,
    block_size: usize,
) -> Result<Vec<Request>, ConvertError> {
    let mut out = Vec::new();
    for_each_line(reader, source_name, |line, text| {
        let map = json_object(text)?;
        let timestamp_ms = match map.get("timestamp") {
            Some(Value::Number(n)) => n.as_f64().unwrap_or(f64::NAN),
            Some(other) => {
                return Err(format!(
                    "\"timestamp\" must be a number of milliseconds, got {other}"
                ))
            }
            None => return Err("missing field \"timestamp\" (milliseconds)".to_string()),
        };
        let start_us = millis_to_us("timestamp", timestamp_ms)?;
        let latency_us = match map.get("latency_ms") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => {
                Some(millis_to_us("latency_ms", n.as_f64().unwrap_or(f64::NAN))?)
            }
            Some(other) => {
                return Err(format!(
                    "\"latency_ms\" must be a number of milliseconds, got {other}"
                ))
            }
        };
        let session = match (map.get("session_id"), map.get("conversation_id")) {
            (Some(a), Some(_)) if !a.is_null() => {
                return Err("give \"session_id\" or \"conversation_id\", not both".to_string())
            }
            (Some(v), _) | (None, Some(v)) => id_field("session_id", v)?,
            (None, None) => None,
        };
        let request_id = match map.get("request_id") {
            Some(v) => id_field("request_id", v)?,
            None => None,
        }
        .unwrap_or_else(|| format!("line-{line}"));
        let body = match map.get("request") {
            Some(body @ Value::Object(_)) => body,
            Some(other) => {
                return Err(format!(
                    "\"request\" must be a chat completions body (an object), got {}",
                    kind(other)
                ))
            }
            None => return Err("missing field \"request\" (the chat request body)".to_string()),
        };
        let tokens = prompts
            .tokens(body)
            .map_err(|m| format!("\"request\" is not a valid chat request: {m}"))?;
        let output_length = output_length(&map, body)?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string);
        out.push(Request {
            line,
            request_id,
            session,
            model,
            start_us,
            end_us: latency_us.and_then(|l| start_us.checked_add(l)),
            output_length,
            prompt: PromptBlocks::of(&tokens, block_size),
            usage_differs: false,
        });
        Ok(true)
    })?;
    Ok(out)
}

/// The largest time a log may give, ms (about 285 thousand years in µs: anything larger is a
/// unit mistake).
const MAX_LOG_MS: f64 = 9e15;

/// Milliseconds to whole µs, checked.
fn millis_to_us(field: &str, ms: f64) -> Result<u64, String> {
    if !(ms.is_finite() && (0.0..=MAX_LOG_MS).contains(&ms)) {
        return Err(format!(
            "\"{field}\" must be finite, >= 0 and at most {MAX_LOG_MS:e} ms, got {ms}"
        ));
    }
    Ok((ms * 1000.0).round() as u64)
}

/// What kind of JSON value `v` is, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A string or integer id; `null` is none.
fn id_field(field: &str, v: &Value) -> Result<Option<String>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Err(format!("\"{field}\" must not be empty")),
        Value::String(s) => Ok(Some(s.clone())),
        Value::Number(n) if n.is_u64() || n.is_i64() => Ok(Some(n.to_string())),
        other => Err(format!(
            "\"{field}\" must be a string or an integer, got {}",
            kind(other)
        )),
    }
}

/// The output length of a log line (see [`read_openai_log`]).
fn output_length(map: &serde_json::Map<String, Value>, body: &Value) -> Result<u64, String> {
    let count = |field: &str, v: &Value| {
        v.as_u64()
            .ok_or_else(|| format!("\"{field}\" must be a whole number >= 0, got {v}"))
    };
    if let Some(v) = map.get("output_tokens").filter(|v| !v.is_null()) {
        return count("output_tokens", v);
    }
    if let Some(v) = map
        .get("response")
        .and_then(|r| r.get("usage"))
        .and_then(|u| u.get("completion_tokens"))
        .filter(|v| !v.is_null())
    {
        return count("response.usage.completion_tokens", v);
    }
    for field in ["max_completion_tokens", "max_tokens"] {
        if let Some(v) = body.get(field).filter(|v| !v.is_null()) {
            return count(&format!("request.{field}"), v);
        }
    }
    Err(
        "no output length: give \"output_tokens\", \"response.usage.completion_tokens\" or \
         the request's \"max_completion_tokens\""
            .to_string(),
    )
}
