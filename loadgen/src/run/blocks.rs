//! A prompt kept as chained block hashes ([`PromptBlocks`]), and the prompt tokens of a chat
//! request as mockserve renders them ([`ChatPrompts`]).
//!
//! A `loadgen multiturn` record keeps its prompt as [`PromptBlocks`] of [`RECORD_BLOCK_TOKENS`]
//! tokens: the hash at index `i` identifies the whole prefix `[0, (i + 1) * 16)` (servesim's
//! sequence hash, the prefix cache's key), so `loadgen trace convert` can label blocks of any
//! multiple of 16 tokens without the prompt's text: block `j` of a `16k`-token block size is
//! named by hash `(j + 1) * k - 1`.

use std::sync::Arc;

use mock_server::api::protocol::ChatRequest;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use servesim::tokenizer::{ChatTemplate, Tokenizer};
use servesim::tokens::BlockHashes;

/// Tokens per hash in a multiturn record's [`PromptBlocks`]: a divisor of every usual KV block
/// size (16, 32, 64, ... and the 512 of public Mooncake traces).
pub(crate) const RECORD_BLOCK_TOKENS: usize = 16;

/// A prompt as the sequence hashes of its full blocks: enough to tell, for any two prompts,
/// how many whole blocks they share from the start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptBlocks {
    /// Prompt tokens (the partial last block included).
    pub tokens: usize,
    /// Tokens per hash.
    pub block_size: usize,
    /// Sequence hash of every full block: `hashes[i]` identifies tokens `[0, (i + 1) *
    /// block_size)`.
    pub hashes: Vec<u64>,
}

impl PromptBlocks {
    /// The hashes of `tokens` in blocks of `block_size` (above 0).
    pub(crate) fn of(tokens: &[u32], block_size: usize) -> PromptBlocks {
        let block_size = block_size.max(1);
        PromptBlocks {
            tokens: tokens.len(),
            block_size,
            hashes: BlockHashes::of(tokens, block_size)
                .sequence
                .iter()
                .map(|h| h.0)
                .collect(),
        }
    }

    /// The prefix hash of every full block of `block_size` tokens (a multiple of
    /// [`Self::block_size`]); `None` when it is not a multiple.
    pub(crate) fn coarse(&self, block_size: usize) -> Option<Vec<u64>> {
        if block_size == 0 || self.block_size == 0 || block_size % self.block_size != 0 {
            return None;
        }
        let k = block_size / self.block_size;
        let full = self.tokens / block_size;
        (1..=full)
            .map(|j| self.hashes.get(j * k - 1).copied())
            .collect()
    }
}

/// Chat requests to prompt tokens: mockserve's request parser (tools in a leading system
/// message, tool calls rendered into their assistant messages) and the chat template of the
/// tokenizer, as the embedded server renders them.
#[derive(Clone)]
pub(crate) struct ChatPrompts {
    /// The tokenizer.
    tokenizer: Arc<dyn Tokenizer>,
    /// Its chat template (resolved once).
    template: ChatTemplate,
}

impl std::fmt::Debug for ChatPrompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatPrompts")
            .field("template", &self.template.family())
            .finish()
    }
}

impl ChatPrompts {
    /// Prompts rendered with `tokenizer` and its chat template.
    pub(crate) fn new(tokenizer: Arc<dyn Tokenizer>) -> ChatPrompts {
        let template = ChatTemplate::for_tokenizer(tokenizer.as_ref());
        ChatPrompts {
            tokenizer,
            template,
        }
    }

    /// The prompt tokens of a `/v1/chat/completions` body, or why mockserve would refuse it
    /// (its 400 message).
    pub(crate) fn tokens(&self, body: &Value) -> Result<Vec<u32>, String> {
        let object = body
            .as_object()
            .ok_or_else(|| "the request body must be a JSON object".to_string())?;
        let request = ChatRequest::parse(object).map_err(|e| e.message)?;
        Ok(self
            .template
            .render(self.tokenizer.as_ref(), &request.messages, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use servesim::tokenizer::BuiltinTokenizer;

    /// Coarse blocks are the fine hashes at every k-th block end, so two prompts share a
    /// coarse block exactly when they agree on its whole prefix; a size that is not a multiple
    /// has none.
    #[test]
    fn coarse_blocks_name_whole_prefixes() {
        let a: Vec<u32> = (0..150).map(|i| i * 7 % 31).collect();
        let mut b = a.clone();
        b[40] += 1;
        let (fa, fb) = (PromptBlocks::of(&a, 16), PromptBlocks::of(&b, 16));
        assert_eq!((fa.tokens, fa.hashes.len()), (150, 9));
        for (size, shared, total) in [(16, 2, 9), (32, 1, 4), (48, 0, 3), (64, 0, 2), (160, 0, 0)] {
            let (ca, cb) = (
                fa.coarse(size).expect("a multiple"),
                fb.coarse(size).expect("a multiple"),
            );
            let k = size / 16;
            let every_kth: Vec<u64> = fa.hashes.iter().skip(k - 1).step_by(k).copied().collect();
            assert_eq!(ca, every_kth, "{size}");
            assert_eq!((ca.len(), cb.len()), (total, total), "{size}");
            let same = ca.iter().zip(&cb).take_while(|(x, y)| x == y).count();
            assert_eq!(same, shared, "{size}");
        }
        assert_eq!(fa.coarse(24), None);
        assert_eq!(fa.coarse(0), None);
    }

    /// The tokens are the server's: the chat template around each message, the generation
    /// prompt at the end; a body the server refuses gives its message.
    #[test]
    fn chat_prompts_render_as_the_server_does() {
        let tok: Arc<dyn Tokenizer> = Arc::new(BuiltinTokenizer::new());
        let prompts = ChatPrompts::new(tok.clone());
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Hello there"},
        ]});
        let ids = prompts.tokens(&body).expect("valid");
        assert_eq!(
            tok.decode(&ids),
            "<|begin_of_text|><|system|>Be brief<|end|><|user|>Hello there<|end|><|assistant|>"
        );
        assert_eq!(
            prompts.tokens(&json!({"model": "m", "messages": []})),
            Err("Invalid 'messages': empty array. Expected an array with minimum length 1.".into())
        );
        assert_eq!(
            prompts.tokens(&json!([1])),
            Err("the request body must be a JSON object".into())
        );
    }
}
