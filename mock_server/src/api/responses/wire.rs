//! A `POST /v1/responses` body read into a validated `ResponsesRequest`: `input` (a string
//! or items) as chat messages, `instructions`, `tools` (flat function tools) and
//! `tool_choice` as chat's `Tools`, and the shared generation parameters. Every malformed
//! field is a 400 naming it (`input[3].content[0]`, `tools[1].name`, ...).

use serde_json::{json, Map, Value};

use crate::api::budget::{check_word_lengths, exceeded};
use crate::api::error::ApiError;
use crate::api::json_mode::ResponseFormat;
use crate::api::protocol::{GenerationParams, NvExt};
use crate::api::tools::{render_calls, ToolCall, Tools};
use crate::text::{ChatMessage, Role};

/// Items one `input` list may hold at most (`input`): each becomes a message of the prompt.
pub const MAX_INPUT_ITEMS: usize = 20_000;

/// Characters of a client's id an error message quotes at most.
const SHOWN_ID_CHARS: usize = 64;

/// A validated `POST /v1/responses` body.
#[derive(Clone, Debug)]
pub(crate) struct ResponsesRequest {
    /// The generation parameters chat uses (`max_output_tokens` as the output limit).
    pub params: GenerationParams,
    /// `instructions`: the system message, not carried over to a continuation.
    pub instructions: Option<String>,
    /// This turn's messages (from `input`).
    pub input: Vec<ChatMessage>,
    /// `tools` and `tool_choice`, as chat reads them.
    pub tools: Tools,
    /// `tools` as sent (echoed in the response).
    pub tools_echo: Value,
    /// `tool_choice` as sent, `"auto"` when absent (echoed).
    pub tool_choice_echo: Value,
    /// `previous_response_id`.
    pub previous: Option<String>,
    /// `store` (default true).
    pub store: bool,
    /// `temperature` (accepted and echoed).
    pub temperature: f64,
    /// `top_p` (accepted and echoed).
    pub top_p: f64,
    /// `metadata` (echoed).
    pub metadata: Value,
}

/// `id` cut to a short prefix for an error message.
pub(crate) fn shown_id(id: &str) -> String {
    match id.char_indices().nth(SHOWN_ID_CHARS) {
        None => id.to_string(),
        Some((end, _)) => format!("{}... ({} bytes)", &id[..end], id.len()),
    }
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// An optional number field in `range`.
fn number(
    body: &Map<String, Value>,
    name: &str,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Option<f64>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(f64::INFINITY);
            if range.contains(&v) {
                Ok(Some(v))
            } else {
                Err(bad(
                    format!(
                        "Invalid '{name}': {v:e}. It must be between {} and {}.",
                        range.start(),
                        range.end()
                    ),
                    name,
                ))
            }
        }
        Some(_) => Err(bad(
            format!("Invalid type for '{name}': expected a number"),
            name,
        )),
    }
}

fn boolean(body: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(
            format!("Invalid type for '{name}': expected a boolean"),
            name,
        )),
    }
}

fn string<'a>(body: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(
            format!("Invalid type for '{name}': expected a string"),
            name,
        )),
    }
}

impl ResponsesRequest {
    /// Validates a Responses body.
    pub(crate) fn parse(body: &Map<String, Value>) -> Result<ResponsesRequest, ApiError> {
        let model = string(body, "model")?
            .ok_or_else(|| bad("Missing required parameter: 'model'.", "model"))?
            .to_string();
        let max_tokens = match body.get("max_output_tokens") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                // At most i64::MAX, as chat's limits, so prompt + limit never overflows.
                Some(n) if n >= 1 => {
                    Some(usize::try_from(n.min(i64::MAX as u64)).unwrap_or(usize::MAX >> 1))
                }
                _ => {
                    return Err(bad(
                        "Invalid 'max_output_tokens': expected an integer of at least 1.",
                        "max_output_tokens",
                    ))
                }
            },
        };
        let temperature = number(body, "temperature", 0.0..=2.0)?.unwrap_or(1.0);
        let top_p = number(body, "top_p", 0.0..=1.0)?.unwrap_or(1.0);
        let stream = boolean(body, "stream")?.unwrap_or(false);
        let store = boolean(body, "store")?.unwrap_or(true);
        let ignore_eos = boolean(body, "ignore_eos")?.unwrap_or(false);
        let seed = match body.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .ok_or_else(|| bad("Invalid type for 'seed': expected an integer", "seed"))?
                    as u64,
            ),
        };
        let previous = string(body, "previous_response_id")?.map(str::to_string);
        let instructions = string(body, "instructions")?.map(str::to_string);
        let metadata = match body.get("metadata") {
            None | Some(Value::Null) => json!({}),
            Some(Value::Object(m)) => Value::Object(m.clone()),
            Some(_) => {
                return Err(bad(
                    "Invalid type for 'metadata': expected an object",
                    "metadata",
                ))
            }
        };
        let nvext = match body.get("nvext") {
            None | Some(Value::Null) => NvExt::default(),
            Some(v) => NvExt::parse(v)?,
        };
        let input = parse_input(body.get("input"))?;
        for message in &input {
            check_word_lengths(&message.content, "input")?;
        }
        if let Some(text) = &instructions {
            check_word_lengths(text, "instructions")?;
        }
        let (tools, tools_echo, tool_choice_echo) = parse_tools(body)?;
        Ok(ResponsesRequest {
            params: GenerationParams {
                model,
                max_tokens,
                stream,
                include_usage: false,
                seed,
                nvext,
                n: 1,
                ignore_eos,
                min_tokens: 0,
                stop: Vec::new(),
                stop_token_ids: Vec::new(),
                include_stop_str: false,
                logprobs: None,
                response_format: ResponseFormat::Text,
            },
            instructions,
            input,
            tools,
            tools_echo,
            tool_choice_echo,
            previous,
            store,
            temperature,
            top_p,
            metadata,
        })
    }
}

