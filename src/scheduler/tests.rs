use std::sync::Arc;

use super::*;
use crate::perf::{DecodeBatch, Fixed, ScaledLatency};
use crate::request::Prompt;

fn prompt(tokens: &[u32], bs: usize) -> EngineRequest {
    EngineRequest {
        prompt: Prompt::from_tokens(tokens, bs),
        max_output_tokens: 0,
        output_tokens: Vec::new(),
    }
}

fn request(tokens: &[u32], bs: usize, out: usize) -> EngineRequest {
    EngineRequest {
        max_output_tokens: out,
        ..prompt(tokens, bs)
    }
}

fn fixed(prefill_ms: f64, decode_ms: f64) -> ScaledLatency {
    ScaledLatency {
        model: Arc::new(Fixed {
            prefill_ms,
            decode_ms,
        }),
        speedup_ratio: 1.0,
        decode_speedup_ratio: 1.0,
    }
}

/// Runs passes back to back from t=0 and returns (pass end times in ns, events per pass).
fn run(s: &mut Scheduler) -> Vec<(u64, Vec<SchedulerEvent>)> {
    let mut t = 0;
    let mut passes = Vec::new();
    while let Some(plan) = s.start_pass() {
        s.assert_invariants();
        t += plan.duration.as_nanos();
        s.finish_pass();
        s.assert_invariants();
        passes.push((t, s.drain_events()));
        assert!(passes.len() < 100_000, "runaway");
    }
    passes
}

fn token_times(passes: &[(u64, Vec<SchedulerEvent>)], id: RequestId) -> Vec<u64> {
    passes
        .iter()
        .flat_map(|(t, ev)| {
            ev.iter()
                .filter(move |e| matches!(e, SchedulerEvent::Token { id: i, .. } if *i == id))
                .map(move |_| *t)
        })
        .collect()
}

#[test]
fn single_request_timing_matches_the_polynomial_by_hand() {
    let cfg = EngineConfig::default();
    let mut s = Scheduler::new(cfg.clone(), 1);
    let tokens: Vec<u32> = (0..1000).collect();
    s.enqueue(RequestId(0), request(&tokens, 64, 3));
    let passes = run(&mut s);
    let total = (16384 * 64) as f64;
    let decode = |len: f64| {
        let u = len / total;
        -25.74 * u * u + 54.01 * u + 5.74
    };
    let ns = |ms: f64| (ms * 1e6).round() as u64;
    // Pass 1 prefills 1000 tokens; its first token comes at the end of the prefill (nobody
    // decodes yet). Later passes are decode steps over the growing context.
    let t1 = ns(4.209989e-07 * 1e6 + 1.518344e-02 * 1000.0 + 16.50142);
    let t2 = t1 + ns(decode(1001.0));
    let t3 = t2 + ns(decode(1002.0));
    assert_eq!(token_times(&passes, RequestId(0)), vec![t1, t2, t3]);
    assert_eq!(
        (t1, t2, t3),
        (
            32_105_859,
            32_105_859 + 5_791_536,
            32_105_859 + 5_791_536 + 5_791_587
        )
    );
    assert!(matches!(
        passes[0].1[0],
        SchedulerEvent::Admitted {
            reused_tokens: 0,
            ..
        }
    ));
    assert!(matches!(
        passes.last().unwrap().1.last(),
        Some(SchedulerEvent::Finished { .. })
    ));
    assert_eq!(s.stats().active_blocks, 0);
    // 1000 prompt + 2 fed-back tokens: 15 full blocks stay cached, the partial one is freed.
    assert_eq!(s.stats().inactive_blocks, 15);
}

