//! `mockserve replay` parsed and run in-process: flags, the report and records files, errors.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use clap::Parser;
use mock_server::test_kit::TempDir;
use mock_server::{run, Cli};

/// Path of a file under the repository's `fixtures/`.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures")).join(name)
}

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("mockserve").chain(args.iter().copied()))
        .expect("flags parse")
}

#[test]
fn replay_writes_report_and_per_request_records() {
    let dir = TempDir::new("replay-cli").unwrap();
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
    // The command times the run (the engine itself reads no clock).
    assert!(v["wall_time_ms"].as_f64().unwrap() > 0.0, "{text}");
    // After Dynamo's keys, what timed the run.
    assert!(
        pos("std_output_token_throughput_per_user") < pos("config"),
        "{text}"
    );
    let model = v["config"]["latency_model"].as_str().unwrap_or_default();
    assert!(model.starts_with("polynomial prefill ["), "{model}");
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
fn unwritable_outputs_fail_before_the_run() {
    let trace = fixture("trace_small.jsonl");
    let err = run(cli(&[
        "replay",
        trace.to_str().unwrap(),
        "-q",
        "--report-json",
        "/nonexistent-dir/r.json",
    ]))
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("cannot create /nonexistent-dir/r.json"),
        "{err:#}"
    );
    let missing = run(cli(&["replay", "no-such-trace.jsonl", "-q"])).unwrap_err();
    assert_eq!(
        format!("{missing:#}"),
        "cannot read trace no-such-trace.jsonl: No such file or directory (os error 2)"
    );
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

#[test]
fn dynamos_disagg_command_runs_and_reports_the_transfers() {
    let dir = TempDir::new("replay-disagg").unwrap();
    let report = dir.join("report.json");
    let trace = fixture("trace_small.jsonl");
    let outcome = mock_server::cmd::replay::run(&match cli(&[
        "replay",
        trace.to_str().unwrap(),
        "--serving-mode",
        "disagg",
        "--num-prefill-workers",
        "2",
        "--num-decode-workers",
        "2",
        "--kv-bytes-per-token",
        "131072",
        "--report-json",
        report.to_str().unwrap(),
        "-q",
    ])
    .command
    {
        Some(mock_server::Command::Replay(args)) => *args,
        other => panic!("{other:?}"),
    })
    .expect("disagg replay runs");
    assert_eq!(
        outcome.report.completed_requests,
        outcome.report.num_requests
    );
    let d = outcome.report.disagg.clone().expect("disagg figures");
    assert_eq!(d.kv_transfers, outcome.report.num_requests);
    assert!(d.mean_kv_transfer_ms > 0.0);
    assert!(d.prefill_pool_utilization > 0.0 && d.decode_pool_utilization > 0.0);
    for r in &outcome.records {
        // input * 131072 B / 64 GB/s, to the nanosecond.
        let expected = (r.input_length as f64 * 131_072.0 / 64e3 * 1000.0).round() / 1e6;
        assert_eq!(r.kv_transfer_ms, Some(expected));
    }
    let text = std::fs::read_to_string(&report).unwrap();
    let dynamo_last = text
        .find("\"std_output_token_throughput_per_user\"")
        .unwrap();
    assert!(text.find("\"mean_kv_transfer_ms\"").unwrap() > dynamo_last);
}

#[test]
fn disagg_and_g2_flags_that_cannot_work_are_rejected() {
    let trace = fixture("trace_small.jsonl");
    let t = trace.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--num-prefill-workers", "2"],
            "only applies to --serving-mode disagg",
        ),
        (
            &["--serving-mode", "disagg", "--num-workers", "2"],
            "--num-workers applies to aggregated serving",
        ),
        (
            &["--kv-transfer-bandwidth", "10"],
            "only applies to --serving-mode disagg",
        ),
        (&["--num-g2-blocks", "100"], "needs --kv-bytes-per-token"),
        (
            &[
                "--num-g2-blocks",
                "100",
                "--kv-bytes-per-token",
                "1000",
                "--engine-type",
                "sglang",
            ],
            "needs --engine-type vllm",
        ),
        (&["--bandwidth-g2-to-g1-gbps", "3"], "need --num-g2-blocks"),
    ];
    for (flags, needle) in cases {
        let mut args = vec!["replay", t, "-q"];
        args.extend_from_slice(flags);
        let err = run(cli(&args)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{flags:?}: {msg}");
    }
}

