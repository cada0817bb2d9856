//! The paged KV block pool of one worker: ref-counted active blocks, an LRU of inactive cached
//! blocks (on a logical clock), prefix lookup, and the KV events it emits.
//!
//! A request holds a list of `BlockRef`s covering the tokens it has scheduled. Full blocks are
//! shared by sequence hash (that is the prefix cache); the block being filled is private
//! (`BlockRef::Partial`) until its last token is scheduled, when it is promoted to a full block
//! (or collapses onto an identical block another request already cached).
//!
//! Blocks are named inside the pool by dense `BlockId`s: a request's hashes are interned once
//! (`KvPool::intern`) when it arrives, and the pool's per-block state is a vector indexed by
//! id, so walking a request's blocks reads neighbouring entries instead of probing a hash table
//! at random for each. An id lives while the block is cached or a request's id list holds it
//! (`KvPool::forget` drops a request's hold), so the table stays as small as the cache plus
//! the requests on the worker. Events carry sequence hashes, as on the wire.

use std::collections::VecDeque;

use crate::kv::block_ids::{BlockId, BlockIds};
use crate::kv::block_map::WARM_CHUNK;
use crate::kv::event::{KvEventData, StoredBlock};
use crate::tokens::{HashKeyMap, LocalBlockHash, SequenceHash};

/// One block held by a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockRef {
    /// A full block in the prefix cache, shared by every request whose sequence contains it.
    Full(BlockId),
    /// A block still being filled (or any block when prefix caching is off): private.
    Partial,
}

/// Not enough free or evictable blocks for an allocation; the scheduler must preempt or wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("KV cache exhausted: {needed} new blocks needed, {available} free or evictable")]
pub(crate) struct CapacityExhausted {
    /// Blocks the allocation needed beyond those it could reuse.
    pub(crate) needed: usize,
    /// Blocks that were free or evictable.
    pub(crate) available: usize,
}

/// What a prefix lookup found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Leading blocks present in the cache (active or inactive).
    pub blocks: usize,
    /// Of those, the leading blocks held by running requests (they cost no new capacity).
    pub(crate) active_blocks: usize,
}

/// Stale LRU entries allowed beyond as many as the live ones before the LRU is compacted.
const LRU_SLACK: usize = 64;

/// The `stamp` of a block that is not cached.
const UNCACHED: u64 = u64::MAX;

/// The pool's state of one interned block.
#[derive(Clone, Debug)]
struct Block {
    /// LRU position while cached and inactive; [`UNCACHED`] when the block is not in the cache.
    stamp: u64,
    /// Requests holding this block; 0 means inactive (in the LRU, evictable) when cached.
    refs: u32,
    /// Id lists ([`KvPool::intern`]) holding the id: it must stay while any does.
    holds: u32,
}

impl Default for Block {
    fn default() -> Self {
        Block {
            stamp: UNCACHED,
            refs: 0,
            holds: 0,
        }
    }
}

impl Block {
    fn is_cached(&self) -> bool {
        self.stamp != UNCACHED
    }
}

/// An inactive block in the LRU: its stamp, id and hash (the hash lets an eviction warm the
/// block's index slot without reading its state first).
#[derive(Clone, Copy, Debug)]
struct LruEntry {
    stamp: u64,
    id: BlockId,
    hash: SequenceHash,
}

/// The block pool of one worker.
#[derive(Clone, Debug)]
pub struct KvPool {
    /// Total blocks (`num_gpu_blocks`).
    capacity: usize,
    /// Whether full blocks are shared by hash; when off every block is private and no events flow.
    prefix_caching: bool,
    /// Every block that is cached (active or inactive) or named by a request's id list.
    blocks: BlockIds<Block>,
    /// Full blocks in the cache, active or inactive.
    num_cached: usize,
    /// Inactive blocks in release order, kept lazily: an entry is live while its block is cached,
    /// inactive and still carries the entry's stamp; reactivated or re-stamped blocks leave
    /// stale entries behind, skipped on eviction and dropped when they pile up. The front is the
    /// least recently released block. (O(1) per operation on the replay's hot path.) Stamps
    /// are never reused, so an entry whose id was freed and handed out again stays stale.
    lru: VecDeque<LruEntry>,
    /// Cached blocks nobody holds (the live entries of `lru`).
    num_inactive: usize,
    /// Logical clock for LRU stamps: bumped on every release, never a wall clock.
    clock: u64,
    /// Cached blocks with `refs > 0`.
    num_active_full: usize,
    /// Private blocks held by requests.
    num_partial: usize,
    /// Events not yet drained by the worker.
    events: Vec<KvEventData>,
    /// Whether events are recorded at all: off where nobody reads them, so the hot paths skip
    /// building them.
    emits_events: bool,
    /// Evicted blocks not yet taken by the G2 tier; None when nobody takes them (no G2).
    evicted: Option<Vec<SequenceHash>>,
}

