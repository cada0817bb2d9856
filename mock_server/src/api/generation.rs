//! One generation as the client sees it: the engine's outputs ([`Event`]s) for each of its
//! choices become the planned pieces of their [`Answer`]s (reasoning and content deltas,
//! tool-call fragments, log-probabilities), then chat or text-completion chunks, SSE frames or
//! one final response object.
//!
//! A generation has one choice per prompt and `n` (each its own engine request); chunks carry
//! the choice's `index`, usage sums over them (a prompt counted once however many choices it
//! has), and the stream ends after every choice has its `finish_reason` chunk.
//!
//! Times in the response `nvext.timing` are the engine's own stamps (simulated time, mapped to
//! the wall clock by the driver's [`crate::driver::SimClock`]): `ttft_ms` and `total_time_ms`
//! run from the engine's submission to the first and last token, exactly as the `/metrics`
//! TTFT and end-to-end histograms measure them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::task::Poll;

use axum::body::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};
use servesim::cluster::Output;
use servesim::ids::WorkerId;
use servesim::request::{EngineRequest, Prompt};
use servesim::time::SimTime;

use super::answer::{Answer, Piece};
use super::error::ApiError;
use super::logprobs::{chat_logprobs, completion_logprobs};
use super::tools::render_calls;
use super::AppState;
use crate::driver::{Event, Submission};
use crate::text::{ChatMessage, Role};

/// Sent as `system_fingerprint` on every response.
pub const SYSTEM_FINGERPRINT: &str = "fp_mockserve";

/// Which OpenAI endpoint a request came to: chat or legacy text completion (their chunks and
/// response objects differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// Response identity shared by every chunk.
#[derive(Clone, Debug)]
pub struct Header {
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Echoed model name.
    pub model: String,
    /// Which endpoint, hence which object shapes.
    pub endpoint: Endpoint,
}

/// What happens after the last chunk, when the request asked for speculative prefill.
#[derive(Clone, Debug)]
pub struct SpecPrefill {
    /// The request's messages; the answer is appended as an assistant message.
    pub messages: Vec<ChatMessage>,
}

/// Which response `nvext` fields the request opted into (its `nvext.extra_fields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtraFields {
    /// `worker_id`: the serving worker.
    pub worker_id: bool,
    /// `timing`: received, first and last token times.
    pub timing: bool,
}

/// One choice in flight: its engine request's events and the answer they run.
#[derive(Debug)]
pub struct Choice {
    /// `choices[].index`: prompt number × n + the choice's number within its prompt.
    pub index: usize,
    /// The engine request's events.
    pub submission: Submission,
    /// What the choice answers, token by token.
    pub answer: Answer,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// The first choice of its prompt: its prompt (and cache hit) counts in `usage`.
    pub counts_prompt: bool,
    /// Completions `echo`: the prompt's text, sent before the first text of the answer.
    pub echo: Option<String>,
    /// Output tokens received so far.
    pub completion_tokens: usize,
    /// Characters of text sent so far (completions `logprobs.text_offset`).
    pub text_chars: usize,
    /// Prompt tokens reused from the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    /// The worker that admitted it.
    pub worker: Option<WorkerId>,
    /// When the engine emitted its first token (its own stamp).
    pub first_token: Option<SimTime>,
    /// When the engine emitted its latest token (its own stamp).
    pub last_token: Option<SimTime>,
    /// Its engine request finished.
    pub done: bool,
}

impl Choice {
    /// A choice over a submitted engine request.
    pub fn new(index: usize, submission: Submission, answer: Answer, prompt_tokens: usize) -> Self {
        Choice {
            index,
            submission,
            answer,
            prompt_tokens,
            counts_prompt: true,
            echo: None,
            completion_tokens: 0,
            text_chars: 0,
            cached_tokens: None,
            worker: None,
            first_token: None,
            last_token: None,
            done: false,
        }
    }

