//! Prompt synthesis from Mooncake `hash_ids`: every hash id becomes one deterministic block of
//! exactly `trace_block_size` tokens, so the server sees the prefix sharing the trace describes.
//!
//! A block is a sequence of *pieces*, each one token of the target's tokenizer: the tokenizer's
//! round-tripping answer words (`" word"`, space-prefixed, so a sequence of them re-encodes to
//! the same ids and pieces never merge across block boundaries). The first pieces spell the hash
//! id in base `V` (the number of pieces), so different ids always differ in their first token
//! (siblings stay distinct); the rest are drawn from a generator seeded with the id. Equal ids
//! give identical blocks. The prompt is the concatenation of its blocks, cut to `input_length`
//! tokens (the last block is cut).
//!
//! Without a tokenizer (`--url` and no `--tokenizer`) the pieces are the one-token words of
//! servesim's default tokenizer (`o200k_base`): common English words, one token each in other
//! byte-level BPE vocabularies too, so counts are close but not exact (2,048 tokens of them are
//! 2,063 for DeepSeek-V3 and 2,064 for `cl100k_base`; lorem-ipsum words, the fallback, were 3,723
//! and 3,326).
//!
//! The text is sent as a raw `/v1/completions` prompt: no chat template adds leading tokens, so
//! trace block `i` starts at token `i * trace_block_size` and, when that is a multiple of the
//! engine's KV block size, engine blocks line up with trace blocks exactly as in offline replay.
//!
//! With exact pieces each piece is one token id, so a prompt's ids are known without encoding
//! its text ([`PromptSynth::prompt_ids`]): the ids the tokenizer gives the text (a test checks
//! it), which a server that shares the tokenizer (loadgen's embedded mockserve) can take as they
//! are instead of tokenizing some 100 kB of text per trace request.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servesim::tokenizer::{Tokenizer, LOREM_WORDS};

/// Salt of the per-block filler generator (so block text is not the id's digits repeated).
const FILLER_SALT: u64 = 0x5EED_B10C_0000_0001;

/// Turns hash ids into prompt text.
#[derive(Clone, Debug)]
pub(crate) struct PromptSynth {
    /// One-token pieces, in a fixed order.
    pieces: Vec<String>,
    /// Each piece's token id when the pieces are exact (empty otherwise).
    ids: Vec<u32>,
    /// Token counts are exact (a tokenizer was known).
    exact: bool,
    /// Tokens per hash id.
    block_size: usize,
    /// Base-`V` digits needed to spell any u64.
    id_digits: usize,
}

impl PromptSynth {
    /// Exact blocks for `tok`: its continuation answer words that encode to one token each.
    pub(crate) fn exact(tok: &dyn Tokenizer, block_size: usize) -> PromptSynth {
        let (ids, pieces): (Vec<u32>, Vec<String>) = tok
            .answer_words()
            .continuation()
            .iter()
            .map(|&id| (id, tok.decode(&[id])))
            .filter(|(id, text)| tok.encode(text) == [*id])
            .unzip();
        if pieces.len() < 2 {
            return PromptSynth::heuristic(block_size);
        }
        PromptSynth {
            ids,
            ..PromptSynth::from_pieces(pieces, true, block_size)
        }
    }

    /// Approximate blocks for an unknown tokenizer: the default tokenizer's one-token words
    /// (lorem-ipsum words should it fail to load).
    pub(crate) fn heuristic(block_size: usize) -> PromptSynth {
        if let Ok(tok) = servesim::tokenizer::default_tokenizer() {
            let exact = PromptSynth::exact(&tok, block_size);
            if exact.is_exact() {
                return PromptSynth {
                    exact: false,
                    ids: Vec::new(),
                    ..exact
                };
            }
        }
        let mut pieces: Vec<String> = LOREM_WORDS.iter().map(|w| format!(" {w}")).collect();
        pieces.dedup();
        PromptSynth::from_pieces(pieces, false, block_size)
    }

    fn from_pieces(pieces: Vec<String>, exact: bool, block_size: usize) -> PromptSynth {
        let v = pieces.len() as u128;
        let mut id_digits = 1;
        let mut span = v;
        while span <= u64::MAX as u128 {
            span *= v;
            id_digits += 1;
        }
        PromptSynth {
            pieces,
            ids: Vec::new(),
            exact,
            block_size: block_size.max(1),
            id_digits,
        }
    }

    /// True when token counts are exact.
    pub(crate) fn is_exact(&self) -> bool {
        self.exact
    }

    /// The pieces (indices) of hash id `id`'s block: exactly `block_size` of them.
    pub(crate) fn block(&self, id: u64) -> Vec<u32> {
        let v = self.pieces.len() as u64;
        let mut out = Vec::with_capacity(self.block_size);
        let mut rest = id;
        for _ in 0..self.id_digits.min(self.block_size) {
            out.push((rest % v) as u32);
            rest /= v;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(id ^ FILLER_SALT);
        while out.len() < self.block_size {
            out.push(rng.gen_range(0..v) as u32);
        }
        out
    }

    /// `n` pieces drawn from a generator seeded with `seed` (synthetic prompts of `bench`).
    pub(crate) fn filler(&self, seed: u64, n: usize) -> Vec<u32> {
        let v = self.pieces.len() as u32;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ FILLER_SALT);
        (0..n).map(|_| rng.gen_range(0..v)).collect()
    }

