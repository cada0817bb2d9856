//! One streamed chat or text-completion request: send, read the SSE stream, stamp times, classify the outcome.
//!
//! Times are `tokio::time::Instant`s taken in the client task; every figure is an offset from the
//! send instant (taken just before the request is handed to reqwest).

use std::borrow::Cow;
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

pub use crate::run::failure::Failure;
use crate::run::sse::SseParser;

/// Most tokens one streamed chunk is assumed to carry before a server's `usage` is called into
/// question: servers batch tokens into chunks (stream intervals, speculative decoding), so usage
/// above the chunk count is normal, but not by more than this factor.
pub(crate) const MAX_TOKENS_PER_CHUNK: u64 = 32;

/// True when `usage.completion_tokens` contradicts the `chunks` that carried tokens: fewer
/// tokens than chunks (every counted chunk carries at least one token) or more than
/// [`MAX_TOKENS_PER_CHUNK`] per chunk.
pub(crate) fn usage_disagrees(usage_tokens: u64, chunks: u64) -> bool {
    usage_tokens < chunks || usage_tokens > MAX_TOKENS_PER_CHUNK.saturating_mul(chunks)
}

/// Most bytes of a non-2xx response body read for its error message.
pub(crate) const ERROR_BODY_BYTES: usize = 16 * 1024;

/// Where `output_tokens` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// Counted content/reasoning chunks (no usage chunk arrived).
    Chunks,
}

/// Which token a time-to-first-token counts to. Both are figures of one [`Timing`], computed in
/// one place ([`Timing::first_token_us`], and from the scheduled send
/// [`crate::run::driver::Sample::ttft_us`]) for every mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstToken {
    /// The first token of any kind: content, reasoning or completion text. The replay and bench
    /// reports' TTFT (`mockserve replay`'s key; AIPerf's and vLLM's TTFT).
    Any,
    /// The first answer (content) token, reasoning excluded: multiturn's TTFT (Dynamo's
    /// `multiturn_bench`; AIPerf's TTFO).
    Answer,
}

/// Everything measured about one request; times in µs from the send.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Response headers arrived.
    pub headers_us: Option<u64>,
    /// First SSE event arrived.
    pub first_chunk_us: Option<u64>,
    /// First reasoning token.
    pub first_reasoning_us: Option<u64>,
    /// First answer (content) token.
    pub first_answer_us: Option<u64>,
    /// Every chunk carrying a token (content or reasoning), in order.
    pub token_chunks_us: Vec<u64>,
    /// The stream ended (or the request failed).
    pub end_us: u64,
}

impl Timing {
    /// Time from the send to the first token of `kind`; None when no such token came.
    pub(crate) fn first_token_us(&self, kind: FirstToken) -> Option<u64> {
        match kind {
            FirstToken::Any => self.token_chunks_us.first().copied(),
            FirstToken::Answer => self.first_answer_us,
        }
    }

    /// Per-request output throughput (tokens/s), as other tools define it: the output tokens
    /// after the first over the time from the first to the last token chunk. None with fewer
    /// than two tokens or no time between the first and last chunk.
    pub(crate) fn output_tokens_per_s(&self, output_tokens: u64) -> Option<f64> {
        let (first, last) = (self.token_chunks_us.first()?, self.token_chunks_us.last()?);
        let span_s = last.checked_sub(*first).filter(|&d| d > 0)? as f64 / 1e6;
        (output_tokens >= 2).then(|| (output_tokens - 1) as f64 / span_s)
    }
}

