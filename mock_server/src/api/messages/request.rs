//! A Messages body read into the chat request the engine path runs ([`to_chat`]): `system`
//! becomes the leading system message, `tool_use` blocks the assistant's `tool_calls`,
//! `tool_result` blocks `tool` messages, `tools` and `tool_choice` their chat forms, as vLLM's
//! `AnthropicServingMessages` converts them. Every malformed field is a 400 naming it, in the
//! Messages API's own terms (`messages.0.content.1.type`), before the chat parser sees it.

use serde_json::{json, Map, Value};

use super::MAX_MESSAGES;
use crate::api::budget::{exceeded, MAX_STOPS, MAX_STOP_BYTES};
use crate::api::error::ApiError;

/// Characters of a client's value quoted in an error message at most.
const ECHO_CHARS: usize = 40;

/// `value` quoted for an error message, cut to [`ECHO_CHARS`] characters.
fn echo(value: &str) -> String {
    match value.char_indices().nth(ECHO_CHARS) {
        Some((end, _)) => format!("{:?}...", &value[..end]),
        None => format!("{value:?}"),
    }
}

/// A 400 naming `param`, written as Anthropic's validation messages are (`param: message`).
fn invalid(param: &str, message: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("{param}: {message}"), Some(param))
}

/// What a Messages body asks for besides the chat request it becomes.
#[derive(Debug)]
pub(crate) struct Translated {
    /// The chat completions body the engine path parses.
    pub chat: Map<String, Value>,
    /// `stream`.
    pub stream: bool,
}

/// The chat body of a Messages body; `count_only` (`/v1/messages/count_tokens`) does not
/// require `max_tokens`.
pub(crate) fn to_chat(body: &Map<String, Value>, count_only: bool) -> Result<Translated, ApiError> {
    let mut chat = Map::new();
    match body.get("model") {
        Some(Value::String(model)) => chat.insert("model".into(), Value::String(model.clone())),
        None | Some(Value::Null) => return Err(invalid("model", "Field required")),
        Some(_) => return Err(invalid("model", "Input should be a valid string")),
    };
    match body.get("max_tokens") {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|n| n >= 1) => {
            chat.insert("max_tokens".into(), Value::Number(n.clone()));
        }
        None | Some(Value::Null) if count_only => {}
        None | Some(Value::Null) => return Err(invalid("max_tokens", "Field required")),
        Some(_) => {
            return Err(invalid(
                "max_tokens",
                "Input should be an integer greater than or equal to 1",
            ))
        }
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream", "Input should be a valid boolean")),
    };
    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    sampling(body, &mut chat)?;
    if let Some(stops) = stop_sequences(body)? {
        chat.insert("stop".into(), stops);
    }
    match body.get("metadata") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(_) => return Err(invalid("metadata", "Input should be an object")),
    }
    let mut messages = Vec::new();
    let mut system = system_text(body.get("system"))?;
    let raw = match body.get("messages") {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(invalid("messages", "Field required")),
        Some(_) => return Err(invalid("messages", "Input should be a valid list")),
    };
    if raw.is_empty() {
        return Err(invalid("messages", "at least one message is required"));
    }
    if raw.len() > MAX_MESSAGES {
        return Err(exceeded(
            "messages",
            format!("{} messages given", raw.len()),
            format!("{MAX_MESSAGES} messages per request"),
        ));
    }
    for (i, message) in raw.iter().enumerate() {
        convert_message(message, i, &mut messages, &mut system)?;
    }
    if !system.is_empty() {
        messages.insert(0, json!({"role": "system", "content": system}));
    }
    chat.insert("messages".into(), Value::Array(messages));
    let tools = tools(body.get("tools"))?;
    if let Some(choice) = tool_choice(body.get("tool_choice"))? {
        let forced = choice == "required" || choice.is_object();
        if forced
            && tools
                .as_ref()
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty)
        {
            return Err(invalid(
                "tool_choice",
                "'any' and 'tool' need at least one tool in 'tools'",
            ));
        }
        chat.insert("tool_choice".into(), choice);
    }
    if let Some(tools) = tools {
        chat.insert("tools".into(), tools);
    }
    Ok(Translated { chat, stream })
}

/// Checks `temperature` (0 to 1, as Anthropic's), `top_p` and `top_k`; all are accepted and
/// have no effect on the answer. `ignore_eos` (vLLM's extension) is passed on.
fn sampling(body: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    for (name, max) in [("temperature", 1.0), ("top_p", 1.0), ("top_k", f64::MAX)] {
        match body.get(name) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if n.as_f64().is_some_and(|v| (0.0..=max).contains(&v)) => {
                if name == "temperature" {
                    chat.insert(name.into(), Value::Number(n.clone()));
                }
            }
            Some(_) if max == f64::MAX => {
                return Err(invalid(name, "Input should be a non-negative integer"))
            }
            Some(_) => {
                return Err(invalid(
                    name,
                    format!("Input should be a number from 0 to {max}"),
                ))
            }
        }
    }
    // vLLM's `ignore_eos` extension (exact output lengths, what load generators send) goes
    // through to the engine as on chat.
    match body.get("ignore_eos") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            chat.insert("ignore_eos".into(), Value::Bool(*b));
        }
        Some(_) => return Err(invalid("ignore_eos", "Input should be a valid boolean")),
    }
    Ok(())
}

