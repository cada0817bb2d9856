//! KV indexers: which worker holds which cached prefix, answered as per-worker overlap scores.
//!
//! The router hashes a request into [`LocalBlockHash`]es and asks an indexer for
//! [`OverlapScores`]: for every worker, how many blocks *from block 0* it holds contiguously.
//! Event-driven indexers learn the cache contents from [`KvEvent`]s; the [`ApproximateIndexer`]
//! instead remembers its own routing decisions for a TTL (Dynamo's `--no-kv-events` mode).
//!
//! Variants, all giving identical answers for the same event stream:
//! - [`RadixTree`]: the single-threaded reference (one node per block, arena allocated);
//! - [`ConcurrentRadixTreeCompressed`]: path-compressed nodes behind per-node `RwLock`s, so
//!   lookups run while events are applied;
//! - [`BranchSharded`]: reference trees sharded by a hash of the first K blocks, exact on
//!   shallow queries and on continuations that cross the K boundary;
//! - [`ApproximateIndexer`]: routing decisions with a TTL and a size cap;
//! - [`FlatIndex`]: one map from sequence hash to workers (the KV router's default).
//!
//! Semantics shared by all (see [`RadixTree`] for details): the answer for a worker depends only
//! on the set of blocks it currently holds; a block whose prefix was evicted stays indexed (it
//! becomes reachable again if the prefix is stored again), which is what a prefix cache keyed by
//! sequence hashes actually hits. This differs from Dynamo's classic tree, which drops the
//! children of a block no worker holds and so leaves "zombie" descendants in the per-worker maps.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::ids::WorkerId;
use crate::kv::event::KvEvent;
use crate::time::{SimDuration, SimTime};
use crate::tokens::{LocalBlockHash, SequenceHash};

mod approx;
mod compressed;
mod flat;
mod radix;
mod sharded;
#[cfg(test)]
mod tests;

pub use approx::{ApproximateConfig, ApproximateIndexer};

pub use compressed::ConcurrentRadixTreeCompressed;
pub use flat::FlatIndex;
pub use radix::RadixTree;
pub use sharded::BranchSharded;

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
    /// An indexer name that is not one of [`IndexerKind`]'s.
    #[error("unknown indexer `{0}` (expected radix-tree, concurrent-radix-tree-compressed, branch-sharded, approximate or flat)")]
    UnknownKind(String),
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
    /// Applies one KV event. A Stored event whose parent the worker does not hold, and removed
    /// hashes the worker does not hold, are skipped and counted in [`IndexerStats`].
    fn apply(&mut self, event: &KvEvent);
    /// Forgets everything about `worker`.
    fn remove_worker(&mut self, worker: WorkerId);
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

/// The interface of indexers that can be shared between threads: every method takes `&self`.
///
/// Per-worker event order is the caller's job (for example one event thread per worker, or
/// workers hashed onto event threads); [`ConcurrentRadixTreeCompressed`] additionally drops
/// events whose `event_id` is not newer than the worker's last applied one.
pub trait ConcurrentKvIndexer: Send + Sync {
    /// Per-worker contiguous prefix matches of `local_hashes`, plus every worker's tree size.
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores;
    /// Applies one KV event (see [`KvIndexer::apply`]).
    fn apply(&self, event: &KvEvent);
    /// Forgets everything about `worker`.
    fn remove_worker(&self, worker: WorkerId);
    /// Event counters.
    fn stats(&self) -> IndexerStats;
}

/// Every concurrent indexer is also a [`KvIndexer`], so tests, benches and the router can drive
/// all variants through one interface.
impl<T: ConcurrentKvIndexer + ?Sized> KvIndexer for T {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        ConcurrentKvIndexer::find_matches(self, local_hashes)
    }
    fn apply(&mut self, event: &KvEvent) {
        ConcurrentKvIndexer::apply(self, event)
    }
    fn remove_worker(&mut self, worker: WorkerId) {
        ConcurrentKvIndexer::remove_worker(self, worker)
    }
    fn stats(&self) -> IndexerStats {
        ConcurrentKvIndexer::stats(self)
    }
}

/// A single-threaded indexer behind one `Mutex`, usable from several threads (the baseline the
/// concurrent variants are compared with).
#[derive(Debug, Default)]
pub struct Locked<T>(Mutex<T>);

impl<T> Locked<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Locked<T> {
        Locked(Mutex::new(inner))
    }

    /// The wrapped indexer.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> ConcurrentKvIndexer for Locked<T>