/// The outcome of one request.
#[derive(Clone, Debug)]
pub struct Response {
    /// Measured times.
    pub timing: Timing,
    /// Concatenated `delta.content` (what goes back into the history).
    pub content: String,
    /// Completion tokens: the server's usage, else (no usage, or usage that contradicts the
    /// chunks, see `usage_disagrees`) the counted token chunks.
    pub output_tokens: u64,
    /// Where `output_tokens` came from.
    pub output_tokens_source: TokenSource,
    /// Chunks that carried a token (content, reasoning or completion text).
    pub chunks: u64,
    /// `usage.completion_tokens` as the server sent it.
    pub usage_output_tokens: Option<u64>,
    /// The server's usage contradicts the counted chunks (and was not used).
    pub usage_mismatch: bool,
    /// `usage.prompt_tokens`, when sent.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`, when sent.
    pub cached_tokens: Option<u64>,
    /// The last `finish_reason` the stream carried (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// The worker that served it, when the server said so (`nvext.worker_id`, asked for with
    /// `nvext.extra_fields`; the decode worker of a disaggregated pair).
    pub worker: Option<u32>,
    /// The tool calls the answer streamed (`delta.tool_calls`), pieced together by index.
    pub tool_calls: Vec<ToolCall>,
    /// None on success.
    pub failure: Option<Failure>,
}

/// One tool call of a streamed answer: its id, function name and the concatenated argument
/// text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// `id` (sent with the call's first delta).
    pub id: String,
    /// `function.name`.
    pub name: String,
    /// `function.arguments`, concatenated over the deltas.
    pub arguments: String,
}

impl ToolCall {
    /// The call as an assistant message's `tool_calls` entry.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// The response of a request dropped because the run stopped early (sent at `start`).
pub fn cancelled(start: Instant) -> Response {
    StreamState::new(start).finish(Some(Failure::Cancelled))
}

/// Where to send and how.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// The HTTP client (connection pool shared by all users).
    pub client: reqwest::Client,
    /// The full request URL: `{url}/v1/chat/completions` or `{url}/v1/completions`.
    pub url: String,
    /// Bearer token.
    pub api_key: Option<String>,
    /// Longest SSE line (and event data) accepted, in bytes; a longer one fails the request.
    pub max_line_bytes: usize,
}

fn us(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

/// Tracks `<think>…</think>` in content (inline reasoning format).
#[derive(Default)]
struct InlineThink {
    inside: bool,
}

impl InlineThink {
    /// Splits a content delta into (reasoning?, answer?) presence.
    fn classify(&mut self, text: &str) -> (bool, bool) {
        let mut reasoning = false;
        let mut answer = false;
        let mut rest = text;
        loop {
            if self.inside {
                match rest.find("</think>") {
                    Some(i) => {
                        reasoning |= !rest[..i].trim().is_empty();
                        self.inside = false;
                        rest = &rest[i + "</think>".len()..];
                    }
                    None => {
                        reasoning |= !rest.trim().is_empty();
                        return (reasoning, answer);
                    }
                }
            } else {
                match rest.find("<think>") {
                    Some(i) => {
                        answer |= !rest[..i].is_empty();
                        self.inside = true;
                        rest = &rest[i + "<think>".len()..];
                    }
                    None => {
                        answer |= !rest.is_empty();
                        return (reasoning, answer);
                    }
                }
            }
        }
    }
}

/// What one streamed chunk says, however it was decoded.
struct Facts<'a> {
    /// `usage` when it is an object: (completion, prompt, cached) tokens.
    usage: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    /// `choices[0].finish_reason`.
    finish_reason: Option<&'a str>,
    /// `nvext.worker_id` (see [`worker_of`]).
    worker: Option<u32>,
    /// `choices[0].text` (text completions).
    text: Option<&'a str>,
    /// `choices[0].delta`, when present: its `content`, `reasoning_content` and `reasoning`
    /// (each `""` when absent or not a string).
    delta: Option<[&'a str; 3]>,
    /// `choices[0].delta.tool_calls`: (index, id, function name, argument text) of each.
    tool_calls: Vec<ToolDelta<'a>>,
}

/// One entry of `delta.tool_calls`: the call's `index` (its position when absent), `id`,
/// `function.name` and `function.arguments` (`""` when absent).
type ToolDelta<'a> = (usize, Option<&'a str>, Option<&'a str>, &'a str);

