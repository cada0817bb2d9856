#![allow(clippy::unwrap_used)]

use std::time::Duration;

use servesim::kv::KvEventData;
use servesim::scheduler::EngineConfig;
use servesim::trace::{parse, TraceOptions};

use super::workload::{duplicate_hash_space, expand_hash_prefix_depth, partition_by_session};
use super::*;

const TRACE: &str = r#"{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 5, "session_id": "s", "input_length": 120, "output_length": 2, "hash_ids": [1, 2, 3]}
{"session_id": "s", "delay": 10, "input_length": 150, "output_length": 2, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 9, "input_length": 64, "output_length": 1, "hash_ids": [7]}
"#;

fn trace() -> servesim::trace::Trace {
    let opts = TraceOptions {
        trace_block_size: 40,
        arrival_speedup_ratio: 1.0,
    };
    parse(TRACE.as_bytes(), "inline", &opts).unwrap()
}

fn config(n: usize, d: usize) -> WorkloadConfig {
    WorkloadConfig {
        num_unique_workers: n,
        worker_duplication_factor: d,
        trace_length_factor: 1,
        trace_duplication_factor: 1,
        trace_block_size: 40,
        engine: EngineConfig {
            block_size: 8,
            num_gpu_blocks: 64,
            ..EngineConfig::default()
        },
        seed: 7,
    }
}

#[test]
fn length_factor_expands_ids_and_lengths() {
    let mut t = trace();
    expand_hash_prefix_depth(&mut t, 3);
    let first = &t.sessions[0].turns[0];
    assert_eq!(first.hash_ids, vec![3, 4, 5, 6, 7, 8]);
    assert_eq!(first.input_length, 240, "80 tokens (clamped to 2 x 40) x 3");
}

#[test]
fn duplication_offsets_hash_space_and_renames_sessions() {
    let t = duplicate_hash_space(&trace(), 2);
    assert_eq!(t.sessions.len(), 6);
    assert_eq!(t.sessions[3].turns[0].hash_ids, vec![9, 10]);
    assert_eq!(t.sessions[4].id, "s:copy_1");
    assert_eq!(t.num_requests(), 8);
}

#[test]
fn partition_keeps_every_session_once() {
    let t = trace();
    let parts = partition_by_session(&t, 2, 1);
    let n: usize = parts.iter().map(Vec::len).sum();
    assert_eq!(n, t.sessions.len());
    assert_eq!(parts, partition_by_session(&t, 2, 1));
}

#[test]
fn workload_counts_requests_and_orders_events_per_worker() {
    let w = prepare(&trace(), &config(2, 3)).unwrap();
    assert_eq!(w.workers.len(), 6);
    assert_eq!(w.totals.requests, 4 * 3);
    assert!(w.totals.stored_events > 0);
    for tl in &w.workers {
        let ids: Vec<u64> = tl
            .ops
            .iter()
            .filter_map(|o| match &o.op {
                Op::Event(e) => {
                    assert_eq!(e.worker, tl.worker);
                    Some(e.event_id)
                }
                Op::Lookup { .. } => None,
            })
            .collect();
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");
        assert!(tl.ops.windows(2).all(|p| p[0].at <= p[1].at));
    }
    // Input lengths clamp to the hash ids: 80, 120, 150 and 40 tokens: 10, 15, 18, 5 blocks of 8.
    let lookup_blocks: u64 = w
        .workers
        .iter()
        .flat_map(|t| &t.ops)
        .map(|o| match &o.op {
            Op::Lookup { local, .. } => local.len() as u64,
            Op::Event(_) => 0,
        })
        .sum();
    assert_eq!(lookup_blocks, w.totals.request_blocks);
    assert_eq!(w.totals.request_blocks, 3 * (10 + 15 + 18 + 5));
    assert_eq!(prepare(&trace(), &config(2, 3)).unwrap(), w);
}

#[test]
fn zero_settings_are_rejected() {
    assert!(prepare(&trace(), &config(0, 1)).is_err());
    assert!(prepare(&trace(), &config(1, 0)).is_err());
}

#[test]
fn open_loop_completes_every_operation() {
    let w = prepare(&trace(), &config(2, 2)).unwrap();
    let run_config = RunConfig {
        benchmark_duration: Duration::from_millis(30),
        ..RunConfig::default()
    };
    for kind in IndexerKind::ALL {
        let r = run(&w, kind, &IndexerConfig::default(), &run_config);
        // Only the wall-clock criterion may fail on a loaded test machine.
        assert!(
            r.failure_reasons
                .iter()
                .all(|f| f.starts_with("issuing took")),
            "{kind}: {:?}",
            r.failure_reasons
        );
        assert_eq!(r.totals.requests, w.totals.requests, "{kind}");
        assert_eq!(r.query_service.count, w.totals.requests, "{kind}");
        if kind.uses_kv_events() {
            assert_eq!(r.totals.events, w.totals.events);
            assert_eq!(r.totals.block_ops, w.totals.block_ops());
            assert_eq!(r.indexer_stats.events_applied, w.totals.events, "{kind}");
            assert_eq!(r.indexer_stats.unknown_parent_events, 0, "{kind}");
        } else {
            assert_eq!(r.totals.events, 0);
            assert_eq!(r.totals.routing_writes, w.totals.requests);
        }
        assert_eq!(
            r.update_accepted_to_finished.count,
            r.totals.logical_ops - r.totals.requests
        );
    }
}

#[test]
fn stored_events_replay_into_the_reference_answers() {
    // Applying the workload in timeline order leaves every worker's lookups answerable.
    let w = prepare(&trace(), &config(1, 1)).unwrap();
    let mut tree = servesim::indexer::RadixTree::new();
    let mut last_lookup = None;
    for op in &w.workers[0].ops {
        match &op.op {
            Op::Event(e) => {
                assert!(!matches!(e.data, KvEventData::Cleared));
                servesim::indexer::KvIndexer::apply(&mut tree, e);
            }
            Op::Lookup { local, .. } => last_lookup = Some(local.clone()),
        }
    }
    let local = last_lookup.unwrap();
    let scores = servesim::indexer::KvIndexer::find_matches(&tree, &local);
    assert!(scores.scores.values().all(|&s| s as usize <= local.len()));
}

#[test]
fn sweep_windows_are_log_spaced_longest_first() {
    assert_eq!(sweep_windows(1000, 50000, 1), vec![50000]);
    let w = sweep_windows(1000, 100_000, 3);
    assert_eq!(w, vec![100_000, 10_000, 1000]);
}
