//! [`ApiError`]: every failure at the HTTP edge as an OpenAI error body
//! `{"error":{"message","type","param","code"}}` with its status.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use servesim::scheduler::RejectReason;

use crate::driver::SubmitError;

/// `code` of the 503 answered on a connection beyond `--max-connections`.
const TOO_MANY_CONNECTIONS: &str = "too_many_connections";

/// `code` of the 503 answered to a request beyond `--max-inflight-bytes`.
const SERVER_OVERLOADED: &str = "server_overloaded";

/// An OpenAI-shaped error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// Machine-readable code.
    pub code: Option<&'static str>,
}

/// Characters of a request's method shown in a 405's message at most.
pub(crate) const SHOWN_METHOD_CHARS: usize = 32;

/// `text` cut to its first `max_chars` characters, with its length said when cut.
pub(crate) fn cut(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((end, _)) => format!("{}... ({} bytes)", &text[..end], text.len()),
    }
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
        }
    }

    /// Sets the code.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// This error with `param` `messages` (an engine rejection of the prompt) naming
    /// `prompt_param` instead: `prompt` on `/v1/completions`.
    pub(crate) fn for_prompt_field(mut self, prompt_param: &str) -> ApiError {
        if self.param.as_deref() == Some("messages") {
            self.param = Some(prompt_param.to_string());
        }
        self
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect API key provided.".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// 404 for a model this server does not serve.
    pub fn model_not_found(model: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// 404 for an unknown route.
    pub fn route_not_found(path: &str) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("Unknown route {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
        }
    }

    /// 413 for a body over `--max-body-bytes`.
    pub fn payload_too_large() -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: "The request body is larger than this server accepts (--max-body-bytes)."
                .into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    }

    /// 400 when prompt + output limit exceed the context length. `param` is the request field
    /// that holds the prompt: `messages` (chat) or `prompt` (text completions).
    pub fn context_length(
        max_model_len: usize,
        prompt: usize,
        output: usize,
        param: &str,
    ) -> ApiError {
        ApiError::invalid(
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, you \
                 requested {} tokens ({prompt} in the {param}, {output} in the completion). \
                 Please reduce the length of the {param} or completion.",
                prompt + output
            ),
            Some(param),
        )
        .with_code("context_length_exceeded")
    }

    /// 405 for a route that exists but not with this method (the router adds `Allow`). An
    /// extension method is any token, so the message shows at most its first 32 characters.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        let method = cut(method, SHOWN_METHOD_CHARS);
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: format!("Method {method} is not allowed on {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
        }
    }

    /// 408 when the body does not arrive within `--body-read-timeout`.
    pub fn body_timeout(timeout: Duration) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            message: format!(
                "The request body did not arrive within {:.3} s (--body-read-timeout).",
                timeout.as_secs_f64()
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_timeout"),
        }
    }

    /// 431 when the request headers add up to more than `max_bytes`.
    pub fn headers_too_large(max_bytes: usize) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            message: format!(
                "The request headers are larger than this server accepts ({max_bytes} bytes)."
            ),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_header_fields_too_large"),
        }
    }

    /// 503 for a connection beyond `--max-connections`.
    pub fn too_many_connections(max_connections: usize) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "The server has {max_connections} open connections, its limit \
                 (--max-connections); retry later."
            ),
            kind: "server_error",
            param: None,
            code: Some(TOO_MANY_CONNECTIONS),
        }
    }

    /// 503 for a request whose estimated memory (`bytes`) does not fit beside the requests in
    /// flight, under `--max-inflight-bytes` (`limit`). It says `Retry-After: 1` and
    /// `Connection: close` (its body may be left unread).
    pub fn server_overloaded(bytes: u64, limit: u64) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "The server is overloaded: this request needs about {bytes} bytes and the \
                 requests in flight hold most of the {limit} bytes this server allows \
                 (--max-inflight-bytes); retry later."
            ),
            kind: "server_error",
            param: None,
            code: Some(SERVER_OVERLOADED),
        }
    }

    /// Whether this is [`ApiError::server_overloaded`].
    pub(crate) fn is_server_overloaded(&self) -> bool {
        self.code == Some(SERVER_OVERLOADED)
    }

    /// 503 while the server shuts down (also the final stream event of a request cut off at
    /// the shutdown deadline).
    pub fn shutting_down() -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "The server is shutting down.".into(),
            kind: "server_error",
            param: None,
            code: Some("service_unavailable"),
        }
    }

    /// Whether the server closes the connection after this response: the request body may be
    /// left unread (408, 413) or the connection is over the limit. The response then says
    /// `Connection: close`, so a pooling client does not reuse it.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self.status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
        ) || matches!(self.code, Some(TOO_MANY_CONNECTIONS | SERVER_OVERLOADED))
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            SubmitError::Overloaded { .. } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: e.to_string(),
                kind: "rate_limit_error",
                param: None,
                code: Some("rate_limit_exceeded"),
            },
            SubmitError::Rejected(reason) => reason.into(),
            SubmitError::NoSuchWorker { .. } => {
                ApiError::invalid(e.to_string(), Some("nvext.backend_instance_id"))
                    .with_code("invalid_worker_id")
            }
            SubmitError::Stopped => ApiError::shutting_down(),
        }
    }
}