#[test]
fn g2_replay_reports_host_tier_hits() {
    let trace = fixture("trace_small.jsonl");
    let args = match cli(&[
        "replay",
        trace.to_str().unwrap(),
        "--num-workers",
        "1",
        "--num-gpu-blocks",
        "160",
        "--num-g2-blocks",
        "4096",
        "--kv-bytes-per-token",
        "131072",
        "-q",
    ])
    .command
    {
        Some(mock_server::Command::Replay(args)) => *args,
        other => panic!("{other:?}"),
    };
    let outcome = mock_server::cmd::replay::run(&args).expect("G2 replay runs");
    let g2 = outcome.report.g2.clone().expect("G2 figures");
    assert_eq!(
        outcome.report.completed_requests,
        outcome.report.num_requests
    );
    let from_records: usize = outcome
        .records
        .iter()
        .map(|r| r.g2_reused_input_tokens)
        .sum();
    assert_eq!(g2.g2_reused_tokens, from_records as u64);
}

fn replay_args(args: &[&str]) -> mock_server::cmd::replay::ReplayArgs {
    match cli(args).command {
        Some(mock_server::Command::Replay(args)) => *args,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_request_that_can_never_run_is_counted_with_its_reason_and_its_session_goes_on() {
    let dir = TempDir::new("replay-huge").unwrap();
    let report = dir.join("report.json");
    let records = dir.join("records.jsonl");
    let trace = fixture("trace_huge_output.jsonl");
    let outcome = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        trace.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
        "--per-request-jsonl",
        records.to_str().unwrap(),
        "-q",
    ]))
    .expect("the other requests complete");
    let r = &outcome.report;
    assert_eq!((r.num_requests, r.completed_requests), (4, 3));
    assert_eq!(r.rejected_requests, 1);
    assert_eq!(outcome.rejections.len(), 1);
    let rejection = &outcome.rejections[0];
    assert_eq!(
        rejection.line, 2,
        "the trace line of the output_length 10000000 row"
    );
    assert!(
        matches!(
            rejection.reason,
            servesim::scheduler::RejectReason::ExceedsKvCapacity { .. }
        ),
        "{:?}",
        rejection.reason
    );
    let summary = mock_server::cmd::replay::rejection_summary(&outcome.rejections);
    assert!(summary.contains("exceeds_kv_capacity"), "{summary}");
    assert!(summary.contains("trace lines 2"), "{summary}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["rejected_requests"], 1);
    let statuses: Vec<String> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["status"].to_string())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| s.contains("rejected")).count(),
        1
    );
}

#[test]
fn a_run_in_which_nothing_completes_is_an_error_that_names_the_reason() {
    let trace = fixture("trace_small.jsonl");
    let t = trace.to_str().unwrap();
    for (flags, reason) in [
        (vec!["--num-gpu-blocks", "1"], "exceeds_kv_capacity"),
        (
            vec!["--max-num-batched-tokens", "16", "--no-chunked-prefill"],
            "exceeds_batch_budget",
        ),
    ] {
        let mut args = vec!["replay", t, "-q"];
        args.extend(flags.iter().copied());
        let parsed = replay_args(&args);
        let err = mock_server::cmd::replay::run(&parsed).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("no request completed: 20 of 20 were rejected"),
            "{flags:?}: {msg}"
        );
        // The reasons are in the library's outcome too.
        let outcome = servesim::replay::replay(
            &servesim::trace::load(&trace, &servesim::trace::TraceOptions::default()).unwrap(),
            &servesim::replay::ReplayConfig {
                cluster: parsed.engine.cluster_config().unwrap(),
                trace_block_size: 512,
            },
            |_, _| {},
        )
        .expect("a replay of refusals ends cleanly");
        assert_eq!(outcome.rejections.len(), 20);
        assert!(outcome.rejections.iter().all(|r| r.reason.code() == reason));
    }
}

