//! What one choice answers, decided before the engine runs it ([`Answer::plan`]): its token
//! ids, the client-visible piece of text (or tool-call fragment) each token streams, and why it
//! ends. The engine is then given exactly these tokens, so KV use and timing follow the tokens
//! actually generated, and the same seed gives the same bytes.
//!
//! How long a text answer runs:
//! - with `ignore_eos`, the output limit (`finish_reason: "length"`);
//! - otherwise a length drawn from `--output-length-dist` and at least `min_tokens`: below the
//!   limit the model ends it (`"stop"`), at or beyond it the limit cuts it (`"length"`);
//! - when the request has `stop` strings or `stop_token_ids` (and no `ignore_eos`), the model's
//!   end is one of them with probability `--stop-probability` (the stop's tokens run in the
//!   engine; its text is not shown, as vLLM's default);
//! - and in every case, once `min_tokens` are out, a stop string or stop token id that the text
//!   would contain ends the answer just before it, with `stop_reason` naming it.
//!
//! JSON modes and tool calls answer a whole JSON document (cut by the limit if it does not fit).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use super::json_mode::ResponseFormat;
use super::logprobs::TokenLogprob;
use super::schema::Words;
use super::tools::{ToolCall, Tools};
use crate::config::ReasoningFormat;
use crate::output_length::OutputLengthDist;
use crate::text::TextCodec;

/// How every choice of one request answers (the request's settings and the server's).
#[derive(Clone, Debug)]
pub(crate) struct AnswerSpec {
    /// Output limit in tokens.
    pub limit: usize,
    /// Run to the limit: no sampled end, no inserted stop.
    pub ignore_eos: bool,
    /// No stop before this many tokens.
    pub min_tokens: usize,
    /// Stop strings (non-empty).
    pub stop: Vec<String>,
    /// Stop token ids.
    pub stop_token_ids: Vec<u32>,
    /// Keep a matched stop string in the text (vLLM's `include_stop_str_in_output`).
    pub include_stop_str: bool,
    /// Share of a text answer that is reasoning (0 for text completions).
    pub reasoning_ratio: f64,
    /// Where reasoning goes.
    pub reasoning_format: ReasoningFormat,
    /// Free text or JSON.
    pub format: ResponseFormat,
    /// Tools the answer may call.
    pub tools: Option<Tools>,
    /// Alternatives per token when log-probabilities are asked for.
    pub logprobs: Option<usize>,
    /// `--output-length-dist`.
    pub output_length: OutputLengthDist,
    /// `--stop-probability`.
    pub stop_probability: f64,
    /// `--tool-call-probability`.
    pub tool_call_probability: f64,
}

/// Why a choice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinishReason {
    /// The model ended it (end of sequence, a stop string or a stop token id).
    Stop,
    /// The output limit cut it.
    Length,
    /// It is a complete tool call.
    ToolCalls,
}

impl FinishReason {
    /// The wire name.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// A fragment of a tool call's arguments.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ToolFragment {
    /// Which call (its index in [`Answer::tool_calls`]).
    pub call: usize,
    /// The first fragment of its call: the chunk also carries the id, type and name.
    pub first: bool,
    /// Argument text.
    pub arguments: String,
}

/// What one output token shows the client.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Piece {
    /// Reasoning text (`--reasoning-format separate`).
    pub reasoning: Option<String>,
    /// Content text.
    pub content: Option<String>,
    /// A tool-call fragment.
    pub tool: Option<ToolFragment>,
    /// The token's log-probabilities, when asked for (content tokens only).
    pub logprob: Option<TokenLogprob>,
}

impl Piece {
    /// Nothing to send (a token of a stop string, or one after it).
    pub(crate) fn is_empty(&self) -> bool {
        self.reasoning.as_deref().is_none_or(str::is_empty)
            && self.content.as_deref().is_none_or(str::is_empty)
            && self.tool.is_none()
    }
}

/// One choice's answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Answer {
    /// The token ids the engine runs, in order.
    pub tokens: Vec<u32>,
    /// What each token shows (as many as `tokens`).
    pub pieces: Vec<Piece>,
    /// Why it ends.
    pub finish_reason: FinishReason,
    /// The stop string or stop token id that ended it (vLLM's `stop_reason`).
    pub stop_reason: Option<Value>,
    /// The calls it makes (complete when `finish_reason` is `tool_calls`).
    pub tool_calls: Vec<ToolCall>,
}