    /// The prompt's pieces: the blocks of `hash_ids` concatenated, cut to `input_length`.
    pub(crate) fn prompt_pieces(&self, hash_ids: &[u64], input_length: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(input_length);
        for &id in hash_ids {
            if out.len() >= input_length {
                break;
            }
            let block = self.block(id);
            let n = (input_length - out.len()).min(block.len());
            out.extend_from_slice(&block[..n]);
        }
        out
    }

    /// The text of some pieces.
    pub(crate) fn text(&self, pieces: &[u32]) -> String {
        let mut s = String::with_capacity(pieces.len() * 7);
        for &p in pieces {
            s.push_str(&self.pieces[p as usize]);
        }
        s
    }

    /// The prompt text of `hash_ids` cut to `input_length` tokens.
    pub(crate) fn prompt(&self, hash_ids: &[u64], input_length: usize) -> String {
        self.text(&self.prompt_pieces(hash_ids, input_length))
    }

    /// The token ids of [`PromptSynth::prompt`]'s text, when the pieces are exact (None
    /// otherwise): each piece's id, no text built or encoded.
    pub(crate) fn prompt_ids(&self, hash_ids: &[u64], input_length: usize) -> Option<Vec<u32>> {
        if !self.exact || self.ids.len() != self.pieces.len() {
            return None;
        }
        let mut ids = self.prompt_pieces(hash_ids, input_length);
        for p in &mut ids {
            *p = self.ids[*p as usize];
        }
        Some(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::tokenizer::BuiltinTokenizer;

    #[test]
    fn exact_token_counts_identical_blocks_and_distinct_siblings() {
        let tok = BuiltinTokenizer::new();
        let synth = PromptSynth::exact(&tok, 32);
        assert!(synth.is_exact());
        for (ids, len) in [
            (vec![1u64, 2, 3], 96),
            (vec![1, 2, 3], 70),
            (vec![7], 1),
            (vec![u64::MAX, 0], 64),
        ] {
            let text = synth.prompt(&ids, len);
            let encoded = tok.encode(&text);
            assert_eq!(encoded.len(), len, "ids {ids:?}");
        }
        // Equal ids: identical tokens; the shared prefix of two prompts is token-identical.
        let a = tok.encode(&synth.prompt(&[1, 2, 3], 96));
        let b = tok.encode(&synth.prompt(&[1, 2, 4], 96));
        assert_eq!(a[..64], b[..64]);
        // Siblings differ from their first token on.
        assert_ne!(a[64], b[64]);
        assert_eq!(synth.block(5), synth.block(5));
        for id in 0..200u64 {
            assert_ne!(
                synth.block(id)[0..synth.id_digits],
                synth.block(id + 1)[0..synth.id_digits]
            );
        }
        // The cut block is the start of the whole block.
        let cut = tok.encode(&synth.prompt(&[9, 8], 40));
        let whole = tok.encode(&synth.prompt(&[9, 8], 64));
        assert_eq!(cut[..], whole[..40]);
    }

    #[test]
    fn default_tokenizer_blocks_are_exact() {
        let tok = match servesim::tokenizer::default_tokenizer() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let synth = PromptSynth::exact(&tok, 16);
        assert!(synth.is_exact());
        for (ids, len) in [
            (vec![1u64, 2, 3], 48),
            (vec![5, 6], 17),
            (vec![u64::MAX], 16),
        ] {
            assert_eq!(
                tok.encode(&synth.prompt(&ids, len)).len(),
                len,
                "ids {ids:?}"
            );
        }
        let a = tok.encode(&synth.prompt(&[1, 2, 3], 48));
        let b = tok.encode(&synth.prompt(&[1, 2, 4], 48));
        assert_eq!(a[..32], b[..32]);
        assert_ne!(a[32], b[32]);
    }

    /// A prompt's ids are exactly what the tokenizer makes of its text (so a server given the
    /// ids runs the same engine request as one given the text), for the default tokenizer and
    /// the built-in one; the heuristic pieces have no ids.
    #[test]
    fn prompt_ids_are_the_encoded_text() {
        let default = match servesim::tokenizer::default_tokenizer() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let builtin = BuiltinTokenizer::new();
        let tokenizers: [&dyn Tokenizer; 2] = [&default, &builtin];
        for tok in tokenizers {
            let synth = PromptSynth::exact(tok, 64);
            for (ids, len) in [
                (vec![1u64, 2, 3], 192),
                (vec![7, 8], 100),
                (vec![u64::MAX, 0, 42], 129),
                ((0..40).collect::<Vec<u64>>(), 2_500),
            ] {
                let text = synth.prompt(&ids, len);
                assert_eq!(
                    synth.prompt_ids(&ids, len),
                    Some(tok.encode(&text)),
                    "hash ids {ids:?}"
                );
            }
        }
        assert_eq!(PromptSynth::heuristic(16).prompt_ids(&[1], 16), None);
    }

    #[test]
    fn heuristic_blocks_have_one_word_per_token() {
        let synth = PromptSynth::heuristic(16);
        assert!(!synth.is_exact());
        let text = synth.prompt(&[3, 4], 20);
        assert_eq!(text.split_whitespace().count(), 20);
        // Words of the default tokenizer: exact for it, close for other BPE vocabularies.
        let tok = match servesim::tokenizer::default_tokenizer() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(tok.encode(&text).len(), 20);
    }
}
