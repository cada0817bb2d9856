use super::*;
use crate::kv::{KvEventData, StoredBlock};
use crate::time::{SimDuration, SimTime};
use crate::tokens::{sequence_hashes, LocalBlockHash, SequenceHash};

/// A lookup by sequence hashes only (the flat index ignores local hashes).
fn request(seq_hashes: &[SequenceHash]) -> RouteRequest<'_> {
    RouteRequest {
        isl: seq_hashes.len() * 4,
        local_hashes: &[],
        seq_hashes,
        now: SimTime::ZERO,
    }
}

fn h(i: u64) -> SequenceHash {
    SequenceHash(0x1000 + i)
}

fn stored(worker: u32, hashes: &[SequenceHash]) -> KvEvent {
    KvEvent {
        worker: WorkerId(worker),
        event_id: 0,
        data: KvEventData::Stored {
            parent: None,
            blocks: hashes
                .iter()
                .map(|&s| StoredBlock {
                    seq_hash: s,
                    local_hash: LocalBlockHash(s.0),
                })
                .collect(),
        },
    }
}

/// Three workers, block size 4, a request of 8 blocks (32 tokens):
/// - w0: nothing cached, idle: prefill 32/4 = 8, decode 0 + 8 new = 8 -> 16
/// - w1: 6 blocks cached but another request still prefilling 40 tokens over 10 other blocks:
///   prefill (40 + 8)/4 = 12, decode 10 + 8 = 18 -> 30
/// - w2: 4 blocks cached, a decoding request holds those 4: prefill 16/4 = 4,
///   decode 4 + 4 new = 8 -> 12 (chosen)
#[test]
fn kv_cost_on_a_hand_built_three_worker_example() {
    let mut r = Router::new(RouterConfig::default(), 3, 4, 8192, 0);
    let req: Vec<SequenceHash> = (0..8).map(h).collect();
    r.apply_kv_event(stored(1, &req[..6]));
    r.apply_kv_event(stored(2, &req[..4]));
    let other: Vec<SequenceHash> = (100..110).map(h).collect();
    r.add_load(1, RequestId(90), &other, 40);
    r.add_load(2, RequestId(91), &req[..4], 0);
    assert_eq!(r.overlaps(request(&req)), vec![0, 6, 4]);
    let costs = r.costs(RouteRequest {
        isl: 32,
        seq_hashes: &req,
        local_hashes: &[],
        now: SimTime::ZERO,
    });
    assert_eq!(costs, vec![16.0, 30.0, 12.0]);
    let d = r.route(
        RequestId(1),
        RouteRequest {
            isl: 32,
            seq_hashes: &req,
            local_hashes: &[],
            now: SimTime::ZERO,
        },
    );
    assert_eq!(
        d,
        Decision {
            worker: WorkerId(2),
            overlap_blocks: 4
        }
    );
    // The routed request now loads w2: 16 prefill tokens, its 8 blocks active.
    assert_eq!(r.load(WorkerId(2)).active_prefill_tokens(), 16);
    assert_eq!(r.load(WorkerId(2)).active_blocks(), 8);
    r.mark_prefill_completed(WorkerId(2), RequestId(1));
    assert_eq!(r.load(WorkerId(2)).active_prefill_tokens(), 0);
    r.free(WorkerId(2), RequestId(1));
    assert_eq!(
        r.load(WorkerId(2)).active_blocks(),
        4,
        "the other request still holds 4"
    );
}

#[test]
fn overlap_is_the_contiguous_prefix_only() {
    let mut r = Router::new(RouterConfig::default(), 2, 4, 8192, 0);
    let req: Vec<SequenceHash> = (0..5).map(h).collect();
    // Worker 0 holds blocks 0, 1 and 3 (not 2): overlap 2.
    r.apply_kv_event(stored(0, &[req[0], req[1], req[3]]));
    r.apply_kv_event(stored(1, &req[..5]));
    assert_eq!(r.overlaps(request(&req)), vec![2, 5]);
    r.apply_kv_event(KvEvent {
        worker: WorkerId(1),
        event_id: 1,
        data: KvEventData::Removed {
            seq_hashes: vec![req[0]],
        },
    });
    assert_eq!(r.overlaps(request(&req)), vec![2, 0]);
    assert_eq!(r.tree_sizes(), vec![3, 4]);
    r.apply_kv_event(KvEvent {
        worker: WorkerId(0),
        event_id: 1,
        data: KvEventData::Cleared,
    });
    assert_eq!(r.overlaps(request(&req)), vec![0, 0]);
    assert_eq!(r.tree_sizes(), vec![0, 4]);
}

