//! Anthropic's error shape, `{"type":"error","error":{"type","message"}}`, and the status each
//! [`ApiError`] is answered with on the Messages paths (a 503 is Anthropic's 529).

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::api::error::ApiError;

/// Anthropic's status for an overloaded server (`overloaded_error`).
const OVERLOADED: u16 = 529;

/// Anthropic's error `type` and status for an error answered with `status`.
pub(crate) fn anthropic_kind(status: StatusCode) -> (&'static str, StatusCode) {
    let overloaded = StatusCode::from_u16(OVERLOADED).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    match status.as_u16() {
        401 => ("authentication_error", status),
        403 => ("permission_error", status),
        404 => ("not_found_error", status),
        413 => ("request_too_large", status),
        429 => ("rate_limit_error", status),
        503 | OVERLOADED => ("overloaded_error", overloaded),
        s if s >= 500 => ("api_error", status),
        _ => ("invalid_request_error", status),
    }
}

/// The Anthropic error body of `e`: `{"type":"error","error":{"type","message"}}`.
pub(crate) fn error_body(e: &ApiError) -> Value {
    let (kind, _) = anthropic_kind(e.status);
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

/// Appends the SSE event `event: error` with `e`'s Anthropic body: the end of a Messages stream
/// that fails after its first byte.
pub(crate) fn push_error_event(out: &mut Vec<u8>, e: &ApiError) {
    out.extend_from_slice(b"event: error\ndata: ");
    out.extend_from_slice(error_body(e).to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropic_error_types() {
        for (status, kind, out) in [
            (400, "invalid_request_error", 400),
            (401, "authentication_error", 401),
            (404, "not_found_error", 404),
            (405, "invalid_request_error", 405),
            (413, "request_too_large", 413),
            (429, "rate_limit_error", 429),
            (500, "api_error", 500),
            (503, "overloaded_error", 529),
        ] {
            let status = StatusCode::from_u16(status).expect("status");
            let (k, s) = anthropic_kind(status);
            assert_eq!((k, s.as_u16()), (kind, out), "{status}");
        }
    }
}
