//! Seeded, plausible log-probabilities for answer tokens ([`TokenLogprob`]) and their two wire
//! shapes: chat's `logprobs.content[]` and the legacy completions' parallel arrays.
//!
//! The sampled token is usually, not always, the most likely one; its alternatives are other
//! words of the vocabulary, distinct, with probabilities that add up to at most 1.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::text::TextCodec;

/// Alternatives at most (`top_logprobs` and the completions `logprobs` are capped here, as by
/// vLLM's default `--max-logprobs`).
pub(crate) const MAX_TOP_LOGPROBS: usize = 20;

/// One output token's log-probability and its most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f64,
    /// The most likely tokens at this position, most likely first (the sampled token among
    /// them); as many as asked for.
    pub top: Vec<(String, f64)>,
}

/// Rounds to 6 decimals, as the text would carry anyway.
fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

impl TokenLogprob {
    /// Log-probabilities for `token`, with `top` alternatives drawn by `alternative`.
    pub(crate) fn generate<R: Rng + ?Sized>(
        rng: &mut R,
        token: &str,
        top: usize,
        alternative: &mut dyn FnMut(&mut R) -> String,
    ) -> TokenLogprob {
        // Most tokens are near-certain; some are real choices.
        let u: f64 = rng.gen();
        let p = (0.98 - 0.9 * u * u * u).clamp(0.01, 0.999);
        let mut rest = 1.0 - p;
        let mut entries = vec![(token.to_string(), p)];
        let mut tries = 0;
        while entries.len() < top.max(1) && tries < 16 * top.max(1) {
            tries += 1;
            let word = alternative(rng);
            if word.is_empty() || entries.iter().any(|(t, _)| *t == word) {
                continue;
            }
            let share = rest * (0.3 + 0.6 * rng.gen::<f64>());
            rest -= share;
            entries.push((word, share));
        }
        entries.sort_by(|a, b| b.1.total_cmp(&a.1));
        entries.truncate(top);
        TokenLogprob {
            token: token.to_string(),
            logprob: round(p.ln()),
            top: entries
                .into_iter()
                .map(|(t, p)| (t, round(p.max(f64::MIN_POSITIVE).ln())))
                .collect(),
        }
    }

    /// The chat shape: `{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}`.
    pub(crate) fn chat(&self) -> Value {
        let top: Vec<Value> = self
            .top
            .iter()
            .map(|(t, lp)| json!({"token": t, "logprob": lp, "bytes": t.as_bytes()}))
            .collect();
        json!({
            "token": self.token,
            "logprob": self.logprob,
            "bytes": self.token.as_bytes(),
            "top_logprobs": top,
        })
    }
}

/// Chat `choices[].logprobs` for these tokens.
pub(crate) fn chat_logprobs(tokens: &[&TokenLogprob]) -> Value {
    json!({
        "content": tokens.iter().map(|t| t.chat()).collect::<Vec<_>>(),
        "refusal": null,
    })
}

/// The seeded stream of prompt log-probabilities (apart from the answers' streams).
const PROMPT_STREAM: u64 = 6;

/// Log-probabilities of a prompt's tokens, for a completions `echo` with `logprobs` (as vLLM and
/// OpenAI answer it): each token's text decoded alone, `top` alternatives. The first token has
/// none on the wire (nothing precedes it): see [`completion_logprobs`].
pub(crate) fn prompt_logprobs(
    codec: &dyn TextCodec,
    tokens: &[u32],
    seed: u64,
    top: usize,
) -> Vec<TokenLogprob> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(PROMPT_STREAM);
    let mut alternative = |rng: &mut ChaCha8Rng| {
        let ids = codec.answer_tokens(rng, 0, 2);
        codec.decode(&ids[ids.len().saturating_sub(1)..])
    };
    tokens
        .iter()
        .map(|&t| TokenLogprob::generate(&mut rng, &codec.decode(&[t]), top, &mut alternative))
        .collect()
}

/// One entry of a completions `logprobs` object: a prompt token (the first has no
/// log-probability) or an answer token.
#[derive(Clone, Copy)]
pub(crate) struct CompletionEntry<'a> {
    /// The token.
    pub token: &'a TokenLogprob,
    /// Written with `null` log-probability and alternatives: the prompt's first token.
    pub first_of_prompt: bool,
}

