//! What an answer must be: the status, the OpenAI error body, a whole completion with
//! consistent `usage`, or a stream of chunks ending in `data: [DONE]`; and what a completed
//! answer generated.

use axum::http::StatusCode;
use serde_json::Value;

use super::{Endpoint, MODEL};

/// A response, read to the end.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) content_type: String,
    pub(super) body: Vec<u8>,
}

/// What a completed answer generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Generated {
    /// `usage.prompt_tokens`, when the answer has usage.
    pub(super) prompt_tokens: Option<u64>,
    /// Output tokens (all choices).
    pub(super) completion_tokens: u64,
    /// Choices.
    pub(super) choices: u64,
    /// Every choice ended at the output limit (`finish_reason: "length"`).
    pub(super) all_length: bool,
}

/// Checks one answer against the properties of the module docs; what a completed 200
/// generated (`None` for an error or a stream ended by an error event).
pub(super) fn check_answer(
    endpoint: Endpoint,
    answer: &Answer,
) -> Result<Option<Generated>, String> {
    let status = answer.status;
    if status == StatusCode::OK {
        if answer.content_type.starts_with("text/event-stream") {
            return check_stream(endpoint, &answer.body);
        }
        let value: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| format!("a 200 body is not JSON: {e}"))?;
        return check_completion(endpoint, &value).map(Some);
    }
    if status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE {
        let value: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| format!("a {status} body is not JSON: {e}"))?;
        return check_error_body(&value)
            .map(|()| None)
            .map_err(|e| format!("{status}: {e}"));
    }
    Err(format!(
        "status {status}: expected 200, a 4xx or a 503 for overload"
    ))
}

/// `{"error":{"message","type","param","code"}}`, nothing else at the top.
pub fn check_error_body(value: &Value) -> Result<(), String> {
    let top = value.as_object().ok_or("the error body is not an object")?;
    if top.len() != 1 {
        return Err(format!(
            "the error body has other keys than `error`: {value}"
        ));
    }
    let error = top
        .get("error")
        .and_then(Value::as_object)
        .ok_or_else(|| format!("no `error` object: {value}"))?;
    match error.get("message") {
        Some(Value::String(m)) if !m.is_empty() => {}
        _ => {
            return Err(format!(
                "`error.message` is not a non-empty string: {value}"
            ))
        }
    }
    if !error.get("type").is_some_and(Value::is_string) {
        return Err(format!("`error.type` is not a string: {value}"));
    }
    for key in ["param", "code"] {
        match error.get(key) {
            Some(Value::String(_) | Value::Null) => {}
            _ => return Err(format!("`error.{key}` is not a string or null: {value}")),
        }
    }
    Ok(())
}

/// Prompt + completion = total, at least one completion token; returns what was generated.
fn check_usage(usage: &Value) -> Result<Generated, String> {
    let count = |key: &str| {
        usage
            .get(key)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("`usage.{key}` is not a count: {usage}"))
    };
    let (prompt, completion, total) = (
        count("prompt_tokens")?,
        count("completion_tokens")?,
        count("total_tokens")?,
    );
    if prompt.checked_add(completion) != Some(total) || completion == 0 {
        return Err(format!("inconsistent usage: {usage}"));
    }
    let cached = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("no `usage.prompt_tokens_details.cached_tokens`: {usage}"))?;
    if cached > prompt {
        return Err(format!("more cached than prompt tokens: {usage}"));
    }
    Ok(Generated {
        prompt_tokens: Some(prompt),
        completion_tokens: completion,
        choices: 1,
        all_length: true,
    })
}

/// The response identity every chunk (or the whole response) carries.
fn check_identity(endpoint: Endpoint, value: &Value, object: &str) -> Result<(), String> {
    if value["object"] != object {
        return Err(format!("`object` is not {object:?}: {value}"));
    }
    if !value["id"]
        .as_str()
        .is_some_and(|id| id.starts_with(endpoint.id_prefix()))
    {
        return Err(format!(
            "`id` does not start with {:?}: {value}",
            endpoint.id_prefix()
        ));
    }
    if value["model"] != MODEL || !value["created"].is_u64() {
        return Err(format!("bad `model` or `created`: {value}"));
    }
    Ok(())
}

