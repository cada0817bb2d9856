//! Micro-benchmark of the KV indexers: `find_matches` and event application over tree sizes.
//!
//! Run with: cargo bench --bench indexer
//!
//! Each size is the number of blocks held over all workers (64 workers, prompts of 240 blocks
//! under 3 shared 32-block system prompts, some prompts held by several workers). Inputs come
//! from a fixed seed. `find_matches` throughput counts queries; `apply` throughput counts
//! events (a Stored/Removed pair per prompt, so the tree stays the same size).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use indexer_bench::{IndexerConfig, IndexerKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servesim::ids::WorkerId;
use servesim::indexer::KvIndexer;
use servesim::kv::{KvEvent, KvEventData, StoredBlock};
use servesim::time::{SimDuration, SimTime};
use servesim::tokens::{sequence_hashes, LocalBlockHash, SequenceHash};

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const WORKERS: u32 = 64;
const PROMPT_BLOCKS: usize = 240;
const PREFIX_BLOCKS: usize = 32;
const QUERIES: usize = 256;
const CHURN_PROMPTS: usize = 32;

/// One prompt: its hashes and the worker it lands on.
struct Prompt {
    worker: WorkerId,
    local: Vec<LocalBlockHash>,
    seq: Vec<SequenceHash>,
}

fn prompt(rng: &mut ChaCha8Rng) -> Prompt {
    let family: u64 = rng.gen_range(0..3);
    let local: Vec<LocalBlockHash> = (0..PROMPT_BLOCKS)
        .map(|i| {
            if i < PREFIX_BLOCKS {
                LocalBlockHash(family * 1_000 + i as u64)
            } else {
                LocalBlockHash(rng.gen())
            }
        })
        .collect();
    let seq = sequence_hashes(&local);
    Prompt {
        worker: WorkerId(rng.gen_range(0..WORKERS)),
        local,
        seq,
    }
}

fn stored(p: &Prompt, worker: WorkerId, event_id: u64) -> KvEvent {
    KvEvent {
        worker,
        event_id,
        data: KvEventData::Stored {
            parent: None,
            blocks: p
                .local
                .iter()
                .zip(&p.seq)
                .map(|(&local_hash, &seq_hash)| StoredBlock {
                    seq_hash,
                    local_hash,
                })
                .collect(),
        },
    }
}

/// A seeded workload: the prompts that fill a tree of about `size` blocks, queries, churn.
struct Workload {
    fill: Vec<KvEvent>,
    prompts: Vec<Prompt>,
    queries: Vec<Vec<LocalBlockHash>>,
    churn: Vec<KvEvent>,
}

fn workload(size: usize) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(size as u64);
    let mut prompts = Vec::new();
    let mut fill = Vec::new();
    let mut held = 0;
    let mut next_id = vec![0u64; WORKERS as usize];
    while held < size {
        let p = prompt(&mut rng);
        // A quarter of the prompts are also held by a second worker.
        let mut holders = vec![p.worker];
        if rng.gen_bool(0.25) {
            holders.push(WorkerId(rng.gen_range(0..WORKERS)));
        }
        for w in holders {
            let id = &mut next_id[w.0 as usize];
            fill.push(stored(&p, w, *id));
            *id += 1;
            held += PROMPT_BLOCKS;
        }
        prompts.push(p);
    }
    let queries = (0..QUERIES)
        .map(|_| {
            let p = &prompts[rng.gen_range(0..prompts.len())];
            let keep = rng.gen_range(PREFIX_BLOCKS..=PROMPT_BLOCKS);
            let mut q = p.local[..keep].to_vec();
            q.extend((keep..PROMPT_BLOCKS).map(|_| LocalBlockHash(rng.gen())));
            q
        })
        .collect();
    let mut churn = Vec::new();
    for _ in 0..CHURN_PROMPTS {
        let p = prompt(&mut rng);
        let id = &mut next_id[p.worker.0 as usize];
        churn.push(stored(&p, p.worker, *id));
        churn.push(KvEvent {
            worker: p.worker,
            event_id: *id + 1,
            data: KvEventData::Removed {
                seq_hashes: p.seq.iter().rev().copied().collect(),
            },
        });
        *id += 2;
    }
    Workload {
        fill,
        prompts,
        queries,
        churn,
    }
}

fn build(kind: IndexerKind, w: &Workload) -> Box<dyn KvIndexer + Send> {
    let mut ix = kind.build(&IndexerConfig::default());
    if kind.uses_kv_events() {
        for e in &w.fill {
            ix.apply(e);
        }
    } else {
        for p in &w.prompts {
            // Routing decisions only fail on mismatched lengths, which cannot happen here.
            let _ = ix.record_routing(p.worker, &p.local, &p.seq, SimTime::ZERO);
        }
    }
    ix
}

fn bench_find_matches(c: &mut Criterion) {
    let mut group = c.benchmark_group("find_matches");
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    for size in SIZES {
        let w = workload(size);
        group.throughput(Throughput::Elements(w.queries.len() as u64));
        for kind in IndexerKind::ALL {
            let ix = build(kind, &w);
            group.bench_with_input(BenchmarkId::new(kind.name(), size), &w, |b, w| {
                b.iter(|| {
                    for q in &w.queries {
                        black_box(ix.find_matches(black_box(q)));
                    }
                })
            });
        }
    }
    group.finish();
}

fn bench_apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply");
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(20);
    for size in SIZES {
        let w = workload(size);
        group.throughput(Throughput::Elements(w.churn.len() as u64));
        for kind in IndexerKind::ALL {
            let mut ix = build(kind, &w);
            if kind.uses_kv_events() {
                // Event ids must keep increasing across iterations (the concurrent tree drops
                // stale ones), so each iteration shifts them past the previous one.
                let stride = 2 * CHURN_PROMPTS as u64 + 1;
                let mut events = w.churn.clone();
                group.bench_with_input(BenchmarkId::new(kind.name(), size), &w, |b, _| {
                    b.iter(|| {
                        for e in &mut events {
                            e.event_id += stride;
                            ix.apply(black_box(e));
                        }
                    })
                });
            } else {
                // Approximate mode: one routing decision per churn prompt, time advancing so
                // entries expire.
                let mut now = SimTime::ZERO;
                group.bench_with_input(BenchmarkId::new(kind.name(), size), &w, |b, w| {
                    b.iter(|| {
                        for e in w.churn.iter().step_by(2) {
                            if let KvEventData::Stored { blocks, .. } = &e.data {
                                let local: Vec<LocalBlockHash> =
                                    blocks.iter().map(|b| b.local_hash).collect();
                                let seq: Vec<SequenceHash> =
                                    blocks.iter().map(|b| b.seq_hash).collect();
                                now += SimDuration::from_micros(1_000_000);
                                let _ = ix.record_routing(e.worker, &local, &seq, now);
                            }
                        }
                    })
                });
            }
        }
    }
    group.finish();
}

/// Every group, with criterion's command-line configuration.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench_find_matches(&mut c);
    bench_apply(&mut c);
}

criterion_main!(benches);