    /// The engine request that runs `answer` after `prompt`.
    pub fn engine_request(prompt: Prompt, answer: &Answer) -> EngineRequest {
        EngineRequest {
            prompt,
            max_output_tokens: answer.tokens.len(),
            output_tokens: answer.tokens.clone(),
        }
    }
}

/// One generation request in flight, from submission to its last chunk: its choices' engine
/// events and what the response needs (ids, token counts, cache hits, timing stamps).
#[derive(Debug)]
pub struct Generation {
    /// Ids and names.
    pub header: Header,
    /// The choices, by index.
    pub choices: Vec<Choice>,
    /// Server state (codec, metrics, engine handle).
    pub state: AppState,
    /// Set when the conversation's next turn should find its prefix warm.
    pub spec_prefill: Option<SpecPrefill>,
    /// Every choice finished (or the generation failed).
    pub done: bool,
    /// Response `nvext` opt-ins.
    pub extras: ExtraFields,
    /// The request asked for log-probabilities (the whole response then has a `logprobs`
    /// object per choice, even an empty one).
    pub logprobs: bool,
    /// When the handler received it: the wall clock read through the driver's clock (so it
    /// precedes the submission on the same time line).
    pub received: SimTime,
    /// Cancelled at the server's shutdown deadline: the generation then ends with an error.
    pub stop: tokio_util::sync::CancellationToken,
}

/// The next thing to tell the client.
#[derive(Debug)]
pub enum Step {
    /// A choice's output token `token` (0-based) arrived: its piece is ready.
    Token {
        /// Index into [`Generation::choices`].
        choice: usize,
        /// Index into that choice's answer pieces.
        token: usize,
    },
    /// A choice ended (with its planned finish reason).
    Finished {
        /// Index into [`Generation::choices`].
        choice: usize,
    },
    /// Generation failed.
    Error(ApiError),
}

impl Generation {
    /// Waits for the next client-visible step.
    pub async fn next(&mut self) -> Step {
        loop {
            let choices = &mut self.choices;
            let stop = &self.stop;
            let (i, event) = tokio::select! {
                biased;
                () = stop.cancelled() => {
                    // Shutdown deadline: the submissions are dropped unfinished, which cancels
                    // the engine requests.
                    self.done = true;
                    return Step::Error(ApiError::shutting_down());
                }
                next = std::future::poll_fn(|cx| {
                    for (i, choice) in choices.iter_mut().enumerate() {
                        if choice.done {
                            continue;
                        }
                        if let Poll::Ready(event) = choice.submission.events.poll_recv(cx) {
                            return Poll::Ready((i, event));
                        }
                    }
                    Poll::Pending
                }) => next,
            };
            let choice = &mut self.choices[i];
            let Some(event) = event else {
                self.fail();
                return Step::Error(ApiError::from(crate::driver::SubmitError::Stopped));
            };
            let output = match event {
                Event::Output(output) => output,
                Event::Stalled => {
                    // The driver cancelled it already (its KV is freed).
                    self.fail();
                    return Step::Error(ApiError {
                        status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        message: "The engine made no progress on this request and cancelled it."
                            .into(),
                        kind: "server_error",
                        param: None,
                        code: Some("engine_stalled"),
                    });
                }
            };
            match output {
                Output::Admitted {
                    reused_tokens,
                    worker,
                    ..
                } => {
                    choice.cached_tokens.get_or_insert(reused_tokens);
                    choice.worker = Some(worker);
                }
                // Not visible to the client (the hand-off shows in the cluster's counters).
                Output::Preempted { .. } | Output::KvTransfer { .. } => {}
                Output::Token { index, time, .. } => {
                    choice.completion_tokens += 1;
                    choice.first_token.get_or_insert(time);
                    choice.last_token = Some(time);
                    return Step::Token {
                        choice: i,
                        token: index.saturating_sub(1),
                    };
                }
                Output::Finished { .. } => {
                    choice.done = true;
                    choice.submission.mark_done();
                    if self.choices.iter().all(|c| c.done) {
                        self.finish();
                    }
                    return Step::Finished { choice: i };
                }
                Output::Rejected { reason, .. } => {
                    self.fail();
                    return Step::Error(reason.into());
                }
            }
        }
    }