/// `input`: a string (one user message) or a list of items.
fn parse_input(input: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        None | Some(Value::Null) => {
            return Err(bad("Missing required parameter: 'input'.", "input"));
        }
        Some(Value::String(text)) => return Ok(vec![ChatMessage::new(Role::User, text.clone())]),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(bad(
                "Invalid type for 'input': expected a string or an array of input items",
                "input",
            ))
        }
    };
    if items.len() > MAX_INPUT_ITEMS {
        return Err(exceeded(
            "input",
            format!("{} input items given", items.len()),
            format!("{MAX_INPUT_ITEMS} input items"),
        ));
    }
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(items.len());
    // The role of the last message pushed (a message's role is not readable back).
    let mut last_role = None;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Some(item) = item.as_object() else {
            return Err(bad(
                format!("Invalid type for '{at}': expected an object"),
                &at,
            ));
        };
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.contains_key("role") => "message",
            Some(Value::String(t)) => t.as_str(),
            _ => {
                return Err(bad(
                    format!("Missing or invalid '{at}.type'"),
                    &format!("{at}.type"),
                ))
            }
        };
        match kind {
            "message" => {
                let role_at = format!("{at}.role");
                let role = match item.get("role").and_then(Value::as_str) {
                    Some("user") => Role::User,
                    Some("assistant") => Role::Assistant,
                    Some("system") => Role::System,
                    Some("developer") => Role::Developer,
                    _ => {
                        return Err(bad(
                            format!(
                                "Missing or invalid '{role_at}': expected 'user', 'assistant', \
                                 'system' or 'developer'"
                            ),
                            &role_at,
                        ))
                    }
                };
                let content = content_text(item.get("content"), &format!("{at}.content"))?;
                messages.push(ChatMessage::new(role, content));
                last_role = Some(role);
            }
            "function_call" => {
                let field = |name: &str| -> Result<String, ApiError> {
                    item.get(name)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| {
                            bad(
                                format!("Missing or invalid '{at}.{name}': expected a string"),
                                &format!("{at}.{name}"),
                            )
                        })
                };
                let call = ToolCall {
                    id: field("call_id")?,
                    name: field("name")?,
                    arguments: field("arguments")?,
                };
                let text = render_calls(std::slice::from_ref(&call));
                // Calls right after an assistant message are part of it, as chat's
                // `tool_calls` are.
                match messages.last_mut() {
                    Some(last) if last_role == Some(Role::Assistant) => {
                        last.content.push_str(&text);
                    }
                    _ => messages.push(ChatMessage::new(Role::Assistant, text)),
                }
                last_role = Some(Role::Assistant);
            }
            "function_call_output" => {
                if !item.get("call_id").is_some_and(Value::is_string) {
                    return Err(bad(
                        format!("Missing or invalid '{at}.call_id': expected a string"),
                        &format!("{at}.call_id"),
                    ));
                }
                let output = content_text(item.get("output"), &format!("{at}.output"))?;
                messages.push(ChatMessage::new(Role::Tool, output));
                last_role = Some(Role::Tool);
            }
            // Earlier reasoning is dropped from the prompt, as chat templates drop it.
            "reasoning" => {}
            other => {
                return Err(bad(
                    format!(
                        "Invalid value for '{at}.type': {:?}. Supported values are: 'message', \
                         'function_call', 'function_call_output' and 'reasoning'.",
                        shown_id(other)
                    ),
                    &format!("{at}.type"),
                ))
            }
        }
    }
    Ok(messages)
}

/// A message's `content` (or a call output's `output`): a string, or parts whose text
/// (`input_text`, `output_text`, `text`, `refusal`) is joined by newlines; images and files
/// add no text.
fn content_text(value: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let parts = match value {
        Some(Value::String(s)) => return Ok(s.clone()),
        Some(Value::Array(parts)) => parts,
        _ => {
            return Err(bad(
                format!("Missing or invalid '{at}': expected a string or an array of parts"),
                at,
            ))
        }
    };
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let part_at = format!("{at}[{j}]");
        let kind = part.get("type").and_then(Value::as_str);
        let key = match kind {
            Some("input_text" | "output_text" | "text") => "text",
            Some("refusal") => "refusal",
            Some("input_image" | "input_file" | "input_audio") => continue,
            _ => {
                return Err(bad(
                    format!(
                        "Invalid content part '{part_at}': expected a 'type' of 'input_text', \
                         'output_text', 'refusal', 'input_image' or 'input_file'"
                    ),
                    &part_at,
                ))
            }
        };
        let Some(Value::String(piece)) = part.get(key) else {
            return Err(bad(
                format!("Missing or invalid '{part_at}.{key}': expected a string"),
                &format!("{part_at}.{key}"),
            ));
        };
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(piece);
    }
    Ok(text)
}

