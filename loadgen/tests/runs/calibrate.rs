//! `loadgen calibrate` end to end: the offline replay against itself is exact; a server whose
//! decode is 25% slower shows as a positive ITL bias and fails TOST; live against the embedded
//! server on the same engine flags; an agentic trace gets trajectory E2E; records of another
//! trace, no matching request and failed requests are errors or counts, never silent matches.

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Parser;
use loadgen::calibrate::CalibrateArgs;
use loadgen::{Command, LoadgenError};

use crate::common::{args, run_ok, within, TempDir};

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    root.join(name).display().to_string()
}

/// `mockserve replay TRACE FLAGS --per-request-jsonl OUT`: the offline records.
fn offline_records(trace: &str, flags: &[&str], out: &Path) {
    let mut argv = vec!["mockserve", "replay", trace, "-q"];
    argv.extend_from_slice(flags);
    let out = out.display().to_string();
    argv.extend_from_slice(&["--per-request-jsonl", &out]);
    let cli = mock_server::Cli::try_parse_from(argv).expect("mockserve flags");
    match cli.command {
        Some(mock_server::Command::Replay(a)) => {
            mock_server::cmd::replay::run(&a).expect("offline replay");
        }
        other => panic!("{other:?}"),
    }
}

fn metric<'a>(run: &'a loadgen::calibrate::CalibrateRun, key: &str) -> &'a serde_json::Value {
    &run.json["metrics"][key]
}

/// The offline replay's own records as the live side: every figure is exact (no error, KS
/// D = 0, every TOST passes), and the report has the keys the interface names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_replay_against_itself_is_exact() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let trace = fixture("trace_small.jsonl");
    let records = tmp.join("self.jsonl");
    offline_records(&trace, &[], &records);
    let report = tmp.join("self.json");
    let html = tmp.join("self.html");
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--records",
        records.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    let run = within(60, loadgen::calibrate::calibrate(&a)).await??;
    for key in ["ttft", "itl", "e2e", "cached_tokens"] {
        let m = metric(&run, key);
        assert_eq!(m["n"], 20, "{key}");
        assert_eq!(m["excluded"], 0, "{key}");
        assert_eq!(m["mape"], 0.0, "{key}");
        assert_eq!(m["bias"], 0.0, "{key}");
        assert_eq!(m["ks_stat"], 0.0, "{key}");
        assert_eq!(m["ks_p"], 1.0, "{key}");
        assert_eq!(m["tost_pass"], true, "{key}");
    }
    assert_eq!(metric(&run, "e2e")["pearson_r"], 1.0);
    // Both sides name the worker (the same records): every request on the same one.
    assert_eq!(run.json["live_path"]["workers_compared"], 20);
    assert_eq!(run.json["live_path"]["same_worker"], 20);
    // Offline records have no server-side TTFT: no live overhead to show.
    assert_eq!(run.json["live_path"]["ttft_overhead_n"], 0);
    assert!(run.json["metrics"].get("trajectory_e2e").is_none());
    // Both sides through the same parser (serde_json's default float parsing is not exact).
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    let expected: serde_json::Value = serde_json::from_str(&serde_json::to_string(&run.json)?)?;
    assert_eq!(written, expected);
    let page = std::fs::read_to_string(&html)?;
    assert!(page.contains("E2E: measured against predicted"), "scatter");
    assert!(page.contains("E2E: CDFs"), "CDFs");
    // Same records, same seed: the same bytes; and `--gate` passes.
    let mut gated = a.clone();
    gated.gate = true;
    let again = within(60, loadgen::calibrate::calibrate(&gated)).await??;
    assert_eq!(
        serde_json::to_string(&again.json)?,
        serde_json::to_string(&run.json)?
    );
    Ok(())
}

