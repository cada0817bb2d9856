//! [`HfTokenizer`]: a HuggingFace `tokenizer.json` behind the [`Tokenizer`] trait, for exact token
//! counts of a real model.
//!
//! Checked by hand against `transformers` for DeepSeek-V3 (129,280 ids): plain text and the
//! rendered chat template give the same ids as the model's own Jinja template.

use std::collections::HashMap;
use std::path::Path;

use super::{AnswerWords, Tokenizer, TokenizerError};

/// At most this many continuation words are kept (lowest ids first: the most frequent merges).
const MAX_CONTINUATION_WORDS: usize = 4096;
/// At most this many initial words are kept.
const MAX_INITIAL_WORDS: usize = 1024;

/// A tokenizer loaded from a HuggingFace `tokenizer.json` with the `tokenizers` crate.
pub(crate) struct HfTokenizer {
    /// The loaded tokenizer, set to encode special-token strings as plain text.
    inner: tokenizers::Tokenizer,
    /// Text -> id of every added token (special or not), for the chat template.
    added: HashMap<String, u32>,
    /// Computed at load (one encode per candidate word, ~150 ms for a 129k vocabulary), so the
    /// first request costs no more than later ones.
    answer_words: AnswerWords,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("added_tokens", &self.added.len())
            .finish_non_exhaustive()
    }
}

impl HfTokenizer {
    /// Loads `path`; errors name the file.
    pub(crate) fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|message| TokenizerError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses the contents of a `tokenizer.json`; the error is the parser's message.
    fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        let mut inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| e.to_string())?;
        inner.set_encode_special_tokens(true);
        let added = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, token)| (token.content, id))
            .collect();
        let mut tok = Self {
            inner,
            added,
            answer_words: AnswerWords::default(),
        };
        tok.answer_words = tok.compute_answer_words();
        Ok(tok)
    }

    /// Round-trip checked answer words, scanning ids in increasing order (deterministic).
    fn compute_answer_words(&self) -> AnswerWords {
        let mut vocab: Vec<(u32, String)> = self
            .inner
            .get_vocab(false)
            .into_iter()
            .map(|(token, id)| (id, token))
            .collect();
        vocab.sort_unstable();
        let round_trips = |ids: &[u32]| self.encode(&self.decode(ids)) == ids;
        let mut continuation = Vec::new();
        for (id, token) in &vocab {
            if continuation.len() >= MAX_CONTINUATION_WORDS {
                break;
            }
            // Cheap filter on the raw token before decoding: a space marker then letters.
            let letters = token.strip_prefix('Ġ').or_else(|| token.strip_prefix('▁'));
            if !letters.is_some_and(is_word) {
                continue;
            }
            let text = self.decode(&[*id]);
            if text.strip_prefix(' ').is_some_and(is_word) && round_trips(&[*id, *id]) {
                continuation.push(*id);
            }
        }
        let mut initial = Vec::new();
        if let Some(&next) = continuation.first() {
            for (id, token) in &vocab {
                if initial.len() >= MAX_INITIAL_WORDS {
                    break;
                }
                if !is_word(token) || !token.starts_with(|c: char| c.is_ascii_uppercase()) {
                    continue;
                }
                if self.decode(&[*id]) == *token && round_trips(&[*id, next]) {
                    initial.push(*id);
                }
            }
        }
        AnswerWords::new(initial, continuation)
    }
}

/// Two or more ASCII letters.
fn is_word(s: &str) -> bool {
    s.len() >= 2 && s.bytes().all(|b| b.is_ascii_alphabetic())
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        match self.inner.encode_fast(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            // Encoding only fails on pathological input (a regex backtracking limit); count it
            // character by character rather than dropping it.
            Err(_) => text
                .chars()
                .flat_map(|c| {
                    let mut buf = [0u8; 4];
                    self.inner
                        .encode_fast(&*c.encode_utf8(&mut buf), false)
                        .map(|e| e.get_ids().to_vec())
                        .unwrap_or_default()
                })
                .collect(),
        }
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn special_token_id(&self, token: &str) -> Option<u32> {
        self.added.get(token).copied()
    }

    fn answer_words(&self) -> &AnswerWords {
        &self.answer_words
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tests::check_answer_words_round_trip;

    fn fixture() -> HfTokenizer {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tokenizer/tiny_bpe.json");
        match HfTokenizer::from_file(&path) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn tiny_fixture_merges_and_round_trips() {
        let tok = fixture();
        // "Ġlorem" and "Ġipsum" are merged words; "Hello" is one token; "!" a single byte.
        let ids = tok.encode("Hello lorem ipsum!");
        let pieces: Vec<String> = ids.iter().map(|&id| tok.decode(&[id])).collect();
        assert_eq!(pieces, ["Hello", " lorem", " ipsum", "!"]);
        for s in ["", "a b  c\n\nd", "unicode é 日本 🦀", "<|im_start|> text"] {
            assert_eq!(tok.decode(&tok.encode(s)), s);
        }
    }

    #[test]
    fn tiny_fixture_special_tokens_are_template_only() {
        let tok = fixture();
        let start = tok.special_token_id("<|im_start|>");
        assert_eq!(start, Some(294));
        assert!(!tok
            .encode("<|im_start|>")
            .iter()
            .any(|&id| Some(id) == start));
        assert_eq!(tok.decode(&[294]), "<|im_start|>");
        assert_eq!(tok.special_token_id("<|nope|>"), None);
    }

    #[test]
    fn tiny_fixture_answer_words() {
        let tok = fixture();
        let words = tok.answer_words();
        let texts: Vec<String> = words
            .continuation()
            .iter()
            .map(|&id| tok.decode(&[id]))
            .collect();
        assert!(texts.contains(&" lorem".to_string()), "{texts:?}");
        assert!(words
            .initial()
            .iter()
            .any(|&id| tok.decode(&[id]) == "Hello"));
        check_answer_words_round_trip(&tok, 50);
    }

    #[test]
    fn bad_json_is_a_parse_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("servesim-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, "{ not json").expect("write");
        let err = HfTokenizer::from_file(&path).err();
        assert!(matches!(&err, Some(TokenizerError::Parse { path: p, .. }) if *p == path));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Against the real DeepSeek-V3 tokenizer when it is present (never in CI).
    #[test]
    fn deepseek_v3_when_present() {
        let path = Path::new("/work/peers/tokenizer/deepseek-v3-tok/tokenizer.json");
        if !path.exists() {
            return;
        }
        let tok = match HfTokenizer::from_file(path) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(tok.vocab_size(), 129_280);
        assert!(tok.special_token_id("<｜User｜>").is_some());
        check_answer_words_round_trip(&tok, 10);
    }
}