/// `stop_sequences` as the chat `stop` list, held to the chat route's caps.
fn stop_sequences(body: &Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let param = "stop_sequences";
    let items = match body.get(param) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items,
        Some(_) => return Err(invalid(param, "Input should be a list of strings")),
    };
    if items.len() > MAX_STOPS {
        return Err(exceeded(
            param,
            format!("{} stop sequences given", items.len()),
            format!("{MAX_STOPS} stop sequences"),
        ));
    }
    if let Some(long) = items
        .iter()
        .filter_map(Value::as_str)
        .find(|s| s.len() > MAX_STOP_BYTES)
    {
        return Err(exceeded(
            param,
            format!("a stop sequence of {} bytes given", long.len()),
            format!("{MAX_STOP_BYTES} bytes (UTF-8) per stop sequence"),
        ));
    }
    Ok(Some(Value::Array(items.clone())))
}

/// The text of `system`: a string or a list of text blocks, joined as vLLM joins them.
fn system_text(value: Option<&Value>) -> Result<String, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (j, block) in blocks.iter().enumerate() {
                let param = format!("system.{j}");
                match block_type(block, &param)? {
                    "text" => text.push_str(block_text(block, &param)?),
                    other => {
                        return Err(invalid(
                            &param,
                            format!("system blocks must be text, not {}", echo(other)),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(invalid(
            "system",
            "Input should be a string or a list of text blocks",
        )),
    }
}

/// A block's `type`, or a 400 naming the block.
fn block_type<'a>(block: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    match block.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ if !block.is_object() => Err(invalid(param, "Input should be an object")),
        _ => Err(invalid(&format!("{param}.type"), "Field required")),
    }
}

/// A text block's `text`, or a 400 naming it.
fn block_text<'a>(block: &'a Value, param: &str) -> Result<&'a str, ApiError> {
    match block.get("text") {
        Some(Value::String(t)) => Ok(t),
        _ => Err(invalid(
            &format!("{param}.text"),
            "Field required (a string)",
        )),
    }
}

/// A string field of a block, or a 400 naming it.
fn block_str<'a>(block: &'a Value, param: &str, name: &str) -> Result<&'a str, ApiError> {
    match block.get(name) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(invalid(
            &format!("{param}.{name}"),
            "Field required (a string)",
        )),
    }
}

