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

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use axum::body::Bytes;
use futures_util::Stream;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};
use servesim::cluster::Output;
use servesim::ids::WorkerId;
use servesim::request::{EngineRequest, Prompt};
use servesim::time::SimTime;

use super::answer::Answer;
use super::error::ApiError;
use super::logprobs::{chat_logprobs, completion_logprobs, TokenLogprob};
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
    /// Which choices may have an event waiting: only those are polled, so a step costs the
    /// same however many choices a request has (a batch of 20,000 prompts stays linear).
    pub ready: ReadyChoices,
}

/// The choices of a [`Generation`] whose event channels were woken since they were last found
/// empty, lowest index first, and how many choices are still running.
///
/// Each choice's channel is polled with a waker of its own, which puts the choice back in the
/// set and wakes the generation's task; a choice outside the set has nothing to read.
#[derive(Debug)]
pub struct ReadyChoices {
    shared: Arc<ReadyShared>,
    wakers: Vec<Waker>,
    /// Choices not finished yet.
    running: usize,
}

#[derive(Debug, Default)]
struct ReadyShared {
    /// The woken choices. A std Mutex: every section is a set insert or pop, never across an
    /// `.await`.
    set: Mutex<BTreeSet<usize>>,
    /// The generation's task.
    task: futures_util::task::AtomicWaker,
}

/// Wakes one choice: puts it in the ready set and wakes the generation's task.
struct ChoiceWaker {
    index: usize,
    shared: Arc<ReadyShared>,
}

impl Wake for ChoiceWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.insert(self.index);
        self.shared.task.wake();
    }
}

impl ReadyShared {
    fn insert(&self, index: usize) {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(index);
    }

    /// The lowest woken choice numbered `from` or more, taken out of the set.
    fn pop_from(&self, from: usize) -> Option<usize> {
        let mut set = self
            .set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = set.range(from..).next().copied()?;
        set.remove(&first);
        Some(first)
    }
}

impl ReadyChoices {
    /// The set for `choices` choices, all of them ready to be polled once.
    pub fn new(choices: usize) -> ReadyChoices {
        let shared = Arc::new(ReadyShared {
            set: Mutex::new((0..choices).collect()),
            task: futures_util::task::AtomicWaker::new(),
        });
        let wakers = (0..choices)
            .map(|index| {
                Waker::from(Arc::new(ChoiceWaker {
                    index,
                    shared: Arc::clone(&shared),
                }))
            })
            .collect();
        ReadyChoices {
            shared,
            wakers,
            running: choices,
        }
    }

