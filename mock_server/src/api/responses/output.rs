//! A response's output as its tokens arrive ([`Output`]): the output items (`reasoning`,
//! `message` with one `output_text` part, `function_call`) opened and closed as the answer's
//! pieces change kind, and, when streaming, the Responses SSE events that say so, each
//! `event: TYPE` and `data: {…, "type", "sequence_number"}`. [`Echo`] writes the response
//! object around them.

use serde_json::{json, Map, Value};

use crate::api::answer::Piece;
use crate::api::tools::{render_calls, ToolCall};

/// What kind of output item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// One output item.
#[derive(Debug)]
struct Item {
    kind: Kind,
    id: String,
    /// Reasoning or message text, or a call's arguments.
    text: String,
    /// A call's id and function.
    call: Option<(String, String)>,
    /// `completed` or `incomplete` once closed; `None` while open.
    status: Option<&'static str>,
}

impl Item {
    /// The item as `output` shows it (open: `in_progress` and, for parts, no content yet).
    fn json(&self) -> Value {
        let status = self.status.unwrap_or("in_progress");
        let open = self.status.is_none();
        match self.kind {
            Kind::Reasoning => json!({
                "id": self.id, "type": "reasoning", "summary": [], "status": status,
                "content": if open { json!([]) } else { json!([self.part()]) },
            }),
            Kind::Message => json!({
                "id": self.id, "type": "message", "role": "assistant", "status": status,
                "content": if open { json!([]) } else { json!([self.part()]) },
            }),
            Kind::Call => {
                let (call_id, name) = self.call.clone().unwrap_or_default();
                json!({
                    "id": self.id, "type": "function_call", "call_id": call_id, "name": name,
                    "arguments": if open { "" } else { self.text.as_str() }, "status": status,
                })
            }
        }
    }

    /// The content part of a reasoning or message item, with the text so far.
    fn part(&self) -> Value {
        match self.kind {
            Kind::Reasoning => json!({"type": "reasoning_text", "text": self.text}),
            _ => {
                json!({"type": "output_text", "text": self.text, "annotations": [], "logprobs": []})
            }
        }
    }
}

/// The output of one response, built token by token; with `streaming`, the SSE events too.
#[derive(Debug)]
pub(crate) struct Output {
    /// The response's id without its `resp_` prefix: item ids are it with theirs.
    key: String,
    items: Vec<Item>,
    /// The next event's `sequence_number`.
    sequence: u64,
    /// Tokens that were reasoning.
    pub reasoning_tokens: usize,
    /// Whether events are written.
    streaming: bool,
    /// SSE bytes written and not yet taken.
    events: Vec<u8>,
}

impl Output {
    /// An empty output for the response `resp_{key}`.
    pub(crate) fn new(key: &str, streaming: bool) -> Output {
        Output {
            key: key.to_string(),
            items: Vec::new(),
            sequence: 0,
            reasoning_tokens: 0,
            streaming,
            events: Vec::new(),
        }
    }

    /// Writes the event `kind` with `fields` (its `type` and `sequence_number` added).
    pub(crate) fn event(&mut self, kind: &str, fields: Value) {
        let sequence = self.sequence;
        self.sequence += 1;
        if !self.streaming {
            return;
        }
        let mut data = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(sequence));
        self.events.extend_from_slice(b"event: ");
        self.events.extend_from_slice(kind.as_bytes());
        self.events.extend_from_slice(b"\ndata: ");
        // A map of JSON values always serializes; should it not, the event is empty.
        let _ = serde_json::to_writer(&mut self.events, &data);
        self.events.extend_from_slice(b"\n\n");
    }

    /// The SSE bytes written since the last call.
    pub(crate) fn take_events(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.events)
    }

    /// Adds one token's piece (`calls`: its answer's tool calls).
    pub(crate) fn token(&mut self, piece: &Piece, calls: &[ToolCall]) {
        if let Some(fragment) = &piece.tool {
            let Some(call) = calls.get(fragment.call) else {
                return;
            };
            let index = self.open(Kind::Call, Some(call));
            if !fragment.arguments.is_empty() {
                self.items[index].text.push_str(&fragment.arguments);
                let id = self.items[index].id.clone();
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": fragment.arguments}),
                );
            }
            return;
        }
        if let Some(text) = &piece.reasoning {
            self.reasoning_tokens += 1;
            if !text.is_empty() {
                let index = self.open(Kind::Reasoning, None);
                self.items[index].text.push_str(text);
                let id = self.items[index].id.clone();
                self.event(
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "delta": text}),
                );
            }
        }
        if let Some(text) = piece.content.as_deref().filter(|t| !t.is_empty()) {
            let index = self.open(Kind::Message, None);
            self.items[index].text.push_str(text);
            let id = self.items[index].id.clone();
            self.event(
                "response.output_text.delta",
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text,
                       "logprobs": []}),
            );
        }
    }

    /// The index of the open item of `kind` (for a call, of that call), opening it (and
    /// closing the one before) when the last item is another.
    fn open(&mut self, kind: Kind, call: Option<&ToolCall>) -> usize {
        let call = call.map(|c| (c.id.clone(), c.name.clone()));
        if let Some(last) = self.items.last() {
            if last.status.is_none() && last.kind == kind && last.call == call {
                return self.items.len() - 1;
            }
        }
        self.close("completed");
        let prefix = match kind {
            Kind::Reasoning => "rs",
            Kind::Message => "msg",
            Kind::Call => "fc",
        };
        let index = self.items.len();
        let item = Item {
            kind,
            id: format!("{prefix}_{}{index:02}", self.key),
            text: String::new(),
            call,
            status: None,
        };
        let json = item.json();
        let part = (kind != Kind::Call).then(|| (item.id.clone(), item.part()));
        self.items.push(item);
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": json}),
        );
        if let Some((id, part)) = part {
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        index
    }

    /// Closes the last item if it is open, with `status`, and writes its `done` events.
    fn close(&mut self, status: &'static str) {
        let index = self.items.len().saturating_sub(1);
        let Some(item) = self.items.last_mut().filter(|i| i.status.is_none()) else {
            return;
        };
        item.status = Some(status);
        let (kind, id, text) = (item.kind, item.id.clone(), item.text.clone());
        let (json, part) = (item.json(), item.part());
        match kind {
            Kind::Reasoning => self.event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
            ),
            Kind::Message => self.event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                       "logprobs": []}),
            ),
            Kind::Call => self.event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "arguments": text}),
            ),
        }
        if kind != Kind::Call {
            self.event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": json}),
        );
    }

    /// Ends the output: a text answer without text still gets its (empty) message unless the
    /// limit cut it (`cut`), and the last item closes `incomplete` when cut.
    pub(crate) fn finish(&mut self, cut: bool) {
        let answered = self.items.iter().any(|i| i.kind != Kind::Reasoning);
        if !answered && !cut {
            self.open(Kind::Message, None);
        }
        self.close(if cut { "incomplete" } else { "completed" });
    }

    /// The `output` array.
    pub(crate) fn items(&self) -> Vec<Value> {
        self.items.iter().map(Item::json).collect()
    }

    /// The output as the conversation's next prompt shows it: the message's text and the
    /// calls, rendered as chat renders an assistant turn (reasoning dropped).
    pub(crate) fn history(&self) -> String {
        let mut text = String::new();
        for item in &self.items {
            match (item.kind, &item.call) {
                (Kind::Message, _) => text.push_str(&item.text),
                (Kind::Call, Some((id, name))) => text.push_str(&render_calls(&[ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: item.text.clone(),
                }])),
                _ => {}
            }
        }
        text
    }
}