/// A whole (non-stream) completion.
fn check_completion(endpoint: Endpoint, value: &Value) -> Result<Generated, String> {
    check_identity(endpoint, value, endpoint.objects().0)?;
    let choices = value["choices"]
        .as_array()
        .ok_or_else(|| format!("`choices` is not an array: {value}"))?;
    if choices.is_empty() {
        return Err(format!("no choices: {value}"));
    }
    let mut all_length = true;
    for (i, choice) in choices.iter().enumerate() {
        if choice["index"] != i {
            return Err(format!("choice {i} has another `index`: {value}"));
        }
        let finish = &choice["finish_reason"];
        if !FINISH_REASONS.iter().any(|r| finish == r) {
            return Err(format!("bad `finish_reason`: {value}"));
        }
        all_length &= finish == "length";
        let text = match endpoint {
            Endpoint::Chat => {
                let message = &choice["message"];
                if message["role"] != "assistant" {
                    return Err(format!("the message is not the assistant's: {value}"));
                }
                if message["content"].is_null() && message["tool_calls"].is_array() {
                    continue;
                }
                &message["content"]
            }
            Endpoint::Completions => &choice["text"],
        };
        if !text.is_string() {
            return Err(format!("no answer text: {value}"));
        }
    }
    Ok(Generated {
        choices: choices.len() as u64,
        all_length,
        ..check_usage(&value["usage"])?
    })
}

/// The finish reasons the server sends.
const FINISH_REASONS: [&str; 3] = ["length", "stop", "tool_calls"];

