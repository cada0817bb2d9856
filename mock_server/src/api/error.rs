//! [`ApiError`]: every failure at the HTTP edge as an OpenAI error body
//! `{"error":{"message","type","param","code"}}` with its status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use servesim::scheduler::RejectReason;

use crate::driver::SubmitError;

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

    /// 400 when prompt + output limit exceed the context length.
    pub fn context_length(max_model_len: usize, prompt: usize, output: usize) -> ApiError {
        ApiError::invalid(
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, you \
                 requested {} tokens ({prompt} in the messages, {output} in the completion). \
                 Please reduce the length of the messages or completion.",
                prompt + output
            ),
            Some("messages"),
        )
        .with_code("context_length_exceeded")
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
            SubmitError::Stopped => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "The server is shutting down.".into(),
                kind: "server_error",
                param: None,
                code: Some("service_unavailable"),
            },
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
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}
