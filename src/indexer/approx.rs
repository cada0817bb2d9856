//! The approximate indexer: remembers routing decisions for a TTL instead of consuming KV events.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::{IndexerError, IndexerStats, KvIndexer, OverlapScores, RadixTree, DEFAULT_TTL};
use crate::ids::WorkerId;
use crate::kv::event::{KvEvent, StoredBlock};
use crate::time::{SimDuration, SimTime};
use crate::tokens::{LocalBlockHash, SequenceHash};

/// Settings of the [`ApproximateIndexer`] (Dynamo's `ApproxKvIndexer` defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ApproximateConfig {
    /// How long a routed block is assumed to stay cached (`router_ttl_secs`, 120 s).
    pub ttl: SimDuration,
    /// Most blocks kept over all workers before pruning (2^20).
    pub max_tree_size: usize,
    /// Pruning shrinks the index to this fraction of `max_tree_size` (0.8).
    pub prune_target_ratio: f64,
}

impl Default for ApproximateConfig {
    fn default() -> ApproximateConfig {
        ApproximateConfig {
            ttl: DEFAULT_TTL,
            max_tree_size: 1 << 20,
            prune_target_ratio: 0.8,
        }
    }
}

/// Key of the expiry queue: earliest deadline first, then the deeper block first, then by
/// worker and hash so the order is total and deterministic.
type ExpiryKey = (SimTime, Reverse<u32>, WorkerId, SequenceHash);

/// Indexer for `--no-kv-events`: each routing decision inserts the request's blocks for the
/// chosen worker with a deadline `now + ttl` (reinsertion refreshes it); `expire` removes
/// blocks whose deadline has passed as if a Removed event had arrived, and a size cap prunes
/// the earliest-expiring blocks (deeper first on ties) down to `prune_target_ratio` of the cap.
#[derive(Clone, Debug)]
pub struct ApproximateIndexer {
    /// The blocks currently assumed cached.
    tree: RadixTree,
    /// TTL and size settings.
    config: ApproximateConfig,
    /// Deadline and depth of every (worker, block) in the tree.
    deadlines: BTreeMap<(WorkerId, SequenceHash), (SimTime, u32)>,
    /// The same entries ordered by expiry.
    queue: BTreeSet<ExpiryKey>,
    /// KV events handed to us and ignored.
    ignored_events: u64,
}

impl Default for ApproximateIndexer {
    fn default() -> ApproximateIndexer {
        ApproximateIndexer::new(ApproximateConfig::default())
    }
}

impl ApproximateIndexer {
    /// An empty indexer.
    pub fn new(config: ApproximateConfig) -> ApproximateIndexer {
        ApproximateIndexer {
            tree: RadixTree::new(),
            config,
            deadlines: BTreeMap::new(),
            queue: BTreeSet::new(),
            ignored_events: 0,
        }
    }

    /// Blocks currently indexed, over all workers.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.deadlines.len()
    }

    /// True when nothing is indexed.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.deadlines.is_empty()
    }

    /// Contiguous matches and tree sizes of what is currently assumed cached.
    pub(crate) fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        self.tree.find_matches(local_hashes)
    }

    /// Records that a request with these block hashes was routed to `worker` at `now`:
    /// expires old entries, inserts (or refreshes) the blocks, then prunes to the size cap.
    pub(crate) fn record_routing(
        &mut self,
        worker: WorkerId,
        local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
        now: SimTime,
    ) -> Result<(), IndexerError> {
        if local_hashes.len() != seq_hashes.len() {
            return Err(IndexerError::HashLengthMismatch {
                local: local_hashes.len(),
                seq: seq_hashes.len(),
            });
        }
        self.expire(now);
        let blocks: Vec<StoredBlock> = local_hashes
            .iter()
            .zip(seq_hashes)
            .map(|(&local_hash, &seq_hash)| StoredBlock {
                seq_hash,
                local_hash,
            })
            .collect();
        self.tree.store(worker, None, &blocks);
        let deadline = now + self.config.ttl;
        for (depth, &h) in seq_hashes.iter().enumerate() {
            let depth = depth as u32;
            if let Some((old, old_depth)) = self.deadlines.insert((worker, h), (deadline, depth)) {
                self.queue.remove(&(old, Reverse(old_depth), worker, h));
            }
            self.queue.insert((deadline, Reverse(depth), worker, h));
        }
        if self.deadlines.len() > self.config.max_tree_size {
            let target = (self.config.max_tree_size as f64 * self.config.prune_target_ratio)
                .floor()
                .max(0.0) as usize;
            while self.deadlines.len() > target {
                let Some(first) = self.queue.pop_first() else {
                    break;
                };
                self.drop_entry(first);
            }
        }
        Ok(())
    }

    /// Removes every block whose deadline is at or before `now`.
    pub(crate) fn expire(&mut self, now: SimTime) {
        while let Some(first) = self.queue.first().copied() {
            if first.0 > now {
                break;
            }
            self.queue.pop_first();
            self.drop_entry(first);
        }
    }

    /// Forgets everything about `worker`.
    pub(crate) fn remove_worker(&mut self, worker: WorkerId) {
        let keys: Vec<(WorkerId, SequenceHash)> = self
            .deadlines
            .range((worker, SequenceHash(0))..=(worker, SequenceHash(u64::MAX)))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some((t, d)) = self.deadlines.remove(&k) {
                self.queue.remove(&(t, Reverse(d), k.0, k.1));
            }
        }
        self.tree.remove_worker(worker);
    }

    /// Checks that the deadline maps and the tree agree; panics otherwise.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        self.tree.assert_invariants();
        assert_eq!(self.deadlines.len(), self.queue.len());
        for (&(w, h), &(t, d)) in &self.deadlines {
            assert!(self.queue.contains(&(t, Reverse(d), w, h)));
            assert!(
                self.tree.holds(w, h),
                "{w} {h:?} has a deadline but no block"
            );
        }
        let total: usize = self.tree.tree_sizes().values().sum();
        assert_eq!(total, self.deadlines.len());
    }

    fn drop_entry(&mut self, (_, _, worker, h): ExpiryKey) {
        self.deadlines.remove(&(worker, h));
        self.tree.remove_block(worker, h);
    }
}

