//! `GET /metrics`: the [`crate::metrics::Metrics`] exposition, gauges refreshed from the engine's
//! snapshot at each scrape.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;

/// The OpenMetrics text content type `prometheus-client` writes (Prometheus scrapes it).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Renders every metric.
pub(crate) async fn handler(State(state): State<AppState>) -> Result<Response, ApiError> {
    let live = state.engine.snapshot().await?;
    state.metrics.set_gauges(&live.cluster);
    let inflight = state.engine.inflight().in_use();
    state
        .metrics
        .inflight_bytes
        .set(i64::try_from(inflight).unwrap_or(i64::MAX));
    // vLLM reports LoRA figures only when LoRA is on.
    if !state.config.lora_modules.is_empty() || !state.lora.all().is_empty() {
        state.metrics.set_lora_info(
            &live.lora_running,
            &live.lora_waiting,
            state.config.max_loras,
        );
    }
    Ok((
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response())
}
