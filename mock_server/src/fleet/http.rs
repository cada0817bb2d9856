//! The fleet's routes beside each worker's API: a worker's own `/metrics`, and on every worker
//! and the admin listener `GET /fleet/decisions` (the judge's log as JSON lines, `?since=SEQ`
//! for the decisions from number SEQ on) and `GET /fleet/manifest`. The admin listener also
//! answers `GET /metrics` (the whole fleet's series, like `serve`'s, plus the judge's) and
//! `GET /health`, `GET /fleet/workers` (each worker's fault state),
//! `POST /fleet/workers/{i}/fault` (`{"state": "down"|"slow"|"stalled"|"503"|"ok", "factor": K}`)
//! and `POST /fleet/workers/{i}/kv-events/restart` (the worker's KV-event publisher starts over).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::fault::{gate, WorkerFaults, WorkerState};
use super::judge::{to_jsonl, Judge};
use super::metrics::WorkerMetrics;
use crate::api::{app, ApiError, AppState};
use crate::driver::EngineHandle;
use crate::kv_events::RestartSwitch;
use crate::metrics::Metrics;

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
    /// The manifest as pretty JSON.
    pub manifest: Arc<str>,
    /// Every worker's fault state.
    pub faults: Arc<WorkerFaults>,
    /// Restarts every worker's KV-event publisher on demand (None without KV events).
    pub kv_restarts: Option<RestartSwitch>,
    /// Every worker's URL, by index.
    pub worker_urls: Arc<[String]>,
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
    fleet_routes(fleet)
        .route("/metrics", get(worker_metrics).with_state(seat))
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .fallback_service(app(api))
        .layer(axum::middleware::from_fn_with_state(faults, gate))
}

/// The admin listener's router.
pub(crate) fn admin_router(fleet: FleetRoutes) -> Router {
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
        .fallback(|uri: Uri| async move { ApiError::route_not_found(uri.path()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
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
        fleet.manifest.to_string(),
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

/// `POST /fleet/workers/{i}/fault`: sets worker i's state; answers its entry of
/// `GET /fleet/workers`.
/// The worker `index` names, or the error that says there is none.
fn worker_index(fleet: &FleetRoutes, index: &str) -> Result<usize, ApiError> {
    let workers = fleet.worker_urls.len();
    match index.parse::<usize>() {
        Ok(i) if i < workers => Ok(i),
        _ => {
            let message = format!(
                "no worker {index:?}: the fleet has workers 0 to {}",
                workers.saturating_sub(1)
            );
            Err(ApiError::invalid(message, Some("index")).with_code("worker_not_found"))
        }
    }
}

/// `POST /fleet/workers/{i}/kv-events/restart`: worker i's KV-event publisher starts over, as a
/// restarted vLLM engine's does: its replay buffer empties now and its next batch is numbered 0.
async fn restart_kv_events(
    State(fleet): State<FleetRoutes>,
    Path(index): Path<String>,
) -> Response {
    let index = match worker_index(&fleet, &index) {
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

async fn set_fault(
    State(fleet): State<FleetRoutes>,
    Path(index): Path<String>,
    body: Bytes,
) -> Response {
    let index = match worker_index(&fleet, &index) {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    let body: FaultBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            let message = format!(
                "expected {{\"state\": \"ok\"|\"down\"|\"slow\"|\"stalled\"|\"503\", \
                 \"factor\": K}}: {e}"
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

/// The `since` parameter of a query string: 0 when absent.
fn since_of(query: Option<&str>) -> Result<u64, ApiError> {
    let Some(query) = query else {
        return Ok(0);
    };
    for pair in query.split('&') {
        if let Some(value) = pair.strip_prefix("since=") {
            return value.parse().map_err(|_| {
                ApiError::invalid(
                    format!("'since' must be a decision number (an integer), got {value:?}"),
                    Some("since"),
                )
            });
        }
    }
    Ok(0)
}

async fn decisions(State(fleet): State<FleetRoutes>, uri: Uri) -> Response {
    let since = match since_of(uri.query()) {
        Ok(since) => since,
        Err(e) => return e.into_response(),
    };
    let decisions = fleet.judge.decisions_since(since);
    // Up to the whole log (100,000 lines by default): written off the runtime's threads.
    let body = tokio::task::spawn_blocking(move || to_jsonl(&decisions))
        .await
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_is_read_from_the_query() {
        assert_eq!(since_of(None).ok(), Some(0));
        assert_eq!(since_of(Some("since=42")).ok(), Some(42));
        assert_eq!(since_of(Some("x=1&since=7")).ok(), Some(7));
        assert!(since_of(Some("since=-1")).is_err());
    }
}