impl KvPool {
    /// An empty pool of `capacity` blocks.
    pub(crate) fn new(capacity: usize, prefix_caching: bool) -> KvPool {
        KvPool {
            capacity,
            prefix_caching,
            blocks: BlockIds::new(),
            num_cached: 0,
            lru: VecDeque::new(),
            num_inactive: 0,
            clock: 0,
            num_active_full: 0,
            num_partial: 0,
            events: Vec::new(),
            emits_events: true,
            evicted: None,
        }
    }

    /// Makes room for `blocks` blocks (at most the pool's capacity) in the per-block state, its
    /// hash index and the LRU, so that none of them grows (copying or re-placing everything,
    /// and touching fresh memory twice) while they fill: a replay calls it with its share of
    /// the trace's blocks.
    pub(crate) fn reserve(&mut self, blocks: usize) {
        if !self.prefix_caching {
            return;
        }
        let blocks = blocks.min(self.capacity);
        self.blocks.reserve(blocks);
        // Stale entries take the LRU to up to twice the inactive blocks before it is compacted.
        let entries = blocks.saturating_mul(2).saturating_add(LRU_SLACK);
        self.lru.reserve(entries.saturating_sub(self.lru.len()));
    }

    /// Records KV events (the default) or, where nobody reads them, not (pending ones are
    /// dropped).
    pub(crate) fn set_emit_events(&mut self, on: bool) {
        self.emits_events = on;
        if !on {
            self.events.clear();
        }
    }

    /// True when events are recorded.
    #[cfg(test)]
    pub(crate) fn emits_events(&self) -> bool {
        self.emits_events
    }

    /// Records `event` if events are on.
    fn emit(&mut self, event: KvEventData) {
        if self.emits_events {
            self.events.push(event);
        }
    }

    /// Keeps a list of evicted blocks for [`KvPool::take_evicted`] (the G2 tier offloads them).
    pub(crate) fn track_evictions(&mut self) {
        self.evicted.get_or_insert_with(Vec::new);
    }

