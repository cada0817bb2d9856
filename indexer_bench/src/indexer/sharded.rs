//! The branch-sharded indexer: reference trees sharded by the first K blocks of each branch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use servesim::ids::WorkerId;
use servesim::indexer::{FxHashMap, IndexerStats, OverlapScores, RadixTree};
use servesim::kv::{KvEvent, KvEventData, StoredBlock};
use servesim::tokens::{LocalBlockHash, SequenceHash, HASH_SEED};

use super::{lock, read, write, ConcurrentKvIndexer};

/// Where one block of a worker lives.
#[derive(Clone, Debug)]
enum Route {
    /// A block among the first K-1 of its branch: copied into every shard. Keeps the local
    /// hashes from block 0 up to and including this one, to key its descendants.
    Shallow(Box<[LocalBlockHash]>),
    /// A block at depth K-1 or deeper: lives in this shard only.
    Deep(usize),
}

/// Per-worker routing table: where each block the worker holds was put.
#[derive(Debug, Default)]
struct Routes {
    blocks: FxHashMap<SequenceHash, Route>,
}

/// N [`RadixTree`] shards; a branch (all blocks below the same first K local hashes) lives in
/// the shard picked by a hash of those K hashes, so a lookup of at least K blocks reads exactly
/// one shard.
///
/// Exactness, where Dynamo's first branch-sharded indexer gave wrong answers:
/// - **Shallow blocks** (the first K-1 of a branch) are copied into *every* shard, so a worker
///   that shares only the first blocks of a query with it (its branch lives in another shard)
///   still scores them, and a query shorter than K blocks can be answered by any one shard.
/// - **Continuations**: a Stored event whose parent is deep in a chain goes to the shard that
///   holds the parent, found in a per-worker `SequenceHash -> route` table (no guessing from
///   a shorter registered prefix); blocks below a shallow parent are keyed from the local hashes
///   the table keeps for shallow blocks.
/// - Removals are routed the same way, so no descendant is left behind in a wrong shard.
///
/// Concurrency: shards sit behind `RwLock`s (lookups share them), each worker's routing table
/// behind its own `Mutex`, held for the whole event so a worker's events reach the shards in
/// order; events of different workers proceed in parallel. Sequence hashes are assumed to be
/// chain hashes of the local hashes (one sequence hash names one path).
#[derive(Debug)]
pub struct BranchSharded {
    /// K: leading blocks that key a branch (at least 1).
    prefix_depth: usize,
    /// The shards.
    shards: Vec<RwLock<RadixTree>>,
    /// Routing table per worker.
    routes: RwLock<BTreeMap<WorkerId, Arc<Mutex<Routes>>>>,
    /// Blocks per worker (copies of shallow blocks counted once).
    sizes: RwLock<BTreeMap<WorkerId, usize>>,
    /// What happened to the events applied so far.
    stats: Mutex<IndexerStats>,
}

impl BranchSharded {
    /// `num_shards` shards keyed by the first `prefix_depth` blocks (both raised to at least 1).
    pub fn new(num_shards: usize, prefix_depth: usize) -> BranchSharded {
        BranchSharded {
            prefix_depth: prefix_depth.max(1),
            shards: (0..num_shards.max(1))
                .map(|_| RwLock::new(RadixTree::new()))
                .collect(),
            routes: RwLock::new(BTreeMap::new()),
            sizes: RwLock::new(BTreeMap::new()),
            stats: Mutex::new(IndexerStats::default()),
        }
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.shards.len()
    }

    /// K, the number of leading blocks that key a branch.
    pub fn prefix_depth(&self) -> usize {
        self.prefix_depth
    }

