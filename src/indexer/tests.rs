//! Differential and concurrency tests: every event-driven indexer must answer like `RadixTree`.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::kv::event::{KvEventData, StoredBlock};
use crate::tokens::sequence_hashes;

/// One step of a generated workload.
#[derive(Clone, Debug)]
enum Op {
    Event(KvEvent),
    RemoveWorker(WorkerId),
    Lookup(Vec<LocalBlockHash>),
}

/// A known sequence: local and chained hashes.
#[derive(Clone, Debug)]
struct Seq {
    local: Vec<LocalBlockHash>,
    seq: Vec<SequenceHash>,
}

impl Seq {
    fn new(local: Vec<LocalBlockHash>) -> Seq {
        let seq = sequence_hashes(&local);
        Seq { local, seq }
    }
    fn blocks(&self, from: usize, to: usize) -> Vec<StoredBlock> {
        (from..to)
            .map(|i| StoredBlock {
                seq_hash: self.seq[i],
                local_hash: self.local[i],
            })
            .collect()
    }
}

/// Workload settings.
struct Gen {
    workers: u32,
    families: u64,
    steps: usize,
    max_len: usize,
    /// Allow remove_worker ops.
    remove_workers: bool,
}

/// Generates a seeded op stream, using a reference tree to know what each worker holds.
fn generate(g: &Gen, seed: u64) -> (Vec<Op>, Vec<Seq>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut truth = RadixTree::new();
    let mut next_id: BTreeMap<WorkerId, u64> = BTreeMap::new();
    let mut pool: Vec<Seq> = Vec::new();
    let mut ops = Vec::new();
    let event = |w: WorkerId, data: KvEventData, next_id: &mut BTreeMap<WorkerId, u64>| {
        let id = next_id.entry(w).or_insert(0);
        let e = KvEvent {
            worker: w,
            event_id: *id,
            data,
        };
        *id += 1;
        e
    };
    for _ in 0..g.steps {
        // Grow the pool: a fresh family sequence, or an extension of a known one.
        if pool.len() < 8 || rng.gen_bool(0.15) {
            let mut local: Vec<LocalBlockHash> = if !pool.is_empty() && rng.gen_bool(0.5) {
                let base = &pool[rng.gen_range(0..pool.len())];
                let cut = rng.gen_range(1..=base.local.len());
                base.local[..cut].to_vec()
            } else {
                let f = rng.gen_range(0..g.families);
                let plen = rng.gen_range(1..5);
                (0..plen).map(|i| LocalBlockHash(f * 1000 + i)).collect()
            };
            let extra = rng.gen_range(0..g.max_len / 2);
            for _ in 0..extra {
                if local.len() >= g.max_len {
                    break;
                }
                local.push(LocalBlockHash(rng.gen_range(0..4)));
            }
            if local.is_empty() {
                local.push(LocalBlockHash(rng.gen_range(0..4)));
            }
            pool.push(Seq::new(local));
        }
        let w = WorkerId(rng.gen_range(0..g.workers));
        let s = &pool[rng.gen_range(0..pool.len())];
        let held = (0..s.seq.len())
            .take_while(|&i| truth.holds(w, s.seq[i]))
            .count();
        let held_any: Vec<usize> = (0..s.seq.len())
            .filter(|&i| truth.holds(w, s.seq[i]))
            .collect();
        let op = match rng.gen_range(0..100) {
            // Store from the root.
            0..=24 => {
                let end = rng.gen_range(1..=s.local.len());
                Op::Event(event(
                    w,
                    KvEventData::Stored {
                        parent: None,
                        blocks: s.blocks(0, end),
                    },
                    &mut next_id,
                ))
            }
            // Continuation below a held block, possibly deep in the chain.
            25..=49 if !held_any.is_empty() => {
                let j = *held_any.choose(&mut rng).unwrap_or(&0);
                if j + 1 >= s.local.len() {
                    Op::Lookup(s.local.clone())
                } else {
                    let end = rng.gen_range(j + 2..=s.local.len());
                    Op::Event(event(
                        w,
                        KvEventData::Stored {
                            parent: Some(s.seq[j]),
                            blocks: s.blocks(j + 1, end),
                        },
                        &mut next_id,
                    ))
                }
            }
            // Unknown parent.
            50..=52 => Op::Event(event(
                w,
                KvEventData::Stored {
                    parent: Some(SequenceHash(rng.gen())),
                    blocks: s.blocks(0, 1),
                },
                &mut next_id,
            )),
            // LRU-like: remove a suffix of the held prefix, tail first.
            53..=62 if held > 0 => {
                let from = rng.gen_range(0..held);
                let mut hashes: Vec<SequenceHash> = s.seq[from..held].to_vec();
                hashes.reverse();
                Op::Event(event(
                    w,
                    KvEventData::Removed { seq_hashes: hashes },
                    &mut next_id,
                ))
            }
            // Arbitrary held blocks, plus sometimes an unknown one.
            63..=72 if !held_any.is_empty() => {
                let n = rng.gen_range(1..=held_any.len().min(3));
                let mut hashes: Vec<SequenceHash> = held_any
                    .choose_multiple(&mut rng, n)
                    .map(|&i| s.seq[i])
                    .collect();
                if rng.gen_bool(0.2) {
                    hashes.push(SequenceHash(rng.gen()));
                }
                Op::Event(event(
                    w,
                    KvEventData::Removed { seq_hashes: hashes },
                    &mut next_id,
                ))
            }
            73..=74 => Op::Event(event(w, KvEventData::Cleared, &mut next_id)),
            75 if g.remove_workers => {
                next_id.remove(&w);
                Op::RemoveWorker(w)
            }
            // Lookups: prefixes (shallow ones included), divergent and unknown queries.
            _ => {
                let mut q = s.local[..rng.gen_range(0..=s.local.len())].to_vec();
                match rng.gen_range(0..10) {
                    0 => q = vec![LocalBlockHash(rng.gen_range(5000..6000)); 3],
                    1 if !q.is_empty() => {
                        let i = rng.gen_range(0..q.len());
                        q[i] = LocalBlockHash(rng.gen_range(0..4));
                    }
                    _ => {}
                }
                Op::Lookup(q)
            }
        };
        match &op {
            Op::Event(e) => truth.apply(e),
            Op::RemoveWorker(w) => truth.remove_worker(*w),
            Op::Lookup(_) => {}
        }
        ops.push(op);
    }
    (ops, pool)
}