    /// Ends the generation after an error: the request that failed is gone from the engine
    /// already; the others are cancelled when their submissions drop.
    fn fail(&mut self) {
        self.done = true;
    }

    fn finish(&mut self) {
        self.done = true;
        if let Some(spec) = self.spec_prefill.take() {
            let Some(first) = self.choices.first() else {
                return;
            };
            let content = if first.answer.tool_calls.is_empty() {
                first.answer.content()
            } else {
                render_calls(&first.answer.tool_calls)
            };
            let mut messages = spec.messages;
            messages.push(ChatMessage::new(Role::Assistant, content));
            let tokens = self.state.config.codec.render_chat(&messages, false);
            let request = EngineRequest {
                prompt: Prompt::from_tokens(&tokens, self.state.block_size),
                max_output_tokens: 1,
                output_tokens: Vec::new(),
            };
            // False only while shutting down: then there is no next turn to warm.
            let _ = self.state.engine.submit_speculative(request);
        }
    }

    /// The response `nvext` object, when the request opted into any of its fields (worker and
    /// submission of the first choice; first and last token over all choices).
    pub fn nvext(&self) -> Option<Value> {
        if self.extras == ExtraFields::default() {
            return None;
        }
        let first = self.choices.first()?;
        let mut nvext = serde_json::Map::new();
        if self.extras.worker_id {
            let w = first.worker.map(|w| w.0);
            nvext.insert(
                "worker_id".into(),
                json!({"prefill_worker_id": w, "decode_worker_id": w}),
            );
        }
        if self.extras.timing {
            // One time line for all four: the driver's clock. Durations run from the
            // submission, as the `/metrics` histograms do, so they are the engine's model exactly.
            let submitted = first.submission.submitted;
            let first_token = self.choices.iter().filter_map(|c| c.first_token).min();
            let last_token = self.choices.iter().filter_map(|c| c.last_token).max();
            let since =
                |t: Option<SimTime>| t.map(|t| t.saturating_since(submitted).as_millis_f64());
            let clock = self.state.engine.clock();
            let unix = |t: SimTime| clock.unix_ms(t).round() as u64;
            nvext.insert(
                "timing".into(),
                json!({
                    "request_received_ms": unix(self.received),
                    "ttft_ms": since(first_token),
                    "total_time_ms": since(last_token),
                    "first_token_ms": first_token.map(unix),
                    "last_token_ms": last_token.map(unix),
                }),
            );
        }
        Some(Value::Object(nvext))
    }

    /// The `usage` object: prompts counted once each, completions summed over choices.
    pub fn usage(&self) -> Value {
        let counted = self.choices.iter().filter(|c| c.counts_prompt);
        let prompt: usize = counted.clone().map(|c| c.prompt_tokens).sum();
        let cached: usize = counted.map(|c| c.cached_tokens.unwrap_or(0)).sum();
        let completion: usize = self.choices.iter().map(|c| c.completion_tokens).sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn chunk(&self, choices: Value) -> Value {
        let object = match self.header.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Text => "text_completion",
        };
        json!({
            "id": self.header.id,
            "object": object,
            "created": self.header.created,
            "model": self.header.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": choices,
        })
    }

    /// The opening `delta.role = "assistant"` chunks, one per choice (chat only).
    pub fn role_chunks(&self) -> Vec<Value> {
        if self.header.endpoint != Endpoint::Chat {
            return Vec::new();
        }
        self.choices
            .iter()
            .map(|c| {
                self.chunk(json!([{
                    "index": c.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                }]))
            })
            .collect()
    }

