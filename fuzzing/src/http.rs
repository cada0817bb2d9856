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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::config::ServerConfig;
use serde_json::Value;
use tower::ServiceExt;

use crate::cost::{Spent, BODY_BUDGET};
use crate::meter::{charge_thread, Meter};

/// Longest a small request may take, headers to the last body byte (larger bodies get 1 s more
/// per MiB: see [`BODY_BUDGET`]).
pub const TIMEOUT: Duration = BODY_BUDGET.time_base;

/// Bytes of a violating answer shown in the message.
const SHOWN_ANSWER_BYTES: usize = 4 << 10;

/// Longest an input waits for the previous one to the same server to finish.
const TURN_WAIT: Duration = Duration::from_secs(10);

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

/// A runtime and the server state living on it.
struct Server {
    runtime: tokio::runtime::Runtime,
    router: Router,
    /// The output limit of a request without one, before the context cuts it.
    default_max_tokens: u64,
    /// The context length.
    max_model_len: u64,
}

impl Server {
    /// Starts a server with `flags` whose runtime threads are charged to `meter`.
    fn start(flags: &[&str], meter: &'static Meter) -> Server {
        let cli = match mock_server::Cli::try_parse_from(flags) {
            Ok(cli) => cli,
            Err(e) => panic!("the fuzzed server's flags do not parse: {e}"),
        };
        let config = match ServerConfig::from_args(&cli.serve) {
            Ok(config) => config,
            Err(e) => panic!("the fuzzed server's flags are invalid: {e}"),
        };
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(move || {
                charge_thread(Some(meter));
            })
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => panic!("cannot start a tokio runtime: {e}"),
        };
        let (default_max_tokens, max_model_len) = (
            config.default_max_tokens as u64,
            config.max_model_len as u64,
        );
        // The engine's driver task is spawned on the runtime that builds the state.
        let state = match runtime.block_on(async { AppState::new(config) }) {
            Ok(state) => state,
            Err(e) => panic!("the fuzzed server's engine settings are invalid: {e}"),
        };
        Server {
            runtime,
            router: app(state),
            default_max_tokens,
            max_model_len,
        }
    }

    /// Sends `body` and reads the whole answer, or says why it could not within `timeout`.
    fn exchange(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Answer, String> {
        let request = Request::post(endpoint.path())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_vec()))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let router = self.router.clone();
        let body_len = body.len();
        self.runtime.block_on(async move {
            let exchange = async {
                let response = router
                    .oneshot(request)
                    .await
                    .map_err(|e| format!("the router failed: {e}"))?;
                let status = response.status();
                let content_type = response
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the {status} body failed: {e}"))?
                    .to_bytes()
                    .to_vec();
                Ok(Answer {
                    status,
                    content_type,
                    body,
                })
            };
            tokio::time::timeout(timeout, exchange).await.map_err(|_| {
                format!(
                    "no complete answer within the time budget of {timeout:.1?} for a {}-byte \
                     body (hang, or work out of proportion to the body)",
                    body_len
                )
            })?
        })
    }
}

/// A response, read to the end.
struct Answer {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

/// One endpoint's server, its input count and the meter of its cost.
struct Harness {
    endpoint: Endpoint,
    /// The server's command line.
    flags: &'static [&'static str],
    /// Charged with the heap of the server's threads and of the thread sending a request.
    meter: &'static Meter,
    /// `std` mutex: held only to take or replace the server, never across a request.
    server: Mutex<Option<Arc<Server>>>,
    /// Held while one input is measured: the meter counts one request at a time.
    turn: Mutex<()>,
    inputs: AtomicU64,
}