/// Independent seeded streams, so that one feature's draws never shift another's.
mod stream {
    pub(super) const LENGTH: u64 = 1;
    pub(super) const STOP: u64 = 2;
    pub(super) const TOOL: u64 = 3;
    pub(super) const LOGPROBS: u64 = 4;
    pub(super) const WORDS: u64 = 5;
}

fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// Words for JSON strings: the vocabulary's answer words, trimmed to letters and digits.
struct CodecWords<'a> {
    codec: &'a dyn TextCodec,
    rng: ChaCha8Rng,
}

impl Words for CodecWords<'_> {
    fn word(&mut self) -> String {
        for _ in 0..8 {
            let ids = self.codec.answer_tokens(&mut self.rng, 0, 2);
            let word: String = self
                .codec
                .decode(&ids[ids.len().saturating_sub(1)..])
                .chars()
                .filter(|c| c.is_alphanumeric())
                .flat_map(char::to_lowercase)
                .collect();
            if !word.is_empty() {
                return word;
            }
        }
        "value".into()
    }
}

/// Bytes of a JSON document drawn per token of its output limit at first: JSON of words runs
/// about 4 bytes a token, so a document cut there is past what the limit shows.
const JSON_BYTES_PER_TOKEN: usize = 8;

/// Bytes per token of the output limit beyond which a JSON document is not drawn again with a
/// larger budget (its tokens would average over this).
const MAX_JSON_BYTES_PER_TOKEN: usize = 64;

/// Per-token texts of `tokens`, which encode `whole`: single-token decodes when they add up to
/// it, else the growth of the decoded prefix (a token that ends inside a character shows
/// nothing until the character is complete).
fn token_texts(codec: &dyn TextCodec, tokens: &[u32], whole: &str) -> Vec<String> {
    let single: Vec<String> = tokens
        .iter()
        .map(|&t| codec.token_text(t).into_owned())
        .collect();
    if single.concat() == whole {
        return single;
    }
    let mut shown = String::new();
    let mut texts = Vec::with_capacity(tokens.len());
    for i in 0..tokens.len() {
        let prefix = codec.decode(&tokens[..=i]);
        match prefix.strip_prefix(shown.as_str()) {
            Some(new) if !prefix.ends_with('\u{FFFD}') => {
                texts.push(new.to_string());
                shown = prefix;
            }
            _ => texts.push(String::new()),
        }
    }
    if let (Some(rest), Some(last)) = (whole.strip_prefix(shown.as_str()), texts.last_mut()) {
        last.push_str(rest);
    }
    texts
}

/// Where a stop ends the text: the index of the token that completes it, the byte at which the
/// visible text ends, and what matched.
struct StopAt {
    token: usize,
    cut: usize,
    reason: Value,
}

/// The first stop string or stop token id in the text, checked once `min_tokens` are out.
///
/// Each token's check looks only at the window a new match can lie in: the token's text and
/// the `longest - 1` bytes before it (at the first checked token, every match that starts in
/// that window counts, one completed by the unchecked tokens before it included). The work is
/// the text's length times the number of stops, whatever their lengths.
fn find_stop(tokens: &[u32], texts: &[String], spec: &AnswerSpec) -> Option<StopAt> {
    let longest = spec.stop.iter().map(String::len).max().unwrap_or(0);
    let mut full = String::new();
    for (i, (&token, text)) in tokens.iter().zip(texts).enumerate() {
        let before = full.len();
        let checked = i + 1 > spec.min_tokens;
        if checked && spec.stop_token_ids.contains(&token) {
            return Some(StopAt {
                token: i,
                cut: before,
                reason: json!(token),
            });
        }
        full.push_str(text);
        if checked && longest > 0 {
            let mut from = before.saturating_sub(longest - 1);
            while !full.is_char_boundary(from) {
                from -= 1;
            }
            // Matches ending at or before `before` were looked for at earlier checked tokens.
            let first_checked = i == spec.min_tokens;
            let found = spec
                .stop
                .iter()
                .filter_map(|s| {
                    let end_from = if first_checked { 0 } else { before + 1 };
                    first_match(full.as_bytes(), s.as_bytes(), from, end_from).map(|p| (p, s))
                })
                .min_by_key(|(p, _)| *p);
            if let Some((at, s)) = found {
                let cut = if spec.include_stop_str {
                    at + s.len()
                } else {
                    at
                };
                return Some(StopAt {
                    token: i,
                    cut,
                    reason: json!(s),
                });
            }
        }
    }
    None
}