#[test]
fn chunked_prefill_splits_long_prompts_by_the_token_budget() {
    let cfg = EngineConfig {
        max_num_batched_tokens: 256,
        latency: fixed(10.0, 1.0),
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(cfg, 1);
    let tokens: Vec<u32> = (0..600).collect();
    s.enqueue(RequestId(7), request(&tokens, 64, 2));
    let passes = run(&mut s);
    // 256 + 256 + 88 prompt tokens: the first token ends the third pass (prefill only, nobody
    // was decoding), the second a decode step.
    assert_eq!(
        token_times(&passes, RequestId(7)),
        vec![10_000_000 * 3, 10_000_000 * 3 + 1_000_000]
    );
}

#[test]
fn fully_cached_prompt_still_computes_its_last_block() {
    let mut s = Scheduler::new(
        EngineConfig {
            latency: fixed(10.0, 1.0),
            ..EngineConfig::default()
        },
        1,
    );
    let tokens: Vec<u32> = (0..256).collect();
    s.enqueue(RequestId(0), request(&tokens, 64, 1));
    run(&mut s);
    s.enqueue(RequestId(1), request(&tokens, 64, 1));
    let passes = run(&mut s);
    // 4 blocks cached, but the last token must be computed: 3 blocks (192 tokens) reused.
    assert!(matches!(
        passes[0].1[0],
        SchedulerEvent::Admitted {
            reused_tokens: 192,
            ..
        }
    ));
    // With a partial last block the whole full-block prefix is reused.
    let longer: Vec<u32> = (0..300).collect();
    s.enqueue(RequestId(2), request(&longer, 64, 1));
    let passes = run(&mut s);
    assert!(matches!(
        passes[0].1[0],
        SchedulerEvent::Admitted {
            reused_tokens: 256,
            ..
        }
    ));
}

#[test]
fn prefix_hits_shorten_prefill_time() {
    let cfg = EngineConfig::default();
    let model = cfg.latency.model.clone();
    let mut s = Scheduler::new(cfg, 1);
    let shared: Vec<u32> = (0..2048).collect();
    s.enqueue(RequestId(0), request(&shared, 64, 1));
    run(&mut s);
    let mut next = shared.clone();
    next.extend(5000..5100);
    s.enqueue(RequestId(1), request(&next, 64, 2));
    let passes = run(&mut s);
    let new_tokens = 100; // 2048 cached, 100 new
    let prefill = model.prefill_ms(&PrefillBatch {
        num_requests: 1,
        total_isl: 2148,
        total_prefix: 2048,
    });
    assert_eq!(
        PrefillBatch {
            num_requests: 1,
            total_isl: 2148,
            total_prefix: 2048
        }
        .new_tokens(),
        new_tokens
    );
    assert_eq!(passes[0].0, (prefill * 1e6).round() as u64);
    // The second token: one decode step over the 2149-token context.
    let decode = model.decode_ms(&DecodeBatch {
        num_requests: 1,
        active_kv_tokens: 2149,
        total_kv_tokens: 16384 * 64,
    });
    assert_eq!(passes[1].0 - passes[0].0, (decode * 1e6).round() as u64);
}

#[test]
fn preemption_under_a_tiny_pool_recomputes_and_completes_everything() {
    // 8 blocks of 4 tokens; three requests of 10 prompt tokens each want 8 output tokens.
    let cfg = EngineConfig {
        num_gpu_blocks: 8,
        block_size: 4,
        latency: fixed(2.0, 1.0),
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(cfg, 3);
    for r in 0..3u32 {
        let tokens: Vec<u32> = (0..10).map(|i| r * 100 + i).collect();
        s.enqueue(RequestId(r as u64), request(&tokens, 4, 8));
    }
    let passes = run(&mut s);
    let events: Vec<&SchedulerEvent> = passes.iter().flat_map(|(_, e)| e).collect();
    let preempted: Vec<RequestId> = events
        .iter()
        .filter_map(|e| match e {
            SchedulerEvent::Preempted { id } => Some(*id),
            _ => None,
        })
        .collect();
    assert!(!preempted.is_empty(), "the pool is too small for all three");
    // Request 2 waits (its 3 blocks do not fit beside the first two); when the running pair
    // outgrows the pool, LIFO preempts the newer of them.
    assert_eq!(preempted[0], RequestId(1));
    for r in 0..3 {
        assert_eq!(
            token_times(&passes, RequestId(r)).len(),
            8,
            "request {r} completes all tokens"
        );
    }
    assert_eq!(s.stats().preemptions, preempted.len() as u64);
}

#[test]
fn prompts_that_can_never_fit_are_rejected() {
    let cfg = EngineConfig {
        num_gpu_blocks: 2,
        block_size: 4,
        max_model_len: Some(20),
        ..EngineConfig::default()
    };
    let mut s = Scheduler::new(cfg, 1);
    s.enqueue(RequestId(0), request(&[1; 9], 4, 1));
    s.enqueue(RequestId(1), request(&[1; 25], 4, 1));
    s.enqueue(RequestId(2), request(&[1; 6], 4, 1));
    let passes = run(&mut s);
    let events: Vec<&SchedulerEvent> = passes.iter().flat_map(|(_, e)| e).collect();
    assert!(matches!(
        events[0],
        SchedulerEvent::Rejected {
            id: RequestId(0),
            reason: RejectReason::ExceedsKvCapacity {
                blocks_needed: 3,
                num_gpu_blocks: 2
            }
        }
    ));
    assert!(matches!(
        events[1],
        SchedulerEvent::Rejected {
            id: RequestId(1),
            reason: RejectReason::ExceedsMaxModelLen { .. }
        }
    ));
    assert_eq!(token_times(&passes, RequestId(2)).len(), 1);
}

#[test]
fn every_engine_type_completes_a_random_workload_with_invariants() {
    use rand::{Rng, SeedableRng};
    for engine_type in [EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm] {
        let cfg = EngineConfig {
            engine_type,
            num_gpu_blocks: 64,
            block_size: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 256,
            latency: fixed(3.0, 1.0),
            sglang: SglangConfig {
                chunked_prefill_size: 256,
                max_prefill_tokens: 512,
                ..SglangConfig::default()
            },
            ..EngineConfig::default()
        };
        let mut s = Scheduler::new(cfg, 9);
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut expected = BTreeMap::new();
        for r in 0..40u64 {
            let family = rng.gen_range(0..3u32);
            let len = rng.gen_range(1..300);
            let tokens: Vec<u32> = (0..len)
                .map(|i| {
                    if i < 150 {
                        family * 1000 + i
                    } else {
                        rng.gen_range(0..50)
                    }
                })
                .collect();
            let out = rng.gen_range(1..60);
            expected.insert(RequestId(r), out);
            s.enqueue(RequestId(r), request(&tokens, 16, out));
        }
        let passes = run(&mut s);
        for (id, out) in expected {
            assert_eq!(
                token_times(&passes, id).len(),
                out,
                "{engine_type}: request {id:?}"
            );
        }
        if engine_type == EngineType::Trtllm {
            assert_eq!(s.stats().preemptions, 0, "TRT-LLM never preempts");
        }
        assert_eq!(s.stats().active_blocks, 0);
    }
}

#[test]
fn cancel_frees_blocks_at_once() {
    let mut s = Scheduler::new(
        EngineConfig {
            latency: fixed(1.0, 1.0),
            ..EngineConfig::default()
        },
        1,
    );
    s.enqueue(RequestId(0), request(&[3; 200], 64, 50));
    s.start_pass();
    s.finish_pass();
    assert!(s.stats().active_blocks > 0);
    assert!(s.cancel(RequestId(0)));
    assert_eq!(s.stats().active_blocks, 0);
    assert!(!s.has_work());
    assert!(!s.cancel(RequestId(0)));
    s.assert_invariants();
}

use std::collections::BTreeMap;