impl Harness {
    const fn new(
        endpoint: Endpoint,
        flags: &'static [&'static str],
        meter: &'static Meter,
    ) -> Harness {
        Harness {
            endpoint,
            flags,
            meter,
            server: Mutex::new(None),
            turn: Mutex::new(()),
            inputs: AtomicU64::new(0),
        }
    }

    /// The running server, started (and warmed by one small request, so that what loads on
    /// first use is not charged to an input) when there is none.
    fn server(&self) -> Arc<Server> {
        let mut slot = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = slot.as_ref() {
            return Arc::clone(server);
        }
        let server = Arc::new(Server::start(self.flags, self.meter));
        let probe = self.endpoint.probe();
        match server.exchange(self.endpoint, probe.as_bytes(), TIMEOUT) {
            Ok(answer) if answer.status == StatusCode::OK => {}
            Ok(answer) => panic!(
                "a new server answers a small valid request to {} with {}: {}",
                self.endpoint.path(),
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ),
            Err(e) => panic!("a new server does not answer a small valid request: {e}"),
        }
        Arc::clone(slot.insert(server))
    }

    /// Waits for the previous input to this server to be measured.
    fn turn(&self) -> MutexGuard<'_, ()> {
        let started = Instant::now();
        loop {
            match self.turn.try_lock() {
                Ok(turn) => return turn,
                Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(TryLockError::WouldBlock) if started.elapsed() > TURN_WAIT => panic!(
                    "the previous input to {} has not returned for {TURN_WAIT:?}: its server \
                     is wedged",
                    self.endpoint.path()
                ),
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    /// Sends `data` and measures what it costs, one input at a time.
    fn measured_exchange(&self, server: &Server, data: &[u8]) -> (Result<Answer, String>, Spent) {
        let _turn = self.turn();
        let charged = charge_thread(Some(self.meter));
        self.meter.arm(BODY_BUDGET.ceiling_bytes(data.len()), data);
        let started = Instant::now();
        let answer = server.exchange(self.endpoint, data, BODY_BUDGET.time(data.len()));
        let spent = Spent {
            elapsed: started.elapsed(),
            peak_heap_bytes: self.meter.disarm(),
            answer_bytes: answer.as_ref().map_or(0, |answer| answer.body.len()),
        };
        charge_thread(charged);
        (answer, spent)
    }

    /// Drops the server (after a hang) so the next input starts a fresh one.
    fn discard(&self, server: Arc<Server>) {
        self.server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Ok(server) = Arc::try_unwrap(server) {
            // A wedged task would block an ordinary shutdown.
            server.runtime.shutdown_background();
        }
    }

    fn check(&self, data: &[u8]) -> Spent {
        let server = self.server();
        let endpoint = self.endpoint;
        let (answer, spent) = self.measured_exchange(&server, data);
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.discard(server);
                let heap = match BODY_BUDGET.check(data.len(), &spent) {
                    Err(over) if over.starts_with("over the heap") => over,
                    _ => format!(
                        "within the heap budget: the heap grew by {} bytes of {}",
                        spent.peak_heap_bytes,
                        BODY_BUDGET.heap_bytes(data.len(), 0)
                    ),
                };
                panic!(
                    "POST {}: {e} (it gave up after {:.1?}); {heap}",
                    endpoint.path(),
                    spent.elapsed
                );
            }
        };
        let verdict = BODY_BUDGET
            .check(data.len(), &spent)
            .and_then(|()| check_answer(endpoint, &answer))
            .and_then(|generated| server.check_limit(data, generated));
        if let Err(e) = verdict {
            let shown = &answer.body[..answer.body.len().min(SHOWN_ANSWER_BYTES)];
            panic!(
                "POST {}: {e}\nstatus {}, content-type {:?}, body ({} bytes{}):\n{}",
                endpoint.path(),
                answer.status,
                answer.content_type,
                answer.body.len(),
                if shown.len() < answer.body.len() {
                    format!(", the first {} shown", shown.len())
                } else {
                    String::new()
                },
                String::from_utf8_lossy(shown)
            );
        }
        let n = self.inputs.fetch_add(1, Ordering::Relaxed) + 1;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE || n % LIVENESS_EVERY == 0 {
            let probe = endpoint.probe();
            let answer = server.exchange(endpoint, probe.as_bytes(), TIMEOUT);
            let verdict = answer.and_then(|answer| match answer.status {
                StatusCode::OK => check_answer(endpoint, &answer)
                    .and_then(|generated| server.check_limit(probe.as_bytes(), generated)),
                status => Err(format!(
                    "got {status}: {}",
                    String::from_utf8_lossy(&answer.body)
                )),
            });
            if let Err(e) = verdict {
                self.discard(server);
                panic!(
                    "the engine stopped answering after this input or one of the {} before it: \
                     a small valid request to {} failed: {e}",
                    LIVENESS_EVERY - 1,
                    endpoint.path()
                );
            }
        }
        spent
    }
}

impl Server {
    /// A completed answer has exactly the output limit the request body asks for.
    fn check_limit(&self, body: &[u8], generated: Option<Generated>) -> Result<(), String> {
        let (Some(generated), Some(requested)) = (generated, requested_limit(body)) else {
            return Ok(());
        };
        let expected = match (requested, generated.prompt_tokens) {
            (Some(limit), _) => limit,
            (None, Some(prompt)) => self
                .default_max_tokens
                .min(self.max_model_len.saturating_sub(prompt)),
            (None, None) => return Ok(()),
        };
        let (count, all_length) = (generated.choices, generated.all_length);
        if count > 1 && requested.is_none() {
            // Each prompt of a batch has its own default limit: not told from the sum.
            return Ok(());
        }
        let limit = expected * count;
        match (all_length, generated.completion_tokens) {
            (true, n) if n == limit => Ok(()),
            (false, n) if n <= limit => Ok(()),
            (_, n) => Err(format!(
                "{n} completion tokens over {count} choice(s), but the output limit is \
                 {expected} per choice (all at the limit: {all_length})"
            )),
        }
    }
}

/// The output limit a body sets: `Some(None)` when it sets none, `None` when that cannot be
/// told (not a JSON object, or a limit that is not a count).
fn requested_limit(body: &[u8]) -> Option<Option<u64>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let field = |key: &str| object.get(key).filter(|v| !v.is_null());
    match field("max_completion_tokens").or_else(|| field("max_tokens")) {
        Some(limit) => Some(Some(limit.as_u64()?)),
        None => Some(None),
    }
}

/// What a completed answer generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Generated {
    /// `usage.prompt_tokens`, when the answer has usage.
    prompt_tokens: Option<u64>,
    /// Output tokens (all choices).
    completion_tokens: u64,
    /// Choices.
    choices: u64,
    /// Every choice ended at the output limit (`finish_reason: "length"`).
    all_length: bool,
}

/// Checks one answer against the properties of the module docs; what a completed 200
/// generated (`None` for an error or a stream ended by an error event).
fn check_answer(endpoint: Endpoint, answer: &Answer) -> Result<Option<Generated>, String> {
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

    #[test]
    fn the_output_limit_is_read_as_the_server_reads_it() {
        assert_eq!(requested_limit(br#"{"max_tokens": 5}"#), Some(Some(5)));
        assert_eq!(
            requested_limit(br#"{"max_tokens": 5, "max_completion_tokens": 7}"#),
            Some(Some(7))
        );
        assert_eq!(
            requested_limit(br#"{"max_tokens": 5, "max_completion_tokens": null}"#),
            Some(Some(5))
        );
        assert_eq!(requested_limit(br#"{"model": "m"}"#), Some(None));
        assert_eq!(requested_limit(br#"{"max_tokens": 5.5}"#), None);
        assert_eq!(requested_limit(b"[1]"), None);
    }

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
