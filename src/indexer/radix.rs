//! The reference indexer: a radix tree of blocks, one arena node per block.

use std::collections::BTreeMap;

use super::{
    narrow_active, sorted_insert, sorted_remove, FxHashMap, IndexerStats, KvIndexer, OverlapScores,
};
use crate::ids::WorkerId;
use crate::kv::event::{KvEvent, KvEventData, StoredBlock};
use crate::tokens::{LocalBlockHash, SequenceHash};

/// Index of a node in the arena.
type NodeId = u32;

/// The root: the empty prefix. Never freed.
const ROOT: NodeId = 0;

/// One block of some prefix.
#[derive(Clone, Debug)]
struct Node {
    /// The node above (ROOT's parent is ROOT).
    parent: NodeId,
    /// Edge label from the parent: this block's local hash.
    local: LocalBlockHash,
    /// Workers holding this block, sorted (intersected on every lookup).
    workers: Vec<WorkerId>,
    /// Number of live children; a node with no workers and no children is freed.
    num_children: u32,
    /// False while the slot sits in the free list.
    live: bool,
}

impl Default for Node {
    fn default() -> Node {
        Node {
            parent: ROOT,
            local: LocalBlockHash(0),
            workers: Vec::new(),
            num_children: 0,
            live: false,
        }
    }
}

/// The single-threaded reference indexer (Dynamo's classic radix tree, arena allocated).
///
/// Node children are keyed by [`LocalBlockHash`] (one edge map for the whole tree); every node
/// keeps its sorted set of workers; per worker a map `SequenceHash -> node` lets a Stored event
/// with a parent and a Removed event jump straight into the tree.
///
/// - **Stored**: start at the worker's node for `parent` (the root when None; unknown parent:
///   skip and count), then for each block follow or create the child with that local hash, add
///   the worker and record the block's sequence hash.
/// - **Removed**: drop the worker from the node of each hash (unknown: skip and count). A node
///   that no worker holds and that has no children is freed, and so on up the tree. Unlike
///   Dynamo's classic tree, the children of a worker-less node are kept: they may still be held
///   by workers, and must be reachable again when the prefix is stored again.
/// - **Cleared** / [`RadixTree::remove_worker`]: drop the worker everywhere.
///
/// Lookups walk the query from the root, intersecting worker sets, so a worker's score is its
/// contiguous match from block 0.
#[derive(Clone, Debug)]
pub struct RadixTree {
    /// Node arena; slot 0 is the root.
    nodes: Vec<Node>,
    /// Freed slots, reused before growing the arena.
    free: Vec<NodeId>,
    /// Children: (parent, local hash) -> child.
    edges: FxHashMap<(NodeId, LocalBlockHash), NodeId>,
    /// Per worker: the node of each block it holds.
    lookup: BTreeMap<WorkerId, FxHashMap<SequenceHash, NodeId>>,
    /// What happened to the events applied so far.
    stats: IndexerStats,
}

impl Default for RadixTree {
    fn default() -> RadixTree {
        RadixTree::new()
    }
}

impl RadixTree {
    /// An empty tree.
    pub fn new() -> RadixTree {
        RadixTree {
            nodes: vec![Node {
                live: true,
                ..Node::default()
            }],
            free: Vec::new(),
            edges: FxHashMap::default(),
            lookup: BTreeMap::new(),
            stats: IndexerStats::default(),
        }
    }

    /// Per-worker contiguous prefix matches of `local_hashes` (no tree sizes).
    pub fn match_scores(&self, local_hashes: &[LocalBlockHash]) -> BTreeMap<WorkerId, u32> {
        let mut scores = BTreeMap::new();
        let mut active: Vec<WorkerId> = Vec::new();
        let mut node = ROOT;
        let mut depth = 0u32;
        for &local in local_hashes {
            let Some(&child) = self.edges.get(&(node, local)) else {
                break;
            };
            let holders = &self.nodes[child as usize].workers;
            if depth == 0 {
                active.extend_from_slice(holders);
            } else {
                narrow_active(&mut active, holders, depth, &mut scores);
            }
            if active.is_empty() {
                break;
            }
            depth += 1;
            node = child;
        }
        for w in active {
            scores.insert(w, depth);
        }
        scores
    }