    /// The next event of the lowest-numbered choice that has one: `Ready((choice, event))`,
    /// `event` being `None` when its channel closed. `Pending` when none has, with the task
    /// (`task`, when given) to be woken as soon as one has.
    fn poll_event(
        &self,
        choices: &mut [Choice],
        task: Option<&Waker>,
    ) -> Poll<(usize, Option<Event>)> {
        if let Some(task) = task {
            // Registered before the set is read, so a wake after the read reaches this task.
            self.shared.task.register(task);
        }
        // One pass in index order: a choice that wakes itself while polled (tokio's budget
        // for the task is spent) is polled again on the next call, not in a loop here.
        let mut from = 0;
        while let Some(i) = self.shared.pop_from(from) {
            from = i + 1;
            let (Some(choice), Some(waker)) = (choices.get_mut(i), self.wakers.get(i)) else {
                continue;
            };
            if choice.done {
                continue;
            }
            let mut cx = Context::from_waker(waker);
            if let Poll::Ready(event) = choice.submission.events.poll_recv(&mut cx) {
                // More may be queued behind it: the choice stays in the set.
                self.shared.insert(i);
                return Poll::Ready((i, event));
            }
        }
        Poll::Pending
    }
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
            let ready = &self.ready;
            let (i, event) = tokio::select! {
                biased;
                () = stop.cancelled() => {
                    // Shutdown deadline: the submissions are dropped unfinished, which cancels
                    // the engine requests.
                    self.done = true;
                    return Step::Error(ApiError::shutting_down());
                }
                next = std::future::poll_fn(|cx| {
                    ready.poll_event(choices, Some(cx.waker()))
                }) => next,
            };
            if let Some(step) = self.on_event(i, event) {
                return step;
            }
        }
    }

    /// The next client-visible step if one is ready now, without waiting: what [`next`]
    /// would return at once (`None` when it would wait, or at the shutdown deadline, which
    /// [`next`] reports).
    ///
    /// [`next`]: Generation::next
    pub fn try_next(&mut self) -> Option<Step> {
        loop {
            if self.done || self.stop.is_cancelled() {
                return None;
            }
            let Poll::Ready((i, event)) = self.ready.poll_event(&mut self.choices, None) else {
                return None;
            };
            if let Some(step) = self.on_event(i, event) {
                return Some(step);
            }
        }
    }

    /// What choice `i`'s engine event (`None`: its channel closed) means to the client, if
    /// anything.
    fn on_event(&mut self, i: usize, event: Option<Event>) -> Option<Step> {
        let choice = &mut self.choices[i];
        let Some(event) = event else {
            self.fail();
            return Some(Step::Error(ApiError::from(
                crate::driver::SubmitError::Stopped,
            )));
        };
        let output = match event {
            Event::Output(output) => output,
            Event::Stalled => {
                // The driver cancelled it already (its KV is freed).
                self.fail();
                return Some(Step::Error(ApiError {
                    status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    message: "The engine made no progress on this request and cancelled it.".into(),
                    kind: "server_error",
                    param: None,
                    code: Some("engine_stalled"),
                }));
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
                None
            }
            // Not visible to the client (the hand-off shows in the cluster's counters).
            Output::Preempted { .. } | Output::KvTransfer { .. } => None,
            Output::Token { index, time, .. } => {
                let late = self.state.engine.clock().now().saturating_since(time);
                self.state
                    .metrics
                    .token_sent(Duration::from_micros(late.as_micros()));
                choice.completion_tokens += 1;
                choice.first_token.get_or_insert(time);
                choice.last_token = Some(time);
                Some(Step::Token {
                    choice: i,
                    token: index.saturating_sub(1),
                })
            }
            Output::Finished { .. } => {
                choice.done = true;
                choice.submission.mark_done();
                self.ready.running = self.ready.running.saturating_sub(1);
                if self.ready.running == 0 {
                    self.finish();
                }
                Some(Step::Finished { choice: i })
            }
            Output::Rejected { reason, .. } => {
                self.fail();
                Some(Step::Error(reason.into()))
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
            let _ = self
                .state
                .engine
                .submit_speculative_on(request, self.state.worker);
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

    /// The SSE events of the opening `delta.role = "assistant"` chunks, one per choice (chat
    /// only), written into `out`.
    pub fn write_role_chunks(&self, frame: &ChunkFrame, out: &mut Vec<u8>) {
        if self.header.endpoint != Endpoint::Chat {
            return;
        }
        for c in &self.choices {
            frame.write(out, |out| {
                out.extend_from_slice(b"{\"delta\":{\"content\":\"\",\"role\":\"assistant\"}");
                out.extend_from_slice(b",\"finish_reason\":null,\"index\":");
                push_json(out, &c.index);
                out.extend_from_slice(b",\"logprobs\":null}");
            });
        }
    }

    /// The SSE events of one token's piece, written into `out`: none for a token that shows
    /// nothing (one of a stop string), two for the first fragment of a tool call (its id and
    /// name, then arguments).
    pub fn write_token(
        &mut self,
        frame: &ChunkFrame,
        choice: usize,
        token: usize,
        out: &mut Vec<u8>,
    ) {
        let endpoint = self.header.endpoint;
        let Some(c) = self.choices.get_mut(choice) else {
            return;
        };
        // A token beyond the plan shows nothing.
        let Some(piece) = c.answer.pieces.get(token) else {
            return;
        };
        let index = c.index;
        match endpoint {
            Endpoint::Chat => {
                let logprobs = piece.logprob.as_ref().map(|lp| chat_logprobs(&[lp]));
                let chunk = |out: &mut Vec<u8>, delta: &dyn Fn(&mut Vec<u8>)| {
                    frame.write(out, |out| {
                        out.extend_from_slice(b"{\"delta\":");
                        delta(out);
                        out.push(b',');
                        push_unfinished_choice(out, index, logprobs.as_ref());
                        out.push(b'}');
                    });
                };
                let tool = piece
                    .tool
                    .as_ref()
                    .and_then(|f| Some((f, c.answer.tool_calls.get(f.call)?)));
                if let Some((fragment, call)) = tool {
                    if fragment.first {
                        let delta = json!({"tool_calls": [{
                            "index": fragment.call, "id": call.id, "type": "function",
                            "function": {"name": call.name, "arguments": ""},
                        }]});
                        chunk(out, &|out| push_json(out, &delta));
                    }
                    if !fragment.arguments.is_empty() {
                        let delta = json!({"tool_calls": [{
                            "index": fragment.call,
                            "function": {"arguments": fragment.arguments},
                        }]});
                        chunk(out, &|out| push_json(out, &delta));
                    }
                } else if !piece.is_empty() {
                    // `{"content":…,"reasoning_content":…}`, each key when the piece has it
                    // (keys sorted, as serde_json writes objects).
                    chunk(out, &|out| {
                        out.push(b'{');
                        if let Some(text) = &piece.content {
                            out.extend_from_slice(b"\"content\":");
                            push_json(out, text);
                        }
                        if let Some(r) = &piece.reasoning {
                            if piece.content.is_some() {
                                out.push(b',');
                            }
                            out.extend_from_slice(b"\"reasoning_content\":");
                            push_json(out, r);
                        }
                        out.push(b'}');
                    });
                }
            }
            Endpoint::Text => {
                let echo = if piece.is_empty() {
                    None
                } else {
                    c.echo.take()
                };
                let answer = piece.content.as_deref().unwrap_or_default();
                if answer.is_empty() && echo.is_none() {
                    return;
                }
                let echo = echo.unwrap_or_default();
                let offset = c.text_chars + echo.chars().count();
                c.text_chars = offset + answer.chars().count();
                let logprobs = piece
                    .logprob
                    .as_ref()
                    .map(|lp| completion_logprobs(&[lp], offset));
                frame.write(out, |out| {
                    out.push(b'{');
                    push_unfinished_choice(out, index, logprobs.as_ref());
                    out.extend_from_slice(b",\"text\":");
                    if echo.is_empty() {
                        push_json(out, answer);
                    } else {
                        push_json(out, &format!("{echo}{answer}"));
                    }
                    out.push(b'}');
                });
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

/// How every chunk's SSE event begins: serde_json writes object keys sorted, so `choices`
/// comes first.
const CHUNK_PREFIX: &[u8] = b"data: {\"choices\":[";

/// The end of every chunk of one response, serialised once: `],"created":…,"id":…,"model":…,
/// "object":…,"system_fingerprint":…}` and the blank line that ends the event. A chunk is then
/// `CHUNK_PREFIX`, its one choice object and this suffix, written straight into the body's
/// buffer: byte for byte what serialising the whole chunk object gives, without building it.
#[derive(Clone, Debug)]
pub struct ChunkFrame {
    suffix: Vec<u8>,
}

impl ChunkFrame {
    /// The frame of `generation`'s chunks.
    pub fn new(generation: &Generation) -> ChunkFrame {
        let header = &generation.header;
        let object = match header.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Text => "text_completion",
        };
        let mut suffix = Vec::with_capacity(160 + header.id.len() + header.model.len());
        suffix.extend_from_slice(b"],\"created\":");
        push_json(&mut suffix, &header.created);
        suffix.extend_from_slice(b",\"id\":");
        push_json(&mut suffix, &header.id);
        suffix.extend_from_slice(b",\"model\":");
        push_json(&mut suffix, &header.model);
        suffix.extend_from_slice(b",\"object\":");
        push_json(&mut suffix, object);
        suffix.extend_from_slice(b",\"system_fingerprint\":");
        push_json(&mut suffix, SYSTEM_FINGERPRINT);
        suffix.extend_from_slice(b"}\n\n");
        ChunkFrame { suffix }
    }

    /// Writes one chunk's SSE event into `out`, its choice object written by `choice`.
    fn write(&self, out: &mut Vec<u8>, choice: impl FnOnce(&mut Vec<u8>)) {
        out.extend_from_slice(CHUNK_PREFIX);
        choice(out);
        out.extend_from_slice(&self.suffix);
    }
}

/// Appends `value` as compact JSON, exactly as serde_json writes it inside a larger object.
fn push_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // serde_json fails only on I/O errors (a `Vec` has none) and on maps with non-string keys
    // (none here); should it ever, the field reads `null` rather than half a value.
    let len = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(len);
        out.extend_from_slice(b"null");
    }
}

/// Appends the keys every unfinished choice of a chunk has, in serde_json's (sorted) order:
/// `"finish_reason":null,"index":…,"logprobs":…`.
fn push_unfinished_choice(out: &mut Vec<u8>, index: usize, logprobs: Option<&Value>) {
    out.extend_from_slice(b"\"finish_reason\":null,\"index\":");
    push_json(out, &index);
    out.extend_from_slice(b",\"logprobs\":");
    match logprobs {
        Some(lp) => push_json(out, lp),
        None => out.extend_from_slice(b"null"),
    }
}

/// Appends the SSE event `data: {value}` (a whole chunk or error object).
fn push_event(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    push_json(out, value);
    out.extend_from_slice(b"\n\n");
}

/// Largest body frame the stream builds from steps that are ready together; the steps after
/// it go into the next frame.
const MAX_FRAME_BYTES: usize = 64 << 10;

/// The state of a streamed generation's body.
struct SseBody {
    generation: Generation,
    frame: ChunkFrame,
    include_usage: bool,
    /// The role chunks, sent before any engine output.
    opening: Option<Vec<u8>>,
    /// `data: [DONE]` is written: the stream ends after the current frame.
    ended: bool,
}

impl SseBody {
    /// Writes the SSE events of one step into `out`.
    fn write_step(&mut self, step: Step, out: &mut Vec<u8>) {
        let generation = &mut self.generation;
        match step {
            Step::Token { choice, token } => {
                generation.write_token(&self.frame, choice, token, out);
            }
            Step::Finished { choice } => {
                push_event(out, &generation.finish_chunk(choice));
                if generation.done {
                    self.ended = true;
                    if self.include_usage {
                        push_event(out, &generation.usage_chunk());
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                }
            }
            Step::Error(e) => {
                self.ended = true;
                generation.state.metrics.http_failures.inc();
                push_event(out, &e.body());
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
        }
    }
}

/// The SSE body of a streamed generation. Dropping it (client gone) cancels the engine requests.
///
/// Each body frame carries every step that is ready when the stream is polled (tokens the
/// engine emitted together, a finish chunk and `[DONE]`), each as its own SSE event: the events
/// are the same whatever the framing, and hyper writes one frame with one chunk header.
pub fn sse_stream(
    generation: Generation,
    include_usage: bool,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let frame = ChunkFrame::new(&generation);
    let mut opening = Vec::new();
    generation.write_role_chunks(&frame, &mut opening);
    let body = SseBody {
        generation,
        frame,
        include_usage,
        opening: Some(opening),
        ended: false,
    };
    futures_util::stream::unfold(body, |mut body| async move {
        if let Some(opening) = body.opening.take().filter(|o| !o.is_empty()) {
            return Some((Ok(Bytes::from(opening)), body));
        }
        let mut out = Vec::new();
        while !body.ended {
            let step = body.generation.next().await;
            body.write_step(step, &mut out);
            while !body.ended && out.len() < MAX_FRAME_BYTES {
                let Some(step) = body.generation.try_next() else {
                    break;
                };
                body.write_step(step, &mut out);
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), body));
            }
        }
        None
    })
}

/// What the whole response shows of one choice.
#[derive(Default)]
struct Collected {
    reasoning: String,
    content: String,
    /// The choice's tokens that carry log-probabilities (indices into its answer's pieces).
    logprobs: Vec<usize>,
}

/// Runs a generation to the end and returns the single response object, serialized.
///
/// Log-probabilities are written straight from the answers' pieces, never built as JSON values
/// (a value tree costs some 30 times the text it serializes to), and a large response is
/// written off the runtime's worker threads.
pub async fn collect(mut generation: Generation) -> Result<Vec<u8>, ApiError> {
    let mut collected: Vec<Collected> = generation
        .choices
        .iter()
        .map(|_| Collected::default())
        .collect();
    loop {
        match generation.next().await {
            Step::Token { choice, token } => {
                let (Some(c), Some(out)) =
                    (generation.choices.get(choice), collected.get_mut(choice))
                else {
                    continue;
                };
                let Some(piece) = c.answer.pieces.get(token) else {
                    continue;
                };
                out.reasoning
                    .push_str(piece.reasoning.as_deref().unwrap_or(""));
                out.content.push_str(piece.content.as_deref().unwrap_or(""));
                if piece.logprob.is_some() {
                    out.logprobs.push(token);
                }
            }
            Step::Finished { .. } => {
                if generation.done {
                    break;
                }
            }
            Step::Error(e) => return Err(e),
        }
    }
    let entries: usize = generation
        .choices
        .iter()
        .map(|c| {
            let top = c
                .answer
                .pieces
                .first()
                .and_then(|p| p.logprob.as_ref())
                .map_or(0, |lp| lp.top.len());
            c.completion_tokens * (1 + top)
        })
        .sum();
    let heavy = entries > 1 << 16 || generation.choices.len() > 1024;
    super::off_runtime(heavy, move || response_body(&generation, collected)).await?
}

/// The whole response of a finished generation, serialized.
fn response_body(generation: &Generation, collected: Vec<Collected>) -> Result<Vec<u8>, ApiError> {
    let logprobs_asked = generation.logprobs;
    let mut logprobs = Vec::with_capacity(collected.len());
    let choices: Vec<Value> = generation
        .choices
        .iter()
        .zip(collected)
        .map(|(c, out)| {
            let finish = c.answer.finish_reason.as_str();
            let tokens: Vec<&TokenLogprob> = out
                .logprobs
                .iter()
                .filter_map(|&t| c.answer.pieces.get(t)?.logprob.as_ref())
                .collect();
            // Written in place of the `logprobs` null below when asked for.
            let mut choice_logprobs = ChoiceLogprobs {
                endpoint: generation.header.endpoint,
                tokens,
                offset: 0,
            };
            let choice = match generation.header.endpoint {
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
                    json!({"index": c.index, "message": message, "logprobs": null,
                           "finish_reason": finish, "stop_reason": c.answer.stop_reason})
                }
                Endpoint::Text => {
                    let echo = c.echo.clone().unwrap_or_default();
                    choice_logprobs.offset = echo.chars().count();
                    json!({"index": c.index, "text": format!("{echo}{}", out.content),
                           "logprobs": null, "finish_reason": finish,
                           "stop_reason": c.answer.stop_reason})
                }
            };
            logprobs.push(logprobs_asked.then_some(choice_logprobs));
            choice
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
        "choices": [],
        "usage": generation.usage(),
    });
    if let Some(nvext) = generation.nvext() {
        response["nvext"] = nvext;
    }
    let body = ResponseBody {
        response: &response,
        choices: &choices,
        logprobs: &logprobs,
    };
    serde_json::to_vec(&body).map_err(|e| ApiError {
        status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        message: format!("Writing the response failed: {e}"),
        kind: "server_error",
        param: None,
        code: None,
    })
}

/// A whole response: `response`'s fields with `choices` in place of its (empty) `choices`,
/// each choice's `logprobs` written from its tokens when asked for. Keys come out sorted, as
/// serde_json writes a value, so the bytes are those of the equivalent value tree.
struct ResponseBody<'a> {
    response: &'a Value,
    choices: &'a [Value],
    logprobs: &'a [Option<ChoiceLogprobs<'a>>],
}

