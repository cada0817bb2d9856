//! One streamed chat or text-completion request: send, read the SSE stream, stamp times, classify the outcome.
//!
//! Times are `tokio::time::Instant`s taken in the client task; every figure is an offset from the
//! send instant (taken just before the request is handed to reqwest).

use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use crate::sse::SseParser;

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Failure {
    /// Non-2xx response status (with the start of the body).
    Http {
        /// The status code.
        status: u16,
        /// The start of the response body.
        body: String,
    },
    /// Connect, send or timeout error before the response headers.
    Transport(String),
    /// The body stream broke, or ended before `data: [DONE]`.
    Stream(String),
    /// The server sent `data: {"error": ...}`.
    Server(String),
}

impl Failure {
    /// A short key grouping similar failures in the summary.
    pub fn reason(&self) -> String {
        match self {
            Failure::Http { status, .. } => format!("HTTP {status}"),
            Failure::Transport(m) => format!("transport: {m}"),
            Failure::Stream(m) => format!("stream: {m}"),
            Failure::Server(m) => format!("server error: {m}"),
        }
    }
}

/// Where `output_tokens` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// Counted content/reasoning chunks (no usage chunk arrived).
    Chunks,
}

/// Everything measured about one request; times in µs from the send.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Response headers arrived.
    pub headers_us: Option<u64>,
    /// First SSE event arrived.
    pub first_chunk_us: Option<u64>,
    /// First reasoning token.
    pub first_reasoning_us: Option<u64>,
    /// First answer (content) token.
    pub first_answer_us: Option<u64>,
    /// Every chunk carrying a token (content or reasoning), in order.
    pub token_chunks_us: Vec<u64>,
    /// The stream ended (or the request failed).
    pub end_us: u64,
}

impl Timing {
    /// Time to the first token of any kind (reasoning included).
    pub fn ttft_any_us(&self) -> Option<u64> {
        self.token_chunks_us.first().copied()
    }
}

/// The outcome of one request.
#[derive(Clone, Debug)]
pub struct Response {
    /// Measured times.
    pub timing: Timing,
    /// Concatenated `delta.content` (what goes back into the history).
    pub content: String,
    /// Completion tokens (usage, else counted chunks).
    pub output_tokens: u64,
    /// Where `output_tokens` came from.
    pub output_tokens_source: TokenSource,
    /// `usage.prompt_tokens`, when sent.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`, when sent.
    pub cached_tokens: Option<u64>,
    /// None on success.
    pub failure: Option<Failure>,
}

/// Where to send and how.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The HTTP client (connection pool shared by all users).
    pub client: reqwest::Client,
    /// The full request URL: `{url}/v1/chat/completions` or `{url}/v1/completions`.
    pub url: String,
    /// Bearer token.
    pub api_key: Option<String>,
}

