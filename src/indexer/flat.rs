//! The flat indexer: one hash map from sequence hash to the set of workers holding that block
//! (the KV router's original structure, kept because it is the fastest on its workloads).

use std::collections::BTreeMap;

use super::{IndexerStats, KvIndexer, OverlapScores};
use crate::ids::WorkerId;
use crate::kv::event::{KvEvent, KvEventData};
use crate::kv::{BlockMap, WARM_CHUNK};
use crate::tokens::{sequence_hashes, LocalBlockHash, SequenceHash};

/// A set of worker ids: a bitmask for the first 64 workers (no allocation), a sorted list beyond.
/// Sixteen bytes, so the index's map entries stay small (it has one per cached block).
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerSet {
    /// Workers 0..64, one bit each.
    low: u64,
    /// Workers from 64 up, sorted; None while there are none.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps the set at 16 bytes (a Vec alone is 24)"
    )]
    high: Option<Box<Vec<u32>>>,
}

impl WorkerSet {
    /// Adds `w`; true when it was not there.
    pub(crate) fn insert(&mut self, w: u32) -> bool {
        if w < 64 {
            let had = self.low & (1 << w) != 0;
            self.low |= 1 << w;
            return !had;
        }
        let high = self.high.get_or_insert_with(Box::default);
        match high.binary_search(&w) {
            Ok(_) => false,
            Err(i) => {
                high.insert(i, w);
                true
            }
        }
    }

    /// Removes `w`; true when it was there.
    pub(crate) fn remove(&mut self, w: u32) -> bool {
        if w < 64 {
            let had = self.low & (1 << w) != 0;
            self.low &= !(1 << w);
            return had;
        }
        let Some(high) = &mut self.high else {
            return false;
        };
        match high.binary_search(&w) {
            Ok(i) => {
                high.remove(i);
                if high.is_empty() {
                    self.high = None;
                }
                true
            }
            Err(_) => false,
        }
    }

    /// True when `w` is in the set.
    pub(crate) fn contains(&self, w: u32) -> bool {
        if w < 64 {
            self.low & (1 << w) != 0
        } else {
            self.high
                .as_ref()
                .is_some_and(|high| high.binary_search(&w).is_ok())
        }
    }

    /// True when no worker is in the set.
    pub(crate) fn is_empty(&self) -> bool {
        self.low == 0 && self.high.is_none()
    }

    /// Members in increasing order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let mut low = self.low;
        std::iter::from_fn(move || {
            (low != 0).then(|| {
                let w = low.trailing_zeros();
                low &= low - 1;
                w
            })
        })
        .chain(self.high.iter().flat_map(|high| high.iter().copied()))
    }
}

/// Indexer keyed by [`SequenceHash`]: `hash -> workers holding that block`.
///
/// A sequence hash names a block together with its whole prefix, so a worker's contiguous match
/// is the number of leading query hashes whose set contains it; no tree is needed. Lookups
/// given only local hashes chain them into sequence hashes first; the router, which has both,
/// calls [`KvIndexer::find_matches_hashed`] and skips that step. Event semantics are the
/// reference's ([`RadixTree`](super::RadixTree)): a Stored event whose parent the worker does not
/// hold is skipped and counted, unknown removed hashes are counted, Cleared drops the worker.
/// Cleared and worker removal scan the whole map.
#[derive(Clone, Debug, Default)]
pub struct FlatIndex {
    /// Which workers hold each block.
    blocks: BlockMap<WorkerSet>,
    /// Blocks held per worker, indexed by worker id (a vector: updated for every block).
    sizes: Vec<usize>,
    /// What happened to the events applied so far.
    stats: IndexerStats,
}

impl FlatIndex {
    /// An empty index.
    pub fn new() -> FlatIndex {
        FlatIndex::default()
    }

    /// True when `worker` holds the block `seq_hash`.
    pub(crate) fn holds(&self, worker: WorkerId, seq_hash: SequenceHash) -> bool {
        self.blocks
            .get(&seq_hash)
            .is_some_and(|s| s.contains(worker.0))
    }

    /// Per-worker contiguous matches of a query given by its sequence hashes.
    pub(crate) fn match_scores(&self, seq_hashes: &[SequenceHash]) -> BTreeMap<WorkerId, u32> {
        let mut scores = BTreeMap::new();
        let mut active: Vec<u32> = Vec::new();
        let mut depth = 0u32;
        for (i, h) in seq_hashes.iter().enumerate() {
            self.blocks.warm_ahead(seq_hashes, i);
            let Some(set) = self.blocks.get(h) else {
                break;
            };
            if depth == 0 {
                active.extend(set.iter());
            } else {
                active.retain(|&w| {
                    let keep = set.contains(w);
                    if !keep {
                        scores.insert(WorkerId(w), depth);
                    }
                    keep
                });
            }
            if active.is_empty() {
                break;
            }
            depth += 1;
        }
        for w in active {
            scores.insert(WorkerId(w), depth);
        }
        scores
    }