/// A JSON object decoded as `T`. A derived struct also accepts a JSON array (its fields by
/// position), which a [`Value`] lookup by key never would; this wrapper accepts objects only,
/// so the fast path never reads a chunk the general path would read differently.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = Object<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Object<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Object)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// The first element of a JSON array (the rest are checked to be JSON and skipped), as
/// `/choices/0` reads it.
struct First<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for V<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<First<T>, A::Error> {
                let first = seq.next_element::<T>()?;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A streamed chunk as the fast path reads it: only the fields the client uses, strings
/// borrowed from the event's text where they have no escapes.
#[derive(Deserialize)]
struct Chunk<'a> {
    /// Any non-null `error` sends the chunk to the general path, which reads the message.
    error: Option<serde::de::IgnoredAny>,
    usage: Option<Object<ChunkUsage>>,
    #[serde(borrow)]
    choices: Option<First<Object<ChunkChoice<'a>>>>,
    nvext: Option<Object<ChunkNvext>>,
}

#[derive(Deserialize)]
struct ChunkUsage {
    completion_tokens: Option<u64>,
    prompt_tokens: Option<u64>,
    prompt_tokens_details: Option<Object<ChunkUsageDetails>>,
}

#[derive(Deserialize)]
struct ChunkUsageDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Object<ChunkDelta<'a>>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<Object<ChunkToolCall<'a>>>>,
}

#[derive(Deserialize)]
struct ChunkToolCall<'a> {
    index: Option<usize>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<Object<ChunkFunction<'a>>>,
}

#[derive(Deserialize)]
struct ChunkFunction<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct ChunkNvext {
    worker_id: Option<WorkerIdField>,
}

/// `nvext.worker_id`: a number, or an object of optional `decode_worker_id` and
/// `prefill_worker_id` numbers.
enum WorkerIdField {
    Id(u64),
    Pair(Object<ChunkWorkerPair>),
}

