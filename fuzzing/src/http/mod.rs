//! The HTTP targets: fuzzed bytes as the JSON body of `POST /v1/chat/completions` and
//! `POST /v1/completions`, sent through [`mock_server::api::app`] with `tower::ServiceExt::oneshot`.
//!
//! Each target owns one server (built on first use, per process): a multi-threaded tokio runtime
//! and an engine at `--speedup-ratio inf` with small limits ([`SERVER_FLAGS`]), so that the
//! largest answer a body can ask for is streamed in milliseconds. [`check_body`] also checks
//! bodies against a server with mockserve's default limits ([`DEFAULT_LIMITS_FLAGS`]), where
//! larger bodies and answers are allowed. Properties, for every body:
//!
//! - the request costs no more than its [`BODY_BUDGET`]: the heap of the server (its runtime's
//!   threads and the thread sending the request) grows by at most 64 MiB + 64 bytes per body
//!   byte + 32 per answer byte, the answer is at most [`MAX_RESPONSE_BYTES`], and the whole
//!   exchange (headers and body) ends within 5 s + 1 s per MiB of body; longer is a hang or
//!   work out of proportion to the body;
//! - the status is 200, a 4xx, or a 503 after which the engine still answers; never another 5xx;
//! - every 4xx (and 503) body is `{"error":{"message","type","param","code"}}` with a non-empty
//!   message, string type, and string-or-null param and code;
//! - a 200 JSON body is one completion of the endpoint's kind with consistent `usage`;
//! - a 200 stream is `data:` frames of chunks sharing one id and `created`, a `finish_reason`
//!   chunk (or a final error event) and `data: [DONE]` last;
//! - each choice of a completed answer that ends with `finish_reason: "length"` has exactly the
//!   output limit's tokens (`max_completion_tokens`, else `max_tokens`, else the default cut to
//!   the context), and one that ends with `stop` or `tool_calls` no more, as the server
//!   documents;
//! - every [`LIVENESS_EVERY`] bodies (and after any 503) a small valid request still gets a 200.
//!
//! After a hang the server is dropped and the next input gets a fresh one, so one wedged engine
//! does not fail every later input.

mod answer;
mod harness;

use std::time::Duration;

pub use answer::check_error_body;
use harness::Harness;

use crate::cost::{Spent, BODY_BUDGET};
use crate::meter::Meter;

/// Longest a small request may take, headers to the last body byte (larger bodies get 1 s more
/// per MiB: see [`BODY_BUDGET`]).
pub const TIMEOUT: Duration = BODY_BUDGET.time_base;

/// A liveness probe follows every this many inputs.
pub const LIVENESS_EVERY: u64 = 8;

/// Largest response body accepted (the biggest legitimate answer is far smaller).
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// The flags of the fuzzed server: no delays, two workers, a context (1024 tokens) larger than
/// one worker's KV cache (48 blocks of 16 = 768 tokens) so both limits are reachable, short
/// default answers, some reasoning, and a 64 KiB body limit that fuzzed inputs can cross.
pub const SERVER_FLAGS: &[&str] = &[
    "mockserve",
    "--speedup-ratio",
    "inf",
    "--num-workers",
    "2",
    "--block-size",
    "16",
    "--num-gpu-blocks",
    "48",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "256",
    "--max-model-len",
    "1024",
    "--default-max-tokens",
    "8",
    "--max-body-bytes",
    "65536",
    "--reasoning-ratio",
    "0.25",
];

/// The flags of the server with mockserve's default limits (8 MiB bodies, a 131,072-token
/// context, 256 default output tokens, four workers of 16,384 blocks of 64 tokens), without
/// delays: what a body may cost on a server as deployed.
pub const DEFAULT_LIMITS_FLAGS: &[&str] = &["mockserve", "--speedup-ratio", "inf"];

/// Which server a body goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limits {
    /// The fuzzed server's small limits ([`SERVER_FLAGS`]), as [`chat_body`] and
    /// [`completions_body`] use.
    Fuzz,
    /// mockserve's default limits ([`DEFAULT_LIMITS_FLAGS`]).
    Default,
}

/// The model the fuzzed server serves.
pub const MODEL: &str = "mock-model";

