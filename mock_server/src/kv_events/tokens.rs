//! [`BlockTokens`]: the token ids behind each sequence hash the engine may cache, so that a
//! `BlockStored` event can carry exactly the tokens of its blocks while the engine itself keeps
//! only hashes.
//!
//! Every tracked request contributes the blocks of its prompt and, as the engine emits them, of
//! its output, hashed exactly as the engine hashes them. An entry lives while a request holds it
//! or a worker has it cached (per-worker sets of stored hashes, emptied by removals and clears),
//! so the table is bounded by what is in flight plus what is cached.

use std::collections::BTreeMap;
use std::sync::Arc;

use servesim::ids::RequestId;
use servesim::kv::{KvEvent, KvEventData};
use servesim::time::SimTime;
use servesim::tokens::{BlockHashes, HashKeyMap, SequenceHash, Token};

use super::wire::{WireEvent, MEDIUM_GPU};

/// The LoRA adapter of a request's blocks: vLLM's `lora_id` and `lora_name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoraTag {
    /// `lora_int_id`.
    pub id: u64,
    /// The adapter's served name.
    pub name: String,
}

/// One block's tokens and who needs them.
#[derive(Debug)]
struct Entry {
    /// The block's tokens (`block_size` of them).
    tokens: Box<[Token]>,
    /// The adapter whose request cached it, if any.
    lora: Option<Arc<LoraTag>>,
    /// Requests holding the block plus workers that have it cached.
    refs: u32,
}

/// A tracked request's view of its own sequence.
#[derive(Debug, Default)]
struct Sequence {
    /// Hashes of its full blocks, as the engine computes them.
    hashes: BlockHashes,
    /// Tokens after the last full block.
    tail: Vec<Token>,
    /// Its adapter, if any.
    lora: Option<Arc<LoraTag>>,
}

/// Sequence hash -> block tokens, fed from requests and their outputs.
#[derive(Debug)]
pub(crate) struct BlockTokens {
    /// Tokens per block (the engine's).
    block_size: usize,
    /// Every block some request or worker needs.
    table: HashKeyMap<SequenceHash, Entry>,
    /// Unfinished requests.
    live: BTreeMap<RequestId, Sequence>,
    /// Released requests whose blocks are kept until the passes running at release time have
    /// ended (their `Stored` events may still be on the way): `(not_before, hashes)`.
    retiring: Vec<(SimTime, Vec<SequenceHash>)>,
    /// Per worker, the hashes it has cached (each holds one ref).
    stored: Vec<HashKeyMap<SequenceHash, ()>>,
    /// Stored blocks whose tokens were unknown (a defect: always 0).
    pub unknown_blocks: u64,
}

impl BlockTokens {
    /// An empty table for `num_workers` workers of `block_size` tokens per block.
    pub(crate) fn new(num_workers: usize, block_size: usize) -> BlockTokens {
        BlockTokens {
            block_size,
            table: HashKeyMap::default(),
            live: BTreeMap::new(),
            retiring: Vec::new(),
            stored: (0..num_workers).map(|_| HashKeyMap::default()).collect(),
            unknown_blocks: 0,
        }
    }

    /// Starts tracking request `id` with its prompt tokens, hashed from scratch.
    pub(crate) fn track(&mut self, id: RequestId, prompt: &[Token]) {
        let full = prompt.len() / self.block_size * self.block_size;
        let hashes = BlockHashes::of(&prompt[..full], self.block_size);
        self.track_hashed(id, prompt, hashes, None);
    }

    /// Starts tracking request `id` with its prompt tokens and the hashes the engine got for
    /// its full blocks (salted for an adapter); its output blocks chain from them.
    pub(crate) fn track_hashed(
        &mut self,
        id: RequestId,
        prompt: &[Token],
        hashes: BlockHashes,
        lora: Option<Arc<LoraTag>>,
    ) {
        let full = hashes.sequence.len() * self.block_size;
        if full > prompt.len() {
            // Hashes without their tokens: nothing to name.
            return;
        }
        for (chunk, &h) in prompt[..full].chunks(self.block_size).zip(&hashes.sequence) {
            self.acquire(h, chunk, lora.as_ref());
        }
        let seq = Sequence {
            hashes,
            tail: prompt[full..].to_vec(),
            lora,
        };
        self.live.insert(id, seq);
    }

