//! Filler text of an exact token count, for loadgen's user turns.

use std::collections::BTreeMap;

use rand::Rng;

use super::words::LOREM_WORDS;
use super::Tokenizer;

/// Lorem-ipsum text whose encoding with `tok` is exactly `n_tokens` tokens.
///
/// Words are drawn with `rng`; a word that would overshoot is replaced by a one-token word (a
/// one-token lorem word, else one of `tok`'s [`AnswerWords`](super::AnswerWords)). The count is
/// exact for tokenizers that split at spaces before letters (the builtin one, byte-level BPE as in
/// GPT, Llama 3, DeepSeek, Qwen); for others the result is checked and repaired word by word, and
/// if that fails it is the closest text found.
pub fn text_with_exact_tokens<R: Rng + ?Sized>(
    tok: &dyn Tokenizer,
    rng: &mut R,
    n_tokens: usize,
) -> String {
    if n_tokens == 0 {
        return String::new();
    }
    let mut costs = WordCosts::new(tok);
    let mut words: Vec<String> = Vec::new();
    let mut count = 0;
    while count < n_tokens {
        let first = words.is_empty();
        let word = LOREM_WORDS[rng.gen_range(0..LOREM_WORDS.len())];
        let piece = if first {
            word.to_string()
        } else {
            format!(" {word}")
        };
        let cost = costs.cost(&piece);
        if cost > 0 && count + cost <= n_tokens {
            words.push(piece);
            count += cost;
        } else if let Some(piece) = costs.one_token_word(rng, first) {
            words.push(piece);
            count += 1;
        } else {
            break;
        }
    }
    let mut text = words.concat();
    // Verify (and repair for tokenizers whose counts are not additive over words).
    for _ in 0..64 {
        let actual = tok.encode(&text).len();
        if actual == n_tokens {
            break;
        }
        if actual > n_tokens {
            if words.pop().is_none() {
                break;
            }
        } else {
            match costs.one_token_word(rng, words.is_empty()) {
                Some(piece) => words.push(piece),
                None => break,
            }
        }
        text = words.concat();
    }
    text
}

/// Token counts of candidate words, computed once per word.
struct WordCosts<'a> {
    /// The tokenizer counting.
    tok: &'a dyn Tokenizer,
    /// Piece (with or without leading space) -> token count; ordered for determinism.
    cache: BTreeMap<String, usize>,
    /// One-token pieces: `[first, continuation]`, lorem words first, else answer words.
    one_token: [Vec<String>; 2],
}

impl<'a> WordCosts<'a> {
    fn new(tok: &'a dyn Tokenizer) -> Self {
        let mut costs = Self {
            tok,
            cache: BTreeMap::new(),
            one_token: Default::default(),
        };
        for (slot, lead) in [(0, ""), (1, " ")] {
            let lorem: Vec<String> = LOREM_WORDS
                .iter()
                .map(|w| format!("{lead}{w}"))
                .filter(|p| costs.cost(p) == 1)
                .collect();
            costs.one_token[slot] = if lorem.is_empty() {
                let answer = tok.answer_words();
                let ids = if slot == 0 && !answer.initial().is_empty() {
                    answer.initial()
                } else {
                    answer.continuation()
                };
                ids.iter().map(|&id| tok.decode(&[id])).collect()
            } else {
                lorem
            };
        }
        costs
    }

    fn cost(&mut self, piece: &str) -> usize {
        if let Some(&c) = self.cache.get(piece) {
            return c;
        }
        let c = self.tok.encode(piece).len();
        self.cache.insert(piece.to_string(), c);
        c
    }

    fn one_token_word<R: Rng + ?Sized>(&self, rng: &mut R, first: bool) -> Option<String> {
        let list = &self.one_token[usize::from(!first)];
        if list.is_empty() {
            return None;
        }
        Some(list[rng.gen_range(0..list.len())].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{BuiltinTokenizer, HfTokenizer};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn builtin_counts_are_exact() {
        let tok = BuiltinTokenizer::new();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for n in 0..300 {
            let text = text_with_exact_tokens(&tok, &mut rng, n);
            assert_eq!(tok.encode(&text).len(), n, "{text:?}");
        }
        let a = text_with_exact_tokens(&tok, &mut ChaCha8Rng::seed_from_u64(9), 50);
        let b = text_with_exact_tokens(&tok, &mut ChaCha8Rng::seed_from_u64(9), 50);
        assert_eq!(a, b);
        assert!(a.split(' ').all(|w| LOREM_WORDS.contains(&w)), "{a}");
    }

    #[test]
    fn default_tokenizer_counts_are_exact() {
        let tok = match crate::tokenizer::default_tokenizer() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for n in (0..300).step_by(7) {
            let text = text_with_exact_tokens(&tok, &mut rng, n);
            assert_eq!(tok.encode(&text).len(), n, "{text:?}");
        }
    }

    #[test]
    fn fixture_counts_are_exact_with_multi_token_words() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/tokenizer/tiny_bpe.json");
        let tok = match HfTokenizer::from_file(&path) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for n in 0..100 {
            let text = text_with_exact_tokens(&tok, &mut rng, n);
            assert_eq!(tok.encode(&text).len(), n, "{text:?}");
        }
    }
}
