//! `BlockIds`: dense ids for sequence hashes, with the per-block state of one structure kept
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
//! `BlockIds::remove`; the id is then reused, so the vector never holds more ids than were
//! live at once.

use crate::kv::block_map::{slots_for, MAX_LOAD, MIN_SLOTS};
use crate::kv::prefetch;
use crate::tokens::SequenceHash;

/// A dense id standing for one [`SequenceHash`] in one [`BlockIds`] (ids of different
/// interners are unrelated).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BlockId(pub u32);

impl BlockId {
    fn index(self) -> usize {
        self.0 as usize
    }
}

/// An interner of sequence hashes into [`BlockId`]s, with a value of type `V` per id.
#[derive(Clone, Debug)]
pub(crate) struct BlockIds<V> {
    /// The id of every live hash.
    index: IdIndex,
    /// By id: the hash it stands for and its value. A dead id holds `V::default()`.
    slots: Vec<(SequenceHash, V)>,
    /// Dead ids, reused last-freed first.
    free: Vec<u32>,
}

impl<V: Default> Default for BlockIds<V> {
    fn default() -> Self {
        BlockIds {
            index: IdIndex::default(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<V: Default> BlockIds<V> {
    /// An empty interner.
    pub(crate) fn new() -> BlockIds<V> {
        BlockIds::default()
    }

    /// Live ids.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.index.len
    }

    /// True when no id is live.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.index.len == 0
    }

    /// Ids ever handed out at once (the length of the value vector).
    #[cfg(test)]
    pub(crate) fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// The id of `hash`, if live.
    pub(crate) fn id(&self, hash: SequenceHash) -> Option<BlockId> {
        self.index.find(hash, &self.slots).map(BlockId)
    }

    /// The id of `hash`, making one (with `V::default()`) when it has none; true when it did.
    pub(crate) fn intern(&mut self, hash: SequenceHash) -> (BlockId, bool) {
        if let Some(id) = self.index.find(hash, &self.slots) {
            return (BlockId(id), false);
        }
        let next = match self.free.pop() {
            Some(next) => {
                self.slots[next as usize].0 = hash;
                next
            }
            None => {
                self.slots.push((hash, V::default()));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(hash, next);
        (BlockId(next), true)
    }

    /// Makes room for `ids` live ids in all, so that neither the values nor the index grow
    /// (copying or re-placing everything) before that many are live. Never shrinks.
    pub(crate) fn reserve(&mut self, ids: usize) {
        self.slots.reserve(ids.saturating_sub(self.slots.len()));
        self.index.reserve(ids);
    }

    /// Prefetches the index slots of `hashes` ahead of interning them (see
    /// [`crate::kv::BlockMap::warm`]).
    pub(crate) fn warm(&self, hashes: impl IntoIterator<Item = SequenceHash>) {
        self.index.warm(hashes);
    }

    /// Prefetches the slots of `ids` ahead of use (see [`crate::kv::BlockMap::warm`]).
    pub(crate) fn warm_ids(&self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            prefetch(&self.slots[id.index()].0);
        }
    }

    /// The hash `id` stands for (meaningless for a dead id).
    pub(crate) fn hash(&self, id: BlockId) -> SequenceHash {
        self.slots[id.index()].0
    }

    /// The value of `id` (`V::default()` for a dead id).
    pub(crate) fn get(&self, id: BlockId) -> &V {
        &self.slots[id.index()].1
    }

    /// The value of `id`, mutably. Must be a live id.
    pub(crate) fn get_mut(&mut self, id: BlockId) -> &mut V {
        &mut self.slots[id.index()].1
    }

    /// Kills a live id: its hash is forgotten, its value reset, and the id reused later.
    pub(crate) fn remove(&mut self, id: BlockId) {
        let (hash, value) = &mut self.slots[id.index()];
        let removed = self.index.remove(*hash, id.0);
        debug_assert!(removed, "removing a dead block id");
        *value = V::default();
        self.free.push(id.0);
    }

    /// Every live id with its hash and value, in no particular order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (BlockId, SequenceHash, &V)> + '_ {
        self.index.ids().map(|i| {
            let (h, v) = &self.slots[i as usize];
            (BlockId(i), *h, v)
        })
    }

    /// Checks the index against the slots (tests). Panics on a violation.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        let mut live = vec![false; self.slots.len()];
        for i in self.index.ids() {
            let h = self.slots[i as usize].0;
            assert_eq!(
                self.index.find(h, &self.slots),
                Some(i),
                "id {i} is found by its hash"
            );
            assert!(!live[i as usize], "id {i} handed out twice");
            live[i as usize] = true;
        }
        assert_eq!(self.index.len, self.index.ids().count(), "entries counted");
        for &i in &self.free {
            assert!(!live[i as usize], "free id {i} is live");
            live[i as usize] = true;
        }
        assert!(live.iter().all(|&l| l), "every id is live or free");
    }
}

/// An empty index slot's id.
const EMPTY: u32 = u32::MAX;

/// The hash -> id index of [`BlockIds`]: open addressing with linear probing, 8 bytes a slot
/// (half what a slot with the whole hash takes, so twice the entries per cache line). A slot
/// holds the id and a fingerprint of the hash: the high 32 bits of its product with a
/// multiplicative (Fibonacci) constant, whose top bits are also the home slot, so slots can be
/// moved and rehashed without reading the hash. A fingerprint match is confirmed against the
/// hash the id stands for.
#[derive(Clone, Debug, Default)]
struct IdIndex {
    /// `(fingerprint, id)`; id [`EMPTY`] marks an empty slot. A power of two long, or empty.
    slots: Vec<(u32, u32)>,
    /// Entries.
    len: usize,
    /// `log2(slots.len())`.
    bits: u32,
}

/// The fingerprint of a hash (see [`IdIndex`]).
fn fingerprint(hash: SequenceHash) -> u32 {
    (hash.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

impl IdIndex {
    /// The home slot of a fingerprint.
    fn home(&self, fp: u32) -> usize {
        // `bits` is at most 32 (ids are u32): the shift stays below 32 but for one slot.
        (u64::from(fp) >> (32 - self.bits)) as usize
    }

    /// The id of `hash`, given what each id stands for.
    fn find<V>(&self, hash: SequenceHash, names: &[(SequenceHash, V)]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let fp = fingerprint(hash);
        let mask = self.slots.len() - 1;
        let mut i = self.home(fp);
        loop {
            let (f, id) = self.slots[i];
            if id == EMPTY {
                return None;
            }
            if f == fp && names[id as usize].0 == hash {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds `hash -> id` (`hash` must be absent).
    fn insert(&mut self, hash: SequenceHash, id: u32) {
        if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.grow();
        }
        self.place(fingerprint(hash), id);
        self.len += 1;
    }

    /// Puts an entry in the first empty slot from its home.
    fn place(&mut self, fp: u32, id: u32) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(fp);
        while self.slots[i].1 != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = (fp, id);
    }

    /// Removes the entry of `id`, whose hash is `hash`; false if there is none.
    fn remove(&mut self, hash: SequenceHash, id: u32) -> bool {
        if self.slots.is_empty() {
            return false;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(fingerprint(hash));
        loop {
            match self.slots[i].1 {
                EMPTY => return false,
                x if x == id => break,
                _ => i = (i + 1) & mask,
            }
        }
        self.len -= 1;
        // Shift the rest of the probe run back (no tombstones): an entry moves into the hole
        // unless its home lies cyclically after the hole (it would land before its home), that
        // is when it is at least as far from its home as from the hole. Whether it moves is
        // computed without a branch: which entries move follows no pattern a predictor learns.
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let (fp, next) = self.slots[j];
            if next == EMPTY {
                self.slots[i] = (0, EMPTY);
                return true;
            }
            let from_home = j.wrapping_sub(self.home(fp)) & mask;
            let from_hole = j.wrapping_sub(i) & mask;
            // All ones when the entry moves, else zero (a mask, which compilers keep as
            // arithmetic where they may turn a select back into a branch).
            let moves = usize::from(from_home >= from_hole).wrapping_neg();
            let (hole_fp, hole_id) = self.slots[i];
            let pick = |moved: u32, kept: u32| (moved & moves as u32) | (kept & !moves as u32);
            self.slots[i] = (pick(fp, hole_fp), pick(next, hole_id));
            i = (j & moves) | (i & !moves);
        }
    }

    /// Prefetches the home slot of every hash (see [`crate::kv::block_map::BlockMap::warm`]).
    fn warm(&self, hashes: impl IntoIterator<Item = SequenceHash>) {
        if self.slots.is_empty() {
            return;
        }
        for hash in hashes {
            prefetch(&self.slots[self.home(fingerprint(hash))]);
        }
    }

    /// Every id indexed, in no particular order.
    #[cfg(test)]
    fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|&&(_, id)| id != EMPTY)
            .map(|&(_, id)| id)
    }

    /// Makes the slots hold `entries` entries without growing.
    fn reserve(&mut self, entries: usize) {
        let wanted = slots_for(entries);
        if wanted > self.slots.len() {
            self.resize(wanted);
        }
    }

    /// Doubles the slots (or makes the first ones) and re-places every entry.
    fn grow(&mut self) {
        self.resize((self.slots.len() * 2).max(MIN_SLOTS));
    }

    /// Re-places every entry into `n` slots (a power of two, at least twice the entries).
    fn resize(&mut self, n: usize) {
        let old = std::mem::replace(&mut self.slots, vec![(0, EMPTY); n]);
        self.bits = n.trailing_zeros();
        for (fp, id) in old {
            if id != EMPTY {
                self.place(fp, id);
            }
        }
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
            // Small keys, and keys that differ in their top bits only (0 among them).
            let key = if rng.gen_bool(0.2) {
                rng.gen_range(0..16u64) << 60
            } else {
                rng.gen_range(0..500u64)
            };
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

    /// The fingerprint's multiplier.
    const FIB: u64 = 0x9E37_79B9_7F4A_7C15;

    /// The multiplier's inverse modulo 2^64 (Newton's iteration; FIB is odd): a product `p`
    /// comes from the hash `p * inverse`.
    fn fib_inverse() -> u64 {
        let mut inverse = FIB;
        for _ in 0..6 {
            inverse = inverse.wrapping_mul(2u64.wrapping_sub(FIB.wrapping_mul(inverse)));
        }
        inverse
    }

    /// Hashes whose fingerprints are equal (their products with the multiplier differ by 1 to
    /// 63, so they share the high bits) still get ids of their own, are found, and are removed
    /// one at a time: the index confirms a fingerprint against the hash.
    #[test]
    fn equal_fingerprints_are_told_apart_by_their_hashes() {
        let inverse = fib_inverse();
        assert_eq!(FIB.wrapping_mul(inverse), 1);
        let base = 0x1234_5678_9abc_def0u64;
        let hashes: Vec<SequenceHash> = (0..64u64)
            .map(|j| SequenceHash(base.wrapping_add(j.wrapping_mul(inverse))))
            .collect();
        let fps: std::collections::HashSet<u32> = hashes.iter().map(|&h| fingerprint(h)).collect();
        assert!(
            fps.len() <= 2,
            "the hashes share their fingerprint (a carry may split it)"
        );
        let mut ids: BlockIds<u64> = BlockIds::new();
        for &h in &hashes {
            let (id, inserted) = ids.intern(h);
            assert!(inserted);
            *ids.get_mut(id) = h.0;
        }
        for &h in &hashes {
            let id = ids.id(h).expect("interned");
            assert_eq!(ids.hash(id), h);
            assert_eq!(*ids.get(id), h.0);
        }
        for &h in hashes.iter().step_by(3) {
            let id = ids.id(h).expect("interned");
            ids.remove(id);
            assert_eq!(ids.id(h), None);
            ids.assert_invariants();
        }
        for (i, &h) in hashes.iter().enumerate() {
            assert_eq!(ids.id(h).is_some(), i % 3 != 0, "hash {i}");
        }
    }

    /// An interner with room made for `n` ids takes `n` live ids without growing its values
    /// or its index, and hands out the same ids as one without.
    #[test]
    fn a_reserved_interner_does_not_grow_before_it_holds_that_many() {
        let mut reserved: BlockIds<u32> = BlockIds::new();
        let mut plain: BlockIds<u32> = BlockIds::new();
        reserved.intern(SequenceHash(7));
        reserved.reserve(1_000);
        plain.intern(SequenceHash(7));
        let (values, slots) = (reserved.slots.capacity(), reserved.index.slots.len());
        assert!(
            values >= 1_000 && slots >= 2_000,
            "{values} values, {slots} slots"
        );
        for k in 0..999u64 {
            let h = SequenceHash(k.wrapping_mul(0x2545_F491_4F6C_DD1D));
            assert_eq!(reserved.intern(h), plain.intern(h), "hash {k}");
            if k % 7 == 0 {
                let id = plain.id(h).expect("interned");
                plain.remove(id);
                reserved.remove(id);
            }
        }
        assert_eq!(reserved.slots.capacity(), values, "the values grew");
        assert_eq!(reserved.index.slots.len(), slots, "the index grew");
        reserved.assert_invariants();
        assert_eq!(reserved.len(), plain.len());
        // Room for fewer than are live changes nothing.
        reserved.reserve(10);
        assert_eq!(reserved.index.slots.len(), slots);
    }

    /// Probe runs that wrap past the end of the index, with entries of neighbouring homes
    /// interleaved in them, survive every order of removal: each removal leaves every other
    /// entry found, and the index consistent.
    #[test]
    fn probe_runs_that_wrap_around_the_index_survive_any_removal_order() {
        let inverse = fib_inverse();
        // A hash whose fingerprint is `fp` (the product's high half), told apart by `low`.
        let with_fingerprint =
            |fp: u32, low: u64| SequenceHash(((u64::from(fp) << 32) | low).wrapping_mul(inverse));
        // Eight entries take an index of this many slots, whose home is a fingerprint's top
        // `bits` bits.
        let slots = slots_for(8);
        let bits = slots.trailing_zeros();
        let at_home = |home: u32, k: u32| (home << (32 - bits)) + k;
        // Five entries at home in the last slot, two in the first and one in the second.
        let last = slots as u32 - 1;
        let hashes: Vec<SequenceHash> = (0..5)
            .map(|k| with_fingerprint(at_home(last, k), k.into()))
            .chain((0..2).map(|k| with_fingerprint(at_home(0, k), 10 + u64::from(k))))
            .chain([with_fingerprint(at_home(1, 0), 20)])
            .collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..200 {
            let mut ids: BlockIds<u64> = BlockIds::new();
            let mut order: Vec<usize> = (0..hashes.len()).collect();
            // Inserted in a random order (which entry sits where in a run changes), removed in
            // another.
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            for &i in &order {
                let (id, inserted) = ids.intern(hashes[i]);
                assert!(inserted);
                *ids.get_mut(id) = i as u64;
            }
            assert_eq!(ids.index.slots.len(), slots);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            for (n, &gone) in order.iter().enumerate() {
                let id = ids.id(hashes[gone]).expect("still interned");
                ids.remove(id);
                ids.assert_invariants();
                assert_eq!(ids.id(hashes[gone]), None);
                for &left in &order[n + 1..] {
                    let id = ids.id(hashes[left]).expect("another entry is still found");
                    assert_eq!(*ids.get(id), left as u64);
                }
            }
            assert!(ids.is_empty());
        }
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
