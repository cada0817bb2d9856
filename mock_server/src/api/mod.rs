//! The OpenAI-compatible HTTP API: [`app`] builds the axum router over an [`AppState`].
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses` (and
//! `GET|DELETE /v1/responses/{id}`, [`responses`]), Anthropic's `POST /v1/messages` and
//! `POST /v1/messages/count_tokens` (`messages`), `POST /v1/embeddings` (`embeddings`),
//! `GET /v1/models`, `GET /health`,
//! `GET /metrics`, and vLLM's `GET /v1/models/{model}`, `POST /tokenize`, `POST /detokenize`,
//! `GET /version`, `GET|POST /ping` (`vllm`). Every error is an [`ApiError`] body, including unknown routes (404) and
//! methods (405, with `Allow`); on the `/v1/messages` paths it is rewritten in Anthropic's shape.
//!
//! Before any handler, `layer::edge_limits` enforces the request-level limits: headers over
//! `layer::MAX_HEADER_BYTES` (431), a body over `--max-body-bytes` (413, at once when
//! `Content-Length` announces it) or not arriving within `--body-read-timeout` (408). 408 and
//! 413 say `Connection: close` (the body may be left unread, so the connection is closed).
//!
//! Wire behaviour worth knowing:
//! - Each choice's answer is planned before the engine runs it (`answer::Answer::plan`) and
//!   the engine runs exactly its tokens. With `ignore_eos` it runs to the output limit
//!   (`max_completion_tokens`, else `max_tokens`, else `--default-max-tokens`) and ends with
//!   `finish_reason: "length"`; without, its length is drawn from `--output-length-dist` (at
//!   least `min_tokens`) and it ends with `"stop"` below the limit. `stop` strings and
//!   `stop_token_ids` end the text just before them (`stop_reason` names the match;
//!   `include_stop_str_in_output` keeps a matched string); with
//!   `--stop-probability` an answer that ends itself ends at one of them. `temperature` and
//!   the like are accepted and ignored. Unknown top-level fields are ignored.
//! - `tools` with `tool_choice` `required`, a named function, or `auto` (with
//!   `--tool-call-probability`) answer a tool call with arguments drawn from the function's
//!   schema, streamed as `delta.tool_calls` fragments, `finish_reason: "tool_calls"`.
//!   `response_format` `json_object` / `json_schema` answer one JSON document. `logprobs`
//!   (`top_logprobs` on chat) add seeded log-probabilities.
//! - `n` (1 to 128) choices per prompt, each its own engine request; `/v1/completions` takes a
//!   batch of prompts (choice index = prompt number × n + choice number) and `echo`.
//! - Every request has a work budget ([`budget`]): stop strings, stop token ids, prompts,
//!   choices, planned output tokens and log-probability entries are capped, each beyond its
//!   cap a 400 naming the parameter; token ids out of the vocabulary are a 400 too. Large
//!   prompts are tokenized, and large requests planned and answered whole, off the runtime's
//!   worker threads; planning stops when the client leaves or the server shuts down.
//! - `--api-key` guards the routes under `/v1`, as vLLM's, and `/reset_prefix_cache`
//!   (`/tokenize`, `/detokenize`, `/health`, `/metrics` answer without it). The key, the request
//!   count and the failure count are layers of the routes (`layer`), not handler code.
//! - Streams start with the `role` chunk at once; an engine rejection after that is a final
//!   `data: {"error":…}` event and `data: [DONE]`.
//! - `usage.prompt_tokens_details.cached_tokens` is the prefix-cache hit at first admission.
//! - With `--reasoning-ratio R`, the first floor(R * limit) chat tokens are reasoning:
//!   `delta.reasoning_content` (or `<think>…</think>` in content with `--reasoning-format inline`).
//! - `nvext` is strict, as Dynamo's: an unknown field (also inside `agent_hints`) is a 400
//!   naming it. `agent_hints.speculative_prefill` (chat only): after the last chunk the
//!   conversation plus the answer (content only) is submitted with one output token through
//!   the router; at most `crate::driver::state::MAX_SPECULATIVE_PREFILLS` run at once, others are
//!   skipped, as are those arriving while the `--max-waiting` queue is full (both counted in
//!   `/metrics`). Other hints are accepted and have no effect.
//! - `nvext.backend_instance_id` (or the `x-dynamo-worker-instance-id` / `x-worker-instance-id`
//!   header, which wins) pins the request to that worker, bypassing worker selection and the
//!   router's queue; an id out of range is a 400.
//! - `nvext.extra_fields: ["worker_id", "timing"]` adds a response `nvext` (on the chunk with
//!   `finish_reason`, or the whole response): `worker_id {prefill_worker_id,
//!   decode_worker_id}` and `timing {request_received_ms, ttft_ms, total_time_ms,
//!   first_token_ms, last_token_ms}` (`*_ms` instants are Unix milliseconds). The token times are
//!   the engine's own (simulated, on the wall-clock time line of the driver's
//!   `crate::driver::SimClock`); `ttft_ms` and `total_time_ms` run from the engine's
//!   submission, as the `/metrics` histograms do, so they state what the engine modelled (with
//!   `--fixed-latency 20,5` and 3 tokens: 20 and 30) whatever the host's load.

pub(crate) mod answer;
pub mod budget;
pub(crate) mod embeddings;
pub(crate) mod error;
pub mod fault;
pub(crate) mod generation;
pub(crate) mod json_mode;
pub(crate) mod layer;
pub(crate) mod logprobs;
pub mod lora;
pub(crate) mod messages;
pub(crate) mod metrics;
pub mod protocol;
pub mod responses;
pub(crate) mod schema;
pub(crate) mod state;
pub(crate) mod tools;
pub(crate) mod vllm;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Uri};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::driver::inflight::Reservation;
use answer::{Answer, AnswerSpec};
pub use error::ApiError;
use generation::{Choice, Endpoint, ExtraFields, Generation, Header, SpecPrefill};
use layer::{Charge, Received};
use protocol::{ApiJson, ChatRequest, CompletionRequest, GenerationParams, PromptInput};
use servesim::ids::WorkerId;
use servesim::time::SimTime;
use state::unix_now;
pub use state::AppState;
use tools::Tools;

