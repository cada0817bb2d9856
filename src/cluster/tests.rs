//! Cluster tests: disaggregated hand-offs, the host tier, and random operations on every
//! engine and router.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::kv::{G2Config, KvEventData};
use crate::perf::Fixed;
use crate::request::Prompt;
use crate::router::{RouterConfig, RouterMode};
use crate::time::SimDuration;

const BS: usize = 4;

fn engine(num_gpu_blocks: usize) -> EngineConfig {
    let mut e = EngineConfig {
        block_size: BS,
        num_gpu_blocks,
        ..EngineConfig::default()
    };
    e.latency.model = Arc::new(Fixed {
        prefill_ms: 20.0,
        decode_ms: 5.0,
    });
    e
}

fn disagg(bandwidth_gbps: f64, timing_mode: KvTransferTimingMode) -> ClusterConfig {
    ClusterConfig {
        engine: engine(64),
        serving: ServingMode::Disagg {
            num_prefill_workers: 1,
            num_decode_workers: 1,
            kv_transfer: KvTransferConfig {
                // 1 MB per token at 1 GB/s: 1 ms per token.
                kv_bytes_per_token: Some(1_000_000),
                bandwidth_gbps,
                timing_mode,
            },
        },
        ..ClusterConfig::default()
    }
}

fn request(tokens: &[u32], out: usize) -> EngineRequest {
    EngineRequest {
        prompt: Prompt::from_tokens(tokens, BS),
        max_output_tokens: out,
        output_tokens: Vec::new(),
    }
}

/// Drives the cluster from event to event until idle, checking invariants at every step.
fn run(c: &mut Cluster) -> Vec<Output> {
    let mut out = Vec::new();
    while let Some(t) = c.next_event_time() {
        out.extend(c.advance(t));
        c.assert_invariants();
    }
    out
}

fn token_times(out: &[Output], id: RequestId) -> Vec<u64> {
    out.iter()
        .filter_map(|o| match o {
            Output::Token { id: i, time, .. } if *i == id => Some(time.as_micros() / 1000),
            _ => None,
        })
        .collect()
}

#[test]
fn disagg_adds_the_transfer_time_exactly_once() {
    // Prefill 20 ms (hidden token), 10 prompt tokens at 1 ms each over the link, then the
    // decode worker emits the first token after one 5 ms decode step: no prefill there.
    let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::FullPrompt)).unwrap();
    let id = c
        .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
        .expect("accepted");
    let out = run(&mut c);
    assert_eq!(token_times(&out, id), vec![20 + 10 + 5, 40, 45]);
    let transfers: Vec<&Output> = out
        .iter()
        .filter(|o| matches!(o, Output::KvTransfer { .. }))
        .collect();
    assert_eq!(
        transfers,
        vec![&Output::KvTransfer {
            id,
            from: WorkerId(0),
            to: WorkerId(1),
            time: SimTime::from_micros(20_000),
            tokens: 10,
            duration: SimDuration::from_micros(10_000),
        }]
    );
    let admitted: Vec<&Output> = out
        .iter()
        .filter(|o| matches!(o, Output::Admitted { .. }))
        .collect();
    assert_eq!(
        admitted.len(),
        1,
        "only the decode-side admission is visible"
    );
    assert!(matches!(
        admitted[0],
        Output::Admitted {
            worker: WorkerId(1),
            time,
            ..
        } if *time == SimTime::from_micros(30_000)
    ));
    let stats = c.snapshot();
    assert_eq!((stats.kv_transfers, stats.kv_transfer_ns), (1, 10_000_000));
    // The prefill worker ran one 20 ms pass; the decode worker only 5 ms decode steps.
    assert_eq!(stats.workers[0].busy_ns, 20_000_000);
    assert_eq!(stats.workers[1].busy_ns, 15_000_000);
    assert_eq!(stats.workers[1].passes, 3);
    assert_eq!(stats.active_requests, 0);

    // Bandwidth 0 disables the delay.
    let mut c = Cluster::new(disagg(0.0, KvTransferTimingMode::FullPrompt)).unwrap();
    let id = c
        .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
        .expect("accepted");
    assert_eq!(token_times(&run(&mut c), id), vec![25, 30, 35]);
}

