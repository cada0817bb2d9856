//! One request to any route loadgen drives (chat, text completions, Responses, Messages,
//! embeddings): send, read the SSE stream (or the one JSON answer), stamp times, classify the
//! outcome.
//!
//! Times are `tokio::time::Instant`s taken in the client task; every figure is an offset from the
//! send instant (taken just before the request is handed to reqwest).
//!
//! The modules: `response` holds what a request's outcome is, `chunk` how one streamed chunk
//! is decoded, `stream` the state of a stream being read; `responses`, `messages` and
//! `embeddings` each hold one other API's request body and events.

mod chunk;
pub(crate) mod embeddings;
pub(crate) mod messages;
mod response;
pub(crate) mod responses;
mod stream;

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::time::Instant;

pub use crate::run::failure::Failure;
use crate::run::sse::SseParser;
pub(crate) use response::{usage_warning, FirstToken, MAX_TOKENS_PER_CHUNK};
pub use response::{Response, Timing, TokenSource, ToolCall};
use stream::{us, StreamState};

/// Most bytes of a non-2xx response body read for its error message.
pub(crate) const ERROR_BODY_BYTES: usize = 16 * 1024;

/// The response of a request dropped because the run stopped early (sent at `start`).
pub fn cancelled(start: Instant) -> Response {
    StreamState::new(start).finish(Some(Failure::Cancelled))
}

/// How an endpoint's answers are read, and its key sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wire {
    /// OpenAI chat or text completions: SSE chunks until `data: [DONE]`.
    #[default]
    OpenAi,
    /// OpenAI Responses: typed SSE events until `response.completed` (or `.incomplete`).
    Responses,
    /// Anthropic Messages: typed SSE events until `message_stop`; the key as `x-api-key`, with
    /// `anthropic-version`.
    Messages,
    /// Embeddings: one JSON answer, not streamed.
    Embeddings,
}

impl Wire {
    /// Whether answers stream, so that the response headers come before the answer is whole
    /// (every wire but embeddings').
    pub(crate) fn streams(self) -> bool {
        self != Wire::Embeddings
    }

    /// The request body for this wire of the chat (or completions) body `chat`.
    pub(crate) fn body(self, chat: Value) -> Value {
        match self {
            Wire::OpenAi => chat,
            Wire::Responses => responses::request(&chat),
            Wire::Messages => messages::request(&chat),
            Wire::Embeddings => embeddings::request(&chat),
        }
    }

    /// The event that ends a successful stream, for the failure of one that ends before it.
    fn end_event(self) -> &'static str {
        match self {
            Wire::OpenAi => "data: [DONE]",
            Wire::Responses => "response.completed",
            Wire::Messages => "message_stop",
            Wire::Embeddings => "the answer",
        }
    }
}

/// Where to send and how.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The HTTP client (connection pool shared by all users).
    pub client: reqwest::Client,
    /// The full request URL: `{url}/v1/chat/completions`, `{url}/v1/completions`,
    /// `{url}/v1/responses`, `{url}/v1/messages` or `{url}/v1/embeddings`.
    pub url: String,
    /// How answers are read.
    pub wire: Wire,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Longest SSE line (and event data) accepted, in bytes; a longer one fails the request.
    pub max_line_bytes: usize,
}

/// The error message of a non-2xx body: `error.message` (OpenAI, vLLM), `error` as a string,
/// `message` or `detail` (FastAPI), else the text itself.
pub(crate) fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let text = |x: &Value| x.as_str().map(str::to_string);
        v.pointer("/error/message")
            .and_then(text)
            .or_else(|| v.get("error").and_then(text))
            .or_else(|| v.get("message").and_then(text))
            .or_else(|| v.get("detail").and_then(text))
    });
    from_json.unwrap_or_else(|| body.trim().to_string())
}