/// Appends the chat messages of Messages entry `i`: the `tool` messages of its `tool_result`
/// blocks, then the message with its text (and, for the assistant, its `tool_calls`). A
/// `system` entry (which vLLM accepts) adds to the system text.
fn convert_message(
    message: &Value,
    i: usize,
    out: &mut Vec<Value>,
    system: &mut String,
) -> Result<(), ApiError> {
    let param = format!("messages.{i}");
    let Some(message) = message.as_object() else {
        return Err(invalid(&param, "Input should be an object"));
    };
    let role = match message.get("role") {
        Some(Value::String(r)) if matches!(r.as_str(), "user" | "assistant" | "system") => {
            r.as_str()
        }
        Some(Value::String(r)) => {
            return Err(invalid(
                &format!("{param}.role"),
                format!("Input should be 'user' or 'assistant', not {}", echo(r)),
            ))
        }
        _ => return Err(invalid(&format!("{param}.role"), "Field required")),
    };
    let content_param = format!("{param}.content");
    let blocks = match message.get("content") {
        Some(Value::String(text)) => {
            if role == "system" {
                system.push_str(text);
            } else {
                out.push(json!({"role": role, "content": text}));
            }
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        None | Some(Value::Null) => return Err(invalid(&content_param, "Field required")),
        Some(_) => {
            return Err(invalid(
                &content_param,
                "Input should be a string or a list of content blocks",
            ))
        }
    };
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{content_param}.{j}");
        match block_type(block, &at)? {
            "text" => texts.push(json!({"type": "text", "text": block_text(block, &at)?})),
            "tool_use" if role == "assistant" => {
                let input = match block.get("input") {
                    Some(input @ Value::Object(_)) => input.to_string(),
                    _ => {
                        return Err(invalid(
                            &format!("{at}.input"),
                            "Field required (an object)",
                        ))
                    }
                };
                calls.push(json!({
                    "id": block_str(block, &at, "id")?,
                    "type": "function",
                    "function": {"name": block_str(block, &at, "name")?, "arguments": input},
                }));
            }
            "tool_result" if role == "user" => {
                let id = block_str(block, &at, "tool_use_id")?;
                let content = tool_result_text(block.get("content"), &at)?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            "tool_use" | "tool_result" => {
                let owner = if role == "user" { "assistant" } else { "user" };
                return Err(invalid(
                    &format!("{at}.type"),
                    format!(
                        "{} blocks belong in {owner} messages",
                        block_type(block, &at)?
                    ),
                ));
            }
            // Earlier reasoning, sent back as it was answered: the chat template drops
            // reasoning from history, as vLLM's does.
            "thinking" | "redacted_thinking" => {}
            "image" | "document" => {
                return Err(invalid(
                    &format!("{at}.type"),
                    "this server answers text only: image and document blocks are not \
                     supported",
                ))
            }
            other => {
                return Err(invalid(
                    &format!("{at}.type"),
                    format!(
                        "unsupported content block type {}; supported: 'text', 'tool_use', \
                         'tool_result', 'thinking'",
                        echo(other)
                    ),
                ))
            }
        }
    }
    if role == "system" {
        for text in &texts {
            system.push_str(text["text"].as_str().unwrap_or_default());
        }
        return Ok(());
    }
    if texts.is_empty() && calls.is_empty() {
        // A user turn of tool results only: its tool messages stand for it.
        return Ok(());
    }
    let mut chat = json!({"role": role, "content": texts});
    if !calls.is_empty() {
        chat["tool_calls"] = Value::Array(calls);
    }
    out.push(chat);
    Ok(())
}

/// The text of a `tool_result` block's `content`: a string or a list of text blocks.
fn tool_result_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let param = format!("{at}.content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (k, block) in blocks.iter().enumerate() {
                let inner = format!("{param}.{k}");
                match block_type(block, &inner)? {
                    "text" => parts.push(block_text(block, &inner)?),
                    other => {
                        return Err(invalid(
                            &format!("{inner}.type"),
                            format!(
                                "tool results hold text blocks only on this server, not {}",
                                echo(other)
                            ),
                        ))
                    }
                }
            }
            Ok(parts.join("\n"))
        }
        Some(_) => Err(invalid(
            &param,
            "Input should be a string or a list of text blocks",
        )),
    }
}

/// `tools` as chat function tools.
fn tools(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("tools", "Input should be a valid list")),
    };
    let mut tools = Vec::with_capacity(items.len());
    for (i, tool) in items.iter().enumerate() {
        let param = format!("tools.{i}");
        if !tool.is_object() {
            return Err(invalid(&param, "Input should be an object"));
        }
        let name = block_str(tool, &param, "name")?;
        let schema = match tool.get("input_schema") {
            Some(schema @ Value::Object(_)) => schema.clone(),
            _ => {
                return Err(invalid(
                    &format!("{param}.input_schema"),
                    "Field required (a JSON schema object)",
                ))
            }
        };
        let mut function = json!({"name": name, "parameters": schema});
        if let Some(description) = tool.get("description").filter(|d| !d.is_null()) {
            function["description"] = description.clone();
        }
        tools.push(json!({"type": "function", "function": function}));
    }
    Ok(Some(Value::Array(tools)))
}

