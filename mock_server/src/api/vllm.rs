//! The parts of vLLM's HTTP surface that routers, gateways and benchmark tools call besides
//! generation: `POST /tokenize`, `POST /detokenize`, `GET /version`, `GET|POST /ping` and
//! `GET /v1/models/{model}`, answered with vLLM's bodies.
//!
//! - `/tokenize` takes `{"prompt": "..."}` (`add_special_tokens` is accepted) or
//!   `{"messages": [...], "add_generation_prompt": true}` (rendered with the chat template the
//!   generation endpoints use, so the ids are exactly the prompt the engine caches) and answers
//!   `{"count", "max_model_len", "tokens", "token_strs"}` (`token_strs` is null unless
//!   `return_token_strs` is true). A `model` other than a served one is a 404.
//! - `/detokenize` takes `{"tokens": [...]}` and answers `{"prompt": "..."}`.
//! - `/ping` answers as `/health` does.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::protocol::{ApiJson, ChatRequest};
use super::{check_auth, fail, ApiError, AppState};

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson, ApiError>,
) -> Response {
    let result = (|| {
        check_auth(&state, &headers)?;
        let body = body?.0;
        check_model(&state, &body)?;
        let tokens = if body.contains_key("messages") {
            let mut chat = body.clone();
            chat.entry("model")
                .or_insert_with(|| Value::String(state.config.model_name.clone()));
            let request = ChatRequest::parse(&chat)?;
            let add_generation_prompt = flag(&body, "add_generation_prompt", true)?;
            state
                .config
                .codec
                .render_chat(&request.messages, add_generation_prompt)
        } else {
            match body.get("prompt") {
                Some(Value::String(text)) => state.config.codec.encode(text),
                _ => {
                    return Err(ApiError::invalid(
                        "Expected either 'prompt' (a string) or 'messages'",
                        Some("prompt"),
                    ))
                }
            }
        };
        let token_strs = if flag(&body, "return_token_strs", false)? {
            let strs: Vec<String> = tokens
                .iter()
                .map(|&t| state.config.codec.decode(&[t]))
                .collect();
            json!(strs)
        } else {
            Value::Null
        };
        Ok(Json(json!({
            "count": tokens.len(),
            "max_model_len": state.config.max_model_len,
            "tokens": tokens,
            "token_strs": token_strs,
        }))
        .into_response())
    })();
    result.unwrap_or_else(|e| fail(&state, e))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<ApiJson, ApiError>,
) -> Response {
    let result = (|| {
        check_auth(&state, &headers)?;
        let body = body?.0;
        check_model(&state, &body)?;
        let bad = || {
            ApiError::invalid(
                "Invalid 'tokens': expected an array of token ids",
                Some("tokens"),
            )
        };
        let ids = body
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(bad)?;
        Ok(Json(json!({"prompt": state.config.codec.decode(&ids)})).into_response())
    })();
    result.unwrap_or_else(|e| fail(&state, e))
}

/// `GET /version`: the server's version, as vLLM reports its own.
pub async fn version() -> Response {
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `GET|POST /ping`: as `/health` (vLLM's SageMaker-style liveness probe): 200 with an empty
/// body while the engine runs, 503 otherwise.
pub async fn ping(State(state): State<AppState>) -> Response {
    if state.engine.is_alive() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

/// The model card of a served model.
pub fn model_card(state: &AppState, id: &str, root: &str, parent: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": state.started,
        "owned_by": "mockserve",
        "root": root,
        "parent": parent,
        "max_model_len": state.config.max_model_len,
        "permission": [],
    })
}

/// `GET /v1/models/{model}`: the served model's card, or a 404 naming the model.
pub async fn model(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(model): Path<String>,
) -> Response {
    if let Err(e) = check_auth(&state, &headers) {
        return e.into_response();
    }
    let name = &state.config.model_name;
    if &model == name {
        Json(model_card(&state, name, name, None)).into_response()
    } else {
        ApiError::model_not_found(&model).into_response()
    }
}

/// A `model` field naming another model is a 404; a missing one means the served model.
fn check_model(state: &AppState, body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == state.config.model_name => Ok(()),
        Some(Value::String(m)) => Err(ApiError::model_not_found(m)),
        Some(_) => Err(ApiError::invalid(
            "Invalid type for 'model': expected a string",
            Some("model"),
        )),
    }
}

/// A boolean field, `default` when absent.
fn flag(body: &Map<String, Value>, name: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            format!("Invalid type for '{name}': expected a boolean"),
            Some(name),
        )),
    }
}