#[test]
fn destination_missing_charges_only_what_the_decode_worker_lacks() {
    let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::DestinationMissing)).unwrap();
    let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    c.submit(request(&prompt, 2), SimTime::ZERO)
        .expect("accepted");
    run(&mut c);
    let t = SimTime::from_micros(100_000);
    let id = c.submit(request(&prompt, 2), t).expect("accepted");
    let out = run(&mut c);
    // Both full blocks are cached at the decode worker: only the 2 tail tokens move.
    assert!(out.contains(&Output::KvTransfer {
        id,
        from: WorkerId(0),
        to: WorkerId(1),
        time: SimTime::from_micros(120_000),
        tokens: 2,
        duration: SimDuration::from_micros(2_000),
    }));
    // The prefill worker reused its 8 cached tokens; that is the reported reuse.
    assert!(out.iter().any(|o| matches!(
        o,
        Output::Admitted {
            reused_tokens: 8,
            ..
        }
    )));
}

#[test]
fn cancel_during_the_hand_off_frees_everything() {
    let mut c = Cluster::new(disagg(1.0, KvTransferTimingMode::FullPrompt)).unwrap();
    let id = c
        .submit(request(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 3), SimTime::ZERO)
        .expect("accepted");
    c.advance(SimTime::ZERO);
    c.advance(SimTime::from_micros(20_000));
    assert_eq!(c.snapshot().kv_transfers_in_flight, 1);
    assert!(c.cancel(id, SimTime::from_micros(25_000)));
    c.assert_invariants();
    assert_eq!(c.snapshot().active_requests, 0);
    assert!(run(&mut c).is_empty());
    assert_eq!(
        c.decode_router()
            .unwrap()
            .load(WorkerId(0))
            .active_requests(),
        0
    );
}

fn with_g2(mut e: EngineConfig) -> EngineConfig {
    e.g2 = Some(G2Config {
        num_blocks: 16,
        // 4-token blocks of 250 kB per token: 1 MB per block, 1 ms per block at 1 GB/s.
        kv_bytes_per_token: 250_000,
        bandwidth_g1_to_g2_gbps: 1.0,
        bandwidth_g2_to_g1_gbps: 1.0,
    });
    e
}

#[test]
fn a_prompt_evicted_to_g2_comes_back_at_the_modelled_cost() {
    let config = ClusterConfig {
        engine: with_g2(engine(4)),
        ..ClusterConfig::default()
    };
    let mut c = Cluster::new(config).unwrap();
    let a: Vec<u32> = (1..=12).collect();
    let b: Vec<u32> = (101..=112).collect();
    c.submit(request(&a, 1), SimTime::ZERO).expect("accepted");
    run(&mut c);
    // B needs 3 of the 4 blocks: A's two tail blocks are evicted and offloaded (2 ms).
    c.submit(request(&b, 1), SimTime::from_micros(20_000))
        .expect("accepted");
    run(&mut c);
    let t = SimTime::from_micros(40_000);
    let id = c.submit(request(&a, 1), t).expect("accepted");
    let out = run(&mut c);
    // G1 still has A's first block; the next one is onboarded from G2 (1 block, 1 ms), the
    // third cannot count as cached (the last prompt token is always computed).
    assert!(out.contains(&Output::Admitted {
        id,
        worker: WorkerId(0),
        time: SimTime::from_micros(41_000),
        reused_tokens: 8,
        g2_reused_tokens: 4,
    }));
    assert_eq!(token_times(&out, id), vec![41 + 20]);
    let w = c.snapshot().workers[0].scheduler;
    assert_eq!((w.g2_offloaded_blocks, w.g2_onboarded_blocks), (2, 1));

    // Without G2 the same request only finds the first block and does not wait.
    let mut c = Cluster::new(ClusterConfig {
        engine: engine(4),
        ..ClusterConfig::default()
    })
    .unwrap();
    c.submit(request(&a, 1), SimTime::ZERO).expect("accepted");
    run(&mut c);
    c.submit(request(&b, 1), SimTime::from_micros(20_000))
        .expect("accepted");
    run(&mut c);
    let id = c.submit(request(&a, 1), t).expect("accepted");
    let out = run(&mut c);
    assert!(out.contains(&Output::Admitted {
        id,
        worker: WorkerId(0),
        time: t,
        reused_tokens: 4,
        g2_reused_tokens: 0,
    }));
}