    /// Blocks held per worker, for workers holding any.
    pub(crate) fn tree_sizes(&self) -> BTreeMap<WorkerId, usize> {
        self.sizes
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(w, n)| (WorkerId(w as u32), *n))
            .collect()
    }

    fn add(&mut self, worker: WorkerId, h: SequenceHash) {
        if self.blocks.get_or_insert_default(h).0.insert(worker.0) {
            let w = worker.0 as usize;
            if self.sizes.len() <= w {
                self.sizes.resize(w + 1, 0);
            }
            self.sizes[w] += 1;
        }
    }

    fn remove(&mut self, worker: WorkerId, h: SequenceHash) -> bool {
        // One lookup finds, updates and (when emptied) drops the set.
        let had = self.blocks.update(&h, |set| {
            let had = set.remove(worker.0);
            (had, set.is_empty())
        }) == Some(true);
        if had {
            self.sizes[worker.0 as usize] -= 1;
        }
        had
    }

    fn clear(&mut self, worker: WorkerId) {
        match self.sizes.get_mut(worker.0 as usize) {
            Some(n) if *n > 0 => *n = 0,
            _ => return,
        }
        self.blocks.retain(|_, set| {
            set.remove(worker.0);
            !set.is_empty()
        });
    }

    /// Checks the per-worker sizes against the map (tests).
    pub fn assert_invariants(&self) {
        let mut sizes: BTreeMap<WorkerId, usize> = BTreeMap::new();
        for set in self.blocks.values() {
            assert!(!set.is_empty(), "empty worker sets are dropped");
            for w in set.iter() {
                *sizes.entry(WorkerId(w)).or_insert(0) += 1;
            }
        }
        assert_eq!(sizes, self.tree_sizes(), "tree sizes vs worker sets");
    }
}

impl KvIndexer for FlatIndex {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        self.find_matches_hashed(local_hashes, &sequence_hashes(local_hashes))
    }

    fn find_matches_hashed(
        &self,
        _local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> OverlapScores {
        OverlapScores {
            scores: self.match_scores(seq_hashes),
            tree_sizes: self.tree_sizes(),
        }
    }

    fn match_scores_hashed(
        &self,
        _local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> BTreeMap<WorkerId, u32> {
        self.match_scores(seq_hashes)
    }

    fn apply(&mut self, event: &KvEvent) {
        let w = event.worker;
        match &event.data {
            KvEventData::Stored { parent, blocks } => {
                if parent.is_some_and(|p| !self.holds(w, p)) {
                    self.stats.unknown_parent_events += 1;
                    return;
                }
                for chunk in blocks.chunks(WARM_CHUNK) {
                    self.blocks.warm(chunk.iter().map(|b| b.seq_hash));
                    for b in chunk {
                        self.add(w, b.seq_hash);
                    }
                }
                self.stats.events_applied += 1;
            }
            KvEventData::Removed { seq_hashes } => {
                for chunk in seq_hashes.chunks(WARM_CHUNK) {
                    self.blocks.warm(chunk.iter().copied());
                    for &h in chunk {
                        if !self.remove(w, h) {
                            self.stats.unknown_removed_hashes += 1;
                        }
                    }
                }
                self.stats.events_applied += 1;
            }
            KvEventData::Cleared => {
                self.clear(w);
                self.stats.events_applied += 1;
            }
        }
    }

    fn remove_worker(&mut self, worker: WorkerId) {
        self.clear(worker);
    }

    fn reserve(&mut self, blocks: usize) {
        self.blocks.reserve(blocks);
    }

    fn stats(&self) -> IndexerStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::WorkerSet;

    /// Workers above 63 live in the boxed list, which goes away with its last member; the set
    /// stays 16 bytes (the index holds one per cached block).
    #[test]
    fn worker_set_keeps_high_workers_sorted_and_small() {
        assert_eq!(std::mem::size_of::<WorkerSet>(), 16);
        let mut s = WorkerSet::default();
        for w in [70, 3, 500, 64, 3] {
            s.insert(w);
        }
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![3, 64, 70, 500]);
        assert!(s.contains(64) && !s.contains(65));
        assert!(s.remove(64) && !s.remove(64));
        for w in [70, 500, 3] {
            assert!(s.remove(w));
        }
        assert!(s.is_empty(), "no empty boxed list is left behind");
        assert!(s.high.is_none());
    }
}
