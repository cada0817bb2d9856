//! The state of one stream being read: what its chunks said so far, the times they came, and
//! the [`Response`] it ends as.

use serde_json::Value;
use tokio::time::Instant;

use crate::run::client::chunk::{engine_ms, worker_of, Chunk, Facts, Object, ToolDelta};
use crate::run::client::response::{usage_disagrees, Response, Timing, TokenSource, ToolCall};
use crate::run::failure::Failure;

pub(super) fn us(start: Instant) -> u64 {
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

/// State of one stream being read.
pub(super) struct StreamState {
    start: Instant,
    pub(super) timing: Timing,
    content: String,
    chunks: u64,
    usage: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    finish_reason: Option<String>,
    worker: Option<u32>,
    tool_calls: Vec<ToolCall>,
    think: InlineThink,
    pub(super) done: bool,
    /// The server's id of the response (`response.id` of a Responses stream), for
    /// `previous_response_id`.
    pub(super) response_id: Option<String>,
    /// The request generates no tokens (embeddings): no output, and no token needed to succeed.
    pub(super) no_output: bool,
    /// The server's key of each tool call, by call (Responses' `output_index`, Messages'
    /// content block `index`), at most [`MAX_TOOL_CALLS`].
    tool_keys: Vec<u64>,
}

impl StreamState {
    /// A stream sent at `start`, nothing read yet.
    pub(super) fn new(start: Instant) -> StreamState {
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
            response_id: None,
            no_output: false,
            tool_keys: Vec::new(),
        }
    }

    /// The tool call the server keys `key`: a new one when `added` (None past
    /// [`MAX_TOOL_CALLS`], or for a key never added).
    pub(super) fn tool_index(&mut self, key: u64, added: bool) -> Option<usize> {
        if let Some(i) = self.tool_keys.iter().position(|&k| k == key) {
            return Some(i);
        }
        if !added || self.tool_keys.len() >= MAX_TOOL_CALLS {
            return None;
        }
        self.tool_keys.push(key);
        Some(self.tool_keys.len() - 1)
    }

    /// True once the answer streamed a tool call.
    pub(super) fn has_tool_calls(&self) -> bool {
        !self.tool_calls.is_empty()
    }

    /// µs since the send.
    pub(super) fn elapsed_us(&self) -> u64 {
        us(self.start)
    }

    /// Stamps an event's arrival (the first one is `first_chunk_us`); returns its offset.
    pub(super) fn arrived(&mut self) -> u64 {
        let t = us(self.start);
        self.timing.first_chunk_us.get_or_insert(t);
        t
    }

    /// Answer text streamed at `t` (Responses' `output_text`, Messages' `text_delta`): a token
    /// chunk when not empty.
    pub(super) fn answer_text(&mut self, t: u64, text: &str) {
        if !text.is_empty() {
            self.content.push_str(text);
            self.token_chunk(t, true);
        }
    }

    /// Reasoning text streamed at `t`: a token chunk when not empty.
    pub(super) fn reasoning_text(&mut self, t: u64, text: &str) {
        if !text.is_empty() {
            self.token_chunk(t, false);
        }
    }

    /// A piece of tool call `index` streamed at `t`: a token chunk (an answer token) when it
    /// carries argument text.
    pub(super) fn tool_delta(&mut self, t: u64, delta: ToolDelta<'_>) {
        if self.merge_tool_delta(delta) {
            self.token_chunk(t, true);
        }
    }

    /// Counts one token chunk at `t`, an answer or a reasoning one.
    fn token_chunk(&mut self, t: u64, answer: bool) {
        self.chunks += 1;
        self.timing.token_chunks_us.push(t);
        if answer {
            self.timing.first_answer_us.get_or_insert(t);
        } else {
            self.timing.first_reasoning_us.get_or_insert(t);
        }
    }

    /// Usage as one event reports it: (output, prompt, cached) tokens, each kept from an
    /// earlier event when this one leaves it out (Messages sends the prompt's in
    /// `message_start`, the output's in `message_delta`).
    pub(super) fn merge_usage(&mut self, usage: (Option<u64>, Option<u64>, Option<u64>)) {
        let old = self.usage.unwrap_or((None, None, None));
        self.usage = Some((usage.0.or(old.0), usage.1.or(old.1), usage.2.or(old.2)));
    }

    /// The reason the answer ended (`stop`, `length`, `tool_calls`, ...).
    pub(super) fn set_finish_reason(&mut self, reason: &str) {
        self.finish_reason = Some(reason.to_string());
    }

    /// Adds a tool-call delta to the call at its index; true when it carried argument text.
    fn merge_tool_delta(&mut self, (index, id, name, arguments): ToolDelta<'_>) -> bool {
        if index >= MAX_TOOL_CALLS {
            return false;
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
        !arguments.is_empty()
    }

    /// Handles one SSE data payload; `Err` is a server error event.
    ///
    /// A chunk is decoded straight into the few fields read ([`Chunk`], borrowing its strings);
    /// one that does not fit that shape exactly (an `error` member, a field of another type, a
    /// repeated key, not JSON) is read again as a [`Value`], which decides.
    pub(super) fn on_event(&mut self, data: &str) -> Result<(), Failure> {
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
                engine: ["ttft_ms", "total_time_ms"].map(|k| {
                    engine_ms(v.pointer("/nvext/timing").and_then(|t| t.get(k)?.as_f64()))
                }),
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
        let [ttft, e2e] = facts.engine;
        self.timing.engine_ttft_ms = ttft.or(self.timing.engine_ttft_ms);
        self.timing.engine_e2e_ms = e2e.or(self.timing.engine_e2e_ms);
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
        for delta in facts.tool_calls {
            tool_tokens |= self.merge_tool_delta(delta);
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

    pub(super) fn finish(mut self, failure: Option<Failure>) -> Response {
        self.timing.end_us = us(self.start);
        let (usage_tokens, prompt, cached) = self.usage.unwrap_or((None, None, None));
        if self.no_output {
            return self.finish_without_output(failure, prompt);
        }
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
            response_id: self.response_id,
            failure,
        }
    }

    /// [`StreamState::finish`] of a request that generates no tokens (embeddings): zero output
    /// tokens, by the server's word.
    fn finish_without_output(mut self, failure: Option<Failure>, prompt: Option<u64>) -> Response {
        // The answer's one "token" is its end: TTFT and E2E are the same instant.
        if let Some(&t) = self.timing.token_chunks_us.last() {
            self.timing.end_us = t;
        }
        Response {
            timing: self.timing,
            content: self.content,
            output_tokens: 0,
            output_tokens_source: TokenSource::Usage,
            chunks: 0,
            usage_output_tokens: None,
            usage_mismatch: false,
            prompt_tokens: prompt,
            cached_tokens: None,
            finish_reason: self.finish_reason,
            worker: self.worker,
            tool_calls: Vec::new(),
            response_id: None,
            failure,
        }
    }
}

/// Tool calls of one answer kept at most (a delta with a larger index is ignored): an index is
/// the server's to choose, and it must not size a vector.
pub(crate) const MAX_TOOL_CALLS: usize = 128;

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