    /// Blocks each worker holds (workers with none are absent).
    pub fn tree_sizes(&self) -> BTreeMap<WorkerId, usize> {
        self.lookup
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(w, m)| (*w, m.len()))
            .collect()
    }

    /// True when `worker` holds the block `seq_hash`.
    pub fn holds(&self, worker: WorkerId, seq_hash: SequenceHash) -> bool {
        self.lookup
            .get(&worker)
            .is_some_and(|m| m.contains_key(&seq_hash))
    }

    /// Number of live nodes, root excluded.
    #[cfg(test)]
    pub(crate) fn num_nodes(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// Contiguous matches and tree sizes (see [`KvIndexer::find_matches`]).
    pub(crate) fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        OverlapScores {
            scores: self.match_scores(local_hashes),
            tree_sizes: self.tree_sizes(),
        }
    }

    /// Applies one event (see [`KvIndexer::apply`]).
    pub(crate) fn apply(&mut self, event: &KvEvent) {
        match &event.data {
            KvEventData::Stored { parent, blocks } => {
                if self.store(event.worker, *parent, blocks) {
                    self.stats.events_applied += 1;
                } else {
                    self.stats.unknown_parent_events += 1;
                }
            }
            KvEventData::Removed { seq_hashes } => {
                for &h in seq_hashes {
                    if !self.remove_block(event.worker, h) {
                        self.stats.unknown_removed_hashes += 1;
                    }
                }
                self.stats.events_applied += 1;
            }
            KvEventData::Cleared => {
                self.clear_worker(event.worker);
                self.stats.events_applied += 1;
            }
        }
    }

    /// Forgets everything about `worker`.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.clear_worker(worker);
        self.lookup.remove(&worker);
    }

    /// Event counters.
    pub(crate) fn stats(&self) -> IndexerStats {
        self.stats
    }

    /// Stores `blocks` under `parent` for `worker`; false (nothing changed) for an unknown parent.
    ///
    /// This and [`remove_block`](RadixTree::remove_block) and
    /// [`clear_worker`](RadixTree::clear_worker) are `apply`'s steps without
    /// its event counters, for indexers that route parts of one event to different trees.
    pub fn store(
        &mut self,
        worker: WorkerId,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> bool {
        let mut node = match parent {
            None => ROOT,
            Some(p) => match self.lookup.get(&worker).and_then(|m| m.get(&p)) {
                Some(&n) => n,
                None => return false,
            },
        };
        for b in blocks {
            let child = self.child_or_insert(node, b.local_hash);
            let previous = self
                .lookup
                .entry(worker)
                .or_default()
                .insert(b.seq_hash, child);
            match previous {
                Some(old) if old == child => {}
                Some(old) => {
                    // The same sequence hash moved (a hash collision or an inconsistent
                    // stream): the worker no longer holds the old node.
                    sorted_remove(&mut self.nodes[old as usize].workers, worker);
                    sorted_insert(&mut self.nodes[child as usize].workers, worker);
                    self.prune(old);
                }
                None => {
                    sorted_insert(&mut self.nodes[child as usize].workers, worker);
                }
            }
            node = child;
        }
        true
    }

    /// Drops `worker` from block `seq_hash`; false when it did not hold it.
    pub fn remove_block(&mut self, worker: WorkerId, seq_hash: SequenceHash) -> bool {
        let Some(node) = self
            .lookup
            .get_mut(&worker)
            .and_then(|m| m.remove(&seq_hash))
        else {
            return false;
        };
        sorted_remove(&mut self.nodes[node as usize].workers, worker);
        self.prune(node);
        true
    }

    /// Drops `worker` from every block (its lookup entry stays, empty).
    pub fn clear_worker(&mut self, worker: WorkerId) {
        let Some(map) = self.lookup.get_mut(&worker) else {
            return;
        };
        let mut nodes: Vec<NodeId> = map.drain().map(|(_, n)| n).collect();
        nodes.sort_unstable();
        for &n in &nodes {
            sorted_remove(&mut self.nodes[n as usize].workers, worker);
        }
        for n in nodes {
            self.prune(n);
        }
    }

    /// The child of `node` with edge `local`, created when absent.
    fn child_or_insert(&mut self, node: NodeId, local: LocalBlockHash) -> NodeId {
        if let Some(&c) = self.edges.get(&(node, local)) {
            return c;
        }
        let fresh = Node {
            parent: node,
            local,
            workers: Vec::new(),
            num_children: 0,
            live: true,
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = fresh;
                id
            }
            None => {
                self.nodes.push(fresh);
                (self.nodes.len() - 1) as NodeId
            }
        };
        self.edges.insert((node, local), id);
        self.nodes[node as usize].num_children += 1;
        id
    }

    /// Frees `node` and then its ancestors while they have neither workers nor children.
    fn prune(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = &self.nodes[node as usize];
            if !n.live || !n.workers.is_empty() || n.num_children > 0 {
                return;
            }
            let (parent, local) = (n.parent, n.local);
            self.edges.remove(&(parent, local));
            self.nodes[node as usize] = Node::default();
            self.free.push(node);
            self.nodes[parent as usize].num_children -= 1;
            node = parent;
        }
    }

    /// Checks the internal invariants; panics with a description when one fails.
    ///
    /// Lookup maps and node worker sets agree, tree sizes are the lookup sizes, every live node
    /// is reachable from the root through the edge map, child counts are right, and no live node
    /// (other than the root) is both worker-less and childless.
    pub fn assert_invariants(&self) {
        // Every lookup entry points at a live node that lists the worker.
        let mut held: BTreeMap<NodeId, Vec<WorkerId>> = BTreeMap::new();
        for (w, map) in &self.lookup {
            for (h, &n) in map {
                let node = &self.nodes[n as usize];
                assert!(node.live, "{w} maps {h:?} to a freed node {n}");
                assert!(
                    node.workers.binary_search(w).is_ok(),
                    "{w} maps {h:?} to node {n} which does not list it"
                );
                held.entry(n).or_default().push(*w);
            }
        }
        // Every node's workers are exactly those whose lookup points at it (once each).
        let free: std::collections::BTreeSet<NodeId> = self.free.iter().copied().collect();
        assert_eq!(free.len(), self.free.len(), "free list has duplicates");
        let mut children = vec![0u32; self.nodes.len()];
        for (&(p, local), &c) in &self.edges {
            let child = &self.nodes[c as usize];
            assert!(child.live, "edge to freed node {c}");
            assert_eq!(child.parent, p, "node {c} parent mismatch");
            assert_eq!(child.local, local, "node {c} label mismatch");
            children[p as usize] += 1;
        }
        for (i, node) in self.nodes.iter().enumerate() {
            let id = i as NodeId;
            assert_eq!(
                node.live,
                !free.contains(&id),
                "node {id} liveness vs free list"
            );
            if !node.live {
                continue;
            }
            assert!(
                node.workers.windows(2).all(|w| w[0] < w[1]),
                "node {id} workers not sorted"
            );
            let mut expect = held.remove(&id).unwrap_or_default();
            expect.sort_unstable();
            assert_eq!(node.workers, expect, "node {id} workers vs lookup maps");
            assert_eq!(node.num_children, children[i], "node {id} child count");
            if id != ROOT {
                assert!(
                    !node.workers.is_empty() || node.num_children > 0,
                    "node {id} is empty and childless"
                );
                assert_eq!(
                    self.edges.get(&(node.parent, node.local)),
                    Some(&id),
                    "node {id} not reachable from its parent"
                );
            }
        }
        // Reachability: walking parents from any live node ends at the root without cycles.
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.live {
                continue;
            }
            let mut cur = i as NodeId;
            let mut steps = 0;
            while cur != ROOT {
                cur = self.nodes[cur as usize].parent;
                steps += 1;
                assert!(steps <= self.nodes.len(), "cycle above node {i}");
            }
        }
        let sizes = self.tree_sizes();
        let total: usize = sizes.values().sum();
        let listed: usize = self.nodes.iter().map(|n| n.workers.len()).sum();
        assert_eq!(total, listed, "tree sizes vs node worker sets");
    }
}