/// What the response object echoes of its request, and its identity.
#[derive(Clone, Debug)]
pub(crate) struct Echo {
    /// `resp_…`.
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The request's model.
    pub model: String,
    /// `instructions`.
    pub instructions: Option<String>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<usize>,
    /// `previous_response_id`.
    pub previous: Option<String>,
    /// `store`.
    pub store: bool,
    /// `temperature`.
    pub temperature: f64,
    /// `top_p`.
    pub top_p: f64,
    /// `tools` as sent.
    pub tools: Value,
    /// `tool_choice` as sent.
    pub tool_choice: Value,
    /// `metadata`.
    pub metadata: Value,
}

impl Echo {
    /// The response object with `status`, `output` and `usage` (`null` until it ends).
    pub(crate) fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": null,
            "metadata": self.metadata,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": self.previous,
            "reasoning": {"effort": null, "summary": null},
            "service_tier": "default",
            "store": self.store,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": self.tool_choice,
            "tools": self.tools,
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": null,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::answer::ToolFragment;

    fn events(out: &mut Output) -> Vec<(String, Value)> {
        let bytes = out.take_events();
        let text = String::from_utf8(bytes).expect("UTF-8");
        text.split_terminator("\n\n")
            .map(|event| {
                let (head, data) = event.split_once('\n').expect("two lines");
                let kind = head.strip_prefix("event: ").expect("event line");
                let data = data.strip_prefix("data: ").expect("data line");
                (kind.to_string(), serde_json::from_str(data).expect("JSON"))
            })
            .collect()
    }

    fn text(reasoning: bool, s: &str) -> Piece {
        if reasoning {
            Piece {
                reasoning: Some(s.into()),
                ..Piece::default()
            }
        } else {
            Piece {
                content: Some(s.into()),
                ..Piece::default()
            }
        }
    }

    #[test]
    fn reasoning_then_text_open_and_close_their_items_in_order() {
        let mut out = Output::new("k", true);
        for piece in [text(true, "a"), text(true, "b"), text(false, "c")] {
            out.token(&piece, &[]);
        }
        out.finish(false);
        let got = events(&mut out);
        let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        for (i, (kind, data)) in got.iter().enumerate() {
            assert_eq!(data["type"], json!(kind));
            assert_eq!(data["sequence_number"], json!(i));
        }
        assert_eq!(got[4].1["text"], "ab");
        assert_eq!(got[12].1["item"]["content"][0]["text"], "c");
        assert_eq!(out.reasoning_tokens, 2);
        assert_eq!(out.history(), "c");
        assert_eq!(out.items()[0]["content"][0]["type"], "reasoning_text");
    }

    #[test]
    fn a_cut_call_is_incomplete_and_renders_into_history() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{\"a\":".into(),
        };
        let mut out = Output::new("k", false);
        for (i, arguments) in ["{\"a\"", ":"].iter().enumerate() {
            let piece = Piece {
                tool: Some(ToolFragment {
                    call: 0,
                    first: i == 0,
                    arguments: arguments.to_string(),
                }),
                ..Piece::default()
            };
            out.token(&piece, std::slice::from_ref(&call));
        }
        out.finish(true);
        assert!(out.take_events().is_empty());
        let items = out.items();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["status"], "incomplete");
        assert_eq!(items[0]["arguments"], "{\"a\":");
        assert_eq!(items[0]["call_id"], "call_1");
        assert_eq!(out.history(), render_calls(&[call]));
    }
}
