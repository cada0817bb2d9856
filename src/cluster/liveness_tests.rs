//! Seeded property test of the cluster's liveness invariant: every request the cluster accepts
//! finishes with all its tokens (or is cancelled) within bounded simulated time and engine
//! steps; every request it cannot run is refused at submission; the clock never goes backwards
//! and never sticks while work is pending.
//!
//! Each case draws a configuration (engine flavour, chunked or not, tiny pools and budgets,
//! context limits, disaggregation, a host tier, router modes with extreme weights, instant
//! passes) and a stream of operations (submissions of empty, one-token, long and huge prompts
//! with small to huge outputs, some pinned; cancellations; clock moves), checking
//! `assert_invariants` after every step.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::kv::G2Config;
use crate::perf::{Fixed, LatencyModel, Polynomial, ScaledLatency};
use crate::request::Prompt;
use crate::router::{RouterConfig, RouterMode};
use crate::scheduler::{EngineType, PreemptionMode, RejectReason, SglangConfig};
use crate::time::SimDuration;

/// Cases run (each with its own seed).
const CASES: u64 = 96;
/// Operations per case before the final drain.
const OPS: usize = 100;
/// Advances allowed to drain a case: the "bounded engine steps" of the liveness claim.
const MAX_DRAIN_ADVANCES: usize = 200_000;
/// Advances in a row at one instant that emit nothing before the clock counts as stuck.
const MAX_IDLE_REPEATS: usize = 8;

fn pick<T: Copy>(rng: &mut ChaCha8Rng, choices: &[T]) -> T {
    choices[rng.gen_range(0..choices.len())]
}

fn random_config(rng: &mut ChaCha8Rng, seed: u64) -> ClusterConfig {
    let engine_type = pick(
        rng,
        &[EngineType::Vllm, EngineType::Sglang, EngineType::Trtllm],
    );
    let block_size = pick(rng, &[1, 2, 4, 8, 16]);
    let model: Arc<dyn LatencyModel> = if rng.gen_bool(0.7) {
        Arc::new(Fixed {
            prefill_ms: pick(rng, &[0.0, 0.5, 3.0]),
            decode_ms: pick(rng, &[0.0, 0.2, 1.0]),
        })
    } else {
        Arc::new(Polynomial::default())
    };
    let enable_prefix_caching = rng.gen_bool(0.8);
    let chunk = block_size * rng.gen_range(1..8);
    let g2 = (engine_type == EngineType::Vllm && enable_prefix_caching && rng.gen_bool(0.3)).then(
        || G2Config {
            num_blocks: rng.gen_range(1..24),
            kv_bytes_per_token: pick(rng, &[1_000, 100_000]),
            bandwidth_g1_to_g2_gbps: pick(rng, &[0.0, 0.5, 10.0]),
            bandwidth_g2_to_g1_gbps: pick(rng, &[0.0, 0.5, 10.0]),
        },
    );
    let engine = EngineConfig {
        engine_type,
        num_gpu_blocks: pick(rng, &[1, 2, 3, 8, 32, 200]),
        block_size,
        max_num_seqs: pick(rng, &[1, 2, 4, 64]),
        max_num_batched_tokens: pick(rng, &[1, 3, 8, 16, 64, 512]),
        enable_prefix_caching,
        enable_chunked_prefill: rng.gen_bool(0.6),
        preemption_mode: pick(rng, &[PreemptionMode::Lifo, PreemptionMode::Fifo]),
        max_model_len: pick(rng, &[None, None, Some(2), Some(40), Some(300)]),
        latency: ScaledLatency {
            model,
            speedup_ratio: pick(rng, &[1.0, 10.0, f64::INFINITY]),
            decode_speedup_ratio: pick(rng, &[1.0, 3.0]),
        },
        sglang: SglangConfig {
            chunked_prefill_size: chunk,
            max_prefill_tokens: chunk * rng.gen_range(1..3),
            ..SglangConfig::default()
        },
        role: WorkerRole::Aggregated,
        g2,
    };
    let mode = pick(
        rng,
        &[
            RouterMode::KvRouter,
            RouterMode::KvRouter,
            RouterMode::RoundRobin,
            RouterMode::Random,
        ],
    );
    let serving = if rng.gen_bool(0.3) {
        ServingMode::Disagg {
            num_prefill_workers: rng.gen_range(1..3),
            num_decode_workers: rng.gen_range(1..3),
            kv_transfer: KvTransferConfig {
                kv_bytes_per_token: pick(rng, &[None, Some(1_000), Some(1_000_000)]),
                bandwidth_gbps: pick(rng, &[0.0, 0.01, 64.0]),
                timing_mode: pick(
                    rng,
                    &[
                        KvTransferTimingMode::FullPrompt,
                        KvTransferTimingMode::DestinationMissing,
                    ],
                ),
            },
        }
    } else {
        ServingMode::Aggregated
    };
    ClusterConfig {
        engine,
        num_workers: rng.gen_range(1..4),
        router: RouterConfig {
            mode,
            overlap_score_weight: pick(rng, &[0.0, 1.0, 7.5, MAX_OVERLAP_SCORE_WEIGHT]),
            temperature: pick(rng, &[0.0, 0.0, 0.7, 1e3]),
            queue_threshold: (mode == RouterMode::KvRouter)
                .then(|| pick(rng, &[None, Some(0.0), Some(0.5), Some(3.0)]))
                .flatten(),
            use_kv_events: rng.gen_bool(0.7),
            ..RouterConfig::default()
        },
        seed,
        serving,
    }
}