impl Serialize for ResponseBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let empty = serde_json::Map::new();
        let fields = self.response.as_object().unwrap_or(&empty);
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (key, value) in fields {
            if key == "choices" {
                map.serialize_entry(key, &ChoicesBody(self))?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

struct ChoicesBody<'a, 'b>(&'b ResponseBody<'a>);

impl Serialize for ChoicesBody<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let body = self.0;
        let mut seq = serializer.serialize_seq(Some(body.choices.len()))?;
        for (i, choice) in body.choices.iter().enumerate() {
            match body.logprobs.get(i) {
                Some(Some(logprobs)) => seq.serialize_element(&ChoiceBody { choice, logprobs })?,
                _ => seq.serialize_element(choice)?,
            }
        }
        seq.end()
    }
}

/// One choice object with its `logprobs` written from its tokens.
struct ChoiceBody<'a, 'b> {
    choice: &'b Value,
    logprobs: &'b ChoiceLogprobs<'a>,
}

impl Serialize for ChoiceBody<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let empty = serde_json::Map::new();
        let fields = self.choice.as_object().unwrap_or(&empty);
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (key, value) in fields {
            if key == "logprobs" {
                map.serialize_entry(key, self.logprobs)?;
            } else {
                map.serialize_entry(key, value)?;
            }
        }
        map.end()
    }
}