/// A batch of events is applied in its order, as the same events one at a time (a Stored
/// then a Removed of one of its blocks, then a Stored of it again), inline and offloaded.
#[test]
fn a_batch_of_kv_events_applies_in_order() {
    let req: Vec<SequenceHash> = (0..5).map(h).collect();
    let removed = |worker| KvEvent {
        worker: WorkerId(worker),
        event_id: 1,
        data: KvEventData::Removed {
            seq_hashes: vec![req[2]],
        },
    };
    let events = vec![
        stored(0, &req),
        removed(0),
        stored(1, &req[..3]),
        removed(1),
        stored(1, &req[2..3]),
    ];
    for offload in [false, true] {
        let mut one = Router::new(RouterConfig::default(), 2, 4, 8192, 0);
        let mut batch = Router::new(RouterConfig::default(), 2, 4, 8192, 0);
        if offload {
            assert!(one.offload().expect("a thread") && batch.offload().expect("a thread"));
        }
        for e in events.clone() {
            one.apply_kv_event(e);
        }
        batch.apply_kv_events(events.clone());
        assert_eq!(batch.overlaps(request(&req)), vec![2, 3]);
        assert_eq!(batch.overlaps(request(&req)), one.overlaps(request(&req)));
        assert_eq!(batch.tree_sizes(), vec![4, 3]);
        assert_eq!(batch.tree_sizes(), one.tree_sizes());
    }
}

#[test]
fn ties_break_by_seeded_draw_and_weight_zero_ignores_prefill() {
    let req: Vec<SequenceHash> = (0..4).map(h).collect();
    let pick = |seed| {
        let mut r = Router::new(RouterConfig::default(), 4, 4, 8192, seed);
        r.route(
            RequestId(0),
            RouteRequest {
                isl: 16,
                seq_hashes: &req,
                local_hashes: &[],
                now: SimTime::ZERO,
            },
        )
        .worker
    };
    assert_eq!(pick(7), pick(7), "same seed, same choice");
    let picks: std::collections::BTreeSet<WorkerId> = (0..32).map(pick).collect();
    assert!(
        picks.len() > 1,
        "ties are not always broken towards one worker"
    );

    let config = RouterConfig {
        overlap_score_weight: 0.0,
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 2, 4, 8192, 0);
    r.add_load(0, RequestId(9), &[], 4000);
    assert_eq!(
        r.costs(RouteRequest {
            isl: 16,
            seq_hashes: &req,
            local_hashes: &[],
            now: SimTime::ZERO,
        }),
        vec![4.0, 4.0]
    );
}

#[test]
fn round_robin_cycles_and_queueing_parks_while_all_are_busy() {
    let config = RouterConfig {
        mode: RouterMode::RoundRobin,
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 3, 4, 8192, 0);
    let ws: Vec<u32> = (0..6)
        .map(|i| {
            r.route(
                RequestId(i),
                RouteRequest {
                    isl: 8,
                    seq_hashes: &[],
                    local_hashes: &[],
                    now: SimTime::ZERO,
                },
            )
            .worker
            .0
        })
        .collect();
    assert_eq!(ws, vec![0, 1, 2, 0, 1, 2]);

    let config = RouterConfig {
        queue_threshold: Some(1.0),
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 2, 4, 100, 0);
    assert!(!r.all_busy());
    r.add_load(0, RequestId(1), &[], 101);
    assert!(!r.all_busy(), "one worker still has room");
    r.add_load(1, RequestId(2), &[], 150);
    assert!(r.all_busy());
    r.park(RequestId(3));
    assert_eq!(r.unpark(), None);
    r.mark_prefill_completed(WorkerId(1), RequestId(2));
    assert_eq!(r.unpark(), Some(RequestId(3)));
}

