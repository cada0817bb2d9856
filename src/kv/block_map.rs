//! `BlockMap`: the map from a block's sequence hash to its bookkeeping that the flat index
//! and the router's active blocks keep, one entry per block (the KV pool's dense ids have an
//! index of their own, `crate::kv::BlockIds`).
//!
//! Those maps hold tens of thousands of blocks each and are probed at random, so on a replay
//! nearly every probe misses the CPU caches: what a probe costs is the cache lines it touches.
//! A general-purpose table keeps its control bytes apart from its entries (two lines per cold
//! probe); this one is open addressing with linear probing and the key stored beside its value,
//! so a probe usually touches one line. Keys are hashes already; a multiplicative (Fibonacci)
//! step spreads them over the slots. Iteration order is arbitrary (no caller depends on it).

use crate::kv::prefetch;
use crate::tokens::SequenceHash;

/// Slots hold at most this share of entries (numerator / denominator): short probe runs. (The
/// pool's id index, [`crate::kv::ids`], probes the same way at the same load.)
pub(crate) const MAX_LOAD: (usize, usize) = (1, 2);
/// Keys to [`BlockMap::warm`] at once: their lines stay in the first-level cache until used.
pub(crate) const WARM_CHUNK: usize = 32;
/// Slots of the first allocation.
pub(crate) const MIN_SLOTS: usize = 16;

/// The slots (a power of two) that hold `entries` entries within [`MAX_LOAD`].
pub(crate) fn slots_for(entries: usize) -> usize {
    (entries.saturating_mul(MAX_LOAD.1) / MAX_LOAD.0)
        .max(MIN_SLOTS)
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
}

/// A map from [`SequenceHash`] to `V`, made for random probes on large tables (see the module
/// docs). Key 0 marks an empty slot; a block whose hash is 0 lives in `zero` instead.
#[derive(Clone, Debug)]
pub(crate) struct BlockMap<V> {
    /// `(key, value)`; key 0 is an empty slot (its value is `V::default()`). A power of two
    /// long, or empty before the first insert.
    slots: Vec<(u64, V)>,
    /// Entries in `slots`.
    len: usize,
    /// `64 - log2(slots.len())`: the shift that maps a key's product to its home slot.
    shift: u32,
    /// The value of key 0, which cannot be stored in a slot.
    zero: Option<V>,
}

impl<V> Default for BlockMap<V> {
    fn default() -> Self {
        BlockMap {
            slots: Vec::new(),
            len: 0,
            shift: 64,
            zero: None,
        }
    }
}

impl<V: Default> BlockMap<V> {
    /// An empty map (allocates on the first insert).
    pub(crate) fn new() -> BlockMap<V> {
        BlockMap::default()
    }

