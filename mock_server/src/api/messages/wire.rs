//! A [`Generation`] on the Messages wire: its answer's pieces as content blocks (`thinking`,
//! `text`, `tool_use`), streamed as Anthropic's named SSE events ([`sse_stream`]) or gathered
//! into one `message` object ([`collect`]). Both fold the same [`BlockEvent`]s, so a streamed
//! answer and a whole one hold the same blocks.

use std::convert::Infallible;

use axum::body::Bytes;
use futures_util::Stream;
use serde_json::{json, Value};

use super::error::push_error_event;
use crate::api::answer::{Answer, FinishReason, Piece};
use crate::api::error::ApiError;
use crate::api::generation::stream::{frames, StepWriter};
use crate::api::generation::{Generation, Step};

/// A `tool_use` block's id for a chat tool call's: `toolu_` and the call's seeded letters.
pub(crate) fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// What kind of content block is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BlockKind {
    /// Reasoning (`--reasoning-format separate`).
    Thinking,
    /// Answer text.
    Text,
    /// A tool call: its index in the answer's calls.
    ToolUse(usize),
}

/// One change to the message's content blocks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum BlockEvent {
    /// `content_block_start`.
    Start {
        /// The block's index in `content`.
        index: usize,
        /// The empty block.
        block: Value,
    },
    /// `content_block_delta`.
    Delta {
        /// The block's index in `content`.
        index: usize,
        /// The delta object (`text_delta`, `thinking_delta`, `signature_delta`,
        /// `input_json_delta`).
        delta: Value,
    },
    /// `content_block_stop`.
    Stop {
        /// The block's index in `content`.
        index: usize,
    },
}

/// The blocks of one answer as its pieces arrive: which block is open and the next index.
#[derive(Debug)]
pub(crate) struct Blocks {
    open: Option<(usize, BlockKind)>,
    next: usize,
    /// The `signature` of thinking blocks (the server's own: it checks none).
    signature: String,
}

impl Blocks {
    /// No block open yet; `signature` closes every thinking block.
    pub(crate) fn new(signature: String) -> Blocks {
        Blocks {
            open: None,
            next: 0,
            signature,
        }
    }

    /// Opens the block `kind` (closing the open one unless it is that block already).
    fn enter(&mut self, kind: BlockKind, answer: &Answer, out: &mut Vec<BlockEvent>) -> usize {
        if let Some((index, open)) = self.open {
            if open == kind {
                return index;
            }
        }
        self.close(out);
        let index = self.next;
        self.next += 1;
        let block = match kind {
            BlockKind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            BlockKind::Text => json!({"type": "text", "text": ""}),
            BlockKind::ToolUse(call) => {
                let (id, name) = answer
                    .tool_calls
                    .get(call)
                    .map(|c| (tool_use_id(&c.id), c.name.clone()))
                    .unwrap_or_default();
                json!({"type": "tool_use", "id": id, "name": name, "input": {}})
            }
        };
        out.push(BlockEvent::Start { index, block });
        self.open = Some((index, kind));
        index
    }

    /// Closes the open block, if any (a thinking block gets its signature first).
    pub(crate) fn close(&mut self, out: &mut Vec<BlockEvent>) {
        let Some((index, kind)) = self.open.take() else {
            return;
        };
        if kind == BlockKind::Thinking {
            let delta = json!({"type": "signature_delta", "signature": self.signature});
            out.push(BlockEvent::Delta { index, delta });
        }
        out.push(BlockEvent::Stop { index });
    }

    /// Opens the block of the answer's first visible piece before any token arrives, so a
    /// stream can start it at once (its first token is then only a delta).
    pub(crate) fn open_first(&mut self, answer: &Answer, out: &mut Vec<BlockEvent>) {
        if let Some(kind) = answer.pieces.iter().find_map(first_kind) {
            self.enter(kind, answer, out);
        }
    }

