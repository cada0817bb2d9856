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
//! [`anthropic_errors`], in Anthropic's shape `{"type":"error","error":{"type","message"}}`
//! (`error`); a 503 becomes Anthropic's 529 `overloaded_error`.

pub(crate) mod error;
mod request;
mod wire;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::json;

use super::error::ApiError;
use super::layer::{Charge, Received};
use super::protocol::{ApiJson, ChatRequest};
use super::state::AppState;
use super::{budget, received_at, sse_response, start_chat};
use error::{anthropic_kind, error_body};

/// Messages one request may hold at most (`messages`), as Anthropic's API documents.
pub(crate) const MAX_MESSAGES: usize = 100_000;

/// The path prefix whose errors [`anthropic_errors`] writes.
const PATH: &str = "/v1/messages";

/// `POST /v1/messages`.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    received: Option<Extension<Received>>,
    charge: Option<Extension<Charge>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = received_at(&state, received);
    let charge = charge.and_then(|Extension(c)| c.take());
    let translated = request::to_chat(&body, false)?;
    let chat = ChatRequest::parse(&translated.chat)?;
    let mut generation = start_chat(&state, &headers, received, charge, chat).await?;
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
    // Written once: a layer further out (a fleet worker's) leaves it as it is.
    parts.extensions.remove::<ApiError>();
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
    fn only_messages_paths_are_rewritten() {
        assert!(is_messages_path("/v1/messages"));
        assert!(is_messages_path("/v1/messages/count_tokens"));
        assert!(!is_messages_path("/v1/messagesx"));
        assert!(!is_messages_path("/v1/chat/completions"));
    }
}