#[test]
fn router_weights_that_cannot_work_are_clear_errors() {
    let trace = fixture("trace_small.jsonl");
    let t = trace.to_str().unwrap();
    for (flags, needle) in [
        (["--overlap-score-weight", "nan"], "--overlap-score-weight"),
        (["--overlap-score-weight", "inf"], "--overlap-score-weight"),
        (
            ["--overlap-score-weight", "1e308"],
            "--overlap-score-weight",
        ),
        (
            ["--overlap-score-weight=-1", "--seed=0"],
            "--overlap-score-weight",
        ),
        (["--router-temperature", "inf"], "--router-temperature"),
        (["--router-temperature", "nan"], "--router-temperature"),
        (["--num-workers", "1000000"], "--num-workers"),
        (["--speedup-ratio", "nan"], "--speedup-ratio"),
        (
            ["--num-gpu-blocks", "18446744073709551615"],
            "--num-gpu-blocks",
        ),
    ] {
        let mut args = vec!["replay", t, "-q"];
        args.extend(flags);
        let err = run(cli(&args)).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{flags:?}: {msg}");
    }
    // The largest weight allowed routes (no overflow, no panic).
    run(cli(&[
        "replay",
        t,
        "-q",
        "--overlap-score-weight",
        "1e6",
        "--num-workers",
        "3",
    ]))
    .expect("runs");
}

#[test]
fn trace_edge_cases_are_accepted_or_named() {
    // A byte order mark before the first row is skipped.
    let bom = fixture("trace_bom.jsonl");
    run(cli(&["replay", bom.to_str().unwrap(), "-q"])).expect("a BOM is fine");
    // A prompt longer than its hash ids cover is cut to them, and said so.
    let path = fixture("trace_clamped.jsonl");
    let trace = servesim::trace::load(&path, &servesim::trace::TraceOptions::default()).unwrap();
    let warning = mock_server::cmd::replay::clamped_warning(&trace, 512).expect("a warning");
    assert!(
        warning.contains("1 trace rows") && warning.contains("line 2, 6755 -> 1024 tokens"),
        "{warning}"
    );
    let clean = servesim::trace::load(
        &fixture("trace_small.jsonl"),
        &servesim::trace::TraceOptions::default(),
    )
    .unwrap();
    assert_eq!(mock_server::cmd::replay::clamped_warning(&clean, 512), None);
    run(cli(&["replay", path.to_str().unwrap(), "-q"])).expect("a clamped row runs");
    for (file, needle) in [
        ("bad/zero_output.jsonl", "zero_output.jsonl:2: \"output_length\" must be at least 1"),
        (
            "bad/object_session_id.jsonl",
            "object_session_id.jsonl:1: \"session_id\" must be a string or an integer, got an object",
        ),
    ] {
        let path = fixture(file);
        let err = run(cli(&["replay", path.to_str().unwrap(), "-q"])).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains(needle), "{file}: {msg}");
    }
}

/// A trace whose schedule runs past seven days (after the speed-up) is refused before the run,
/// naming its line; `--allow-long-schedule` replays it, with the duration it really has. A
/// timestamp no f64 holds in whole milliseconds is refused whatever the flag.
#[test]
fn a_long_schedule_is_refused_unless_allowed() {
    let dir = TempDir::new("replay-long").unwrap();
    let trace = dir.join("long.jsonl");
    // 40 days of trace time: 10 days at the default speed-up of 4.
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1]}\n\
         {\"timestamp\": 3456000000, \"output_length\": 2, \"hash_ids\": [2]}\n",
    )
    .unwrap();
    let path = trace.to_str().unwrap();
    let e = mock_server::cmd::replay::run(&replay_args(&["replay", path, "-q"]))
        .expect_err("ten days of schedule");
    let text = format!("{e:#}");
    assert!(
        text.contains("long.jsonl:2: session \"request_2\" arrives 10.0 days after")
            && text.contains("--allow-long-schedule"),
        "{text}"
    );
    let outcome = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        path,
        "-q",
        "--allow-long-schedule",
    ]))
    .expect("allowed");
    assert_eq!(outcome.report.completed_requests, 2);
    assert!(
        outcome.report.duration_ms >= 864_000_000.0 && outcome.report.duration_ms < 865_000_000.0,
        "{}",
        outcome.report.duration_ms
    );
    std::fs::write(
        &trace,
        "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1]}\n\
         {\"timestamp\": 1e300, \"output_length\": 2, \"hash_ids\": [2]}\n",
    )
    .unwrap();
    for extra in [None, Some("--allow-long-schedule")] {
        let mut args = vec!["replay", path, "-q"];
        args.extend(extra);
        let e = mock_server::cmd::replay::run(&replay_args(&args)).expect_err("1e300");
        let text = format!("{e:#}");
        assert!(
            text.contains("long.jsonl:2: \"timestamp\" must be finite, >= 0 and at most")
                && text.contains("got 1e300"),
            "{text}"
        );
    }
    let e = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        path,
        "--trace-block-size",
        "4294967296",
    ]))
    .expect_err("block size");
    assert_eq!(
        e.to_string(),
        "--trace-block-size must be from 1 to 1048576, got 4294967296"
    );
}

