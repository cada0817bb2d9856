use clap::Parser;
use mock_server::{run, Cli};

use crate::fixture;

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("mockserve").chain(args.iter().copied()))
        .expect("flags parse")
}

#[test]
fn replay_writes_report_and_per_request_records() {
    let dir = std::env::temp_dir().join(format!("servesim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let records = dir.join("records.jsonl");
    let trace = fixture("trace_small.jsonl");
    run(cli(&[
        "replay",
        trace.to_str().unwrap(),
        "--num-workers",
        "2",
        "--report-json",
        report.to_str().unwrap(),
        "--per-request-jsonl",
        records.to_str().unwrap(),
        "--quiet",
    ]))
    .expect("replay runs");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    // Keys in Dynamo's order.
    let text = std::fs::read_to_string(&report).unwrap();
    let pos = |k: &str| {
        text.find(&format!("\"{k}\""))
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    let order = [
        "num_requests",
        "completed_requests",
        "duration_ms",
        "prefix_cache_reused_ratio",
        "mean_ttft_ms",
        "p99_e2e_latency_ms",
    ];
    assert!(order.windows(2).all(|w| pos(w[0]) < pos(w[1])), "{text}");
    let lines = std::fs::read_to_string(&records).unwrap();
    assert_eq!(
        lines.lines().count() as u64,
        v["num_requests"].as_u64().unwrap()
    );
    for line in lines.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["status"], "completed");
        assert!(r["ttft_ms"].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn malformed_trace_lines_are_errors_with_file_and_line() {
    let bad = fixture("bad/missing_hash_ids.jsonl");
    let err = run(cli(&["replay", bad.to_str().unwrap(), "-q"])).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("missing_hash_ids.jsonl:2"), "{msg}");
    assert!(msg.contains("hash_ids"), "{msg}");
}

#[test]
fn invalid_settings_are_rejected_before_running() {
    let trace = fixture("trace_small.jsonl");
    let t = trace.to_str().unwrap();
    for (flags, needle) in [
        (vec!["--num-workers", "0"], "--num-workers"),
        (vec!["--block-size", "0"], "--block-size"),
        (
            vec![
                "--router-mode",
                "round-robin",
                "--router-queue-threshold",
                "2",
            ],
            "kv-router",
        ),
        (vec!["--arrival-speedup-ratio", "0"], "speedup"),
    ] {
        let mut args = vec!["replay", t, "-q"];
        args.extend(flags);
        let err = run(cli(&args)).unwrap_err();
        assert!(format!("{err:#}").contains(needle), "{args:?}: {err:#}");
    }
    assert!(Cli::try_parse_from(["mockserve", "replay", t, "--engine-type", "tgi"]).is_err());
    assert!(Cli::try_parse_from(["mockserve", "replay", t, "--iterations", "0"]).is_err());
}
