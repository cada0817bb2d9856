//! Fault injection for testing clients: `--fault-rate R` fails a seeded share of generation
//! requests with one of `--fault-types`, and the request header `x-servesim-fault: TYPE` forces
//! one (`none` forces none).
//!
//! [`inject`] is a middleware in front of `/v1/chat/completions` and `/v1/completions`. Each
//! request that reaches it takes the next draw number `k` (arrival order), and whether it faults,
//! with which type and after how many tokens, is a function of `(--seed, k)` alone: the same
//! seed and the same request order give the same faults.
//!
//! | type | on the wire |
//! |------|-------------|
//! | `rate-limit` | 429 `rate_limit_error`, `retry-after: 1` |
//! | `server-error` | 500 `server_error` |
//! | `unavailable` | 503 `server_error` |
//! | `context-length` | 400 `context_length_exceeded` (`param: messages`) |
//! | `invalid-request` | 400 `invalid_request_error` |
//! | `stream-cut` | the connection drops after N content chunks (no `[DONE]`) |
//! | `stream-stall` | no bytes for `--fault-stall-ms` after N chunks, then the stream goes on |
//! | `stream-error` | after N chunks a final `data: {"error":…}` event, then `data: [DONE]` |
//!
//! N is drawn in `0..=16`; a stream that ends sooner faults just before its finish chunk. The
//! first five types answer without running the request. A cut or errored stream drops the
//! generation, which cancels the engine request and frees its KV blocks at once (it then also
//! counts as a cancellation). A non-streamed request drawn a stream type is cut (the connection
//! drops without an answer), stalled (answered late) or answered with a 500, after running.
//! Every applied fault counts in `servesim_faults_total{type}`; all but stalls also count as
//! failures (`servesim_http_request_failures_total`).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::{Args, ValueEnum};
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::api::error::ApiError;
use crate::metrics::{FaultLabel, Metrics};

/// The request header that forces a fault type (or `none`).
pub const FAULT_HEADER: &str = "x-servesim-fault";

/// Salt of the per-request fault generator (so faults do not echo answer seeds).
const FAULT_SALT: u64 = 0xFA17_5EED_0000_0001;

/// Largest number of content chunks before a stream fault.
const MAX_TOKENS_BEFORE_FAULT: usize = 16;

/// Pause before a stream cut, so the chunks before it reach the client.
const CUT_FLUSH: Duration = Duration::from_millis(20);

/// Default `--fault-stall-ms`.
pub const DEFAULT_STALL_MS: u64 = 2000;

/// A kind of injected failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum FaultType {
    /// 429 with `retry-after`.
    RateLimit,
    /// 500.
    ServerError,
    /// 503.
    Unavailable,
    /// 400 `context_length_exceeded`.
    ContextLength,
    /// 400 `invalid_request_error`.
    InvalidRequest,
    /// The connection drops mid-stream.
    StreamCut,
    /// No bytes for a while mid-stream, then the stream goes on.
    StreamStall,
    /// A final `data: {"error":…}` event mid-stream.
    StreamError,
}

impl FaultType {
    /// Every type, in flag order.
    pub const ALL: [FaultType; 8] = [
        FaultType::RateLimit,
        FaultType::ServerError,
        FaultType::Unavailable,
        FaultType::ContextLength,
        FaultType::InvalidRequest,
        FaultType::StreamCut,
        FaultType::StreamStall,
        FaultType::StreamError,
    ];

