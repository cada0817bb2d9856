//! The benchmark's indexers: thread-safe variants of the engine's [`KvIndexer`]s, and the kinds
//! selectable from the command line.
//!
//! - [`ConcurrentRadixTreeCompressed`]: path-compressed nodes behind per-node `RwLock`s, so
//!   lookups run while events are applied;
//! - [`BranchSharded`]: reference trees sharded by a hash of the first K blocks, exact on
//!   shallow queries and on continuations that cross the K boundary;
//! - [`Locked`]: any single-threaded indexer behind one `Mutex` (the baseline).
//!
//! They answer exactly like the engine's [`RadixTree`] for the same event stream (the
//! differential tests here hold them to it); [`IndexerKind`] also names the engine's own
//! indexers (radix tree, flat, approximate) so one command line covers all five.

use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use servesim::ids::WorkerId;
use servesim::indexer::{
    ApproximateConfig, ApproximateIndexer, FlatIndex, IndexerStats, KvIndexer, OverlapScores,
    RadixTree,
};
use servesim::kv::KvEvent;
use servesim::tokens::LocalBlockHash;

mod compressed;
mod sharded;
#[cfg(test)]
mod tests;

pub use compressed::ConcurrentRadixTreeCompressed;
pub use sharded::BranchSharded;

/// An indexer name that is not one of [`IndexerKind`]'s.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("unknown indexer `{0}` (expected radix-tree, concurrent-radix-tree-compressed, branch-sharded, approximate or flat)")]
pub struct UnknownIndexer(pub String);

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

/// Implements [`KvIndexer`] for concurrent indexers by forwarding to [`ConcurrentKvIndexer`], so
/// tests, benches and the open loop drive every variant through one interface. (A blanket impl
/// over `T: ConcurrentKvIndexer` is not allowed outside the crate that owns `KvIndexer`.)
macro_rules! kv_indexer_via_concurrent {
    ($($ty:ty),* $(,)?) => {$(
        impl KvIndexer for $ty {
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
    )*};
}

kv_indexer_via_concurrent!(
    ConcurrentRadixTreeCompressed,
    BranchSharded,
    dyn ConcurrentKvIndexer + '_,
);

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

impl<T> KvIndexer for Locked<T>
where
    T: KvIndexer + Send,
{
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
    type Err = UnknownIndexer;
    fn from_str(s: &str) -> Result<IndexerKind, UnknownIndexer> {
        IndexerKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownIndexer(s.to_string()))
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
