use std::sync::Arc;

use servesim::cluster::ClusterConfig;
use servesim::metrics::WALL_CLOCK_KEYS;
use servesim::perf::{Fixed, ScaledLatency};
use servesim::replay::{replay, ReplayConfig};
use servesim::router::{RouterConfig, RouterMode};
use servesim::scheduler::EngineConfig;
use servesim::trace::{self, TraceOptions};

use crate::fixture;

fn config(num_workers: usize, mode: RouterMode) -> ReplayConfig {
    ReplayConfig {
        cluster: ClusterConfig {
            num_workers,
            router: RouterConfig {
                mode,
                ..RouterConfig::default()
            },
            ..ClusterConfig::default()
        },
        trace_block_size: 512,
    }
}

fn report_json(trace: &trace::Trace, config: &ReplayConfig) -> serde_json::Value {
    let outcome = replay(trace, config, |_, _| {}).expect("replay runs");
    let mut v = serde_json::to_value(&outcome.report).expect("report serialises");
    for key in WALL_CLOCK_KEYS {
        v[key] = serde_json::Value::Null;
    }
    v
}

#[test]
fn same_seed_and_trace_give_byte_identical_reports() {
    let trace = trace::load(&fixture("trace_small.jsonl"), &TraceOptions::default())
        .expect("fixture loads");
    for mode in [
        RouterMode::KvRouter,
        RouterMode::RoundRobin,
        RouterMode::Random,
    ] {
        let c = config(3, mode);
        let a = serde_json::to_string(&report_json(&trace, &c)).unwrap();
        let b = serde_json::to_string(&report_json(&trace, &c)).unwrap();
        assert_eq!(a, b, "{mode}");
        let v: serde_json::Value = serde_json::from_str(&a).unwrap();
        assert_eq!(v["completed_requests"], v["num_requests"]);
    }
}

#[test]
fn single_request_ttft_and_e2e_by_hand() {
    // One request of 1000 tokens (2 hash ids of 512, clamped) and 3 output tokens.
    let text = r#"{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]}"#;
    let trace = trace::parse(text.as_bytes(), "one.jsonl", &TraceOptions::default()).unwrap();
    let outcome = replay(&trace, &config(1, RouterMode::RoundRobin), |_, _| {}).unwrap();
    let r = &outcome.report;
    // Prefill of 1000 tokens: 4.209989e-07 * 1000^2 + 1.518344e-02 * 1000 + 16.50142 =
    // 32.1058589 ms, on the clock to the nanosecond.
    assert_eq!(r.ttft.mean, 32.105859);
    // Two decode steps at u = 1001 and 1002 tokens of 16384 * 64: 5.7915 ms each. The passes
    // run back to back, so the end of the last one is the sum of the three, each rounded to
    // the nanosecond.
    let step_ns = |len: f64| {
        let u = len / (16384.0 * 64.0);
        ((-25.74 * u * u + 54.01 * u + 5.74) * 1e6).round()
    };
    let prefill_ns = ((4.209989e-07 * 1e6 + 1.518344e-02 * 1e3 + 16.50142f64) * 1e6).round();
    let end_ns = prefill_ns + step_ns(1001.0) + step_ns(1002.0);
    assert_eq!(end_ns, 43_688_982.0);
    assert_eq!(r.e2e_latency.mean, 43.688982);
    assert_eq!(r.total_output_tokens, 3);
    assert_eq!(r.prefix_cache_reused_ratio, 0.0);
    // The engine reads no clock: wall-clock figures are the caller's to fill in.
    assert_eq!(r.wall_time_ms, 0.0);
    let mut timed = r.clone();
    servesim::replay::set_wall_time(&mut timed, std::time::Duration::from_millis(500));
    assert_eq!(timed.wall_time_ms, 500.0);
    assert!((timed.processed_output_tokens_per_s - 6.0).abs() < 1e-9);
    assert!((timed.processed_tokens_per_s - 2.0 * (1000.0 + 3.0)).abs() < 1e-9);
}

#[test]
fn a_repeated_prompt_reuses_its_cached_prefix() {
    let text = concat!(
        r#"{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]}"#,
        "\n",
        r#"{"timestamp": 1000, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]}"#,
    );
    let trace = trace::parse(text.as_bytes(), "two.jsonl", &TraceOptions::default()).unwrap();
    let outcome = replay(&trace, &config(1, RouterMode::KvRouter), |_, _| {}).unwrap();
    // 15 full blocks of 64 (960 tokens) are cached; 40 tokens recomputed: 17.109431 ms.
    assert_eq!(outcome.records[1].reused_input_tokens, 960);
    assert_eq!(outcome.records[1].ttft_ms, Some(17.109431));
    assert_eq!(outcome.report.prefix_cache_reused_ratio, 960.0 / 2000.0);
}