    /// The name in flags, the header and the metric label.
    pub fn name(self) -> &'static str {
        match self {
            FaultType::RateLimit => "rate-limit",
            FaultType::ServerError => "server-error",
            FaultType::Unavailable => "unavailable",
            FaultType::ContextLength => "context-length",
            FaultType::InvalidRequest => "invalid-request",
            FaultType::StreamCut => "stream-cut",
            FaultType::StreamStall => "stream-stall",
            FaultType::StreamError => "stream-error",
        }
    }

    /// The error answered at once, `None` for the stream types.
    fn immediate_error(self, model: &str, max_model_len: usize) -> Option<ApiError> {
        let error = |status, message: String, kind, param: Option<&str>, code| ApiError {
            status,
            message,
            kind,
            param: param.map(str::to_string),
            code: Some(code),
        };
        Some(match self {
            FaultType::RateLimit => error(
                StatusCode::TOO_MANY_REQUESTS,
                format!("Rate limit reached for {model}. Please retry after 1 second."),
                "rate_limit_error",
                None,
                "rate_limit_exceeded",
            ),
            FaultType::ServerError => stream_error(),
            FaultType::Unavailable => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "The server is overloaded or not ready yet.".into(),
                "server_error",
                None,
                "service_unavailable",
            ),
            FaultType::ContextLength => error(
                StatusCode::BAD_REQUEST,
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, \
                     your messages resulted in more tokens. Please reduce the length of the \
                     messages."
                ),
                "invalid_request_error",
                Some("messages"),
                "context_length_exceeded",
            ),
            FaultType::InvalidRequest => error(
                StatusCode::BAD_REQUEST,
                "The request is invalid.".into(),
                "invalid_request_error",
                None,
                "invalid_request",
            ),
            FaultType::StreamCut | FaultType::StreamStall | FaultType::StreamError => return None,
        })
    }
}

impl FromStr for FaultType {
    type Err = String;

    fn from_str(s: &str) -> Result<FaultType, String> {
        FaultType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = FaultType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown fault type '{s}' (expected none or one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// The 500 `server_error` of `server-error` faults, also the final event of `stream-error`.
fn stream_error() -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        message: "The server had an error while processing your request.".into(),
        kind: "server_error",
        param: None,
        code: Some("internal_error"),
    }
}

/// `mockserve serve` flags for fault injection.
#[derive(Args, Clone, Debug, PartialEq)]
#[command(next_help_heading = "Fault injection")]
pub struct FaultArgs {
    /// Share of generation requests (0..=1) that fail with one of --fault-types, drawn from
    /// --seed and the request's arrival number.
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    pub fault_rate: f64,

    /// The failures drawn (comma-separated): rate-limit (429), server-error (500),
    /// unavailable (503), context-length (400), invalid-request (400), stream-cut,
    /// stream-stall, stream-error. Default: all.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "TYPES")]
    pub fault_types: Vec<FaultType>,

    /// How long a stream-stall fault sends nothing, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_STALL_MS)]
    pub fault_stall_ms: u64,
}

impl Default for FaultArgs {
    fn default() -> Self {
        FaultArgs {
            fault_rate: 0.0,
            fault_types: Vec::new(),
            fault_stall_ms: DEFAULT_STALL_MS,
        }
    }
}

/// Fault-injection settings, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Share of requests that fault (0 disables drawing; the header still forces).
    pub rate: f64,
    /// Types drawn from, sorted and distinct (never empty).
    pub types: Vec<FaultType>,
    /// How long a stall lasts.
    pub stall: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            rate: 0.0,
            types: FaultType::ALL.to_vec(),
            stall: Duration::from_millis(DEFAULT_STALL_MS),
        }
    }
}

impl FaultConfig {
    /// The settings the flags describe; the rate must lie in 0..=1.
    pub fn from_args(args: &FaultArgs) -> Result<FaultConfig, String> {
        if !(0.0..=1.0).contains(&args.fault_rate) {
            return Err(format!(
                "--fault-rate must be between 0 and 1, got {}",
                args.fault_rate
            ));
        }
        let mut types = if args.fault_types.is_empty() {
            FaultType::ALL.to_vec()
        } else {
            args.fault_types.clone()
        };
        types.sort_unstable();
        types.dedup();
        Ok(FaultConfig {
            rate: args.fault_rate,
            types,
            stall: Duration::from_millis(args.fault_stall_ms),
        })
    }