/// Every lookup of every prefix of every pool sequence (plus tree sizes).
fn snapshot<I: KvIndexer + ?Sized>(ix: &I, pool: &[Seq]) -> Vec<OverlapScores> {
    let mut out = Vec::new();
    for s in pool {
        for n in 0..=s.local.len() {
            out.push(ix.find_matches(&s.local[..n]));
        }
    }
    out
}

/// The event-driven variants under test, each with its invariant check.
struct Variants {
    crtc: ConcurrentRadixTreeCompressed,
    sharded: Vec<BranchSharded>,
    locked: Locked<RadixTree>,
    flat: FlatIndex,
}

impl Variants {
    fn new() -> Variants {
        Variants {
            crtc: ConcurrentRadixTreeCompressed::new(),
            sharded: vec![
                BranchSharded::new(4, 2),
                BranchSharded::new(3, 1),
                BranchSharded::new(2, 3),
                BranchSharded::new(5, 5),
            ],
            locked: Locked::new(RadixTree::new()),
            flat: FlatIndex::new(),
        }
    }
    fn all(&mut self) -> Vec<(String, &mut dyn KvIndexer)> {
        let mut v: Vec<(String, &mut dyn KvIndexer)> = Vec::new();
        v.push(("crtc".into(), &mut self.crtc));
        for s in &mut self.sharded {
            let name = format!("sharded {}x{}", s.num_shards(), s.prefix_depth());
            v.push((name, s));
        }
        v.push(("locked".into(), &mut self.locked));
        v.push(("flat".into(), &mut self.flat));
        v
    }
    fn assert_invariants(&self) {
        self.crtc.assert_invariants();
        self.flat.assert_invariants();
        for s in &self.sharded {
            s.assert_invariants();
        }
    }
}

fn run_differential(g: &Gen, seed: u64, check_every: usize) {
    let (ops, pool) = generate(g, seed);
    let mut reference = RadixTree::new();
    let mut variants = Variants::new();
    let mut lookups = 0;
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Event(e) => {
                reference.apply(e);
                for (_, v) in variants.all() {
                    v.apply(e);
                }
            }
            Op::RemoveWorker(w) => {
                reference.remove_worker(*w);
                for (_, v) in variants.all() {
                    v.remove_worker(*w);
                }
            }
            Op::Lookup(q) => {
                lookups += 1;
                let expect = reference.find_matches(q);
                for (name, v) in variants.all() {
                    assert_eq!(v.find_matches(q), expect, "{name} at step {step}: {q:?}");
                }
            }
        }
        if step % check_every == 0 {
            reference.assert_invariants();
            variants.assert_invariants();
        }
    }
    reference.assert_invariants();
    variants.assert_invariants();
    assert!(lookups > g.steps / 10, "too few lookups: {lookups}");
    let expect = snapshot(&reference, &pool);
    let stats = reference.stats();
    assert!(stats.unknown_parent_events > 0 && stats.unknown_removed_hashes > 0);
    for (name, v) in variants.all() {
        assert_eq!(snapshot(&*v, &pool), expect, "{name} final state");
        assert_eq!(v.stats(), stats, "{name} stats");
    }
}