    /// The events of one token's piece.
    pub(crate) fn piece(&mut self, piece: &Piece, answer: &Answer, out: &mut Vec<BlockEvent>) {
        if let Some(text) = piece.reasoning.as_deref().filter(|t| !t.is_empty()) {
            let index = self.enter(BlockKind::Thinking, answer, out);
            let delta = json!({"type": "thinking_delta", "thinking": text});
            out.push(BlockEvent::Delta { index, delta });
        }
        if let Some(text) = piece.content.as_deref().filter(|t| !t.is_empty()) {
            let index = self.enter(BlockKind::Text, answer, out);
            let delta = json!({"type": "text_delta", "text": text});
            out.push(BlockEvent::Delta { index, delta });
        }
        if let Some(fragment) = &piece.tool {
            let index = self.enter(BlockKind::ToolUse(fragment.call), answer, out);
            if !fragment.arguments.is_empty() {
                let delta = json!({"type": "input_json_delta", "partial_json": fragment.arguments});
                out.push(BlockEvent::Delta { index, delta });
            }
        }
    }
}

/// The kind of the first block a piece shows, if it shows anything.
fn first_kind(piece: &Piece) -> Option<BlockKind> {
    if piece.reasoning.as_deref().is_some_and(|t| !t.is_empty()) {
        Some(BlockKind::Thinking)
    } else if piece.content.as_deref().is_some_and(|t| !t.is_empty()) {
        Some(BlockKind::Text)
    } else {
        piece.tool.as_ref().map(|f| BlockKind::ToolUse(f.call))
    }
}

/// `stop_reason` and `stop_sequence` of an answer: a tool call is `tool_use`, the output
/// limit `max_tokens`, a matched stop string `stop_sequence` (naming it), else `end_turn`.
pub(crate) fn stop_reason(answer: &Answer) -> (&'static str, Value) {
    match answer.finish_reason {
        FinishReason::ToolCalls => ("tool_use", Value::Null),
        FinishReason::Length => ("max_tokens", Value::Null),
        FinishReason::Stop => match &answer.stop_reason {
            Some(Value::String(stop)) => ("stop_sequence", Value::String(stop.clone())),
            _ => ("end_turn", Value::Null),
        },
    }
}

/// The message's `usage`: `input_tokens` is the whole prompt, cached or not, as vLLM reports
/// it; `cache_read_input_tokens` the prefix-cache hit at admission.
fn usage(generation: &Generation) -> Value {
    let (prompt, cached, output) = generation.choices.first().map_or((0, 0, 0), |c| {
        (
            c.prompt_tokens,
            c.cached_tokens.unwrap_or(0),
            c.completion_tokens,
        )
    });
    json!({
        "input_tokens": prompt,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    })
}

/// The `message` object with `content` and the generation's stop reason and usage so far.
fn message(generation: &Generation, content: Value) -> Value {
    let (reason, sequence, usage) = match generation.choices.first() {
        Some(c) if c.done => {
            let (reason, sequence) = stop_reason(&c.answer);
            (Value::from(reason), sequence, usage(generation))
        }
        _ => (Value::Null, Value::Null, usage(generation)),
    };
    json!({
        "id": generation.header.id,
        "type": "message",
        "role": "assistant",
        "model": generation.header.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage,
    })
}

/// Runs a one-choice generation to its end and returns the `message` object.
pub(crate) async fn collect(
    mut generation: Generation,
    signature: String,
) -> Result<Value, ApiError> {
    let mut blocks = Blocks::new(signature);
    let mut content: Vec<Value> = Vec::new();
    let mut events = Vec::new();
    loop {
        match generation.next().await {
            Step::Token { choice, token } => {
                if let Some(c) = generation.choices.get(choice) {
                    if let Some(piece) = c.answer.pieces.get(token) {
                        blocks.piece(piece, &c.answer, &mut events);
                    }
                }
            }
            Step::Finished { .. } => {
                if generation.done {
                    break;
                }
            }
            Step::Error(e) => return Err(e),
        }
        fold(&mut content, events.drain(..));
    }
    blocks.close(&mut events);
    fold(&mut content, events.drain(..));
    Ok(message(&generation, Value::Array(content)))
}

