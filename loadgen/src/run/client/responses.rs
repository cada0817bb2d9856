//! The OpenAI Responses API (`POST /v1/responses`) on the wire: the request made from a chat
//! body ([`request`]), and its typed stream events read into a [`StreamState`] ([`on_event`]).
//!
//! Tokens: `response.output_text.delta` and `response.function_call_arguments.delta` are answer
//! tokens, `response.reasoning_text.delta` and `response.reasoning_summary_text.delta` reasoning
//! ones, so TTFT and ITL mean what they mean on chat. Usage comes from `response.completed` (or
//! `response.incomplete`): `input_tokens`, `output_tokens`,
//! `input_tokens_details.cached_tokens`. `response.failed` and `error` fail the request.

use serde_json::{json, Map, Value};

use crate::run::client::stream::StreamState;
use crate::run::failure::Failure;

/// A Responses body with the same conversation as the chat (or completions) body `chat`: its
/// messages as input items (a lone user message as the `input` string), `max_tokens` as
/// `max_output_tokens`, function tools flattened; `ignore_eos` and `nvext` kept.
pub(crate) fn request(chat: &Value) -> Value {
    let mut body = Map::new();
    copy(
        chat,
        &mut body,
        &["model", "ignore_eos", "nvext", "tool_choice"],
    );
    body.insert("input".into(), input(chat));
    if let Some(n) = max_tokens(chat) {
        body.insert("max_output_tokens".into(), n.clone());
    }
    body.insert("stream".into(), json!(true));
    if let Some(tools) = chat.get("tools").and_then(Value::as_array) {
        let flat: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                json!({"type": "function", "name": f["name"], "description": f["description"],
                    "parameters": f["parameters"]})
            })
            .collect();
        body.insert("tools".into(), Value::Array(flat));
    }
    Value::Object(body)
}

/// Copies the members `keys` of `from` that are present into `to`.
pub(super) fn copy(from: &Value, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).to_string(), v.clone());
        }
    }
}

/// `max_tokens`, else `max_completion_tokens`, of a chat body.
pub(super) fn max_tokens(chat: &Value) -> Option<&Value> {
    chat.get("max_tokens")
        .or_else(|| chat.get("max_completion_tokens"))
}

/// A message's `content` as text (`null` and non-strings as `""`).
pub(super) fn text(message: &Value) -> &str {
    message.get("content").and_then(Value::as_str).unwrap_or("")
}

/// `input`: a completions `prompt` or a lone user message as a string, else one item per
/// message (assistant tool calls as `function_call` items, tool results as
/// `function_call_output`).
fn input(chat: &Value) -> Value {
    if let Some(prompt) = chat.get("prompt") {
        return prompt.clone();
    }
    let messages = chat
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    if let [only] = messages {
        if only["role"] == "user" && only["content"].is_string() {
            return only["content"].clone();
        }
    }
    let mut items = Vec::with_capacity(messages.len());
    for m in messages {
        match m["role"].as_str().unwrap_or("user") {
            "tool" => items.push(json!({"type": "function_call_output",
                "call_id": m["tool_call_id"], "output": text(m)})),
            role => {
                let calls = m.get("tool_calls").and_then(Value::as_array);
                if calls.is_none() || !text(m).is_empty() {
                    items.push(json!({"type": "message", "role": role, "content": text(m)}));
                }
                for c in calls.into_iter().flatten() {
                    items.push(json!({"type": "function_call", "call_id": c["id"],
                        "name": c["function"]["name"], "arguments": c["function"]["arguments"]}));
                }
            }
        }
    }
    Value::Array(items)
}

/// A string member of `v` at `pointer`.
fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// The message of an error object: `message`, else the whole object as text.
pub(super) fn message_of(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string())
}

/// Handles one event's data; `Err` is a `response.failed` or `error` event. Data that is not a
/// JSON object with a `type` is ignored, as chat ignores lines that are not chunks.
pub(super) fn on_event(state: &mut StreamState, data: &str) -> Result<(), Failure> {
    let t = state.arrived();
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return Ok(());
    };
    let delta = || str_at(&v, "/delta").unwrap_or("");
    match v.get("type").and_then(Value::as_str).unwrap_or("") {
        "response.created" | "response.in_progress" => {
            if let Some(id) = str_at(&v, "/response/id") {
                state.response_id = Some(id.to_string());
            }
        }
        "response.output_text.delta" => state.answer_text(t, delta()),
        "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            state.reasoning_text(t, delta());
        }
        "response.output_item.added" if str_at(&v, "/item/type") == Some("function_call") => {
            if let Some(index) = output_index(state, &v, true) {
                let item = &v["item"];
                let arguments = str_at(item, "/arguments").unwrap_or("");
                let call = (
                    index,
                    str_at(item, "/call_id"),
                    str_at(item, "/name"),
                    arguments,
                );
                state.tool_delta(t, call);
            }
        }
        "response.function_call_arguments.delta" => {
            if let Some(index) = output_index(state, &v, false) {
                state.tool_delta(t, (index, None, None, delta()));
            }
        }
        kind @ ("response.completed" | "response.incomplete") => {
            let r = &v["response"];
            if let Some(id) = str_at(r, "/id") {
                state.response_id = Some(id.to_string());
            }
            if let Some(u) = r.get("usage").filter(|u| u.is_object()) {
                let n = |p: &str| u.pointer(p).and_then(Value::as_u64);
                state.merge_usage((
                    n("/output_tokens"),
                    n("/input_tokens"),
                    n("/input_tokens_details/cached_tokens"),
                ));
            }
            let reason = match (kind, str_at(r, "/incomplete_details/reason")) {
                ("response.incomplete", Some("max_output_tokens")) => "length",
                ("response.incomplete", Some(other)) => other,
                ("response.incomplete", None) => "incomplete",
                _ if state.has_tool_calls() => "tool_calls",
                _ => "stop",
            };
            state.set_finish_reason(reason);
            state.done = true;
        }
        "response.failed" => {
            let e = v.pointer("/response/error").filter(|e| !e.is_null());
            return Err(Failure::Server(
                e.map_or_else(|| "response.failed".to_string(), message_of),
            ));
        }
        "error" => {
            let e = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
            return Err(Failure::Server(message_of(e)));
        }
        _ => {}
    }
    Ok(())
}

