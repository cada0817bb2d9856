//! Seeded, plausible log-probabilities for answer tokens ([`TokenLogprob`]) and their two wire
//! shapes: chat's `logprobs.content[]` and the legacy completions' parallel arrays.
//!
//! The sampled token is usually, not always, the most likely one; its alternatives are other
//! words of the vocabulary, distinct, with probabilities that add up to at most 1.

use rand::Rng;
use serde_json::{json, Map, Value};

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

/// Completions `choices[].logprobs` for these tokens, the first at `offset` characters into the
/// choice's text: `{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`.
pub(crate) fn completion_logprobs(tokens: &[&TokenLogprob], mut offset: usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for t in tokens {
        text_offset.push(offset);
        offset += t.token.chars().count();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut map = Map::new();
            map.insert(t.token.clone(), json!(t.logprob));
            for (token, lp) in &t.top {
                map.entry(token.clone()).or_insert(json!(lp));
            }
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

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
        let c = completion_logprobs(&[&none, &none], 3);
        assert_eq!(c["text_offset"], json!([3, 4]));
        assert_eq!(c["top_logprobs"][0]["x"], json!(none.logprob));
    }
}
