//! The plan's two inputs beyond a trace's per-request bounds: the trajectory E2E bound of an
//! agentic trace (`--slo trajectory_e2e=...`, counted by `mockserve plan` and `mockserve replay`,
//! refused where a run has no trajectories), and synthetic load instead of TRACE
//! (`--request-rate ...`, the same requests for the same seed, its command reproducing it).

use std::path::Path;

use serde_json::Value;
use servesim::trace::synthetic::{Arrival, Lengths, SyntheticLoad};

use super::{fails, json, mockserve, ok, scratch, write};

/// An agentic trace of `plays` plays all due at once, each a chain of three requests with
/// prompts of their own: on one worker they queue behind each other, on two they queue less.
fn contended_agentic_trace(plays: usize) -> String {
    let mut out = String::from(
        "{\"schema\":\"dynamo.agentic_mooncake\",\"version\":2,\"block_size\":64,\
         \"hash_id_scope\":\"local\",\"source\":{\"format\":\"hand\",\"digest\":\"x\"}}\n",
    );
    for p in 0..plays {
        for r in 0..3 {
            let ids: Vec<String> = (0..32)
                .map(|b| (p * 1000 + r * 100 + b).to_string())
                .collect();
            let deps = if r == 0 {
                "[]".to_string()
            } else {
                format!(
                    "[{{\"request_id\":\"p{p}r{}\",\"trigger\":\"completion\",\
                     \"relation\":\"sequence\",\"delay_ms\":0}}]",
                    r - 1
                )
            };
            out.push_str(&format!(
                "{{\"request_id\":\"p{p}r{r}\",\"play_id\":\"p{p}\",\"session_id\":\"main\",\
                 \"model\":\"M\",\"input_length\":2048,\"output_length\":32,\"hash_ids\":[{}],\
                 \"not_before_ms\":0,\"dependencies\":{deps}}}\n",
                ids.join(",")
            ));
        }
    }
    out
}

/// The replay report of `trace` on `workers` workers.
fn replay_report(dir: &Path, trace: &str, workers: &str, extra: &[&str]) -> Value {
    let out = dir.join(format!("replay-{workers}.json"));
    let out_s = out.display().to_string();
    let mut args = vec![
        "replay",
        trace,
        "--num-workers",
        workers,
        "--arrival-speedup-ratio",
        "1",
        "-q",
        "--report-json",
        out_s.as_str(),
    ];
    args.extend_from_slice(extra);
    ok(&mockserve(&args));
    json(&out)
}

fn best_workers(report: &Value) -> &Value {
    &report["best"]["knobs"]["num_workers"]
}

