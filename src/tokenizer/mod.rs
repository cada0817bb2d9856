//! Text <-> token ids: the [`Tokenizer`] trait, the default [`TiktokenTokenizer`] (OpenAI's
//! `o200k_base`, embedded: counts close to what load generators' tokenizers count), the
//! word-level [`BuiltinTokenizer`], HuggingFace `tokenizer.json` loading ([`load_tokenizer`]),
//! the chat template ([`render_chat`]) and token-exact filler text ([`text_with_exact_tokens`]).
//!
//! Two properties make multi-turn prefix caching behave as on a real engine:
//!
//! * answers are drawn from [`AnswerWords`], whose tokens re-encode to the same ids when the client
//!   sends the answer text back as history;
//! * the chat template renders each message on its own (role markers are special-token ids), so a
//!   conversation's rendering is a token prefix of the next turn's rendering.
//!
//! ```
//! use servesim::tokenizer::{render_chat, BuiltinTokenizer, ChatMessage, Tokenizer};
//!
//! let tok = BuiltinTokenizer::new();
//! let prompt = render_chat(&tok, &[ChatMessage::user("Hello there")], true);
//! assert_eq!(tok.decode(&prompt), "<|begin_of_text|><|user|>Hello there<|end|><|assistant|>");
//! ```

mod builtin;
mod chat;
mod hf;
mod pretokenize;
mod text;
mod tiktoken;
mod words;

use std::path::{Path, PathBuf};

use rand::Rng;

pub use builtin::BuiltinTokenizer;
pub use chat::{render_chat, ChatMessage, ChatTemplate, Role, TemplateFamily};
pub(crate) use hf::HfTokenizer;
pub use text::text_with_exact_tokens;
pub use tiktoken::{TiktokenEncoding, TiktokenTokenizer};
pub use words::LOREM_WORDS;

/// A tokenizer: what mockserve and loadgen need from one, builtin or loaded from a file.
///
/// `encode` does not produce special tokens: special-token strings inside the text are encoded as
/// plain text, so user content cannot forge a BOS or the builtin role markers. (A loaded
/// `tokenizer.json` may declare role markers as *non-special* added tokens, as DeepSeek-V3 does
/// for `<｜User｜>`; those match inside text exactly as with the real tokenizer.) The chat template
/// inserts markers itself, looking them up with [`Tokenizer::special_token_id`].
pub trait Tokenizer: Send + Sync {
    /// Token ids of `text`, without any BOS/EOS or other special tokens.
    fn encode(&self, text: &str) -> Vec<u32>;

    /// Text of `ids`; special tokens decode to their own text, unknown ids to nothing.
    fn decode(&self, ids: &[u32]) -> String;

    /// Number of ids (including special and added tokens).
    fn vocab_size(&self) -> usize;

    /// Id of the special or added token whose text is exactly `token`, `None` when it has none.
    fn special_token_id(&self, token: &str) -> Option<u32>;

    /// Words to draw generated answers from (see [`AnswerWords`] for the guarantee).
    fn answer_words(&self) -> &AnswerWords;
}

/// Token ids to draw answers from, chosen so that answer text re-encodes to the same ids.
///
/// Guarantee: for any sequence `s` made of at most one [`initial`](Self::initial) id followed by
/// any number of [`continuation`](Self::continuation) ids, `encode(decode(s)) == s`. Continuation
/// tokens are space-prefixed words (`" word"`); initial tokens are words without the space, so an
/// answer does not start with a blank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnswerWords {
    /// Ids allowed as the first token of an answer.
    initial: Vec<u32>,
    /// Ids allowed anywhere after the first token (and also first, if `initial` is empty).
    continuation: Vec<u32>,
}

impl AnswerWords {
    /// Words from the two lists; the caller guarantees the round-trip property.
    pub(crate) fn new(initial: Vec<u32>, continuation: Vec<u32>) -> Self {
        Self {
            initial,
            continuation,
        }
    }

    /// Ids allowed as the first token of an answer.
    pub fn initial(&self) -> &[u32] {
        &self.initial
    }

    /// Ids allowed after the first token.
    pub fn continuation(&self) -> &[u32] {
        &self.continuation
    }

    /// `n` answer tokens drawn uniformly: the first from `initial` (or `continuation` when
    /// `initial` is empty), the rest from `continuation`. Empty when both lists are empty.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Vec<u32> {
        if self.continuation.is_empty() && self.initial.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let list = if (i == 0 && !self.initial.is_empty()) || self.continuation.is_empty() {
                &self.initial
            } else {
                &self.continuation
            };
            out.push(list[rng.gen_range(0..list.len())]);
        }
        out
    }

    /// `n` tokens drawn from `continuation` only: text that can follow earlier answer tokens.
    #[cfg(test)]
    pub(crate) fn sample_continuation<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Vec<u32> {
        if self.continuation.is_empty() {
            return Vec::new();
        }
        (0..n)
            .map(|_| self.continuation[rng.gen_range(0..self.continuation.len())])
            .collect()
    }
}

