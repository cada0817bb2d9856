//! The fleet's routes beside each worker's API: a worker's own `/metrics`, and on every worker
//! and the admin listener `GET /fleet/decisions` (the judge's log as JSON lines, a page at a
//! time: `?since=SEQ` for the decisions from number SEQ on, `?limit=N` for at most N of them,
//! at most [`MAX_DECISIONS_PAGE`]), `GET /fleet/manifest` and `GET /fleet/workers`. The admin
//! listener also answers `GET /metrics` (the whole fleet's series, like `serve`'s, plus the
//! judge's) and `GET /health`, `POST /fleet/workers/{i}/fault`
//! (`{"state": "down"|"slow"|"stalled"|"503"|"ok", "factor": K}`) and
//! `POST /fleet/workers/{i}/kv-events/restart` (the worker's KV-event publisher starts over),
//! and `GET`/`PUT /fleet/scale` (an elastic fleet's size, `super::scale`).
//!
//! With `--api-key`, every route of the admin listener and the `/fleet/*` routes of every
//! worker answer 401 (OpenAI-shaped) without `Authorization: Bearer KEY`. The admin listener
//! reads a body of at most [`MAX_ADMIN_BODY_BYTES`] within `--body-read-timeout` (413 and 408,
//! OpenAI-shaped). Worker indexes and query numbers are canonical decimals only (`1`, not `+1`
//! or `01`), and no error message quotes more than a short prefix of what the client sent.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::fault::{canonical_index, canonical_number, gate, quoted, WorkerFaults, WorkerState};
use super::judge::{to_jsonl, Judge, MAX_DECISIONS_PAGE};
use super::metrics::WorkerMetrics;
use crate::api::error::cut;
use crate::api::{app, ApiError, AppState};
use crate::driver::EngineHandle;
use crate::kv_events::RestartSwitch;
use crate::metrics::Metrics;

/// The largest body the admin listener reads (a fault body is a few dozen bytes).
pub(crate) const MAX_ADMIN_BODY_BYTES: usize = 4096;

/// The header of a `GET /fleet/decisions` answer that gives the `since` of the next page.
pub(crate) const NEXT_SINCE_HEADER: &str = "x-fleet-next-since";

/// Characters of a serde or path error message an answer shows at most.
const SHOWN_MESSAGE_CHARS: usize = 240;

/// The OpenMetrics text content type (what `prometheus-client` writes).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What the fleet's own routes read; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct FleetRoutes {
    /// The shared engine (snapshots for the gauges, its health).
    pub engine: EngineHandle,
    /// The engine's metrics, every worker's series (with the judge's registered beside them).
    pub metrics: Arc<Metrics>,
    /// The routing judge.
    pub judge: Arc<Judge>,
    /// The manifest as pretty JSON (an elastic fleet rewrites it on every change).
    pub manifest: Arc<std::sync::Mutex<Arc<str>>>,
    /// The elastic fleet's slots (`PUT /fleet/scale`), None for a fixed fleet.
    pub elastic: Option<Arc<super::elastic::Lifecycle>>,
    /// Every worker's fault state.
    pub faults: Arc<WorkerFaults>,
    /// Restarts every worker's KV-event publisher on demand (None without KV events).
    pub kv_restarts: Option<RestartSwitch>,
    /// Every worker's URL, by index.
    pub worker_urls: Arc<[String]>,
    /// `--api-key`: the admin routes answer 401 without it.
    pub api_key: Option<Arc<str>>,
    /// `--body-read-timeout`: an admin body must be in this long after its headers.
    pub body_read_timeout: Duration,
}

/// One worker's endpoint: the fleet's routes, the worker's `/metrics`, and everything else the
/// worker's own API (`api`, pinned to the worker) answers, behind the worker's fault
/// [`gate`] (`faults`: every worker's states and this worker's index).
pub(crate) fn worker_router(
    api: AppState,
    metrics: Arc<WorkerMetrics>,
    fleet: FleetRoutes,
    faults: (Arc<WorkerFaults>, usize),
) -> Router {
    let seat = (fleet.engine.clone(), metrics);
    let key = fleet.api_key.clone();
    fleet_routes(fleet)
        .route_layer(from_fn_with_state(key, require_key))
        .route("/metrics", get(worker_metrics).with_state(seat))
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .fallback_service(app(api))
        .layer(axum::middleware::from_fn_with_state(faults, gate))
        // The gate's errors on the Messages paths in Anthropic's shape, as the worker's own.
        .layer(axum::middleware::from_fn(
            crate::api::messages::anthropic_errors,
        ))
}

