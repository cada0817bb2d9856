//! OpenAI's Responses API: `POST /v1/responses` (streamed or whole), `GET /v1/responses/{id}`
//! and `DELETE /v1/responses/{id}`.
//!
//! A Responses request becomes the request chat makes: its `instructions` a system message,
//! its `input` items chat messages (`wire`), the conversation of its `previous_response_id`
//! before them (`store`), and `tools` presented as chat presents them. The prompt is rendered
//! with the chat template and run by the same generation path (`super::start_generation`), so
//! the engine, pacing, faults, metrics, budget and, in a fleet, the routing judge apply as
//! they do to chat, and the same prompt counts the same tokens. `output` turns the answer's
//! pieces into output items and events.
//!
//! Stored responses (`store`, default true) are kept per server, or per worker in a fleet, as
//! each vLLM process keeps its own: a continuation must reach the worker that answered.

pub(crate) mod output;
pub mod store;
pub mod wire;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::Stream;
use serde_json::{json, Value};

use super::answer::FinishReason;
use super::budget::{exceeded, off_runtime, INLINE_TEXT_BYTES};
use super::error::ApiError;
use super::generation::stream::{frames, StepWriter};
use super::generation::{Endpoint, Generation, SpecPrefill, Step};
use super::layer::{Charge, Received};
use super::protocol::ApiJson;
use super::state::{unix_now, AppState};
use super::{PromptIn, RequestIn};
use crate::text::{ChatMessage, Role};
use output::{Echo, Output};
use store::{ChainError, Store, Stored, MAX_CHAIN_DEPTH};
use wire::{shown_id, ResponsesRequest};

/// Bytes of text one conversation may hold at most: a `previous_response_id` chain's turns
/// and the new input together (`previous_response_id`); one request's own text is bounded by
/// the body limit.
pub const MAX_CONVERSATION_BYTES: usize = 16 << 20;

/// The 404 of an id the store does not hold.
fn not_found(message: String, param: Option<&str>, code: Option<&'static str>) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message,
        kind: "invalid_request_error",
        param: param.map(str::to_string),
        code,
    }
}

fn chain_error(id: &str, error: ChainError) -> ApiError {
    let param = "previous_response_id";
    let shown = shown_id(id);
    match error {
        ChainError::NotFound => not_found(
            format!("Previous response with id '{shown}' not found."),
            Some(param),
            Some("previous_response_not_found"),
        ),
        ChainError::Broken(at) => not_found(
            format!(
                "Previous response with id '{shown}' cannot be continued: an earlier response \
                 of its chain ('{}') is no longer stored.",
                shown_id(&at)
            ),
            Some(param),
            Some("previous_response_not_found"),
        ),
        ChainError::TooDeep => exceeded(
            param,
            format!("the chain of '{shown}' runs more than {MAX_CHAIN_DEPTH} responses back"),
            format!("{MAX_CHAIN_DEPTH} responses per chain"),
        ),
    }
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(store): Extension<Arc<Store>>,
    headers: HeaderMap,
    received: Option<Extension<Received>>,
    charge: Option<Extension<Charge>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = super::received_at(&state, received);
    let charge = charge.and_then(|Extension(c)| c.take());
    let mut request = ResponsesRequest::parse(&body)?;
    super::apply_header_overrides(&mut request.params, &headers)?;
    let history = match &request.previous {
        Some(id) => store.conversation(id).map_err(|e| chain_error(id, e))?,
        None => Vec::new(),
    };
    let mut messages = Vec::with_capacity(history.len() + request.input.len() + 2);
    messages.extend(request.tools.prompt().map(ChatMessage::system));
    messages.extend(request.instructions.clone().map(ChatMessage::system));
    messages.extend(history);
    messages.extend(request.input.iter().cloned());
    let text_bytes: usize = messages.iter().map(|m| m.content.len()).sum();
    if text_bytes > MAX_CONVERSATION_BYTES {
        let param = match request.previous {
            Some(_) => "previous_response_id",
            None => "input",
        };
        return Err(exceeded(
            param,
            format!("the conversation holds {text_bytes} bytes of text"),
            format!("{MAX_CONVERSATION_BYTES} bytes"),
        ));
    }
    // `nvext.agent_hints.speculative_prefill` warms the next turn, as on chat.
    let spec_prefill = request.params.speculative_prefill().then(|| SpecPrefill {
        messages: messages.clone(),
    });
    let codec = Arc::clone(&state.config.codec);
    let tokens = off_runtime(text_bytes > INLINE_TEXT_BYTES, move || {
        codec.render_chat(&messages, true)
    })
    .await?;
    // Named as the Responses field here, before the chat path would name `messages`.
    super::output_limit(
        &state.config,
        request.params.max_tokens,
        tokens.len(),
        "input",
    )?;
    let request_in = RequestIn {
        endpoint: Endpoint::Chat,
        received,
        spec_prefill,
        tools: Some(request.tools.clone()),
        charge,
    };
    let prompts = vec![PromptIn { tokens, echo: None }];
    let generation =
        super::start_generation(&state, request.params.clone(), prompts, request_in).await?;
    // The generation's id is unique to this server's request: the response's is made of it.
    let key = generation
        .header
        .id
        .rsplit('-')
        .next()
        .unwrap_or_default()
        .to_string();
    let echo = Echo {
        id: format!("resp_{key}"),
        created_at: unix_now(),
        model: request.params.model.clone(),
        instructions: request.instructions.clone(),
        max_output_tokens: request.params.max_tokens,
        previous: request.previous.clone(),
        store: request.store,
        temperature: request.temperature,
        top_p: request.top_p,
        tools: request.tools_echo.clone(),
        tool_choice: request.tool_choice_echo.clone(),
        metadata: request.metadata.clone(),
    };
    let keep = request.store.then(|| Keep {
        store,
        previous: request.previous.clone(),
        input: request.input,
    });
    let answer = Answer {
        generation,
        output: Output::new(&key, request.params.stream),
        echo,
        keep,
    };
    if request.params.stream {
        let body = axum::body::Body::from_stream(sse_stream(answer));
        Ok(super::sse_response(body))
    } else {
        let response = answer.collect().await?;
        Ok(Json(response).into_response())
    }
}