#[test]
fn sessions_wait_for_the_previous_turn() {
    let text = concat!(
        r#"{"session_id": "a", "timestamp": 0, "input_length": 100, "output_length": 2, "hash_ids": [1]}"#,
        "\n",
        r#"{"session_id": "a", "delay": 50, "input_length": 200, "output_length": 2, "hash_ids": [1]}"#,
    );
    let trace = trace::parse(text.as_bytes(), "s.jsonl", &TraceOptions::default()).unwrap();
    let mut c = config(1, RouterMode::RoundRobin);
    c.cluster.engine = EngineConfig {
        latency: ScaledLatency {
            model: Arc::new(Fixed {
                prefill_ms: 10.0,
                decode_ms: 1.0,
            }),
            speedup_ratio: 1.0,
            decode_speedup_ratio: 1.0,
        },
        ..EngineConfig::default()
    };
    let outcome = replay(&trace, &c, |_, _| {}).unwrap();
    // Turn 0: first token at 10 ms (prefill), second at 11; turn 1 arrives at 11 + 50.
    assert_eq!(outcome.records[0].finish_ms, Some(11.0));
    assert_eq!(outcome.records[1].arrival_ms, 61.0);
    assert_eq!(outcome.records[1].ttft_ms, Some(10.0));
}

#[test]
fn kv_routing_beats_round_robin_on_prefix_reuse() {
    let trace = trace::load(&fixture("trace_small.jsonl"), &TraceOptions::default()).unwrap();
    let kv = replay(&trace, &config(4, RouterMode::KvRouter), |_, _| {}).unwrap();
    let rr = replay(&trace, &config(4, RouterMode::RoundRobin), |_, _| {}).unwrap();
    assert!(
        kv.report.prefix_cache_reused_ratio > rr.report.prefix_cache_reused_ratio,
        "kv {} vs rr {}",
        kv.report.prefix_cache_reused_ratio,
        rr.report.prefix_cache_reused_ratio
    );
}

/// A replay with a stop rule stops exactly when its full run misses the attainment: a run that
/// goes to the end has the full run's report, byte for byte (on one thread or two), and a
/// stopped one's bound on its attainment holds and is below the target.
#[test]
fn a_replay_stops_exactly_when_its_slo_is_lost() {
    use servesim::replay::{replay_with, Ended, ReplayOptions, StopRule};
    use servesim::slo::Slo;
    let (mut stopped, mut complete) = (0, 0);
    for speedup in [1.0, 4.0, 16.0] {
        let options = TraceOptions {
            arrival_speedup_ratio: speedup,
            ..TraceOptions::default()
        };
        let trace = trace::load(&fixture("trace_small.jsonl"), &options).unwrap();
        for (workers, mode) in [(1, RouterMode::RoundRobin), (2, RouterMode::KvRouter)] {
            let c = config(workers, mode);
            let full = replay(&trace, &c, |_, _| {}).unwrap();
            let text = |o: &servesim::replay::ReplayOutcome| {
                serde_json::to_string(&o.report).unwrap() + &format!("{:?}", o.records)
            };
            for slo in ["ttft=100ms,tpot=20ms", "ttft=400ms", "e2e=1s", "tpot=15ms"] {
                let slo: Slo = slo.parse().unwrap();
                let good = full.records.iter().filter(|r| slo.met(r)).count();
                let share = good as f64 / full.records.len() as f64;
                for attainment in [0.5, 0.8, 0.95] {
                    let stop = Some(StopRule { slo, attainment });
                    for one_thread in [false, true] {
                        let opts = ReplayOptions { stop, one_thread };
                        let at = format!("x{speedup} {workers} {mode} {slo:?} {attainment}");
                        match replay_with(&trace, &c, &opts).unwrap() {
                            Ended::Complete(o) => {
                                assert!(share >= attainment, "{at}: ran on at {share}");
                                assert_eq!(text(&o), text(&full), "{at}");
                                complete += 1;
                            }
                            Ended::Stopped(s) => {
                                assert!(share < attainment, "{at}: stopped at {share}");
                                let most = s.attainment_at_most();
                                assert!(share <= most && most < attainment, "{at}: {s:?}");
                                assert!(s.line >= 1 && s.line <= 20, "{at}: {s:?}");
                                assert!(s.nth <= s.missed, "{at}: {s:?}");
                                stopped += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        stopped > 10 && complete > 10,
        "{stopped} stopped, {complete} ran on"
    );
}
