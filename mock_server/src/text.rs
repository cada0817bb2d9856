//! Text <-> token ids at the HTTP edge: the [`TextCodec`] the server uses, over servesim's
//! tokenizers (OpenAI's embedded `o200k_base` by default; `--tokenizer` names another embedded
//! one or a HuggingFace `tokenizer.json`). Codecs are fully set up when built, before the server
//! reports ready.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use servesim::tokenizer::{
    default_tokenizer, load_tokenizer, BuiltinTokenizer, ChatTemplate, Tokenizer, TokenizerError,
};
pub use servesim::tokenizer::{ChatMessage, Role};

/// What the server needs from a tokenizer and chat template.
pub trait TextCodec: Send + Sync + std::fmt::Debug {
    /// Renders messages with the chat template; `add_generation_prompt` appends the assistant
    /// header that a reply starts from. Reasoning in assistant history is dropped, as reasoning
    /// models' templates do.
    fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Vec<u32>;

    /// Tokenizes plain text (a `/v1/completions` prompt).
    fn encode(&self, text: &str) -> Vec<u32>;

    /// `n` answer token ids whose first `reasoning` are reasoning. Each part decodes to text that
    /// re-encodes to the same ids, so an answer sent back as history hits the prefix cache.
    fn answer_tokens(&self, rng: &mut ChaCha8Rng, reasoning: usize, n: usize) -> Vec<u32>;

    /// The text of some token ids (concatenating per-token decodes gives the whole text).
    fn decode(&self, ids: &[u32]) -> String;

    /// How many token ids the codec knows (`0..vocab_size`), when it knows: ids beyond are
    /// refused in requests. `None` accepts every id.
    fn vocab_size(&self) -> Option<usize> {
        None
    }

    /// The text of one token id: `decode(&[id])`, borrowed when the codec keeps it at hand.
    fn token_text(&self, id: u32) -> Cow<'_, str> {
        Cow::Owned(self.decode(&[id]))
    }
}

/// A [`Tokenizer`] with the chat template that matches its special tokens.
pub(crate) struct TokenizerCodec {
    tokenizer: Box<dyn Tokenizer>,
    template: ChatTemplate,
    /// The text of every answer word's token, decoded once: answers are made of these, and
    /// each of their tokens would otherwise be decoded again for every answer that streams it.
    word_texts: HashMap<u32, Box<str>>,
}

impl std::fmt::Debug for TokenizerCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizerCodec")
            .field("template", &self.template.family())
            .finish()
    }
}

impl TokenizerCodec {
    /// A codec over `tokenizer`, warmed: one chat rendered and one answer drawn, so the first
    /// request finds nothing left to set up.
    pub(crate) fn new(tokenizer: Box<dyn Tokenizer>) -> TokenizerCodec {
        let template = ChatTemplate::for_tokenizer(tokenizer.as_ref());
        let words = tokenizer.answer_words();
        let word_texts = words
            .initial()
            .iter()
            .chain(words.continuation())
            .map(|&id| (id, tokenizer.decode(&[id]).into_boxed_str()))
            .collect();
        let codec = TokenizerCodec {
            tokenizer,
            template,
            word_texts,
        };
        let warm = [ChatMessage::user("Warm up, please: 1, 2, 3.")];
        let _ = codec.render_chat(&warm, true);
        let _ = codec.answer_tokens(&mut ChaCha8Rng::seed_from_u64(0), 1, 4);
        codec
    }

    /// A codec over the tokenizer `path` names: `builtin`, `cl100k_base`, `o200k_base`, or a
    /// HuggingFace `tokenizer.json`.
    pub(crate) fn from_file(path: &Path) -> Result<TokenizerCodec, TokenizerError> {
        Ok(TokenizerCodec::new(load_tokenizer(path)?))
    }
}

impl TextCodec for TokenizerCodec {
    fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Vec<u32> {
        self.template
            .render(self.tokenizer.as_ref(), messages, add_generation_prompt)
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text)
    }

    fn answer_tokens(&self, rng: &mut ChaCha8Rng, reasoning: usize, n: usize) -> Vec<u32> {
        let words = self.tokenizer.answer_words();
        let reasoning = reasoning.min(n);
        let mut ids = words.sample(rng, reasoning);
        ids.extend(words.sample(rng, n - reasoning));
        ids
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids)
    }

    fn vocab_size(&self) -> Option<usize> {
        Some(self.tokenizer.vocab_size())
    }

    fn token_text(&self, id: u32) -> Cow<'_, str> {
        match self.word_texts.get(&id) {
            Some(text) => Cow::Borrowed(text),
            None => Cow::Owned(self.tokenizer.decode(&[id])),
        }
    }
}

/// The codec the server uses unless told otherwise: servesim's default tokenizer (`o200k_base`,
/// loaded once per process; later calls are cheap). Should the embedded encoding ever fail to
/// load (a build defect that servesim's tests rule out), the word-level builtin one stands in.
pub fn default_codec() -> Arc<dyn TextCodec> {
    let tokenizer: Box<dyn Tokenizer> = match default_tokenizer() {
        Ok(t) => Box::new(t),
        Err(_) => Box::new(BuiltinTokenizer::new()),
    };
    Arc::new(TokenizerCodec::new(tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip_and_extend_the_prompt() {
        let codec = default_codec();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let answer = codec.answer_tokens(&mut rng, 0, 50);
        let text = codec.decode(&answer);
        assert_eq!(codec.encode(&text), answer);
        let per_token: String = answer.iter().map(|&t| codec.decode(&[t])).collect();
        assert_eq!(per_token, text, "streamed pieces concatenate to the text");

        let user = ChatMessage::user("hello there");
        let turn1 = codec.render_chat(std::slice::from_ref(&user), true);
        let history = vec![
            user,
            ChatMessage::assistant(format!("<think>hmm</think>{text}")),
        ];
        let warm = codec.render_chat(&history, false);
        assert_eq!(&warm[..turn1.len()], &turn1[..]);
        assert_eq!(&warm[turn1.len()..turn1.len() + answer.len()], &answer[..]);
    }

    #[test]
    fn token_texts_are_single_token_decodes() {
        let codec = default_codec();
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut ids = codec.answer_tokens(&mut rng, 10, 200);
        // Ids that are no answer word are decoded on the spot.
        ids.extend([0, 1, 100, 199_997, u32::MAX]);
        for id in ids {
            assert_eq!(codec.token_text(id), codec.decode(&[id]), "token {id}");
        }
    }

    #[test]
    fn reasoning_and_answer_each_round_trip() {
        let codec = default_codec();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let ids = codec.answer_tokens(&mut rng, 20, 50);
        assert_eq!(ids.len(), 50);
        let (thinking, answer) = ids.split_at(20);
        assert_eq!(codec.encode(&codec.decode(thinking)), thinking);
        assert_eq!(codec.encode(&codec.decode(answer)), answer);
    }
}