use crate::config::ServerConfig;
use crate::driver::SubmitOptions;

/// The router with every route.
pub fn app(state: AppState) -> Router {
    let body_limit = DefaultBodyLimit::max(state.config.max_body_bytes);
    let config = &state.config;
    let faults = crate::api::fault::FaultInjector::new(
        config.faults.clone(),
        config.seed,
        Arc::clone(&state.metrics),
        (config.model_name.clone(), config.max_model_len),
    );
    // A route's own layers, innermost first: the key, then failure counting, then the request
    // count (so a refused key is a counted request and a counted failure).
    let key = || from_fn_with_state(state.clone(), layer::require_api_key);
    let failures = || from_fn_with_state(Arc::clone(&state.metrics), layer::count_failures);
    let requests = |endpoint: &'static str| {
        from_fn_with_state(
            (Arc::clone(&state.metrics), endpoint),
            layer::count_requests,
        )
    };
    let generation = |route: MethodRouter<AppState>, endpoint| {
        route
            .route_layer(key())
            .route_layer(failures())
            .route_layer(requests(endpoint))
    };
    let stored_responses = Extension(Arc::new(responses::store::Store::default()));
    Router::new()
        .route(
            "/v1/responses",
            generation(post(responses::create), "responses").layer(stored_responses.clone()),
        )
        .route(
            "/v1/chat/completions",
            generation(post(chat_completions), "chat"),
        )
        .route(
            "/v1/completions",
            generation(post(completions), "completions"),
        )
        .route(
            "/v1/embeddings",
            generation(post(embeddings::embeddings), "embeddings"),
        )
        .route(
            "/v1/messages",
            generation(post(messages::create), "messages"),
        )
        // Only the generation routes above.
        .route_layer(from_fn_with_state(faults, crate::api::fault::inject))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve)
                .delete(responses::delete)
                .route_layer(key())
                .route_layer(failures())
                .layer(stored_responses),
        )
        .route("/v1/models", get(models).route_layer(key()))
        .route("/health", get(health))
        .route("/metrics", get(metrics::handler))
        .route("/v1/models/{model}", get(vllm::model).route_layer(key()))
        .route("/tokenize", post(vllm::tokenize).route_layer(failures()))
        .route(
            "/detokenize",
            post(vllm::detokenize).route_layer(failures()),
        )
        .route(
            "/v1/messages/count_tokens",
            post(messages::count_tokens)
                .route_layer(key())
                .route_layer(failures()),
        )
        .route("/version", get(vllm::version))
        .route("/ping", get(vllm::ping).post(vllm::ping))
        .route(
            "/v1/load_lora_adapter",
            post(vllm::load_lora_adapter)
                .route_layer(key())
                .route_layer(failures()),
        )
        .route(
            "/v1/unload_lora_adapter",
            post(vllm::unload_lora_adapter)
                .route_layer(key())
                .route_layer(failures()),
        )
        .route(
            "/reset_prefix_cache",
            post(vllm::reset_prefix_cache)
                .route_layer(key())
                .route_layer(failures()),
        )
        .fallback(|uri: Uri| async move { ApiError::route_not_found(uri.path()) })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(method.as_str(), uri.path())
        })
        .layer(body_limit)
        .layer(from_fn_with_state(state.clone(), layer::edge_limits))
        .layer(axum::middleware::from_fn(messages::anthropic_errors))
        .with_state(state)
}