impl<'de> Deserialize<'de> for WorkerIdField {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = WorkerIdField;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a worker id or an object of worker ids")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<WorkerIdField, E> {
                Ok(WorkerIdField::Id(n))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<WorkerIdField, A::Error> {
                ChunkWorkerPair::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|p| WorkerIdField::Pair(Object(p)))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct ChunkWorkerPair {
    decode_worker_id: Option<u64>,
    prefill_worker_id: Option<u64>,
}

impl<'a> Chunk<'a> {
    /// The chunk's facts, borrowing from it (`error` is the caller's to check first).
    fn facts(&self) -> Facts<'_> {
        let choice = self
            .choices
            .as_ref()
            .and_then(|c| c.0.as_ref())
            .map(|c| &c.0);
        let usage = self.usage.as_ref().map(|Object(u)| {
            let cached = u
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.0.cached_tokens);
            (u.completion_tokens, u.prompt_tokens, cached)
        });
        let id = |n: Option<u64>| n.and_then(|n| u32::try_from(n).ok());
        let worker = self
            .nvext
            .as_ref()
            .and_then(|n| n.0.worker_id.as_ref())
            .and_then(|w| match w {
                WorkerIdField::Id(n) => id(Some(*n)),
                WorkerIdField::Pair(Object(p)) => {
                    id(p.decode_worker_id).or_else(|| id(p.prefill_worker_id))
                }
            });
        let delta = choice.and_then(|c| c.delta.as_ref()).map(|Object(d)| d);
        let tool_calls = delta
            .and_then(|d| d.tool_calls.as_ref())
            .map(|calls| {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, Object(c))| {
                        let f = c.function.as_ref().map(|Object(f)| f);
                        (
                            c.index.unwrap_or(i),
                            c.id.as_deref(),
                            f.and_then(|f| f.name.as_deref()),
                            f.and_then(|f| f.arguments.as_deref()).unwrap_or(""),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Facts {
            usage,
            finish_reason: choice.and_then(|c| c.finish_reason.as_deref()),
            worker,
            text: choice.and_then(|c| c.text.as_deref()),
            delta: delta.map(|d| {
                [
                    d.content.as_deref().unwrap_or(""),
                    d.reasoning_content.as_deref().unwrap_or(""),
                    d.reasoning.as_deref().unwrap_or(""),
                ]
            }),
            tool_calls,
        }
    }
}

/// State of one stream being read.
struct StreamState {
    start: Instant,
    timing: Timing,
    content: String,
    chunks: u64,
    usage: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    finish_reason: Option<String>,
    worker: Option<u32>,
    tool_calls: Vec<ToolCall>,
    think: InlineThink,
    done: bool,
}

impl StreamState {
    /// A stream sent at `start`, nothing read yet.
    fn new(start: Instant) -> StreamState {
        StreamState {
            start,
            timing: Timing::default(),
            content: String::new(),
            chunks: 0,
            usage: None,
            finish_reason: None,
            worker: None,
            tool_calls: Vec::new(),
            think: InlineThink::default(),
            done: false,
        }
    }

    /// Handles one SSE data payload; `Err` is a server error event.
    ///
    /// A chunk is decoded straight into the few fields read ([`Chunk`], borrowing its strings);
    /// one that does not fit that shape exactly (an `error` member, a field of another type, a
    /// repeated key, not JSON) is read again as a [`Value`], which decides.
    fn on_event(&mut self, data: &str) -> Result<(), Failure> {
        let t = us(self.start);
        self.timing.first_chunk_us.get_or_insert(t);
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        match serde_json::from_str::<Object<Chunk<'_>>>(data) {
            Ok(Object(chunk)) if chunk.error.is_none() => {
                self.on_facts(chunk.facts(), t);
                Ok(())
            }
            _ => self.on_value(data, t),
        }
    }

    /// The general path of [`StreamState::on_event`]: any JSON, through a [`Value`].
    fn on_value(&mut self, data: &str, t: u64) -> Result<(), Failure> {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Ok(());
        };
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| e.to_string());
            return Err(Failure::Server(message));
        }
        let usage = v.get("usage").filter(|u| u.is_object()).map(|u| {
            let get = |k: &str| u.get(k).and_then(Value::as_u64);
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64);
            (get("completion_tokens"), get("prompt_tokens"), cached)
        });
        let delta = v.pointer("/choices/0/delta").map(|delta| {
            let text = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or("");
            [
                text("content"),
                text("reasoning_content"),
                text("reasoning"),
            ]
        });
        let tool_calls = v
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
            .map(|calls| {
                calls
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let s = |p: &str| c.pointer(p).and_then(Value::as_str);
                        (
                            c.get("index")
                                .and_then(Value::as_u64)
                                .and_then(|n| usize::try_from(n).ok())
                                .unwrap_or(i),
                            s("/id"),
                            s("/function/name"),
                            s("/function/arguments").unwrap_or(""),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.on_facts(
            Facts {
                usage,
                finish_reason: v
                    .pointer("/choices/0/finish_reason")
                    .and_then(Value::as_str),
                worker: v.pointer("/nvext/worker_id").and_then(worker_of),
                text: v.pointer("/choices/0/text").and_then(Value::as_str),
                delta,
                tool_calls,
            },
            t,
        );
        Ok(())
    }

    /// Records what one chunk (not an error) says, arrived at `t`.
    fn on_facts(&mut self, facts: Facts<'_>, t: u64) {
        if let Some(usage) = facts.usage {
            self.usage = Some(usage);
        }
        if let Some(reason) = facts.finish_reason {
            self.finish_reason = Some(reason.to_string());
        }
        if let Some(w) = facts.worker {
            self.worker = Some(w);
        }
        // `/v1/completions` streams `choices[0].text`; it has no reasoning channel.
        if let Some(text) = facts.text {
            if !text.is_empty() {
                self.chunks += 1;
                self.timing.token_chunks_us.push(t);
                self.timing.first_answer_us.get_or_insert(t);
                self.content.push_str(text);
            }
            return;
        }
        let Some([content, reasoning_content, reasoning]) = facts.delta else {
            return;
        };
        // Tool calls are answer tokens: a delta with argument text is a token chunk (the one
        // naming the function alone carries no generated argument text).
        let mut tool_tokens = false;
        for (index, id, name, arguments) in facts.tool_calls {
            if index >= MAX_TOOL_CALLS {
                continue;
            }
            if self.tool_calls.len() <= index {
                self.tool_calls.resize_with(index + 1, ToolCall::default);
            }
            let call = &mut self.tool_calls[index];
            if let Some(id) = id {
                call.id = id.to_string();
            }
            if let Some(name) = name {
                call.name.push_str(name);
            }
            call.arguments.push_str(arguments);
            tool_tokens |= !arguments.is_empty();
        }
        if tool_tokens {
            self.timing.first_answer_us.get_or_insert(t);
        }
        let reasoning_text = if reasoning_content.is_empty() {
            reasoning
        } else {
            reasoning_content
        };
        let mut reasoning = !reasoning_text.is_empty();
        let mut answer = false;
        if !content.is_empty() {
            let (r, a) = self.think.classify(content);
            reasoning |= r;
            answer = a;
            self.content.push_str(content);
        }
        if reasoning || answer || tool_tokens {
            self.chunks += 1;
            self.timing.token_chunks_us.push(t);
        }
        if reasoning {
            self.timing.first_reasoning_us.get_or_insert(t);
        }
        if answer {
            self.timing.first_answer_us.get_or_insert(t);
        }
    }

    fn finish(mut self, failure: Option<Failure>) -> Response {
        self.timing.end_us = us(self.start);
        let (usage_tokens, prompt, cached) = self.usage.unwrap_or((None, None, None));
        let usage_mismatch = usage_tokens.is_some_and(|u| usage_disagrees(u, self.chunks));
        let (output_tokens, source) = match usage_tokens {
            Some(u) if !usage_mismatch => (u, TokenSource::Usage),
            _ => (self.chunks, TokenSource::Chunks),
        };
        // A stream that ended normally without a single token is not a success.
        let failure = match failure {
            None if self.chunks == 0 => Some(Failure::EmptyStream),
            f => f,
        };
        Response {
            timing: self.timing,
            content: self.content,
            output_tokens,
            output_tokens_source: source,
            chunks: self.chunks,
            usage_output_tokens: usage_tokens,
            usage_mismatch,
            prompt_tokens: prompt,
            cached_tokens: cached,
            finish_reason: self.finish_reason,
            worker: self.worker,
            tool_calls: self.tool_calls,
            failure,
        }
    }
}

/// Tool calls of one answer kept at most (a delta with a larger index is ignored): an index is
/// the server's to choose, and it must not size a vector.
pub(crate) const MAX_TOOL_CALLS: usize = 128;

/// The serving worker of a response's `nvext.worker_id`: a number, or Dynamo's object
/// `{"prefill_worker_id", "decode_worker_id"}` (the decode worker, else the prefill one).
fn worker_of(v: &Value) -> Option<u32> {
    let id = |x: Option<&Value>| {
        x.and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    id(Some(v))
        .or_else(|| id(v.get("decode_worker_id")))
        .or_else(|| id(v.get("prefill_worker_id")))
}

/// The error message of a non-2xx body: `error.message` (OpenAI, vLLM), `error` as a string,
/// `message` or `detail` (FastAPI), else the text itself.
pub(crate) fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let text = |x: &Value| x.as_str().map(str::to_string);
        v.pointer("/error/message")
            .and_then(text)
            .or_else(|| v.get("error").and_then(text))
            .or_else(|| v.get("message").and_then(text))
            .or_else(|| v.get("detail").and_then(text))
    });
    from_json.unwrap_or_else(|| body.trim().to_string())
}