    /// Tags request `id`'s blocks with its adapter (prompt blocks it introduced, and every
    /// output block from now on).
    pub(crate) fn set_lora(&mut self, id: RequestId, lora: Option<Arc<LoraTag>>) {
        let Some(seq) = self.live.get_mut(&id) else {
            return;
        };
        seq.lora.clone_from(&lora);
        for h in &seq.hashes.sequence {
            if let Some(entry) = self.table.get_mut(h) {
                if entry.lora.is_none() {
                    entry.lora.clone_from(&lora);
                }
            }
        }
    }

    /// Appends one output token of request `id` (untracked requests are ignored).
    pub(crate) fn push_token(&mut self, id: RequestId, token: Token) {
        let Some(seq) = self.live.get_mut(&id) else {
            return;
        };
        seq.tail.push(token);
        if seq.tail.len() < self.block_size {
            return;
        }
        seq.hashes.push_block(&seq.tail);
        let block = std::mem::take(&mut seq.tail);
        let lora = seq.lora.clone();
        if let Some(&h) = seq.hashes.sequence.last() {
            self.acquire(h, &block, lora.as_ref());
        }
    }

    /// Stops tracking request `id`; its blocks stay known until the engine has passed
    /// `not_before` (see [`BlockTokens::retire_until`]).
    pub(crate) fn release(&mut self, id: RequestId, not_before: SimTime) {
        if let Some(seq) = self.live.remove(&id) {
            self.retiring.push((not_before, seq.hashes.sequence));
        }
    }