/// The request's [`Received`] stamp, or now for a request that did not pass
/// [`layer::edge_limits`].
fn received_at(state: &AppState, received: Option<Extension<Received>>) -> SimTime {
    received.map_or_else(|| state.engine.clock().now(), |Extension(Received(t))| t)
}

/// Headers that override `nvext` routing fields, as Dynamo's `apply_header_routing_overrides`.
const WORKER_HEADERS: [&str; 2] = ["x-dynamo-worker-instance-id", "x-worker-instance-id"];

/// Applies the worker-pinning header to `nvext.backend_instance_id`.
fn apply_header_overrides(
    params: &mut GenerationParams,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    for name in WORKER_HEADERS {
        if let Some(value) = headers.get(name) {
            let id = value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("Invalid header '{name}': expected a worker id (an integer)"),
                        Some(name),
                    )
                })?;
            params.nvext.backend_instance_id = Some(id);
            return Ok(());
        }
    }
    Ok(())
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    received: Option<Extension<Received>>,
    charge: Option<Extension<Charge>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = received_at(&state, received);
    let charge = charge.and_then(|Extension(c)| c.take());
    let request = ChatRequest::parse(&body)?;
    let (stream, include_usage) = (request.params.stream, request.params.include_usage);
    let generation = start_chat(&state, &headers, received, charge, request).await?;
    respond(generation, stream, include_usage).await
}

/// Renders a chat request's conversation and starts its generation (shared by chat and the
/// routes that translate their bodies into a chat request, such as `/v1/messages`); `charge` is
/// the body's reservation in the in-flight budget.
async fn start_chat(
    state: &AppState,
    headers: &HeaderMap,
    received: SimTime,
    charge: Option<Reservation>,
    mut request: ChatRequest,
) -> Result<Generation, ApiError> {
    apply_header_overrides(&mut request.params, headers)?;
    let spec = request.params.speculative_prefill().then(|| SpecPrefill {
        messages: request.messages.clone(),
    });
    for message in &request.messages {
        budget::check_word_lengths(&message.content, "messages")?;
    }
    let text_bytes: usize = request.messages.iter().map(|m| m.content.len()).sum();
    let codec = Arc::clone(&state.config.codec);
    let messages = request.messages;
    let prompt = budget::off_runtime(text_bytes > budget::INLINE_TEXT_BYTES, move || {
        codec.render_chat(&messages, true)
    })
    .await?;
    let prompts = vec![PromptIn {
        tokens: prompt,
        echo: None,
    }];
    let request_in = RequestIn {
        endpoint: Endpoint::Chat,
        received,
        spec_prefill: spec,
        tools: Some(request.tools),
        charge,
    };
    start_generation(state, request.params, prompts, request_in).await
}