    /// Entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// True when there are no entries.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The home slot of a non-zero key.
    fn home(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The slot holding `key` (non-zero), if any.
    fn find(&self, key: u64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        loop {
            match self.slots[i].0 {
                0 => return None,
                k if k == key => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The value of `key`.
    pub(crate) fn get(&self, key: &SequenceHash) -> Option<&V> {
        if key.0 == 0 {
            return self.zero.as_ref();
        }
        self.find(key.0).map(|i| &self.slots[i].1)
    }

    /// The value of `key`, inserting `V::default()` first when absent; true when it inserted.
    pub(crate) fn get_or_insert_default(&mut self, key: SequenceHash) -> (&mut V, bool) {
        if key.0 == 0 {
            let inserted = self.zero.is_none();
            return (self.zero.get_or_insert_with(V::default), inserted);
        }
        if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(key.0);
        loop {
            match self.slots[i].0 {
                0 => {
                    self.slots[i].0 = key.0;
                    self.len += 1;
                    return (&mut self.slots[i].1, true);
                }
                k if k == key.0 => return (&mut self.slots[i].1, false),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Prefetches the home slot of every key (`src/kv/prefetch.rs`): the misses overlap one
    /// another and the work that follows, and the probes after them find the lines in cache.
    /// Worth it before a loop over a request's blocks, [`WARM_CHUNK`] keys at a time.
    pub(crate) fn warm(&self, keys: impl IntoIterator<Item = SequenceHash>) {
        if self.slots.is_empty() {
            return;
        }
        for key in keys {
            prefetch(&self.slots[self.home(key.0)].0);
        }
    }

    /// In a loop over `keys` that may stop early: at every [`WARM_CHUNK`]-th index `i`,
    /// [`BlockMap::warm`]s the chunk of keys starting there.
    pub(crate) fn warm_ahead(&self, keys: &[SequenceHash], i: usize) {
        if i % WARM_CHUNK == 0 {
            let end = keys.len().min(i + WARM_CHUNK);
            self.warm(keys[i..end].iter().copied());
        }
    }

    /// Sets `key`'s value; the previous one, if any.
    pub(crate) fn insert(&mut self, key: SequenceHash, value: V) -> Option<V> {
        let (slot, inserted) = self.get_or_insert_default(key);
        let old = std::mem::replace(slot, value);
        (!inserted).then_some(old)
    }

    /// Calls `f` on `key`'s value (one probe) and removes the entry when `f` says so (the
    /// second element of what it returns); `f`'s result, or None when `key` has no entry.
    pub(crate) fn update<R>(
        &mut self,
        key: &SequenceHash,
        f: impl FnOnce(&mut V) -> (R, bool),
    ) -> Option<R> {
        if key.0 == 0 {
            let (r, remove) = f(self.zero.as_mut()?);
            if remove {
                self.zero = None;
            }
            return Some(r);
        }
        let i = self.find(key.0)?;
        let (r, remove) = f(&mut self.slots[i].1);
        if remove {
            self.remove_slot(i);
        }
        Some(r)
    }

    /// Removes `key`; its value, if it had one.
    pub(crate) fn remove(&mut self, key: &SequenceHash) -> Option<V> {
        if key.0 == 0 {
            return self.zero.take();
        }
        let i = self.find(key.0)?;
        Some(self.remove_slot(i))
    }

    /// Empties slot `i` and shifts the entries of its probe run back (no tombstones).
    fn remove_slot(&mut self, mut i: usize) -> V {
        let mask = self.slots.len() - 1;
        let (_, value) = std::mem::take(&mut self.slots[i]);
        self.len -= 1;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let key = self.slots[j].0;
            if key == 0 {
                return value;
            }
            if may_fill(i, j, self.home(key)) {
                self.slots.swap(i, j);
                i = j;
            }
        }
    }

    /// Removes every entry, keeping the allocation.
    #[cfg(test)]
    pub(crate) fn clear(&mut self) {
        for slot in &mut self.slots {
            if slot.0 != 0 {
                *slot = (0, V::default());
            }
        }
        self.len = 0;
        self.zero = None;
    }

    /// Keeps the entries for which `keep` returns true (called once per entry).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(SequenceHash, &mut V) -> bool) {
        if let Some(v) = &mut self.zero {
            if !keep(SequenceHash(0), v) {
                self.zero = None;
            }
        }
        // Removing shifts later entries back (across the wrap too): decide first, then remove.
        let doomed: Vec<u64> = self
            .slots
            .iter_mut()
            .filter(|(k, _)| *k != 0)
            .filter_map(|(k, v)| (!keep(SequenceHash(*k), v)).then_some(*k))
            .collect();
        for key in doomed {
            self.remove(&SequenceHash(key));
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SequenceHash, &V)> + '_ {
        self.zero.iter().map(|v| (SequenceHash(0), v)).chain(
            self.slots
                .iter()
                .filter(|(k, _)| *k != 0)
                .map(|(k, v)| (SequenceHash(*k), v)),
        )
    }

    /// Every value, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// Makes room for `entries` entries in all, so that the map does not grow (nor pause to
    /// re-insert everything) before it holds that many. Never shrinks.
    pub(crate) fn reserve(&mut self, entries: usize) {
        if entries == 0 {
            return;
        }
        let wanted = slots_for(entries);
        if wanted > self.slots.len() {
            self.resize(wanted);
        }
    }

    /// Doubles the slots (or makes the first ones) and re-inserts every entry.
    fn grow(&mut self) {
        self.resize((self.slots.len() * 2).max(MIN_SLOTS));
    }

    /// Re-inserts every entry into `n` slots (a power of two, at least the entries).
    fn resize(&mut self, n: usize) {
        let old = std::mem::replace(
            &mut self.slots,
            std::iter::repeat_with(|| (0, V::default()))
                .take(n)
                .collect(),
        );
        self.shift = 64 - n.trailing_zeros();
        let mask = n - 1;
        for (key, value) in old {
            if key == 0 {
                continue;
            }
            let mut i = self.home(key);
            while self.slots[i].0 != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = (key, value);
        }
    }
}

/// In a linearly probed table that just emptied slot `hole`, whether the entry at `slot`
/// (later in the probe run) whose home slot is `home` may move into the hole: not if its home
/// lies cyclically in `(hole, slot]`, for then it would end up before its home.
pub(crate) fn may_fill(hole: usize, slot: usize, home: usize) -> bool {
    let stays = if hole <= slot {
        hole < home && home <= slot
    } else {
        hole < home || home <= slot
    };
    !stays
}

impl<V: Default> FromIterator<(SequenceHash, V)> for BlockMap<V> {
    fn from_iter<I: IntoIterator<Item = (SequenceHash, V)>>(iter: I) -> Self {
        let mut map = BlockMap::new();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// Every operation agrees with std's `HashMap` over seeded random operations on a small key
    /// space (so removals hit long probe runs, wrap-arounds and key 0).
    #[test]
    fn agrees_with_hash_map_on_random_operations() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for round in 0..4 {
            let mut ours: BlockMap<u32> = BlockMap::new();
            let mut want: HashMap<u64, u32> = HashMap::new();
            let space = [8u64, 64, 1000, u64::MAX][round];
            for step in 0..20_000u32 {
                let key = match rng.gen_range(0..10) {
                    0 => 0,
                    // Keys that share a home slot (same high bits after the multiply are
                    // likely among small multiples).
                    1 => rng.gen_range(0..8) << 60,
                    _ => rng.gen_range(0..space.max(1)),
                };
                let k = SequenceHash(key);
                match rng.gen_range(0..6) {
                    0 | 1 => assert_eq!(ours.insert(k, step), want.insert(key, step)),
                    2 => assert_eq!(ours.remove(&k), want.remove(&key)),
                    5 if step % 2 == 0 => {
                        // Bump, and drop the entry at an odd value.
                        let got = ours.update(&k, |v| {
                            *v += 1;
                            (*v, *v % 2 == 1)
                        });
                        let expected = want.get_mut(&key).map(|v| {
                            *v += 1;
                            *v
                        });
                        if expected.is_some_and(|v| v % 2 == 1) {
                            want.remove(&key);
                        }
                        assert_eq!(got, expected);
                    }
                    3 => {
                        let (v, inserted) = ours.get_or_insert_default(k);
                        *v += 1;
                        let w = want.entry(key);
                        assert_eq!(
                            inserted,
                            matches!(w, std::collections::hash_map::Entry::Vacant(_))
                        );
                        *w.or_default() += 1;
                    }
                    4 if step % 500 == 0 => {
                        ours.retain(|k, v| (k.0 ^ u64::from(*v)) % 3 != 0);
                        want.retain(|k, v| (k ^ u64::from(*v)) % 3 != 0);
                    }
                    _ => assert_eq!(ours.get(&k), want.get(&key)),
                }
                assert_eq!(ours.len(), want.len());
            }
            for (k, v) in &want {
                assert_eq!(ours.get(&SequenceHash(*k)), Some(v));
            }
            let mut seen: Vec<(u64, u32)> = ours.iter().map(|(k, v)| (k.0, *v)).collect();
            let mut expected: Vec<(u64, u32)> = want.iter().map(|(k, v)| (*k, *v)).collect();
            seen.sort_unstable();
            expected.sort_unstable();
            assert_eq!(seen, expected);
            ours.clear();
            assert!(ours.is_empty());
            assert_eq!(ours.get(&SequenceHash(1)), None);
        }
    }

    /// A reserved map takes that many entries without growing, keeps what it held when
    /// reserved, and never shrinks; its contents agree with an unreserved map's.
    #[test]
    fn a_reserved_map_does_not_grow_before_it_is_full() {
        let mut plain: BlockMap<u32> = BlockMap::new();
        let mut reserved: BlockMap<u32> = BlockMap::new();
        for k in 1..=100u64 {
            plain.insert(SequenceHash(k), k as u32);
            reserved.insert(SequenceHash(k), k as u32);
        }
        reserved.reserve(5_000);
        let slots = reserved.slots.len();
        assert!(slots * MAX_LOAD.0 >= 5_000 * MAX_LOAD.1, "{slots} slots");
        for k in 101..=5_000u64 {
            plain.insert(SequenceHash(k * 7919), k as u32);
            reserved.insert(SequenceHash(k * 7919), k as u32);
            assert_eq!(reserved.slots.len(), slots, "grew at {k} entries");
        }
        reserved.reserve(10);
        assert_eq!(
            reserved.slots.len(),
            slots,
            "a smaller reservation shrinks nothing"
        );
        // Past what the slots hold, it grows as before.
        let mut k = 5_001u64;
        while reserved.slots.len() == slots {
            plain.insert(SequenceHash(k * 7919), 1);
            reserved.insert(SequenceHash(k * 7919), 1);
            k += 1;
        }
        assert_eq!(reserved.len() * MAX_LOAD.1, slots * MAX_LOAD.0 + MAX_LOAD.1);
        let mut a: Vec<(u64, u32)> = plain.iter().map(|(k, v)| (k.0, *v)).collect();
        let mut b: Vec<(u64, u32)> = reserved.iter().map(|(k, v)| (k.0, *v)).collect();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
        for k in 1..=100u64 {
            assert_eq!(reserved.get(&SequenceHash(k)), Some(&(k as u32)));
        }
    }

    /// Reserving nothing, or a handful, leaves a map that works as a new one does (no table
    /// smaller than the first one it would make).
    #[test]
    fn a_small_reservation_leaves_a_working_map() {
        for entries in [0, 1, 2, 3, 9] {
            let mut map: BlockMap<u32> = BlockMap::new();
            map.reserve(entries);
            assert!(
                map.slots.is_empty() || map.slots.len() >= MIN_SLOTS,
                "{entries}"
            );
            for k in 1..=40u64 {
                map.insert(SequenceHash(k.wrapping_mul(0x9E37_79B9)), k as u32);
            }
            for k in 1..=40u64 {
                assert_eq!(
                    map.get(&SequenceHash(k.wrapping_mul(0x9E37_79B9))),
                    Some(&(k as u32))
                );
            }
            assert_eq!(map.len(), 40);
        }
    }
}
