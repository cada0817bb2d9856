//! `POST /v1/embeddings`, OpenAI's embeddings API: [`EmbeddingRequest`] parsing and the
//! handler.
//!
//! `input` is a string, a list of strings, a list of token ids, or a list of lists of token
//! ids; `dimensions` (1 to [`EMBEDDING_DIM`]) shortens the vectors; `encoding_format` is
//! `float` (the default) or `base64`; `user` is accepted and ignored, as are unknown fields.
//! Vectors come from [`vector`]: deterministic per input tokens, `--seed` and dimension, and
//! L2-normalised.
//!
//! Latency is a prefill-only pass of the engine: each input is an engine request of its prompt
//! tokens and one output token, all submitted at once (so they batch, hit and fill the prefix
//! cache, count in `/metrics` and go through the fleet's routing), and the response is sent once
//! every one has finished. Each input must fit the context with that one token.
//!
//! The request budget ([`super::budget`]) caps the inputs ([`MAX_EMBEDDING_INPUTS`]) and their
//! tokens ([`MAX_EMBEDDING_TOKENS`]), each beyond its cap a 400 naming `input`; large inputs
//! are tokenized, and large responses built, off the runtime's worker threads, the building
//! stopping when the client leaves or the server shuts down.

pub(crate) mod vector;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde_json::{Map, Value};
use servesim::cluster::Output;
use servesim::request::EngineRequest;

use super::budget::{self, exceeded, EMBEDDING_DIM, MAX_EMBEDDING_INPUTS, MAX_EMBEDDING_TOKENS};
use super::error::ApiError;
use super::layer::Received;
use super::lora::Adapter;
use super::protocol::ApiJson;
use super::state::AppState;
use crate::driver::{Event, Submission, SubmitError, SubmitOptions};
use vector::{BodySpec, Encoding};

/// One input as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EmbeddingInput {
    /// Text, tokenized by the server's tokenizer.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// A validated `/v1/embeddings` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EmbeddingRequest {
    /// `model`: the served model or a loaded LoRA adapter.
    pub model: String,
    /// `input`, one entry per vector (not empty, none empty).
    pub inputs: Vec<EmbeddingInput>,
    /// `dimensions`, default [`EMBEDDING_DIM`].
    pub dimensions: usize,
    /// `encoding_format`.
    pub encoding: Encoding,
}

/// A 400 naming `input`, saying what it may be.
fn bad_input() -> ApiError {
    ApiError::invalid(
        "Invalid 'input': expected a non-empty string, an array of non-empty strings, an array \
         of token ids, or an array of non-empty arrays of token ids.",
        Some("input"),
    )
}

/// Token ids of an array; a 400 naming `input` for anything but an integer in `u32`.
fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(bad_input)
        })
        .collect()
}

/// The inputs of `input`: the count is checked before any is copied.
fn parse_inputs(value: Option<&Value>) -> Result<Vec<EmbeddingInput>, ApiError> {
    let inputs = match value {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "Missing required parameter: 'input'.",
                Some("input"),
            ))
        }
        Some(Value::String(s)) => vec![EmbeddingInput::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad_input()),
        // One input of token ids (its length is the context's business).
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => {
            vec![EmbeddingInput::Tokens(token_ids(items)?)]
        }
        Some(Value::Array(items)) if items.len() > MAX_EMBEDDING_INPUTS => {
            return Err(exceeded(
                "input",
                format!("{} inputs given", items.len()),
                format!("{MAX_EMBEDDING_INPUTS} inputs per request"),
            ))
        }
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|v| EmbeddingInput::Text(v.as_str().unwrap_or_default().to_string()))
            .collect(),
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|v| token_ids(v.as_array().map_or(&[][..], Vec::as_slice)))
            .map(|ids| ids.map(EmbeddingInput::Tokens))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad_input()),
    };
    let empty = inputs.iter().any(|input| match input {
        EmbeddingInput::Text(text) => text.is_empty(),
        EmbeddingInput::Tokens(ids) => ids.is_empty(),
    });
    if empty {
        return Err(
            ApiError::invalid("Invalid 'input': an input is empty.", Some("input"))
                .with_code("empty_input"),
        );
    }
    Ok(inputs)
}

/// `dimensions`: 1 to [`EMBEDDING_DIM`], default [`EMBEDDING_DIM`].
fn parse_dimensions(value: Option<&Value>) -> Result<usize, ApiError> {
    let range = || format!("It must be an integer between 1 and {EMBEDDING_DIM}.");
    match value {
        None | Some(Value::Null) => Ok(EMBEDDING_DIM),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(d) if (1..=EMBEDDING_DIM as u64).contains(&d) => Ok(d as usize),
            // A number is written compactly (`1e300`, not 300 digits).
            _ => Err(ApiError::invalid(
                format!("Invalid 'dimensions': {n}. {}", range()),
                Some("dimensions"),
            )),
        },
        Some(_) => Err(ApiError::invalid(
            format!(
                "Invalid type for 'dimensions': expected an integer. {}",
                range()
            ),
            Some("dimensions"),
        )),
    }
}