    /// The fault of draw number `k` under `seed`: `(type, tokens before a stream fault)`.
    pub fn draw(&self, seed: u64, k: u64) -> Option<(FaultType, usize)> {
        if self.rate <= 0.0 {
            return None;
        }
        let mut rng = self.rng(seed, k);
        if rng.gen::<f64>() >= self.rate {
            return None;
        }
        let kind = self.types[rng.gen_range(0..self.types.len())];
        Some((kind, rng.gen_range(0..=MAX_TOKENS_BEFORE_FAULT)))
    }

    /// Tokens before a stream fault forced by the header on draw `k` (the same number a drawn
    /// fault of draw `k` would have).
    pub fn forced_after(&self, seed: u64, k: u64) -> usize {
        let mut rng = self.rng(seed, k);
        let _ = rng.gen::<f64>();
        let _ = rng.gen_range(0..self.types.len());
        rng.gen_range(0..=MAX_TOKENS_BEFORE_FAULT)
    }

    fn rng(&self, seed: u64, k: u64) -> ChaCha8Rng {
        let mixed = xxhash_rust::xxh3::xxh3_64_with_seed(&k.to_le_bytes(), seed ^ FAULT_SALT);
        ChaCha8Rng::seed_from_u64(mixed)
    }
}

/// The middleware's state: settings, the draw counter and the metrics.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    /// Validated settings.
    config: Arc<FaultConfig>,
    /// Seed of the draws (the server's `--seed`).
    seed: u64,
    /// Next draw number: requests in arrival order.
    draws: Arc<AtomicU64>,
    /// Where applied faults are counted.
    metrics: Arc<Metrics>,
    /// Served model name and context length, for the error messages.
    model: Arc<(String, usize)>,
}

impl FaultInjector {
    /// An injector for one server.
    pub fn new(
        config: FaultConfig,
        seed: u64,
        metrics: Arc<Metrics>,
        model: (String, usize),
    ) -> FaultInjector {
        FaultInjector {
            config: Arc::new(config),
            seed,
            draws: Arc::default(),
            metrics,
            model: Arc::new(model),
        }
    }

    fn count(&self, kind: FaultType) {
        self.metrics
            .faults
            .get_or_create(&FaultLabel {
                r#type: kind.name(),
            })
            .inc();
        if kind != FaultType::StreamStall {
            self.metrics.http_failures.inc();
        }
    }
}

/// The fault a request asked for with [`FAULT_HEADER`]: `Ok(None)` without the header,
/// `Ok(Some(None))` for `none`, an OpenAI-shaped 400 for an unknown type.
fn forced(request: &Request) -> Result<Option<Option<FaultType>>, ApiError> {
    let Some(value) = request.headers().get(FAULT_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "none" {
        return Ok(Some(None));
    }
    text.parse::<FaultType>()
        .map(|t| Some(Some(t)))
        .map_err(|e| {
            ApiError::invalid(
                format!("Invalid header '{FAULT_HEADER}': {e}"),
                Some(FAULT_HEADER),
            )
            .with_code("invalid_fault_type")
        })
}

/// Applies the drawn or forced fault to one generation request (see the module docs).
pub async fn inject(State(faults): State<FaultInjector>, request: Request, next: Next) -> Response {
    let k = faults.draws.fetch_add(1, Ordering::Relaxed);
    let fault = match forced(&request) {
        Err(e) => {
            faults.metrics.http_failures.inc();
            return e.into_response();
        }
        Ok(Some(None)) => None,
        Ok(Some(Some(kind))) => Some((kind, faults.config.forced_after(faults.seed, k))),
        Ok(None) => faults.config.draw(faults.seed, k),
    };
    let Some((kind, after)) = fault else {
        return next.run(request).await;
    };
    let (model, max_model_len) = &*faults.model;
    if let Some(error) = kind.immediate_error(model, *max_model_len) {
        faults.count(kind);
        return error.into_response();
    }
    let response = next.run(request).await;
    if !response.status().is_success() {
        // The request failed on its own: nothing left to fault.
        return response;
    }
    faults.count(kind);
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if is_sse {
        let (parts, body) = response.into_parts();
        let stream = StreamFault {
            kind,
            after,
            stall: faults.config.stall,
        };
        return Response::from_parts(parts, Body::from_stream(stream.apply(body)));
    }
    match kind {
        FaultType::StreamStall => {
            tokio::time::sleep(faults.config.stall).await;
            response
        }
        FaultType::StreamCut => {
            let (mut parts, _) = response.into_parts();
            // The body fails at once: the connection drops without an answer.
            parts.headers.remove(header::CONTENT_LENGTH);
            let cut = futures_util::stream::once(async { Err::<Bytes, _>(cut_error()) });
            Response::from_parts(parts, Body::from_stream(cut))
        }
        _ => stream_error().into_response(),
    }
}

fn cut_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "stream-cut fault injected",
    )
}