/// `tools` (flat function tools) and `tool_choice` read as chat's, with errors naming the
/// Responses fields; and both as sent, for the echo.
fn parse_tools(body: &Map<String, Value>) -> Result<(Tools, Value, Value), ApiError> {
    let tools_echo = match body.get("tools") {
        None | Some(Value::Null) => Value::Array(Vec::new()),
        Some(v) => v.clone(),
    };
    let chat_tools = match &tools_echo {
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|tool| match tool.as_object() {
                    Some(t) => {
                        let mut function = t.clone();
                        let kind = function.remove("type").unwrap_or(Value::Null);
                        json!({"type": kind, "function": function})
                    }
                    None => tool.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    };
    let tool_choice_echo = match body.get("tool_choice") {
        None | Some(Value::Null) => json!("auto"),
        Some(v) => v.clone(),
    };
    let chat_choice = match &tool_choice_echo {
        Value::Object(choice) => match (
            choice.get("type").and_then(Value::as_str),
            choice.get("name"),
        ) {
            (Some("function"), Some(name)) => {
                json!({"type": "function", "function": {"name": name}})
            }
            _ => {
                return Err(bad(
                    "Invalid 'tool_choice': expected 'none', 'auto', 'required' or \
                     {\"type\": \"function\", \"name\": ...}",
                    "tool_choice",
                ))
            }
        },
        other => other.clone(),
    };
    let mut chat = Map::new();
    chat.insert("tools".into(), chat_tools);
    chat.insert("tool_choice".into(), chat_choice);
    let tools = Tools::parse(&chat).map_err(|e| ApiError {
        message: e.message.replace(".function", ""),
        param: e.param.map(|p| p.replace(".function", "")),
        ..e
    })?;
    Ok((tools, tools_echo, tool_choice_echo))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ResponsesRequest, ApiError> {
        ResponsesRequest::parse(body.as_object().expect("an object"))
    }

    #[test]
    fn items_become_chat_messages() {
        let r = parse(json!({"model": "m", "instructions": "Be brief.", "input": [
            {"role": "user", "content": "Weather?"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        ]}))
        .expect("valid");
        assert_eq!(
            serde_json::to_value(&r.input).expect("serializes"),
            json!([
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "Checking.<tool_call>\n{\"name\": \
                    \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>"},
                {"role": "tool", "content": "sunny"},
                {"role": "user", "content": "a\nb"},
            ])
        );
        assert_eq!(r.instructions.as_deref(), Some("Be brief."));
        assert!(r.store);
    }

    #[test]
    fn flat_tools_parse_and_errors_name_responses_fields() {
        let weather = json!({"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}});
        let r = parse(json!({"model": "m", "input": "hi", "tools": [weather],
            "tool_choice": {"type": "function", "name": "get_weather"}}))
        .expect("valid");
        assert_eq!(r.tools.tools[0].name, "get_weather");
        assert_eq!(r.tools.choice, crate::api::tools::ToolChoice::Named(0));
        for (body, param) in [
            (json!({"input": "hi"}), "model"),
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": 3}), "input"),
            (json!({"model": "m", "input": [3]}), "input[0]"),
            (
                json!({"model": "m", "input": [{"type": "x"}]}),
                "input[0].type",
            ),
            (
                json!({"model": "m", "input": [{"role": "robot", "content": "x"}]}),
                "input[0].role",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "nope"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
                "input[0].content[0].text",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call", "name": "f"}]}),
                "input[0].call_id",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a b"}]}),
                "tools[0].name",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": {"type": "function"}}),
                "tool_choice",
            ),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"model": "m", "input": "x", "temperature": 3}),
                "temperature",
            ),
            (json!({"model": "m", "input": "x", "top_p": "a"}), "top_p"),
            (
                json!({"model": "m", "input": "x", "previous_response_id": 1}),
                "previous_response_id",
            ),
        ] {
            let e = parse(body.clone()).expect_err("malformed");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn a_huge_input_list_is_refused_before_it_is_read() {
        let items = vec![json!({"role": "user", "content": "x"}); MAX_INPUT_ITEMS + 1];
        let e = parse(json!({"model": "m", "input": items})).expect_err("too many");
        assert_eq!(e.param.as_deref(), Some("input"));
        assert_eq!(e.code, Some("request_too_large"));
        assert!(e.message.contains("20000 input items"), "{}", e.message);
        let items = vec![json!({"role": "user", "content": "x"}); MAX_INPUT_ITEMS];
        assert!(parse(json!({"model": "m", "input": items})).is_ok());
    }
}