impl From<RejectReason> for ApiError {
    fn from(reason: RejectReason) -> ApiError {
        // The reason reads inside other sentences (lower case); as a message it is one.
        let text = reason.to_string();
        let mut chars = text.chars();
        let message = match chars.next() {
            Some(first) => format!("{}{}.", first.to_uppercase(), chars.as_str()),
            None => String::new(),
        };
        let server_error = |code| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.clone(),
            kind: "server_error",
            param: None,
            code: Some(code),
        };
        match reason {
            RejectReason::EmptyPrompt => {
                ApiError::invalid(message, Some("prompt")).with_code("empty_prompt")
            }
            RejectReason::NoOutputTokens => {
                ApiError::invalid(message, Some("max_tokens")).with_code("invalid_value")
            }
            RejectReason::ExceedsMaxModelLen { .. } => {
                ApiError::invalid(message, Some("messages")).with_code("context_length_exceeded")
            }
            RejectReason::ExceedsBatchBudget { .. } => {
                ApiError::invalid(message, Some("messages")).with_code("batch_budget_exceeded")
            }
            RejectReason::ExceedsKvCapacity { .. } => {
                ApiError::invalid(message, Some("messages")).with_code("kv_capacity_exceeded")
            }
            // The server built a prompt the engine cannot read, or the scheduler failed it:
            // neither is the client's fault.
            RejectReason::MalformedPrompt { .. } => server_error("malformed_prompt"),
            RejectReason::Unschedulable => server_error("unschedulable"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || matches!(self.code, Some(TOO_MANY_CONNECTIONS | SERVER_OVERLOADED))
        {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.closes_connection() {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // For layers that answer in another API's shape (`super::messages`).
        response.extensions_mut().insert(self);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_length_names_the_prompt_field() {
        for param in ["messages", "prompt"] {
            let e = ApiError::context_length(64, 100, 4, param);
            assert_eq!(e.param.as_deref(), Some(param));
            assert_eq!(e.code, Some("context_length_exceeded"));
            assert!(
                e.message.contains(&format!("100 in the {param}")),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn a_405_shows_a_short_prefix_of_a_long_extension_method() {
        let method = "DELE".repeat(300);
        let e = ApiError::method_not_allowed(&method, "/fleet/decisions");
        assert_eq!(
            e.message,
            format!(
                "Method {}... (1200 bytes) is not allowed on /fleet/decisions",
                &method[..SHOWN_METHOD_CHARS]
            )
        );
        let short = ApiError::method_not_allowed("PATCH", "/v1/models");
        assert_eq!(short.message, "Method PATCH is not allowed on /v1/models");
    }

    #[test]
    fn responses_that_close_the_connection_say_so() {
        let close = |e: ApiError| {
            let response = e.into_response();
            response
                .headers()
                .get(header::CONNECTION)
                .map(|v| v.as_bytes().to_vec())
        };
        for e in [
            ApiError::payload_too_large(),
            ApiError::body_timeout(Duration::from_secs(1)),
            ApiError::too_many_connections(10),
            ApiError::server_overloaded(10, 5),
        ] {
            assert_eq!(close(e), Some(b"close".to_vec()));
        }
        for e in [
            ApiError::shutting_down(),
            ApiError::method_not_allowed("GET", "/v1/completions"),
            ApiError::headers_too_large(1),
            ApiError::route_not_found("/x"),
        ] {
            assert_eq!(close(e), None);
        }
    }
}
