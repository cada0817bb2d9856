//! Differential and concurrency tests: every concurrent indexer must answer like the engine's
//! `RadixTree`.

use std::collections::BTreeMap;

use servesim::indexer::testing::{generate, run_differential, snapshot, Gen, Op, Seq, Variants};
use servesim::indexer::{FlatIndex, KvIndexer, RadixTree};
use servesim::kv::{KvEvent, KvEventData};
use servesim::time::SimTime;
use servesim::tokens::LocalBlockHash;

use super::*;

/// The concurrent variants under test (and the router's flat map), each with its invariant check.
struct Concurrent {
    crtc: ConcurrentRadixTreeCompressed,
    sharded: Vec<BranchSharded>,
    locked: Locked<RadixTree>,
    flat: FlatIndex,
}

impl Concurrent {
    fn new() -> Concurrent {
        Concurrent {
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
}

impl Variants for Concurrent {
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
            &mut Concurrent::new(),
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
        &mut Concurrent::new(),
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
        ix.record_routing(WorkerId(2), &s.local, &s.seq, SimTime::from_micros(0))?;
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
        Err(UnknownIndexer(_))
    ));
    Ok(())
}