    /// The chunks of one token's piece: none for a token that shows nothing (one of a stop
    /// string), two for the first fragment of a tool call (its id and name, then arguments).
    pub fn token_chunks(&mut self, choice: usize, token: usize) -> Vec<Value> {
        let endpoint = self.header.endpoint;
        let Some(c) = self.choices.get_mut(choice) else {
            return Vec::new();
        };
        let piece = c.answer.pieces.get(token).cloned().unwrap_or_default();
        let index = c.index;
        let mut out = Vec::new();
        match endpoint {
            Endpoint::Chat => {
                let tool = piece
                    .tool
                    .as_ref()
                    .and_then(|f| Some((f, c.answer.tool_calls.get(f.call)?)));
                if let Some((fragment, call)) = tool {
                    if fragment.first {
                        out.push(json!({"tool_calls": [{
                            "index": fragment.call, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }]}));
                    }
                    if !fragment.arguments.is_empty() {
                        out.push(json!({"tool_calls": [{
                            "index": fragment.call,
                            "function": {"arguments": fragment.arguments},
                        }]}));
                    }
                } else if !piece.is_empty() {
                    let mut delta = serde_json::Map::new();
                    if let Some(r) = &piece.reasoning {
                        delta.insert("reasoning_content".into(), Value::String(r.clone()));
                    }
                    if let Some(text) = &piece.content {
                        delta.insert("content".into(), Value::String(text.clone()));
                    }
                    out.push(Value::Object(delta));
                }
                let logprobs = piece
                    .logprob
                    .as_ref()
                    .map_or(Value::Null, |lp| chat_logprobs(&[lp]));
                out.into_iter()
                    .map(|delta| {
                        self.chunk(json!([{
                            "index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": null,
                        }]))
                    })
                    .collect()
            }
            Endpoint::Text => {
                let echo = if piece.is_empty() {
                    None
                } else {
                    c.echo.take()
                };
                let answer = piece.content.clone().unwrap_or_default();
                if answer.is_empty() && echo.is_none() {
                    return Vec::new();
                }
                let echo = echo.unwrap_or_default();
                let offset = c.text_chars + echo.chars().count();
                c.text_chars = offset + answer.chars().count();
                let logprobs = piece
                    .logprob
                    .as_ref()
                    .map_or(Value::Null, |lp| completion_logprobs(&[lp], offset));
                vec![self.chunk(json!([{
                    "index": index, "text": format!("{echo}{answer}"), "logprobs": logprobs,
                    "finish_reason": null,
                }]))]
            }
        }
    }

    /// The chunk carrying a choice's `finish_reason` (with a completions echo not sent yet,
    /// and, once every choice is done, the response `nvext` if asked for).
    pub fn finish_chunk(&mut self, choice: usize) -> Value {
        let endpoint = self.header.endpoint;
        let Some(c) = self.choices.get_mut(choice) else {
            return Value::Null;
        };
        let finish = c.answer.finish_reason.as_str();
        let stop_reason = c.answer.stop_reason.clone();
        let choice = match endpoint {
            Endpoint::Chat => json!({
                "index": c.index, "delta": {}, "logprobs": null, "finish_reason": finish,
                "stop_reason": stop_reason,
            }),
            Endpoint::Text => json!({
                "index": c.index, "text": c.echo.take().unwrap_or_default(), "logprobs": null,
                "finish_reason": finish, "stop_reason": stop_reason,
            }),
        };
        let mut chunk = self.chunk(json!([choice]));
        if self.done {
            if let Some(nvext) = self.nvext() {
                chunk["nvext"] = nvext;
            }
        }
        chunk
    }

    /// The `choices: []` chunk with usage.
    pub fn usage_chunk(&self) -> Value {
        let mut chunk = self.chunk(json!([]));
        chunk["usage"] = self.usage();
        chunk
    }
}