fn random_request(rng: &mut ChaCha8Rng, block_size: usize) -> EngineRequest {
    let len = match rng.gen_range(0..10) {
        0 => 0,
        1 => 1,
        2 => rng.gen_range(300..3_000),
        3 if rng.gen_bool(0.1) => 20_000,
        _ => rng.gen_range(2..120),
    };
    let family = rng.gen_range(0..4u32);
    let tokens: Vec<u32> = (0..len as u32)
        .map(|i| {
            if i < 64 {
                family * 1_000 + i
            } else {
                rng.gen_range(0..5)
            }
        })
        .collect();
    let max_output_tokens = match rng.gen_range(0..10) {
        0 => 0,
        1 => 1,
        2 => 10_000_000,
        _ => rng.gen_range(1..40),
    };
    EngineRequest {
        prompt: Prompt::from_tokens(&tokens, block_size),
        max_output_tokens,
        output_tokens: Vec::new(),
    }
}

/// What the test knows about each accepted request.
#[derive(Debug)]
struct Expected {
    /// Tokens it must emit when it finishes.
    tokens: usize,
    /// Tokens seen so far.
    seen: usize,
    /// Ended: finished (true) or cancelled (false).
    ended: Option<bool>,
}

/// The case's bookkeeping over the cluster's outputs.
struct Observer {
    expected: BTreeMap<RequestId, Expected>,
    /// Consecutive advances at one instant that emitted nothing.
    idle_repeats: usize,
    last_advance: SimTime,
}

impl Observer {
    fn observe(&mut self, outputs: &[Output], case: u64) {
        for out in outputs {
            match *out {
                Output::Token { id, index, .. } => {
                    let e = self
                        .expected
                        .get_mut(&id)
                        .expect("a token of an accepted request");
                    assert_eq!(e.ended, None, "case {case}: {id} emits after it ended");
                    e.seen += 1;
                    assert_eq!(e.seen, index, "case {case}: {id} tokens in order");
                    assert!(e.seen <= e.tokens, "case {case}: {id} emits past its limit");
                }
                Output::Finished { id, .. } => {
                    let e = self.expected.get_mut(&id).expect("accepted");
                    assert_eq!(e.ended, None, "case {case}: {id} ends twice");
                    assert_eq!(
                        e.seen, e.tokens,
                        "case {case}: {id} finishes with every token"
                    );
                    e.ended = Some(true);
                }
                Output::Rejected { id, reason, .. } => {
                    panic!("case {case}: accepted request {id} rejected later: {reason}")
                }
                Output::Admitted { .. } | Output::KvTransfer { .. } | Output::Preempted { .. } => {}
            }
        }
    }

    /// Advances to `now` and checks the clock: the next event is never before `now` and the
    /// engine does not ask to be woken at the same instant again and again for nothing.
    fn advance(&mut self, c: &mut Cluster, now: SimTime, case: u64) {
        let out = c.advance(now);
        c.assert_invariants();
        self.observe(&out, case);
        let next = c.next_event_time();
        if let Some(t) = next {
            assert!(t >= now, "case {case}: next event {t} before now {now}");
        }
        if out.is_empty() && next == Some(now) && now == self.last_advance {
            self.idle_repeats += 1;
            assert!(
                self.idle_repeats < MAX_IDLE_REPEATS,
                "case {case}: the clock is stuck at {now} with work pending"
            );
        } else {
            self.idle_repeats = 0;
        }
        self.last_advance = now;
    }
}