/// `tool_choice` as its chat form: `auto`, `any` (`required`), `none`, or `tool` (a named
/// function).
fn tool_choice(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let param = "tool_choice";
    let choice = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(choice @ Value::Object(_)) => choice,
        Some(_) => return Err(invalid(param, "Input should be an object")),
    };
    let kind = block_str(choice, param, "type")?;
    Ok(Some(match kind {
        "auto" => json!("auto"),
        "any" => json!("required"),
        "none" => json!("none"),
        "tool" => {
            let name = block_str(choice, param, "name")?;
            json!({"type": "function", "function": {"name": name}})
        }
        other => {
            return Err(invalid(
                &format!("{param}.type"),
                format!(
                    "Input should be 'auto', 'any', 'tool' or 'none', not {}",
                    echo(other)
                ),
            ))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: Value) -> Result<Value, ApiError> {
        let map = body.as_object().cloned().unwrap_or_default();
        to_chat(&map, false).map(|t| Value::Object(t.chat))
    }

    #[test]
    fn blocks_become_chat_messages() {
        let chat = chat(json!({
            "model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Oslo"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "cold"}]},
                ]},
            ],
            "tools": [{"name": "get", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
        }))
        .expect("valid");
        assert_eq!(
            chat["messages"][0],
            json!({"role": "system", "content": "Be brief."})
        );
        assert_eq!(
            chat["messages"][2]["tool_calls"][0]["function"],
            json!({"name": "get", "arguments": "{\"city\":\"Oslo\"}"})
        );
        assert_eq!(
            chat["messages"][3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "cold"})
        );
        assert_eq!(chat["messages"].as_array().map(Vec::len), Some(4));
        assert_eq!(chat["tool_choice"], "required");
        assert_eq!(
            chat["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
    }

    /// `ignore_eos` reaches the engine (loadgen's exact output lengths); a non-boolean is a 400.
    #[test]
    fn ignore_eos_goes_through() {
        let body = |v: Value| {
            json!({"model": "m", "max_tokens": 4, "ignore_eos": v,
                "messages": [{"role": "user", "content": "x"}]})
        };
        let translated = chat(body(json!(true))).expect("valid");
        assert_eq!(translated["ignore_eos"], true);
        let e = chat(body(json!("yes"))).expect_err("refused");
        assert!(format!("{e:?}").contains("ignore_eos"), "{e:?}");
    }

    #[test]
    fn malformed_fields_name_their_path() {
        let base = |messages: Value| json!({"model": "m", "max_tokens": 4, "messages": messages});
        let cases = [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (
                base(json!([{"role": "user", "content": [{"text": "x"}]}])),
                "messages.0.content.0.type",
            ),
            (
                base(json!([{"role": "user", "content": [{"type": "text"}]}])),
                "messages.0.content.0.text",
            ),
            (
                base(json!([{"role": "user", "content": [{"type": "image", "source": {}}]}])),
                "messages.0.content.0.type",
            ),
            (
                base(
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]),
                ),
                "messages.0.content.0.type",
            ),
            (
                base(json!([{"role": "robot", "content": "x"}])),
                "messages.0.role",
            ),
            (base(json!([])), "messages"),
            (
                json!({"model": "m", "max_tokens": 4, "tool_choice": {"type": "any"},
                       "messages": [{"role": "user", "content": "x"}]}),
                "tool_choice",
            ),
        ];
        for (body, param) in cases {
            let e = chat(body).expect_err(param);
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
            assert!(e.message.starts_with(param), "{}", e.message);
        }
    }

    /// A random JSON value of the kinds clients get wrong: wrong types, huge numbers, long
    /// strings, blocks of every type with fields missing or mistyped.
    fn random_value(rng: &mut rand_chacha::ChaCha8Rng, depth: usize) -> Value {
        use rand::Rng;
        let long = "x".repeat(5_000);
        let leaves = [
            Value::Null,
            json!(true),
            json!(0),
            json!(-1),
            json!(1e308),
            json!(u64::MAX),
            json!(""),
            json!("user"),
            json!("assistant"),
            json!("text"),
            json!("tool_use"),
            json!("tool_result"),
            json!("image"),
            json!(long),
        ];
        let pick = rng.gen_range(0..if depth == 0 { 1 } else { 4 });
        match pick {
            0 => leaves[rng.gen_range(0..leaves.len())].clone(),
            1 => Value::Array(
                (0..rng.gen_range(0..4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => {
                let keys = [
                    "type",
                    "text",
                    "role",
                    "content",
                    "id",
                    "name",
                    "input",
                    "tool_use_id",
                    "input_schema",
                    "source",
                ];
                let mut map = Map::new();
                for _ in 0..rng.gen_range(0..5) {
                    let key = keys[rng.gen_range(0..keys.len())];
                    map.insert(key.into(), random_value(rng, depth - 1));
                }
                Value::Object(map)
            }
        }
    }

    #[test]
    fn random_bodies_are_translated_or_refused_briefly() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(48);
        let fields = [
            "model",
            "max_tokens",
            "messages",
            "system",
            "stop_sequences",
            "temperature",
            "top_p",
            "top_k",
            "tools",
            "tool_choice",
            "stream",
            "metadata",
        ];
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..5_000 {
            let mut body = Map::new();
            body.insert("model".into(), json!("m"));
            body.insert("max_tokens".into(), json!(4));
            body.insert(
                "messages".into(),
                json!([{"role": "user", "content": "hi"}]),
            );
            for _ in 0..rng.gen_range(1..4) {
                let field = fields[rng.gen_range(0..fields.len())];
                body.insert(field.into(), random_value(&mut rng, 4));
            }
            match to_chat(&body, false) {
                Ok(t) => {
                    accepted += 1;
                    // The chat parser reads every translation without panicking.
                    let _ = crate::api::protocol::ChatRequest::parse(&t.chat);
                }
                Err(e) => {
                    refused += 1;
                    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{e:?}");
                    assert!(e.param.is_some(), "{e:?}");
                    assert!(e.message.len() < 300, "{}", e.message);
                }
            }
        }
        assert!(
            accepted > 100 && refused > 100,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let role = "r".repeat(10_000);
        let e = chat(json!({"model": "m", "max_tokens": 1,
            "messages": [{"role": role, "content": "x"}]}))
        .expect_err("bad role");
        assert!(e.message.len() < 200, "{}", e.message);
    }
}