/// A streamed completion: `data:` frames, chunks with one identity, then `[DONE]`; what it
/// generated, unless an error event ended it.
fn check_stream(endpoint: Endpoint, body: &[u8]) -> Result<Option<Generated>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("the stream is not UTF-8: {e}"))?;
    let frames = text
        .strip_suffix("\n\n")
        .ok_or("the stream does not end with a blank line")?
        .split("\n\n")
        .map(|frame| {
            frame
                .strip_prefix("data: ")
                .ok_or_else(|| format!("a frame is not a `data: ` line: {frame:?}"))
        })
        .collect::<Result<Vec<&str>, String>>()?;
    let Some((&"[DONE]", events)) = frames.split_last() else {
        return Err("the stream does not end with `data: [DONE]`".into());
    };
    let chunk_object = endpoint.objects().1;
    let mut identity: Option<(Value, Value)> = None;
    let mut deltas = 0u64;
    // Per choice index: finished, and at the limit.
    let mut choice_ends: Vec<Option<bool>> = Vec::new();
    let mut tool_calls = false;
    let mut usage = None;
    for (i, event) in events.iter().enumerate() {
        let value: Value = serde_json::from_str(event)
            .map_err(|e| format!("event {i} is not JSON ({e}): {event}"))?;
        if value.get("error").is_some() {
            check_error_body(&value).map_err(|e| format!("error event {i}: {e}"))?;
            if i + 1 != events.len() {
                return Err(format!("events follow the error event {i}"));
            }
            return Ok(None);
        }
        check_identity(endpoint, &value, chunk_object).map_err(|e| format!("chunk {i}: {e}"))?;
        let this = (value["id"].clone(), value["created"].clone());
        if identity.get_or_insert_with(|| this.clone()) != &this {
            return Err(format!("chunk {i} changes `id` or `created`: {value}"));
        }
        let choices = value["choices"]
            .as_array()
            .ok_or_else(|| format!("chunk {i} has no `choices` array: {value}"))?;
        if usage.is_some() {
            return Err(format!("chunk {i} follows the usage chunk"));
        }
        let all_finished = !choice_ends.is_empty() && choice_ends.iter().all(Option::is_some);
        match choices.as_slice() {
            [] => {
                if !all_finished {
                    return Err(format!("usage chunk {i} before the finish chunks"));
                }
                usage = Some(check_usage(&value["usage"])?);
            }
            [choice] => {
                // Choices stream independently: a later choice may start after an earlier one
                // finished, so only a finished choice's own index may not come back.
                let index = choice["index"]
                    .as_u64()
                    .ok_or_else(|| format!("chunk {i} has no choice index"))?
                    as usize;
                if index > choice_ends.len() || index > 4096 {
                    return Err(format!("chunk {i} skips a choice index: {value}"));
                }
                if index == choice_ends.len() {
                    choice_ends.push(None);
                }
                if choice_ends[index].is_some() {
                    return Err(format!(
                        "chunk {i} follows choice {index}'s finish: {value}"
                    ));
                }
                match &choice["finish_reason"] {
                    Value::Null => {}
                    reason if FINISH_REASONS.iter().any(|r| reason == r) => {
                        choice_ends[index] = Some(reason == "length");
                        continue;
                    }
                    reason => return Err(format!("chunk {i} has finish_reason {reason}")),
                }
                let delta = &choice["delta"];
                let is_role = endpoint == Endpoint::Chat && delta.get("role").is_some();
                if is_role && delta["role"] != "assistant" {
                    return Err(format!("a role chunk is not the assistant's: {value}"));
                }
                tool_calls |= delta.get("tool_calls").is_some();
                if !is_role {
                    deltas += 1;
                }
            }
            _ => return Err(format!("chunk {i} has several choices: {value}")),
        }
    }
    if choice_ends.is_empty() || choice_ends.iter().any(Option::is_none) {
        return Err(
            "the stream ends without a finish_reason chunk per choice or an error event".into(),
        );
    }
    let all_length = choice_ends.iter().all(|end| *end == Some(true));
    let choices = choice_ends.len() as u64;
    match usage {
        // Every token shows in its own chunk unless a stop cut the text or a tool call added
        // its header chunk.
        Some(usage) if all_length && !tool_calls && usage.completion_tokens != deltas => {
            Err(format!(
                "usage counts {} completion tokens, the stream has {deltas} token chunks",
                usage.completion_tokens
            ))
        }
        Some(usage) => Ok(Some(Generated {
            choices,
            all_length,
            ..usage
        })),
        None if all_length && !tool_calls => Ok(Some(Generated {
            prompt_tokens: None,
            completion_tokens: deltas,
            choices,
            all_length,
        })),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn error_bodies_need_all_four_keys() {
        let good = json!({"error": {"message": "m", "type": "t", "param": null, "code": "c"}});
        assert!(check_error_body(&good).is_ok());
        for bad in [
            json!({"error": {"message": "", "type": "t", "param": null, "code": null}}),
            json!({"error": {"message": "m", "param": null, "code": null}}),
            json!({"error": {"message": "m", "type": "t", "code": null}}),
            json!({"error": {"message": "m", "type": "t", "param": null, "code": 400}}),
            json!({"error": "m"}),
            json!({"error": {"message": "m", "type": "t", "param": null, "code": null}, "x": 1}),
        ] {
            assert!(check_error_body(&bad).is_err(), "{bad}");
        }
    }

    fn chunk(choices: Value) -> String {
        json!({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
               "choices": choices})
        .to_string()
    }

    fn stream(events: &[String]) -> Vec<u8> {
        let mut s: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        s.push_str("data: [DONE]\n\n");
        s.into_bytes()
    }

    #[test]
    fn streams_need_a_finish_and_done_and_matching_usage() {
        let token = chunk(json!([{"index": 0, "text": "a", "finish_reason": null}]));
        let finish = chunk(json!([{"index": 0, "text": "", "finish_reason": "length"}]));
        let usage = |n: u64| {
            let mut v: Value = serde_json::from_str(&chunk(json!([]))).expect("json");
            v["usage"] = json!({"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n,
                                "prompt_tokens_details": {"cached_tokens": 0}});
            v.to_string()
        };
        let ok = stream(&[token.clone(), token.clone(), finish.clone(), usage(2)]);
        let generated = Generated {
            prompt_tokens: Some(3),
            completion_tokens: 2,
            choices: 1,
            all_length: true,
        };
        assert_eq!(
            check_stream(Endpoint::Completions, &ok),
            Ok(Some(generated))
        );
        let wrong_usage = stream(&[token.clone(), finish.clone(), usage(2)]);
        assert!(check_stream(Endpoint::Completions, &wrong_usage).is_err());
        let no_finish = stream(std::slice::from_ref(&token));
        assert!(check_stream(Endpoint::Completions, &no_finish).is_err());
        let mut no_done = stream(&[token.clone(), finish.clone()]);
        no_done.truncate(no_done.len() - "data: [DONE]\n\n".len());
        assert!(check_stream(Endpoint::Completions, &no_done).is_err());
        let error = json!({"error": {"message": "m", "type": "t", "param": null, "code": null}});
        let failed = stream(&[token.clone(), error.to_string()]);
        assert_eq!(check_stream(Endpoint::Completions, &failed), Ok(None));
        let chat = stream(&[token.clone(), finish.clone()]);
        assert!(check_stream(Endpoint::Chat, &chat).is_err(), "wrong object");

        // Two choices: each needs its finish; a stop may end one before the limit.
        let token1 = chunk(json!([{"index": 1, "text": "b", "finish_reason": null}]));
        let stop1 = chunk(json!([{"index": 1, "text": "", "finish_reason": "stop"}]));
        let both = stream(&[
            token.clone(),
            token1.clone(),
            finish.clone(),
            stop1,
            usage(2),
        ]);
        let generated = check_stream(Endpoint::Completions, &both)
            .expect("valid")
            .expect("generated");
        assert_eq!((generated.choices, generated.all_length), (2, false));
        let one_open = stream(&[token, token1, finish.clone(), usage(2)]);
        assert!(check_stream(Endpoint::Completions, &one_open).is_err());
        let skipped = chunk(json!([{"index": 2, "text": "c", "finish_reason": null}]));
        assert!(check_stream(Endpoint::Completions, &stream(&[skipped, finish])).is_err());
    }
}
