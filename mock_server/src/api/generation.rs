//! One generation as the client sees it: the engine's outputs ([`Event`]s) become reasoning and
//! content deltas, then chat or text-completion chunks, SSE frames or one final response object.
//!
//! Times in the response `nvext.timing` are the engine's own stamps (simulated time, mapped to
//! the wall clock by the driver's [`crate::driver::SimClock`]): `ttft_ms` and `total_time_ms`
//! run from the engine's submission to the first and last token, exactly as the `/metrics`
//! TTFT and end-to-end histograms measure them.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};
use servesim::cluster::Output;
use servesim::ids::WorkerId;
use servesim::request::{EngineRequest, Prompt};
use servesim::time::SimTime;

use super::error::ApiError;
use super::AppState;
use crate::config::ReasoningFormat;
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

/// One generation request in flight, from submission to its last chunk: the engine's events
/// for it and what the response needs (ids, token counts, cache hits, timing stamps).
#[derive(Debug)]
pub struct Generation {
    /// Ids and names.
    pub header: Header,
    /// The engine request's events.
    pub submission: Submission,
    /// Server state (codec, metrics, engine handle).
    pub state: AppState,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// The first this many output tokens are reasoning.
    pub reasoning_tokens: usize,
    /// Output tokens received so far.
    pub completion_tokens: usize,
    /// Prompt tokens reused from the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    /// Set when the conversation's next turn should find its prefix warm.
    pub spec_prefill: Option<SpecPrefill>,
    /// Content text so far (kept only for speculative prefill).
    pub content: String,
    /// The request finished (or failed).
    pub done: bool,
    /// Response `nvext` opt-ins.
    pub extras: ExtraFields,
    /// The worker that admitted it.
    pub worker: Option<WorkerId>,
    /// When the handler received it: the wall clock read through the driver's clock (so it
    /// precedes the submission on the same time line).
    pub received: SimTime,
    /// When the engine emitted the first token (its own stamp).
    pub first_token: Option<SimTime>,
    /// When the engine emitted the latest token (its own stamp).
    pub last_token: Option<SimTime>,
    /// Cancelled at the server's shutdown deadline: the generation then ends with an error.
    pub stop: tokio_util::sync::CancellationToken,
}

/// The next thing to tell the client.
#[derive(Debug)]
pub enum Step {
    /// Text for one output token.
    Delta {
        /// Reasoning text (separate format).
        reasoning: Option<String>,
        /// Content text.
        content: Option<String>,
    },
    /// Generation ended at the output limit.
    Finished,
    /// Generation failed.
    Error(ApiError),
}

impl Generation {
    /// Waits for the next client-visible step.
    pub async fn next(&mut self) -> Step {
        loop {
            let event = tokio::select! {
                biased;
                event = self.submission.events.recv() => event,
                () = self.stop.cancelled() => {
                    // Shutdown deadline: the submission is dropped unfinished, which cancels
                    // the engine request.
                    self.done = true;
                    return Step::Error(ApiError::shutting_down());
                }
            };
            let Some(event) = event else {
                self.done = true;
                self.submission.mark_done();
                return Step::Error(ApiError::from(crate::driver::SubmitError::Stopped));
            };
            let output = match event {
                Event::Output(output) => output,
                Event::Stalled => {
                    // The driver cancelled it already (its KV is freed).
                    self.done = true;
                    self.submission.mark_done();
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
                    self.cached_tokens.get_or_insert(reused_tokens);
                    self.worker = Some(worker);
                }
                // Not visible to the client (the hand-off shows in the cluster's counters).
                Output::Preempted { .. } | Output::KvTransfer { .. } => {}
                Output::Token {
                    token, index, time, ..
                } => {
                    self.completion_tokens += 1;
                    self.first_token.get_or_insert(time);
                    self.last_token = Some(time);
                    return self.delta(token, index);
                }
                Output::Finished { .. } => {
                    self.finish();
                    return Step::Finished;
                }
                Output::Rejected { reason, .. } => {
                    self.done = true;
                    self.submission.mark_done();
                    return Step::Error(reason.into());
                }
            }
        }
    }

    fn delta(&mut self, token: u32, index: usize) -> Step {
        let word = self.state.config.codec.decode(&[token]);
        let step = if index <= self.reasoning_tokens {
            match self.state.config.reasoning_format {
                ReasoningFormat::Separate => Step::Delta {
                    reasoning: Some(word),
                    content: None,
                },
                ReasoningFormat::Inline => {
                    let open = if index == 1 { "<think>" } else { "" };
                    let close = if index == self.reasoning_tokens {
                        "</think>"
                    } else {
                        ""
                    };
                    Step::Delta {
                        reasoning: None,
                        content: Some(format!("{open}{word}{close}")),
                    }
                }
            }
        } else {
            Step::Delta {
                reasoning: None,
                content: Some(word),
            }
        };
        if self.spec_prefill.is_some() {
            if let Step::Delta {
                content: Some(c), ..
            } = &step
            {
                self.content.push_str(c);
            }
        }
        step
    }