/// A choice's `logprobs`: chat's `{content, refusal}` ([`chat_logprobs`]) or the completions'
/// parallel arrays ([`completion_logprobs`]), the first token at `offset` characters.
struct ChoiceLogprobs<'a> {
    endpoint: Endpoint,
    tokens: Vec<&'a TokenLogprob>,
    offset: usize,
}

impl Serialize for ChoiceLogprobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        match self.endpoint {
            Endpoint::Chat => {
                let content = each(&self.tokens, |t| ChatToken(t));
                map.serialize_entry("content", &content)?;
                map.serialize_entry("refusal", &())?;
            }
            Endpoint::Text => {
                let offsets = TextOffsets {
                    tokens: &self.tokens,
                    offset: self.offset,
                };
                map.serialize_entry("text_offset", &offsets)?;
                let logprobs = each(&self.tokens, |t| t.logprob);
                map.serialize_entry("token_logprobs", &logprobs)?;
                let texts = each(&self.tokens, |t| t.token.as_str());
                map.serialize_entry("tokens", &texts)?;
                let top = each(&self.tokens, |t| {
                    // The token first, then alternatives not already named.
                    let mut top = std::collections::BTreeMap::new();
                    top.insert(t.token.as_str(), t.logprob);
                    for (token, lp) in &t.top {
                        top.entry(token.as_str()).or_insert(*lp);
                    }
                    top
                });
                map.serialize_entry("top_logprobs", &top)?;
            }
        }
        map.end()
    }
}