fn us(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

/// Tracks `<think>…</think>` in content (inline reasoning format).
#[derive(Default)]
struct InlineThink {
    inside: bool,
}

impl InlineThink {
    /// Splits a content delta into (reasoning?, answer?) presence.
    fn classify(&mut self, text: &str) -> (bool, bool) {
        let mut reasoning = false;
        let mut answer = false;
        let mut rest = text;
        loop {
            if self.inside {
                match rest.find("</think>") {
                    Some(i) => {
                        reasoning |= !rest[..i].trim().is_empty();
                        self.inside = false;
                        rest = &rest[i + "</think>".len()..];
                    }
                    None => {
                        reasoning |= !rest.trim().is_empty();
                        return (reasoning, answer);
                    }
                }
            } else {
                match rest.find("<think>") {
                    Some(i) => {
                        answer |= !rest[..i].is_empty();
                        self.inside = true;
                        rest = &rest[i + "<think>".len()..];
                    }
                    None => {
                        answer |= !rest.is_empty();
                        return (reasoning, answer);
                    }
                }
            }
        }
    }
}

/// State of one stream being read.
struct StreamState {
    start: Instant,
    timing: Timing,
    content: String,
    chunks: u64,
    usage: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    think: InlineThink,
    done: bool,
}

impl StreamState {
    /// Handles one SSE data payload; `Err` is a server error event.
    fn on_event(&mut self, data: &str) -> Result<(), Failure> {
        let t = us(self.start);
        self.timing.first_chunk_us.get_or_insert(t);
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Ok(());
        };
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string());
            return Err(Failure::Server(message));
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let get = |k: &str| u.get(k).and_then(Value::as_u64);
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64);
            self.usage = Some((get("completion_tokens"), get("prompt_tokens"), cached));
        }
        // `/v1/completions` streams `choices[0].text`; it has no reasoning channel.
        if let Some(text) = v.pointer("/choices/0/text").and_then(Value::as_str) {
            if !text.is_empty() {
                self.chunks += 1;
                self.timing.token_chunks_us.push(t);
                self.timing.first_answer_us.get_or_insert(t);
                self.content.push_str(text);
            }
            return Ok(());
        }
        let Some(delta) = v.pointer("/choices/0/delta") else {
            return Ok(());
        };
        let text = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or("");
        let reasoning_text = if text("reasoning_content").is_empty() {
            text("reasoning")
        } else {
            text("reasoning_content")
        };
        let mut reasoning = !reasoning_text.is_empty();
        let content = text("content");
        let mut answer = false;
        if !content.is_empty() {
            let (r, a) = self.think.classify(content);
            reasoning |= r;
            answer = a;
            self.content.push_str(content);
        }
        if reasoning || answer {
            self.chunks += 1;
            self.timing.token_chunks_us.push(t);
        }
        if reasoning {
            self.timing.first_reasoning_us.get_or_insert(t);
        }
        if answer {
            self.timing.first_answer_us.get_or_insert(t);
        }
        Ok(())
    }

    fn finish(mut self, failure: Option<Failure>) -> Response {
        self.timing.end_us = us(self.start);
        let (output_tokens, source, prompt, cached) = match self.usage {
            Some((Some(c), p, cached)) => (c, TokenSource::Usage, p, cached),
            Some((None, p, cached)) => (self.chunks, TokenSource::Chunks, p, cached),
            None => (self.chunks, TokenSource::Chunks, None, None),
        };
        Response {
            timing: self.timing,
            content: self.content,
            output_tokens,
            output_tokens_source: source,
            prompt_tokens: prompt,
            cached_tokens: cached,
            failure,
        }
    }
}

/// Sends one streamed chat request and reads it to the end.
pub async fn send(endpoint: &Endpoint, body: &Value) -> Response {
    let mut request = endpoint.client.post(&endpoint.url).json(body);
    if let Some(key) = &endpoint.api_key {
        request = request.bearer_auth(key);
    }
    let start = Instant::now();
    let mut state = StreamState {
        start,
        timing: Timing::default(),
        content: String::new(),
        chunks: 0,
        usage: None,
        think: InlineThink::default(),
        done: false,
    };
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => return state.finish(Some(Failure::Transport(error_chain(&e)))),
    };
    state.timing.headers_us = Some(us(start));
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        let body: String = body.chars().take(500).collect();
        return state.finish(Some(Failure::Http {
            status: status.as_u16(),
            body,
        }));
    }
    let mut parser = SseParser::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => return state.finish(Some(Failure::Stream(error_chain(&e)))),
        };
        for data in parser.push(&bytes) {
            if let Err(f) = state.on_event(&data) {
                return state.finish(Some(f));
            }
            if state.done {
                return state.finish(None);
            }
        }
    }
    if let Some(data) = parser.finish() {
        if let Err(f) = state.on_event(&data) {
            return state.finish(Some(f));
        }
    }
    if state.done {
        state.finish(None)
    } else {
        state.finish(Some(Failure::Stream("ended before data: [DONE]".into())))
    }
}

/// An error and its causes on one line (reqwest's top-level message alone is vague).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// The request timeout as reqwest wants it.
pub fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .tcp_nodelay(true)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_think_splits_reasoning_from_answer() {
        let mut t = InlineThink::default();
        assert_eq!(t.classify("<think>hmm "), (true, false));
        assert_eq!(t.classify("more "), (true, false));
        assert_eq!(t.classify("done</think>"), (true, false));
        assert_eq!(t.classify("answer "), (false, true));
        let mut t = InlineThink::default();
        assert_eq!(t.classify("<think>a</think>b"), (true, true));
    }
}