#[test]
fn reference_invariants_hold_on_random_operations() {
    let (ops, _) = generate(
        &Gen {
            workers: 6,
            families: 2,
            steps: 3000,
            max_len: 12,
            remove_workers: true,
        },
        1,
    );
    let mut t = RadixTree::new();
    for op in &ops {
        match op {
            Op::Event(e) => t.apply(e),
            Op::RemoveWorker(w) => t.remove_worker(*w),
            Op::Lookup(q) => {
                let m = t.find_matches(q);
                assert!(m.scores.values().all(|&s| s as usize <= q.len() && s > 0));
            }
        }
        t.assert_invariants();
    }
}

#[test]
fn all_variants_match_the_reference_small() {
    for seed in 0..3 {
        run_differential(
            &Gen {
                workers: 8,
                families: 2,
                steps: 1500,
                max_len: 10,
                remove_workers: true,
            },
            seed,
            1,
        );
    }
}

#[test]
fn all_variants_match_the_reference_many_workers() {
    run_differential(
        &Gen {
            workers: 48,
            families: 3,
            steps: 8000,
            max_len: 40,
            remove_workers: true,
        },
        42,
        50,
    );
}

/// Queries shorter than K blocks, and queries that share only the first blocks with a branch
/// stored in another shard: Dynamo's first branch-sharded indexer missed both.
#[test]
fn branch_sharded_is_exact_on_shallow_queries() {
    let seq = |v: &[u64]| Seq::new(v.iter().map(|&x| LocalBlockHash(x)).collect());
    for k in 1..=4 {
        let sharded = BranchSharded::new(8, k);
        let mut reference = RadixTree::new();
        // Many branches under one 1-block system prompt, each on its own worker, so their
        // deep parts spread over the shards.
        let mut all = Vec::new();
        for w in 0..16u32 {
            let s = seq(&[7, 100 + u64::from(w), 200, 300, 400]);
            let e = KvEvent {
                worker: WorkerId(w),
                event_id: 0,
                data: KvEventData::Stored {
                    parent: None,
                    blocks: s.blocks(0, 2),
                },
            };
            // Continuation crossing the K boundary, with its parent at block 1.
            let cont = KvEvent {
                worker: WorkerId(w),
                event_id: 1,
                data: KvEventData::Stored {
                    parent: Some(s.seq[1]),
                    blocks: s.blocks(2, 5),
                },
            };
            for e in [&e, &cont] {
                sharded.apply(e);
                reference.apply(e);
            }
            all.push(s);
        }
        sharded.assert_invariants();
        let mut queries: Vec<Vec<LocalBlockHash>> = vec![vec![], vec![LocalBlockHash(7)]];
        for s in &all {
            for n in 1..=s.local.len() {
                queries.push(s.local[..n].to_vec());
            }
        }
        // Shares block 0 with everyone, then diverges.
        queries.push(seq(&[7, 999, 200]).local);
        for q in &queries {
            let got = sharded.find_matches(q);
            assert_eq!(got, reference.find_matches(q), "k={k} query {q:?}");
        }
        // The one-block query sees all 16 workers.
        assert_eq!(sharded.find_matches(&[LocalBlockHash(7)]).scores.len(), 16);
        // A diverging query still scores 1 for every worker.
        let m = sharded.find_matches(&seq(&[7, 999]).local);
        assert_eq!(m.scores.values().copied().collect::<Vec<_>>(), vec![1; 16]);
        // Evicting the shared first block from a worker removes it from every shard.
        let s = &all[3];
        let rm = KvEvent {
            worker: WorkerId(3),
            event_id: 2,
            data: KvEventData::Removed {
                seq_hashes: vec![s.seq[0]],
            },
        };
        sharded.apply(&rm);
        reference.apply(&rm);
        sharded.assert_invariants();
        for q in &queries {
            assert_eq!(sharded.find_matches(q), reference.find_matches(q));
        }
    }
}