/// Where the leftmost occurrence of `needle` in `haystack` starts, among those that start at
/// `from` or later and end at `end_from` or later (byte offsets). Only the end positions are
/// scanned (for the needle's last byte), each candidate compared in full.
fn first_match(haystack: &[u8], needle: &[u8], from: usize, end_from: usize) -> Option<usize> {
    let (&last, _) = needle.split_last()?;
    let first_end = end_from.max(from + needle.len());
    if first_end > haystack.len() {
        return None;
    }
    // `end` is one past the candidate's last byte.
    (first_end..=haystack.len())
        .filter(|&end| haystack[end - 1] == last)
        .map(|end| end - needle.len())
        .find(|&start| &haystack[start..start + needle.len()] == needle)
}

/// Cuts per-token texts at byte `cut` of their concatenation.
fn cut_texts(texts: &mut [String], cut: usize) {
    let mut at = 0;
    for text in texts {
        let keep = cut.saturating_sub(at).min(text.len());
        at += text.len();
        text.truncate(keep);
    }
}

impl Answer {
    /// Plans one choice from its seed.
    pub(crate) fn plan(spec: &AnswerSpec, codec: &dyn TextCodec, seed: u64) -> Answer {
        let limit = spec.limit.max(1);
        // The length the model would run if nothing stopped it.
        let sampled = if spec.ignore_eos {
            limit
        } else {
            spec.output_length
                .sample(&mut rng(seed, stream::LENGTH), limit)
                .max(spec.min_tokens)
        };
        let mut tool_rng = rng(seed, stream::TOOL);
        let tool = spec
            .tools
            .as_ref()
            .and_then(|t| t.pick(&mut tool_rng, spec.tool_call_probability));
        // A JSON document (tool arguments or a JSON mode's answer) is drawn within a byte
        // budget past what `limit` tokens show; should the text cut there still fit in
        // `limit` tokens (unusually long tokens), it is drawn again with a larger budget.
        let json_document = |max_bytes: usize| -> Option<(String, bool, Option<ToolCall>)> {
            let mut words = CodecWords {
                codec,
                rng: rng(seed, stream::WORDS),
            };
            if let Some(tool) = tool {
                let (call, truncated) =
                    ToolCall::generate(tool, &mut tool_rng.clone(), &mut words, max_bytes);
                return Some((call.arguments.clone(), truncated, Some(call)));
            }
            spec.format
                .generate(
                    &mut rng(seed, stream::WORDS + 16),
                    &mut words,
                    (sampled.min(limit), limit),
                    max_bytes,
                    &|t: &str| codec.encode(t).len(),
                )
                .map(|(text, truncated)| (text, truncated, None))
        };
        let mut max_bytes = limit.saturating_add(1).saturating_mul(JSON_BYTES_PER_TOKEN);
        let mut document = json_document(max_bytes);
        let mut encoded = None;
        while let Some((text, true, _)) = &document {
            let tokens = codec.encode(text);
            if tokens.len() > limit || max_bytes >= limit.saturating_mul(MAX_JSON_BYTES_PER_TOKEN) {
                encoded = Some(tokens);
                break;
            }
            max_bytes = max_bytes.saturating_mul(4);
            document = json_document(max_bytes);
        }
        let truncated = matches!(document, Some((_, true, _)));
        let mut answer = if let Some((arguments, _, Some(call))) = document {
            let tokens = encoded.unwrap_or_else(|| codec.encode(&arguments));
            let texts = token_texts(codec, &tokens, &arguments);
            let pieces = texts
                .into_iter()
                .enumerate()
                .map(|(i, arguments)| Piece {
                    tool: Some(ToolFragment {
                        call: 0,
                        first: i == 0,
                        arguments,
                    }),
                    ..Piece::default()
                })
                .collect();
            Answer {
                tokens,
                pieces,
                finish_reason: FinishReason::ToolCalls,
                stop_reason: None,
                tool_calls: vec![call],
            }
        } else if let Some((text, _, None)) = document {
            let tokens = encoded.unwrap_or_else(|| codec.encode(&text));
            let texts = token_texts(codec, &tokens, &text);
            Answer::text(spec, tokens, texts, 0, FinishReason::Stop)
        } else {
            Answer::free_text(spec, codec, seed, sampled)
        };
        if truncated && answer.tokens.len() <= limit {
            // Cut at the budget yet within the limit: the limit ended it all the same.
            answer.finish_reason = FinishReason::Length;
        }
        if answer.tokens.len() > limit {
            answer.tokens.truncate(limit);
            answer.pieces.truncate(limit);
            answer.finish_reason = FinishReason::Length;
            // A call cut by the limit shows only the arguments it got out.
            for (i, call) in answer.tool_calls.iter_mut().enumerate() {
                call.arguments = answer
                    .pieces
                    .iter()
                    .filter_map(|p| p.tool.as_ref().filter(|t| t.call == i))
                    .map(|t| t.arguments.as_str())
                    .collect();
            }
        }
        if answer.tokens.is_empty() {
            // The engine runs at least one token: an empty document still ends with one.
            answer.tokens = codec.answer_tokens(&mut rng(seed, 0), 0, 1);
            answer.pieces = vec![Piece::default(); answer.tokens.len()];
        }
        if let Some(top) = spec.logprobs {
            answer.add_logprobs(codec, seed, top);
        }
        answer
    }

