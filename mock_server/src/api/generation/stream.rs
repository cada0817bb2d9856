//! The streaming writer: a [`Generation`]'s steps as SSE events, `data: {chunk}` with a blank
//! line after each, ending in `data: [DONE]`. Chunks are written straight into the body's
//! buffer, byte for byte what serialising the chunk objects gives; an error after the first
//! byte is a final `data: {"error":…}` event. Dropping the body (the client left) drops the
//! generation, which cancels its engine requests.

use std::convert::Infallible;

use axum::body::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};

use super::{Endpoint, Generation, Step, SYSTEM_FINGERPRINT};
use crate::api::logprobs::{chat_logprobs, completion_logprobs, TokenLogprob};

impl Generation {
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
    pub(crate) fn write_role_chunks(&self, frame: &ChunkFrame, out: &mut Vec<u8>) {
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
    pub(crate) fn write_token(
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
                // The echoed prompt's log-probabilities go with it.
                let prompt = echo.as_ref().and_then(|_| c.prompt_logprobs.take());
                let echo = echo.unwrap_or_default();
                let offset = c.text_chars + echo.chars().count();
                c.text_chars = offset + answer.chars().count();
                let prompt = prompt.as_deref().map_or(&[][..], Vec::as_slice);
                let tokens: Vec<&TokenLogprob> = piece.logprob.iter().collect();
                let logprobs = (piece.logprob.is_some() || !prompt.is_empty())
                    .then(|| completion_logprobs(prompt, &tokens, offset));
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
    pub(crate) fn finish_chunk(&mut self, choice: usize) -> Value {
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
            Endpoint::Text => {
                // An echo not sent yet (the answer showed no text) goes here, with its prompt's
                // log-probabilities.
                let echo = c.echo.take();
                let prompt = echo.as_ref().and_then(|_| c.prompt_logprobs.take());
                let logprobs = prompt.map_or(Value::Null, |p| completion_logprobs(&p, &[], 0));
                json!({
                    "index": c.index, "text": echo.unwrap_or_default(), "logprobs": logprobs,
                    "finish_reason": finish, "stop_reason": stop_reason,
                })
            }
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
    pub(crate) fn usage_chunk(&self) -> Value {
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
pub(crate) struct ChunkFrame {
    suffix: Vec<u8>,
}

impl ChunkFrame {
    /// The frame of `generation`'s chunks.
    pub(crate) fn new(generation: &Generation) -> ChunkFrame {
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

/// What a streamed body writes for each engine step: chat's and completions' chunks here,
/// Anthropic's message events and the Responses API's events in their own modules. [`frames`]
/// is the one loop that drives every writer.
pub(crate) trait StepWriter: Send + 'static {
    /// The generation whose steps are written.
    fn generation(&mut self) -> &mut Generation;

    /// Writes the events of one step into `out`; true once the stream has ended.
    fn write_step(&mut self, step: Step, out: &mut Vec<u8>) -> bool;
}

/// A streamed body: `opening` at once (when not empty), then the writer's events. Dropping it
/// (client gone) drops the generation, which cancels the engine requests.
///
/// Each body frame carries every step that is ready when the stream is polled (tokens the
/// engine emitted together, a finish and the end), up to [`MAX_FRAME_BYTES`]: the events are
/// the same whatever the framing, and hyper writes one frame with one chunk header.
pub(crate) fn frames<W: StepWriter>(
    writer: W,
    opening: Vec<u8>,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let start = (writer, Some(opening), false);
    futures_util::stream::unfold(start, |(mut writer, opening, mut ended)| async move {
        if let Some(opening) = opening.filter(|o| !o.is_empty()) {
            return Some((Ok(Bytes::from(opening)), (writer, None, ended)));
        }
        let mut out = Vec::new();
        while !ended {
            let step = writer.generation().next().await;
            ended = writer.write_step(step, &mut out);
            while !ended && out.len() < MAX_FRAME_BYTES {
                let Some(step) = writer.generation().try_next() else {
                    break;
                };
                ended = writer.write_step(step, &mut out);
            }
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), (writer, None, ended)));
            }
        }
        None
    })
}

/// The state of a streamed chat or completion body.
struct SseBody {
    generation: Generation,
    frame: ChunkFrame,
    include_usage: bool,
}

impl StepWriter for SseBody {
    fn generation(&mut self) -> &mut Generation {
        &mut self.generation
    }

    /// Writes the SSE events of one step into `out`.
    fn write_step(&mut self, step: Step, out: &mut Vec<u8>) -> bool {
        let generation = &mut self.generation;
        match step {
            Step::Token { choice, token } => {
                generation.write_token(&self.frame, choice, token, out);
                false
            }
            Step::Finished { choice } => {
                push_event(out, &generation.finish_chunk(choice));
                if !generation.done {
                    return false;
                }
                if self.include_usage {
                    push_event(out, &generation.usage_chunk());
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                true
            }
            Step::Error(e) => {
                generation.state.metrics.http_failures.inc();
                push_event(out, &e.body());
                out.extend_from_slice(b"data: [DONE]\n\n");
                true
            }
        }
    }
}

/// The SSE body of a streamed chat or completion: the role chunks, then a chunk per token, the
/// finish chunks, the usage chunk when asked and `data: [DONE]` ([`frames`]).
pub(crate) fn sse_stream(
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
    };
    frames(body, opening)
}

#[cfg(test)]
mod tests {
    use servesim::cluster::ClusterConfig;
    use servesim::request::Prompt;

    use servesim::time::SimTime;

    use super::super::{Choice, ExtraFields, Header, ReadyChoices};
    use super::*;
    use crate::api::answer::{Answer, FinishReason, Piece, ToolFragment};
    use crate::api::logprobs::TokenLogprob;
    use crate::api::tools::ToolCall;
    use crate::api::AppState;
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
                let prompt = echo.as_ref().and_then(|_| c.prompt_logprobs.take());
                let echo = echo.unwrap_or_default();
                let offset = c.text_chars + echo.chars().count();
                c.text_chars = offset + answer.chars().count();
                let prompt = prompt.as_deref().map_or(&[][..], Vec::as_slice);
                let tokens: Vec<&TokenLogprob> = piece.logprob.iter().collect();
                let logprobs = if piece.logprob.is_some() || !prompt.is_empty() {
                    completion_logprobs(prompt, &tokens, offset)
                } else {
                    Value::Null
                };
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
            _reservation: state.engine.inflight().try_reserve(0).expect("room"),
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
}