#[test]
fn invariants_of_both_tiers_hold_over_many_random_operations() {
    for (seed, serving) in [
        (1, ServingMode::Aggregated),
        (
            2,
            ServingMode::Disagg {
                num_prefill_workers: 2,
                num_decode_workers: 2,
                kv_transfer: KvTransferConfig {
                    kv_bytes_per_token: Some(100_000),
                    bandwidth_gbps: 1.0,
                    timing_mode: KvTransferTimingMode::DestinationMissing,
                },
            },
        ),
    ] {
        let mut e = with_g2(engine(24));
        e.max_num_seqs = 6;
        e.max_num_batched_tokens = 32;
        e.g2.as_mut().unwrap().num_blocks = 20;
        let mut c = Cluster::new(ClusterConfig {
            engine: e,
            num_workers: 2,
            serving,
            seed,
            ..ClusterConfig::default()
        })
        .unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let families: Vec<Vec<u32>> = (0..5)
            .map(|f| (0..48).map(|i| f * 1000 + i).collect())
            .collect();
        let mut now = 0u64;
        let mut live: Vec<RequestId> = Vec::new();
        let mut ended = 0usize;
        for _ in 0..3000 {
            match rng.gen_range(0..10) {
                0..=3 => {
                    let f = &families[rng.gen_range(0..families.len())];
                    let mut tokens = f[..rng.gen_range(1..f.len())].to_vec();
                    tokens.extend((0..rng.gen_range(0..6)).map(|_| rng.gen_range(0..3)));
                    let id = c
                        .submit(
                            request(&tokens, rng.gen_range(1..12)),
                            SimTime::from_micros(now),
                        )
                        .expect("accepted");
                    live.push(id);
                }
                4 if !live.is_empty() => {
                    let id = live.swap_remove(rng.gen_range(0..live.len()));
                    if c.cancel(id, SimTime::from_micros(now)) {
                        ended += 1;
                    }
                }
                _ => {
                    now = match c.next_event_time() {
                        Some(t) if rng.gen_bool(0.7) => t.as_micros().max(now),
                        _ => now + rng.gen_range(0..8000),
                    };
                    for o in c.advance(SimTime::from_micros(now)) {
                        if let Output::Finished { id, .. } | Output::Rejected { id, .. } = o {
                            live.retain(|&l| l != id);
                            ended += 1;
                        }
                    }
                }
            }
            c.assert_invariants();
        }
        for o in run(&mut c) {
            if let Output::Finished { .. } | Output::Rejected { .. } = o {
                ended += 1;
            }
        }
        let stats = c.snapshot();
        assert_eq!(stats.active_requests, 0, "seed {seed}");
        assert_eq!(ended as u64, c.next_id, "every request ended once");
        for w in &stats.workers {
            assert_eq!(w.scheduler.active_blocks, 0);
            assert_eq!(w.scheduler.awaiting_onboard, 0);
        }
        assert!(stats
            .workers
            .iter()
            .any(|w| w.scheduler.g2_onboarded_blocks > 0));
    }
}

/// Random submissions, cancellations and clock jumps on every engine and router.
mod random_ops {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use crate::cluster::*;
    use crate::perf::{Fixed, ScaledLatency};
    use crate::request::Prompt;
    use crate::router::{RouterConfig, RouterMode};
    use crate::scheduler::EngineType;

    fn small(engine_type: EngineType, mode: RouterMode) -> ClusterConfig {
        ClusterConfig {
            engine: EngineConfig {
                engine_type,
                num_gpu_blocks: 48,
                block_size: 8,
                max_num_seqs: 6,
                max_num_batched_tokens: 64,
                latency: ScaledLatency {
                    model: Arc::new(Fixed {
                        prefill_ms: 2.0,
                        decode_ms: 1.0,
                    }),
                    speedup_ratio: 1.0,
                    decode_speedup_ratio: 1.0,
                },
                sglang: crate::scheduler::SglangConfig {
                    chunked_prefill_size: 64,
                    max_prefill_tokens: 128,
                    ..Default::default()
                },
                ..EngineConfig::default()
            },
            num_workers: 3,
            router: RouterConfig {
                mode,
                queue_threshold: (mode == RouterMode::KvRouter).then_some(2.0),
                ..RouterConfig::default()
            },
            seed: 5,
            ..ClusterConfig::default()
        }
    }