#[test]
fn softmax_sampling_prefers_cheap_workers() {
    let config = RouterConfig {
        temperature: 0.5,
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 2, 4, 8192, 3);
    let mut cheap = 0;
    for i in 0..400 {
        let pick = r.with_core(|c| c.select(&[1.0, 3.0]));
        cheap += usize::from(pick == 0);
        let _ = i;
    }
    // p(0) = 1 / (1 + e^-2) = 0.88
    assert!(
        (320..380).contains(&cheap),
        "cheap worker picked {cheap} of 400 times"
    );
}

#[test]
fn without_kv_events_routing_decisions_are_remembered_for_the_ttl() {
    let config = RouterConfig {
        use_kv_events: false,
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 3, 4, 8192, 0);
    let local: Vec<LocalBlockHash> = (1..=6).map(LocalBlockHash).collect();
    let seq = sequence_hashes(&local);
    let at = |now: SimTime| RouteRequest {
        isl: 24,
        local_hashes: &local,
        seq_hashes: &seq,
        now,
    };
    let first = r.route(RequestId(1), at(SimTime::ZERO));
    assert_eq!(first.overlap_blocks, 0);
    r.free(first.worker, RequestId(1));
    // KV events are ignored: only the routing decision counts.
    r.apply_kv_event(stored(2, &seq));
    let mut expect = vec![0; 3];
    expect[first.worker.0 as usize] = 6;
    assert_eq!(r.overlaps(at(SimTime::ZERO)), expect);
    let second = r.route(
        RequestId(2),
        at(SimTime::ZERO + SimDuration::from_millis(1000)),
    );
    assert_eq!(
        second,
        Decision {
            worker: first.worker,
            overlap_blocks: 6
        }
    );
    r.free(second.worker, RequestId(2));
    // 120 s after the last routing the blocks are forgotten.
    let late = SimTime::ZERO + SimDuration::from_millis(122_000);
    let third = r.route(RequestId(3), at(late));
    assert_eq!(third.overlap_blocks, 0);
}

/// A pinned request loads the worker it names exactly as if the router had chosen it.
#[test]
fn route_to_records_load_like_route() {
    let req: Vec<SequenceHash> = (0..8).map(h).collect();
    let local: Vec<LocalBlockHash> = req.iter().map(|s| LocalBlockHash(s.0)).collect();
    let request = RouteRequest {
        isl: 32,
        local_hashes: &local,
        seq_hashes: &req,
        now: SimTime::ZERO,
    };
    let mut chosen = Router::new(RouterConfig::default(), 3, 4, 8192, 0);
    let mut pinned = Router::new(RouterConfig::default(), 3, 4, 8192, 0);
    for r in [&mut chosen, &mut pinned] {
        r.apply_kv_event(stored(1, &req[..6]));
        r.apply_kv_event(stored(2, &req[..4]));
    }
    let d = chosen.route(RequestId(1), request);
    let p = pinned.route_to(RequestId(1), d.worker, request);
    assert_eq!(d, p);
    // Pinning to a worker the router would not choose still counts the overlap there.
    let p0 = pinned.route_to(RequestId(2), WorkerId(0), request);
    assert_eq!(p0.overlap_blocks, 0);
    assert_eq!(pinned.load(WorkerId(0)).active_prefill_tokens(), 32);
    assert_eq!(pinned.load(WorkerId(0)).active_requests(), 1);
    pinned.free(WorkerId(0), RequestId(2));
    assert_eq!(pinned.load(WorkerId(0)).active_requests(), 0);
}

#[test]
fn selection_is_total_over_non_finite_costs() {
    for temperature in [0.0, 0.5] {
        let config = RouterConfig {
            temperature,
            ..RouterConfig::default()
        };
        let mut r = Router::new(config, 3, 4, 8192, 3);
        let inf = f64::INFINITY;
        let nan = f64::NAN;
        for costs in [
            [nan, nan, nan],
            [inf, inf, inf],
            [nan, 2.0, inf],
            [inf, inf, 5.0],
            [-inf, 1.0, 2.0],
        ] {
            let pick = r.with_core(move |c| c.select(&costs));
            assert!(pick < 3, "{costs:?}");
            // A finite cost beats NaN and infinity.
            if costs.iter().filter(|c| c.is_finite()).count() == 1 {
                assert!(costs[pick].is_finite(), "{costs:?} -> {pick}");
            }
        }
    }
}