impl EmbeddingRequest {
    /// Validates an embeddings body.
    pub(crate) fn parse(body: &Map<String, Value>) -> Result<EmbeddingRequest, ApiError> {
        let model = match body.get("model") {
            Some(Value::String(model)) => model.clone(),
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "you must provide a model parameter",
                    Some("model"),
                ))
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid type for 'model': expected a string.",
                    Some("model"),
                ))
            }
        };
        let inputs = parse_inputs(body.get("input"))?;
        let dimensions = parse_dimensions(body.get("dimensions"))?;
        let encoding = match body.get("encoding_format") {
            None | Some(Value::Null) => Encoding::Float,
            Some(Value::String(s)) if s == "float" => Encoding::Float,
            Some(Value::String(s)) if s == "base64" => Encoding::Base64,
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid 'encoding_format': expected 'float' or 'base64'.",
                    Some("encoding_format"),
                ))
            }
        };
        match body.get("user") {
            None | Some(Value::Null | Value::String(_)) => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid type for 'user': expected a string.",
                    Some("user"),
                ))
            }
        }
        Ok(EmbeddingRequest {
            model,
            inputs,
            dimensions,
            encoding,
        })
    }
}

/// The adapter `model` names, `None` for the served model; a 404 for neither.
fn adapter_for(state: &AppState, model: &str) -> Result<Option<Adapter>, ApiError> {
    if model == state.config.model_name {
        return Ok(None);
    }
    let adapter = state
        .lora
        .get(model)
        .ok_or_else(|| ApiError::model_not_found(model))?;
    state
        .metrics
        .lora_requests
        .get_or_create(&crate::metrics::AdapterLabel {
            adapter: adapter.name.clone(),
        })
        .inc();
    Ok(Some(adapter))
}

/// Checks each input against the context (it runs with one output token) and the request's
/// tokens against [`MAX_EMBEDDING_TOKENS`]; returns the total.
fn check_lengths(inputs: &[Vec<u32>], max_model_len: usize) -> Result<usize, ApiError> {
    for (i, tokens) in inputs.iter().enumerate() {
        if tokens.len() >= max_model_len {
            return Err(ApiError::invalid(
                format!(
                    "This model's maximum context length is {max_model_len} tokens; input {i} \
                     has {} tokens, and its prefill pass runs one more. Reduce the length of \
                     the input.",
                    tokens.len()
                ),
                Some("input"),
            )
            .with_code("context_length_exceeded"));
        }
    }
    let total = inputs.iter().map(Vec::len).sum::<usize>();
    if total > MAX_EMBEDDING_TOKENS {
        return Err(exceeded(
            "input",
            format!("{} inputs of {total} tokens in all", inputs.len()),
            format!("{MAX_EMBEDDING_TOKENS} tokens per request"),
        ));
    }
    Ok(total)
}