/// Applies block events to the content list (a tool block's `input` is parsed from its JSON
/// fragments when it stops: an object cut by the output limit reads `{}`).
fn fold(content: &mut Vec<Value>, events: impl Iterator<Item = BlockEvent>) {
    for event in events {
        match event {
            BlockEvent::Start { block, .. } => {
                let mut block = block;
                if block["type"] == "tool_use" {
                    block["partial_json"] = Value::String(String::new());
                }
                content.push(block);
            }
            BlockEvent::Delta { index, delta } => {
                let Some(block) = content.get_mut(index) else {
                    continue;
                };
                let (field, key) = match delta["type"].as_str() {
                    Some("text_delta") => ("text", "text"),
                    Some("thinking_delta") => ("thinking", "thinking"),
                    Some("signature_delta") => ("signature", "signature"),
                    Some("input_json_delta") => ("partial_json", "partial_json"),
                    _ => continue,
                };
                let add = delta[key].as_str().unwrap_or_default();
                if let Some(Value::String(text)) = block.get_mut(field) {
                    text.push_str(add);
                }
            }
            BlockEvent::Stop { index } => {
                let Some(block) = content.get_mut(index).and_then(Value::as_object_mut) else {
                    continue;
                };
                if let Some(Value::String(json)) = block.remove("partial_json") {
                    let input = serde_json::from_str::<Value>(&json)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    block.insert("input".into(), input);
                }
            }
        }
    }
}

/// Appends the SSE event `event: NAME` / `data: {value}`.
fn push_event(out: &mut Vec<u8>, name: &str, value: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    // A `Value` always serializes.
    out.extend_from_slice(value.to_string().as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends block events as SSE events.
fn push_blocks(out: &mut Vec<u8>, events: &mut Vec<BlockEvent>) {
    for event in events.drain(..) {
        match event {
            BlockEvent::Start { index, block } => push_event(
                out,
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            ),
            BlockEvent::Delta { index, delta } => push_event(
                out,
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ),
            BlockEvent::Stop { index } => push_event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ),
        }
    }
}

/// The state of a streamed message's body.
struct MessageBody {
    generation: Generation,
    blocks: Blocks,
    events: Vec<BlockEvent>,
}

impl StepWriter for MessageBody {
    fn generation(&mut self) -> &mut Generation {
        &mut self.generation
    }

    fn write_step(&mut self, step: Step, out: &mut Vec<u8>) -> bool {
        let generation = &mut self.generation;
        match step {
            Step::Token { choice, token } => {
                if let Some(c) = generation.choices.get(choice) {
                    if let Some(piece) = c.answer.pieces.get(token) {
                        self.blocks.piece(piece, &c.answer, &mut self.events);
                    }
                }
                push_blocks(out, &mut self.events);
                false
            }
            Step::Finished { .. } => {
                if !generation.done {
                    return false;
                }
                self.blocks.close(&mut self.events);
                push_blocks(out, &mut self.events);
                let (reason, sequence) = generation
                    .choices
                    .first()
                    .map_or(("end_turn", Value::Null), |c| stop_reason(&c.answer));
                push_event(
                    out,
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": usage(generation),
                    }),
                );
                push_event(out, "message_stop", &json!({"type": "message_stop"}));
                true
            }
            Step::Error(e) => {
                generation.state.metrics.http_failures.inc();
                push_error_event(out, &e);
                true
            }
        }
    }
}

