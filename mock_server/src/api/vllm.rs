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
//! - `--api-key` guards the routes under `/v1`, as vLLM's, and `/reset_prefix_cache`:
//!   `/tokenize` and `/detokenize` answer without it. A token id out of the vocabulary is a 400
//!   naming `tokens`.

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::layer::Charge;
use super::lora::Adapter;
use super::protocol::{ApiJson, ChatRequest};
use super::state::AppState;
use crate::text::ChatMessage;

/// `POST /tokenize`. Text over [`super::budget::INLINE_TEXT_BYTES`] is checked, tokenized and
/// its answer written on the blocking pool, as the generation endpoints do.
pub(crate) async fn tokenize(
    State(state): State<AppState>,
    charge: Option<Extension<Charge>>,
    ApiJson(mut body): ApiJson,
) -> Result<Response, ApiError> {
    check_model(&state, &body)?;
    let return_token_strs = flag(&body, "return_token_strs", false)?;
    let input = if body.contains_key("messages") {
        body.entry("model")
            .or_insert_with(|| Value::String(state.config.model_name.clone()));
        let request = ChatRequest::parse(&body)?;
        let add_generation_prompt = flag(&body, "add_generation_prompt", true)?;
        TokenizeInput::Chat(request.messages, add_generation_prompt)
    } else {
        match body.get("prompt") {
            Some(Value::String(text)) => TokenizeInput::Text(text.clone()),
            _ => {
                return Err(ApiError::invalid(
                    "Expected either 'prompt' (a string) or 'messages'",
                    Some("prompt"),
                ))
            }
        }
    };
    drop(body);
    let per_byte = if return_token_strs {
        super::budget::TOKENIZE_STRS_TEXT_BYTES
    } else {
        super::budget::TOKENIZE_TEXT_BYTES
    };
    let work = (input.bytes() as u64).saturating_mul(per_byte);
    let _reservation = super::reserve(&state, charge.and_then(|Extension(c)| c.take()), work)?;
    let heavy = input.bytes() > super::budget::INLINE_TEXT_BYTES;
    let codec = Arc::clone(&state.config.codec);
    let max_model_len = state.config.max_model_len;
    super::budget::off_runtime(heavy, move || {
        let tokens = match input {
            TokenizeInput::Chat(messages, add_generation_prompt) => {
                for message in &messages {
                    super::budget::check_word_lengths(&message.content, "messages")?;
                }
                codec.render_chat(&messages, add_generation_prompt)
            }
            TokenizeInput::Text(text) => {
                super::budget::check_word_lengths(&text, "prompt")?;
                codec.encode(&text)
            }
        };
        let token_strs = if return_token_strs {
            let strs: Vec<String> = tokens.iter().map(|&t| codec.decode(&[t])).collect();
            json!(strs)
        } else {
            Value::Null
        };
        Ok(json_bytes(&json!({
            "count": tokens.len(),
            "max_model_len": max_model_len,
            "tokens": tokens,
            "token_strs": token_strs,
        })))
    })
    .await?
}

/// What `/tokenize` tokenizes: a prompt, or chat messages rendered with the template.
enum TokenizeInput {
    Text(String),
    Chat(Vec<ChatMessage>, bool),
}

impl TokenizeInput {
    /// Its text in bytes.
    fn bytes(&self) -> usize {
        match self {
            TokenizeInput::Text(text) => text.len(),
            TokenizeInput::Chat(messages, _) => messages.iter().map(|m| m.content.len()).sum(),
        }
    }
}

/// `value` as a JSON response, written where the caller runs (the blocking pool for a large
/// one).
fn json_bytes(value: &Value) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        value.to_string(),
    )
        .into_response()
}

/// `POST /detokenize`. More than [`super::budget::INLINE_TEXT_BYTES`] / 4 ids are decoded,
/// and the answer written, on the blocking pool.
pub(crate) async fn detokenize(
    State(state): State<AppState>,
    charge: Option<Extension<Charge>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
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
    drop(body);
    if let Some(vocab_size) = state.config.codec.vocab_size() {
        super::budget::check_token_ids(&ids, vocab_size, "tokens")?;
    }
    let work = (ids.len() as u64).saturating_mul(super::budget::DETOKENIZE_ID_BYTES);
    let _reservation = super::reserve(&state, charge.and_then(|Extension(c)| c.take()), work)?;
    let heavy = ids.len().saturating_mul(4) > super::budget::INLINE_TEXT_BYTES;
    let codec = Arc::clone(&state.config.codec);
    super::budget::off_runtime(heavy, move || {
        json_bytes(&json!({"prompt": codec.decode(&ids)}))
    })
    .await
}