#[test]
fn a_trajectory_bound_changes_which_agentic_candidate_ranks_first() {
    let dir = scratch("trajectory-rank");
    let trace = write(&dir, "agentic.jsonl", &contended_agentic_trace(6));
    let one = replay_report(&dir, &trace, "1", &[]);
    let two = replay_report(&dir, &trace, "2", &[]);
    let longest = |r: &Value| {
        r["agentic"]["max_trajectory_e2e_latency_ms"]
            .as_f64()
            .unwrap()
    };
    let (m1, m2) = (longest(&one), longest(&two));
    assert!(m2 < m1, "two workers end their plays sooner: {m2} vs {m1}");
    let space = write(&dir, "space.toml", "num_workers = [1, 2]\n");
    let plan = |slo: &str, name: &str| -> Value {
        let report = dir.join(name).display().to_string();
        ok(&mockserve(&[
            "plan",
            &trace,
            "--space",
            &space,
            "--slo",
            slo,
            "--attainment",
            "1",
            "--arrival-speedup-ratio",
            "1",
            "--speedup-steps",
            "0",
            "-q",
            "--report-json",
            &report,
        ]));
        json(Path::new(&report))
    };
    // Per-request bounds alone: both meet them, one worker gives more goodput per GPU.
    let loose = plan("e2e=600s", "loose.json");
    assert_eq!(loose["ranking"].as_array().unwrap().len(), 2);
    assert_eq!(best_workers(&loose), 1);
    // Every play within the two-worker makespan: one worker misses it with some plays.
    let bound = format!("e2e=600s,trajectory_e2e={m2}ms");
    let tight = plan(&bound, "tight.json");
    assert_eq!(best_workers(&tight), 2);
    assert_eq!(tight["best"]["slo_attainment"], 1.0);
    let trial_one = tight["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["knobs"]["num_workers"] == 1)
        .expect("the one-worker trial");
    assert!(
        trial_one["slo_attainment"].as_f64().unwrap() < 1.0,
        "{trial_one}"
    );
    // Only the candidates meeting it rank (--attainment 1).
    assert_eq!(tight["ranking"].as_array().unwrap().len(), 1);
}

#[test]
fn mockserve_replay_counts_each_request_through_its_play() {
    let dir = scratch("trajectory-replay");
    let trace = "fixtures/agentic/worked_example.jsonl";
    let base = replay_report(&dir, trace, "1", &["--slo", "ttft=600s"]);
    assert_eq!(base["slo"]["good_requests"], 5);
    assert_eq!(base["slo"]["slo_attainment"], 1.0);
    let plays = base["agentic"]["plays"].as_array().unwrap();
    let shortest = plays
        .iter()
        .map(|p| p["makespan_ms"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    // Only the requests of plays ending within the bound meet it.
    let expected: u64 = plays
        .iter()
        .filter(|p| p["makespan_ms"].as_f64().unwrap() <= shortest)
        .map(|p| p["requests"].as_u64().unwrap())
        .sum();
    assert!(expected < 5);
    let slo = format!("ttft=600s,trajectory_e2e={shortest}ms");
    let r = replay_report(&dir, trace, "1", &["--slo", &slo]);
    assert_eq!(r["slo"]["good_requests"], expected);
    assert_eq!(r["slo"]["num_requests"], 5);
    assert_eq!(r["slo"]["slo"]["trajectory_e2e_ms"], shortest);
    assert_eq!(
        r["slo"]["slo_attainment"].as_f64().unwrap(),
        expected as f64 / 5.0
    );
}

#[test]
fn a_trajectory_bound_without_trajectories_is_refused_naming_slo() {
    let dir = scratch("trajectory-refused");
    let space = write(&dir, "space.toml", "num_workers = [1]\n");
    let slo = "ttft=1s,trajectory_e2e=60s";
    let err = fails(&mockserve(&[
        "plan",
        "fixtures/trace_small.jsonl",
        "--space",
        &space,
        "--slo",
        slo,
        "-q",
    ]));
    assert!(
        err.contains(
            "--slo: trajectory_e2e bounds the plays (trajectories) of an agentic trace, and the \
             plain Mooncake trace fixtures/trace_small.jsonl has none"
        ),
        "{err}"
    );
    let err = fails(&mockserve(&[
        "plan",
        "--request-rate",
        "10",
        "--space",
        &space,
        "--slo",
        slo,
        "-q",
    ]));
    assert!(err.contains("and synthetic load has none"), "{err}");
    let err = fails(&mockserve(&[
        "plan",
        "fixtures/agentic/worked_example.jsonl",
        "--space",
        &space,
        "--slo",
        slo,
        "--verify",
        "-q",
    ]));
    assert!(
        err.contains("it cannot check --slo trajectory_e2e"),
        "{err}"
    );
    let err = fails(&mockserve(&[
        "replay",
        "fixtures/trace_small.jsonl",
        "--slo",
        slo,
        "-q",
    ]));
    assert!(
        err.contains("--slo: trajectory_e2e bounds the plays") && err.contains("trace_small"),
        "{err}"
    );
}

/// The synthetic flags of the tests below.
const LOAD: &[&str] = &[
    "--request-rate",
    "40",
    "--num-requests",
    "30",
    "--input-tokens",
    "300",
    "--input-tokens-stddev",
    "60",
    "--output-tokens",
    "12",
    "--shared-prefix-tokens",
    "128",
    "--num-prefix-groups",
    "2",
];

fn per_request(dir: &Path, name: &str, extra: &[&str]) -> (String, Value) {
    let records = dir.join(format!("{name}.jsonl")).display().to_string();
    let report = dir.join(format!("{name}.json")).display().to_string();
    let mut args = vec!["replay"];
    args.extend_from_slice(LOAD);
    args.extend_from_slice(extra);
    args.extend([
        "-q",
        "--per-request-jsonl",
        records.as_str(),
        "--report-json",
        report.as_str(),
    ]);
    ok(&mockserve(&args));
    (
        std::fs::read_to_string(&records).expect("records"),
        json(Path::new(&report)),
    )
}

#[test]
fn synthetic_load_replays_the_generators_requests_the_same_for_a_seed() {
    let dir = scratch("synthetic-replay");
    let (a, report) = per_request(&dir, "a", &["--seed", "5"]);
    let (b, _) = per_request(&dir, "b", &["--seed", "5"]);
    assert_eq!(a, b, "same seed, same bytes");
    let (c, _) = per_request(&dir, "c", &["--seed", "6"]);
    assert_ne!(a, c, "another seed, other requests");
    assert_eq!(report["num_requests"], 30);
    // The engine's generator (the one loadgen bench sends from) gives every arrival and length:
    // the rate as given (no trace speed-up without --arrival-speedup-ratio).
    let load = SyntheticLoad {
        rate: 40.0,
        arrival: Arrival::Poisson,
        burstiness: 1.0,
        num_requests: Some(30),
        duration_s: None,
        lengths: Lengths {
            input_tokens: 300,
            input_tokens_stddev: 60.0,
            output_tokens: 12,
            output_tokens_stddev: 0.0,
            shared_prefix_tokens: 128,
            num_prefix_groups: 2,
        },
        seed: 5,
    };
    let offsets = load.offsets().expect("offsets");
    let mut records: Vec<Value> = a
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect();
    records.sort_by_key(|r| r["request_id"].as_u64());
    assert_eq!(records.len(), 30);
    let mut reused = 0;
    for (k, r) in records.iter().enumerate() {
        let (unique, output) = load.lengths(k);
        assert_eq!(r["input_length"], 128 + unique, "request {k}");
        assert_eq!(r["output_length"], output as u64);
        let arrival = r["arrival_ms"].as_f64().unwrap();
        assert!(
            (arrival - offsets[k] * 1000.0).abs() < 1e-3,
            "{arrival} {k}"
        );
        // Only the shared prefix is ever found cached: its whole blocks.
        let hit = r["reused_input_tokens"].as_u64().unwrap();
        assert!(hit <= 128, "request {k} reused {hit}");
        reused += hit;
    }
    assert!(reused > 0, "the groups' prefixes are shared KV blocks");
    // An explicit speed-up divides the arrivals, as for a trace.
    let (fast, _) = per_request(
        &dir,
        "fast",
        &["--seed", "5", "--arrival-speedup-ratio", "2"],
    );
    let last = |text: &str| {
        text.lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["arrival_ms"]
                    .as_f64()
                    .unwrap()
            })
            .fold(0.0, f64::max)
    };
    assert!((last(&fast) * 2.0 - last(&a)).abs() < 1e-3);
}

#[test]
fn a_synthetic_plan_ranks_and_its_command_reproduces_the_ledger() {
    let dir = scratch("synthetic-plan");
    let space = write(&dir, "space.toml", "num_workers = [1, 2]\n");
    let report = dir.join("r.json").display().to_string();
    let ledger = dir.join("l.jsonl").display().to_string();
    let mut args = vec!["plan", "--space", space.as_str()];
    args.extend_from_slice(LOAD);
    args.extend([
        "--seed",
        "3",
        "--slo",
        "ttft=2s",
        "--speedup-steps",
        "2",
        "--report-json",
        report.as_str(),
        "--ledger",
        ledger.as_str(),
        "-q",
    ]);
    let table = ok(&mockserve(&args));
    assert!(
        table.contains("Plan over synthetic load: 2 candidates"),
        "{table}"
    );
    let r = json(Path::new(&report));
    assert_eq!(r["ranking"].as_array().unwrap().len(), 2);
    let best = &r["best"];
    let command = best["command"].as_str().unwrap();
    assert!(
        command.starts_with("mockserve replay --request-rate 40 --num-requests 30"),
        "{command}"
    );
    assert!(command.contains("--arrival-speedup-ratio 1"), "{command}");
    assert!(command.contains("--seed 3"), "{command}");
    let fleet = best["fleet_command"].as_str().unwrap();
    assert!(
        !fleet.contains("--request-rate") && !fleet.contains("--num-requests"),
        "{fleet}"
    );
    // The command reproduces the ledger's figures.
    let out = dir.join("replayed.json").display().to_string();
    let mut words: Vec<&str> = command.split(' ').skip(1).collect();
    words.extend(["-q", "--report-json", out.as_str()]);
    ok(&mockserve(&words));
    let replayed = json(Path::new(&out));
    let recorded = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["index"] == best["index"])
        .expect("in the ledger");
    let stats = recorded["figures"]["report"].as_object().unwrap();
    assert!(stats.len() >= 30);
    for (k, v) in stats {
        assert_eq!(&replayed[k], v, "{k} of {command}");
    }
    // The same search again: the same report bytes.
    let again = dir.join("again.json").display().to_string();
    let mut args2: Vec<&str> = args.clone();
    let at = args2.iter().position(|a| *a == report.as_str()).unwrap();
    args2[at] = again.as_str();
    let at = args2.iter().position(|a| *a == "--ledger").unwrap();
    args2.drain(at..at + 2);
    ok(&mockserve(&args2));
    assert_eq!(
        std::fs::read_to_string(&report).unwrap(),
        std::fs::read_to_string(&again).unwrap()
    );
    // Halving cuts synthetic load into prefixes of its requests as it cuts a trace's sessions.
    let halving = dir.join("h.json").display().to_string();
    let mut args3: Vec<&str> = args2.clone();
    let at = args3.iter().position(|a| *a == again.as_str()).unwrap();
    args3[at] = halving.as_str();
    args3.extend(["--strategy", "halving"]);
    ok(&mockserve(&args3));
    assert_eq!(json(Path::new(&halving))["best"]["index"], best["index"]);
}