/// The admin listener's router: every route behind the key (when `--api-key` is set) and the
/// admin body limits.
pub(crate) fn admin_router(fleet: FleetRoutes) -> Router {
    let key = fleet.api_key.clone();
    let body_read_timeout = fleet.body_read_timeout;
    fleet_routes(fleet.clone())
        .route("/metrics", get(fleet_metrics).with_state(fleet.clone()))
        .route("/health", get(health).with_state(fleet.clone()))
        .route(
            "/fleet/workers/{index}/fault",
            post(set_fault).with_state(fleet.clone()),
        )
        .route(
            "/fleet/workers/{index}/kv-events/restart",
            post(restart_kv_events).with_state(fleet.clone()),
        )
        .route(
            "/fleet/scale",
            get(super::scale::get_scale)
                .put(super::scale::put_scale)
                .with_state(fleet.elastic.clone()),
        )
        .route(
            "/fleet/scale/{role}",
            get(super::scale::role_scale).put(super::scale::role_scale),
        )
        .fallback(|uri: Uri| async move { ApiError::route_not_found(&shown_path(&uri)) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), &shown_path(&uri))
        })
        .layer(from_fn_with_state(body_read_timeout, admin_body))
        .layer(from_fn_with_state(key, require_key))
}

/// `uri`'s path for a message, cut to a short prefix.
fn shown_path(uri: &Uri) -> String {
    cut(uri.path(), SHOWN_MESSAGE_CHARS)
}

/// Answers 401 unless the request carries `Authorization: Bearer KEY` for `--api-key` (every
/// request passes when none is set), as the worker API's `/v1` routes do.
async fn require_key(
    State(key): State<Option<Arc<str>>>,
    request: Request,
    next: Next,
) -> Response {
    match &key {
        Some(key) if !has_key(request.headers(), key) => ApiError::unauthorized().into_response(),
        _ => next.run(request).await,
    }
}

fn has_key(headers: &HeaderMap, key: &str) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        == Some(key)
}

/// The 413 of a body over [`MAX_ADMIN_BODY_BYTES`].
fn admin_body_too_large() -> ApiError {
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!(
            "The request body is larger than the fleet's admin routes accept \
             ({MAX_ADMIN_BODY_BYTES} bytes)."
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("request_too_large"),
    }
}

/// Reads an admin request's body whole, at most [`MAX_ADMIN_BODY_BYTES`] within
/// `body_read_timeout` (413 and 408 otherwise, OpenAI-shaped), so no handler waits on a slow
/// client or reads a large body.
async fn admin_body(
    State(body_read_timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_ADMIN_BODY_BYTES as u64) {
        return admin_body_too_large().into_response();
    }
    let limited = http_body_util::Limited::new(body, MAX_ADMIN_BODY_BYTES);
    let read =
        tokio::time::timeout(body_read_timeout, http_body_util::BodyExt::collect(limited)).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return admin_body_too_large().into_response()
        }
        Ok(Err(e)) => {
            let message = format!("Could not read the body: {}", cut(&e.to_string(), 80));
            return ApiError::invalid(message, None).into_response();
        }
        Err(_) => return ApiError::body_timeout(body_read_timeout).into_response(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// `/fleet/decisions` and `/fleet/manifest`.
fn fleet_routes(fleet: FleetRoutes) -> Router {
    Router::new()
        .route("/fleet/decisions", get(decisions))
        .route("/fleet/manifest", get(manifest))
        .route("/fleet/workers", get(workers))
        .with_state(fleet)
}

async fn worker_metrics(
    State((engine, metrics)): State<(EngineHandle, Arc<WorkerMetrics>)>,
) -> Response {
    let live = match engine.snapshot().await {
        Ok(live) => live,
        Err(e) => return ApiError::from(e).into_response(),
    };
    metrics.engine.set_gauges(&live.cluster);
    ([(header::CONTENT_TYPE, OPENMETRICS)], metrics.encode()).into_response()
}

async fn fleet_metrics(State(fleet): State<FleetRoutes>) -> Response {
    let live = match fleet.engine.snapshot().await {
        Ok(live) => live,
        Err(e) => return ApiError::from(e).into_response(),
    };
    fleet.metrics.set_gauges(&live.cluster);
    (
        [(header::CONTENT_TYPE, OPENMETRICS)],
        fleet.metrics.encode(),
    )
        .into_response()
}

async fn health(State(fleet): State<FleetRoutes>) -> Response {
    if fleet.engine.is_alive() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        let body = Json(json!({"status": "unavailable", "reason": "the engine task has stopped"}));
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

async fn manifest(State(fleet): State<FleetRoutes>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        // Held only to clone the text.
        fleet
            .manifest
            .lock()
            .map(|m| m.to_string())
            .unwrap_or_else(|e| e.into_inner().to_string()),
    )
        .into_response()
}

/// `GET /fleet/workers`: every worker's index, URL and fault state.
async fn workers(State(fleet): State<FleetRoutes>) -> Response {
    let workers: Vec<serde_json::Value> = fleet
        .worker_urls
        .iter()
        .enumerate()
        .map(|(i, url)| fleet.faults.state(i).to_json(i, url))
        .collect();
    Json(json!({ "workers": workers })).into_response()
}

/// The body of `POST /fleet/workers/{i}/fault`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultBody {
    /// `ok`, `down`, `slow`, `stalled` or `503`.
    state: String,
    /// The `slow` factor.
    #[serde(default)]
    factor: Option<f64>,
}