/// Against a live server whose decode steps take 25% longer (`--decode-speedup-ratio 0.8`),
/// offline on the default flags: ITL shows a positive bias of at least 20% and TOST fails. The
/// live run's records are read back with `--records`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slower_decode_is_a_positive_itl_bias_and_tost_fails() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let trace = fixture("trace_small.jsonl");
    let records = tmp.join("slow.jsonl");
    // The engine at a quarter speed (40 ms decode steps) on both sides: the client's jitter on
    // a loaded machine (a late first chunk, then a burst) stays small against the steps.
    let argv = [
        "replay",
        &trace,
        "--speedup-ratio",
        "0.25",
        "--arrival-speedup-ratio",
        "0.25",
        "--decode-speedup-ratio",
        "0.8",
        "--per-request-jsonl",
        records.to_str().unwrap(),
        "--quiet",
    ];
    run_ok(60, &argv).await?;
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--speedup-ratio",
        "0.25",
        "--arrival-speedup-ratio",
        "0.25",
        "--records",
        records.to_str().unwrap(),
    ]);
    let run = within(60, loadgen::calibrate::calibrate(&a)).await??;
    let itl = metric(&run, "itl");
    let bias = itl["bias"].as_f64().expect("ITL bias");
    assert!(bias >= 0.2, "ITL bias {bias}");
    assert_eq!(itl["tost_pass"], false);
    assert_eq!(itl["tost_mean"]["pass"], false);
    assert_eq!(run.failed_live, 0);
    // `--gate`: the same comparison fails the command (exit status 4), naming the metrics
    // whose verdict failed, after the report is written.
    let report = tmp.join("gate.json");
    let mut gated = a.clone();
    gated.gate = true;
    gated.replay.run.report.report_json = Some(report.clone());
    let err = within(60, loadgen::calibrate::calibrate(&gated))
        .await?
        .expect_err("the gate fails");
    assert_eq!(err.exit_code(), loadgen::error::EXIT_GATE_FAILED);
    let LoadgenError::GateFailed { failed, margin } = &err else {
        panic!("{err}");
    };
    assert!(failed.contains(&"itl".to_string()), "{failed:?}");
    assert!(failed.iter().all(|k| metric(&run, k)["tost_pass"] == false));
    assert_eq!(*margin, 0.1);
    assert!(err
        .to_string()
        .starts_with("calibrate --gate: TOST at ±0.1 failed on "));
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert_eq!(written["metrics"]["itl"]["tost_pass"], false);
    Ok(())
}

/// Live against the embedded server with the same engine flags (at half speed, as the replay
/// test runs it, so client overhead stays small): every request matched, none failed, the
/// warm-up and windows applied, and E2E not below the prediction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_on_the_same_engine_flags_matches_every_request() -> Result<()> {
    let trace = fixture("trace_small.jsonl");
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--arrival-speedup-ratio",
        "0.5",
        "--speedup-ratio",
        "0.5",
        "--warmup",
        "100ms",
        "--windows",
        "2",
    ]);
    let run = within(120, loadgen::calibrate::calibrate(&a)).await??;
    let counts = &run.json["counts"];
    assert_eq!(counts["matched"], 20);
    assert_eq!(counts["failed_live"], 0);
    assert_eq!(counts["missing_live"], 0);
    let e2e = metric(&run, "e2e");
    let n = e2e["n"].as_u64().unwrap();
    assert_eq!(n + e2e["excluded"].as_u64().unwrap(), 20);
    assert_eq!(n + counts["warmup_excluded"].as_u64().unwrap(), 20);
    // A late client adds latency, it never removes it: live E2E is not below offline (the
    // upper side depends on the machine's load; docs/calibrate.md has measured figures).
    let bias = e2e["bias"].as_f64().unwrap();
    assert!(bias > -0.05, "E2E bias {bias}");
    for key in ["ttft", "itl", "cached_tokens"] {
        assert_eq!(metric(&run, key)["n"], n, "{key}");
    }
    // Every compared request names its worker on both sides, and the server its own TTFT,
    // from the engine's arrival: the client and HTTP path only ever add to it.
    let path = &run.json["live_path"];
    assert_eq!(path["workers_compared"], n);
    assert_eq!(path["ttft_overhead_n"], n);
    let overhead = path["ttft_overhead_ms"]["p50"].as_f64().expect("a median");
    assert!(overhead >= 0.0, "live TTFT less engine TTFT: {overhead} ms");
    assert_eq!(run.json["load_levels"].as_array().map(Vec::len), Some(2));
    Ok(())
}

