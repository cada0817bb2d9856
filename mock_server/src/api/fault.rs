//! Fault injection over HTTP: `inject`, the middleware in front of the generation routes,
//! takes each request's draw (or the fault its [`FAULT_HEADER`] forces) and answers an error
//! at once, or lets the request run and then cuts, stalls or errors its stream (see
//! [`crate::fault`] for what each type looks like on the wire).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::api::error::ApiError;
use crate::fault::{FaultConfig, FaultType};
use crate::metrics::{FaultLabel, Metrics};

/// The request header that forces a fault type (or `none`).
pub const FAULT_HEADER: &str = "x-servesim-fault";

/// Pause before a stream cut, so the chunks before it reach the client.
const CUT_FLUSH: Duration = Duration::from_millis(20);

/// The error `kind` answers at once, `None` for the stream types. `prompt_param` is the
/// request field that holds the prompt: `messages` (chat) or `prompt` (text completions).
fn immediate_error(
    kind: FaultType,
    model: &str,
    max_model_len: usize,
    prompt_param: &str,
) -> Option<ApiError> {
    let error = |status, message: String, kind, param: Option<&str>, code| ApiError {
        status,
        message,
        kind,
        param: param.map(str::to_string),
        code: Some(code),
    };
    Some(match kind {
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
                 your {prompt_param} resulted in more tokens. Please reduce the length of the \
                 {prompt_param}."
            ),
            "invalid_request_error",
            Some(prompt_param),
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

/// The middleware's state: settings, the draw counter and the metrics.
#[derive(Clone, Debug)]
pub(crate) struct FaultInjector {
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
    pub(crate) fn new(
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
pub(crate) async fn inject(
    State(faults): State<FaultInjector>,
    request: Request,
    next: Next,
) -> Response {
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
    let prompt_param = if request.uri().path() == "/v1/completions" {
        "prompt"
    } else {
        "messages"
    };
    if let Some(error) = immediate_error(kind, model, *max_model_len, prompt_param) {
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
            passed: 0,
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
    /// Events passed so far (the next event's `sequence_number` in a Responses stream).
    passed: u64,
}

/// What one SSE frame of a generation is, for counting tokens.
#[derive(PartialEq, Eq)]
enum Frame {
    /// The opening `role` chunk (or a Messages stream's `message_start`, `content_block_start`
    /// and `ping`): passed before any fault.
    Role,
    /// One token's text.
    Token,
    /// The finish chunk, usage chunk, an error event or `[DONE]`: faults come before it.
    End,
}

fn classify(frame: &[u8]) -> Frame {
    // Named events: the Responses API's (`response.*`) and Anthropic's (`/v1/messages`: the
    // message and block openings and `ping` pass, each delta is a token, the rest ends the
    // message).
    if let Some(named) = frame.strip_prefix(b"event: ") {
        let name = named.split(|&b| b == b'\n').next().unwrap_or_default();
        return match name {
            b"message_start" | b"content_block_start" | b"ping" => Frame::Role,
            b"content_block_delta" => Frame::Token,
            _ if name.starts_with(b"response.") => classify_named(name),
            _ => Frame::End,
        };
    }
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

/// A named event (`event: NAME`): in the Responses API's streams, text deltas are tokens, the
/// final events (`response.completed`, `response.incomplete`, `response.failed`, `error`) the
/// end, and the events that open or close an output item pass as the role chunk does.
fn classify_named(name: &[u8]) -> Frame {
    match name {
        b"response.completed" | b"response.incomplete" | b"response.failed" | b"error" => {
            Frame::End
        }
        name if name.starts_with(b"response.") && name.ends_with(b".delta") => Frame::Token,
        name if name.starts_with(b"response.") => Frame::Role,
        _ => Frame::End,
    }
}

/// The `stream-error` event of a stream of named events: OpenAI's `error` event, numbered
/// after the `passed` events before it.
fn named_stream_error(passed: u64) -> String {
    let error = stream_error();
    let data = serde_json::json!({
        "type": "error", "code": error.code, "message": error.message, "param": null,
        "sequence_number": passed,
    });
    format!("event: error\ndata: {data}\n\n")
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
            |(mut fault, mut inner, mut tokens, mut fired, mut queued)| async move {
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
                let responses = frame.starts_with(b"event: response.");
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
                    fault.passed += 1;
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
                    _ if responses => {
                        let event = named_stream_error(fault.passed);
                        Some((Ok(Bytes::from(event)), (fault, None, tokens, fired, queued)))
                    }
                    _ if frame.starts_with(b"event: ") => {
                        let mut event = Vec::new();
                        crate::api::messages::error::push_error_event(&mut event, &stream_error());
                        Some((Ok(Bytes::from(event)), (fault, None, tokens, fired, queued)))
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
        for (event, frame) in [
            ("response.created", Frame::Role),
            ("response.output_item.added", Frame::Role),
            ("response.output_text.delta", Frame::Token),
            ("response.reasoning_text.delta", Frame::Token),
            ("response.function_call_arguments.delta", Frame::Token),
            ("response.output_item.done", Frame::Role),
            ("response.completed", Frame::End),
            ("response.incomplete", Frame::End),
            ("error", Frame::End),
        ] {
            let named = format!("event: {event}\ndata: {{}}\n\n");
            assert!(classify(named.as_bytes()) == frame, "{event}");
        }
        assert!(classify(b"event: message_start\ndata: {}") == Frame::Role);
        assert!(classify(b"event: ping\ndata: {}") == Frame::Role);
        assert!(classify(b"event: content_block_delta\ndata: {}") == Frame::Token);
        assert!(classify(b"event: content_block_stop\ndata: {}") == Frame::End);
        assert!(classify(b"event: message_delta\ndata: {}") == Frame::End);
    }
}