impl KvIndexer for RadixTree {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        RadixTree::find_matches(self, local_hashes)
    }
    fn apply(&mut self, event: &KvEvent) {
        RadixTree::apply(self, event)
    }
    fn remove_worker(&mut self, worker: WorkerId) {
        RadixTree::remove_worker(self, worker)
    }
    fn stats(&self) -> IndexerStats {
        RadixTree::stats(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::sequence_hashes;

    fn blocks(locals: &[u64]) -> (Vec<LocalBlockHash>, Vec<StoredBlock>) {
        let locals: Vec<LocalBlockHash> = locals.iter().map(|&l| LocalBlockHash(l)).collect();
        let seqs = sequence_hashes(&locals);
        let b = locals
            .iter()
            .zip(&seqs)
            .map(|(&local_hash, &seq_hash)| StoredBlock {
                seq_hash,
                local_hash,
            })
            .collect();
        (locals, b)
    }

    fn stored(worker: u32, parent: Option<SequenceHash>, blocks: Vec<StoredBlock>) -> KvEvent {
        KvEvent {
            worker: WorkerId(worker),
            event_id: 0,
            data: KvEventData::Stored { parent, blocks },
        }
    }

    #[test]
    fn contiguous_prefix_scores() {
        let mut t = RadixTree::new();
        let (q, b) = blocks(&[1, 2, 3, 4]);
        t.apply(&stored(0, None, b.clone()));
        t.apply(&stored(1, None, b[..2].to_vec()));
        t.assert_invariants();
        let m = t.find_matches(&q);
        assert_eq!(
            m.scores,
            BTreeMap::from([(WorkerId(0), 4), (WorkerId(1), 2)])
        );
        assert_eq!(
            m.tree_sizes,
            BTreeMap::from([(WorkerId(0), 4), (WorkerId(1), 2)])
        );
        // Worker 0 loses block 1: its contiguous score is 1 even though it holds 2 and 3.
        t.apply(&KvEvent {
            worker: WorkerId(0),
            event_id: 1,
            data: KvEventData::Removed {
                seq_hashes: vec![b[1].seq_hash],
            },
        });
        t.assert_invariants();
        let m = t.find_matches(&q);
        assert_eq!(
            m.scores,
            BTreeMap::from([(WorkerId(0), 1), (WorkerId(1), 2)])
        );
        // Storing it again reconnects the deeper blocks.
        t.apply(&stored(0, Some(b[0].seq_hash), vec![b[1]]));
        assert_eq!(t.find_matches(&q).scores[&WorkerId(0)], 4);
        t.assert_invariants();
    }

    #[test]
    fn unknown_parent_and_hash_are_counted_and_skipped() {
        let mut t = RadixTree::new();
        let (_, b) = blocks(&[1, 2]);
        t.apply(&stored(0, Some(b[0].seq_hash), vec![b[1]]));
        t.apply(&KvEvent {
            worker: WorkerId(0),
            event_id: 1,
            data: KvEventData::Removed {
                seq_hashes: vec![b[0].seq_hash],
            },
        });
        let s = t.stats();
        assert_eq!(s.unknown_parent_events, 1);
        assert_eq!(s.unknown_removed_hashes, 1);
        assert_eq!(t.num_nodes(), 0);
        t.assert_invariants();
    }

    #[test]
    fn clearing_frees_every_node() {
        let mut t = RadixTree::new();
        let (_, b) = blocks(&[5, 6, 7]);
        t.apply(&stored(3, None, b));
        t.apply(&KvEvent {
            worker: WorkerId(3),
            event_id: 1,
            data: KvEventData::Cleared,
        });
        t.assert_invariants();
        assert_eq!(t.num_nodes(), 0);
        assert!(t.tree_sizes().is_empty());
    }
}
