//! Seeded operation streams for indexer tests: the generator and the differential driver that
//! hold every indexer to [`RadixTree`]'s answers. Compiled for this crate's tests and, with the
//! `test-support` feature, for other crates' tests (the benchmark's concurrent indexers).

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{KvIndexer, OverlapScores, RadixTree};
use crate::ids::WorkerId;
use crate::kv::event::{KvEvent, KvEventData, StoredBlock};
use crate::tokens::{sequence_hashes, LocalBlockHash, SequenceHash};

/// One step of a generated workload.
#[derive(Clone, Debug)]
pub enum Op {
    /// Apply a KV event.
    Event(KvEvent),
    /// Forget a worker.
    RemoveWorker(WorkerId),
    /// Look these hashes up.
    Lookup(Vec<LocalBlockHash>),
}

/// A known sequence: local and chained hashes.
#[derive(Clone, Debug)]
pub struct Seq {
    /// Local block hashes.
    pub local: Vec<LocalBlockHash>,
    /// Sequence hashes chaining `local`.
    pub seq: Vec<SequenceHash>,
}

impl Seq {
    /// The sequence of these local hashes.
    pub fn new(local: Vec<LocalBlockHash>) -> Seq {
        let seq = sequence_hashes(&local);
        Seq { local, seq }
    }
    /// Blocks `from..to` as a Stored event carries them.
    pub fn blocks(&self, from: usize, to: usize) -> Vec<StoredBlock> {
        (from..to)
            .map(|i| StoredBlock {
                seq_hash: self.seq[i],
                local_hash: self.local[i],
            })
            .collect()
    }
}

/// Workload settings.
#[derive(Clone, Debug)]
pub struct Gen {
    /// Workers the operations are spread over.
    pub workers: u32,
    /// Distinct system-prompt families sequences start from.
    pub families: u64,
    /// Operations generated.
    pub steps: usize,
    /// Longest sequence, in blocks.
    pub max_len: usize,
    /// Allow remove_worker ops.
    pub remove_workers: bool,
}

/// Generates a seeded op stream, using a reference tree to know what each worker holds; returns
/// the ops and every sequence they were drawn from.
pub fn generate(g: &Gen, seed: u64) -> (Vec<Op>, Vec<Seq>) {
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
pub fn snapshot<I: KvIndexer + ?Sized>(ix: &I, pool: &[Seq]) -> Vec<OverlapScores> {
    let mut out = Vec::new();
    for s in pool {
        for n in 0..=s.local.len() {
            out.push(ix.find_matches(&s.local[..n]));
        }
    }
    out
}

/// The indexers under differential test, each with its invariant check.
pub trait Variants {
    /// Every indexer under test, named for failure messages.
    fn all(&mut self) -> Vec<(String, &mut dyn KvIndexer)>;
    /// Checks every indexer's internal invariants; panics otherwise.
    fn assert_invariants(&self);
}

/// Drives `variants` and a reference [`RadixTree`] with the same generated stream: every lookup,
/// the final answers for every prefix of every sequence and the event counters must be equal;
/// invariants are checked every `check_every` steps. Panics on the first difference.
pub fn run_differential(g: &Gen, seed: u64, check_every: usize, variants: &mut dyn Variants) {
    let (ops, pool) = generate(g, seed);
    let mut reference = RadixTree::new();
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