/// Errors of loading a tokenizer file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The file could not be read.
    #[error("cannot read tokenizer file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a tokenizer.json the `tokenizers` crate understands.
    #[error("cannot parse tokenizer file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// An embedded encoding failed to load (a build defect, never bad input).
    #[error("cannot load the embedded {name} encoding: {message}")]
    Embedded {
        /// The encoding.
        name: &'static str,
        /// What the loader said.
        message: String,
    },
}

/// The encoding of the default tokenizer.
pub(crate) const DEFAULT_ENCODING: TiktokenEncoding = TiktokenEncoding::O200kBase;

/// Name that selects the word-level [`BuiltinTokenizer`] in [`load_tokenizer`].
pub(crate) const BUILTIN_NAME: &str = "builtin";

/// The tokenizer mockserve and loadgen use unless told otherwise: `DEFAULT_ENCODING`, loaded
/// once per process (later calls are cheap clones) with its answer words computed.
pub fn default_tokenizer() -> Result<TiktokenTokenizer, TokenizerError> {
    TiktokenTokenizer::new(DEFAULT_ENCODING)
}

/// Loads the tokenizer `path` names, with its answer words computed (nothing is left for the
/// first request to set up):
///
/// * `builtin`: the word-level [`BuiltinTokenizer`];
/// * `cl100k_base` or `o200k_base`: an embedded OpenAI encoding ([`TiktokenTokenizer`]);
/// * any other path: a HuggingFace `tokenizer.json` (any model type the `tokenizers` crate
///   supports: byte-level BPE as in Llama 3, DeepSeek, Qwen; WordPiece; Unigram).
///
/// A name wins over a file of the same name in the working directory (write `./builtin`).
pub fn load_tokenizer(path: &Path) -> Result<Box<dyn Tokenizer>, TokenizerError> {
    let name = path.to_str().unwrap_or_default();
    if name == BUILTIN_NAME {
        return Ok(Box::new(BuiltinTokenizer::new()));
    }
    if let Some(encoding) = TiktokenEncoding::from_name(name) {
        return Ok(Box::new(TiktokenTokenizer::new(encoding)?));
    }
    Ok(Box::new(HfTokenizer::from_file(path)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Checks the [`AnswerWords`] guarantee on seeded random answers of 1..500 tokens.
    pub(crate) fn check_answer_words_round_trip(tok: &dyn Tokenizer, cases: usize) {
        let words = tok.answer_words();
        assert!(!words.continuation().is_empty());
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..cases {
            let n = rng.gen_range(1..500);
            let ids = words.sample(&mut rng, n);
            assert_eq!(ids.len(), n);
            assert_eq!(tok.encode(&tok.decode(&ids)), ids);
            let more = words.sample_continuation(&mut rng, n);
            assert_eq!(tok.encode(&tok.decode(&more)), more);
        }
    }

    #[test]
    fn builtin_answer_words_round_trip() {
        check_answer_words_round_trip(&BuiltinTokenizer::new(), 300);
    }

    #[test]
    fn sample_is_deterministic_and_starts_with_an_initial_word() {
        let tok = BuiltinTokenizer::new();
        let words = tok.answer_words();
        let a = words.sample(&mut ChaCha8Rng::seed_from_u64(3), 20);
        let b = words.sample(&mut ChaCha8Rng::seed_from_u64(3), 20);
        assert_eq!(a, b);
        assert!(words.initial().contains(&a[0]));
        assert!(a[1..].iter().all(|id| words.continuation().contains(id)));
        assert!(!tok.decode(&a).starts_with(' '));
        assert!(AnswerWords::default()
            .sample(&mut ChaCha8Rng::seed_from_u64(3), 5)
            .is_empty());
    }

    #[test]
    fn names_select_the_embedded_tokenizers() {
        let load = |name: &str| match load_tokenizer(Path::new(name)) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            load("builtin").vocab_size(),
            BuiltinTokenizer::new().vocab_size()
        );
        assert_eq!(load("cl100k_base").encode("hello world"), [15339, 1917]);
        assert_eq!(load("o200k_base").vocab_size(), 200_266);
        let default = default_tokenizer().map(|t| t.encoding()).ok();
        assert_eq!(default, Some(DEFAULT_ENCODING));
    }

    #[test]
    fn load_errors_name_the_path() {
        let missing = Path::new("/nonexistent/tokenizer.json");
        let err = load_tokenizer(missing).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("/nonexistent/tokenizer.json")));
    }
}