async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    received: Option<Extension<Received>>,
    charge: Option<Extension<Charge>>,
    ApiJson(body): ApiJson,
) -> Result<Response, ApiError> {
    let received = received_at(&state, received);
    let charge = charge.and_then(|Extension(c)| c.take());
    let mut request = CompletionRequest::parse(&body)?;
    apply_header_overrides(&mut request.params, &headers)?;
    if let Some(vocab_size) = state.config.codec.vocab_size() {
        for prompt in &request.prompts {
            if let PromptInput::Tokens(ids) = prompt {
                budget::check_token_ids(ids, vocab_size, "prompt")?;
            }
        }
    }
    for prompt in &request.prompts {
        if let PromptInput::Text(text) = prompt {
            budget::check_word_lengths(text, "prompt")?;
        }
    }
    let size: usize = request
        .prompts
        .iter()
        .map(|p| match p {
            PromptInput::Text(text) => text.len(),
            PromptInput::Tokens(ids) => ids.len() * 4,
        })
        .sum();
    let codec = Arc::clone(&state.config.codec);
    let echo = request.echo;
    let prompts = budget::off_runtime(size > budget::INLINE_TEXT_BYTES, move || {
        request
            .prompts
            .into_iter()
            .map(|prompt| {
                let (tokens, text) = match prompt {
                    PromptInput::Text(text) => (codec.encode(&text), text),
                    PromptInput::Tokens(ids) => {
                        let text = if echo {
                            codec.decode(&ids)
                        } else {
                            String::new()
                        };
                        (ids, text)
                    }
                };
                PromptIn {
                    tokens,
                    echo: echo.then_some(text),
                }
            })
            .collect()
    })
    .await?;
    let request_in = RequestIn {
        endpoint: Endpoint::Text,
        received,
        spec_prefill: None,
        tools: None,
        charge,
    };
    generate(&state, request.params, prompts, request_in).await
}

/// One prompt of a request: its token ids and, for a completions `echo`, its text.
struct PromptIn {
    tokens: Vec<u32>,
    echo: Option<String>,
}

/// What a request brings besides its shared parameters and prompts.
struct RequestIn {
    endpoint: Endpoint,
    /// When the server had the request whole ([`Received`]).
    received: SimTime,
    spec_prefill: Option<SpecPrefill>,
    tools: Option<Tools>,
    /// Its body's reservation in the in-flight budget ([`layer::Charge`]), grown to the whole
    /// request's work and held until its answer ends.
    charge: Option<Reservation>,
}

/// The output limit of one prompt: the request's, else the default cut to the context; a
/// prompt and limit beyond the context are a 400.
fn output_limit(
    config: &ServerConfig,
    requested: Option<usize>,
    prompt_len: usize,
    prompt_param: &str,
) -> Result<usize, ApiError> {
    let max_len = config.max_model_len;
    match requested {
        Some(n) if prompt_len + n > max_len => Err(ApiError::context_length(
            max_len,
            prompt_len,
            n,
            prompt_param,
        )),
        Some(n) => Ok(n),
        None if prompt_len >= max_len => Err(ApiError::context_length(
            max_len,
            prompt_len,
            1,
            prompt_param,
        )),
        None => Ok(config.default_max_tokens.min(max_len - prompt_len)),
    }
}