#[test]
fn the_largest_overlap_weight_routes_without_overflow() {
    let config = RouterConfig {
        overlap_score_weight: crate::cluster::MAX_OVERLAP_SCORE_WEIGHT,
        ..RouterConfig::default()
    };
    let mut r = Router::new(config, 2, 4, 8192, 3);
    let hashes: Vec<SequenceHash> = (0..8).map(h).collect();
    r.apply_kv_event(stored(1, &hashes[..4]));
    let d = r.route(RequestId(0), request(&hashes));
    assert_eq!(d.worker, WorkerId(1), "the cached prefix wins");
}

/// The active blocks give every worker the new-block count of a brute-force model (the query's
/// blocks missing from the worker's active requests), and its own load agrees, over
/// seeded random routes and frees of hash chains that share prefixes (duplicates included),
/// with the core in the router and on its own thread.
#[test]
fn holders_agree_with_each_workers_load() {
    for offloaded in [false, true] {
        holders_agree_with_each_workers_load_on(offloaded);
    }
}

fn holders_agree_with_each_workers_load_on(offloaded: bool) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    // Chains over a two-letter alphabet: short ones coincide, longer ones share prefixes.
    let chain = |rng: &mut rand_chacha::ChaCha8Rng| {
        let locals: Vec<LocalBlockHash> = (0..rng.gen_range(0..12))
            .map(|_| LocalBlockHash(rng.gen_range(0..2)))
            .collect();
        sequence_hashes(&locals)
    };
    let mut r = Router::new(RouterConfig::default(), 70, 4, 8192, 0);
    if offloaded {
        assert!(r.offload().expect("thread"));
        assert!(matches!(r.core, CoreHandle::Offloaded(_)));
    }
    let mut live: Vec<(WorkerId, RequestId, Vec<SequenceHash>)> = Vec::new();
    for i in 0..600u64 {
        if !live.is_empty() && rng.gen_bool(0.4) {
            let (w, id, _) = live.swap_remove(rng.gen_range(0..live.len()));
            r.free(w, id);
        } else {
            let hashes = chain(&mut rng);
            let w = rng.gen_range(0..70);
            r.add_load(w, RequestId(i), &hashes, 4);
            live.push((WorkerId(w as u32), RequestId(i), hashes));
        }
        let query = chain(&mut rng);
        let costs = r.costs(request(&query));
        r.with_core(|c| c.active.assert_invariants(&c.loads));
        for (w, cost) in costs.iter().enumerate() {
            let worker = WorkerId(w as u32);
            let load = r.load(worker);
            let held: std::collections::HashSet<SequenceHash> = live
                .iter()
                .filter(|(lw, _, _)| *lw == worker)
                .flat_map(|(_, _, hs)| hs.iter().copied())
                .collect();
            let new = query.iter().filter(|h| !held.contains(h)).count();
            assert_eq!(
                r.new_blocks(worker, &query),
                new,
                "worker {w} after step {i}"
            );
            assert_eq!(
                load.active_blocks(),
                held.len(),
                "worker {w}'s distinct blocks"
            );
            let want = (load.active_prefill_tokens() + query.len() * 4) as f64 / 4.0
                + (load.active_blocks() + new) as f64;
            assert_eq!(*cost, want, "worker {w} after step {i}");
        }
    }
}