    /// Random submissions, cancellations and clock jumps on every engine and router: invariants
    /// after every step; every request not cancelled ends with all its tokens (or a rejection).
    #[test]
    fn invariants_hold_over_random_operations() {
        for engine_type in [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm] {
            for mode in [
                RouterMode::KvRouter,
                RouterMode::RoundRobin,
                RouterMode::Random,
            ] {
                let mut cluster = Cluster::new(small(engine_type, mode)).unwrap();
                let mut rng = ChaCha8Rng::seed_from_u64(17);
                let mut want: BTreeMap<RequestId, usize> = BTreeMap::new();
                let mut got: BTreeMap<RequestId, usize> = BTreeMap::new();
                let mut ended: BTreeMap<RequestId, bool> = BTreeMap::new();
                let mut now = SimTime::ZERO;
                for step in 0..3000 {
                    match rng.gen_range(0..10) {
                        0..=3 if step < 2000 => {
                            let family = rng.gen_range(0..4u32);
                            let len = rng.gen_range(1..120);
                            let tokens: Vec<u32> = (0..len)
                                .map(|i| {
                                    if i < 60 {
                                        family * 100 + i
                                    } else {
                                        rng.gen_range(0..9)
                                    }
                                })
                                .collect();
                            let out = rng.gen_range(1..20);
                            let request = EngineRequest {
                                prompt: Prompt::from_tokens(&tokens, 8),
                                max_output_tokens: out,
                                output_tokens: Vec::new(),
                            };
                            let id = cluster.submit(request, now).expect("accepted");
                            want.insert(id, out);
                        }
                        4 if !want.is_empty() => {
                            let id = RequestId(rng.gen_range(0..want.len() as u64));
                            if cluster.cancel(id, now) {
                                ended.insert(id, false);
                            }
                        }
                        _ => {
                            now = cluster.next_event_time().map_or(now, |t| t.max(now));
                        }
                    }
                    for out in cluster.advance(now) {
                        match out {
                            Output::Token { id, index, .. } => {
                                let n = got.entry(id).or_default();
                                *n += 1;
                                assert_eq!(*n, index, "tokens in order");
                            }
                            Output::Finished { id, .. } | Output::Rejected { id, .. } => {
                                assert!(ended.insert(id, true).is_none(), "{id} ends once");
                            }
                            _ => {}
                        }
                    }
                    cluster.assert_invariants();
                }
                while let Some(t) = cluster.next_event_time() {
                    now = t.max(now);
                    for out in cluster.advance(now) {
                        match out {
                            Output::Token { id, .. } => *got.entry(id).or_default() += 1,
                            Output::Finished { id, .. } | Output::Rejected { id, .. } => {
                                ended.insert(id, true);
                            }
                            _ => {}
                        }
                    }
                    cluster.assert_invariants();
                }
                assert_eq!(
                    cluster.snapshot().active_requests,
                    0,
                    "{engine_type} {mode}: all done"
                );
                for (id, out) in &want {
                    match ended.get(id) {
                        Some(true) => assert!(
                            got.get(id).is_none_or(|n| n == out),
                            "{engine_type} {mode} {id}: {got:?} of {out}"
                        ),
                        Some(false) => {}
                        None => panic!("{engine_type} {mode}: {id} never ended"),
                    }
                }
                for w in cluster.snapshot().workers {
                    assert_eq!(w.scheduler.active_blocks, 0, "blocks released");
                }
            }
        }
    }
}

/// Workers build KV events only where something reads them: behind round-robin nothing does
/// until the events are exported; the KV router reads them. Either way the cluster serves the
/// same outputs.
#[test]
fn kv_events_are_built_only_where_read() {
    let config = |mode| ClusterConfig {
        engine: engine(64),
        num_workers: 2,
        router: RouterConfig {
            mode,
            ..RouterConfig::default()
        },
        ..ClusterConfig::default()
    };
    let emitting =
        |c: &Cluster| -> Vec<bool> { c.workers.iter().map(Worker::emits_kv_events).collect() };
    let serve = |c: &mut Cluster| {
        let tokens: Vec<u32> = (0..40).collect();
        c.submit(request(&tokens, 3), SimTime::ZERO)
            .expect("admitted");
        run(c)
    };
    let mut rr = Cluster::new(config(RouterMode::RoundRobin)).expect("valid");
    assert_eq!(emitting(&rr), [false, false]);
    let quiet = serve(&mut rr);
    let mut exported = Cluster::new(config(RouterMode::RoundRobin)).expect("valid");
    exported.export_kv_events();
    assert_eq!(emitting(&exported), [true, true]);
    assert_eq!(serve(&mut exported), quiet);
    let events = exported.drain_kv_events();
    assert!(
        events
            .iter()
            .any(|e| matches!(e.data, KvEventData::Stored { .. })),
        "{events:?}"
    );
    let kv = Cluster::new(config(RouterMode::KvRouter)).expect("valid");
    assert_eq!(emitting(&kv), [true, true]);
}