/// The public Mooncake trace's first `rows` rows at arrival speed-up `speedup`, live on the
/// embedded server against the replay with the same (default) engine flags: TOST at ±10%
/// passes on the mean and the p90 of TTFT, ITL and E2E, with every request matched and none
/// failed. Real-time, so `#[ignore]`d: run by hand, alone, on a quiet machine (`cargo test -p
/// loadgen --test runs -- --ignored --exact --test-threads=1 calibrate::live_equals_...`).
/// Four workers, so routing can differ between the sides; with one core taken by a busy loop,
/// the x10 case failed its E2E p90 TOST once in two runs (docs/calibrate.md). CI runs the
/// one-worker short cases instead (`scripts/ci-calibrate.sh`, on a release build); the longer
/// cases are `scripts/calibrate.sh`'s.
async fn live_equals_offline_on_mooncake(rows: &str, speedup: &str) -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let trace = root
        .join("mooncake_synthetic_trace.jsonl")
        .display()
        .to_string();
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--max-requests",
        rows,
        "--arrival-speedup-ratio",
        speedup,
        "--warmup",
        "2s",
        "--windows",
        "2",
    ]);
    let run = within(300, loadgen::calibrate::calibrate(&a)).await??;
    for key in ["ttft", "itl", "e2e"] {
        let m = metric(&run, key);
        eprintln!(
            "x{speedup} {key}: mean {} p90 {}",
            m["tost_mean"], m["tost_p90"]
        );
    }
    let counts = &run.json["counts"];
    assert_eq!(counts["failed_live"], 0);
    assert_eq!(counts["missing_live"], 0);
    for key in ["ttft", "itl", "e2e"] {
        let m = metric(&run, key);
        for tost in ["tost_mean", "tost_p90"] {
            assert_eq!(
                m[tost]["pass"], true,
                "x{speedup} {key} {tost}: {}",
                m[tost]
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real time: run by hand on a quiet machine"]
async fn live_equals_offline_on_mooncake_at_speedup_1() -> Result<()> {
    live_equals_offline_on_mooncake("100", "1").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real time: run by hand on a quiet machine"]
async fn live_equals_offline_on_mooncake_at_speedup_10() -> Result<()> {
    live_equals_offline_on_mooncake("300", "10").await
}

/// `--jitter-draws K`: K more offline replays with arrivals moved by up to `--jitter-ms`; the
/// section brackets the unmoved prediction (1), the offline records read back as the live side
/// lie within it, moves of up to half a second do move the figures, and the same seed gives
/// the same section. Bad values and an agentic trace are refused before anything runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jittered_replays_give_the_prediction_s_own_spread() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let trace = fixture("trace_small.jsonl");
    let records = tmp.join("self.jsonl");
    offline_records(&trace, &[], &records);
    let base = [trace.as_str(), "--records", records.to_str().unwrap()];
    let with = |extra: &[&str]| {
        let mut argv = base.to_vec();
        argv.extend_from_slice(extra);
        args::<CalibrateArgs>(&argv)
    };
    let run = within(
        60,
        loadgen::calibrate::calibrate(&with(&["--jitter-draws", "4"])),
    )
    .await??;
    let spread = &run.json["offline_spread"];
    assert_eq!(spread["draws"], 4);
    assert_eq!(spread["jitter_ms"], 1.0);
    for key in ["ttft", "itl", "e2e", "cached_tokens"] {
        let m = &spread["metrics"][key];
        for stat in ["mean", "p90"] {
            let (lo, hi) = (m[stat][0].as_f64().unwrap(), m[stat][1].as_f64().unwrap());
            assert!(lo <= 1.0 && 1.0 <= hi, "{key} {stat}: {m}");
            assert_eq!(m["measured"][stat], 1.0, "{key} {stat}");
            assert_eq!(m["within"][stat], true, "{key} {stat}");
        }
    }
    let wide = with(&["--jitter-draws", "4", "--jitter-ms", "500"]);
    let moved = within(60, loadgen::calibrate::calibrate(&wide)).await??;
    let ttft = &moved.json["offline_spread"]["metrics"]["ttft"]["mean"];
    assert!(
        ttft[0] != ttft[1],
        "arrivals moved by up to 500 ms move TTFT: {ttft}"
    );
    let again = within(60, loadgen::calibrate::calibrate(&wide)).await??;
    assert_eq!(again.json["offline_spread"], moved.json["offline_spread"]);

    for (flags, expect) in [
        (vec!["--jitter-ms", "2"], "give K too"),
        (vec!["--jitter-draws", "101"], "--jitter-draws"),
        (
            vec!["--jitter-draws", "2", "--jitter-ms", "0"],
            "--jitter-ms",
        ),
    ] {
        let err = within(60, loadgen::calibrate::calibrate(&with(&flags)))
            .await?
            .expect_err("refused");
        assert!(err.to_string().contains(expect), "{flags:?}: {err}");
    }
    let agentic = fixture("agentic/worked_example.jsonl");
    let a = args::<CalibrateArgs>(&[
        &agentic,
        "--records",
        records.to_str().unwrap(),
        "--jitter-draws",
        "2",
    ]);
    let err = within(60, loadgen::calibrate::calibrate(&a))
        .await?
        .expect_err("refused");
    assert!(err.to_string().contains("agentic trace"), "{err}");
    Ok(())
}

/// An agentic trace: trajectory E2E per play beside the per-request metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agentic_trace_gets_trajectory_e2e() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let trace = fixture("agentic/worked_example.jsonl");
    let records = tmp.join("agentic.jsonl");
    offline_records(
        &trace,
        &["--arrival-speedup-ratio", "10", "--num-workers", "1"],
        &records,
    );
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--arrival-speedup-ratio",
        "10",
        "--num-workers",
        "1",
        "--records",
        records.to_str().unwrap(),
    ]);
    let run = within(60, loadgen::calibrate::calibrate(&a)).await??;
    let t = metric(&run, "trajectory_e2e");
    assert_eq!(t["n"], 2, "{t}");
    assert_eq!(t["bias"], 0.0);
    assert_eq!(metric(&run, "e2e")["n"], 5);
    // Live against the embedded server: both plays compared.
    let live = args::<CalibrateArgs>(&[
        &trace,
        "--arrival-speedup-ratio",
        "10",
        "--num-workers",
        "1",
    ]);
    let run = within(60, loadgen::calibrate::calibrate(&live)).await??;
    assert_eq!(metric(&run, "trajectory_e2e")["n"], 2);
    assert_eq!(run.json["counts"]["matched"], 5);
    Ok(())
}