/// Where a finished response is stored, and what of it.
struct Keep {
    store: Arc<Store>,
    previous: Option<String>,
    /// The request's input messages (the turn's first part).
    input: Vec<ChatMessage>,
}

/// One response being answered.
struct Answer {
    generation: Generation,
    output: Output,
    echo: Echo,
    keep: Option<Keep>,
}

impl Answer {
    /// Adds token `token` of choice `choice` to the output.
    fn on_token(&mut self, choice: usize, token: usize) {
        let Some(c) = self.generation.choices.get(choice) else {
            return;
        };
        if let Some(piece) = c.answer.pieces.get(token) {
            self.output.token(piece, &c.answer.tool_calls);
        }
    }

    /// Ends the output and returns the final response object (and stores it when asked).
    fn finish(&mut self) -> Value {
        let cut = self
            .generation
            .choices
            .first()
            .is_some_and(|c| c.answer.finish_reason == FinishReason::Length);
        self.output.finish(cut);
        let status = if cut { "incomplete" } else { "completed" };
        let response = self
            .echo
            .response(status, self.output.items(), self.usage());
        if let Some(keep) = self.keep.take() {
            let mut turn = keep.input;
            turn.push(ChatMessage::new(Role::Assistant, self.output.history()));
            let stored = Stored {
                previous: keep.previous,
                turn,
                response: response.to_string(),
            };
            keep.store.insert(self.echo.id.clone(), stored);
        }
        response
    }

    /// `usage`, with the counts chat's `usage` gives for the same prompt.
    fn usage(&self) -> Value {
        let chat = self.generation.usage();
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        let input = count(&chat["prompt_tokens"]);
        let cached = count(&chat["prompt_tokens_details"]["cached_tokens"]);
        let output = count(&chat["completion_tokens"]);
        json!({
            "input_tokens": input,
            "input_tokens_details": {
                "cached_tokens": cached,
                "cache_write_tokens": input.saturating_sub(cached),
            },
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": self.output.reasoning_tokens},
            "total_tokens": input + output,
        })
    }

    /// Runs the generation to its end: the whole response object.
    async fn collect(mut self) -> Result<Value, ApiError> {
        loop {
            match self.generation.next().await {
                Step::Token { choice, token } => self.on_token(choice, token),
                Step::Finished { .. } if self.generation.done => return Ok(self.finish()),
                Step::Finished { .. } => {}
                Step::Error(e) => return Err(e),
            }
        }
    }

    /// Adds one step's events to the output; true once the stream has ended.
    fn write_events(&mut self, step: Step) -> bool {
        match step {
            Step::Token { choice, token } => {
                self.on_token(choice, token);
                false
            }
            Step::Finished { .. } if self.generation.done => {
                let response = self.finish();
                let kind = if response["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.output.event(kind, json!({"response": response}));
                true
            }
            Step::Finished { .. } => false,
            Step::Error(e) => {
                self.generation.state.metrics.http_failures.inc();
                let code = e.code.unwrap_or(e.kind);
                self.output.event(
                    "error",
                    json!({"code": code, "message": e.message, "param": e.param}),
                );
                let mut response = self
                    .echo
                    .response("failed", self.output.items(), Value::Null);
                response["error"] = json!({"code": code, "message": e.message});
                self.output
                    .event("response.failed", json!({"response": response}));
                true
            }
        }
    }
}

impl StepWriter for Answer {
    fn generation(&mut self) -> &mut Generation {
        &mut self.generation
    }

    fn write_step(&mut self, step: Step, out: &mut Vec<u8>) -> bool {
        let ended = self.write_events(step);
        out.append(&mut self.output.take_events());
        ended
    }
}

/// The SSE body of a streamed response: `response.created` and `response.in_progress` at
/// once, then each step's events as the engine paces them ([`frames`]). Dropping it (the
/// client left) drops the generation, which cancels its engine request.
fn sse_stream(mut answer: Answer) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let opening = answer.echo.response("in_progress", Vec::new(), Value::Null);
    answer
        .output
        .event("response.created", json!({"response": opening}));
    answer
        .output
        .event("response.in_progress", json!({"response": opening}));
    let opening = answer.output.take_events();
    frames(answer, opening)
}

/// `GET /v1/responses/{id}`: a stored response.
pub(crate) async fn retrieve(
    Extension(store): Extension<Arc<Store>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    // An id that is not UTF-8 once percent-decoded names no stored response.
    let Ok(Path(id)) = id else {
        return Err(missing("(an id that is not UTF-8)"));
    };
    let stored = store.get(&id).ok_or_else(|| missing(&id))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        stored.response.clone(),
    )
        .into_response())
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(
    Extension(store): Extension<Arc<Store>>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    // An id that is not UTF-8 once percent-decoded names no stored response.
    let Ok(Path(id)) = id else {
        return Err(missing("(an id that is not UTF-8)"));
    };
    if !store.remove(&id) {
        return Err(missing(&id));
    }
    Ok(Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response())
}

fn missing(id: &str) -> ApiError {
    not_found(
        format!("Response with id '{}' not found.", shown_id(id)),
        None,
        None,
    )
}