#[test]
fn crtc_drops_stale_events() {
    let t = ConcurrentRadixTreeCompressed::new();
    let s = Seq::new(vec![LocalBlockHash(1), LocalBlockHash(2)]);
    let e = |id, data| KvEvent {
        worker: WorkerId(0),
        event_id: id,
        data,
    };
    t.apply(&e(
        5,
        KvEventData::Stored {
            parent: None,
            blocks: s.blocks(0, 2),
        },
    ));
    t.apply(&e(5, KvEventData::Cleared));
    t.apply(&e(3, KvEventData::Cleared));
    assert_eq!(t.stats().stale_events, 2);
    assert_eq!(t.find_matches(&s.local).scores[&WorkerId(0)], 2);
    assert_eq!(t.num_nodes(), 1);
    t.assert_invariants();
}

/// Writers apply per-worker streams from several threads while readers query; the final state
/// must equal the reference's.
#[test]
fn concurrent_variants_match_reference_under_threads() {
    let g = Gen {
        workers: 32,
        families: 3,
        steps: 6000,
        max_len: 30,
        remove_workers: true,
    };
    let (ops, pool) = generate(&g, 9);
    let mut reference = RadixTree::new();
    let mut per_worker: BTreeMap<WorkerId, Vec<Op>> = BTreeMap::new();
    let mut queries = Vec::new();
    for op in &ops {
        match op {
            Op::Event(e) => {
                reference.apply(e);
                per_worker.entry(e.worker).or_default().push(op.clone());
            }
            Op::RemoveWorker(w) => {
                reference.remove_worker(*w);
                per_worker.entry(*w).or_default().push(op.clone());
            }
            Op::Lookup(q) => queries.push(q.clone()),
        }
    }
    let expect = snapshot(&reference, &pool);
    let indexers: Vec<(&str, Box<dyn ConcurrentKvIndexer>)> = vec![
        ("crtc", Box::new(ConcurrentRadixTreeCompressed::new())),
        ("sharded", Box::new(BranchSharded::new(4, 2))),
        ("locked", Box::new(Locked::new(RadixTree::new()))),
    ];
    const WRITERS: usize = 4;
    for (name, ix) in &indexers {
        let ix: &dyn ConcurrentKvIndexer = ix.as_ref();
        let done = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for t in 0..WRITERS {
                let streams: Vec<&Vec<Op>> = per_worker
                    .iter()
                    .filter(|(w, _)| w.0 as usize % WRITERS == t)
                    .map(|(_, v)| v)
                    .collect();
                let done = &done;
                scope.spawn(move || {
                    // Interleave this thread's workers round-robin, each in its own order.
                    let mut cursors = vec![0usize; streams.len()];
                    let mut left = true;
                    while left {
                        left = false;
                        for (i, s) in streams.iter().enumerate() {
                            if let Some(op) = s.get(cursors[i]) {
                                cursors[i] += 1;
                                left = true;
                                match op {
                                    Op::Event(e) => ix.apply(e),
                                    Op::RemoveWorker(w) => ix.remove_worker(*w),
                                    Op::Lookup(_) => {}
                                }
                            }
                        }
                    }
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
            for r in 0..2 {
                let queries = &queries;
                let done = &done;
                scope.spawn(move || {
                    let mut i = r;
                    while done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS {
                        let q = &queries[i % queries.len()];
                        let m = ix.find_matches(q);
                        assert!(m.scores.values().all(|&s| s > 0 && s as usize <= q.len()));
                        i += 1;
                    }
                });
            }
        });
        assert_eq!(snapshot(ix, &pool), expect, "{name} final state");
        assert_eq!(ix.stats(), reference.stats(), "{name} stats");
    }
}

#[test]
fn kinds_parse_and_print_kebab_case() -> anyhow::Result<()> {
    for k in IndexerKind::ALL {
        assert_eq!(k.to_string().parse::<IndexerKind>()?, k);
        let mut ix = k.build(&IndexerConfig::default());
        let s = Seq::new(vec![LocalBlockHash(1), LocalBlockHash(2)]);
        ix.apply(&KvEvent {
            worker: WorkerId(1),
            event_id: 0,
            data: KvEventData::Stored {
                parent: None,
                blocks: s.blocks(0, 2),
            },
        });
        ix.record_routing(WorkerId(2), &s.local, &s.seq, crate::time::SimTime(0))?;
        let m = ix.find_matches(&s.local);
        let expect = if k.uses_kv_events() {
            WorkerId(1)
        } else {
            WorkerId(2)
        };
        assert_eq!(m.scores, BTreeMap::from([(expect, 2)]), "{k}");
    }
    assert_eq!(
        "concurrent-radix-tree-compressed".parse::<IndexerKind>()?,
        IndexerKind::ConcurrentRadixTreeCompressed
    );
    assert!(matches!(
        "nested-map".parse::<IndexerKind>(),
        Err(IndexerError::UnknownKind(_))
    ));
    Ok(())
}