    /// Blocks held per shard (shallow copies included), for balance diagnostics.
    pub fn shard_block_counts(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|s| read(s).tree_sizes().values().sum())
            .collect()
    }

    /// The shard of a branch keyed by `prefix` (its first K local hashes, or a whole shorter
    /// query).
    fn shard_of(&self, prefix: &[LocalBlockHash]) -> usize {
        let mut bytes = Vec::with_capacity(prefix.len() * 8);
        for l in prefix {
            bytes.extend_from_slice(&l.0.to_le_bytes());
        }
        (xxh3_64_with_seed(&bytes, HASH_SEED) % self.shards.len() as u64) as usize
    }

    /// Contiguous matches (one shard read) and tree sizes.
    pub fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        if local_hashes.is_empty() {
            return OverlapScores {
                scores: BTreeMap::new(),
                tree_sizes: read(&self.sizes).clone(),
            };
        }
        let key = &local_hashes[..local_hashes.len().min(self.prefix_depth)];
        let shard = self.shard_of(key);
        let scores = read(&self.shards[shard]).match_scores(local_hashes);
        OverlapScores {
            scores,
            tree_sizes: read(&self.sizes).clone(),
        }
    }

    /// Applies one event; a worker's events must come in order.
    pub fn apply(&self, event: &KvEvent) {
        let worker = event.worker;
        let routes = self.worker_routes(worker);
        let mut routes = lock(&routes);
        let before = routes.blocks.len();
        let mut stats = IndexerStats::default();
        match &event.data {
            KvEventData::Stored { parent, blocks } => {
                if self.store(worker, &mut routes, *parent, blocks) {
                    stats.events_applied += 1;
                } else {
                    stats.unknown_parent_events += 1;
                }
            }
            KvEventData::Removed { seq_hashes } => {
                let mut per_shard: Vec<Vec<SequenceHash>> = vec![Vec::new(); self.shards.len()];
                let mut shallow = Vec::new();
                for h in seq_hashes {
                    match routes.blocks.remove(h) {
                        Some(Route::Shallow(_)) => shallow.push(*h),
                        Some(Route::Deep(s)) => per_shard[s].push(*h),
                        None => stats.unknown_removed_hashes += 1,
                    }
                }
                for (s, shard) in self.shards.iter().enumerate() {
                    if shallow.is_empty() && per_shard[s].is_empty() {
                        continue;
                    }
                    let mut tree = write(shard);
                    for h in shallow.iter().chain(&per_shard[s]) {
                        tree.remove_block(worker, *h);
                    }
                }
                stats.events_applied += 1;
            }
            KvEventData::Cleared => {
                routes.blocks.clear();
                for shard in &self.shards {
                    write(shard).clear_worker(worker);
                }
                stats.events_applied += 1;
            }
        }
        let after = routes.blocks.len();
        if after != before {
            let mut sizes = write(&self.sizes);
            if after == 0 {
                sizes.remove(&worker);
            } else {
                sizes.insert(worker, after);
            }
        }
        drop(routes);
        let mut total = lock(&self.stats);
        total.events_applied += stats.events_applied;
        total.unknown_parent_events += stats.unknown_parent_events;
        total.unknown_removed_hashes += stats.unknown_removed_hashes;
    }

    /// Forgets everything about `worker`.
    pub fn remove_worker(&self, worker: WorkerId) {
        let routes = self.worker_routes(worker);
        let mut routes = lock(&routes);
        routes.blocks.clear();
        for shard in &self.shards {
            write(shard).remove_worker(worker);
        }
        write(&self.sizes).remove(&worker);
        write(&self.routes).remove(&worker);
    }

    /// Event counters.
    pub fn stats(&self) -> IndexerStats {
        *lock(&self.stats)
    }

    /// Checks every shard's invariants, that each shard holds exactly the blocks the routing
    /// tables send to it, and the tree sizes; panics otherwise.
    pub fn assert_invariants(&self) {
        let routes = read(&self.routes);
        let sizes = read(&self.sizes);
        let mut expect_sizes = BTreeMap::new();
        let mut shallow_per_worker: BTreeMap<WorkerId, usize> = BTreeMap::new();
        let mut deep_per_shard: Vec<BTreeMap<WorkerId, usize>> =
            vec![BTreeMap::new(); self.shards.len()];
        for (w, r) in routes.iter() {
            let r = lock(r);
            if !r.blocks.is_empty() {
                expect_sizes.insert(*w, r.blocks.len());
            }
            for (h, route) in &r.blocks {
                match route {
                    Route::Shallow(prefix) => {
                        assert!(prefix.len() < self.prefix_depth, "shallow block too deep");
                        *shallow_per_worker.entry(*w).or_default() += 1;
                        for s in &self.shards {
                            assert!(read(s).holds(*w, *h), "shallow {h:?} missing in a shard");
                        }
                    }
                    Route::Deep(s) => {
                        *deep_per_shard[*s].entry(*w).or_default() += 1;
                        assert!(read(&self.shards[*s]).holds(*w, *h), "deep {h:?} missing");
                    }
                }
            }
        }
        assert_eq!(*sizes, expect_sizes, "tree sizes vs routing tables");
        for (s, shard) in self.shards.iter().enumerate() {
            let tree = read(shard);
            tree.assert_invariants();
            for (w, n) in tree.tree_sizes() {
                let expect = shallow_per_worker.get(&w).copied().unwrap_or(0)
                    + deep_per_shard[s].get(&w).copied().unwrap_or(0);
                assert_eq!(n, expect, "shard {s} holds stray blocks of {w}");
            }
        }
    }

    fn worker_routes(&self, worker: WorkerId) -> Arc<Mutex<Routes>> {
        if let Some(r) = read(&self.routes).get(&worker) {
            return Arc::clone(r);
        }
        Arc::clone(write(&self.routes).entry(worker).or_default())
    }

    /// Routes and stores one Stored event; false for an unknown parent.
    fn store(
        &self,
        worker: WorkerId,
        routes: &mut Routes,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> bool {
        // The parent's prefix of local hashes while shallow, or its shard once deep.
        let (mut prefix, mut deep): (Vec<LocalBlockHash>, Option<usize>) = match parent {
            None => (Vec::new(), None),
            Some(p) => match routes.blocks.get(&p) {
                None => return false,
                Some(Route::Shallow(pre)) => (pre.to_vec(), None),
                Some(Route::Deep(s)) => (Vec::new(), Some(*s)),
            },
        };
        let mut split = blocks.len();
        for (i, b) in blocks.iter().enumerate() {
            let route = match deep {
                Some(s) => Route::Deep(s),
                None => {
                    prefix.push(b.local_hash);
                    if prefix.len() < self.prefix_depth {
                        Route::Shallow(prefix.clone().into_boxed_slice())
                    } else {
                        let s = self.shard_of(&prefix);
                        deep = Some(s);
                        Route::Deep(s)
                    }
                }
            };
            if i < split && matches!(route, Route::Deep(_)) {
                split = i;
            }
            routes.blocks.insert(b.seq_hash, route);
        }
        let (shallow, deep_blocks) = blocks.split_at(split);
        if !shallow.is_empty() {
            for shard in &self.shards {
                write(shard).store(worker, parent, shallow);
            }
        }
        if let (Some(s), false) = (deep, deep_blocks.is_empty()) {
            let deep_parent = shallow.last().map(|b| b.seq_hash).or(parent);
            write(&self.shards[s]).store(worker, deep_parent, deep_blocks);
        }
        true
    }
}

impl ConcurrentKvIndexer for BranchSharded {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        BranchSharded::find_matches(self, local_hashes)
    }
    fn apply(&self, event: &KvEvent) {
        BranchSharded::apply(self, event)
    }
    fn remove_worker(&self, worker: WorkerId) {
        BranchSharded::remove_worker(self, worker)
    }
    fn stats(&self) -> IndexerStats {
        BranchSharded::stats(self)
    }
}
