//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, as vLLM
//! serves them.
//!
//! A Messages body is translated into the chat request it stands for (`request`), which then
//! runs exactly as `/v1/chat/completions` does: the same chat template and prompt tokens, answer
//! plan, engine submission, pacing, request budget, metrics and routing. Only the answer's wire
//! form differs (`wire`): content blocks, `stop_reason`, Anthropic's usage and named SSE events.
//!
//! Every error on these paths, whoever raises it (JSON rejection, budget cap, the key layer,
//! an injected fault, the edge limits, an unknown sub-route), is written once, by
//! [`anthropic_errors`], in Anthropic's shape `{"type":"error","error":{"type","message"}}`;
//! a 503 becomes Anthropic's 529 `overloaded_error`.

mod request;
pub(crate) mod wire;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::error::ApiError;
use super::layer::Received;
use super::protocol::{ApiJson, ChatRequest};
use super::state::AppState;
use super::{budget, received_at, sse_response, start_chat};

/// Messages one request may hold at most (`messages`), as Anthropic's API documents.
pub(crate) const MAX_MESSAGES: usize = 100_000;

/// Anthropic's status for an overloaded server (`overloaded_error`).
const OVERLOADED: u16 = 529;

/// The path prefix whose errors [`anthropic_errors`] writes.
const PATH: &str = "/v1/messages";

/// `POST /v1/messages`.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    received: Option<Extension<Received>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = received_at(&state, received);
    let translated = request::to_chat(&body, false)?;
    let chat = ChatRequest::parse(&translated.chat)?;
    let mut generation = start_chat(&state, &headers, received, chat).await?;
    // The chat id's hash, under Anthropic's prefix.
    let hash = generation
        .header
        .id
        .rsplit('-')
        .next()
        .unwrap_or_default()
        .to_string();
    generation.header.id = format!("msg_{hash}");
    let signature = format!("sig_{hash}");
    if translated.stream {
        let body = Body::from_stream(wire::sse_stream(generation, signature));
        Ok(sse_response(body))
    } else {
        Ok(Json(wire::collect(generation, signature).await?).into_response())
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the prompt tokens `/v1/messages`
/// would count for the same body (`max_tokens` not required). No engine work.
pub(crate) async fn count_tokens(
    State(state): State<AppState>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let translated = request::to_chat(&body, true)?;
    let chat = ChatRequest::parse(&translated.chat)?;
    for message in &chat.messages {
        budget::check_word_lengths(&message.content, "messages")?;
    }
    let text_bytes: usize = chat.messages.iter().map(|m| m.content.len()).sum();
    let codec = Arc::clone(&state.config.codec);
    let messages = chat.messages;
    let tokens = budget::off_runtime(text_bytes > budget::INLINE_TEXT_BYTES, move || {
        codec.render_chat(&messages, true).len()
    })
    .await?;
    Ok(Json(json!({"input_tokens": tokens})).into_response())
}

/// A `tool_use` block's id for a chat tool call's: `toolu_` and the call's seeded letters.
pub(crate) fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// Anthropic's error `type` and status for an error answered with `status`.
fn anthropic_kind(status: StatusCode) -> (&'static str, StatusCode) {
    let overloaded = StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    match status.as_u16() {
        401 => ("authentication_error", status),
        403 => ("permission_error", status),
        404 => ("not_found_error", status),
        413 => ("request_too_large", status),
        429 => ("rate_limit_error", status),
        503 | OVERLOADED => ("overloaded_error", overloaded),
        s if s >= 500 => ("api_error", status),
        _ => ("invalid_request_error", status),
    }
}

/// The Anthropic error body of `e`: `{"type":"error","error":{"type","message"}}`.
pub(crate) fn error_body(e: &ApiError) -> Value {
    let (kind, _) = anthropic_kind(e.status);
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

/// Whether `path` is served by this module.
fn is_messages_path(path: &str) -> bool {
    path == PATH
        || path
            .strip_prefix(PATH)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Rewrites every error answered on the Messages paths into Anthropic's shape and status (the
/// [`ApiError`] travels in the response's extensions), keeping the headers (`Retry-After`,
/// `Allow`, `Connection: close`). Outermost layer of the router, so it sees the edge limits'
/// answers too.
pub(crate) async fn anthropic_errors(request: Request, next: Next) -> Response {
    if !is_messages_path(request.uri().path()) {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    let Some(error) = response.extensions().get::<ApiError>().cloned() else {
        return response;
    };
    let (mut parts, _) = response.into_parts();
    let (_, status) = anthropic_kind(error.status);
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(error_body(&error).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropic_error_types() {
        for (status, kind, out) in [
            (400, "invalid_request_error", 400),
            (401, "authentication_error", 401),
            (404, "not_found_error", 404),
            (405, "invalid_request_error", 405),
            (413, "request_too_large", 413),
            (429, "rate_limit_error", 429),
            (500, "api_error", 500),
            (503, "overloaded_error", 529),
        ] {
            let status = StatusCode::from_u16(status).expect("status");
            let (k, s) = anthropic_kind(status);
            assert_eq!((k, s.as_u16()), (kind, out), "{status}");
        }
    }

    #[test]
    fn only_messages_paths_are_rewritten() {
        assert!(is_messages_path("/v1/messages"));
        assert!(is_messages_path("/v1/messages/count_tokens"));
        assert!(!is_messages_path("/v1/messagesx"));
        assert!(!is_messages_path("/v1/chat/completions"));
    }
}