where
    T: KvIndexer + Send,
{
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        lock(&self.0).find_matches(local_hashes)
    }
    fn apply(&self, event: &KvEvent) {
        lock(&self.0).apply(event)
    }
    fn remove_worker(&self, worker: WorkerId) {
        lock(&self.0).remove_worker(worker)
    }
    fn stats(&self) -> IndexerStats {
        lock(&self.0).stats()
    }
}

/// The indexer variants selectable from the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum IndexerKind {
    /// [`RadixTree`].
    #[default]
    RadixTree,
    /// [`ConcurrentRadixTreeCompressed`].
    ConcurrentRadixTreeCompressed,
    /// [`BranchSharded`].
    BranchSharded,
    /// [`ApproximateIndexer`].
    Approximate,
    /// [`FlatIndex`].
    Flat,
}

impl IndexerKind {
    /// Every kind, in a fixed order.
    pub const ALL: [IndexerKind; 5] = [
        IndexerKind::RadixTree,
        IndexerKind::ConcurrentRadixTreeCompressed,
        IndexerKind::BranchSharded,
        IndexerKind::Approximate,
        IndexerKind::Flat,
    ];

    /// The kebab-case name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            IndexerKind::RadixTree => "radix-tree",
            IndexerKind::ConcurrentRadixTreeCompressed => "concurrent-radix-tree-compressed",
            IndexerKind::BranchSharded => "branch-sharded",
            IndexerKind::Approximate => "approximate",
            IndexerKind::Flat => "flat",
        }
    }

    /// True for the indexers that learn from KV events.
    pub fn uses_kv_events(self) -> bool {
        self != IndexerKind::Approximate
    }

    /// A fresh indexer of this kind.
    pub fn build(self, config: &IndexerConfig) -> Box<dyn KvIndexer + Send> {
        match self {
            IndexerKind::RadixTree => Box::new(RadixTree::new()),
            IndexerKind::ConcurrentRadixTreeCompressed => {
                Box::new(ConcurrentRadixTreeCompressed::new())
            }
            IndexerKind::BranchSharded => {
                Box::new(BranchSharded::new(config.num_shards, config.prefix_depth))
            }
            IndexerKind::Approximate => Box::new(ApproximateIndexer::new(config.approximate)),
            IndexerKind::Flat => Box::new(FlatIndex::new()),
        }
    }
}

impl fmt::Display for IndexerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for IndexerKind {
    type Err = IndexerError;
    fn from_str(s: &str) -> Result<IndexerKind, IndexerError> {
        IndexerKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| IndexerError::UnknownKind(s.to_string()))
    }
}

/// Settings of every indexer kind (each kind reads only its own).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IndexerConfig {
    /// [`BranchSharded`]: number of shards (at least 1).
    pub num_shards: usize,
    /// [`BranchSharded`]: K, the number of leading blocks whose hash picks a branch's shard.
    pub prefix_depth: usize,
    /// [`ApproximateIndexer`] settings.
    pub approximate: ApproximateConfig,
}

impl Default for IndexerConfig {
    fn default() -> IndexerConfig {
        IndexerConfig {
            num_shards: 4,
            prefix_depth: 2,
            approximate: ApproximateConfig::default(),
        }
    }
}

/// Default TTL of a routing decision in the approximate indexer (Dynamo's `router_ttl_secs`).
pub const DEFAULT_TTL: SimDuration = SimDuration(120_000_000);

/// Hasher for keys that are already hashes (or small ids): one multiply, FxHash style.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FxHasher(u64);

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
pub(crate) type FxHashMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
/// A `HashSet` of hashes or ids.
pub(crate) type FxHashSet<K> = std::collections::HashSet<K, FxBuild>;

/// Locks a mutex, ignoring poisoning (a panicking writer leaves consistent-enough state for a
/// simulator; the panic itself is reported on its own thread).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks, ignoring poisoning.
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks, ignoring poisoning.
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Intersects sorted `active` with sorted `holders` in place; workers that drop out get
/// `score = depth` (when positive).
pub(crate) fn narrow_active(
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
pub(crate) fn sorted_insert(workers: &mut Vec<WorkerId>, w: WorkerId) -> bool {
    match workers.binary_search(&w) {
        Ok(_) => false,
        Err(i) => {
            workers.insert(i, w);
            true
        }
    }
}

/// Removes `w` from a sorted worker list; true when it was present.
pub(crate) fn sorted_remove(workers: &mut Vec<WorkerId>, w: WorkerId) -> bool {
    match workers.binary_search(&w) {
        Ok(i) => {
            workers.remove(i);
            true
        }
        Err(_) => false,
    }
}