/// The entries of an echoed prompt's tokens (`prompt`, empty without echo) then of answer
/// tokens.
pub(crate) fn entries<'a: 'b, 'b>(
    prompt: &'a [TokenLogprob],
    tokens: &'b [&'a TokenLogprob],
) -> impl Iterator<Item = CompletionEntry<'a>> + Clone + 'b {
    let prompt = prompt.iter().enumerate().map(|(i, token)| CompletionEntry {
        token,
        first_of_prompt: i == 0,
    });
    prompt.chain(tokens.iter().map(|token| CompletionEntry {
        token,
        first_of_prompt: false,
    }))
}

impl<'a> CompletionEntry<'a> {
    /// `token_logprobs[i]`.
    pub(crate) fn logprob(self) -> Option<f64> {
        (!self.first_of_prompt).then_some(self.token.logprob)
    }

    /// `top_logprobs[i]`: the token first, then alternatives not already named.
    pub(crate) fn top(self) -> Option<std::collections::BTreeMap<&'a str, f64>> {
        if self.first_of_prompt {
            return None;
        }
        let mut top = std::collections::BTreeMap::new();
        top.insert(self.token.token.as_str(), self.token.logprob);
        for (token, lp) in &self.token.top {
            top.entry(token.as_str()).or_insert(*lp);
        }
        Some(top)
    }
}

/// Completions `choices[].logprobs` for an echoed prompt's tokens (`prompt`, at the start of
/// the choice's text) and then these answer tokens, the first at `offset` characters into the
/// choice's text: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`;
/// the prompt's first token has `null` log-probability and alternatives.
pub(crate) fn completion_logprobs(
    prompt: &[TokenLogprob],
    tokens: &[&TokenLogprob],
    offset: usize,
) -> Value {
    let mut text_offset = Vec::with_capacity(prompt.len() + tokens.len());
    let mut at = 0;
    for t in prompt {
        text_offset.push(at);
        at += t.token.chars().count();
    }
    let mut at = offset;
    for t in tokens {
        text_offset.push(at);
        at += t.token.chars().count();
    }
    let all = entries(prompt, tokens);
    json!({
        "tokens": all.clone().map(|e| e.token.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": all.clone().map(|e| e.logprob()).collect::<Vec<_>>(),
        "top_logprobs": all.map(|e| e.top()).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternatives_are_distinct_sorted_and_sum_below_one() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut next = 0;
        let mut alt = |_: &mut ChaCha8Rng| {
            next += 1;
            format!(" w{}", next % 7)
        };
        for _ in 0..100 {
            let t = TokenLogprob::generate(&mut rng, " hello", 5, &mut alt);
            assert!(t.logprob <= 0.0);
            assert_eq!(t.top.len(), 5);
            assert!(t
                .top
                .iter()
                .any(|(tok, lp)| tok == " hello" && *lp == t.logprob));
            assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1));
            let sum: f64 = t.top.iter().map(|(_, lp)| lp.exp()).sum();
            assert!(sum <= 1.0 + 1e-5, "{sum}");
            let mut names: Vec<&str> = t.top.iter().map(|(t, _)| t.as_str()).collect();
            names.dedup();
            assert_eq!(names.len(), 5);
        }
        let none = TokenLogprob::generate(&mut rng, "x", 0, &mut alt);
        assert!(none.top.is_empty());
        let chat = none.chat();
        assert_eq!(chat["bytes"], json!([120]));
        let c = completion_logprobs(&[], &[&none, &none], 3);
        assert_eq!(c["text_offset"], json!([3, 4]));
        assert_eq!(c["top_logprobs"][0]["x"], json!(none.logprob));
        // An echoed prompt comes first, from offset 0; its first token has no log-probability.
        let prompt = [none.clone(), none.clone()];
        let c = completion_logprobs(&prompt, &[&none], 5);
        assert_eq!(c["text_offset"], json!([0, 1, 5]));
        assert_eq!(c["tokens"], json!(["x", "x", "x"]));
        assert_eq!(
            c["token_logprobs"],
            json!([null, none.logprob, none.logprob])
        );
        assert_eq!(c["top_logprobs"][0], Value::Null);
        assert_eq!(c["top_logprobs"][1]["x"], json!(none.logprob));
    }
}