impl KvIndexer for ApproximateIndexer {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        ApproximateIndexer::find_matches(self, local_hashes)
    }
    fn apply(&mut self, _event: &KvEvent) {
        self.ignored_events += 1;
    }
    fn remove_worker(&mut self, worker: WorkerId) {
        ApproximateIndexer::remove_worker(self, worker)
    }
    fn stats(&self) -> IndexerStats {
        IndexerStats {
            ignored_events: self.ignored_events,
            ..IndexerStats::default()
        }
    }
    fn record_routing(
        &mut self,
        worker: WorkerId,
        local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
        now: SimTime,
    ) -> Result<(), IndexerError> {
        ApproximateIndexer::record_routing(self, worker, local_hashes, seq_hashes, now)
    }
    fn expire(&mut self, now: SimTime) {
        ApproximateIndexer::expire(self, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::sequence_hashes;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn hashes(locals: &[u64]) -> (Vec<LocalBlockHash>, Vec<SequenceHash>) {
        let l: Vec<LocalBlockHash> = locals.iter().map(|&x| LocalBlockHash(x)).collect();
        let s = sequence_hashes(&l);
        (l, s)
    }

    const SEC: u64 = 1_000_000;

    #[test]
    fn ttl_expires_and_reinsertion_refreshes() -> anyhow::Result<()> {
        let mut a = ApproximateIndexer::default();
        let (l, s) = hashes(&[1, 2, 3]);
        let (l2, s2) = hashes(&[1, 2]);
        a.record_routing(WorkerId(0), &l, &s, SimTime::from_micros(0))?;
        a.record_routing(WorkerId(0), &l2, &s2, SimTime::from_micros(100 * SEC))?;
        a.expire(SimTime::from_micros(119 * SEC));
        assert_eq!(a.find_matches(&l).scores[&WorkerId(0)], 3);
        a.expire(SimTime::from_micros(120 * SEC));
        // Block 3 expired; blocks 1-2 were refreshed at 100 s.
        assert_eq!(a.find_matches(&l).scores[&WorkerId(0)], 2);
        a.assert_invariants();
        a.expire(SimTime::from_micros(220 * SEC));
        assert!(a.find_matches(&l).scores.is_empty());
        assert!(a.is_empty());
        a.assert_invariants();
        Ok(())
    }

    #[test]
    fn size_cap_prunes_earliest_then_deepest() -> anyhow::Result<()> {
        let mut a = ApproximateIndexer::new(ApproximateConfig {
            max_tree_size: 10,
            ..ApproximateConfig::default()
        });
        let (l1, s1) = hashes(&[1, 2, 3, 4, 5, 6]);
        let (l2, s2) = hashes(&[7, 8, 9, 10, 11]);
        a.record_routing(WorkerId(0), &l1, &s1, SimTime::from_micros(0))?;
        a.record_routing(WorkerId(1), &l2, &s2, SimTime::from_micros(SEC))?;
        // 11 > 10 blocks: prune to 8, dropping worker 0's three deepest (earliest deadline).
        assert_eq!(a.len(), 8);
        assert_eq!(a.find_matches(&l1).scores[&WorkerId(0)], 3);
        assert_eq!(a.find_matches(&l2).scores[&WorkerId(1)], 5);
        a.assert_invariants();
        Ok(())
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let mut a = ApproximateIndexer::default();
        let (l, s) = hashes(&[1, 2]);
        assert_eq!(
            a.record_routing(WorkerId(0), &l, &s[..1], SimTime::from_micros(0)),
            Err(IndexerError::HashLengthMismatch { local: 2, seq: 1 })
        );
    }

    #[test]
    fn invariants_hold_on_random_operations() -> anyhow::Result<()> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut a = ApproximateIndexer::new(ApproximateConfig {
            ttl: SimDuration::from_micros(50 * SEC),
            max_tree_size: 200,
            prune_target_ratio: 0.8,
        });
        let mut now = SimTime::from_micros(0);
        for _ in 0..2000 {
            now += SimDuration::from_micros(rng.gen_range(0..2 * SEC));
            let family: u64 = rng.gen_range(0..3);
            let len = rng.gen_range(1..30);
            let locals: Vec<u64> = (0..len)
                .map(|i| {
                    if i < 5 {
                        family * 100 + i
                    } else {
                        rng.gen_range(0..4)
                    }
                })
                .collect();
            let (l, s) = hashes(&locals);
            let w = WorkerId(rng.gen_range(0..8));
            match rng.gen_range(0..20) {
                0 => a.remove_worker(w),
                1 => a.expire(now),
                _ => a.record_routing(w, &l, &s, now)?,
            }
            a.assert_invariants();
            assert!(a.len() <= 200);
        }
        Ok(())
    }
}