/// A sequence of `f(item)` for each item, made as it is written.
struct Each<'a, T, F>(&'a [T], F);

fn each<'a, T, U: Serialize, F: Fn(&'a T) -> U>(items: &'a [T], f: F) -> Each<'a, T, F> {
    Each(items, f)
}

impl<'a, T, U: Serialize, F: Fn(&'a T) -> U> Serialize for Each<'a, T, F> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&(self.1)(item))?;
        }
        seq.end()
    }
}

/// Completions `text_offset`: where each token starts, in characters.
struct TextOffsets<'a, 'b> {
    tokens: &'b [&'a TokenLogprob],
    offset: usize,
}

impl Serialize for TextOffsets<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.tokens.len()))?;
        let mut offset = self.offset;
        for t in self.tokens {
            seq.serialize_element(&offset)?;
            offset += t.token.chars().count();
        }
        seq.end()
    }
}

/// One token of chat's `logprobs.content`: `{bytes, logprob, token, top_logprobs}`.
struct ChatToken<'a>(&'a TokenLogprob);

impl Serialize for ChatToken<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("bytes", t.token.as_bytes())?;
        map.serialize_entry("logprob", &t.logprob)?;
        map.serialize_entry("token", &t.token)?;
        map.serialize_entry(
            "top_logprobs",
            &each(&t.top, |(token, lp)| Alternative(token, *lp)),
        )?;
        map.end()
    }
}

