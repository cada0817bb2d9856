//! The Anthropic Messages API (`POST /v1/messages`) on the wire: the request made from a chat
//! body ([`request`]), and its typed stream events read into a [`StreamState`] ([`on_event`]).
//!
//! Tokens: a `content_block_delta` with text (`text_delta`) or tool input (`input_json_delta`)
//! is an answer token, one with `thinking_delta` a reasoning token, so TTFT and ITL mean what
//! they mean on chat. Usage: `input_tokens` and `cache_read_input_tokens` of `message_start`
//! (or a later `message_delta`), `output_tokens` of the last `message_delta`. `input_tokens` is
//! read as the whole prompt, as vLLM reports it (Anthropic's own API counts cached tokens
//! apart). `message_stop` ends the stream; `event: error` fails it.

use serde_json::{json, Map, Value};

use crate::run::client::responses::{copy, max_tokens, message_of, text};
use crate::run::client::stream::StreamState;
use crate::run::failure::Failure;

/// The `anthropic-version` header every request carries.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// A Messages body with the same conversation as the chat (or completions) body `chat`: system
/// messages as `system`, assistant tool calls as `tool_use` blocks, tool results as
/// `tool_result` blocks of a user message, `max_tokens`, tools with their `input_schema`;
/// `ignore_eos` kept (a vLLM extension).
pub(crate) fn request(chat: &Value) -> Value {
    let mut body = Map::new();
    copy(chat, &mut body, &["model", "ignore_eos"]);
    body.insert(
        "max_tokens".into(),
        max_tokens(chat).cloned().unwrap_or(json!(1)),
    );
    let (system, messages) = messages(chat);
    if !system.is_empty() {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(true));
    if let Some(tools) = chat.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                json!({"name": f["name"], "description": f["description"],
                    "input_schema": f["parameters"]})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = chat.get("tool_choice").and_then(Value::as_str) {
        let kind = if choice == "required" { "any" } else { choice };
        body.insert("tool_choice".into(), json!({"type": kind}));
    }
    Value::Object(body)
}

/// The system text and the messages of a chat body (a completions `prompt` as one user
/// message). Consecutive tool results are blocks of one user message.
fn messages(chat: &Value) -> (String, Vec<Value>) {
    if let Some(prompt) = chat.get("prompt") {
        return (
            String::new(),
            vec![json!({"role": "user", "content": prompt})],
        );
    }
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    let list = chat.get("messages").and_then(Value::as_array);
    for m in list.into_iter().flatten() {
        match m["role"].as_str().unwrap_or("user") {
            "system" | "developer" => system.push(text(m)),
            "tool" => {
                let block = json!({"type": "tool_result", "tool_use_id": m["tool_call_id"],
                    "content": text(m)});
                match out.last_mut() {
                    Some(last) if last["role"] == "user" && last["content"].is_array() => {
                        if let Some(blocks) = last["content"].as_array_mut() {
                            blocks.push(block);
                        }
                    }
                    _ => out.push(json!({"role": "user", "content": [block]})),
                }
            }
            "assistant" => match m.get("tool_calls").and_then(Value::as_array) {
                None => out.push(json!({"role": "assistant", "content": text(m)})),
                Some(calls) => {
                    let mut blocks = Vec::with_capacity(calls.len() + 1);
                    if !text(m).is_empty() {
                        blocks.push(json!({"type": "text", "text": text(m)}));
                    }
                    for c in calls {
                        let args = c["function"]["arguments"].as_str().unwrap_or("");
                        let input = serde_json::from_str::<Value>(args)
                            .ok()
                            .filter(Value::is_object)
                            .unwrap_or_else(|| json!({}));
                        blocks.push(json!({"type": "tool_use", "id": c["id"],
                            "name": c["function"]["name"], "input": input}));
                    }
                    out.push(json!({"role": "assistant", "content": blocks}));
                }
            },
            _ => out.push(json!({"role": "user", "content": text(m)})),
        }
    }
    (system.join("\n"), out)
}