fn run_case(case: u64) -> (usize, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(0x11fe_0000 + case);
    let config = random_config(&mut rng, case);
    let mut c = match Cluster::new(config.clone()) {
        Ok(c) => c,
        Err(e) => panic!("case {case}: generated an invalid config: {e}"),
    };
    let bs = config.engine.block_size;
    let mut obs = Observer {
        expected: BTreeMap::new(),
        idle_repeats: 0,
        last_advance: SimTime::ZERO,
    };
    let mut now = SimTime::ZERO;
    let mut refused = 0;
    for _ in 0..OPS {
        match rng.gen_range(0..10) {
            0..=3 => {
                let request = random_request(&mut rng, bs);
                let check = config.engine.check_request(&request);
                let (prompt_len, out) = (request.prompt.len, request.max_output_tokens);
                let result = if rng.gen_bool(0.2) {
                    let worker = WorkerId(rng.gen_range(0..4));
                    match c.submit_to(request, worker, now) {
                        Err(SubmitToError::NoSuchWorker { .. }) => continue,
                        Err(SubmitToError::Rejected(r)) => Err(r),
                        Ok(id) => Ok(id),
                    }
                } else {
                    c.submit(request, now)
                };
                match result {
                    Ok(id) => {
                        assert_eq!(check, Ok(()), "case {case}");
                        let tokens = match config.engine.max_model_len {
                            Some(m) => out.min(m - prompt_len),
                            None => out,
                        };
                        obs.expected.insert(
                            id,
                            Expected {
                                tokens,
                                seen: 0,
                                ended: None,
                            },
                        );
                    }
                    Err(rejection) => {
                        assert_eq!(check, Err(rejection.reason), "case {case}");
                        assert_eq!(
                            rejection.reason == RejectReason::EmptyPrompt,
                            prompt_len == 0,
                            "case {case}"
                        );
                        refused += 1;
                    }
                }
            }
            4 => {
                let live: Vec<RequestId> = obs
                    .expected
                    .iter()
                    .filter(|(_, e)| e.ended.is_none())
                    .map(|(&id, _)| id)
                    .collect();
                if let Some(&id) = live.get(rng.gen_range(0..live.len().max(1))) {
                    assert!(c.cancel(id, now), "case {case}: {id} is live");
                    if let Some(e) = obs.expected.get_mut(&id) {
                        e.ended = Some(false);
                    }
                }
            }
            5 => {
                now += SimDuration::from_micros(rng.gen_range(0..5_000));
                obs.advance(&mut c, now, case);
            }
            _ => {
                if let Some(t) = c.next_event_time() {
                    now = now.max(t);
                }
                obs.advance(&mut c, now, case);
            }
        }
        c.assert_invariants();
    }
    // Drain: with no more arrivals, everything accepted must end in bounded steps.
    let mut advances = 0;
    while let Some(t) = c.next_event_time() {
        assert!(t >= now, "case {case}: time went backwards");
        now = t;
        obs.advance(&mut c, now, case);
        advances += 1;
        assert!(
            advances < MAX_DRAIN_ADVANCES,
            "case {case}: {} requests still active after {advances} advances ({config:?})",
            c.active_requests()
        );
    }
    assert_eq!(
        c.active_requests(),
        0,
        "case {case}: work left with no event to run it"
    );
    for (id, e) in &obs.expected {
        assert!(e.ended.is_some(), "case {case}: {id} never ended");
    }
    let stats = c.snapshot();
    for w in &stats.workers {
        assert_eq!(w.scheduler.active_blocks, 0, "case {case}: blocks released");
        assert_eq!(w.scheduler.unschedulable, 0, "case {case}");
        assert_eq!(w.scheduler.waiting + w.scheduler.running, 0, "case {case}");
    }
    (obs.expected.len(), refused)
}

#[test]
fn every_accepted_request_ends_and_every_hopeless_one_is_refused() {
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..CASES {
        let (a, r) = run_case(case);
        accepted += a;
        refused += r;
    }
    // The generator exercises both sides.
    assert!(accepted > 500, "{accepted} accepted");
    assert!(refused > 300, "{refused} refused");
}
