//! Prompt tokens and engine block hashes of a trace request, synthesized from its `hash_ids`
//! without materialising long prompts: [`TraceRequest::synthesize_tokens`] and
//! [`TraceRequest::engine_block_local_hashes`] over a [`LocalHashCache`].

use std::collections::HashMap;

use super::TraceRequest;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::tokens::{local_block_hashes, LocalBlockHash, Token, HASH_SEED};

impl TraceRequest {
    /// The prompt as token ids: `trace_block_size` copies of `hash_id as u32` per hash id
    /// (u64 → u32 truncation, as Dynamo does), truncated to `input_length`.
    pub fn synthesize_tokens(&self, trace_block_size: usize) -> Vec<Token> {
        let mut tokens = Vec::with_capacity(self.input_length);
        for &id in &self.hash_ids {
            let remaining = self.input_length - tokens.len();
            if remaining == 0 {
                break;
            }
            let n = remaining.min(trace_block_size);
            tokens.extend(std::iter::repeat_n(id as Token, n));
        }
        tokens
    }

    /// Local hashes of every full engine block of the synthesized prompt: exactly
    /// `local_block_hashes(&self.synthesize_tokens(trace_block_size), cache.block_size())`.
    ///
    /// When `trace_block_size` is a multiple of the engine block size, every full engine block is
    /// `block_size` copies of one token, so its hash depends only on the hash id and is memoised
    /// in `cache`; no tokens are materialised. Otherwise this falls back to synthesizing tokens.
    pub(crate) fn engine_block_local_hashes(
        &self,
        trace_block_size: usize,
        cache: &mut LocalHashCache,
    ) -> Vec<LocalBlockHash> {
        let block_size = cache.block_size;
        if trace_block_size == 0 || trace_block_size % block_size != 0 {
            return local_block_hashes(&self.synthesize_tokens(trace_block_size), block_size);
        }
        let num_blocks = self.input_length / block_size;
        let per_trace_block = trace_block_size / block_size;
        let mut out = Vec::with_capacity(num_blocks);
        for &id in &self.hash_ids {
            if out.len() == num_blocks {
                break;
            }
            let hash = cache.uniform_block(id as Token);
            let n = per_trace_block.min(num_blocks - out.len());
            out.extend(std::iter::repeat_n(hash, n));
        }
        out
    }
}

/// Memoised local hashes of uniform engine blocks (`block_size` copies of one token).
///
/// Tied to one engine block size; share one across all turns of a replay.
#[derive(Clone, Debug)]
pub struct LocalHashCache {
    /// Engine block size the memoised hashes were computed for.
    block_size: usize,
    /// Token value -> local hash of a block made only of that token, for tokens below
    /// [`DENSE_TOKENS`] (trace hash ids count up from 0: a vector, no hashing).
    dense: Vec<Option<LocalBlockHash>>,
    /// The same for larger tokens.
    sparse: HashMap<Token, LocalBlockHash>,
    /// Number of tokens memoised.
    len: usize,
    /// The bytes of one uniform block, reused for every miss.
    scratch: Vec<u8>,
}

/// Tokens below this are memoised in a vector indexed by token.
const DENSE_TOKENS: Token = 1 << 20;

impl LocalHashCache {
    /// An empty cache for engine blocks of `block_size` tokens (values below 1 are treated as 1).
    pub fn new(block_size: usize) -> LocalHashCache {
        LocalHashCache {
            block_size: block_size.max(1),
            dense: Vec::new(),
            sparse: HashMap::new(),
            len: 0,
            scratch: Vec::new(),
        }
    }

    /// The engine block size this cache serves.
    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of distinct tokens memoised.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn uniform_block(&mut self, token: Token) -> LocalBlockHash {
        if token < DENSE_TOKENS {
            let i = token as usize;
            if let Some(Some(hash)) = self.dense.get(i) {
                return *hash;
            }
            let hash = self.hash_uniform(token);
            if i >= self.dense.len() {
                self.dense.resize(i + 1, None);
            }
            self.dense[i] = Some(hash);
            self.len += 1;
            return hash;
        }
        if let Some(hash) = self.sparse.get(&token) {
            return *hash;
        }
        let hash = self.hash_uniform(token);
        self.sparse.insert(token, hash);
        self.len += 1;
        hash
    }

    /// [`local_block_hash`](crate::tokens::local_block_hash) of `block_size` copies of `token`, without allocating.
    fn hash_uniform(&mut self, token: Token) -> LocalBlockHash {
        self.scratch.clear();
        for _ in 0..self.block_size {
            self.scratch.extend_from_slice(&token.to_le_bytes());
        }
        LocalBlockHash(xxh3_64_with_seed(&self.scratch, HASH_SEED))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SimDuration;

    #[test]
    fn synthesized_tokens_repeat_hash_ids() {
        let turn = TraceRequest {
            line: 1,
            request_id: None,
            input_length: 6,
            requested_input_length: None,
            output_length: 1,
            hash_ids: vec![7, (1u64 << 32) + 3, 9],
            delay: SimDuration::ZERO,
        };
        assert_eq!(turn.synthesize_tokens(4), [7, 7, 7, 7, 3, 3]);
    }

    #[test]
    fn memoised_engine_hashes_match_materialised_tokens() {
        let shapes: &[(usize, usize, usize, usize)] = &[
            // (trace block, engine block, hash ids, input_length)
            (512, 64, 3, 1536),
            (512, 64, 3, 1500), // partial last engine block
            (512, 64, 3, 1000), // ends inside the second trace block
            (512, 512, 2, 700),
            (8, 4, 5, 39),
            (8, 1, 2, 16),
            (6, 4, 4, 23), // trace block not a multiple of the engine block
            (3, 4, 5, 15),
            (4, 8, 3, 12),
        ];
        for &(tbs, bs, n, input_length) in shapes {
            let turn = TraceRequest {
                line: 1,
                request_id: None,
                input_length,
                requested_input_length: None,
                output_length: 1,
                hash_ids: (0..n as u64).map(|i| i * 0x1_0000_0001 + 5).collect(),
                delay: SimDuration::ZERO,
            };
            let mut cache = LocalHashCache::new(bs);
            let want = local_block_hashes(&turn.synthesize_tokens(tbs), bs);
            assert_eq!(
                turn.engine_block_local_hashes(tbs, &mut cache),
                want,
                "{tbs} {bs}"
            );
            // Second call served from the cache.
            assert_eq!(turn.engine_block_local_hashes(tbs, &mut cache), want);
        }
    }

    #[test]
    fn memo_serves_small_and_large_tokens() {
        let mut cache = LocalHashCache::new(4);
        for token in [0, 3, DENSE_TOKENS - 1, DENSE_TOKENS, Token::MAX, 3] {
            let want = crate::tokens::local_block_hash(&[token; 4]);
            assert_eq!(cache.uniform_block(token), want, "{token}");
        }
        assert_eq!(cache.len(), 5, "a repeated token is memoised once");
    }
}