/// Reads at most [`ERROR_BODY_BYTES`] of an error response (a huge body is not buffered).
async fn error_body(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(ERROR_BODY_BYTES);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A reqwest error as a failure: a timeout, or `other` with the error's causes.
fn classify(e: &reqwest::Error, other: fn(String) -> Failure, when: &str) -> Failure {
    if e.is_timeout() {
        Failure::Timeout(format!(
            "no complete response within the request timeout ({when})"
        ))
    } else {
        other(crate::error::chain(e))
    }
}

/// Sends one streamed chat request and reads it to the end.
pub async fn send(endpoint: &Endpoint, body: &Value) -> Response {
    match reqwest::Url::parse(&endpoint.url) {
        Ok(url) => send_to(endpoint, &url, body).await,
        // reqwest reports the bad URL as it would have.
        Err(_) => send_request(endpoint, endpoint.client.post(&endpoint.url), body).await,
    }
}

/// [`send`] to `url`, `endpoint.url` parsed once by the caller (a URL is not parsed per request).
pub(crate) async fn send_to(endpoint: &Endpoint, url: &reqwest::Url, body: &Value) -> Response {
    send_request(endpoint, endpoint.client.post(url.clone()), body).await
}

async fn send_request(
    endpoint: &Endpoint,
    request: reqwest::RequestBuilder,
    body: &Value,
) -> Response {
    let mut request = request.json(body);
    if let Some(key) = &endpoint.api_key {
        request = request.bearer_auth(key);
    }
    let start = Instant::now();
    let mut state = StreamState::new(start);
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            let f = classify(&e, Failure::Transport, "before the response headers");
            return state.finish(Some(f));
        }
    };
    state.timing.headers_us = Some(us(start));
    let status = response.status();
    if !status.is_success() {
        let body = error_body(response).await;
        return state.finish(Some(Failure::Http {
            status: status.as_u16(),
            message: error_message(&body),
        }));
    }
    let mut parser = SseParser::with_limit(endpoint.max_line_bytes);
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => {
                let f = classify(&e, Failure::Stream, "while streaming");
                return state.finish(Some(f));
            }
        };
        let events = match parser.push_events(&bytes) {
            Ok(events) => events,
            Err(e) => return state.finish(Some(Failure::LineTooLong { limit: e.limit })),
        };
        for data in events {
            if let Err(f) = state.on_event(data) {
                return state.finish(Some(f));
            }
            if state.done {
                return state.finish(None);
            }
        }
    }
    match parser.finish() {
        Ok(Some(data)) => {
            if let Err(f) = state.on_event(&data) {
                return state.finish(Some(f));
            }
        }
        Ok(None) => {}
        Err(e) => return state.finish(Some(Failure::LineTooLong { limit: e.limit })),
    }
    if state.done {
        state.finish(None)
    } else {
        state.finish(Some(Failure::Stream("ended before data: [DONE]".into())))
    }
}

