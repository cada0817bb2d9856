//! The layers the routes run under, each applied where [`super::app`] builds the router:
//! [`edge_limits`] on every route, [`require_api_key`] on the routes `--api-key` guards,
//! [`count_requests`] on the generation routes, and [`count_failures`] on the routes whose error
//! answers count in `servesim_http_request_failures_total`. Handlers then hold only their own
//! work: they return `Result<Response, ApiError>` and never check a key or count an answer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use servesim::time::SimTime;

use super::budget;
use super::error::ApiError;
use super::state::AppState;
use crate::driver::inflight::Reservation;
use crate::metrics::{EndpointLabel, Metrics};

/// Largest total size of a request's headers (names, values and separators) the handlers
/// accept; beyond it the answer is an OpenAI-shaped 431. hyper itself answers a bodiless 431
/// to a head beyond its read buffer (about 400 KiB) or with more than 100 headers.
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;

/// When the server had a request whole (headers and body), on the engine's clock: set by
/// [`edge_limits`], before the handler parses and tokenizes it, and taken as the engine request's
/// arrival.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received(pub SimTime);

/// The request's reservation in the server's in-flight budget
/// ([`crate::driver::inflight`]): its body's bytes, set by [`edge_limits`]; a handler whose work
/// outlives the response's head (a generation) takes it over and resizes it to that work.
#[derive(Clone, Debug)]
pub(crate) struct Charge(Arc<std::sync::Mutex<Option<Reservation>>>);

impl Charge {
    /// The reservation, taken out (`None` once taken). The std Mutex is held for the take only.
    pub(crate) fn take(&self) -> Option<Reservation> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Request-level limits, checked before any handler: header size (431), body size (413),
/// body-read time (408) and the server's in-flight budget (503 `server_overloaded`: the body's
/// estimated memory, reserved as it arrives, all of it at once when `Content-Length` announces
/// it). The body is read here, whole, so no handler ever waits on a slow client, and the size
/// limit holds whether or not `Content-Length` is sent. The request is stamped [`Received`]
/// once it is whole, and carries its [`Charge`].
pub(crate) async fn edge_limits(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let header_bytes: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if header_bytes > MAX_HEADER_BYTES {
        return refuse(
            &state.metrics,
            ApiError::headers_too_large(MAX_HEADER_BYTES),
        );
    }
    let (mut parts, body) = request.into_parts();
    let inflight = state.engine.inflight();
    if http_body::Body::is_end_stream(&body) {
        let Some(reservation) = inflight.try_reserve(0) else {
            return refuse(
                &state.metrics,
                ApiError::server_overloaded(0, inflight.limit()),
            );
        };
        parts
            .extensions
            .insert(Received(state.engine.clock().now()));
        let charge = Charge(Arc::new(std::sync::Mutex::new(Some(reservation))));
        parts.extensions.insert(charge);
        return next.run(Request::from_parts(parts, body)).await;
    }
    let limit = state.config.max_body_bytes;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return refuse(&state.metrics, ApiError::payload_too_large());
    }
    let declared = declared.map_or(0, |len| len as usize);
    let cost = budget::body_bytes(declared);
    let Some(mut reservation) = inflight.try_reserve(cost) else {
        return refuse(
            &state.metrics,
            ApiError::server_overloaded(cost, inflight.limit()),
        );
    };
    let timeout = state.config.http.body_read_timeout;
    let read =
        tokio::time::timeout(timeout, read_body(body, limit, declared, &mut reservation)).await;
    let bytes = match read {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return refuse(&state.metrics, e),
        Err(_) => return refuse(&state.metrics, ApiError::body_timeout(timeout)),
    };
    parts
        .extensions
        .insert(Received(state.engine.clock().now()));
    let charge = Charge(Arc::new(std::sync::Mutex::new(Some(reservation))));
    parts.extensions.insert(charge);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Reads `body` whole: at most `limit` bytes (413 beyond), `declared` of them announced, the
/// reservation grown to each size reached (503 when the budget has no room for it).
async fn read_body(
    mut body: Body,
    limit: usize,
    declared: usize,
    reservation: &mut Reservation,
) -> Result<axum::body::Bytes, ApiError> {
    let mut bytes = Vec::with_capacity(declared.min(limit));
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("Could not read the body: {e}"), None))?;
        // Trailers carry nothing a handler reads.
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = bytes.len() + data.len();
        if len > limit {
            return Err(ApiError::payload_too_large());
        }
        let cost = budget::body_bytes(len);
        if cost > reservation.bytes() && !reservation.try_resize(cost) {
            return Err(ApiError::server_overloaded(cost, reservation.limit()));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.into())
}

/// Answers 401 unless the request carries `Authorization: Bearer KEY` or `x-api-key: KEY`
/// (Anthropic's header) for the server's `--api-key` (every request passes when none is set).
pub(crate) async fn require_api_key(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match check_api_key(&state, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

fn check_api_key(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.config.api_key else {
        return Ok(());
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Anthropic's SDKs send the key as `x-api-key`.
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    if bearer == Some(key.as_str()) || x_api_key == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

/// Counts every request of a generation route in `servesim_http_requests_total{endpoint}`
/// (the state names the endpoint), whatever its answer.
pub(crate) async fn count_requests(
    State((metrics, endpoint)): State<(Arc<Metrics>, &'static str)>,
    request: Request,
    next: Next,
) -> Response {
    metrics
        .http_requests
        .get_or_create(&EndpointLabel { endpoint })
        .inc();
    next.run(request).await
}

/// Counts the route's error answers in `servesim_http_request_failures_total` (every answer
/// but a success), a 429 also in `servesim_http_requests_overloaded_total`.
pub(crate) async fn count_failures(
    State(metrics): State<Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    count_failure(&metrics, response.status());
    response
}

/// Counts an answer of `status` in `servesim_http_request_failures_total` unless it is a
/// success, and a 429 also in `servesim_http_requests_overloaded_total`. A stream that fails
/// after its 200 is counted by its writer.
fn count_failure(metrics: &Metrics, status: StatusCode) {
    if status.is_success() {
        return;
    }
    metrics.http_failures.inc();
    if status == StatusCode::TOO_MANY_REQUESTS {
        metrics.overloaded.inc();
    }
}

/// `e` as the answer, counted as a failure (and a 503 `server_overloaded` as a request over
/// the in-flight bound).
pub(crate) fn refuse(metrics: &Metrics, e: ApiError) -> Response {
    if e.is_server_overloaded() {
        metrics.over_inflight_bound.inc();
    }
    let response = e.into_response();
    count_failure(metrics, response.status());
    response
}