fn frame(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The SSE body of a streamed generation. Dropping it (client gone) cancels the engine requests.
pub fn sse_stream(
    generation: Generation,
    include_usage: bool,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let pending: VecDeque<Bytes> = generation.role_chunks().iter().map(frame).collect();
    futures_util::stream::unfold(
        (generation, pending, false),
        move |(mut generation, mut pending, mut ended)| async move {
            loop {
                if let Some(bytes) = pending.pop_front() {
                    return Some((Ok(bytes), (generation, pending, ended)));
                }
                if ended {
                    return None;
                }
                match generation.next().await {
                    Step::Token { choice, token } => {
                        pending.extend(generation.token_chunks(choice, token).iter().map(frame));
                    }
                    Step::Finished { choice } => {
                        pending.push_back(frame(&generation.finish_chunk(choice)));
                        if generation.done {
                            ended = true;
                            if include_usage {
                                pending.push_back(frame(&generation.usage_chunk()));
                            }
                            pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        }
                    }
                    Step::Error(e) => {
                        ended = true;
                        generation.state.metrics.http_failures.inc();
                        pending.push_back(frame(&e.body()));
                        pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    }
                }
            }
        },
    )
}

/// What the whole response shows of one choice.
#[derive(Default)]
struct Collected {
    reasoning: String,
    content: String,
    logprobs: Vec<super::logprobs::TokenLogprob>,
}

/// Runs a generation to the end and returns the single response object.
pub async fn collect(mut generation: Generation) -> Result<Value, ApiError> {
    let mut collected: Vec<Collected> = generation
        .choices
        .iter()
        .map(|_| Collected::default())
        .collect();
    loop {
        match generation.next().await {
            Step::Token { choice, token } => {
                let piece: Piece = generation.choices[choice]
                    .answer
                    .pieces
                    .get(token)
                    .cloned()
                    .unwrap_or_default();
                let out = &mut collected[choice];
                out.reasoning
                    .push_str(piece.reasoning.as_deref().unwrap_or(""));
                out.content.push_str(piece.content.as_deref().unwrap_or(""));
                out.logprobs.extend(piece.logprob);
            }
            Step::Finished { .. } => {
                if generation.done {
                    break;
                }
            }
            Step::Error(e) => return Err(e),
        }
    }
    let logprobs_asked = generation.logprobs;
    let choices: Vec<Value> = generation
        .choices
        .iter()
        .zip(collected)
        .map(|(c, out)| {
            let finish = c.answer.finish_reason.as_str();
            let lps: Vec<&super::logprobs::TokenLogprob> = out.logprobs.iter().collect();
            match generation.header.endpoint {
                Endpoint::Chat => {
                    let mut message = json!({"role": "assistant", "content": out.content});
                    if !out.reasoning.is_empty() {
                        message["reasoning_content"] = Value::String(out.reasoning);
                    }
                    if !c.answer.tool_calls.is_empty() {
                        message["content"] = Value::Null;
                        message["tool_calls"] = c
                            .answer
                            .tool_calls
                            .iter()
                            .map(|call| {
                                json!({"id": call.id, "type": "function", "function": {
                                    "name": call.name, "arguments": call.arguments}})
                            })
                            .collect();
                    }
                    let logprobs = if logprobs_asked {
                        chat_logprobs(&lps)
                    } else {
                        Value::Null
                    };
                    json!({"index": c.index, "message": message, "logprobs": logprobs,
                           "finish_reason": finish, "stop_reason": c.answer.stop_reason})
                }
                Endpoint::Text => {
                    let echo = c.echo.clone().unwrap_or_default();
                    let logprobs = if logprobs_asked {
                        completion_logprobs(&lps, echo.chars().count())
                    } else {
                        Value::Null
                    };
                    json!({"index": c.index, "text": format!("{echo}{}", out.content),
                           "logprobs": logprobs, "finish_reason": finish,
                           "stop_reason": c.answer.stop_reason})
                }
            }
        })
        .collect();
    let object = match generation.header.endpoint {
        Endpoint::Chat => "chat.completion",
        Endpoint::Text => "text_completion",
    };
    let mut response = json!({
        "id": generation.header.id,
        "object": object,
        "created": generation.header.created,
        "model": generation.header.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
        "usage": generation.usage(),
    });
    if let Some(nvext) = generation.nvext() {
        response["nvext"] = nvext;
    }
    Ok(response)
}