    /// A free-text answer: seeded words of the sampled length, maybe a stop at its end.
    fn free_text(spec: &AnswerSpec, codec: &dyn TextCodec, seed: u64, sampled: usize) -> Answer {
        let limit = spec.limit.max(1);
        let (mut body, finish) = if sampled >= limit {
            (limit, FinishReason::Length)
        } else {
            (sampled, FinishReason::Stop)
        };
        let mut stop_rng = rng(seed, stream::STOP);
        let stops = spec.stop.len() + spec.stop_token_ids.len();
        let mut tail = Vec::new();
        if !spec.ignore_eos
            && finish == FinishReason::Stop
            && stops > 0
            && stop_rng.gen::<f64>() < spec.stop_probability
        {
            let k = stop_rng.gen_range(0..stops);
            tail = match spec.stop.get(k) {
                Some(s) => codec.encode(s),
                None => vec![spec.stop_token_ids[k - spec.stop.len()]],
            };
            body = body.max(spec.min_tokens);
            if tail.is_empty() || body + tail.len() > limit {
                body = limit.saturating_sub(tail.len()).max(spec.min_tokens);
            }
            if tail.is_empty() || body + tail.len() > limit {
                tail.clear();
                body = sampled.min(limit);
            }
        }
        let reasoning = (spec.reasoning_ratio * body as f64).floor() as usize;
        let mut tokens = codec.answer_tokens(&mut rng(seed, 0), reasoning, body);
        let inserted = !tail.is_empty();
        tokens.extend(tail);
        let texts: Vec<String> = tokens
            .iter()
            .map(|&t| codec.token_text(t).into_owned())
            .collect();
        let mut answer = Answer::text(spec, tokens, texts, reasoning, finish);
        if inserted && answer.stop_reason.is_none() {
            // The stop's tokens did not decode to the stop (an unusual tokenizer): the model
            // simply ends where the stop would have begun.
            answer.tokens.truncate(body);
            answer.pieces.truncate(body);
        }
        answer
    }

    /// Pieces of a text answer (reasoning first), cut at the first stop.
    fn text(
        spec: &AnswerSpec,
        mut tokens: Vec<u32>,
        mut texts: Vec<String>,
        reasoning: usize,
        mut finish: FinishReason,
    ) -> Answer {
        let mut stop_reason = None;
        if let Some(stop) = find_stop(&tokens, &texts, spec) {
            tokens.truncate(stop.token + 1);
            texts.truncate(stop.token + 1);
            cut_texts(&mut texts, stop.cut);
            finish = FinishReason::Stop;
            stop_reason = Some(stop.reason);
        }
        let pieces = texts
            .into_iter()
            .enumerate()
            .map(|(i, text)| {
                if i >= reasoning {
                    return Piece {
                        content: Some(text),
                        ..Piece::default()
                    };
                }
                match spec.reasoning_format {
                    ReasoningFormat::Separate => Piece {
                        reasoning: Some(text),
                        ..Piece::default()
                    },
                    ReasoningFormat::Inline => {
                        let open = if i == 0 { "<think>" } else { "" };
                        let close = if i + 1 == reasoning { "</think>" } else { "" };
                        Piece {
                            content: Some(format!("{open}{text}{close}")),
                            ..Piece::default()
                        }
                    }
                }
            })
            .collect();
        Answer {
            tokens,
            pieces,
            finish_reason: finish,
            stop_reason,
            tool_calls: Vec::new(),
        }
    }

