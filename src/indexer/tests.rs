//! Differential tests: the router's event-driven indexer must answer like `RadixTree`.
//! (The benchmark's concurrent indexers have the same tests in `indexer_bench`.)

use super::testing::{generate, run_differential, Gen, Op, Variants};
use super::*;

/// The router's event-driven indexer.
struct Flat(FlatIndex);

impl Variants for Flat {
    fn all(&mut self) -> Vec<(String, &mut dyn KvIndexer)> {
        vec![("flat".into(), &mut self.0)]
    }
    fn assert_invariants(&self) {
        self.0.assert_invariants();
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
fn flat_matches_the_reference_small() {
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
            &mut Flat(FlatIndex::new()),
        );
    }
}

#[test]
fn flat_matches_the_reference_many_workers() {
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
        &mut Flat(FlatIndex::new()),
    );
}