/// The SSE body of a streamed message: `message_start`, the first block's
/// `content_block_start` and `ping` at once, then `content_block_delta`s as the engine emits
/// tokens (blocks stopped and started as the answer moves from thinking to text or tool use),
/// the last `content_block_stop`, `message_delta` and `message_stop`. An error after the first
/// byte is a final `event: error`. Dropping the body (the client left) cancels the engine
/// request.
pub(crate) fn sse_stream(
    generation: Generation,
    signature: String,
) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let mut blocks = Blocks::new(signature);
    let mut opening = Vec::new();
    push_event(
        &mut opening,
        "message_start",
        &json!({"type": "message_start", "message": message(&generation, json!([]))}),
    );
    let mut events = Vec::new();
    if let Some(c) = generation.choices.first() {
        blocks.open_first(&c.answer, &mut events);
    }
    push_blocks(&mut opening, &mut events);
    push_event(&mut opening, "ping", &json!({"type": "ping"}));
    let body = MessageBody {
        generation,
        blocks,
        events,
    };
    frames(body, opening)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::answer::ToolFragment;
    use crate::api::tools::ToolCall;

    fn text(t: &str) -> Piece {
        Piece {
            content: Some(t.into()),
            ..Piece::default()
        }
    }

    fn answer(pieces: Vec<Piece>, calls: Vec<ToolCall>) -> Answer {
        Answer {
            tokens: vec![0; pieces.len()],
            pieces,
            finish_reason: FinishReason::Stop,
            stop_reason: None,
            tool_calls: calls,
        }
    }

    #[test]
    fn pieces_fold_into_thinking_text_and_tool_blocks() {
        let call = ToolCall {
            id: "call_abc".into(),
            name: "get".into(),
            arguments: "{\"a\":1}".into(),
        };
        let fragment = |first, arguments: &str| Piece {
            tool: Some(ToolFragment {
                call: 0,
                first,
                arguments: arguments.into(),
            }),
            ..Piece::default()
        };
        let pieces = vec![
            Piece {
                reasoning: Some("hm".into()),
                ..Piece::default()
            },
            text("Hi"),
            text(""),
            text(" there"),
            fragment(true, "{\"a\""),
            fragment(false, ":1}"),
        ];
        let answer = answer(pieces, vec![call]);
        let mut blocks = Blocks::new("sig".into());
        let mut events = Vec::new();
        blocks.open_first(&answer, &mut events);
        for piece in &answer.pieces {
            blocks.piece(piece, &answer, &mut events);
        }
        blocks.close(&mut events);
        let starts = events
            .iter()
            .filter(|e| matches!(e, BlockEvent::Start { .. }))
            .count();
        assert_eq!(starts, 3, "{events:?}");
        let mut content = Vec::new();
        fold(&mut content, events.into_iter());
        assert_eq!(
            Value::Array(content),
            json!([
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "text", "text": "Hi there"},
                {"type": "tool_use", "id": "toolu_abc", "name": "get", "input": {"a": 1}},
            ])
        );
    }

    #[test]
    fn a_cut_tool_input_reads_as_an_empty_object() {
        let mut content = Vec::new();
        let events = vec![
            BlockEvent::Start {
                index: 0,
                block: json!({"type": "tool_use", "id": "t", "name": "n", "input": {}}),
            },
            BlockEvent::Delta {
                index: 0,
                delta: json!({"type": "input_json_delta", "partial_json": "{\"a\": [1,"}),
            },
            BlockEvent::Stop { index: 0 },
        ];
        fold(&mut content, events.into_iter());
        assert_eq!(content[0]["input"], json!({}));
    }

    #[test]
    fn stop_reasons_follow_the_answer() {
        let mut a = answer(vec![], vec![]);
        assert_eq!(stop_reason(&a).0, "end_turn");
        a.stop_reason = Some(json!("END"));
        assert_eq!(stop_reason(&a), ("stop_sequence", json!("END")));
        a.stop_reason = Some(json!(7));
        assert_eq!(stop_reason(&a).0, "end_turn");
        a.finish_reason = FinishReason::Length;
        assert_eq!(stop_reason(&a).0, "max_tokens");
        a.finish_reason = FinishReason::ToolCalls;
        assert_eq!(stop_reason(&a).0, "tool_use");
    }
}
