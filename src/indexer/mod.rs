//! KV indexers: which worker holds which cached prefix, answered as per-worker overlap scores.
//!
//! The router hashes a request into [`LocalBlockHash`]es and asks an indexer for
//! [`OverlapScores`]: for every worker, how many blocks *from block 0* it holds contiguously.
//! Event-driven indexers learn the cache contents from [`KvEvent`]s; the [`ApproximateIndexer`]
//! instead remembers its own routing decisions for a TTL (Dynamo's `--no-kv-events` mode).
//!
//! The indexers the router uses, all single-threaded behind the [`KvIndexer`] trait:
//! - [`FlatIndex`]: one map from sequence hash to workers (the KV router's default);
//! - [`ApproximateIndexer`]: routing decisions with a TTL and a size cap, kept in a radix tree;
//! - [`RadixTree`]: one node per block, arena allocated: the reference every other indexer must
//!   answer like (the differential tests hold them to it).
//!
//! The benchmark's thread-safe variants (a path-compressed concurrent tree, branch-sharded
//! reference trees) live in the `indexer_bench` crate, built on the helpers exported here.
//!
//! Semantics shared by all (see [`RadixTree`] for details): the answer for a worker depends only
//! on the set of blocks it currently holds; a block whose prefix was evicted stays indexed (it
//! becomes reachable again if the prefix is stored again), which is what a prefix cache keyed by
//! sequence hashes actually hits. This differs from Dynamo's classic tree, which drops the
//! children of a block no worker holds and so leaves "zombie" descendants in the per-worker maps.

use std::collections::BTreeMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::ids::WorkerId;
use crate::kv::event::KvEvent;
use crate::time::{SimDuration, SimTime};
use crate::tokens::{LocalBlockHash, SequenceHash};

mod approx;
mod flat;
mod radix;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use approx::{ApproximateConfig, ApproximateIndexer};
pub use flat::FlatIndex;
pub use radix::RadixTree;

/// What an indexer knows about one request: per-worker contiguous prefix matches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlapScores {
    /// Blocks matched contiguously from block 0, per worker; only workers with at least one.
    pub scores: BTreeMap<WorkerId, u32>,
    /// Blocks each worker holds in the index (workers holding none are absent); the router
    /// uses it to break ties towards the emptier worker.
    pub tree_sizes: BTreeMap<WorkerId, usize>,
}

/// Counters of what an indexer did with the events it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexerStats {
    /// Events applied (possibly partly, when some removed hashes were unknown).
    pub events_applied: u64,
    /// Stored events skipped because the worker does not hold their parent.
    pub unknown_parent_events: u64,
    /// Removed hashes skipped because the worker does not hold them.
    pub unknown_removed_hashes: u64,
    /// Events skipped because their `event_id` was not newer than the worker's last one.
    pub stale_events: u64,
    /// Events ignored because the indexer does not consume KV events (approximate mode).
    pub ignored_events: u64,
}

/// Errors of the indexer API.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum IndexerError {
    /// A routing decision whose two hash lists differ in length.
    #[error("{local} local hashes but {seq} sequence hashes")]
    HashLengthMismatch {
        /// Number of local hashes given.
        local: usize,
        /// Number of sequence hashes given.
        seq: usize,
    },
}

/// The indexer interface the engine's router drives (single-threaded, synchronous).
pub trait KvIndexer {
    /// Per-worker contiguous prefix matches of `local_hashes`, plus every worker's tree size.
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores;
    /// [`find_matches`](KvIndexer::find_matches) for a caller that already has the query's
    /// sequence hashes (`seq_hashes[i]` chains `local_hashes[..=i]`); indexers keyed by sequence
    /// hash use them instead of rehashing.
    fn find_matches_hashed(
        &self,
        local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> OverlapScores {
        let _ = seq_hashes;
        self.find_matches(local_hashes)
    }
    /// Only the per-worker matches of [`find_matches_hashed`](KvIndexer::find_matches_hashed)
    /// (what routing needs): indexers that can skip the tree sizes, an O(workers) map, do.
    fn match_scores_hashed(
        &self,
        local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> BTreeMap<WorkerId, u32> {
        self.find_matches_hashed(local_hashes, seq_hashes).scores
    }
    /// Applies one KV event. A Stored event whose parent the worker does not hold, and removed
    /// hashes the worker does not hold, are skipped and counted in [`IndexerStats`].
    fn apply(&mut self, event: &KvEvent);
    /// Forgets everything about `worker`.
    fn remove_worker(&mut self, worker: WorkerId);
    /// Makes room for about `blocks` indexed blocks ahead of time, where that spares the
    /// indexer pauses to grow while events come in (by default nothing).
    fn reserve(&mut self, blocks: usize) {
        let _ = blocks;
    }
    /// Event counters.
    fn stats(&self) -> IndexerStats;
    /// Records that a request with these hashes was routed to `worker` at `now`. Only the
    /// approximate indexer uses it; event-driven indexers ignore it.
    fn record_routing(
        &mut self,
        worker: WorkerId,
        local_hashes: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
        now: SimTime,
    ) -> Result<(), IndexerError> {
        let _ = (worker, local_hashes, seq_hashes, now);
        Ok(())
    }
    /// Drops entries whose TTL ran out by `now`. Only the approximate indexer uses it.
    fn expire(&mut self, now: SimTime) {
        let _ = now;
    }
}

/// Default TTL of a routing decision in the approximate indexer (Dynamo's `router_ttl_secs`).
pub(crate) const DEFAULT_TTL: SimDuration = SimDuration::from_micros(120_000_000);

/// Hasher for keys that are already hashes (or small ids): one multiply, FxHash style. Unlike
/// [`PassThroughHasher`](crate::tokens::PassThroughHasher) it mixes every word, so tuple keys
/// such as `(node, local hash)` spread well.
#[derive(Clone, Copy, Debug, Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(buf));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// `HashMap` builder using [`FxHasher`]; only for maps whose iteration order never matters.
pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
/// A `HashMap` keyed by hashes or ids.
pub type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
/// A `HashSet` of hashes or ids.
pub type FxHashSet<K> = std::collections::HashSet<K, FxBuild>;

/// Intersects sorted `active` with sorted `holders` in place; workers that drop out get
/// `score = depth` (when positive). One step of a tree walk's lookup: every tree indexer scores
/// contiguous matches this way, so they agree.
pub fn narrow_active(
    active: &mut Vec<WorkerId>,
    holders: &[WorkerId],
    depth: u32,
    scores: &mut BTreeMap<WorkerId, u32>,
) {
    if active.as_slice() == holders {
        return;
    }
    let mut j = 0;
    active.retain(|w| {
        while j < holders.len() && holders[j] < *w {
            j += 1;
        }
        let keep = j < holders.len() && holders[j] == *w;
        if !keep && depth > 0 {
            scores.insert(*w, depth);
        }
        keep
    });
}

/// Inserts `w` into a sorted worker list; true when it was absent.
pub fn sorted_insert(workers: &mut Vec<WorkerId>, w: WorkerId) -> bool {
    match workers.binary_search(&w) {
        Ok(_) => false,
        Err(i) => {
            workers.insert(i, w);
            true
        }
    }
}

/// Removes `w` from a sorted worker list; true when it was present.
pub fn sorted_remove(workers: &mut Vec<WorkerId>, w: WorkerId) -> bool {
    match workers.binary_search(&w) {
        Ok(i) => {
            workers.remove(i);
            true
        }
        Err(_) => false,
    }
}
