//! The embeddings API (`POST /v1/embeddings`) on the wire: the request made from a chat body
//! ([`request`]) and the one JSON answer read ([`read`]).
//!
//! Not streamed, so the whole answer is the only "token": TTFT is the end-to-end latency (the
//! body fully read), there is no ITL, and output tokens are 0. Usage is `usage.prompt_tokens`.
//! The body is read up to `--max-line-bytes` (one input's vector is well under it); a longer
//! one fails the request, never buffered whole.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::run::client::responses::text;
use crate::run::client::stream::StreamState;
use crate::run::client::Response;
use crate::run::failure::Failure;

/// An embeddings body for the text of the chat (or completions) body `chat`: the prompt, or
/// the messages' texts joined by newlines, as one input.
pub(crate) fn request(chat: &Value) -> Value {
    let input = match chat.get("prompt") {
        Some(prompt) => prompt.clone(),
        None => {
            let list = chat.get("messages").and_then(Value::as_array);
            let texts: Vec<&str> = list.into_iter().flatten().map(text).collect();
            json!(texts.join("\n"))
        }
    };
    json!({"model": chat["model"], "input": input, "encoding_format": "float"})
}

/// An embeddings answer as read: the vectors are counted, not kept.
#[derive(Deserialize)]
struct Answer {
    data: Option<Vec<serde::de::IgnoredAny>>,
    usage: Option<Usage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
}

/// Reads the answer body (at most `limit` bytes) and finishes the request.
pub(super) async fn read(
    mut response: reqwest::Response,
    mut state: StreamState,
    limit: usize,
) -> Response {
    state.no_output = true;
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > limit {
                    return state.finish(Some(Failure::BodyTooLong { limit }));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => {
                let f = super::classify(&e, Failure::Stream, "while reading the body");
                return state.finish(Some(f));
            }
        }
    }
    let t = state.elapsed_us();
    let failure = on_body(&mut state, &body, t);
    state.finish(failure)
}

/// Records the answer `body`, complete at `t`: the end is its one token; None on success.
fn on_body(state: &mut StreamState, body: &[u8], t: u64) -> Option<Failure> {
    state.timing.first_chunk_us = Some(t);
    let Ok(answer) = serde_json::from_slice::<Answer>(body) else {
        return Some(Failure::Stream(
            "the answer is not an embeddings object".into(),
        ));
    };
    if let Some(e) = answer.error.filter(|e| !e.is_null()) {
        return Some(Failure::Server(super::responses::message_of(&e)));
    }
    if answer.data.is_none_or(|d| d.is_empty()) {
        return Some(Failure::EmptyStream);
    }
    let prompt = answer.usage.and_then(|u| u.prompt_tokens);
    state.merge_usage((None, prompt, None));
    state.timing.first_answer_us = Some(t);
    state.timing.token_chunks_us.push(t);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn read_body(body: &str) -> Response {
        let mut s = StreamState::new(Instant::now());
        s.no_output = true;
        let f = on_body(&mut s, body.as_bytes(), 7);
        s.finish(f)
    }

    #[test]
    fn an_answer_is_one_token_at_the_end_and_no_output() {
        let r = read_body(
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.6,0.8]}],"model":"m","usage":{"prompt_tokens":12,"total_tokens":12}}"#,
        );
        assert_eq!(r.failure, None);
        assert_eq!(
            (r.output_tokens, r.chunks, r.prompt_tokens),
            (0, 0, Some(12))
        );
        assert_eq!(r.timing.token_chunks_us, [7]);
        assert_eq!(r.timing.first_answer_us, Some(7));
        assert_eq!(r.timing.output_tokens_per_s(r.output_tokens), None);
    }

    #[test]
    fn bad_answers_fail_by_reason() {
        for (body, failure) in [
            (r#"{"data":[]}"#, Failure::EmptyStream),
            (r#"{"usage":{"prompt_tokens":1}}"#, Failure::EmptyStream),
            (
                r#"{"error":{"message":"too many inputs","type":"invalid_request_error"}}"#,
                Failure::Server("too many inputs".into()),
            ),
            (
                "garbage",
                Failure::Stream("the answer is not an embeddings object".into()),
            ),
            (
                r#"{"data":5}"#,
                Failure::Stream("the answer is not an embeddings object".into()),
            ),
        ] {
            assert_eq!(read_body(body).failure, Some(failure), "{body}");
        }
    }

    #[test]
    fn chat_bodies_become_embeddings_bodies() {
        let chat = json!({"model": "m", "max_tokens": 3, "stream": true,
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]});
        assert_eq!(
            request(&chat),
            json!({"model": "m", "input": "s\nu", "encoding_format": "float"})
        );
        let completion = json!({"model": "m", "prompt": "p", "max_tokens": 2});
        assert_eq!(request(&completion)["input"], "p");
    }
}