    fn finish(&mut self) {
        self.done = true;
        self.submission.mark_done();
        if let Some(spec) = self.spec_prefill.take() {
            let mut messages = spec.messages;
            messages.push(ChatMessage::new(
                Role::Assistant,
                std::mem::take(&mut self.content),
            ));
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

    /// The response `nvext` object, when the request opted into any of its fields.
    pub fn nvext(&self) -> Option<Value> {
        if self.extras == ExtraFields::default() {
            return None;
        }
        let mut nvext = serde_json::Map::new();
        if self.extras.worker_id {
            let w = self.worker.map(|w| w.0);
            nvext.insert(
                "worker_id".into(),
                json!({"prefill_worker_id": w, "decode_worker_id": w}),
            );
        }
        if self.extras.timing {
            // One time line for all four: the driver's clock. Durations run from the
            // submission, as the `/metrics` histograms do, so they are the engine's model exactly.
            let submitted = self.submission.submitted;
            let since =
                |t: Option<SimTime>| t.map(|t| t.saturating_since(submitted).as_millis_f64());
            let clock = self.state.engine.clock();
            let unix = |t: SimTime| clock.unix_ms(t).round() as u64;
            nvext.insert(
                "timing".into(),
                json!({
                    "request_received_ms": unix(self.received),
                    "ttft_ms": since(self.first_token),
                    "total_time_ms": since(self.last_token),
                    "first_token_ms": self.first_token.map(unix),
                    "last_token_ms": self.last_token.map(unix),
                }),
            );
        }
        Some(Value::Object(nvext))
    }

    /// The `usage` object.
    pub fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens.unwrap_or(0)},
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

    fn choice_chunk(&self, delta: Value, text: &str, finish_reason: Option<&str>) -> Value {
        let choice = match self.header.endpoint {
            Endpoint::Chat => json!({
                "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason,
            }),
            Endpoint::Text => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason,
            }),
        };
        self.chunk(json!([choice]))
    }

    /// The opening `delta.role = "assistant"` chunk (chat only).
    pub fn role_chunk(&self) -> Option<Value> {
        (self.header.endpoint == Endpoint::Chat)
            .then(|| self.choice_chunk(json!({"role": "assistant", "content": ""}), "", None))
    }

    /// The chunk of one step's text.
    pub fn delta_chunk(&self, reasoning: Option<String>, content: Option<String>) -> Value {
        let text = format!(
            "{}{}",
            reasoning.as_deref().unwrap_or(""),
            content.as_deref().unwrap_or("")
        );
        let mut delta = serde_json::Map::new();
        if let Some(r) = reasoning {
            delta.insert("reasoning_content".into(), Value::String(r));
        }
        if let Some(c) = content {
            delta.insert("content".into(), Value::String(c));
        }
        self.choice_chunk(Value::Object(delta), &text, None)
    }

    /// The chunk carrying `finish_reason` (and the response `nvext`, if asked for).
    pub fn finish_chunk(&self) -> Value {
        let mut chunk = self.choice_chunk(json!({}), "", Some("length"));
        if let Some(nvext) = self.nvext() {
            chunk["nvext"] = nvext;
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

/// The SSE body of a streamed generation. Dropping it (client gone) cancels the engine request.
pub fn sse_stream(
    generation: Generation,
    include_usage: bool,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let mut pending = VecDeque::new();
    if let Some(role) = generation.role_chunk() {
        pending.push_back(frame(&role));
    }
    futures_util::stream::unfold(
        (generation, pending),
        move |(mut generation, mut pending)| async move {
            loop {
                if let Some(bytes) = pending.pop_front() {
                    return Some((Ok(bytes), (generation, pending)));
                }
                if generation.done {
                    return None;
                }
                match generation.next().await {
                    Step::Delta { reasoning, content } => {
                        pending.push_back(frame(&generation.delta_chunk(reasoning, content)));
                    }
                    Step::Finished => {
                        pending.push_back(frame(&generation.finish_chunk()));
                        if include_usage {
                            pending.push_back(frame(&generation.usage_chunk()));
                        }
                        pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    }
                    Step::Error(e) => {
                        generation.state.metrics.http_failures.inc();
                        pending.push_back(frame(&e.body()));
                        pending.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                    }
                }
            }
        },
    )
}

/// Runs a generation to the end and returns the single response object.
pub async fn collect(mut generation: Generation) -> Result<Value, ApiError> {
    let mut reasoning = String::new();
    let mut content = String::new();
    loop {
        match generation.next().await {
            Step::Delta {
                reasoning: r,
                content: c,
            } => {
                reasoning.push_str(r.as_deref().unwrap_or(""));
                content.push_str(c.as_deref().unwrap_or(""));
            }
            Step::Finished => break,
            Step::Error(e) => return Err(e),
        }
    }
    let choice = match generation.header.endpoint {
        Endpoint::Chat => {
            let mut message = json!({"role": "assistant", "content": content});
            if !reasoning.is_empty() {
                message["reasoning_content"] = Value::String(reasoning);
            }
            json!({"index": 0, "message": message, "logprobs": null, "finish_reason": "length"})
        }
        Endpoint::Text => json!({
            "index": 0, "text": content, "logprobs": null, "finish_reason": "length",
        }),
    };
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
        "choices": [choice],
        "usage": generation.usage(),
    });
    if let Some(nvext) = generation.nvext() {
        response["nvext"] = nvext;
    }
    Ok(response)
}