    fn add_logprobs(&mut self, codec: &dyn TextCodec, seed: u64, top: usize) {
        let mut rng = rng(seed, stream::LOGPROBS);
        let mut alternative = |rng: &mut ChaCha8Rng| {
            let ids = codec.answer_tokens(rng, 0, 2);
            codec.decode(&ids[ids.len().saturating_sub(1)..])
        };
        for piece in &mut self.pieces {
            if let Some(content) = piece.content.as_deref().filter(|c| !c.is_empty()) {
                piece.logprob = Some(TokenLogprob::generate(
                    &mut rng,
                    content,
                    top,
                    &mut alternative,
                ));
            }
        }
    }

    /// The visible content text (tool-call arguments excluded).
    pub(crate) fn content(&self) -> String {
        self.pieces
            .iter()
            .filter_map(|p| p.content.as_deref())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::default_codec;

    fn spec(limit: usize) -> AnswerSpec {
        AnswerSpec {
            limit,
            ignore_eos: false,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            include_stop_str: false,
            reasoning_ratio: 0.0,
            reasoning_format: ReasoningFormat::Separate,
            format: ResponseFormat::Text,
            tools: None,
            logprobs: None,
            output_length: OutputLengthDist::default(),
            stop_probability: 0.5,
            tool_call_probability: 0.5,
        }
    }

    #[test]
    fn ignore_eos_runs_to_the_limit_and_sampled_lengths_stop_earlier() {
        let codec = default_codec();
        let mut s = spec(64);
        s.ignore_eos = true;
        for seed in 0..20 {
            let a = Answer::plan(&s, codec.as_ref(), seed);
            assert_eq!(a.tokens.len(), 64);
            assert_eq!(a.finish_reason, FinishReason::Length);
        }
        s.ignore_eos = false;
        s.min_tokens = 10;
        let mut stopped = 0;
        for seed in 0..200 {
            let a = Answer::plan(&s, codec.as_ref(), seed);
            assert!((10..=64).contains(&a.tokens.len()), "{}", a.tokens.len());
            assert_eq!(a.pieces.len(), a.tokens.len());
            match a.finish_reason {
                FinishReason::Stop => stopped += 1,
                FinishReason::Length => assert_eq!(a.tokens.len(), 64),
                FinishReason::ToolCalls => panic!("no tools"),
            }
            assert_eq!(a, Answer::plan(&s, codec.as_ref(), seed), "deterministic");
        }
        assert!(stopped > 150, "{stopped} of 200 stopped before the limit");
    }

    #[test]
    fn stops_end_the_text_before_them_and_after_min_tokens() {
        let codec = default_codec();
        let base = Answer::plan(&spec(200), codec.as_ref(), 3);
        let text = base.content();
        // A word from the middle of the answer, as a stop string.
        let word = codec.decode(&base.tokens[5..6]);
        let mut s = spec(200);
        s.stop = vec![word.clone()];
        s.stop_probability = 0.0;
        let a = Answer::plan(&s, codec.as_ref(), 3);
        assert_eq!(a.finish_reason, FinishReason::Stop);
        assert_eq!(a.stop_reason, Some(json!(word)));
        let cut = text.find(&word).expect("in the text");
        assert_eq!(a.content(), text[..cut]);
        assert!(!a.content().contains(&word));

        // With min_tokens past it, that occurrence no longer stops the answer.
        s.min_tokens = 6;
        let later = Answer::plan(&s, codec.as_ref(), 3);
        assert!(later.tokens.len() > 6, "{}", later.tokens.len());
        assert!(later.content().len() > cut);

        // Stop probability 1: every answer that ends early ends at a stop.
        let mut s = spec(100);
        s.stop = vec!["\n\n".into()];
        s.stop_token_ids = vec![7];
        s.stop_probability = 1.0;
        for seed in 0..50 {
            let a = Answer::plan(&s, codec.as_ref(), seed);
            if a.finish_reason == FinishReason::Stop {
                assert!(a.stop_reason.is_some(), "seed {seed}");
            }
            assert!(!a.content().contains("\n\n"));
        }
    }

    #[test]
    fn a_stop_string_across_tokens_cuts_inside_the_first() {
        let codec = default_codec();
        let mut s = spec(60);
        s.ignore_eos = true;
        let base = Answer::plan(&s, codec.as_ref(), 21);
        let texts: Vec<String> = base.tokens.iter().map(|&t| codec.decode(&[t])).collect();
        let (a, b) = (&texts[10], &texts[11]);
        let stop = format!("{}{}", &a[a.len() - 2..], &b[..2]);
        let text = base.content();
        let at = text.find(&stop).expect("present");
        s.stop = vec![stop.clone()];
        let cut = Answer::plan(&s, codec.as_ref(), 21);
        assert_eq!(cut.content(), text[..at]);
        assert!(cut.tokens.len() <= 12);
        assert_eq!(cut.stop_reason, Some(json!(stop)));
        s.include_stop_str = true;
        let kept = Answer::plan(&s, codec.as_ref(), 21);
        assert_eq!(kept.content(), text[..at + stop.len()]);
        assert_eq!(kept.tokens.len(), cut.tokens.len());
    }

    /// The whole-window search stops used to run at every token: [`find_stop`] must agree
    /// with it.
    fn find_stop_whole_window(
        tokens: &[u32],
        texts: &[String],
        spec: &AnswerSpec,
    ) -> Option<(usize, usize, Value)> {
        let longest = spec.stop.iter().map(String::len).max().unwrap_or(0);
        let mut full = String::new();
        for (i, (&token, text)) in tokens.iter().zip(texts).enumerate() {
            let before = full.len();
            let checked = i + 1 > spec.min_tokens;
            if checked && spec.stop_token_ids.contains(&token) {
                return Some((i, before, json!(token)));
            }
            full.push_str(text);
            if checked && longest > 0 {
                let mut from = before.saturating_sub(longest - 1);
                while !full.is_char_boundary(from) {
                    from -= 1;
                }
                let found = spec
                    .stop
                    .iter()
                    .filter_map(|s| full[from..].find(s.as_str()).map(|p| (from + p, s)))
                    .min_by_key(|(p, _)| *p);
                if let Some((at, s)) = found {
                    let cut = if spec.include_stop_str {
                        at + s.len()
                    } else {
                        at
                    };
                    return Some((i, cut, json!(s)));
                }
            }
        }
        None
    }

    #[test]
    fn windowed_stop_matching_agrees_with_the_whole_window_search() {
        let codec = default_codec();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut found = 0;
        for seed in 0..300u64 {
            let tokens = codec.answer_tokens(&mut rng, 0, 40);
            let mut texts: Vec<String> = tokens
                .iter()
                .map(|&t| codec.token_text(t).into_owned())
                .collect();
            if seed % 5 == 0 {
                texts[3] = "é中😀aaa".into();
            }
            let text: String = texts.concat();
            let mut s = spec(40);
            s.min_tokens = rng.gen_range(0..12);
            s.include_stop_str = rng.gen_bool(0.5);
            for _ in 0..rng.gen_range(1..4) {
                let a = rng.gen_range(0..text.len());
                let b = (a + rng.gen_range(1..24)).min(text.len());
                let (Some(stop), _) = (text.get(a..b), ()) else {
                    continue;
                };
                if !stop.is_empty() {
                    s.stop.push(stop.to_string());
                }
            }
            if rng.gen_bool(0.2) {
                s.stop.push("aa".into());
            }
            let new = find_stop(&tokens, &texts, &s).map(|f| (f.token, f.cut, f.reason));
            let old = find_stop_whole_window(&tokens, &texts, &s);
            assert_eq!(new, old, "seed {seed}: {:?}", s.stop);
            found += usize::from(new.is_some());
        }
        assert!(found > 200, "{found}");
    }
}