/// The SSE events of one body frame, each with the blank line that ends it (a trailing
/// partial event, which the server never sends, is kept as it is).
fn sse_events(mut frame: Bytes) -> Vec<Bytes> {
    let mut events = Vec::new();
    while let Some(end) = frame.windows(2).position(|w| w == b"\n\n") {
        events.push(frame.split_to(end + 2));
    }
    if !frame.is_empty() {
        events.push(frame);
    }
    events
}

/// A stream fault about to be applied to an SSE body.
struct StreamFault {
    kind: FaultType,
    /// Content chunks passed before the fault.
    after: usize,
    stall: Duration,
}

/// What one SSE frame of a generation is, for counting tokens.
#[derive(PartialEq, Eq)]
enum Frame {
    /// The opening `role` chunk: passed before any fault.
    Role,
    /// One token's text.
    Token,
    /// The finish chunk, usage chunk, an error event or `[DONE]`: faults come before it.
    End,
}

fn classify(frame: &[u8]) -> Frame {
    let data = frame.strip_prefix(b"data: ").unwrap_or(frame);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        // `[DONE]` (or anything unexpected).
        return Frame::End;
    };
    let choice = &value["choices"][0];
    if value.get("error").is_some() || choice.is_null() || !choice["finish_reason"].is_null() {
        Frame::End
    } else if choice["delta"].get("role").is_some() {
        Frame::Role
    } else {
        Frame::Token
    }
}