#[test]
fn bad_input_flags_are_named() {
    let dir = scratch("synthetic-errors");
    let space = write(&dir, "space.toml", "num_workers = [1]\n");
    let cases: &[(&[&str], &str)] = &[
        (&[], "give a TRACE, or synthetic load with --request-rate R"),
        (
            &["fixtures/trace_small.jsonl", "--request-rate", "5"],
            "--request-rate describes synthetic load, which replaces TRACE",
        ),
        (
            &["--concurrency", "4"],
            "--concurrency (loadgen bench's closed loop) does not fit a replay",
        ),
        (
            &["--num-requests", "10"],
            "--num-requests describes synthetic load: it needs --request-rate",
        ),
        (
            &["--request-rate", "0"],
            "--request-rate must be above 0 and at most 1000000, or inf, got 0",
        ),
        (
            &["--request-rate", "inf"],
            "--request-rate inf needs --num-requests",
        ),
        (
            &["--request-rate", "5", "--burstiness", "2"],
            "--burstiness is the shape of gamma gaps: it needs --arrival gamma",
        ),
        (
            &["--request-rate", "5", "--output-tokens", "0"],
            "--output-tokens must be from 1 to 4194304, got 0",
        ),
        (
            &["--request-rate", "5", "--num-prefix-groups", "3"],
            "--num-prefix-groups needs --shared-prefix-tokens",
        ),
        (
            &["--request-rate", "5", "--trace-block-size", "64"],
            "--trace-block-size reads a trace; synthetic load has none",
        ),
        (
            &["--request-rate", "1e6", "--duration", "100"],
            "schedules about 100000000 requests",
        ),
        (
            &["--request-rate", "5", "--arrival", "bursty"],
            "invalid value 'bursty' for '--arrival <ARRIVAL>'",
        ),
        (
            &["--request-rate", "5", "--verify"],
            "--verify replays the TRACE live through loadgen replay",
        ),
    ];
    for (flags, needle) in cases {
        for command in ["plan", "replay"] {
            if command == "replay" && flags.contains(&"--verify") {
                continue;
            }
            let mut args = vec![command];
            args.extend_from_slice(flags);
            if command == "plan" {
                args.extend(["--space", space.as_str(), "--slo", "ttft=1s"]);
            }
            args.push("-q");
            let err = fails(&mockserve(&args));
            assert!(
                err.contains(needle),
                "{command} {flags:?}: {needle:?} in {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}
