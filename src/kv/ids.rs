//! [`BlockIds`]: dense ids for sequence hashes, with the per-block state of one structure kept
//! in a `Vec` indexed by id.
//!
//! A structure keyed by 64-bit block hashes probes a hash table at a random place for every
//! block of a request, and on large tables nearly every probe misses the CPU caches. Interning
//! a request's hashes once (one probe each) and keeping the request's ids turns every later
//! access into an index into a vector; the blocks of one request get neighbouring ids (fresh
//! ids are consecutive, and freed ids are reused last-freed first, which hands out a released
//! run of blocks again in order), so those accesses share cache lines.
//!
//! The owner decides when an id is dead (nothing it keeps refers to it any more) and calls
//! [`BlockIds::remove`]; the id is then reused, so the vector never holds more ids than were
//! live at once.

use crate::kv::table::BlockMap;
use crate::tokens::SequenceHash;

/// A dense id standing for one [`SequenceHash`] in one [`BlockIds`] (ids of different
/// interners are unrelated).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

impl BlockId {
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// An interner of sequence hashes into [`BlockId`]s, with a value of type `V` per id.
#[derive(Clone, Debug)]
pub struct BlockIds<V> {
    /// The id of every live hash.
    index: BlockMap<u32>,
    /// By id: the hash it stands for and its value. A dead id holds `V::default()`.
    slots: Vec<(SequenceHash, V)>,
    /// Dead ids, reused last-freed first.
    free: Vec<u32>,
}

impl<V: Default> Default for BlockIds<V> {
    fn default() -> Self {
        BlockIds {
            index: BlockMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<V: Default> BlockIds<V> {
    /// An empty interner.
    pub fn new() -> BlockIds<V> {
        BlockIds::default()
    }

    /// Live ids.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when no id is live.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Ids ever handed out at once (the length of the value vector).
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The id of `hash`, if live.
    pub fn id(&self, hash: SequenceHash) -> Option<BlockId> {
        self.index.get(&hash).map(|&i| BlockId(i))
    }

    /// The id of `hash`, making one (with `V::default()`) when it has none; true when it did.
    pub fn intern(&mut self, hash: SequenceHash) -> (BlockId, bool) {
        let next = self.free.last().copied().unwrap_or(self.slots.len() as u32);
        let (slot, inserted) = self.index.get_or_insert_default(hash);
        if !inserted {
            return (BlockId(*slot), false);
        }
        *slot = next;
        if self.free.pop().is_none() {
            self.slots.push((hash, V::default()));
        } else {
            self.slots[next as usize].0 = hash;
        }
        (BlockId(next), true)
    }

    /// Reads the index slots of `hashes` ahead of interning them (see [`BlockMap::warm`]).
    pub fn warm(&self, hashes: impl IntoIterator<Item = SequenceHash>) {
        self.index.warm(hashes);
    }

    /// Reads the slots of `ids` ahead of use (see [`BlockMap::warm`]).
    pub fn warm_ids(&self, ids: impl IntoIterator<Item = BlockId>) {
        let mut acc = 0u64;
        for id in ids {
            acc ^= self.slots[id.index()].0 .0;
        }
        std::hint::black_box(acc);
    }

    /// The hash `id` stands for (meaningless for a dead id).
    pub fn hash(&self, id: BlockId) -> SequenceHash {
        self.slots[id.index()].0
    }

    /// The value of `id` (`V::default()` for a dead id).
    pub fn get(&self, id: BlockId) -> &V {
        &self.slots[id.index()].1
    }

    /// The value of `id`, mutably. Must be a live id.
    pub fn get_mut(&mut self, id: BlockId) -> &mut V {
        &mut self.slots[id.index()].1
    }

    /// Kills a live id: its hash is forgotten, its value reset, and the id reused later.
    pub fn remove(&mut self, id: BlockId) {
        let (hash, value) = &mut self.slots[id.index()];
        let removed = self.index.remove(hash);
        debug_assert_eq!(removed, Some(id.0), "removing a dead block id");
        *value = V::default();
        self.free.push(id.0);
    }

    /// Every live id with its hash and value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, SequenceHash, &V)> + '_ {
        self.index
            .iter()
            .map(|(h, &i)| (BlockId(i), h, &self.slots[i as usize].1))
    }

    /// Checks the index against the slots (tests). Panics on a violation.
    pub fn assert_invariants(&self) {
        let mut live = vec![false; self.slots.len()];
        for (h, &i) in self.index.iter() {
            assert_eq!(self.slots[i as usize].0, h, "id {i} stands for its hash");
            assert!(!live[i as usize], "id {i} handed out twice");
            live[i as usize] = true;
        }
        for &i in &self.free {
            assert!(!live[i as usize], "free id {i} is live");
            live[i as usize] = true;
        }
        assert!(live.iter().all(|&l| l), "every id is live or free");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// Interning, lookups and removals agree with a `HashMap` model over seeded random
    /// operations, ids are reused, and the vector never outgrows the most ids live at once.
    #[test]
    fn agrees_with_hash_map_on_random_operations() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut ids: BlockIds<u32> = BlockIds::new();
        let mut model: HashMap<u64, (BlockId, u32)> = HashMap::new();
        let mut peak = 0;
        for step in 0..20_000u32 {
            let key = rng.gen_range(0..500u64);
            let h = SequenceHash(key);
            match rng.gen_range(0..4) {
                0 | 1 => {
                    let (id, inserted) = ids.intern(h);
                    assert_eq!(inserted, !model.contains_key(&key));
                    if inserted {
                        assert_eq!(*ids.get(id), 0, "a new id starts at the default");
                        *ids.get_mut(id) = step;
                        model.insert(key, (id, step));
                    } else {
                        assert_eq!(model[&key].0, id);
                    }
                }
                2 => {
                    if let Some((id, _)) = model.remove(&key) {
                        ids.remove(id);
                    }
                }
                _ => {
                    let got = ids.id(h);
                    assert_eq!(got, model.get(&key).map(|e| e.0));
                    if let Some(id) = got {
                        assert_eq!(ids.hash(id), h);
                        assert_eq!(*ids.get(id), model[&key].1);
                    }
                }
            }
            peak = peak.max(model.len());
            assert_eq!(ids.len(), model.len());
            assert!(ids.num_slots() <= peak, "dead ids are reused");
            if step % 1000 == 0 {
                ids.assert_invariants();
            }
        }
        ids.assert_invariants();
        let mut seen: Vec<(u64, u32)> = ids.iter().map(|(_, h, v)| (h.0, *v)).collect();
        let mut want: Vec<(u64, u32)> = model.iter().map(|(k, e)| (*k, e.1)).collect();
        seen.sort_unstable();
        want.sort_unstable();
        assert_eq!(seen, want);
    }

    /// A run of blocks freed together is handed out again in its order: neighbours stay
    /// neighbours.
    #[test]
    fn a_freed_run_is_reused_in_order() {
        let mut ids: BlockIds<()> = BlockIds::new();
        let first: Vec<BlockId> = (1..=4).map(|k| ids.intern(SequenceHash(k)).0).collect();
        assert_eq!(first, (0..4).map(BlockId).collect::<Vec<_>>());
        // Released tail first, as the pool releases a request.
        for &id in first.iter().rev() {
            ids.remove(id);
        }
        let again: Vec<BlockId> = (10..14).map(|k| ids.intern(SequenceHash(k)).0).collect();
        assert_eq!(again, first);
    }
}