/// A prefix-cache reset empties an idle worker's cache at once (the next identical prompt
/// reuses nothing), publishes `Cleared` to the export and its router, and is refused, changing
/// nothing, while the worker runs a request; an unknown worker is refused.
#[test]
fn a_prefix_cache_reset_clears_an_idle_worker_only() {
    let mut c = Cluster::new(ClusterConfig {
        engine: engine(64),
        num_workers: 2,
        router: RouterConfig {
            mode: RouterMode::KvRouter,
            ..RouterConfig::default()
        },
        ..ClusterConfig::default()
    })
    .expect("valid");
    c.export_kv_events();
    let tokens: Vec<u32> = (0..64).collect();
    let reuse = |c: &mut Cluster| {
        let id = c
            .submit_to(request(&tokens, 2), WorkerId(0), SimTime::ZERO)
            .expect("admitted");
        let out = run(c);
        out.iter()
            .find_map(|o| match o {
                Output::Admitted {
                    id: i,
                    reused_tokens,
                    ..
                } if *i == id => Some(*reused_tokens),
                _ => None,
            })
            .expect("admitted")
    };
    assert_eq!(reuse(&mut c), 0);
    assert!(reuse(&mut c) > 0, "the second run hits the cache");
    c.drain_kv_events();
    assert!(!c.reset_prefix_cache(7), "no such worker");
    assert!(c.reset_prefix_cache(0));
    let events = c.drain_kv_events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].worker, WorkerId(0));
    assert!(matches!(events[0].data, KvEventData::Cleared));
    assert_eq!(reuse(&mut c), 0, "nothing cached after the reset");
    // Busy: a request admitted and not finished holds blocks.
    c.submit_to(request(&tokens, 50), WorkerId(0), SimTime::ZERO)
        .expect("admitted");
    if let Some(t) = c.next_event_time() {
        c.advance(t);
    }
    assert!(!c.reset_prefix_cache(0));
    c.drain_kv_events();
    run(&mut c);
    assert!(c
        .drain_kv_events()
        .iter()
        .all(|e| !matches!(e.data, KvEventData::Cleared)));
}

/// The clock has nanoseconds: a pass on an idle worker starts at the instant it is started
/// (10.5 µs, plus 1,000.8 µs of prefill: it ends at 1,011.3 µs), its token is stamped with
/// that end, and it has not ended at an earlier instant of the same microsecond.
#[test]
fn a_pass_starts_and_ends_between_whole_microseconds() {
    let mut e = engine(64);
    e.latency.model = Arc::new(Fixed {
        prefill_ms: 1.0008,
        decode_ms: 1.0008,
    });
    let config = ClusterConfig {
        engine: e,
        ..ClusterConfig::default()
    };
    let mut c = Cluster::new(config).expect("valid");
    let start = SimTime::from_nanos(10_500);
    let id = c
        .submit(request(&[1, 2, 3, 4], 1), start)
        .expect("accepted");
    let token_ns = |out: &[Output]| -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                Output::Token { id: i, time, .. } if *i == id => Some(time.as_nanos()),
                _ => None,
            })
            .collect()
    };
    let mut out = Vec::new();
    c.start_idle_into(start, &mut out);
    let end = c.next_pass_end().expect("a pass");
    assert_eq!(end, SimTime::from_nanos(1_011_300));
    c.finish_due_into(SimTime::from_nanos(1_011_299), &mut out);
    assert!(token_ns(&out).is_empty(), "1,011.299 µs is before the end");
    c.finish_due_into(end, &mut out);
    assert_eq!(token_ns(&out), [1_011_300]);
    c.assert_invariants();
}
