//! The JSONL dataset format: one JSON value per line, each one conversation (blank lines are
//! skipped, a UTF-8 byte order mark before the first line too):
//!
//! - a string: the prompt;
//! - `{"prompt": "...", ...}`: the prompt (a completions request body; other keys ignored);
//! - `{"messages": [...], ...}`: a chat request body's messages;
//! - `[...]`: a list of messages.
//!
//! A message is `{"role": "user"|"assistant"|"system"|"developer", "content": ...}` whose
//! content is a string, `null`, or a list of `{"type": "text", "text": "..."}` parts (joined
//! with newlines). In an object, `output_tokens`, `max_tokens` or `max_completion_tokens` (the
//! first present; an integer from 1 to 2^22) is the output length of every turn of the line.
//! Lines are read through a line cap and a file cap; every error names `PATH:LINE`.

use std::path::Path;

use serde_json::Value;

use crate::capped::RecordLines;
use crate::dataset::{cut, Conversation, DatasetError, Origin, Role};
use crate::error::LoadgenError;
use crate::limits;

/// Keys of an object line that give its output length, in the order they are looked at.
const LENGTH_KEYS: [&str; 3] = ["output_tokens", "max_tokens", "max_completion_tokens"];

/// Reads the JSONL file `path` into conversations, one per non-blank line, in file order.
pub(crate) fn read(
    path: &Path,
    line_cap: u64,
    file_cap: u64,
) -> Result<Vec<Conversation>, LoadgenError> {
    let mut lines = RecordLines::with_named_caps(
        path,
        (line_cap, "MAX_DATASET_LINE_BYTES"),
        (file_cap, "MAX_DATASET_FILE_BYTES"),
    )?;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while lines.next(&mut buf)? {
        let line = lines.line();
        let bytes = match (line, buf.strip_prefix(b"\xEF\xBB\xBF".as_slice())) {
            (1, Some(rest)) => rest,
            _ => &buf[..],
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let conversation = parse_line(bytes, line).map_err(|message| DatasetError::Line {
            path: path.to_path_buf(),
            line,
            message,
        })?;
        out.push(conversation);
    }
    Ok(out)
}

/// One line's conversation, or what is wrong with it.
fn parse_line(bytes: &[u8], line: usize) -> Result<Conversation, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| cut(&e.to_string()))?;
    let origin = Origin::Line(line);
    match value {
        Value::String(prompt) => Ok(Conversation::of_messages(
            origin,
            vec![(Role::User, prompt)],
            None,
        )),
        Value::Array(messages) => Ok(Conversation::of_messages(
            origin,
            messages_of(messages)?,
            None,
        )),
        Value::Object(mut map) => {
            let output_tokens = output_length(&map)?;
            let messages = match (map.remove("prompt"), map.remove("messages")) {
                (Some(_), Some(_)) => {
                    return Err("both \"prompt\" and \"messages\": give one".into())
                }
                (Some(Value::String(prompt)), None) => vec![(Role::User, prompt)],
                (Some(_), None) => {
                    return Err("\"prompt\" must be a string (token ids are not read)".into())
                }
                (None, Some(Value::Array(messages))) => messages_of(messages)?,
                (None, Some(_)) => return Err("\"messages\" must be a list of messages".into()),
                (None, None) => {
                    return Err("an object line needs \"prompt\" or \"messages\"".into())
                }
            };
            Ok(Conversation::of_messages(origin, messages, output_tokens))
        }
        _ => Err(
            "expected a string, an object with \"prompt\" or \"messages\", or a list of \
                  messages"
                .into(),
        ),
    }
}

/// The output length an object line asks for, if any.
fn output_length(map: &serde_json::Map<String, Value>) -> Result<Option<usize>, String> {
    let Some((key, value)) = LENGTH_KEYS.iter().find_map(|&k| map.get(k).map(|v| (k, v))) else {
        return Ok(None);
    };
    match value.as_u64() {
        Some(n) if n >= 1 && n <= limits::MAX_OUTPUT_TOKENS as u64 => Ok(Some(n as usize)),
        _ => Err(format!(
            "\"{key}\" must be an integer from 1 to {}, got {}",
            limits::MAX_OUTPUT_TOKENS,
            cut(&value.to_string())
        )),
    }
}

/// The messages of a list, each its role and text.
fn messages_of(messages: Vec<Value>) -> Result<Vec<(Role, String)>, String> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(m).map_err(|e| format!("message {i}: {e}")))
        .collect()
}

/// One chat message's role and text.
fn message(m: Value) -> Result<(Role, String), String> {
    let Value::Object(mut m) = m else {
        return Err("expected an object with \"role\" and \"content\"".into());
    };
    let role = match m.get("role").and_then(Value::as_str) {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("system" | "developer") => Role::System,
        Some(other) => {
            return Err(format!(
                "\"role\" is {:?}: expected user, assistant, system or developer",
                cut(other)
            ))
        }
        None => return Err("\"role\" must be a string".into()),
    };
    let text = match m.remove("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => parts
            .into_iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => Ok(t.clone()),
                    _ => Err(
                        "\"content\" parts must be {\"type\": \"text\", \"text\": \"...\"} \
                          (only text is sent)"
                            .to_string(),
                    ),
                },
            )
            .collect::<Result<Vec<_>, _>>()?
            .join("\n"),
        Some(_) => return Err("\"content\" must be a string, null or a list of text parts".into()),
    };
    Ok((role, text))
}