/// `GET /version`: the server's version, as vLLM reports its own.
pub(crate) async fn version() -> Response {
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `GET|POST /ping`: as `/health` (vLLM's SageMaker-style liveness probe): 200 with an empty
/// body while the engine runs, 503 otherwise.
pub(crate) async fn ping(State(state): State<AppState>) -> Response {
    if state.is_ready() && state.engine.is_alive() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

/// 503 while the simulated model load (`--startup-delay`) runs.
pub(crate) fn loading() -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: "The model is still loading; retry when /health answers 200".into(),
        kind: "server_error",
        param: None,
        code: Some("model_loading"),
    }
}

/// The model card of a served model.
pub(crate) fn model_card(state: &AppState, id: &str, root: &str, parent: Option<&str>) -> Value {
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
pub(crate) async fn model(
    State(state): State<AppState>,
    model: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    // A name that is not UTF-8 once percent-decoded names no model.
    let Ok(Path(model)) = model else {
        return Err(ApiError::model_not_found("(a name that is not UTF-8)"));
    };
    let name = &state.config.model_name;
    if &model == name {
        Ok(Json(model_card(&state, name, name, None)).into_response())
    } else if let Some(adapter) = state.lora.get(&model) {
        Ok(Json(model_card(&state, &adapter.name, &adapter.path, Some(name))).into_response())
    } else {
        Err(ApiError::model_not_found(&model))
    }
}

/// A `model` field naming another model is a 404; a missing one means the served model.
fn check_model(state: &AppState, body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == state.config.model_name => Ok(()),
        Some(Value::String(m)) if state.lora.get(m).is_some() => Ok(()),
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

/// The prompt of `tokens` at `block_size`, its block hashes salted by `adapter` (so no block of
/// an adapter request matches a base-model block or another adapter's). Output blocks chain
/// from the salted prompt blocks; a prompt shorter than one block has nothing to salt.
pub(crate) fn prompt_for(
    tokens: &[u32],
    block_size: usize,
    adapter: Option<&Adapter>,
) -> servesim::request::Prompt {
    let mut prompt = servesim::request::Prompt::from_tokens(tokens, block_size);
    if let Some(adapter) = adapter {
        let mut parent = Some(servesim::tokens::SequenceHash(adapter.salt()));
        for (seq, local) in prompt.blocks.sequence.iter_mut().zip(&prompt.blocks.local) {
            *seq = servesim::tokens::next_sequence_hash(parent, *local);
            parent = Some(*seq);
        }
    }
    prompt
}

/// The `lora_name` field of a load or unload body: at most
/// [`super::lora::MAX_LORA_NAME_BYTES`].
fn lora_name(body: &Map<String, Value>) -> Result<String, ApiError> {
    match body.get("lora_name") {
        Some(Value::String(name)) if name.len() > super::lora::MAX_LORA_NAME_BYTES => {
            Err(super::budget::exceeded(
                "lora_name",
                format!("the name has {} bytes", name.len()),
                format!("{} bytes", super::lora::MAX_LORA_NAME_BYTES),
            ))
        }
        Some(Value::String(name)) if !name.is_empty() => Ok(name.clone()),
        _ => Err(ApiError::invalid(
            "Both 'lora_name' and 'lora_path' must be provided.",
            Some("lora_name"),
        )),
    }
}

/// `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: 200 with vLLM's text; an adapter
/// loaded already (or the base model's name) is a 400.
pub(crate) async fn load_lora_adapter(
    State(state): State<AppState>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let name = lora_name(&body)?;
    let path = match body.get("lora_path") {
        Some(Value::String(path)) if path.len() > super::lora::MAX_LORA_PATH_BYTES => {
            return Err(super::budget::exceeded(
                "lora_path",
                format!("the path has {} bytes", path.len()),
                format!("{} bytes", super::lora::MAX_LORA_PATH_BYTES),
            ))
        }
        Some(Value::String(path)) if !path.is_empty() => path.clone(),
        _ => {
            return Err(ApiError::invalid(
                "Both 'lora_name' and 'lora_path' must be provided.",
                Some("lora_path"),
            ))
        }
    };
    let loaded = if name == state.config.model_name {
        Err(super::lora::LoadRefusal::Loaded)
    } else {
        state.lora.load(&name, &path)
    };
    match loaded {
        Ok(()) => {}
        Err(super::lora::LoadRefusal::Loaded) => {
            return Err(ApiError::invalid(
                format!("The lora adapter '{name}' has already been loaded."),
                Some("lora_name"),
            ))
        }
        Err(super::lora::LoadRefusal::Full) => {
            return Err(super::budget::exceeded(
                "lora_name",
                format!(
                    "{} adapters are loaded (unload one first)",
                    super::lora::MAX_LORA_ADAPTERS
                ),
                format!("{} adapters", super::lora::MAX_LORA_ADAPTERS),
            ))
        }
    }
    Ok(format!("Success: LoRA adapter '{name}' added successfully.").into_response())
}

/// `POST /reset_prefix_cache` (vLLM's development endpoint): empties the prefix cache of every
/// idle worker behind this endpoint (all of `serve`'s, a fleet endpoint's own), each publishing
/// `AllBlocksCleared`; a worker running requests keeps its cache. 200 with
/// `{"reset_workers": [...], "busy_workers": [...]}`.
pub(crate) async fn reset_prefix_cache(
    State(state): State<AppState>,
) -> Result<Response, ApiError> {
    let reset = state.engine.reset_prefix_cache(state.worker).await?;
    let workers = |done: bool| -> Vec<u32> {
        reset
            .iter()
            .filter(|(_, r)| *r == done)
            .map(|(w, _)| w.0)
            .collect()
    };
    Ok(
        Json(json!({"reset_workers": workers(true), "busy_workers": workers(false)}))
            .into_response(),
    )
}

/// `POST /v1/unload_lora_adapter {"lora_name"}`: 200 with vLLM's text; an adapter that is not
/// loaded is a 400.
pub(crate) async fn unload_lora_adapter(
    State(state): State<AppState>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let name = lora_name(&body)?;
    if !state.lora.unload(&name) {
        return Err(ApiError::invalid(
            format!("The lora adapter '{name}' cannot be found."),
            Some("lora_name"),
        ));
    }
    // Its series goes with it, so `/metrics` holds only the loaded adapters'.
    state
        .metrics
        .lora_requests
        .remove(&crate::metrics::AdapterLabel {
            adapter: name.clone(),
        });
    Ok(format!("Success: LoRA adapter '{name}' removed successfully.").into_response())
}