    /// Blocks evicted since the last call, in eviction order (empty unless tracked).
    pub(crate) fn take_evicted(&mut self) -> Vec<SequenceHash> {
        self.evicted
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Appends the ids of `hashes` to `ids`, holding each until [`KvPool::forget`]: a request
    /// interns its blocks once and names them by id from then on. Without prefix caching no
    /// block is shared and nothing is appended.
    pub(crate) fn intern(&mut self, hashes: &[SequenceHash], ids: &mut Vec<BlockId>) {
        if !self.prefix_caching {
            return;
        }
        ids.reserve(hashes.len());
        for chunk in hashes.chunks(WARM_CHUNK) {
            self.blocks.warm(chunk.iter().copied());
            for &h in chunk {
                let (id, _) = self.blocks.intern(h);
                self.blocks.get_mut(id).holds += 1;
                ids.push(id);
            }
        }
    }

    /// Drops the holds [`KvPool::intern`] took on `ids`; ids neither held nor cached die.
    pub(crate) fn forget(&mut self, ids: &[BlockId]) {
        for &id in ids {
            let b = self.blocks.get_mut(id);
            b.holds -= 1;
            if b.holds == 0 && !b.is_cached() {
                self.blocks.remove(id);
            }
        }
    }

    /// The cached block `id`, if it is in the cache.
    fn cached(&self, id: BlockId) -> Option<&Block> {
        Some(self.blocks.get(id)).filter(|b| b.is_cached())
    }

    /// Takes `id` out of the cache (its entry dies unless an id list holds it); its hash.
    fn uncache(&mut self, id: BlockId) -> SequenceHash {
        let hash = self.blocks.hash(id);
        let b = self.blocks.get_mut(id);
        b.stamp = UNCACHED;
        b.refs = 0;
        if b.holds == 0 {
            self.blocks.remove(id);
        }
        self.num_cached -= 1;
        hash
    }

    /// Marks inactive blocks among `hashes` as just used, the first one last (so a prefix is
    /// evicted after its suffix). Active and unknown blocks are left alone.
    pub(crate) fn touch(&mut self, hashes: &[SequenceHash]) {
        for h in hashes.iter().rev() {
            let Some(id) = self.blocks.id(*h) else {
                continue;
            };
            let b = self.blocks.get_mut(id);
            if b.is_cached() && b.refs == 0 {
                self.clock += 1;
                b.stamp = self.clock;
                self.lru.push_back(LruEntry {
                    stamp: self.clock,
                    id,
                    hash: *h,
                });
            }
        }
        self.compact_lru();
    }

    /// Registers blocks that arrived from another tier as inactive cached blocks, in prefix order
    /// (`parent` precedes `blocks[0]`). Blocks already cached are skipped; no block inserted here
    /// evicts another one inserted by the same call, so at most `free + inactive` blocks go in.
    /// The tail gets the oldest LRU stamp, as on release. Returns the blocks inserted.
    pub(crate) fn insert_inactive(
        &mut self,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        let room = self.num_free_blocks() + self.num_inactive_blocks();
        let new: Vec<StoredBlock> = blocks
            .iter()
            .filter(|b| !self.contains(b.seq_hash))
            .take(room)
            .copied()
            .collect();
        let mut removed = Vec::new();
        let n = new.len() as u64;
        let base = self.clock;
        self.clock += n;
        let mut queued = Vec::with_capacity(new.len());
        for (i, b) in new.iter().enumerate() {
            // The new stamps are above every existing one: eviction takes older blocks first.
            self.make_room(&mut removed);
            let stamp = base + n - i as u64;
            let (id, _) = self.blocks.intern(b.seq_hash);
            let block = self.blocks.get_mut(id);
            block.stamp = stamp;
            block.refs = 0;
            self.num_cached += 1;
            self.num_inactive += 1;
            queued.push(LruEntry {
                stamp,
                id,
                hash: b.seq_hash,
            });
        }
        // Queued in stamp order (the tail first) once all are in, so none of them was evictable
        // while the call made room.
        self.lru.extend(queued.into_iter().rev());
        if !removed.is_empty() {
            self.emit(KvEventData::Removed {
                seq_hashes: removed,
            });
        }
        // One Stored event per contiguous run of inserted blocks.
        let mut run_parent = parent;
        let mut run: Vec<StoredBlock> = Vec::new();
        let inserted: HashKeyMap<SequenceHash, ()> = new.iter().map(|b| (b.seq_hash, ())).collect();
        for b in blocks {
            if inserted.contains_key(&b.seq_hash) {
                run.push(*b);
            } else if !run.is_empty() {
                self.emit(KvEventData::Stored {
                    parent: run_parent,
                    blocks: std::mem::take(&mut run),
                });
            }
            if run.is_empty() {
                run_parent = Some(b.seq_hash);
            }
        }
        if !run.is_empty() {
            self.emit(KvEventData::Stored {
                parent: run_parent,
                blocks: run,
            });
        }
        new.len()
    }

    /// Total blocks.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks held by running requests (shared full blocks count once).
    pub(crate) fn num_active_blocks(&self) -> usize {
        self.num_active_full + self.num_partial
    }

    /// Cached blocks nobody holds: reusable on a prefix hit, evictable otherwise.
    pub(crate) fn num_inactive_blocks(&self) -> usize {
        self.num_inactive
    }

    /// Blocks neither active nor cached.
    pub(crate) fn num_free_blocks(&self) -> usize {
        self.capacity - self.num_active_blocks() - self.num_inactive_blocks()
    }

    /// Whether the pool shares full blocks by hash.
    #[cfg(test)]
    pub(crate) fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// True when `hash` is cached (active or inactive).
    pub(crate) fn contains(&self, hash: SequenceHash) -> bool {
        self.blocks
            .id(hash)
            .is_some_and(|id| self.cached(id).is_some())
    }

    /// The longest run of leading blocks of `ids` (from [`KvPool::intern`]) present in the
    /// cache.
    pub(crate) fn lookup_prefix(&self, ids: &[BlockId]) -> PrefixMatch {
        self.leading_run(ids.iter().map(|&id| self.cached(id)))
    }

    /// `KvPool::lookup_prefix` for a sequence given by its hashes (not interned here).
    pub fn lookup_prefix_hashes(&self, hashes: &[SequenceHash]) -> PrefixMatch {
        self.leading_run(
            hashes
                .iter()
                .map(|&h| self.blocks.id(h).and_then(|id| self.cached(id))),
        )
    }

    /// The leading cached blocks of a sequence (each `None` once a block is not cached), and
    /// how many of those are held by running requests from the first on.
    fn leading_run<'a>(&self, blocks: impl Iterator<Item = Option<&'a Block>>) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        if !self.prefix_caching {
            return m;
        }
        let mut all_active = true;
        for b in blocks.map_while(|b| b) {
            m.blocks += 1;
            all_active &= b.refs > 0;
            if all_active {
                m.active_blocks += 1;
            }
        }
        m
    }

    /// Extends `held` so that it covers `num_tokens` tokens of a sequence whose full blocks are
    /// `seq` (interned ids, and local hashes for events). Blocks below
    /// `num_tokens / block_size` are full (shared by hash); a trailing partial block is private.
    ///
    /// All or nothing: on [`CapacityExhausted`] nothing changed.
    pub(crate) fn allocate(
        &mut self,
        held: &mut Vec<BlockRef>,
        seq: SequenceBlocks<'_>,
        num_tokens: usize,
        block_size: usize,
    ) -> Result<(), CapacityExhausted> {
        let target = num_tokens.div_ceil(block_size);
        let full_target = if self.prefix_caching {
            (num_tokens / block_size).min(seq.ids.len())
        } else {
            0
        };
        // Only the last held block can be partial: every block before it is full already.
        let first = held.len().saturating_sub(1);
        // (The length test first: it spares a read of `held`'s buffer, often out of cache, on
        // the common call that needs nothing.)
        let last_needs_promotion = first < full_target && held.last() == Some(&BlockRef::Partial);
        if target <= held.len() && !last_needs_promotion {
            return Ok(());
        }

        // Count what this allocation costs before changing anything.
        let mut new_blocks = 0usize;
        let mut freed = 0usize;
        let mut reactivated = 0usize;
        for i in first..target {
            let existing = held.get(i).copied();
            let wants_full = i < full_target;
            match (existing, wants_full) {
                (Some(BlockRef::Full(_)), _) | (Some(BlockRef::Partial), false) => {}
                (Some(BlockRef::Partial), true) => {
                    if let Some(b) = self.cached(seq.ids[i]) {
                        freed += 1;
                        reactivated += usize::from(b.refs == 0);
                    }
                }
                (None, true) => match self.cached(seq.ids[i]) {
                    Some(b) => reactivated += usize::from(b.refs == 0),
                    None => new_blocks += 1,
                },
                (None, false) => new_blocks += 1,
            }
        }
        let available = self.num_free_blocks() + freed + (self.num_inactive - reactivated);
        if new_blocks > available {
            return Err(CapacityExhausted {
                needed: new_blocks,
                available,
            });
        }

        // Sized for the worst case up front: these grow one block at a time on the hot path.
        let events = usize::from(self.emits_events);
        let mut stored: Vec<StoredBlock> =
            Vec::with_capacity(events * full_target.saturating_sub(first));
        let mut stored_parent: Option<SequenceHash> = None;
        let evictions = new_blocks.saturating_sub(self.num_free_blocks());
        let mut removed: Vec<SequenceHash> = Vec::with_capacity(events * evictions);
        // The blocks at the front of the LRU are about to be evicted: their state and index
        // slots are prefetched, so those cache misses overlap.
        for chunk_start in (0..evictions).step_by(WARM_CHUNK) {
            let n = WARM_CHUNK.min(evictions - chunk_start);
            let victims = self.lru.range(chunk_start..).take(n);
            self.blocks.warm_ids(victims.clone().map(|e| e.id));
            self.blocks.warm(victims.map(|e| e.hash));
        }
        held.reserve(target.saturating_sub(held.len()));
        for i in first..target {
            let existing = held.get(i).copied();
            if i >= full_target {
                if existing.is_none() {
                    self.make_room(&mut removed);
                    self.num_partial += 1;
                    held.push(BlockRef::Partial);
                }
                continue;
            }
            if let Some(BlockRef::Full(_)) = existing {
                continue;
            }
            let id = seq.ids[i];
            let promote = existing == Some(BlockRef::Partial);
            if promote {
                // Promote: the partial block's slot becomes the full block, or is released when
                // the same block is already cached.
                self.num_partial -= 1;
            }
            if !self.acquire_cached(id) {
                if !promote {
                    self.make_room(&mut removed);
                }
                self.insert_new(i, &seq, &mut stored, &mut stored_parent);
            }
            if promote {
                held[i] = BlockRef::Full(id);
            } else {
                held.push(BlockRef::Full(id));
            }
        }
        if !removed.is_empty() {
            self.emit(KvEventData::Removed {
                seq_hashes: removed,
            });
        }
        if !stored.is_empty() {
            self.emit(KvEventData::Stored {
                parent: stored_parent,
                blocks: stored,
            });
        }
        Ok(())
    }

    /// Releases a request's blocks, tail first, so that its suffix is evicted before the prefix
    /// it may share with others.
    pub(crate) fn release(&mut self, held: &mut Vec<BlockRef>) {
        while let Some(b) = held.pop() {
            match b {
                BlockRef::Partial => self.num_partial -= 1,
                BlockRef::Full(id) => {
                    let hash = self.blocks.hash(id);
                    let entry = self.blocks.get_mut(id);
                    debug_assert!(entry.is_cached(), "held full block is cached");
                    entry.refs -= 1;
                    if entry.refs == 0 {
                        self.clock += 1;
                        entry.stamp = self.clock;
                        self.lru.push_back(LruEntry {
                            stamp: self.clock,
                            id,
                            hash,
                        });
                        self.num_inactive += 1;
                        self.num_active_full -= 1;
                    }
                }
            }
        }
        self.compact_lru();
    }

    /// Drops every inactive block (a `Removed` event for them).
    #[cfg(test)]
    pub(crate) fn clear_inactive(&mut self) {
        let ids = self.lru_order();
        let hashes: Vec<SequenceHash> = ids.iter().map(|&id| self.uncache(id)).collect();
        if let Some(evicted) = &mut self.evicted {
            evicted.extend_from_slice(&hashes);
        }
        self.lru.clear();
        self.num_inactive = 0;
        if !hashes.is_empty() {
            self.emit(KvEventData::Removed { seq_hashes: hashes });
        }
    }

    /// Empties the prefix cache when no request holds a block (vLLM's `reset_prefix_cache`),
    /// emitting `Cleared`. Returns false, changing nothing, while blocks are in use.
    pub(crate) fn reset(&mut self) -> bool {
        if self.num_active_blocks() > 0 {
            return false;
        }
        // Nothing is active: every cached block is inactive, live in the LRU.
        for id in self.lru_order() {
            self.uncache(id);
        }
        self.lru.clear();
        self.num_inactive = 0;
        self.emit(KvEventData::Cleared);
        true
    }

    /// Takes the events emitted since the last call.
    pub(crate) fn drain_events(&mut self) -> Vec<KvEventData> {
        std::mem::take(&mut self.events)
    }

    /// True when events are waiting to be drained.
    #[cfg(test)]
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Takes one more reference on `id` if it is cached; false (changing nothing) if not.
    fn acquire_cached(&mut self, id: BlockId) -> bool {
        let entry = self.blocks.get_mut(id);
        if !entry.is_cached() {
            return false;
        }
        if entry.refs == 0 {
            // Its LRU entry goes stale.
            self.num_inactive -= 1;
            self.num_active_full += 1;
        }
        entry.refs += 1;
        true
    }

    /// Caches block `index` of `seq` as a new active block and records it for a Stored event.
    fn insert_new(
        &mut self,
        index: usize,
        seq: &SequenceBlocks<'_>,
        stored: &mut Vec<StoredBlock>,
        stored_parent: &mut Option<SequenceHash>,
    ) {
        let id = seq.ids[index];
        let entry = self.blocks.get_mut(id);
        entry.stamp = 0;
        entry.refs = 1;
        self.num_cached += 1;
        self.num_active_full += 1;
        if !self.emits_events {
            return;
        }
        let hash = self.blocks.hash(id);
        let parent = index.checked_sub(1).map(|p| self.blocks.hash(seq.ids[p]));
        // One Stored event per contiguous run; a gap starts a new event.
        if stored.last().map(|b| Some(b.seq_hash)) != Some(parent) {
            if !stored.is_empty() {
                self.emit(KvEventData::Stored {
                    parent: *stored_parent,
                    blocks: std::mem::take(stored),
                });
            }
            *stored_parent = parent;
        }
        stored.push(StoredBlock {
            seq_hash: hash,
            local_hash: seq.locals[index],
        });
    }

    /// Frees one slot by evicting the least recently released inactive block if the pool is full.
    fn make_room(&mut self, removed: &mut Vec<SequenceHash>) {
        if self.num_free_blocks() > 0 {
            return;
        }
        while let Some(victim) = self.lru.pop_front() {
            if !self.is_live(victim) {
                continue;
            }
            let hash = self.uncache(victim.id);
            self.num_inactive -= 1;
            if self.emits_events {
                removed.push(hash);
            }
            if let Some(evicted) = &mut self.evicted {
                evicted.push(hash);
            }
            return;
        }
    }

    /// True when an LRU entry still stands for an inactive block.
    fn is_live(&self, entry: LruEntry) -> bool {
        let b = self.blocks.get(entry.id);
        b.is_cached() && b.refs == 0 && b.stamp == entry.stamp
    }

    /// Drops stale LRU entries once they outnumber the live ones (amortised O(1)).
    fn compact_lru(&mut self) {
        if self.lru.len() > 2 * self.num_inactive + LRU_SLACK {
            let mut lru = std::mem::take(&mut self.lru);
            lru.retain(|&e| self.is_live(e));
            self.lru = lru;
        }
    }

    /// Inactive blocks, least recently released first.
    fn lru_order(&self) -> Vec<BlockId> {
        self.lru
            .iter()
            .filter(|&&e| self.is_live(e))
            .map(|e| e.id)
            .collect()
    }

    /// Checks every internal count against the data it summarises. Panics on a violation.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        self.blocks.assert_invariants();
        let cached = self.blocks.iter().filter(|(_, _, b)| b.is_cached()).count();
        assert_eq!(cached, self.num_cached, "cached block count");
        assert!(
            self.blocks
                .iter()
                .all(|(_, _, b)| b.is_cached() || b.holds > 0),
            "an id lives while cached or held"
        );
        let active = self
            .blocks
            .iter()
            .filter(|(_, _, b)| b.is_cached() && b.refs > 0)
            .count();
        assert_eq!(active, self.num_active_full, "active full block count");
        let inactive = cached - active;
        assert_eq!(inactive, self.num_inactive, "inactive block count");
        let live = self.lru_order();
        assert_eq!(
            live.len(),
            inactive,
            "every inactive block is live in the LRU once"
        );
        let mut seen = std::collections::HashSet::new();
        assert!(
            live.iter().all(|h| seen.insert(*h)),
            "no block is live twice"
        );
        assert!(
            self.lru
                .iter()
                .zip(self.lru.iter().skip(1))
                .all(|(a, b)| a.stamp < b.stamp),
            "LRU entries are in stamp order"
        );
        assert!(
            self.lru.back().is_none_or(|e| e.stamp <= self.clock),
            "stamps come from the logical clock"
        );
        assert!(
            self.num_active_blocks() + self.num_inactive_blocks() <= self.capacity,
            "pool over capacity: {} active + {} inactive > {}",
            self.num_active_blocks(),
            self.num_inactive_blocks(),
            self.capacity
        );
        if !self.prefix_caching {
            assert!(
                self.blocks.is_empty(),
                "no shared blocks without prefix caching"
            );
        }
    }

    /// Reference counts, for tests that hold requests' block lists.
    #[cfg(test)]
    pub(crate) fn refs(&self, hash: SequenceHash) -> u32 {
        self.blocks
            .id(hash)
            .and_then(|id| self.cached(id))
            .map_or(0, |b| b.refs)
    }

    /// Id lists holding the id of `hash` (0 when it has none), for tests that keep them.
    #[cfg(test)]
    pub(crate) fn holds(&self, hash: SequenceHash) -> u32 {
        self.blocks
            .id(hash)
            .map_or(0, |id| self.blocks.get(id).holds)
    }

    /// Holds taken by [`KvPool::intern`] and not yet dropped, over every id (tests).
    #[cfg(test)]
    pub(crate) fn num_holds(&self) -> u64 {
        self.blocks.iter().map(|(_, _, b)| u64::from(b.holds)).sum()
    }

    /// Blocks with an id (cached or held by an id list): what the pool's tables hold.
    #[cfg(test)]
    pub(crate) fn num_ids(&self) -> usize {
        self.blocks.len()
    }
}