/// Bad input: records of another trace and records matching nothing are errors naming the
/// first foreign record; a failed live request is counted and left out, and more failures than
/// `--max-failure-rate` (1 of 20 above 1%) make the run fail after its report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_errors_and_failures_are_counted() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let small = fixture("trace_small.jsonl");
    let records = tmp.join("bad.jsonl");
    offline_records(&small, &[], &records);
    // Records of trace_small against another trace.
    let other = fixture("sessions_cumulative.jsonl");
    let a = args::<CalibrateArgs>(&[&other, "--records", records.to_str().unwrap()]);
    let e = within(60, loadgen::calibrate::calibrate(&a))
        .await?
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("calibrate: no live record matches a request of ")
            && e.contains("(records of another trace?): first ")
            && e.contains("bad.jsonl:1 ("),
        "{e}"
    );
    // A file with no record of the trace at all.
    let empty = tmp.join("empty.jsonl");
    std::fs::write(&empty, "\n")?;
    let a = args::<CalibrateArgs>(&[&small, "--records", empty.to_str().unwrap()]);
    let e = within(60, loadgen::calibrate::calibrate(&a))
        .await?
        .unwrap_err()
        .to_string();
    assert!(e.contains("no records (an empty file)"), "{e}");
    // One failed request: counted, excluded, and above the default 5% failure rate.
    let text = std::fs::read_to_string(&records)?;
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    lines[3]["status"] = "rejected".into();
    lines[3]["error"] = "HTTP 500: boom".into();
    let failed = tmp.join("failed.jsonl");
    std::fs::write(
        &failed,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )?;
    let report = tmp.join("failed.json");
    let a = args::<CalibrateArgs>(&[
        &small,
        "--records",
        failed.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
        "--max-failure-rate",
        "0.01",
    ]);
    let e = within(60, loadgen::calibrate::calibrate(&a))
        .await?
        .unwrap_err();
    assert!(
        matches!(
            e,
            LoadgenError::TooManyFailures {
                failed: 1,
                total: 20,
                ..
            }
        ),
        "{e}"
    );
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert_eq!(written["counts"]["failed_live"], 1);
    assert_eq!(written["metrics"]["ttft"]["n"], 19);
    let a = args::<CalibrateArgs>(&[
        &small,
        "--records",
        failed.to_str().unwrap(),
        "--max-failure-rate",
        "0.1",
    ]);
    let run = within(60, loadgen::calibrate::calibrate(&a)).await??;
    assert_eq!((run.failed_live, run.live_records), (1, 20));
    assert_eq!(metric(&run, "e2e")["n"], 19);
    // Flags are checked before anything runs.
    let e = loadgen::validate(&Command::Calibrate(args::<CalibrateArgs>(&[
        &small, "--margin", "0",
    ])))
    .unwrap_err()
    .to_string();
    assert_eq!(
        e,
        "invalid configuration: --margin must be above 0 and below 1, got 0"
    );
    Ok(())
}

/// Fit, then gate: `--fit-profile` measures the live target with `loadgen profile` first and
/// times the offline side with the fitted profile; it needs a live side to measure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fit_profile_fits_the_live_target_then_gates() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate")?;
    let trace = fixture("trace_small.jsonl");
    let profile = tmp.join("fit.npz");
    let a = args::<CalibrateArgs>(&[
        &trace,
        "--decode-speedup-ratio",
        "0.8",
        "--fit-profile",
        profile.to_str().unwrap(),
        "--windows",
        "0",
    ]);
    let run = within(300, loadgen::calibrate::calibrate(&a)).await??;
    assert!(profile.exists() && profile.with_extension("json").exists());
    assert_eq!(run.json["fit_profile"], profile.display().to_string());
    assert_eq!(run.json["counts"]["matched"], 20);
    assert_eq!(metric(&run, "itl")["n"], 20);
    let e = loadgen::validate(&Command::Calibrate(args::<CalibrateArgs>(&[
        &trace,
        "--records",
        "r.jsonl",
        "--fit-profile",
        "p.npz",
    ])))
    .unwrap_err()
    .to_string();
    assert!(e.contains("--fit-profile measures the live target"), "{e}");
    Ok(())
}