/// An agentic trace replays through the command: the format detected or named, floors and
/// delays at the recorded pace with `--arrival-speedup-ratio 1`, the report's usual keys plus an
/// `agentic` section; a plain Mooncake report has no such section.
#[test]
fn agentic_traces_replay_with_an_agentic_section() {
    let dir = TempDir::new("replay-agentic").unwrap();
    let report = dir.join("report.json");
    let records = dir.join("records.jsonl");
    let trace = fixture("agentic/worked_example.jsonl");
    for format in ["auto", "agentic-mooncake", "agentic_mooncake"] {
        let outcome = mock_server::cmd::replay::run(&replay_args(&[
            "replay",
            trace.to_str().unwrap(),
            "--trace-format",
            format,
            "--arrival-speedup-ratio",
            "1",
            "--num-workers",
            "1",
            "--report-json",
            report.to_str().unwrap(),
            "--per-request-jsonl",
            records.to_str().unwrap(),
            "-q",
        ]))
        .expect("the agentic replay runs");
        assert_eq!(outcome.report.completed_requests, 5, "{format}");
        let text = std::fs::read_to_string(&report).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["num_requests"], 5);
        assert_eq!(
            v["config"]["trace_block_size"], 64,
            "the header's block size"
        );
        let agentic = &v["agentic"];
        assert_eq!(agentic["input_format"], "agentic-mooncake");
        assert_eq!(agentic["completed_plays"], 2);
        // Trajectory E2E under AISimulate's keys: two completed plays, p50 the longer one.
        assert_eq!(agentic["total_trajectories"], 2);
        assert_eq!(agentic["completed_trajectories"], 2);
        assert_eq!(agentic["incomplete_trajectories"], 0);
        let spans = [
            agentic["plays"][0]["makespan_ms"].as_f64().unwrap(),
            agentic["plays"][1]["makespan_ms"].as_f64().unwrap(),
        ];
        let longer = spans[0].max(spans[1]);
        assert_eq!(agentic["p50_trajectory_e2e_latency_ms"], longer);
        assert_eq!(agentic["max_trajectory_e2e_latency_ms"], longer);
        assert_eq!(
            agentic["min_trajectory_e2e_latency_ms"],
            spans[0].min(spans[1])
        );
        assert!(
            (agentic["mean_trajectory_e2e_latency_ms"].as_f64().unwrap()
                - (spans[0] + spans[1]) / 2.0)
                .abs()
                < 1e-9
        );
        assert_eq!(agentic["plays"][0]["play_id"], "p0");
        assert_eq!(agentic["plays"][0]["critical_path_floor_wait_ms"], 1000.0);
        assert_eq!(agentic["source"]["format"], "hand");
        assert_eq!(
            agentic["plays"][0]["makespan_ms"], v["duration_ms"],
            "p0 ends last"
        );
        assert!(text.find("\"config\"") < text.find("\"agentic\""), "{text}");
        let arrivals: Vec<f64> = std::fs::read_to_string(&records)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["arrival_ms"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        assert_eq!(&arrivals[..3], &[0.0, 100.0, 300.0]);
        let second: serde_json::Value = serde_json::from_str(
            std::fs::read_to_string(&records)
                .unwrap()
                .lines()
                .nth(1)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            second["agentic"],
            serde_json::json!({"request_id": "r1", "play_id": "p0", "conversation_id": "sub", "parent_id": "r0"})
        );
    }
    let summary = mock_server::cmd::replay::agentic_summary(
        mock_server::cmd::replay::run(&replay_args(&[
            "replay",
            fixture("agentic/weka.jsonl").to_str().unwrap(),
            "--arrival-speedup-ratio",
            "1",
            "-q",
        ]))
        .expect("weka replays")
        .agentic
        .as_ref()
        .expect("agentic"),
    );
    assert!(
        summary.starts_with("Agentic trace (weka, block size 64"),
        "{summary}"
    );
    assert!(summary.contains("(1 completed, 0 failed)"), "{summary}");
    assert!(
        summary.contains("trajectory E2E over 1 completed of 1 (0 incomplete)"),
        "{summary}"
    );
    assert!(summary.contains("1000.000 ms tool waits"), "{summary}");
    // One lane: q0 (play p1) waits for p0 to settle.
    let laned = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        trace.to_str().unwrap(),
        "--arrival-speedup-ratio",
        "1",
        "--agentic-lanes",
        "1",
        "-q",
    ]))
    .expect("lanes replay");
    let agentic = laned.agentic.as_ref().expect("agentic");
    assert_eq!(agentic.lanes, Some(1));
    assert_eq!(agentic.plays[1].start_ms, agentic.plays[0].settled_at_ms);
    assert!(mock_server::cmd::replay::agentic_summary(agentic).contains(", 1 lanes)"));
    let e = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        fixture("trace_small.jsonl").to_str().unwrap(),
        "--agentic-lanes",
        "2",
        "-q",
    ]))
    .unwrap_err();
    assert!(
        format!("{e:#}").starts_with("--agentic-lanes needs an agentic trace"),
        "{e:#}"
    );
    // Legacy rows are detected by their wait_for.
    let legacy = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        fixture("agentic/legacy_v1.jsonl").to_str().unwrap(),
        "--trace-block-size",
        "64",
        "-q",
    ]))
    .expect("legacy replays");
    assert_eq!(legacy.agentic.as_ref().map(|a| a.play_count), Some(2));
    // Plain Mooncake: the same report as ever, no agentic key.
    mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        fixture("trace_small.jsonl").to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
        "-q",
    ]))
    .expect("plain replay");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(v.get("agentic").is_none());
}