impl StreamFault {
    /// `body` with the fault applied before its `after`-th token frame (or its end).
    fn apply(
        self,
        body: Body,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send {
        // A body frame may carry several events; faults count them one by one.
        let inner = Some(body.into_data_stream().flat_map(|frame| {
            let events: Vec<Result<Bytes, axum::Error>> = match frame {
                Ok(frame) => sse_events(frame).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures_util::stream::iter(events)
        }));
        futures_util::stream::unfold(
            (self, inner, 0usize, false, Vec::<Bytes>::new()),
            |(fault, mut inner, mut tokens, mut fired, mut queued)| async move {
                if let Some(bytes) = queued.pop() {
                    return Some((Ok(bytes), (fault, inner, tokens, fired, queued)));
                }
                let frame = match inner.as_mut()?.next().await? {
                    Ok(frame) => frame,
                    Err(e) => {
                        return Some((
                            Err(std::io::Error::other(e)),
                            (fault, None, tokens, true, queued),
                        ))
                    }
                };
                let class = classify(&frame);
                let due = !fired
                    && match class {
                        Frame::Role => false,
                        Frame::Token => tokens == fault.after,
                        Frame::End => true,
                    };
                if class == Frame::Token {
                    tokens += 1;
                }
                if !due {
                    return Some((Ok(frame), (fault, inner, tokens, fired, queued)));
                }
                fired = true;
                match fault.kind {
                    FaultType::StreamStall => {
                        tokio::time::sleep(fault.stall).await;
                        Some((Ok(frame), (fault, inner, tokens, fired, queued)))
                    }
                    FaultType::StreamCut => {
                        // Dropping the generation cancels it and frees its KV.
                        drop(inner);
                        // A moment for the server to flush the chunks before it: a body error
                        // aborts the connection and discards what is still buffered.
                        tokio::time::sleep(CUT_FLUSH).await;
                        Some((Err(cut_error()), (fault, None, tokens, fired, queued)))
                    }
                    _ => {
                        let event = format!("data: {}\n\n", stream_error().body());
                        queued.push(Bytes::from_static(b"data: [DONE]\n\n"));
                        Some((Ok(Bytes::from(event)), (fault, None, tokens, fired, queued)))
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_clear() {
        for t in FaultType::ALL {
            assert_eq!(t.name().parse::<FaultType>(), Ok(t));
            let value = t.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(value.as_deref(), Some(t.name()));
        }
        let err = "explode".parse::<FaultType>().err().unwrap_or_default();
        assert!(
            err.contains("unknown fault type 'explode'") && err.contains("stream-cut"),
            "{err}"
        );
    }

    #[test]
    fn draws_are_seeded_and_follow_the_rate() {
        let config = FaultConfig {
            rate: 0.25,
            types: vec![FaultType::RateLimit, FaultType::StreamCut],
            ..FaultConfig::default()
        };
        let a: Vec<_> = (0..2000).map(|k| config.draw(7, k)).collect();
        let b: Vec<_> = (0..2000).map(|k| config.draw(7, k)).collect();
        let c: Vec<_> = (0..2000).map(|k| config.draw(8, k)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let faulted = a.iter().flatten().count();
        assert!((400..600).contains(&faulted), "{faulted}");
        assert!(a.iter().flatten().any(|(t, _)| *t == FaultType::RateLimit));
        assert!(a.iter().flatten().any(|(t, _)| *t == FaultType::StreamCut));
        assert!(a
            .iter()
            .flatten()
            .all(|(_, n)| *n <= MAX_TOKENS_BEFORE_FAULT));
        let off = FaultConfig::default();
        assert!((0..100).all(|k| off.draw(7, k).is_none()));
    }

    #[test]
    fn flags_are_validated() {
        let args = FaultArgs {
            fault_rate: 1.5,
            ..FaultArgs::default()
        };
        assert!(FaultConfig::from_args(&args).is_err());
        let args = FaultArgs {
            fault_rate: 0.5,
            fault_types: vec![
                FaultType::StreamCut,
                FaultType::RateLimit,
                FaultType::StreamCut,
            ],
            fault_stall_ms: 10,
        };
        let config = FaultConfig::from_args(&args).ok();
        assert_eq!(
            config.map(|c| c.types),
            Some(vec![FaultType::RateLimit, FaultType::StreamCut])
        );
        assert_eq!(
            FaultConfig::from_args(&FaultArgs::default()).map(|c| c.types.len()),
            Ok(8)
        );
    }

    #[test]
    fn frames_are_split_into_events() {
        let frame =
            Bytes::from_static(b"data: {\"a\":1}\n\ndata: {\"b\":\"x\\ny\"}\n\ndata: [DONE]\n\n");
        let events = sse_events(frame);
        assert_eq!(
            events,
            vec![
                Bytes::from_static(b"data: {\"a\":1}\n\n"),
                Bytes::from_static(b"data: {\"b\":\"x\\ny\"}\n\n"),
                Bytes::from_static(b"data: [DONE]\n\n"),
            ]
        );
        assert_eq!(
            sse_events(Bytes::from_static(b"data: 1\n\ndata: 2")),
            vec![
                Bytes::from_static(b"data: 1\n\n"),
                Bytes::from_static(b"data: 2")
            ]
        );
        assert!(sse_events(Bytes::new()).is_empty());
    }

    #[test]
    fn frames_are_classified() {
        let role = br#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
        let token =
            br#"data: {"choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}"#;
        let text = br#"data: {"choices":[{"index":0,"text":" word","finish_reason":null}]}"#;
        let finish = br#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#;
        let usage = br#"data: {"choices":[],"usage":{}}"#;
        assert!(classify(role) == Frame::Role);
        assert!(classify(token) == Frame::Token);
        assert!(classify(text) == Frame::Token);
        assert!(classify(finish) == Frame::End);
        assert!(classify(usage) == Frame::End);
        assert!(classify(b"data: [DONE]") == Frame::End);
        assert!(classify(br#"data: {"error":{}}"#) == Frame::End);
    }
}