/// `charge` (the body's reservation, when the request has one) grown by `work` bytes: a 503
/// `server_overloaded` when the in-flight budget has no room for them.
pub(crate) fn reserve(
    state: &AppState,
    charge: Option<Reservation>,
    work: u64,
) -> Result<Reservation, ApiError> {
    let inflight = state.engine.inflight();
    let overloaded = |bytes| {
        state.metrics.over_inflight_bound.inc();
        ApiError::server_overloaded(bytes, inflight.limit())
    };
    match charge {
        Some(mut reservation) => {
            let bytes = reservation.bytes().saturating_add(work);
            if reservation.try_resize(bytes) {
                Ok(reservation)
            } else {
                Err(overloaded(bytes))
            }
        }
        None => inflight.try_reserve(work).ok_or_else(|| overloaded(work)),
    }
}

/// The seed of choice `index` of a request seeded `seed`: the request's own for the first, so
/// a one-choice answer depends on the seed alone.
fn choice_seed(seed: u64, index: usize) -> u64 {
    if index == 0 {
        seed
    } else {
        xxhash_rust::xxh3::xxh3_64_with_seed(&(index as u64).to_le_bytes(), seed)
    }
}

/// Starts a generation and answers it (streamed or whole).
async fn generate(
    state: &AppState,
    params: GenerationParams,
    prompts: Vec<PromptIn>,
    request: RequestIn,
) -> Result<Response, ApiError> {
    let (stream, include_usage) = (params.stream, params.include_usage);
    let generation = start_generation(state, params, prompts, request).await?;
    respond(generation, stream, include_usage).await
}