/// The worker `index` names (a canonical decimal below the fleet's size), or the error that
/// says there is none.
fn worker_index(fleet: &FleetRoutes, index: &str) -> Result<usize, ApiError> {
    let workers = fleet.worker_urls.len();
    match canonical_index(index) {
        Some(i) if i < workers => Ok(i),
        _ => {
            let message = format!(
                "no worker {}: the fleet has workers 0 to {} (an index is written in decimal \
                 digits, without sign or leading zero)",
                quoted(index),
                workers.saturating_sub(1)
            );
            Err(ApiError::invalid(message, Some("index")).with_code("worker_not_found"))
        }
    }
}

/// The worker index of a `/fleet/workers/{i}/...` path. A path axum cannot decode (`%F1`: not
/// UTF-8 once percent-decoded) is a 400 like any other bad index, in the OpenAI shape.
fn index_in_path(
    fleet: &FleetRoutes,
    path: Result<Path<String>, PathRejection>,
) -> Result<usize, ApiError> {
    match path {
        Ok(Path(index)) => worker_index(fleet, &index),
        Err(e) => {
            let message = format!(
                "the worker index is not a decimal number: {}",
                cut(&e.body_text(), SHOWN_MESSAGE_CHARS)
            );
            Err(ApiError::invalid(message, Some("index")).with_code("worker_not_found"))
        }
    }
}

/// `POST /fleet/workers/{i}/kv-events/restart`: worker i's KV-event publisher starts over, as a
/// restarted vLLM engine's does: its replay buffer empties now and its next batch is numbered 0.
async fn restart_kv_events(
    State(fleet): State<FleetRoutes>,
    index: Result<Path<String>, PathRejection>,
) -> Response {
    let index = match index_in_path(&fleet, index) {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let Some(restarts) = &fleet.kv_restarts else {
        let message = "the fleet publishes no KV events (start it with --kv-events-endpoint)";
        return ApiError::invalid(message.to_string(), None)
            .with_code("kv_events_off")
            .into_response();
    };
    let restarted = restarts.restart(index);
    Json(json!({"worker": index, "kv_events_restarted": restarted})).into_response()
}

/// `POST /fleet/workers/{i}/fault`: sets worker i's state; answers its entry of
/// `GET /fleet/workers`.
async fn set_fault(
    State(fleet): State<FleetRoutes>,
    index: Result<Path<String>, PathRejection>,
    body: Bytes,
) -> Response {
    let index = match index_in_path(&fleet, index) {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let body: FaultBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            let message = format!(
                "expected {{\"state\": \"ok\"|\"down\"|\"slow\"|\"stalled\"|\"503\", \
                 \"factor\": K}}: {}",
                cut(&e.to_string(), SHOWN_MESSAGE_CHARS)
            );
            return ApiError::invalid(message, None).into_response();
        }
    };
    let state = match WorkerState::parse(&body.state, body.factor) {
        Ok(state) => state,
        Err(message) => return ApiError::invalid(message, Some("state")).into_response(),
    };
    fleet.faults.set(index, state);
    Json(state.to_json(index, &fleet.worker_urls[index])).into_response()
}