/// Graph errors stop the command before the run, naming the file and line; a format named
/// is read as that format; unknown names are refused.
#[test]
fn agentic_trace_errors_are_named_before_the_run() {
    let dir = TempDir::new("replay-agentic-bad").unwrap();
    let path = dir.join("cycle.jsonl");
    let text = std::fs::read_to_string(fixture("agentic/agentic_mooncake_v2.jsonl"))
        .unwrap()
        .replace("\"dependencies\":[]", "\"dependencies\":[{\"request_id\":\"r1\",\"trigger\":\"completion\",\"relation\":\"sequence\"}]");
    std::fs::write(&path, text).unwrap();
    let p = path.to_str().unwrap();
    let e = mock_server::cmd::replay::run(&replay_args(&["replay", p, "-q"])).unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!("{p}:2: dependency cycle: \"r1\" -> \"r0\" -> \"r1\"")
    );
    let e = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        p,
        "--trace-format",
        "mooncake",
        "-q",
    ]))
    .unwrap_err();
    // Named plain Mooncake, the header is a row without hash ids.
    assert_eq!(
        format!("{e:#}"),
        format!("{p}:1: missing field \"hash_ids\"")
    );
    let parsed =
        mock_server::Cli::try_parse_from(["mockserve", "replay", p, "--trace-format", "csv"]);
    let e = parsed.expect_err("unknown format").to_string();
    assert!(e.contains("unknown trace format \"csv\""), "{e}");
}

/// A trace line over `MAX_TRACE_LINE_BYTES` (a plain Mooncake file, or a `.jsonl.gz` that
/// inflates to it) is one error naming the file, the line and the cap, before the run (issue 43:
/// the replay aborted on a failed allocation).
#[test]
fn a_trace_line_over_the_cap_is_named_before_the_run() {
    use std::io::Write;
    let dir = TempDir::new("replay-long-line").unwrap();
    let row = r#"{"timestamp":0,"input_length":4,"output_length":1,"hash_ids":[1]}"#;
    let long = "1".repeat(servesim::trace::MAX_TRACE_LINE_BYTES + 1);
    let plain = dir.join("plain.jsonl");
    std::fs::write(&plain, format!("{row}\n{row}\n{long}\n")).unwrap();
    let gz = dir.join("agentic.jsonl.gz");
    let mut out = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).unwrap(),
        flate2::Compression::fast(),
    );
    let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":4}"#;
    out.write_all(format!("{header}\n{long}\n").as_bytes())
        .unwrap();
    out.finish().unwrap();
    for (path, line) in [(&plain, 3), (&gz, 2)] {
        let p = path.to_str().unwrap();
        let e = mock_server::cmd::replay::run(&replay_args(&["replay", p, "-q"])).unwrap_err();
        assert_eq!(
            format!("{e:#}"),
            format!(
                "{p}:{line}: the line is longer than 16777216 bytes, the most a trace line may \
                 hold"
            )
        );
    }
}