    /// Drops the blocks of requests released with `not_before <= now`.
    pub(crate) fn retire_until(&mut self, now: SimTime) {
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retiring)
            .into_iter()
            .partition(|(t, _)| *t <= now);
        self.retiring = keep;
        for (_, hashes) in due {
            for h in hashes {
                self.unref(h);
            }
        }
    }

    /// The wire form of one engine event, with the tokens of stored blocks; updates which
    /// worker caches what.
    pub(crate) fn wire_event(&mut self, event: &KvEvent) -> WireEvent {
        let w = event.worker.0 as usize;
        match &event.data {
            KvEventData::Stored { parent, blocks } => {
                let mut token_ids = Vec::with_capacity(blocks.len() * self.block_size);
                let mut lora = None;
                for b in blocks {
                    match self.table.get_mut(&b.seq_hash) {
                        Some(entry) => {
                            token_ids.extend_from_slice(&entry.tokens);
                            if lora.is_none() {
                                lora.clone_from(&entry.lora);
                            }
                            if let Some(stored) = self.stored.get_mut(w) {
                                if stored.insert(b.seq_hash, ()).is_none() {
                                    entry.refs += 1;
                                }
                            }
                        }
                        None => self.unknown_blocks += 1,
                    }
                }
                WireEvent::BlockStored {
                    block_hashes: blocks.iter().map(|b| b.seq_hash.0).collect(),
                    parent_block_hash: parent.map(|p| p.0),
                    token_ids,
                    block_size: self.block_size,
                    lora_id: lora.as_ref().map(|l| l.id),
                    medium: Some(MEDIUM_GPU),
                    lora_name: lora.map(|l| l.name.clone()),
                }
            }
            KvEventData::Removed { seq_hashes } => {
                for h in seq_hashes {
                    let was_stored = self
                        .stored
                        .get_mut(w)
                        .is_some_and(|s| s.remove(h).is_some());
                    if was_stored {
                        self.unref(*h);
                    }
                }
                WireEvent::BlockRemoved {
                    block_hashes: seq_hashes.iter().map(|h| h.0).collect(),
                    medium: Some(MEDIUM_GPU),
                }
            }
            KvEventData::Cleared => {
                let hashes: Vec<SequenceHash> = self
                    .stored
                    .get_mut(w)
                    .map(|s| s.drain().map(|(h, ())| h).collect())
                    .unwrap_or_default();
                for h in hashes {
                    self.unref(h);
                }
                WireEvent::AllBlocksCleared
            }
        }
    }

    /// Blocks known.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no block is known.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn acquire(&mut self, hash: SequenceHash, tokens: &[Token], lora: Option<&Arc<LoraTag>>) {
        self.table
            .entry(hash)
            .or_insert_with(|| Entry {
                tokens: tokens.into(),
                lora: lora.cloned(),
                refs: 0,
            })
            .refs += 1;
    }

    fn unref(&mut self, hash: SequenceHash) {
        if let Some(entry) = self.table.get_mut(&hash) {
            entry.refs = entry.refs.saturating_sub(1);
            if entry.refs == 0 {
                self.table.remove(&hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::ids::WorkerId;
    use servesim::kv::StoredBlock;

    fn stored(worker: u32, hashes: &BlockHashes, range: std::ops::Range<usize>) -> KvEvent {
        KvEvent {
            worker: WorkerId(worker),
            event_id: 0,
            data: KvEventData::Stored {
                parent: range.start.checked_sub(1).map(|p| hashes.sequence[p]),
                blocks: range
                    .map(|i| StoredBlock {
                        seq_hash: hashes.sequence[i],
                        local_hash: hashes.local[i],
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn stored_blocks_carry_prompt_and_output_tokens() {
        let mut t = BlockTokens::new(2, 2);
        let id = RequestId(7);
        t.track(id, &[1, 2, 3, 4, 5]);
        t.push_token(id, 6);
        t.push_token(id, 7);
        let all = BlockHashes::of(&[1, 2, 3, 4, 5, 6, 7], 2);
        let wire = t.wire_event(&stored(1, &all, 1..3));
        let WireEvent::BlockStored {
            token_ids,
            parent_block_hash,
            block_hashes,
            ..
        } = wire
        else {
            panic!("{wire:?}")
        };
        assert_eq!(token_ids, vec![3, 4, 5, 6]);
        assert_eq!(parent_block_hash, Some(all.sequence[0].0));
        assert_eq!(block_hashes, vec![all.sequence[1].0, all.sequence[2].0]);
        assert_eq!(t.unknown_blocks, 0);
    }

    #[test]
    fn entries_live_while_held_or_cached() {
        let mut t = BlockTokens::new(1, 2);
        let id = RequestId(1);
        t.track(id, &[1, 2, 3, 4]);
        let all = BlockHashes::of(&[1, 2, 3, 4], 2);
        t.wire_event(&stored(0, &all, 0..2));
        t.release(id, SimTime::from_micros(10));
        t.retire_until(SimTime::from_micros(9));
        assert_eq!(t.len(), 2, "not retired before its time");
        t.retire_until(SimTime::from_micros(10));
        assert_eq!(t.len(), 2, "still cached on worker 0");
        t.wire_event(&KvEvent {
            worker: WorkerId(0),
            event_id: 1,
            data: KvEventData::Removed {
                seq_hashes: vec![all.sequence[1]],
            },
        });
        assert_eq!(t.len(), 1);
        t.wire_event(&KvEvent {
            worker: WorkerId(0),
            event_id: 2,
            data: KvEventData::Cleared,
        });
        assert!(t.is_empty());
    }

    #[test]
    fn adapter_blocks_carry_the_adapter_and_chain_from_salted_hashes() {
        let mut t = BlockTokens::new(1, 2);
        let id = RequestId(3);
        // Salted prompt hashes, as the server computes them for an adapter.
        let plain = BlockHashes::of(&[1, 2], 2);
        let salted_seq = servesim::tokens::next_sequence_hash(
            Some(servesim::tokens::SequenceHash(99)),
            plain.local[0],
        );
        let salted = BlockHashes {
            local: plain.local.clone(),
            sequence: vec![salted_seq],
        };
        let lora = Arc::new(LoraTag {
            id: 1,
            name: "ad".into(),
        });
        t.track_hashed(id, &[1, 2, 3], salted.clone(), None);
        t.set_lora(id, Some(Arc::clone(&lora)));
        t.push_token(id, 4);
        let mut all = salted;
        all.push_block(&[3, 4]);
        let wire = t.wire_event(&stored(0, &all, 0..2));
        let WireEvent::BlockStored {
            token_ids,
            lora_id,
            lora_name,
            block_hashes,
            ..
        } = wire
        else {
            panic!("{wire:?}")
        };
        assert_eq!(token_ids, vec![1, 2, 3, 4]);
        assert_eq!(block_hashes[0], salted_seq.0);
        assert_ne!(block_hashes[0], plain.sequence[0].0);
        assert_eq!((lora_id, lora_name.as_deref()), (Some(1), Some("ad")));
        assert_eq!(t.unknown_blocks, 0);
    }

    #[test]
    fn unknown_blocks_are_counted() {
        let mut t = BlockTokens::new(1, 2);
        let all = BlockHashes::of(&[1, 2], 2);
        t.wire_event(&stored(0, &all, 0..1));
        assert_eq!(t.unknown_blocks, 1);
    }
}