/// A router whose core runs on its own thread decides exactly as one that keeps it, over seeded
/// random KV events, routes (softmax draws included), pinned routes, first tokens and frees,
/// and so does one whose index made room ahead (as a replay's does); an offloaded router and
/// an unoffloadable one (round-robin) say so.
#[test]
fn an_offloaded_core_decides_as_an_inline_one() {
    use rand::{Rng, SeedableRng};
    let config = RouterConfig {
        temperature: 0.3,
        ..RouterConfig::default()
    };
    let mut inline = Router::new(config.clone(), 4, 4, 8192, 9);
    let mut offloaded = Router::new(config, 4, 4, 8192, 9);
    assert!(offloaded.offload().expect("thread"));
    offloaded.reserve_index(50_000);
    assert!(matches!(offloaded.core, CoreHandle::Offloaded(_)));
    let mut rr = Router::new(
        RouterConfig {
            mode: RouterMode::RoundRobin,
            ..RouterConfig::default()
        },
        4,
        4,
        8192,
        9,
    );
    assert!(!rr.offload().expect("nothing to do"));
    assert!(
        matches!(rr.core, CoreHandle::Inline(_)),
        "round-robin keeps its core"
    );

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
    let mut live: Vec<(WorkerId, RequestId)> = Vec::new();
    for i in 0..2000u64 {
        let locals: Vec<LocalBlockHash> = (0..rng.gen_range(1..16))
            .map(|_| LocalBlockHash(rng.gen_range(0..3)))
            .collect();
        let hashes = sequence_hashes(&locals);
        match rng.gen_range(0..5) {
            0 => {
                let event = stored(rng.gen_range(0..4), &hashes);
                inline.apply_kv_event(event.clone());
                offloaded.apply_kv_event(event);
            }
            1 if !live.is_empty() => {
                let (w, id) = live.swap_remove(rng.gen_range(0..live.len()));
                inline.free(w, id);
                offloaded.free(w, id);
            }
            2 if !live.is_empty() => {
                let (w, id) = live[rng.gen_range(0..live.len())];
                inline.mark_prefill_completed(w, id);
                offloaded.mark_prefill_completed(w, id);
            }
            3 => {
                let w = WorkerId(rng.gen_range(0..4));
                let a = inline.route_to(RequestId(i), w, request(&hashes));
                assert_eq!(offloaded.route_to(RequestId(i), w, request(&hashes)), a);
                live.push((w, RequestId(i)));
            }
            _ => {
                let a = inline.route(RequestId(i), request(&hashes));
                assert_eq!(
                    offloaded.route(RequestId(i), request(&hashes)),
                    a,
                    "step {i}"
                );
                live.push((a.worker, RequestId(i)));
            }
        }
    }
    assert_eq!(inline.tree_sizes(), offloaded.tree_sizes());
    for w in 0..4 {
        assert_eq!(inline.load(WorkerId(w)), offloaded.load(WorkerId(w)));
    }
}

/// Block lists that are not chains (a hash repeated, or met again at another depth) keep the
/// active blocks consistent: a block is then named by its path, so a worker holds the leading
/// blocks of a query that one of its active requests starts with; nothing panics, and freeing
/// every request leaves no run behind.
#[test]
fn active_blocks_stay_consistent_on_lists_that_are_not_chains() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut active = super::load::ActiveBlocks::default();
    let mut loads = vec![WorkerLoad::default(); 3];
    let mut live: Vec<(usize, RequestId, Vec<SequenceHash>)> = Vec::new();
    let list = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<SequenceHash> {
        (0..rng.gen_range(0..8))
            .map(|_| SequenceHash(rng.gen_range(0..4)))
            .collect()
    };
    for i in 0..3000u64 {
        if !live.is_empty() && rng.gen_bool(0.45) {
            let (w, id, _) = live.swap_remove(rng.gen_range(0..live.len()));
            active.free(&mut loads[w], w as u32, id);
        } else {
            let hashes = list(&mut rng);
            let w = rng.gen_range(0..3);
            active.add(&mut loads[w], w as u32, RequestId(i), hashes.clone(), 0);
            live.push((w, RequestId(i), hashes));
        }
        active.assert_invariants(&loads);
        let query = list(&mut rng);
        for w in 0..3 {
            let held = live
                .iter()
                .filter(|(lw, _, _)| *lw == w)
                .map(|(_, _, hs)| hs.iter().zip(&query).take_while(|(a, b)| a == b).count())
                .max()
                .unwrap_or(0);
            assert_eq!(
                active.new_blocks(w as u32, &query),
                query.len() - held,
                "worker {w} after step {i}"
            );
        }
    }
    for (w, id, _) in live {
        active.free(&mut loads[w], w as u32, id);
    }
    active.assert_invariants(&loads);
    assert!(loads.iter().all(|l| l.active_blocks() == 0));
}