/// A weka corpus directory: its `.json` and `.jsonl` files in path order (`notes.txt` left
/// out), ids keyed by their paths in the corpus, one lane taking the plays in that order. The
/// dispatch and last-token times are AISimulate's (0.13.0.dev202610270000000085) on the same
/// directory with one worker and one lane.
#[test]
fn a_weka_corpus_directory_replays_as_aisimulate_replays_it() {
    let dir = TempDir::new("replay-weka-corpus").unwrap();
    let records = dir.join("records.jsonl");
    let corpus = fixture("weka_corpus");
    mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        corpus.to_str().unwrap(),
        "--arrival-speedup-ratio",
        "1",
        "--num-workers",
        "1",
        "--agentic-lanes",
        "1",
        "--per-request-jsonl",
        records.to_str().unwrap(),
        "-q",
    ]))
    .expect("the corpus replays");
    let mut got: Vec<(String, f64, f64)> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                v["agentic"]["request_id"].as_str().unwrap().to_string(),
                v["arrival_ms"].as_f64().unwrap(),
                v["last_token_ms"].as_f64().unwrap(),
            )
        })
        .collect();
    got.sort_by(|a, b| a.1.total_cmp(&b.1));
    let want = [
        ("weka:2d6414eba35a594e:request:outer:0", 0.0, 35.692),
        ("weka:507bbb3b7d63ad13:request:outer:0", 35.692, 71.384),
        ("weka:ae79e8dbfe7ecc58:request:outer:0", 71.384, 107.076),
        ("weka:ae79e8dbfe7ecc58:request:outer:1", 1071.384, 1106.109),
        ("weka:2f961d03c4a07934:request:outer:0", 1106.109, 1140.814),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((id, arrival, last), (want_id, want_arrival, want_last)) in got.iter().zip(want) {
        assert_eq!(id, want_id);
        assert!((arrival - want_arrival).abs() <= 0.001, "{id}: {arrival}");
        assert!((last - want_last).abs() <= 0.001, "{id}: {last}");
    }
    // Only weka reads a directory.
    let e = mock_server::cmd::replay::run(&replay_args(&[
        "replay",
        corpus.to_str().unwrap(),
        "--trace-format",
        "dynamo",
        "-q",
    ]))
    .unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!(
            "{}: a directory is read only as a weka corpus, not as dynamo",
            corpus.display()
        )
    );
    // A symbolic link in a corpus is refused, naming it.
    let linked = dir.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::fs::copy(corpus.join("b.json"), linked.join("b.json")).unwrap();
    std::os::unix::fs::symlink(corpus.join("a.jsonl"), linked.join("a.jsonl")).unwrap();
    let e =
        mock_server::cmd::replay::run(&replay_args(&["replay", linked.to_str().unwrap(), "-q"]))
            .unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!(
            "{}: {} is a symbolic link, which a weka corpus may not hold",
            linked.display(),
            linked.join("a.jsonl").display()
        )
    );
    // A corpus with no weka file is empty; a file name that is not UTF-8 is named.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("notes.txt"), "no trace").unwrap();
    let e = mock_server::cmd::replay::run(&replay_args(&["replay", empty.to_str().unwrap(), "-q"]))
        .unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!("{}: trace contains no requests", empty.display())
    );
    let odd = dir.join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    let name: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(b"\xff.json");
    std::fs::write(odd.join(name), "{}").unwrap();
    let e = mock_server::cmd::replay::run(&replay_args(&["replay", odd.to_str().unwrap(), "-q"]))
        .unwrap_err();
    assert_eq!(
        format!("{e:#}"),
        format!(
            "{}: {} has a name that is not UTF-8",
            odd.display(),
            odd.join(name).display()
        )
    );
}