/// One of chat's `top_logprobs`: `{bytes, logprob, token}`.
struct Alternative<'a>(&'a str, f64);

impl Serialize for Alternative<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("bytes", self.0.as_bytes())?;
        map.serialize_entry("logprob", &self.1)?;
        map.serialize_entry("token", self.0)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use servesim::cluster::ClusterConfig;
    use servesim::request::Prompt;

    use super::super::answer::{FinishReason, Piece, ToolFragment};
    use super::super::logprobs::TokenLogprob;
    use super::super::tools::ToolCall;
    use super::*;
    use crate::config::ServerConfig;

    /// The chunks of one token's piece as JSON objects: the shape [`Generation::write_token`]
    /// must write byte for byte.
    fn reference_token_chunks(g: &mut Generation, choice: usize, token: usize) -> Vec<Value> {
        let endpoint = g.header.endpoint;
        let c = &mut g.choices[choice];
        let piece = c.answer.pieces.get(token).cloned().unwrap_or_default();
        let index = c.index;
        let mut out = Vec::new();
        let choices = match endpoint {
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
                        json!([{"index": index, "delta": delta, "logprobs": logprobs,
                                "finish_reason": null}])
                    })
                    .collect::<Vec<_>>()
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
                vec![json!([{"index": index, "text": format!("{echo}{answer}"),
                             "logprobs": logprobs, "finish_reason": null}])]
            }
        };
        choices.into_iter().map(|c| g.chunk(c)).collect()
    }

    fn events(chunks: &[Value]) -> Vec<u8> {
        chunks
            .iter()
            .flat_map(|c| format!("data: {c}\n\n").into_bytes())
            .collect()
    }

    fn text(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    /// Pieces that exercise every branch and JSON escape.
    fn pieces() -> Vec<Piece> {
        let logprob = TokenLogprob {
            token: " \"q\"\n".into(),
            logprob: -0.25,
            top: vec![(" \"q\"\n".into(), -0.25), ("é\u{1}".into(), -1.5)],
        };
        vec![
            Piece {
                content: text(" plain"),
                ..Piece::default()
            },
            Piece {
                content: text("quotes \" back\\slash \n\t\r \u{0}\u{1f} </script> é 中 😀"),
                ..Piece::default()
            },
            Piece {
                reasoning: text(" thinking\u{7f}"),
                ..Piece::default()
            },
            Piece {
                reasoning: text(""),
                content: text("both"),
                ..Piece::default()
            },
            Piece {
                reasoning: text("r"),
                content: text(""),
                ..Piece::default()
            },
            // Shows nothing: one of a stop string.
            Piece {
                content: text(""),
                ..Piece::default()
            },
            Piece::default(),
            Piece {
                content: text(" with logprobs"),
                logprob: Some(logprob),
                ..Piece::default()
            },
            Piece {
                tool: Some(ToolFragment {
                    call: 0,
                    first: true,
                    arguments: "{\"city\": \"Par".into(),
                }),
                ..Piece::default()
            },
            Piece {
                tool: Some(ToolFragment {
                    call: 0,
                    first: false,
                    arguments: "is\"}".into(),
                }),
                ..Piece::default()
            },
            Piece {
                tool: Some(ToolFragment {
                    call: 0,
                    first: true,
                    arguments: String::new(),
                }),
                ..Piece::default()
            },
            // A fragment of a call that does not exist shows its text, if any.
            Piece {
                content: text("orphan"),
                tool: Some(ToolFragment {
                    call: 7,
                    first: false,
                    arguments: "x".into(),
                }),
                ..Piece::default()
            },
        ]
    }

    async fn generation(endpoint: Endpoint, model: &str, n: usize) -> Generation {
        let state = AppState::new(ServerConfig::new(ClusterConfig::default())).expect("valid");
        let answer = Answer {
            tokens: vec![1; pieces().len()],
            pieces: pieces(),
            finish_reason: FinishReason::ToolCalls,
            stop_reason: None,
            tool_calls: vec![ToolCall {
                id: "call_\"x\"".into(),
                name: "get_weather".into(),
                arguments: "{\"city\": \"Paris\"}".into(),
            }],
        };
        let mut choices = Vec::new();
        for index in 0..n {
            let request = Choice::engine_request(Prompt::from_tokens(&[1, 2, 3], 16), &answer);
            let submission = state.engine.submit(request, None).await.expect("submitted");
            let mut choice = Choice::new(index * 3 + 1, submission, answer.clone(), 3);
            choice.echo = Some("echo \"é\"\n".into());
            choices.push(choice);
        }
        Generation {
            header: Header {
                id: "chatcmpl-0123456789abcdef".into(),
                created: 1_700_000_123,
                model: model.into(),
                endpoint,
            },
            choices,
            state: state.clone(),
            spec_prefill: None,
            done: false,
            extras: ExtraFields::default(),
            logprobs: false,
            received: SimTime::ZERO,
            stop: state.stop_generations.child_token(),
            ready: ReadyChoices::new(n),
        }
    }

    #[tokio::test]
    async fn written_chunks_are_the_serialised_chunk_objects() {
        for endpoint in [Endpoint::Chat, Endpoint::Text] {
            for model in ["mock-model", "odd \"model\"\\name é"] {
                let mut fast = generation(endpoint, model, 2).await;
                let mut reference = generation(endpoint, model, 2).await;
                let frame = ChunkFrame::new(&fast);
                let mut roles = Vec::new();
                fast.write_role_chunks(&frame, &mut roles);
                let expected: Vec<Value> = match endpoint {
                    Endpoint::Chat => reference
                        .choices
                        .iter()
                        .map(|c| {
                            reference.chunk(json!([{
                                "index": c.index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": null,
                                "finish_reason": null,
                            }]))
                        })
                        .collect(),
                    Endpoint::Text => Vec::new(),
                };
                assert_eq!(
                    String::from_utf8_lossy(&roles),
                    String::from_utf8_lossy(&events(&expected))
                );
                let mut written = 0;
                for token in 0..pieces().len() + 1 {
                    for choice in 0..2 {
                        let mut out = Vec::new();
                        fast.write_token(&frame, choice, token, &mut out);
                        let want = events(&reference_token_chunks(&mut reference, choice, token));
                        assert_eq!(
                            String::from_utf8_lossy(&out),
                            String::from_utf8_lossy(&want),
                            "{endpoint:?} token {token} of choice {choice}"
                        );
                        written += out.len();
                    }
                }
                assert!(written > 0);
                for choice in 0..2 {
                    assert_eq!(
                        fast.choices[choice].text_chars,
                        reference.choices[choice].text_chars
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn the_frame_suffix_is_the_serialised_chunk_tail() {
        for endpoint in [Endpoint::Chat, Endpoint::Text] {
            let g = generation(endpoint, "m\u{1}\"", 1).await;
            let whole = format!("data: {}\n\n", g.chunk(json!([])));
            let mut written = Vec::new();
            ChunkFrame::new(&g).write(&mut written, |_| {});
            assert_eq!(String::from_utf8_lossy(&written), whole);
        }
    }

    #[tokio::test]
    async fn ready_steps_share_one_body_frame_and_keep_their_events() {
        use futures_util::StreamExt;
        use std::time::Duration;
        let g = generation(Endpoint::Chat, "mock-model", 1).await;
        let engine = g.state.engine.clone();
        // Once the engine has finished the request, every event it sends is in the channel.
        tokio::time::timeout(Duration::from_secs(30), async {
            while engine
                .snapshot()
                .await
                .expect("running")
                .cluster
                .active_requests
                > 0
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("finished in time");
        let frame = ChunkFrame::new(&g);
        let mut roles = Vec::new();
        g.write_role_chunks(&frame, &mut roles);
        let mut reference = generation(Endpoint::Chat, "mock-model", 1).await;
        let mut tokens = Vec::new();
        for token in 0..pieces().len() {
            tokens.extend(events(&reference_token_chunks(&mut reference, 0, token)));
        }
        let stream = sse_stream(g, false);
        tokio::pin!(stream);
        let mut frames = Vec::new();
        while let Some(frame) = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("in time")
        {
            frames.push(frame.expect("infallible").to_vec());
        }
        // The role chunk at once, then everything that was ready in one frame: every token's
        // events as they would be written one by one, the finish chunk and `[DONE]`.
        assert_eq!(frames.len(), 2, "{frames:?}");
        assert_eq!(frames[0], roles);
        let rest = String::from_utf8_lossy(&frames[1]);
        let tokens = String::from_utf8_lossy(&tokens);
        assert!(rest.starts_with(tokens.as_ref()), "{rest}");
        let end = &rest[tokens.len()..];
        assert!(end.contains("\"finish_reason\":\"tool_calls\""), "{end}");
        assert!(end.ends_with("}\n\ndata: [DONE]\n\n"), "{end}");
        assert_eq!(end.matches("\n\n").count(), 2, "{end}");
    }

    #[test]
    fn written_logprobs_are_the_serialised_logprob_values() {
        let tokens = [
            TokenLogprob {
                token: " \"q\"\n".into(),
                logprob: -0.25,
                top: vec![(" \"q\"\n".into(), -0.25), ("é\u{1}".into(), -1.5)],
            },
            TokenLogprob {
                token: "中😀".into(),
                logprob: -3.0e-7,
                top: vec![
                    ("b".into(), -0.1),
                    ("a".into(), -2.0),
                    ("中😀".into(), -9.0),
                ],
            },
            TokenLogprob {
                token: "x".into(),
                logprob: 0.0,
                top: Vec::new(),
            },
        ];
        let refs: Vec<&TokenLogprob> = tokens.iter().collect();
        for (endpoint, want) in [
            (Endpoint::Chat, chat_logprobs(&refs)),
            (Endpoint::Text, completion_logprobs(&refs, 7)),
        ] {
            let written = ChoiceLogprobs {
                endpoint,
                tokens: refs.clone(),
                offset: 7,
            };
            assert_eq!(
                serde_json::to_string(&written).expect("serialises"),
                want.to_string(),
                "{endpoint:?}"
            );
        }
        let choice = json!({"index": 3, "logprobs": null, "text": "t", "finish_reason": "stop"});
        let response = json!({"id": "x", "choices": [], "usage": {"a": 1}});
        let logprobs = [
            Some(ChoiceLogprobs {
                endpoint: Endpoint::Text,
                tokens: refs.clone(),
                offset: 0,
            }),
            None,
        ];
        let body = ResponseBody {
            response: &response,
            choices: &[choice.clone(), choice.clone()],
            logprobs: &logprobs,
        };
        let mut with = choice.clone();
        with["logprobs"] = completion_logprobs(&refs, 0);
        let want = json!({"id": "x", "choices": [with, choice], "usage": {"a": 1}});
        assert_eq!(
            serde_json::to_string(&body).expect("serialises"),
            want.to_string()
        );
    }
}