/// Handles one event's data; `Err` is an `error` event. Data that is not a JSON object with a
/// `type` is ignored, as chat ignores lines that are not chunks.
pub(super) fn on_event(state: &mut StreamState, data: &str) -> Result<(), Failure> {
    let t = state.arrived();
    let Ok(v) = serde_json::from_str::<Value>(data) else {
        return Ok(());
    };
    let s = |p: &str| v.pointer(p).and_then(Value::as_str);
    match v.get("type").and_then(Value::as_str).unwrap_or("") {
        "message_start" => {
            if let Some(id) = s("/message/id") {
                state.response_id = Some(id.to_string());
            }
            usage(state, v.pointer("/message/usage"), false);
        }
        "content_block_start" => {
            let block = &v["content_block"];
            let index = v.get("index").and_then(Value::as_u64);
            match block["type"].as_str() {
                Some("text") => state.answer_text(t, block["text"].as_str().unwrap_or("")),
                Some("thinking") => {
                    state.reasoning_text(t, block["thinking"].as_str().unwrap_or(""));
                }
                Some("tool_use") => {
                    if let Some(i) = index.and_then(|k| state.tool_index(k, true)) {
                        let (id, name) = (block["id"].as_str(), block["name"].as_str());
                        state.tool_delta(t, (i, id, name, ""));
                    }
                }
                _ => {}
            }
        }
        "content_block_delta" => match s("/delta/type") {
            Some("text_delta") => state.answer_text(t, s("/delta/text").unwrap_or("")),
            Some("thinking_delta") => state.reasoning_text(t, s("/delta/thinking").unwrap_or("")),
            Some("input_json_delta") => {
                let index = v.get("index").and_then(Value::as_u64);
                if let Some(i) = index.and_then(|k| state.tool_index(k, false)) {
                    state.tool_delta(t, (i, None, None, s("/delta/partial_json").unwrap_or("")));
                }
            }
            _ => {}
        },
        "message_delta" => {
            if let Some(reason) = s("/delta/stop_reason") {
                state.set_finish_reason(match reason {
                    "end_turn" | "stop_sequence" => "stop",
                    "max_tokens" => "length",
                    "tool_use" => "tool_calls",
                    other => other,
                });
            }
            usage(state, v.get("usage"), true);
        }
        "message_stop" => state.done = true,
        "error" => {
            let e = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
            return Err(Failure::Server(message_of(e)));
        }
        _ => {}
    }
    Ok(())
}

/// Usage of `message_start` or (`with_output`) `message_delta`: `message_start`'s
/// `output_tokens` is a placeholder, not the count.
fn usage(state: &mut StreamState, usage: Option<&Value>, with_output: bool) {
    let Some(u) = usage.filter(|u| u.is_object()) else {
        return;
    };
    let n = |k: &str| u.get(k).and_then(Value::as_u64);
    let output = if with_output {
        n("output_tokens")
    } else {
        None
    };
    state.merge_usage((output, n("input_tokens"), n("cache_read_input_tokens")));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn read(events: &[&str]) -> crate::run::client::Response {
        let mut s = StreamState::new(Instant::now());
        for e in events {
            if let Err(f) = on_event(&mut s, e) {
                return s.finish(Some(f));
            }
            if s.done {
                return s.finish(None);
            }
        }
        s.finish(Some(Failure::Stream("ended before message_stop".into())))
    }

    /// Anthropic's event sequence (as the API and mockserve stream it), with thinking and a
    /// tool use.
    #[test]
    fn a_streamed_message_is_read_as_a_chat_stream_is() {
        let r = read(&[
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":16,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            r#"{"type":"ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"lookup","input":{}}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"q\""}}"#,
            r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":":1}"}}"#,
            r#"{"type":"content_block_delta","index":9,"delta":{"type":"input_json_delta","partial_json":"stray"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":4}}"#,
            r#"{"type":"message_stop"}"#,
        ]);
        assert_eq!(r.failure, None);
        assert_eq!(r.content, "Hi");
        assert_eq!((r.chunks, r.output_tokens, r.usage_mismatch), (4, 4, false));
        assert_eq!((r.prompt_tokens, r.cached_tokens), (Some(30), Some(16)));
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(r.tool_calls.len(), 1);
        let call = &r.tool_calls[0];
        assert_eq!(
            (
                call.id.as_str(),
                call.name.as_str(),
                call.arguments.as_str()
            ),
            ("toolu_1", "lookup", "{\"q\":1}")
        );
        assert!(r.timing.first_reasoning_us.is_some());
    }

    #[test]
    fn error_events_and_streams_cut_short_fail() {
        let r = read(&[
            r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":3}}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ]);
        assert_eq!(r.failure, Some(Failure::Server("Overloaded".into())));
        let r = read(&[
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#,
        ]);
        assert_eq!(
            r.failure,
            Some(Failure::Stream("ended before message_stop".into()))
        );
        let r = read(&[r#"{"type":"message_stop"}"#]);
        assert_eq!(r.failure, Some(Failure::EmptyStream));
    }

    #[test]
    fn chat_bodies_become_messages_bodies() {
        let chat = json!({"model": "m", "max_completion_tokens": 5, "ignore_eos": true,
            "stream": true, "stream_options": {"include_usage": true}, "nvext": {},
            "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "d",
                "parameters": {"type": "object"}}}],
            "messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\":1}"}},
                    {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": "not json"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "found"},
                {"role": "tool", "tool_call_id": "c2", "content": ""}]});
        assert_eq!(
            request(&chat),
            json!({"model": "m", "max_tokens": 5, "ignore_eos": true, "stream": true,
                "system": "be brief",
                "tools": [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}],
                "tool_choice": {"type": "any"},
                "messages": [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": 1}},
                        {"type": "tool_use", "id": "c2", "name": "lookup", "input": {}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "c1", "content": "found"},
                        {"type": "tool_result", "tool_use_id": "c2", "content": ""}]}]})
        );
        let completion = json!({"model": "m", "prompt": "p", "max_tokens": 2});
        assert_eq!(
            request(&completion)["messages"],
            json!([{"role": "user", "content": "p"}])
        );
    }
}