/// Which API a body goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl Endpoint {
    /// The route.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }

    /// A small valid body for the liveness probe.
    fn probe(self) -> String {
        match self {
            Endpoint::Chat => format!(
                r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"ping"}}],"max_tokens":2}}"#
            ),
            Endpoint::Completions => {
                format!(r#"{{"model":"{MODEL}","prompt":"ping","max_tokens":2}}"#)
            }
        }
    }

    /// `object` of a whole response and of a streamed chunk.
    fn objects(self) -> (&'static str, &'static str) {
        match self {
            Endpoint::Chat => ("chat.completion", "chat.completion.chunk"),
            Endpoint::Completions => ("text_completion", "text_completion"),
        }
    }

    /// Prefix of response ids.
    fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completions => "cmpl-",
        }
    }
}

/// Checks a `/v1/chat/completions` body (see the module docs for the properties).
pub fn chat_body(data: &[u8]) {
    check_body(Endpoint::Chat, Limits::Fuzz, data);
}

/// Checks a `/v1/completions` body (see the module docs for the properties).
pub fn completions_body(data: &[u8]) {
    check_body(Endpoint::Completions, Limits::Fuzz, data);
}

/// Checks a body to `endpoint` on the server with `limits` (see the module docs for the
/// properties) and returns what it cost; panics naming the violated property.
pub fn check_body(endpoint: Endpoint, limits: Limits, data: &[u8]) -> Spent {
    harness(endpoint, limits).check(data)
}

/// Starts the server that bodies to `endpoint` with `limits` go to, unless it runs: callers
/// that time checks leave its start-up (seconds in a debug build) out that way.
pub fn start_server(endpoint: Endpoint, limits: Limits) {
    harness(endpoint, limits).server();
}

/// The most the heap has grown since the body being checked on `endpoint` with `limits` (or,
/// when none is, the last one) was sent: the figure to report when a checker is stuck in
/// server work that its time budget cannot interrupt.
pub fn heap_growth(endpoint: Endpoint, limits: Limits) -> usize {
    harness(endpoint, limits).meter.peak_growth()
}

fn harness(endpoint: Endpoint, limits: Limits) -> &'static Harness {
    match (endpoint, limits) {
        (Endpoint::Chat, Limits::Fuzz) => &CHAT,
        (Endpoint::Completions, Limits::Fuzz) => &COMPLETIONS,
        (Endpoint::Chat, Limits::Default) => &CHAT_DEFAULT_LIMITS,
        (Endpoint::Completions, Limits::Default) => &COMPLETIONS_DEFAULT_LIMITS,
    }
}

static CHAT: Harness = Harness::new(Endpoint::Chat, SERVER_FLAGS, &CHAT_METER);
static COMPLETIONS: Harness = Harness::new(Endpoint::Completions, SERVER_FLAGS, &COMPLETIONS_METER);
static CHAT_DEFAULT_LIMITS: Harness = Harness::new(
    Endpoint::Chat,
    DEFAULT_LIMITS_FLAGS,
    &CHAT_DEFAULT_LIMITS_METER,
);
static COMPLETIONS_DEFAULT_LIMITS: Harness = Harness::new(
    Endpoint::Completions,
    DEFAULT_LIMITS_FLAGS,
    &COMPLETIONS_DEFAULT_LIMITS_METER,
);
static CHAT_METER: Meter = Meter::new("chat_body");
static COMPLETIONS_METER: Meter = Meter::new("completions_body");
static CHAT_DEFAULT_LIMITS_METER: Meter = Meter::new("chat_body with default limits");
static COMPLETIONS_DEFAULT_LIMITS_METER: Meter = Meter::new("completions_body with default limits");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_and_invalid_bodies_pass_the_checkers() {
        chat_body(br#"{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}"#);
        chat_body(
            br#"{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"stream":true,
                 "stream_options":{"include_usage":true},"max_tokens":40}"#,
        );
        chat_body(b"{\"model\": ");
        chat_body(br#"{"model":"other","messages":[]}"#);
        completions_body(br#"{"model":"mock-model","prompt":[[1,2,3]],"max_tokens":900}"#);
        completions_body(br#"{"model":"mock-model","prompt":"hi","stream":true}"#);
        completions_body(b"[]");
    }
}