/// A page of `GET /fleet/decisions`: from decision `since` on, at most `limit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PageQuery {
    since: u64,
    limit: usize,
}

/// The query of `GET /fleet/decisions`: `since` (0 when absent) and `limit` (1 to
/// [`MAX_DECISIONS_PAGE`], the most when absent), each at most once, canonical decimals;
/// nothing else.
fn page_query(query: Option<&str>) -> Result<PageQuery, ApiError> {
    let mut since = None;
    let mut limit = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "since" => &mut since,
            "limit" => &mut limit,
            _ => {
                let message = format!(
                    "unknown parameter {} (/fleet/decisions takes since and limit)",
                    quoted(name)
                );
                return Err(ApiError::invalid(message, None));
            }
        };
        let param = if name == "since" { "since" } else { "limit" };
        if slot.is_some() {
            let message = format!("'{param}' is given twice");
            return Err(ApiError::invalid(message, Some(param)));
        }
        let Some(number) = canonical_number(value) else {
            let message = format!(
                "'{param}' must be a number in decimal digits (no sign, no leading zero), got {}",
                quoted(value)
            );
            return Err(ApiError::invalid(message, Some(param)));
        };
        *slot = Some(number);
    }
    let limit = match limit {
        None => MAX_DECISIONS_PAGE,
        Some(n) => match usize::try_from(n) {
            Ok(n) if (1..=MAX_DECISIONS_PAGE).contains(&n) => n,
            _ => {
                let message =
                    format!("'limit' must be between 1 and {MAX_DECISIONS_PAGE}, got {n}");
                return Err(ApiError::invalid(message, Some("limit")));
            }
        },
    };
    Ok(PageQuery {
        since: since.unwrap_or(0),
        limit,
    })
}

/// `GET /fleet/decisions`: a page of the judge's log as JSON lines, the next page's `since`
/// in [`NEXT_SINCE_HEADER`].
async fn decisions(State(fleet): State<FleetRoutes>, uri: Uri) -> Response {
    let query = match page_query(uri.query()) {
        Ok(query) => query,
        Err(e) => return e.into_response(),
    };
    let (page, next) = fleet.judge.page(query.since, query.limit);
    // Up to a full page (about 3 MB): written off the runtime's threads.
    let body = tokio::task::spawn_blocking(move || to_jsonl(&page))
        .await
        .unwrap_or_default();
    let mut response = ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    response
        .headers_mut()
        .insert(NEXT_SINCE_HEADER, HeaderValue::from(next));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(query: &str) -> Result<(u64, usize), String> {
        page_query(Some(query))
            .map(|q| (q.since, q.limit))
            .map_err(|e| e.message)
    }

    #[test]
    fn the_page_is_read_from_the_query() {
        let most = MAX_DECISIONS_PAGE;
        assert_eq!(page_query(None).map(|q| (q.since, q.limit)), Ok((0, most)));
        assert_eq!(page("since=42"), Ok((42, most)));
        assert_eq!(page("limit=7&since=3"), Ok((3, 7)));
        assert_eq!(page(&format!("limit={most}")), Ok((0, most)));
        assert_eq!(page("since=18446744073709551615"), Ok((u64::MAX, most)));
    }

    #[test]
    fn bad_pages_are_refused_with_a_short_message() {
        for (query, wanted) in [
            ("since=-1", "decimal digits"),
            ("since=+1", "decimal digits"),
            ("since=01", "decimal digits"),
            ("since=", "decimal digits"),
            ("limit=0", "between 1 and 10000"),
            ("limit=10001", "between 1 and 10000, got 10001"),
            ("since=1&since=2", "given twice"),
            ("after=1", "unknown parameter"),
        ] {
            let error = page(query).err().unwrap_or_default();
            assert!(error.contains(wanted), "{query}: {error}");
        }
        let zeros = format!("since={}1", "0".repeat(5000));
        let error = page(&zeros).err().unwrap_or_default();
        assert!(
            error.len() < 200 && error.contains("(5001 bytes)"),
            "{error}"
        );
        let long = format!("{}=1", "k".repeat(2_000_000));
        let error = page(&long).err().unwrap_or_default();
        assert!(error.len() < 200, "{} bytes", error.len());
    }

    #[test]
    fn long_texts_are_cut() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("abcdef", 3), "abc... (6 bytes)");
    }
}
