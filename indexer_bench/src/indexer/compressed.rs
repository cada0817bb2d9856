//! The concurrent path-compressed radix tree: lookups run while events are applied.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use servesim::ids::WorkerId;
use servesim::indexer::{
    narrow_active, sorted_insert, sorted_remove, FxHashMap, FxHashSet, IndexerStats, OverlapScores,
};
use servesim::kv::{KvEvent, KvEventData, StoredBlock};
use servesim::tokens::{LocalBlockHash, SequenceHash};

use super::{lock, read, write, ConcurrentKvIndexer};

/// A shared, individually locked node.
type NodeRef = Arc<RwLock<Node>>;

/// A run of blocks that exactly the same workers hold.
#[derive(Debug)]
struct Node {
    /// Local hashes of the run (empty only for the root).
    locals: Vec<LocalBlockHash>,
    /// Sequence hashes of the run, position by position.
    seqs: Vec<SequenceHash>,
    /// Workers holding every block of the run, sorted.
    workers: Vec<WorkerId>,
    /// Children keyed by the first local hash of their run.
    children: FxHashMap<LocalBlockHash, NodeRef>,
    /// The node above (dangling for the root); only the writer reads it.
    parent: Weak<RwLock<Node>>,
    /// False once the node was freed or merged into its parent. A reader that still holds it
    /// sees its last (consistent) contents.
    live: bool,
}

impl Node {
    fn new(parent: Weak<RwLock<Node>>) -> Node {
        Node {
            locals: Vec::new(),
            seqs: Vec::new(),
            workers: Vec::new(),
            children: FxHashMap::default(),
            parent,
            live: true,
        }
    }
}

/// What the writer knows about one worker.
#[derive(Debug, Default)]
struct WorkerState {
    /// Sequence hashes of the blocks it holds.
    blocks: FxHashSet<SequenceHash>,
    /// `event_id` of its last applied event.
    last_event_id: Option<u64>,
}

/// State only the (single) writer touches.
#[derive(Debug, Default)]
struct Writer {
    /// The node holding each sequence hash in the tree.
    lookup: FxHashMap<SequenceHash, NodeRef>,
    /// Per-worker blocks and event ids.
    workers: BTreeMap<WorkerId, WorkerState>,
    /// What happened to the events applied so far.
    stats: IndexerStats,
}

/// A radix tree whose nodes hold runs of blocks (path compression), shared between threads.
///
/// Every node is a run of blocks held by exactly the same workers; runs split when workers
/// diverge inside them and merge again when a node's only child has the same workers, so a
/// 240-block prompt held by one worker is one node and a lookup intersects worker sets once
/// per run instead of once per block.
///
/// Concurrency (std locks only): each node sits behind its own `RwLock`. A lookup holds one
/// node's read lock at a time, walking down, so it never waits for a whole event, only for the
/// node being changed. Events are applied by one writer at a time (a `Mutex` over the
/// writer-only state: the `SequenceHash -> node` map and per-worker block sets); every change a
/// reader can observe is made under the changed node's write lock, so a reader sees each node
/// either before or after a change. A lookup racing an event may see part of it.
///
/// Ordering: a worker's events must be applied in order, which is the caller's job (for
/// example one event thread per worker, or workers hashed onto event threads). As a guard,
/// an event whose `event_id` is not greater than the worker's last applied one is dropped and
/// counted as stale; gaps are accepted. Sequence hashes are assumed to be chain hashes of the
/// local hashes (one sequence hash names one path).
#[derive(Debug)]
pub struct ConcurrentRadixTreeCompressed {
    /// The empty prefix; never freed, never merged.
    root: NodeRef,
    /// Writer-only state; its lock serializes events.
    writer: Mutex<Writer>,
    /// Blocks per worker, published after each event for lookups.
    sizes: RwLock<BTreeMap<WorkerId, usize>>,
}

impl Default for ConcurrentRadixTreeCompressed {
    fn default() -> ConcurrentRadixTreeCompressed {
        ConcurrentRadixTreeCompressed::new()
    }
}