/// The blocks of a sequence, as the pool needs them to allocate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SequenceBlocks<'a> {
    /// Id of every full block, from [`KvPool::intern`].
    pub(crate) ids: &'a [BlockId],
    /// Local hash of every full block (same length, for events).
    pub(crate) locals: &'a [LocalBlockHash],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::BlockHashes;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const BS: usize = 4;

    /// A sequence's hashes and the ids a pool gave them.
    struct Seq {
        sequence: Vec<SequenceHash>,
        local: Vec<LocalBlockHash>,
        ids: Vec<BlockId>,
    }

    impl Seq {
        fn blocks(&self) -> SequenceBlocks<'_> {
            SequenceBlocks {
                ids: &self.ids,
                locals: &self.local,
            }
        }

        fn len(&self) -> usize {
            self.sequence.len()
        }
    }

    /// Hashes `tokens` and interns them in `pool`.
    fn seq(pool: &mut KvPool, tokens: &[u32]) -> Seq {
        let h = BlockHashes::of(tokens, BS);
        let mut ids = Vec::new();
        pool.intern(&h.sequence, &mut ids);
        Seq {
            sequence: h.sequence,
            local: h.local,
            ids,
        }
    }

    #[test]
    fn shared_prefix_is_allocated_once_and_released_tail_first() {
        let mut pool = KvPool::new(10, true);
        let a = seq(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        let b = seq(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]);
        let (mut ha, mut hb) = (Vec::new(), Vec::new());
        pool.allocate(&mut ha, a.blocks(), 10, BS).unwrap();
        assert_eq!(ha.len(), 3);
        assert_eq!(pool.num_active_blocks(), 3);
        let ev = pool.drain_events();
        assert_eq!(ev.len(), 1);
        assert!(
            matches!(&ev[0], KvEventData::Stored { parent: None, blocks } if blocks.len() == 2)
        );

        assert_eq!(
            pool.lookup_prefix(&b.ids),
            PrefixMatch {
                blocks: 2,
                active_blocks: 2
            }
        );
        pool.allocate(&mut hb, b.blocks(), 12, BS).unwrap();
        assert_eq!(
            pool.num_active_blocks(),
            4,
            "two shared + one partial + one new"
        );
        let ev = pool.drain_events();
        assert_eq!(
            ev,
            vec![KvEventData::Stored {
                parent: Some(b.sequence[1]),
                blocks: vec![StoredBlock {
                    seq_hash: b.sequence[2],
                    local_hash: b.local[2]
                }]
            }]
        );
        assert_eq!(pool.refs(a.sequence[0]), 2);
        pool.assert_invariants();

        pool.release(&mut ha);
        pool.release(&mut hb);
        assert_eq!(pool.num_active_blocks(), 0);
        assert_eq!(pool.num_inactive_blocks(), 3);
        pool.assert_invariants();
        // b released last: its tail is the oldest inactive block, its first block the newest.
        let order = pool.lru_order();
        assert_eq!(order, vec![b.ids[2], b.ids[1], b.ids[0]]);
        assert_eq!(
            pool.lookup_prefix(&b.ids),
            PrefixMatch {
                blocks: 3,
                active_blocks: 0
            }
        );
    }

    #[test]
    fn eviction_takes_the_least_recently_released_block() {
        let mut pool = KvPool::new(2, true);
        let a = seq(&mut pool, &[1, 1, 1, 1, 2, 2, 2, 2]);
        let mut ha = Vec::new();
        pool.allocate(&mut ha, a.blocks(), 8, BS).unwrap();
        pool.release(&mut ha);
        pool.drain_events();
        let c = seq(&mut pool, &[9, 9, 9, 9]);
        let mut hc = Vec::new();
        pool.allocate(&mut hc, c.blocks(), 4, BS).unwrap();
        // The tail block of `a` (released first) is evicted, its prefix stays.
        assert_eq!(pool.lookup_prefix(&a.ids).blocks, 1);
        let ev = pool.drain_events();
        assert_eq!(
            ev[0],
            KvEventData::Removed {
                seq_hashes: vec![a.sequence[1]]
            }
        );
        pool.assert_invariants();
    }

    #[test]
    fn exhausted_allocation_changes_nothing() {
        let mut pool = KvPool::new(2, true);
        let a = seq(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let mut ha = Vec::new();
        let err = pool.allocate(&mut ha, a.blocks(), 9, BS).unwrap_err();
        assert_eq!(
            err,
            CapacityExhausted {
                needed: 3,
                available: 2
            }
        );
        assert!(ha.is_empty());
        assert_eq!(pool.num_active_blocks(), 0);
        assert!(!pool.has_events());
        pool.assert_invariants();
    }

    #[test]
    fn partial_block_promotes_or_collapses_onto_a_cached_twin() {
        let mut pool = KvPool::new(8, true);
        let full = seq(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut h1 = Vec::new();
        let mut h2 = Vec::new();
        // Both requests schedule 6 tokens: one full block shared, one private partial each.
        pool.allocate(&mut h1, full.blocks(), 6, BS).unwrap();
        pool.allocate(&mut h2, full.blocks(), 6, BS).unwrap();
        assert_eq!(pool.num_active_blocks(), 3);
        pool.allocate(&mut h1, full.blocks(), 8, BS).unwrap();
        assert_eq!(h1[1], BlockRef::Full(full.ids[1]));
        pool.allocate(&mut h2, full.blocks(), 8, BS).unwrap();
        assert_eq!(
            pool.num_active_blocks(),
            2,
            "the second partial collapsed onto the first"
        );
        assert_eq!(pool.refs(full.sequence[1]), 2);
        pool.assert_invariants();
    }

    #[test]
    fn without_prefix_caching_every_block_is_private() {
        let mut pool = KvPool::new(8, false);
        let a = seq(&mut pool, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let (mut h1, mut h2) = (Vec::new(), Vec::new());
        pool.allocate(&mut h1, a.blocks(), 8, BS).unwrap();
        pool.allocate(&mut h2, a.blocks(), 8, BS).unwrap();
        assert_eq!(pool.num_active_blocks(), 4);
        assert_eq!(pool.lookup_prefix(&a.ids).blocks, 0);
        pool.release(&mut h1);
        assert_eq!(pool.num_free_blocks(), 6);
        assert!(!pool.has_events());
        pool.assert_invariants();
    }

    #[test]
    fn reset_empties_an_idle_cache_with_a_cleared_event() {
        let mut pool = KvPool::new(4, true);
        let a = seq(&mut pool, &[1, 2, 3, 4]);
        let mut held = Vec::new();
        pool.allocate(&mut held, a.blocks(), 4, BS).unwrap();
        assert!(!pool.reset(), "a held block blocks the reset");
        pool.release(&mut held);
        pool.drain_events();
        assert!(pool.reset());
        assert_eq!(pool.drain_events(), vec![KvEventData::Cleared]);
        assert_eq!(pool.lookup_prefix(&a.ids).blocks, 0);
        pool.assert_invariants();
    }

    #[test]
    fn invariants_hold_over_many_random_operations() {
        random_operations(None);
    }

    /// A pool with room made up front (for fewer blocks than it holds, or for more) behaves as
    /// one without: the same events after every step of the same operations.
    #[test]
    fn a_reserved_pool_behaves_as_an_unreserved_one() {
        let plain = random_operations(None);
        assert!(plain.len() > 300, "{} events", plain.len());
        assert_eq!(random_operations(Some(16)), plain);
        assert_eq!(random_operations(Some(1_000)), plain);
    }

    /// Seeded random allocations, growths, releases, clears and resets on a pool of 40 blocks
    /// (with room made for `reserve` blocks first), checking every invariant after each step;
    /// the events of every step, in order.
    fn random_operations(reserve: Option<usize>) -> Vec<(usize, KvEventData)> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut pool = KvPool::new(40, true);
        if let Some(blocks) = reserve {
            pool.reserve(blocks);
        }
        let mut events = Vec::new();
        // A few prompt families sharing prefixes.
        let families: Vec<Vec<u32>> = (0..4)
            .map(|f| (0..64).map(|i| f * 1000 + i / 3).collect())
            .collect();
        let mut live: Vec<(Seq, Vec<BlockRef>, usize)> = Vec::new();
        for step in 0..5000 {
            match rng.gen_range(0..10) {
                0..=4 => {
                    let f = &families[rng.gen_range(0..families.len())];
                    let mut tokens = f[..rng.gen_range(1..f.len())].to_vec();
                    tokens.extend((0..rng.gen_range(0..12)).map(|_| rng.gen_range(0..5)));
                    let h = seq(&mut pool, &tokens);
                    let n = rng.gen_range(1..=tokens.len());
                    let mut held = Vec::new();
                    let before = (pool.num_active_blocks(), pool.num_inactive_blocks());
                    match pool.allocate(&mut held, h.blocks(), n, BS) {
                        Ok(()) => {
                            assert_eq!(held.len(), n.div_ceil(BS));
                            live.push((h, held, n));
                        }
                        Err(_) => {
                            assert!(held.is_empty());
                            pool.forget(&h.ids);
                            assert_eq!(
                                before,
                                (pool.num_active_blocks(), pool.num_inactive_blocks())
                            );
                        }
                    }
                }
                5..=6 if !live.is_empty() => {
                    // Grow a live sequence (chunked prefill / decode).
                    let i = rng.gen_range(0..live.len());
                    let (h, held, n) = &mut live[i];
                    let max = h.len() * BS;
                    if *n < max {
                        let target = (*n + rng.gen_range(1..=6)).min(max);
                        if pool.allocate(held, h.blocks(), target, BS).is_ok() {
                            *n = target;
                        }
                    }
                }
                7..=8 if !live.is_empty() => {
                    let i = rng.gen_range(0..live.len());
                    let (h, mut held, _) = live.swap_remove(i);
                    pool.release(&mut held);
                    pool.forget(&h.ids);
                }
                9 if step % 97 == 0 => pool.clear_inactive(),
                9 if step % 89 == 0 && live.is_empty() => {
                    assert!(pool.reset());
                    assert_eq!(pool.num_free_blocks(), pool.capacity());
                }
                9 if step % 83 == 0 => {
                    let idle = live.is_empty();
                    assert_eq!(pool.reset(), idle, "reset only when nothing is held");
                }
                _ => {}
            }
            pool.assert_invariants();
            // Every held full block has a positive refcount equal to its holders, and every id
            // list holds its ids.
            let mut refs: HashKeyMap<SequenceHash, u32> = HashKeyMap::default();
            let mut holds: HashKeyMap<SequenceHash, u32> = HashKeyMap::default();
            for (h, held, _) in &live {
                for (i, b) in held.iter().enumerate() {
                    if let BlockRef::Full(id) = b {
                        assert_eq!(*id, h.ids[i], "block {i} is held by its own id");
                        *refs.entry(h.sequence[i]).or_default() += 1;
                    }
                }
                for &hash in &h.sequence {
                    *holds.entry(hash).or_default() += 1;
                }
            }
            for (h, r) in &refs {
                assert_eq!(pool.refs(*h), *r);
            }
            for (h, n) in &holds {
                assert_eq!(pool.holds(*h), *n);
            }
            // The ids are those of cached blocks and of live sequences, no more.
            assert!(pool.num_ids() <= pool.num_cached + holds.len());
            events.extend(pool.drain_events().into_iter().map(|e| (step, e)));
        }
        events
    }
}
