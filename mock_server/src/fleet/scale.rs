//! `GET /fleet/scale` and `PUT /fleet/scale` on the admin listener: the elastic fleet's size
//! in the shape of a Kubernetes scale subresource (`autoscaling/v1` `Scale`).
//!
//! `PUT` takes `{"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": N}}`
//! (`apiVersion`, `kind`, `metadata` and `status` optional; when given, `apiVersion` must be
//! `autoscaling/v1` and `kind` `Scale`), N a whole number between `--min-workers` and
//! `--max-workers`. Both answer the Scale object:
//!
//! ```json
//! {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "mockserve-fleet"},
//!  "spec": {"replicas": 3},
//!  "status": {"replicas": 3, "readyReplicas": 2, "loadingReplicas": 1, "drainingReplicas": 1,
//!             "workers": [{"index": 0, "url": "http://127.0.0.1:8001", "phase": "ready"}, ...]}}
//! ```
//!
//! `status.replicas` counts loading and ready workers (what the fleet is becoming); a draining
//! worker is still listed until it is gone. A fleet started without `--elastic` answers 400
//! `fleet_not_elastic`. Every fleet worker prefills and decodes, so the fleet has one pool;
//! per-role pools would be `/fleet/scale/{role}` (`prefill`, `decode`), which answers 404
//! `role_not_found` naming the one pool there is.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::elastic::{Lifecycle, ScaleError, ScaleStatus};
use super::fault::quoted;
use crate::api::ApiError;

/// The Scale object of `status`.
pub(crate) fn scale_object(status: &ScaleStatus) -> Value {
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": "mockserve-fleet"},
        "spec": {"replicas": status.desired},
        "status": {
            "replicas": status.replicas,
            "readyReplicas": status.ready,
            "loadingReplicas": status.loading,
            "drainingReplicas": status.draining,
            "workers": status.workers,
        },
    })
}

fn not_elastic() -> ApiError {
    ApiError::invalid(
        "This fleet is not elastic: start it with --elastic --min-workers A --max-workers B to \
         scale it.",
        None,
    )
    .with_code("fleet_not_elastic")
}

/// `GET /fleet/scale`.
pub(crate) async fn get_scale(State(lifecycle): State<Option<Arc<Lifecycle>>>) -> Response {
    match lifecycle {
        Some(l) => Json(scale_object(&l.status())).into_response(),
        None => not_elastic().into_response(),
    }
}

/// The replicas a PUT body asks for, or the error naming what is wrong.
fn requested_replicas(body: &[u8]) -> Result<u64, ApiError> {
    let shape = "expected {\"apiVersion\": \"autoscaling/v1\", \"kind\": \"Scale\", \"spec\": \
                 {\"replicas\": N}}";
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        let e = e.to_string();
        ApiError::invalid(
            format!("The body is not JSON ({}): {shape}", quoted(&e)),
            None,
        )
    })?;
    let Some(object) = value.as_object() else {
        return Err(ApiError::invalid(
            format!("The body must be a JSON object: {shape}"),
            None,
        ));
    };
    for (key, want) in [("apiVersion", "autoscaling/v1"), ("kind", "Scale")] {
        match object.get(key) {
            None => {}
            Some(Value::String(s)) if s == want => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("{key} must be {want:?}, got {}", quoted(&other.to_string())),
                    Some(key),
                ))
            }
        }
    }
    let replicas = object
        .get("spec")
        .and_then(|spec| spec.as_object())
        .and_then(|spec| spec.get("replicas"));
    match replicas {
        None => Err(ApiError::invalid(
            format!("spec.replicas is missing: {shape}"),
            Some("spec.replicas"),
        )),
        Some(n) => n.as_u64().ok_or_else(|| {
            ApiError::invalid(
                format!(
                    "spec.replicas must be a whole number >= 0, got {}",
                    quoted(&n.to_string())
                ),
                Some("spec.replicas"),
            )
        }),
    }
}

/// `PUT /fleet/scale`.
pub(crate) async fn put_scale(
    State(lifecycle): State<Option<Arc<Lifecycle>>>,
    body: Bytes,
) -> Response {
    let Some(lifecycle) = lifecycle else {
        return not_elastic().into_response();
    };
    let replicas = match requested_replicas(&body) {
        Ok(n) => n,
        Err(e) => return e.into_response(),
    };
    match lifecycle.scale(replicas) {
        Ok(status) => Json(scale_object(&status)).into_response(),
        Err(e @ ScaleError::OutOfBounds { .. }) => {
            ApiError::invalid(e.to_string(), Some("spec.replicas"))
                .with_code("replicas_out_of_bounds")
                .into_response()
        }
    }
}

/// `/fleet/scale/{role}`: the fleet has one pool.
pub(crate) async fn role_scale(Path(role): Path<String>) -> Response {
    let mut e = ApiError::invalid(
        format!(
            "This fleet has no {} pool: every worker prefills and decodes, scale the whole \
             fleet with /fleet/scale.",
            quoted(&role)
        ),
        Some("role"),
    )
    .with_code("role_not_found");
    e.status = axum::http::StatusCode::NOT_FOUND;
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str) -> String {
        requested_replicas(body.as_bytes())
            .expect_err("refused")
            .message
    }

    #[test]
    fn the_body_is_a_scale_object() {
        let full = r#"{"apiVersion":"autoscaling/v1","kind":"Scale","spec":{"replicas":3}}"#;
        assert_eq!(requested_replicas(full.as_bytes()).ok(), Some(3));
        assert_eq!(
            requested_replicas(br#"{"spec":{"replicas":0}}"#).ok(),
            Some(0)
        );
        assert!(message("nope").starts_with("The body is not JSON"));
        assert!(message("[1]").starts_with("The body must be a JSON object"));
        assert_eq!(
            message(r#"{"kind":"Deployment","spec":{"replicas":1}}"#),
            "kind must be \"Scale\", got \"\\\"Deployment\\\"\""
        );
        assert!(message(r#"{"spec":{}}"#).starts_with("spec.replicas is missing"));
        assert_eq!(
            message(r#"{"spec":{"replicas":-1}}"#),
            "spec.replicas must be a whole number >= 0, got \"-1\""
        );
        assert_eq!(
            message(r#"{"spec":{"replicas":1.5}}"#),
            "spec.replicas must be a whole number >= 0, got \"1.5\""
        );
        assert_eq!(
            message(r#"{"spec":{"replicas":"2"}}"#),
            "spec.replicas must be a whole number >= 0, got \"\\\"2\\\"\""
        );
    }
}