impl ConcurrentRadixTreeCompressed {
    /// An empty tree.
    pub fn new() -> ConcurrentRadixTreeCompressed {
        ConcurrentRadixTreeCompressed {
            root: Arc::new(RwLock::new(Node::new(Weak::new()))),
            writer: Mutex::new(Writer::default()),
            sizes: RwLock::new(BTreeMap::new()),
        }
    }

    /// Contiguous matches and tree sizes.
    pub fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        let mut scores = BTreeMap::new();
        let mut active: Vec<WorkerId> = Vec::new();
        let mut depth = 0u32;
        let mut pos = 0usize;
        let mut next = match local_hashes.first() {
            Some(first) => read(&self.root).children.get(first).cloned(),
            None => None,
        };
        while let Some(node) = next.take() {
            let g = read(&node);
            let rest = &local_hashes[pos..];
            let m = g
                .locals
                .iter()
                .zip(rest)
                .take_while(|(a, b)| a == b)
                .count();
            if m == 0 {
                break;
            }
            if depth == 0 {
                active.extend_from_slice(&g.workers);
            } else {
                narrow_active(&mut active, &g.workers, depth, &mut scores);
            }
            if active.is_empty() {
                break;
            }
            depth += m as u32;
            pos += m;
            if m < g.locals.len() || pos == local_hashes.len() {
                break;
            }
            next = g.children.get(&local_hashes[pos]).cloned();
        }
        for w in active {
            scores.insert(w, depth);
        }
        OverlapScores {
            scores,
            tree_sizes: read(&self.sizes).clone(),
        }
    }

    /// Applies one event (see the type's notes on ordering).
    pub fn apply(&self, event: &KvEvent) {
        let mut wr = lock(&self.writer);
        let worker = event.worker;
        let state = wr.workers.entry(worker).or_default();
        if state
            .last_event_id
            .is_some_and(|last| event.event_id <= last)
        {
            wr.stats.stale_events += 1;
            return;
        }
        state.last_event_id = Some(event.event_id);
        match &event.data {
            KvEventData::Stored { parent, blocks } => {
                if self.store(&mut wr, worker, *parent, blocks) {
                    wr.stats.events_applied += 1;
                } else {
                    wr.stats.unknown_parent_events += 1;
                }
            }
            KvEventData::Removed { seq_hashes } => {
                let mut touched = Vec::new();
                for h in seq_hashes {
                    if !self.remove_block(&mut wr, worker, *h, &mut touched) {
                        wr.stats.unknown_removed_hashes += 1;
                    }
                }
                self.merge_all(&mut wr, touched);
                wr.stats.events_applied += 1;
            }
            KvEventData::Cleared => {
                self.clear_worker(&mut wr, worker);
                wr.stats.events_applied += 1;
            }
        }
        let n = wr.workers.get(&worker).map_or(0, |s| s.blocks.len());
        let mut sizes = write(&self.sizes);
        if n == 0 {
            sizes.remove(&worker);
        } else {
            sizes.insert(worker, n);
        }
    }

    /// Forgets everything about `worker` (its event ids start afresh).
    pub fn remove_worker(&self, worker: WorkerId) {
        let mut wr = lock(&self.writer);
        self.clear_worker(&mut wr, worker);
        wr.workers.remove(&worker);
        write(&self.sizes).remove(&worker);
    }

    /// Event counters.
    pub fn stats(&self) -> IndexerStats {
        lock(&self.writer).stats
    }

    /// Number of nodes, root excluded.
    pub fn num_nodes(&self) -> usize {
        let mut n = 0;
        let mut stack = vec![Arc::clone(&self.root)];
        while let Some(node) = stack.pop() {
            let g = read(&node);
            n += g.children.len();
            stack.extend(g.children.values().cloned());
        }
        n
    }

    /// Checks the internal invariants; panics with a description when one fails. Call it with
    /// no event in flight.
    ///
    /// Runs are non-empty with one sequence hash per block; children are keyed by their first
    /// block and point back at their parent; the lookup map names exactly the blocks in the
    /// tree; worker sets are sorted and agree with the per-worker block sets and tree sizes;
    /// no node is empty and childless; no node has a single child with the same workers
    /// (runs are maximal).
    pub fn assert_invariants(&self) {
        let wr = lock(&self.writer);
        let mut seen_seqs = 0usize;
        let mut per_worker: BTreeMap<WorkerId, usize> = BTreeMap::new();
        let mut stack = vec![Arc::clone(&self.root)];
        while let Some(node) = stack.pop() {
            let g = read(&node);
            assert!(g.live, "dead node reachable");
            let is_root = Arc::ptr_eq(&node, &self.root);
            assert_eq!(g.locals.len(), g.seqs.len());
            assert!(
                g.workers.windows(2).all(|w| w[0] < w[1]),
                "workers unsorted"
            );
            if !is_root {
                assert!(!g.locals.is_empty(), "empty run");
                assert!(
                    !g.workers.is_empty() || !g.children.is_empty(),
                    "empty childless node"
                );
                if g.children.len() == 1 {
                    let only = g.children.values().next().map(|c| read(c).workers.clone());
                    assert_ne!(only.as_ref(), Some(&g.workers), "mergeable run left split");
                }
            }
            for s in &g.seqs {
                let at = wr.lookup.get(s).map(|n| Arc::ptr_eq(n, &node));
                assert_eq!(at, Some(true), "lookup of {s:?} does not point at its node");
                seen_seqs += 1;
            }
            for w in &g.workers {
                *per_worker.entry(*w).or_default() += g.seqs.len();
                let held = wr.workers.get(w).map(|s| &s.blocks);
                for s in &g.seqs {
                    assert!(
                        held.is_some_and(|b| b.contains(s)),
                        "{w} not tracking {s:?}"
                    );
                }
            }
            for (first, child) in &g.children {
                let c = read(child);
                assert_eq!(c.locals.first(), Some(first), "child keyed by wrong hash");
                let back = c.parent.upgrade().map(|p| Arc::ptr_eq(&p, &node));
                assert_eq!(back, Some(true), "child's parent pointer is wrong");
                drop(c);
                stack.push(Arc::clone(child));
            }
        }
        assert_eq!(
            seen_seqs,
            wr.lookup.len(),
            "lookup names blocks not in the tree"
        );
        let held: BTreeMap<WorkerId, usize> = wr
            .workers
            .iter()
            .filter(|(_, s)| !s.blocks.is_empty())
            .map(|(w, s)| (*w, s.blocks.len()))
            .collect();
        assert_eq!(
            per_worker, held,
            "node worker sets vs per-worker block sets"
        );
        assert_eq!(*read(&self.sizes), held, "published tree sizes");
    }

    /// Stores `blocks` under `parent`; false (nothing changed) for an unknown parent.
    fn store(
        &self,
        wr: &mut Writer,
        worker: WorkerId,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> bool {
        // Cursor: a node and how many blocks of its run lie before the insertion point.
        let (mut node, mut consumed) = match parent {
            None => (Arc::clone(&self.root), 0),
            Some(p) => {
                let held = wr
                    .workers
                    .get(&worker)
                    .is_some_and(|s| s.blocks.contains(&p));
                let found = wr.lookup.get(&p).cloned();
                match (held, found) {
                    (true, Some(n)) => {
                        let idx = read(&n).seqs.iter().rposition(|s| *s == p);
                        match idx {
                            Some(i) => (n, i + 1),
                            None => return false,
                        }
                    }
                    _ => return false,
                }
            }
        };
        let mut touched = Vec::new();
        let mut k = 0;
        while k < blocks.len() {
            let (len, m, holds) = {
                let g = read(&node);
                let m = g.locals[consumed.min(g.locals.len())..]
                    .iter()
                    .zip(&blocks[k..])
                    .take_while(|(a, b)| **a == b.local_hash)
                    .count();
                (g.locals.len(), m, g.workers.binary_search(&worker).is_ok())
            };
            if consumed < len {
                if m == 0 {
                    if consumed == 0 {
                        break; // unreachable: children are keyed by their first block
                    }
                    self.split(wr, &node, consumed);
                    continue;
                }
                if holds {
                    consumed += m;
                    k += m;
                    continue;
                }
                let seg = if consumed > 0 {
                    self.split(wr, &node, consumed)
                } else {
                    Arc::clone(&node)
                };
                if m < len - consumed {
                    self.split(wr, &seg, m);
                }
                let seqs = {
                    let mut g = write(&seg);
                    sorted_insert(&mut g.workers, worker);
                    g.seqs.clone()
                };
                wr.workers.entry(worker).or_default().blocks.extend(seqs);
                touched.push(Arc::clone(&seg));
                node = seg;
                consumed = m;
                k += m;
            } else {
                let child = read(&node).children.get(&blocks[k].local_hash).cloned();
                if let Some(c) = child {
                    node = c;
                    consumed = 0;
                    continue;
                }
                let rest = &blocks[k..];
                let mut fresh = Node::new(Arc::downgrade(&node));
                fresh.locals = rest.iter().map(|b| b.local_hash).collect();
                fresh.seqs = rest.iter().map(|b| b.seq_hash).collect();
                fresh.workers = vec![worker];
                let fresh = Arc::new(RwLock::new(fresh));
                for b in rest {
                    wr.lookup.insert(b.seq_hash, Arc::clone(&fresh));
                }
                wr.workers
                    .entry(worker)
                    .or_default()
                    .blocks
                    .extend(rest.iter().map(|b| b.seq_hash));
                write(&node)
                    .children
                    .insert(rest[0].local_hash, Arc::clone(&fresh));
                touched.push(fresh);
                break;
            }
        }
        self.merge_all(wr, touched);
        true
    }

    /// Drops `worker` from block `h`; false when it did not hold it.
    fn remove_block(
        &self,
        wr: &mut Writer,
        worker: WorkerId,
        h: SequenceHash,
        touched: &mut Vec<NodeRef>,
    ) -> bool {
        let held = wr
            .workers
            .get_mut(&worker)
            .is_some_and(|s| s.blocks.remove(&h));
        let Some(node) = wr.lookup.get(&h).cloned().filter(|_| held) else {
            return false;
        };
        let (idx, len) = {
            let g = read(&node);
            (g.seqs.iter().rposition(|s| *s == h), g.seqs.len())
        };
        let Some(idx) = idx else {
            return true;
        };
        let seg = if idx > 0 {
            self.split(wr, &node, idx)
        } else {
            node
        };
        if len - idx > 1 {
            self.split(wr, &seg, 1);
        }
        sorted_remove(&mut write(&seg).workers, worker);
        if let Some(survivor) = self.prune(wr, &seg) {
            touched.push(survivor);
        }
        touched.push(seg);
        true
    }

    /// Drops `worker` from every node (keeps its event id).
    fn clear_worker(&self, wr: &mut Writer, worker: WorkerId) {
        let Some(state) = wr.workers.get_mut(&worker) else {
            return;
        };
        let seqs: Vec<SequenceHash> = state.blocks.drain().collect();
        let mut nodes: Vec<NodeRef> = Vec::new();
        let mut seen = FxHashSet::default();
        for s in seqs {
            if let Some(n) = wr.lookup.get(&s) {
                if seen.insert(Arc::as_ptr(n) as usize) {
                    nodes.push(Arc::clone(n));
                }
            }
        }
        for n in &nodes {
            sorted_remove(&mut write(n).workers, worker);
        }
        let mut touched = Vec::new();
        for n in nodes {
            if let Some(survivor) = self.prune(wr, &n) {
                touched.push(survivor);
            }
            touched.push(n);
        }
        self.merge_all(wr, touched);
    }

    /// Splits `node`'s run before position `at` (0 < at < len): the node keeps the head, a new
    /// child takes the tail, the children and the same workers. Returns the tail.
    fn split(&self, wr: &mut Writer, node: &NodeRef, at: usize) -> NodeRef {
        let mut tail = Node::new(Arc::downgrade(node));
        let tail = {
            let mut g = write(node);
            tail.locals = g.locals.split_off(at);
            tail.seqs = g.seqs.split_off(at);
            tail.workers = g.workers.clone();
            tail.children = std::mem::take(&mut g.children);
            let first = tail.locals[0];
            let tail = Arc::new(RwLock::new(tail));
            g.children.insert(first, Arc::clone(&tail));
            tail
        };
        let t = read(&tail);
        for s in &t.seqs {
            wr.lookup.insert(*s, Arc::clone(&tail));
        }
        for c in t.children.values() {
            write(c).parent = Arc::downgrade(&tail);
        }
        drop(t);
        tail
    }

    /// Frees `node` and its ancestors while they have neither workers nor children; returns
    /// the first ancestor left standing (its child set changed).
    fn prune(&self, wr: &mut Writer, node: &NodeRef) -> Option<NodeRef> {
        let mut cur = Arc::clone(node);
        let mut survivor = None;
        while !Arc::ptr_eq(&cur, &self.root) {
            let (parent, first) = {
                let g = read(&cur);
                if !g.live || !g.workers.is_empty() || !g.children.is_empty() {
                    break;
                }
                (g.parent.upgrade(), g.locals.first().copied())
            };
            let (Some(parent), Some(first)) = (parent, first) else {
                break;
            };
            {
                let mut pg = write(&parent);
                if pg
                    .children
                    .get(&first)
                    .is_some_and(|c| Arc::ptr_eq(c, &cur))
                {
                    pg.children.remove(&first);
                }
            }
            {
                let mut g = write(&cur);
                g.live = false;
                for s in &g.seqs {
                    if wr.lookup.get(s).is_some_and(|n| Arc::ptr_eq(n, &cur)) {
                        wr.lookup.remove(s);
                    }
                }
            }
            survivor = Some(Arc::clone(&parent));
            cur = parent;
        }
        survivor
    }

    /// Restores maximal runs around every touched node.
    fn merge_all(&self, wr: &mut Writer, touched: Vec<NodeRef>) {
        for n in touched {
            let parent = read(&n).parent.upgrade();
            if let Some(p) = parent {
                self.merge_down(wr, &p);
            }
            self.merge_down(wr, &n);
        }
    }

    /// While `node` has a single child with the same workers, absorbs it. The absorbed child
    /// keeps its contents so a reader already holding it still sees a consistent run.
    fn merge_down(&self, wr: &mut Writer, node: &NodeRef) {
        if Arc::ptr_eq(node, &self.root) {
            return;
        }
        loop {
            let child = {
                let g = read(node);
                if !g.live || g.children.len() != 1 {
                    return;
                }
                match g.children.values().next() {
                    Some(c) => Arc::clone(c),
                    None => return,
                }
            };
            let (locals, seqs, children) = {
                let c = read(&child);
                if c.workers != read(node).workers {
                    return;
                }
                (c.locals.clone(), c.seqs.clone(), c.children.clone())
            };
            {
                let mut g = write(node);
                g.locals.extend_from_slice(&locals);
                g.seqs.extend_from_slice(&seqs);
                g.children = children.clone();
            }
            write(&child).live = false;
            for s in seqs {
                wr.lookup.insert(s, Arc::clone(node));
            }
            for c in children.values() {
                write(c).parent = Arc::downgrade(node);
            }
        }
    }
}

impl ConcurrentKvIndexer for ConcurrentRadixTreeCompressed {
    fn find_matches(&self, local_hashes: &[LocalBlockHash]) -> OverlapScores {
        ConcurrentRadixTreeCompressed::find_matches(self, local_hashes)
    }
    fn apply(&self, event: &KvEvent) {
        ConcurrentRadixTreeCompressed::apply(self, event)
    }
    fn remove_worker(&self, worker: WorkerId) {
        ConcurrentRadixTreeCompressed::remove_worker(self, worker)
    }
    fn stats(&self) -> IndexerStats {
        ConcurrentRadixTreeCompressed::stats(self)
    }
}