/// Reads at most [`ERROR_BODY_BYTES`] of an error response (a huge body is not buffered).
async fn error_body(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(ERROR_BODY_BYTES);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A reqwest error as a failure: a timeout, or `other` with the error's causes.
fn classify(e: &reqwest::Error, other: fn(String) -> Failure, when: &str) -> Failure {
    if e.is_timeout() {
        Failure::Timeout(format!(
            "no complete response within the request timeout ({when})"
        ))
    } else {
        other(crate::error::chain(e))
    }
}

/// A request body serialized before its send is due, so that the timed send does no JSON
/// work (a trace prompt of 15,000 tokens is about 100 kB of JSON text).
#[derive(Debug)]
pub struct Encoded(Vec<u8>);

impl Encoded {
    /// `body` as JSON bytes.
    pub fn new(body: &Value) -> Result<Encoded, serde_json::Error> {
        serde_json::to_vec(body).map(Encoded)
    }
}

/// The failed response of a body that could not be encoded (sent at `start`).
fn unencodable(start: Instant, e: &serde_json::Error) -> Response {
    StreamState::new(start).finish(Some(Failure::Transport(format!(
        "the request body could not be encoded as JSON: {e}"
    ))))
}

/// Sends one streamed chat request and reads it to the end.
pub async fn send(endpoint: &Endpoint, body: &Value) -> Response {
    let body = match Encoded::new(body) {
        Ok(b) => b,
        Err(e) => return unencodable(Instant::now(), &e),
    };
    match reqwest::Url::parse(&endpoint.url) {
        Ok(url) => send_encoded(endpoint, &url, body, None).await,
        // reqwest reports the bad URL as it would have.
        Err(_) => send_request(endpoint, endpoint.client.post(&endpoint.url), body, None).await,
    }
}

/// [`send`] to `url`, `endpoint.url` parsed once by the caller (a URL is not parsed per request).
/// `on_headers` is dropped once the response headers came (or the request failed before them):
/// a server that answers headers only after admitting the request has admitted it by then.
pub(crate) async fn send_to(
    endpoint: &Endpoint,
    url: &reqwest::Url,
    body: &Value,
    on_headers: Option<tokio::sync::oneshot::Sender<()>>,
) -> Response {
    match Encoded::new(body) {
        Ok(body) => send_encoded(endpoint, url, body, on_headers).await,
        Err(e) => unencodable(Instant::now(), &e),
    }
}

/// [`send_to`] with the body already encoded: the send itself only hands the bytes to the
/// connection.
pub(crate) async fn send_encoded(
    endpoint: &Endpoint,
    url: &reqwest::Url,
    body: Encoded,
    on_headers: Option<tokio::sync::oneshot::Sender<()>>,
) -> Response {
    send_request(
        endpoint,
        endpoint.client.post(url.clone()),
        body,
        on_headers,
    )
    .await
}

async fn send_request(
    endpoint: &Endpoint,
    request: reqwest::RequestBuilder,
    body: Encoded,
    on_headers: Option<tokio::sync::oneshot::Sender<()>>,
) -> Response {
    let mut request = request
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.0);
    let wire = endpoint.wire;
    if wire == Wire::Messages {
        request = request.header("anthropic-version", messages::ANTHROPIC_VERSION);
    }
    request = match (&endpoint.api_key, wire) {
        (Some(key), Wire::Messages) => request.header("x-api-key", key),
        (Some(key), _) => request.bearer_auth(key),
        (None, _) => request,
    };
    let start = Instant::now();
    let mut state = StreamState::new(start);
    let sent = request.send().await;
    drop(on_headers);
    let response = match sent {
        Ok(r) => r,
        Err(e) => {
            let f = classify(&e, Failure::Transport, "before the response headers");
            return state.finish(Some(f));
        }
    };
    state.timing.headers_us = Some(us(start));
    let status = response.status();
    if !status.is_success() {
        let body = error_body(response).await;
        return state.finish(Some(Failure::Http {
            status: status.as_u16(),
            message: error_message(&body),
        }));
    }
    if wire == Wire::Embeddings {
        return embeddings::read(response, state, endpoint.max_line_bytes).await;
    }
    let mut parser = SseParser::with_limit(endpoint.max_line_bytes);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => {
                let f = classify(&e, Failure::Stream, "while streaming");
                return state.finish(Some(f));
            }
        };
        if let Some(outcome) = feed(wire, &mut parser, &mut state, &bytes) {
            return state.finish(outcome);
        }
    }
    let outcome = at_end(wire, &mut parser, &mut state);
    state.finish(outcome)
}

/// Reads `bytes` of a stream: `Some` with the request's outcome (None: success) once it is
/// over, `None` while more is expected.
fn feed(
    wire: Wire,
    parser: &mut SseParser,
    state: &mut StreamState,
    bytes: &[u8],
) -> Option<Option<Failure>> {
    let events = match parser.push_events(bytes) {
        Ok(events) => events,
        Err(e) => return Some(Some(Failure::LineTooLong { limit: e.limit })),
    };
    for data in events {
        if let Err(f) = on_event(wire, state, data) {
            return Some(Some(f));
        }
        if state.done {
            return Some(None);
        }
    }
    None
}

/// The outcome of a stream whose body ended without [`feed`] ending it.
fn at_end(wire: Wire, parser: &mut SseParser, state: &mut StreamState) -> Option<Failure> {
    match parser.finish() {
        Ok(Some(data)) => {
            if let Err(f) = on_event(wire, state, &data) {
                return Some(f);
            }
        }
        Ok(None) => {}
        Err(e) => return Some(Failure::LineTooLong { limit: e.limit }),
    }
    if state.done {
        return None;
    }
    let end = wire.end_event();
    Some(Failure::Stream(format!("ended before {end}")))
}

/// One SSE event's data read as `wire` streams it; `Err` is the server's error event.
fn on_event(wire: Wire, state: &mut StreamState, data: &str) -> Result<(), Failure> {
    match wire {
        Wire::OpenAi | Wire::Embeddings => state.on_event(data),
        Wire::Responses => responses::on_event(state, data),
        Wire::Messages => messages::on_event(state, data),
    }
}

/// How long an idle pooled connection may be reused: below the keep-alive timeouts servers
/// commonly close idle connections at (mockserve's `--idle-timeout` and uvicorn's both default to
/// 5 s). reqwest's own 90 s lets a request go out on a connection the server is closing at that
/// moment, which fails as "connection closed before message completed".
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(2);

/// The request timeout as reqwest wants it.
pub fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .tcp_nodelay(true)
        .build()
}

#[cfg(test)]
mod wire_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_of_common_bodies() {
        let openai = r#"{"error":{"message":"rate limited","type":"rate_limit_error","param":null,"code":null}}"#;
        assert_eq!(error_message(openai), "rate limited");
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message(r#"{"error":"overloaded"}"#), "overloaded");
        assert_eq!(error_message("  Bad Gateway\n"), "Bad Gateway");
    }
}