/// Waits until the engine request of `submission` has finished (its prefill pass done).
async fn finished(state: &AppState, submission: &mut Submission) -> Result<(), ApiError> {
    loop {
        let event = tokio::select! {
            biased;
            () = state.stop_generations.cancelled() => return Err(ApiError::shutting_down()),
            event = submission.events.recv() => event,
        };
        match event {
            None => return Err(ApiError::from(SubmitError::Stopped)),
            Some(Event::Stalled) => {
                return Err(ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    message: "The engine made no progress on this request and cancelled it.".into(),
                    kind: "server_error",
                    param: None,
                    code: Some("engine_stalled"),
                })
            }
            Some(Event::Output(Output::Finished { .. })) => {
                submission.mark_done();
                return Ok(());
            }
            Some(Event::Output(Output::Rejected { reason, .. })) => return Err(reason.into()),
            Some(Event::Output(_)) => {}
        }
    }
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    received: Option<Extension<Received>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = super::received_at(&state, received);
    let request = EmbeddingRequest::parse(&body)?;
    drop(body);
    if !state.is_ready() {
        return Err(super::vllm::loading());
    }
    let adapter = adapter_for(&state, &request.model)?;
    let codec = Arc::clone(&state.config.codec);
    if let Some(vocab_size) = codec.vocab_size() {
        for input in &request.inputs {
            if let EmbeddingInput::Tokens(ids) = input {
                budget::check_token_ids(ids, vocab_size, "input")?;
            }
        }
    }
    let mut text_bytes = 0usize;
    for input in &request.inputs {
        if let EmbeddingInput::Text(text) = input {
            budget::check_word_lengths(text, "input")?;
            text_bytes += text.len();
        }
    }
    let inputs = request.inputs;
    let inputs: Vec<Vec<u32>> = budget::off_runtime(text_bytes > budget::INLINE_TEXT_BYTES, {
        let codec = Arc::clone(&codec);
        move || {
            inputs
                .into_iter()
                .map(|input| match input {
                    EmbeddingInput::Text(text) => codec.encode(&text),
                    EmbeddingInput::Tokens(ids) => ids,
                })
                .collect()
        }
    })
    .await?;
    let prompt_tokens = check_lengths(&inputs, state.config.max_model_len)?;
    let lora = adapter.as_ref().map(|a| {
        Arc::new(crate::kv_events::tokens::LoraTag {
            id: a.id,
            name: a.name.clone(),
        })
    });
    // Every input is submitted before any is awaited, so they batch as a server would.
    let mut submissions = Vec::with_capacity(inputs.len());
    for tokens in &inputs {
        // Other tasks run between submissions of a large batch.
        tokio::task::consume_budget().await;
        let engine_request = EngineRequest {
            prompt: super::vllm::prompt_for(tokens, state.block_size, adapter.as_ref()),
            max_output_tokens: 1,
            output_tokens: Vec::new(),
        };
        let options = SubmitOptions {
            pinned: state.worker,
            lora: lora.clone(),
            finish_reason: "length",
            max_tokens: 1,
            received: Some(received),
        };
        // An error drops the submissions so far, which cancels them.
        submissions.push(state.engine.submit_as(engine_request, options).await?);
    }
    let spec_model = request.model;
    let (seed, dimensions, encoding) = (state.config.seed, request.dimensions, request.encoding);
    // Drawn while the engine runs the prefills: one draw per four coordinates per token, off
    // the runtime's threads beyond 256 Ki tokens x coordinates (about 10 ms in a debug build).
    let heavy = prompt_tokens.saturating_mul(dimensions) > budget::INLINE_PLAN_TOKENS << 4;
    // Drawing stops when the client leaves (this future is dropped) or the server shuts down.
    let cancel = state.stop_generations.child_token();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let body = budget::off_runtime(heavy, move || {
        let spec = BodySpec {
            model: &spec_model,
            prompt_tokens,
            seed,
            dimensions,
            encoding,
        };
        vector::response_body(&inputs, &spec, || cancel.is_cancelled())
    })
    .await?
    .ok_or_else(ApiError::shutting_down)?;
    for submission in &mut submissions {
        finished(&state, submission).await?;
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<EmbeddingRequest, ApiError> {
        let Value::Object(map) = body else {
            panic!("an object")
        };
        EmbeddingRequest::parse(&map)
    }

    #[test]
    fn inputs_take_the_four_openai_shapes() {
        let request = parse(json!({"model": "m", "input": "hi"})).expect("valid");
        assert_eq!(request.inputs, vec![EmbeddingInput::Text("hi".into())]);
        assert_eq!(request.dimensions, EMBEDDING_DIM);
        assert_eq!(request.encoding, Encoding::Float);
        let request = parse(json!({"model": "m", "input": ["a", "b"], "dimensions": 8,
            "encoding_format": "base64", "user": "u"}))
        .expect("valid");
        assert_eq!(request.inputs.len(), 2);
        assert_eq!(request.dimensions, 8);
        assert_eq!(request.encoding, Encoding::Base64);
        let request = parse(json!({"model": "m", "input": [1, 2, 3]})).expect("valid");
        assert_eq!(request.inputs, vec![EmbeddingInput::Tokens(vec![1, 2, 3])]);
        let request = parse(json!({"model": "m", "input": [[1], [2, 3]]})).expect("valid");
        assert_eq!(request.inputs.len(), 2);
    }

    #[test]
    fn bad_inputs_name_their_parameter() {
        for (body, param) in [
            (json!({"input": "x"}), "model"),
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": ""}), "input"),
            (json!({"model": "m", "input": []}), "input"),
            (json!({"model": "m", "input": [[]]}), "input"),
            (json!({"model": "m", "input": ["a", 1]}), "input"),
            (json!({"model": "m", "input": [-1]}), "input"),
            (json!({"model": "m", "input": [1.5]}), "input"),
            (json!({"model": "m", "input": {"a": 1}}), "input"),
            (
                json!({"model": "m", "input": "x", "dimensions": 0}),
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "x", "dimensions": 1_000_000_000}),
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "x", "dimensions": -3}),
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "x", "dimensions": "8"}),
                "dimensions",
            ),
            (
                json!({"model": "m", "input": "x", "encoding_format": "int8"}),
                "encoding_format",
            ),
            (json!({"model": "m", "input": "x", "user": 3}), "user"),
        ] {
            let e = parse(body.clone()).expect_err("invalid");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
        let many = vec!["a"; MAX_EMBEDDING_INPUTS + 1];
        let e = parse(json!({"model": "m", "input": many})).expect_err("too many");
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(
            e.message.contains("2048 inputs per request"),
            "{}",
            e.message
        );
        let e =
            parse(json!({"model": "m", "input": "x", "dimensions": 1e300})).expect_err("too large");
        assert!(e.message.len() < 200, "{}", e.message);
    }

    #[test]
    fn lengths_are_held_to_the_context_and_the_token_cap() {
        assert_eq!(check_lengths(&[vec![1; 9], vec![2; 3]], 10), Ok(12));
        let e = check_lengths(&[vec![1; 3], vec![1; 10]], 10).expect_err("too long");
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(e.message.contains("input 1 has 10 tokens"), "{}", e.message);
        let many = vec![vec![1; 1000]; MAX_EMBEDDING_TOKENS / 1000 + 1];
        let e = check_lengths(&many, 4096).expect_err("too many tokens");
        assert!(
            e.message.contains("300000 tokens per request"),
            "{}",
            e.message
        );
    }
}
