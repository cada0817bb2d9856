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
//!
//! [`Generation`] is the state of one request's choices and its steps ([`Generation::next`]);
//! `stream.rs` writes those steps as SSE chunks and `collect.rs` gathers them into one whole
//! response.

pub(crate) mod collect;
pub(crate) mod stream;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use serde_json::{json, Value};
use servesim::cluster::Output;
use servesim::ids::WorkerId;
use servesim::request::{EngineRequest, Prompt};
use servesim::time::SimTime;

use super::answer::Answer;
use super::error::ApiError;
use super::state::AppState;
use super::tools::render_calls;
use crate::driver::{Event, Submission};
use crate::text::{ChatMessage, Role};

/// Sent as `system_fingerprint` on every response.
pub(crate) const SYSTEM_FINGERPRINT: &str = "fp_mockserve";

/// Which OpenAI endpoint a request came to: chat or legacy text completion (their chunks and
/// response objects differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Text,
}

/// Response identity shared by every chunk.
#[derive(Clone, Debug)]
pub(crate) struct Header {
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
pub(crate) struct SpecPrefill {
    /// The request's messages; the answer is appended as an assistant message.
    pub messages: Vec<ChatMessage>,
}

/// Which response `nvext` fields the request opted into (its `nvext.extra_fields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ExtraFields {
    /// `worker_id`: the serving worker.
    pub worker_id: bool,
    /// `timing`: received, first and last token times.
    pub timing: bool,
}

/// One choice in flight: its engine request's events and the answer they run.
#[derive(Debug)]
pub(crate) struct Choice {
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
    /// Completions `echo` with `logprobs`: the prompt tokens' log-probabilities, sent with the
    /// echo (shared by the choices of one prompt).
    pub prompt_logprobs: Option<Arc<Vec<crate::api::logprobs::TokenLogprob>>>,
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
    pub(crate) fn new(
        index: usize,
        submission: Submission,
        answer: Answer,
        prompt_tokens: usize,
    ) -> Self {
        Choice {
            index,
            submission,
            answer,
            prompt_tokens,
            counts_prompt: true,
            echo: None,
            prompt_logprobs: None,
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
    pub(crate) fn engine_request(prompt: Prompt, answer: &Answer) -> EngineRequest {
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
pub(crate) struct Generation {
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
    /// The request's estimated memory in the server's in-flight budget, given back when the
    /// generation ends (its last chunk sent, or the client gone).
    pub _reservation: crate::driver::inflight::Reservation,
}

/// The choices of a [`Generation`] whose event channels were woken since they were last found
/// empty, lowest index first, and how many choices are still running.
///
/// Each choice's channel is polled with a waker of its own, which puts the choice back in the
/// set and wakes the generation's task; a choice outside the set has nothing to read.
#[derive(Debug)]
pub(crate) struct ReadyChoices {
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
    pub(crate) fn new(choices: usize) -> ReadyChoices {
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
pub(crate) enum Step {
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
    pub(crate) async fn next(&mut self) -> Step {
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
    pub(crate) fn try_next(&mut self) -> Option<Step> {
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
                let prompt_param = match self.header.endpoint {
                    Endpoint::Chat => "messages",
                    Endpoint::Text => "prompt",
                };
                Some(Step::Error(
                    ApiError::from(reason).for_prompt_field(prompt_param),
                ))
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
    pub(crate) fn nvext(&self) -> Option<Value> {
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
    pub(crate) fn usage(&self) -> Value {
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
}
