//! What the engine is asked to run: a prompt (as block hashes plus a short tail of tokens) and
//! an output budget.

use std::sync::Arc;

use crate::tokens::{BlockHashes, Token};

/// A prompt as the engine needs it: its length, the hashes of its full blocks at the engine's
/// block size, and the tokens after the last full block.
///
/// Keeping hashes instead of tokens lets a trace of millions of tokens replay without
/// materialising them; the tail is kept because decode tokens complete the block it starts.
#[derive(Clone, Debug, Default)]
pub struct Prompt {
    /// Number of prompt tokens.
    pub len: usize,
    /// Hashes of the `len / block_size` full blocks.
    pub blocks: BlockHashes,
    /// The `len % block_size` tokens after the last full block.
    pub(crate) tail: Vec<Token>,
    /// Every prompt token, when the caller had them ([`Prompt::from_tokens`]); None for prompts
    /// built from hashes (trace replay). The engine never reads them: a KV-event publisher uses
    /// them to name the tokens of the blocks the engine cached.
    pub tokens: Option<Arc<[Token]>>,
}

impl Prompt {
    /// A prompt from its tokens.
    pub fn from_tokens(tokens: &[Token], block_size: usize) -> Prompt {
        let full = tokens.len() / block_size * block_size;
        Prompt {
            len: tokens.len(),
            blocks: BlockHashes::of(&tokens[..full], block_size),
            tail: tokens[full..].to_vec(),
            tokens: Some(Arc::from(tokens)),
        }
    }
}

/// One request for the engine.
#[derive(Clone, Debug, Default)]
pub struct EngineRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Tokens to generate (the engine ignores EOS: it always generates exactly this many unless
    /// the context limit ends it earlier).
    pub max_output_tokens: usize,
    /// Token ids to emit, in order, when the caller has chosen them (the server does, so that the
    /// text it streams re-tokenizes to the ids the engine cached). Missing ids are drawn from the
    /// engine's seeded generator.
    pub output_tokens: Vec<Token>,
}