/// Checks limits, plans every choice's answer and submits them.
async fn start_generation(
    state: &AppState,
    params: GenerationParams,
    prompts: Vec<PromptIn>,
    request: RequestIn,
) -> Result<Generation, ApiError> {
    let received = request.received;
    let config = &state.config;
    let endpoint = request.endpoint;
    if !state.is_ready() {
        return Err(vllm::loading());
    }
    let adapter = if params.model == config.model_name {
        None
    } else {
        let adapter = state
            .lora
            .get(&params.model)
            .ok_or_else(|| ApiError::model_not_found(&params.model))?;
        state
            .metrics
            .lora_requests
            .get_or_create(&crate::metrics::AdapterLabel {
                adapter: adapter.name.clone(),
            })
            .inc();
        Some(adapter)
    };
    let pinned = match params.nvext.backend_instance_id {
        // A fleet worker runs what its listener received.
        _ if state.worker.is_some() => state.worker,
        None => None,
        Some(id) if id < config.cluster.num_workers as u64 => Some(WorkerId(id as u32)),
        Some(id) => {
            return Err(ApiError::from(crate::driver::SubmitError::NoSuchWorker {
                worker: id,
                num_workers: config.cluster.num_workers,
            }))
        }
    };
    let prompt_param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Text => "prompt",
    };
    let limits = prompts
        .iter()
        .map(|p| output_limit(config, params.max_tokens, p.tokens.len(), prompt_param))
        .collect::<Result<Vec<_>, _>>()?;
    let n = params.n;
    if n > 1 {
        // The choices of a prompt are sampled together, as parallel sampling on one engine:
        // their sequences must fit one worker's KV cache at once.
        let capacity = config.cluster.engine.num_gpu_blocks * config.cluster.engine.block_size;
        for (prompt, limit) in prompts.iter().zip(&limits) {
            let per_choice = prompt.tokens.len() + limit;
            if n.saturating_mul(per_choice) > capacity {
                return Err(ApiError::invalid(
                    format!(
                        "'n' = {n} choices of up to {per_choice} tokens each ({} prompt + {limit} \
                         output) need {} tokens of KV cache, more than a worker holds \
                         ({capacity}). Reduce 'n' or the output limit.",
                        prompt.tokens.len(),
                        n * per_choice
                    ),
                    Some("n"),
                )
                .with_code("n_too_large"));
            }
        }
    }
    if let Some(vocab_size) = config.codec.vocab_size() {
        budget::check_token_ids(&params.stop_token_ids, vocab_size, "stop_token_ids")?;
    }
    let logprobs_param = match endpoint {
        Endpoint::Chat => "top_logprobs",
        Endpoint::Text => "logprobs",
    };
    // Completions `echo` with `logprobs`: each choice carries its prompt's log-probabilities.
    let echo_logprobs = endpoint == Endpoint::Text && params.logprobs.is_some();
    let echoed: usize = prompts
        .iter()
        .filter(|p| echo_logprobs && p.echo.is_some())
        .map(|p| p.tokens.len().saturating_mul(n))
        .sum();
    budget::check_plan(&limits, n, params.logprobs, logprobs_param, echoed)?;
    // The whole request's estimated memory must fit in the server's in-flight budget, beside
    // its body's.
    let planned: usize = limits.iter().map(|l| l * n).sum();
    let prompt_lens = || prompts.iter().map(|p| p.tokens.len());
    let work = |output| budget::generation_bytes(prompt_lens(), n, output, params.logprobs, echoed);
    let body = request.charge.as_ref().map_or(0, Reservation::bytes);
    let mut reservation = reserve(state, request.charge, work(planned))?;
    let number = state.counter.fetch_add(1, Ordering::Relaxed);
    let seed = params.seed.unwrap_or_else(|| {
        config
            .seed
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(number)
    });
    let spec = AnswerSpec {
        limit: 0,
        ignore_eos: params.ignore_eos,
        min_tokens: params.min_tokens,
        stop: params.stop.clone(),
        stop_token_ids: params.stop_token_ids.clone(),
        include_stop_str: params.include_stop_str,
        reasoning_ratio: match endpoint {
            Endpoint::Chat => config.reasoning_ratio,
            Endpoint::Text => 0.0,
        },
        reasoning_format: config.reasoning_format,
        format: params.response_format.clone(),
        tools: request.tools.filter(|t| !t.tools.is_empty()),
        logprobs: params.logprobs,
        output_length: config.output_length,
        stop_probability: config.stop_probability,
        tool_call_probability: config.tool_call_probability,
    };
    let lora = adapter.as_ref().map(|a| {
        Arc::new(crate::kv_events::tokens::LoraTag {
            id: a.id,
            name: a.name.clone(),
        })
    });
    // Planning stops when the client leaves (this future is dropped) or the server shuts down.
    let cancel = state.stop_generations.child_token();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let codec = Arc::clone(&config.codec);
    let plan_limits = limits.clone();
    // JSON answers cost more a token (drawn, serialized and tokenized as a document).
    let json_answers = spec.tools.is_some() || spec.format != json_mode::ResponseFormat::Text;
    let inline_tokens = if json_answers {
        budget::INLINE_PLAN_TOKENS / 16
    } else {
        budget::INLINE_PLAN_TOKENS
    };
    let top = params.logprobs.unwrap_or(0);
    let echo_tokens: Vec<Option<Vec<u32>>> = prompts
        .iter()
        .map(|p| (echo_logprobs && p.echo.is_some()).then(|| p.tokens.clone()))
        .collect();
    let heavy = planned > inline_tokens || echoed > inline_tokens;
    let planned_work = budget::off_runtime(heavy, move || {
        let prompt_logprobs: Vec<Option<Arc<Vec<logprobs::TokenLogprob>>>> = echo_tokens
            .iter()
            .map(|tokens| {
                let tokens = tokens.as_ref()?;
                Some(Arc::new(logprobs::prompt_logprobs(
                    codec.as_ref(),
                    tokens,
                    seed,
                    top,
                )))
            })
            .collect();
        let mut answers = Vec::with_capacity(plan_limits.len() * n);
        for (p, &limit) in plan_limits.iter().enumerate() {
            let spec = AnswerSpec {
                limit,
                ..spec.clone()
            };
            for j in 0..n {
                if cancel.is_cancelled() {
                    return None;
                }
                let index = p * n + j;
                answers.push(Answer::plan(
                    &spec,
                    codec.as_ref(),
                    choice_seed(seed, index),
                ));
            }
        }
        Some((answers, prompt_logprobs))
    })
    .await?;
    let (answers, prompt_logprobs) = planned_work.ok_or_else(ApiError::shutting_down)?;
    // Answers that end themselves plan fewer tokens than their limits: the rest is given back.
    let answered: usize = answers.iter().map(|a: &Answer| a.tokens.len()).sum();
    reservation.try_resize(body.saturating_add(work(answered)));
    let mut answers = answers.into_iter();
    let mut choices = Vec::with_capacity(prompts.len() * n);
    for (p, (prompt, limit)) in prompts.iter().zip(limits).enumerate() {
        for j in 0..n {
            let index = p * n + j;
            let Some(answer) = answers.next() else {
                return Err(ApiError::shutting_down());
            };
            // Other tasks run between submissions of a large batch.
            tokio::task::consume_budget().await;
            let engine_request = Choice::engine_request(
                vllm::prompt_for(&prompt.tokens, state.block_size, adapter.as_ref()),
                &answer,
            );
            // An error drops the choices submitted so far, which cancels them.
            let options = SubmitOptions {
                pinned,
                lora: lora.clone(),
                // The engine's reason, as vLLM counts it: a tool call is a stop.
                finish_reason: match answer.finish_reason {
                    answer::FinishReason::Length => "length",
                    answer::FinishReason::Stop | answer::FinishReason::ToolCalls => "stop",
                },
                max_tokens: limit,
                received: Some(received),
            };
            let submission = state
                .engine
                .submit_as(engine_request, options)
                .await
                .map_err(|e| ApiError::from(e).for_prompt_field(prompt_param))?;
            let mut choice = Choice::new(index, submission, answer, prompt.tokens.len());
            choice.counts_prompt = j == 0;
            choice.echo = prompt.echo.clone();
            choice.prompt_logprobs = prompt_logprobs.get(p).cloned().flatten();
            choices.push(choice);
        }
    }
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Text => "cmpl",
    };
    let ready = generation::ReadyChoices::new(choices.len());
    Ok(Generation {
        header: Header {
            id: format!(
                "{prefix}-{:032x}",
                xxhash_rust::xxh3::xxh3_128_with_seed(&number.to_le_bytes(), state.started)
            ),
            created: unix_now(),
            model: params.model,
            endpoint,
        },
        choices,
        state: state.clone(),
        spec_prefill: request.spec_prefill,
        done: false,
        extras: ExtraFields {
            worker_id: params.nvext.wants("worker_id"),
            timing: params.nvext.wants("timing"),
        },
        logprobs: params.logprobs.is_some(),
        received,
        stop: state.stop_generations.child_token(),
        ready,
        _reservation: reservation,
    })
}

/// A started generation's answer: chat or completion chunks as SSE, or the whole object.
async fn respond(
    generation: Generation,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    if stream {
        let body = axum::body::Body::from_stream(generation::stream::sse_stream(
            generation,
            include_usage,
        ));
        Ok(sse_response(body))
    } else {
        let body = generation::collect::collect(generation).await?;
        Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response())
    }
}

/// A streamed answer's response: `body` as `text/event-stream`, never cached or buffered.
fn sse_response(body: axum::body::Body) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

async fn models(State(state): State<AppState>) -> Response {
    let name = &state.config.model_name;
    let mut data = vec![vllm::model_card(&state, name, name, None)];
    for adapter in state.lora.all() {
        data.push(vllm::model_card(
            &state,
            &adapter.name,
            &adapter.path,
            Some(name),
        ));
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn health(State(state): State<AppState>) -> Response {
    if !state.is_ready() {
        let body = Json(json!({"status": "loading"}));
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    } else if state.engine.is_alive() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        let body = Json(json!({"status": "unavailable", "reason": "the engine task has stopped"}));
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}
