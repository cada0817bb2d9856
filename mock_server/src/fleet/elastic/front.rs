//! The elastic fleet's front endpoint (`--front-port`): one URL whose requests go to the ready
//! workers, round-robin, so that a client with one URL (loadgen) follows the fleet's size as a
//! router following the discovery file would. Each request is handed in process to the chosen
//! worker's own API, behind its lifecycle gate (counted in its requests in flight, refused
//! while it loads or once its drain refuses), so that nothing differs from a request sent to
//! the worker's own listener. A loading or draining worker gets no new request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt;

use super::Lifecycle;
use crate::api::ApiError;

/// What the front endpoint routes over.
#[derive(Clone, Debug)]
pub(crate) struct Front {
    /// The fleet's slots (which are ready).
    pub lifecycle: Arc<Lifecycle>,
    /// Every slot's API, gate included, by index.
    pub workers: Arc<Vec<Router>>,
    /// The round-robin position.
    pub next: Arc<AtomicUsize>,
}

/// The front endpoint's router: every path goes to the next ready worker.
pub(crate) fn router(front: Front) -> Router {
    Router::new().fallback(forward).with_state(front)
}

async fn forward(State(front): State<Front>, request: Request) -> Response {
    let ready = front.lifecycle.ready_slots();
    if ready.is_empty() {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "No worker of the fleet is ready (every one is loading or draining).".into(),
            kind: "server_error",
            param: None,
            code: Some("no_ready_worker"),
        }
        .into_response();
    }
    let k = front.next.fetch_add(1, Ordering::Relaxed) % ready.len();
    let Some(worker) = front.workers.get(ready[k]).cloned() else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    match worker.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}
