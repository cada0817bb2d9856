//! Collection of a non-streamed answer: a [`Generation`] run to its end, its choices' pieces
//! gathered and the one response object (`chat.completion` or `text_completion`) serialized.
//! An error before the end is the whole answer instead.

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{json, Value};

use super::{Endpoint, Generation, Step, SYSTEM_FINGERPRINT};
use crate::api::error::ApiError;
use crate::api::logprobs::{entries, CompletionEntry, TokenLogprob};

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
pub(crate) async fn collect(mut generation: Generation) -> Result<Vec<u8>, ApiError> {
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
            let echoed = c.prompt_logprobs.as_ref().map_or(0, |p| {
                p.len() * (1 + p.first().map_or(0, |lp| lp.top.len()))
            });
            c.completion_tokens * (1 + top) + echoed
        })
        .sum();
    let heavy = entries > 1 << 16 || generation.choices.len() > 1024;
    crate::api::budget::off_runtime(heavy, move || response_body(&generation, collected)).await?
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
                prompt: &[],
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
                    if c.echo.is_some() {
                        choice_logprobs.prompt = c.prompt_logprobs.as_deref().map_or(&[], |p| p);
                    }
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
/// parallel arrays ([`completion_logprobs`]): an echoed prompt's tokens first (from offset 0),
/// then the answer's, the first at `offset` characters.
struct ChoiceLogprobs<'a> {
    endpoint: Endpoint,
    prompt: &'a [TokenLogprob],
    tokens: Vec<&'a TokenLogprob>,
    offset: usize,
}

impl<'a> Serialize for ChoiceLogprobs<'a> {
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
                    prompt: self.prompt,
                    tokens: &self.tokens,
                    offset: self.offset,
                };
                map.serialize_entry("text_offset", &offsets)?;
                let all = || entries(self.prompt, &self.tokens);
                let logprob = |e: CompletionEntry<'_>| e.logprob();
                map.serialize_entry("token_logprobs", &Seq(all(), logprob))?;
                let text = |e: CompletionEntry<'a>| e.token.token.as_str();
                map.serialize_entry("tokens", &Seq(all(), text))?;
                let top = |e: CompletionEntry<'a>| e.top();
                map.serialize_entry("top_logprobs", &Seq(all(), top))?;
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

/// A sequence of `f(entry)` for each completions entry, made as it is written.
struct Seq<I, F>(I, F);

impl<'a, I, U, F> Serialize for Seq<I, F>
where
    I: Iterator<Item = CompletionEntry<'a>> + Clone,
    U: Serialize,
    F: Fn(CompletionEntry<'a>) -> U,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(None)?;
        for entry in self.0.clone() {
            seq.serialize_element(&(self.1)(entry))?;
        }
        seq.end()
    }
}

/// Completions `text_offset`: where each token starts, in characters (an echoed prompt's from
/// the start of the text).
struct TextOffsets<'a, 'b> {
    prompt: &'a [TokenLogprob],
    tokens: &'b [&'a TokenLogprob],
    offset: usize,
}

impl Serialize for TextOffsets<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.prompt.len() + self.tokens.len()))?;
        let mut at = 0;
        for t in self.prompt {
            seq.serialize_element(&at)?;
            at += t.token.chars().count();
        }
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
    use super::*;
    use crate::api::logprobs::{chat_logprobs, completion_logprobs};

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
            (Endpoint::Text, completion_logprobs(&[], &refs, 7)),
        ] {
            let written = ChoiceLogprobs {
                endpoint,
                prompt: &[],
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
                prompt: &tokens[..2],
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
        with["logprobs"] = completion_logprobs(&tokens[..2], &refs, 0);
        let want = json!({"id": "x", "choices": [with, choice], "usage": {"a": 1}});
        assert_eq!(
            serde_json::to_string(&body).expect("serialises"),
            want.to_string()
        );
    }
}