/// The request timeout as reqwest wants it.
pub fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .tcp_nodelay(true)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_think_splits_reasoning_from_answer() {
        let mut t = InlineThink::default();
        assert_eq!(t.classify("<think>hmm "), (true, false));
        assert_eq!(t.classify("more "), (true, false));
        assert_eq!(t.classify("done</think>"), (true, false));
        assert_eq!(t.classify("answer "), (false, true));
        let mut t = InlineThink::default();
        assert_eq!(t.classify("<think>a</think>b"), (true, true));
    }

    /// Runs `events` through one decoding path and describes everything it recorded.
    fn read_with(events: &[&str], general_only: bool) -> String {
        let mut s = state();
        let mut results = Vec::new();
        for e in events {
            results.push(if general_only {
                s.on_value(e, 1)
            } else {
                s.on_event(e)
            });
        }
        let t = &s.timing;
        format!(
            "{results:?} chunks={} content={:?} tools={:?} usage={:?} finish={:?} worker={:?} stamps={} answer={} reasoning={}",
            s.chunks,
            s.content,
            s.tool_calls,
            s.usage,
            s.finish_reason,
            s.worker,
            t.token_chunks_us.len(),
            t.first_answer_us.is_some(),
            t.first_reasoning_us.is_some()
        )
    }

    /// Chunks of every shape the client may meet, the odd ones included.
    const CHUNKS: &[&str] = &[
        r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"hi \"there\" \u00e9"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#,
        r#"{"choices":[{"delta":{"reasoning":"hmm","reasoning_content":""}}]}"#,
        r#"{"choices":[{"delta":{"content":"<think>a</think>b"}}]}"#,
        r#"{"choices":[{"text":"word","finish_reason":"length"}],"nvext":{"worker_id":{"prefill_worker_id":1,"decode_worker_id":2}}}"#,
        r#"{"choices":[{"text":""}]}"#,
        r#"{"choices":[{"text":null,"delta":{"content":"x"}}]}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":32,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":64}}}"#,
        r#"{"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":32,"prompt_tokens_details":null}}"#,
        r#"{"choices":[],"usage":null}"#,
        r#"{"usage":{"completion_tokens":3.0,"prompt_tokens":-1}}"#,
        r#"{"usage":5}"#,
        r#"{"usage":{"prompt_tokens_details":[1]}}"#,
        r#"{"nvext":{"worker_id":7}}"#,
        r#"{"nvext":{"worker_id":99999999999}}"#,
        r#"{"nvext":{"worker_id":{"decode_worker_id":99999999999,"prefill_worker_id":3}}}"#,
        r#"{"nvext":{"worker_id":[1,2]}}"#,
        r#"{"nvext":{"worker_id":-1}}"#,
        r#"{"nvext":{"worker_id":"w1"}}"#,
        r#"{"nvext":[{"worker_id":1}]}"#,
        r#"{"error":{"message":"boom","type":"server_error"}}"#,
        r#"{"error":"plain"}"#,
        r#"{"error":null,"choices":[{"delta":{"content":"y"}}]}"#,
        r#"[null,null,[{"text":"arr"}],null]"#,
        r#"{"choices":{"0":{"text":"keyed"}}}"#,
        r#"{"choices":[5,{"text":"second"}]}"#,
        r#"{"choices":[{"text":"a"},{"text":7}]}"#,
        r#"{"choices":[{"delta":null}]}"#,
        r#"{"choices":[{"delta":[1,2]}]}"#,
        r#"{"choices":[{"delta":{"content":5}}]}"#,
        r#"{"choices":[{"finish_reason":1,"delta":{"content":"z"}}]}"#,
        r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
        r#"{"choices":[{"delta":{"content":"x"}}]} trailing"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"","name":"lookup"},"id":"call_1","index":0,"type":"function"}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{\"q\": 1}"},"index":0}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"x"},"index":1},{"id":"c2","index":2}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"y"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":99999999999,"function":{"arguments":"z"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":"1","function":{"arguments":"w"}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":5}}]}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":5}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[7]}}]}"#,
        "not json",
        "",
        "[DONE]",
    ];

    #[test]
    fn the_fast_decoding_reads_every_chunk_as_the_general_one_does() {
        // One chunk at a time, then every ordered pair (state carries across chunks).
        for a in CHUNKS {
            assert_eq!(read_with(&[a], false), read_with(&[a], true), "{a}");
            for b in CHUNKS {
                let pair = [*a, *b];
                assert_eq!(
                    read_with(&pair, false),
                    read_with(&pair, true),
                    "{a} then {b}"
                );
            }
        }
    }

    #[test]
    fn ordinary_chunks_take_the_fast_decoding() {
        for chunk in &CHUNKS[..10] {
            let fast = serde_json::from_str::<Object<Chunk<'_>>>(chunk);
            assert!(fast.is_ok_and(|Object(c)| c.error.is_none()), "{chunk}");
        }
    }

    /// A streamed tool call (mockserve's shape, as OpenAI's): pieced together by index; only
    /// deltas with argument text are token chunks (the first is the answer's first token), so
    /// the usage of a one-token call agrees.
    #[test]
    fn streamed_tool_calls_are_answer_tokens() {
        let mut s = state();
        for e in [
            r#"{"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,"index":0}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"","name":"lookup"},"id":"call_A","index":0,"type":"function"}]},"finish_reason":null,"index":0}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{}"},"index":0}]},"finish_reason":null,"index":0}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls","index":0}]}"#,
            r#"{"choices":[],"usage":{"completion_tokens":1,"prompt_tokens":64,"prompt_tokens_details":{"cached_tokens":0}}}"#,
            "[DONE]",
        ] {
            s.on_event(e).expect("not an error");
        }
        assert!(s.timing.first_answer_us.is_some());
        let r = s.finish(None);
        assert_eq!(r.failure, None);
        assert_eq!((r.chunks, r.output_tokens, r.usage_mismatch), (1, 1, false));
        assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                id: "call_A".into(),
                name: "lookup".into(),
                arguments: "{}".into()
            }]
        );
        assert_eq!(
            r.tool_calls[0].to_json(),
            serde_json::json!({"id": "call_A", "type": "function",
                "function": {"name": "lookup", "arguments": "{}"}})
        );
    }

    #[test]
    fn usage_tolerance() {
        // Several tokens per chunk is normal; fewer tokens than chunks or far more are not.
        assert!(!usage_disagrees(3, 3));
        assert!(!usage_disagrees(96, 3));
        assert!(usage_disagrees(2, 3));
        assert!(usage_disagrees(1000, 3));
        assert!(usage_disagrees(1, 0));
        assert!(!usage_disagrees(0, 0));
    }

    #[test]
    fn error_messages_of_common_bodies() {
        let openai = r#"{"error":{"message":"rate limited","type":"rate_limit_error","param":null,"code":null}}"#;
        assert_eq!(error_message(openai), "rate limited");
        assert_eq!(error_message(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(error_message(r#"{"error":"overloaded"}"#), "overloaded");
        assert_eq!(error_message("  Bad Gateway\n"), "Bad Gateway");
    }

    fn state() -> StreamState {
        StreamState::new(Instant::now())
    }

    #[test]
    fn streams_without_tokens_fail_and_contradicting_usage_is_not_used() {
        for events in [
            &["[DONE]"][..],
            &[r#"{"choices":[]}"#, "[DONE]"],
            &[
                "not json",
                r#"{"choices":[{"delta":{"role":"assistant"}}]}"#,
                "[DONE]",
            ],
        ] {
            let mut s = state();
            for e in events {
                s.on_event(e).expect("no error event");
            }
            let r = s.finish(None);
            assert_eq!(r.failure, Some(Failure::EmptyStream), "{events:?}");
        }
        let mut s = state();
        for _ in 0..3 {
            s.on_event(r#"{"choices":[{"delta":{"content":"x"}}]}"#)
                .expect("chunk");
        }
        s.on_event(r#"{"choices":[],"usage":{"completion_tokens":1000}}"#)
            .expect("usage");
        let r = s.finish(None);
        assert_eq!(r.failure, None);
        assert!(r.usage_mismatch);
        assert_eq!(
            (
                r.output_tokens,
                r.output_tokens_source,
                r.usage_output_tokens
            ),
            (3, TokenSource::Chunks, Some(1000))
        );
    }
}