/// The tool call of an event's `output_index` (a new one when `added`).
fn output_index(state: &mut StreamState, v: &Value, added: bool) -> Option<usize> {
    let key = v.get("output_index").and_then(Value::as_u64)?;
    state.tool_index(key, added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn read(events: &[&str]) -> (Result<(), Failure>, crate::run::client::Response) {
        let mut s = StreamState::new(Instant::now());
        let mut result = Ok(());
        for e in events {
            result = on_event(&mut s, e);
            if result.is_err() || s.done {
                break;
            }
        }
        let failure = result.clone().err();
        (result, s.finish(failure))
    }

    /// OpenAI's event sequence (as the API and mockserve stream it), with reasoning and a
    /// function call: tokens, usage, the id, the call pieced together.
    #[test]
    fn a_streamed_response_is_read_as_a_chat_stream_is() {
        let (result, r) = read(&[
            r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","status":"in_progress","output":[]}}"#,
            r#"{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1"}}"#,
            r#"{"type":"response.reasoning_text.delta","output_index":0,"delta":"hmm"}"#,
            r#"{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"msg_1","role":"assistant","content":[]}}"#,
            r#"{"type":"response.content_part.added","output_index":1,"part":{"type":"output_text","text":""}}"#,
            r#"{"type":"response.output_text.delta","output_index":1,"delta":"Hello"}"#,
            r#"{"type":"response.output_text.delta","output_index":1,"delta":" there"}"#,
            r#"{"type":"response.output_text.delta","output_index":1,"delta":""}"#,
            r#"{"type":"response.output_text.done","output_index":1,"text":"Hello there"}"#,
            r#"{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"lookup","arguments":""}}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":2,"item_id":"fc_1","delta":"{\"q\":"}"#,
            r#"{"type":"response.function_call_arguments.delta","output_index":2,"item_id":"fc_1","delta":"1}"}"#,
            r#"{"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":40,"input_tokens_details":{"cached_tokens":16},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":45}}}"#,
            r#"{"type":"response.output_text.delta","delta":"after the end"}"#,
        ]);
        assert_eq!(result, Ok(()));
        assert_eq!(r.failure, None);
        assert_eq!(r.content, "Hello there");
        assert_eq!((r.chunks, r.output_tokens), (5, 5));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (Some(40), Some(16)));
        assert_eq!(r.response_id.as_deref(), Some("resp_1"));
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(
            (
                r.tool_calls[0].id.as_str(),
                r.tool_calls[0].name.as_str(),
                r.tool_calls[0].arguments.as_str()
            ),
            ("call_1", "lookup", "{\"q\":1}")
        );
        let t = &r.timing;
        assert!(t.first_reasoning_us.is_some() && t.first_answer_us.is_some());
        assert_eq!(t.token_chunks_us.len(), 5);
    }

    #[test]
    fn failures_and_incomplete_answers() {
        let (result, r) = read(&[
            r#"{"type":"response.output_text.delta","delta":"x"}"#,
            r#"{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"server_error","message":"engine died"}}}"#,
        ]);
        assert_eq!(result, Err(Failure::Server("engine died".into())));
        assert_eq!(r.failure, Some(Failure::Server("engine died".into())));
        let (_, r) = read(&[
            r#"{"type":"response.output_text.delta","delta":"x"}"#,
            r#"{"type":"error","code":"rate_limit_exceeded","message":"slow down","param":null,"sequence_number":3}"#,
        ]);
        assert_eq!(r.failure, Some(Failure::Server("slow down".into())));
        let (_, r) = read(&[
            r#"{"type":"response.output_text.delta","delta":"x"}"#,
            r#"{"type":"response.incomplete","response":{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":1}}}"#,
        ]);
        assert_eq!(
            (r.failure, r.finish_reason.as_deref()),
            (None, Some("length"))
        );
        // No token before the end is an empty stream, as on chat.
        let (_, r) = read(&[r#"{"type":"response.completed","response":{"id":"r"}}"#]);
        assert_eq!(r.failure, Some(Failure::EmptyStream));
    }

    #[test]
    fn chat_bodies_become_responses_bodies() {
        let chat = json!({"model": "m", "max_tokens": 7, "ignore_eos": true, "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            request(&chat),
            json!({"model": "m", "input": "hi", "max_output_tokens": 7, "ignore_eos": true,
                "stream": true})
        );
        let chat = json!({"model": "m", "max_completion_tokens": 3, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "d",
                "parameters": {"type": "object"}}}],
            "messages": [{"role": "system", "content": "s"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                    "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"}]});
        assert_eq!(
            request(&chat),
            json!({"model": "m", "max_output_tokens": 3, "stream": true,
                "tool_choice": "required",
                "tools": [{"type": "function", "name": "lookup", "description": "d",
                    "parameters": {"type": "object"}}],
                "input": [{"type": "message", "role": "system", "content": "s"},
                    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "found"}]})
        );
        let completion = json!({"model": "m", "prompt": "p", "max_tokens": 2});
        assert_eq!(request(&completion)["input"], "p");
    }
}
