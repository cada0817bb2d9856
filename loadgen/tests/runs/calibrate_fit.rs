//! `loadgen calibrate --fit`: a profile fitted on a run of one trace times the offline side of
//! the gate on another. On a server whose engine runs at half speed (its runs recorded by the
//! engine itself, so the machine's load does not move the figures), the default engine model
//! is far off and the fitted profile brings TTFT, ITL and E2E within the margin; the live path
//! runs end to end against the embedded server; the same trace, a shared request, a fit run
//! with failures, records of another trace and too few observations are errors that name
//! `--fit` or `--fit-records`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use loadgen::calibrate::CalibrateArgs;
use serde_json::Value;

use crate::common::{args, within, TempDir};

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    root.join(name).display().to_string()
}

/// The "real" server: the embedded engine at half speed.
const SLOW: [&str; 2] = ["--speedup-ratio", "0.5"];

/// A run of `trace` on the half-speed engine, as the engine times it (`mockserve replay`):
/// its per-request records.
fn recorded(trace: &str, out: &Path) -> Result<()> {
    let out = out.display().to_string();
    let mut argv = vec![
        "mockserve",
        "replay",
        trace,
        "-q",
        "--per-request-jsonl",
        &out,
    ];
    argv.extend_from_slice(&SLOW);
    let cli = <mock_server::Cli as clap::Parser>::try_parse_from(argv)?;
    match cli.command {
        Some(mock_server::Command::Replay(a)) => {
            mock_server::cmd::replay::run(&a)?;
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

fn bias(run: &loadgen::calibrate::CalibrateRun, key: &str) -> f64 {
    run.json["metrics"][key]["bias"]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} bias in {}", run.json["metrics"]))
}

async fn calibrate_err(flags: &[&str]) -> Result<String> {
    let a = args::<CalibrateArgs>(flags);
    Ok(within(120, loadgen::calibrate::calibrate(&a))
        .await?
        .expect_err("refused")
        .to_string())
}

/// Fit on trace_fit, gate on trace_small: the default engine model predicts the half-speed
/// server's TTFT, ITL and E2E far too low; the profile fitted on the other trace's run
/// predicts them within the 10% margin. The report names both traces and the profile is a
/// `--perf-profile` `mockserve replay` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_fitted_on_one_trace_gates_another() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate-fit")?;
    let fit_trace = fixture("trace_fit.jsonl");
    let gate_trace = fixture("trace_small.jsonl");
    let fit_records = tmp.join("fit.jsonl");
    let gate_records = tmp.join("gate.jsonl");
    recorded(&fit_trace, &fit_records)?;
    recorded(&gate_trace, &gate_records)?;
    let gate = gate_records.to_str().unwrap();
    let plain = args::<CalibrateArgs>(&[&gate_trace, "--records", gate, "--windows", "0"]);
    let plain = within(60, loadgen::calibrate::calibrate(&plain)).await??;
    let profile = tmp.join("fitted.npz");
    let report = tmp.join("gate.json");
    let fitted = args::<CalibrateArgs>(&[
        &gate_trace,
        "--records",
        gate,
        "--fit",
        &fit_trace,
        "--fit-records",
        fit_records.to_str().unwrap(),
        "--fit-profile",
        profile.to_str().unwrap(),
        "--windows",
        "0",
        "--report-json",
        report.to_str().unwrap(),
    ]);
    let fitted = within(60, loadgen::calibrate::calibrate(&fitted)).await??;
    for key in ["ttft", "itl", "e2e"] {
        let (before, after) = (bias(&plain, key), bias(&fitted, key));
        assert!(before > 0.5, "{key}: default-model bias {before}");
        assert!(
            after.abs() < 0.1,
            "{key}: fitted bias {after} (default {before})"
        );
    }
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert_eq!(json["gate_trace"], gate_trace);
    assert_eq!(json["fit"]["trace"], fit_trace);
    assert_eq!(json["fit"]["profile"], profile.display().to_string());
    assert_eq!(json["fit"]["requests"], 24);
    assert!(
        json["fit"]["decode_phases"].as_u64() >= Some(8),
        "{}",
        json["fit"]
    );
    assert_eq!(json["fit"]["engine_timed"], json["fit"]["equations"]);
    assert!(plain.json["fit"].is_null());
    // The fitted profile drives `mockserve replay --perf-profile` (and its JSON twin and
    // curves sit beside it).
    assert!(profile.with_extension("json").exists() && profile.with_extension("svg").exists());
    let profile_arg = profile.display().to_string();
    let argv = [
        "mockserve",
        "replay",
        &gate_trace,
        "-q",
        "--perf-profile",
        &profile_arg,
    ];
    let cli = <mock_server::Cli as clap::Parser>::try_parse_from(argv)?;
    match cli.command {
        Some(mock_server::Command::Replay(a)) => {
            let outcome = mock_server::cmd::replay::run(&a)?;
            assert_eq!(outcome.report.completed_requests, 20);
        }
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// What `--fit` refuses, each naming it: the gate trace itself, a trace sharing a request with
/// the gate, a fit run with failures, records of another trace, and a run with too few
/// observations; and the flags that need each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fit_errors_name_the_fit() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate-fit")?;
    let fit_trace = fixture("trace_fit.jsonl");
    let gate_trace = fixture("trace_small.jsonl");
    let profile = tmp.join("p.npz");
    let p = profile.to_str().unwrap();
    let e = calibrate_err(&[&gate_trace, "--fit", &gate_trace, "--fit-profile", p]).await?;
    assert!(
        e.starts_with(&format!("calibrate: --fit {gate_trace} is the gate trace")),
        "{e}"
    );
    // A fit trace holding one of the gate's rows (line 4 of trace_small).
    let small = std::fs::read_to_string(&gate_trace)?;
    let fit_text = std::fs::read_to_string(&fit_trace)?;
    let shared = tmp.join("shared.jsonl");
    let row = small.lines().nth(3).unwrap();
    std::fs::write(&shared, format!("{fit_text}{row}\n"))?;
    let shared_arg = shared.display().to_string();
    let e = calibrate_err(&[&gate_trace, "--fit", &shared_arg, "--fit-profile", p]).await?;
    assert!(
        e.contains(&format!(
            "share 1 of their 25 and 20 requests (first: {shared_arg}:25 is {gate_trace}:4)"
        )),
        "{e}"
    );
    // The fit run's records: one failed, a foreign one, and too few.
    let records = tmp.join("fit.jsonl");
    recorded(&fit_trace, &records)?;
    let lines: Vec<Value> = std::fs::read_to_string(&records)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let write = |name: &str, rows: &[Value]| -> Result<String> {
        let path = tmp.join(name);
        let text: String = rows.iter().map(|v| format!("{v}\n")).collect();
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };
    let fit_with = |r: &str| {
        let mut flags = vec![gate_trace.clone(), "--fit".into(), fit_trace.clone()];
        flags.extend([
            "--fit-records".into(),
            r.to_string(),
            "--fit-profile".into(),
        ]);
        flags.push(p.to_string());
        flags
    };
    let mut failed = lines.clone();
    failed[3]["error"] = Value::from("HTTP 500: boom");
    let r = write("failed.jsonl", &failed)?;
    let flags = fit_with(&r);
    let e = calibrate_err(&flags.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    assert_eq!(
        e,
        format!(
            "calibrate: --fit-records {r}: 1 of 24 requests of the fit run failed: a profile \
             is not fitted from a run with failures"
        )
    );
    let mut foreign = lines.clone();
    foreign[0]["session_id"] = Value::from("elsewhere");
    let r = write("foreign.jsonl", &foreign)?;
    let flags = fit_with(&r);
    let e = calibrate_err(&flags.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    assert_eq!(
        e,
        format!(
            "calibrate: --fit-records {r}: {r}:1 (elsewhere#0) is not a request of the fit \
             trace {fit_trace}"
        )
    );
    let r = write("few.jsonl", &lines[..2])?;
    let flags = fit_with(&r);
    let e = calibrate_err(&flags.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    assert!(
        e.starts_with(&format!(
            "calibrate: --fit-records {r}: too few observations to fit a profile: "
        )) && e.contains("(2 requests)"),
        "{e}"
    );
    assert!(!profile.exists(), "no profile from a failed fit");
    for (flags, needle) in [
        (
            vec![gate_trace.as_str(), "--fit", &fit_trace],
            "--fit FIT_TRACE fits a profile: give --fit-profile PATH",
        ),
        (
            vec![
                gate_trace.as_str(),
                "--fit-records",
                "r.jsonl",
                "--fit-profile",
                p,
            ],
            "--fit-records reads the fit run of --fit FIT_TRACE",
        ),
    ] {
        let e = loadgen::validate(&loadgen::Command::Calibrate(args::<CalibrateArgs>(&flags)))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e}");
    }
    Ok(())
}

/// The live path: `--fit` runs the fit trace against the embedded server, fits on what the
/// server's `nvext.timing` says, then runs and gates the other trace. (The error figures of a
/// live run on a loaded machine are the machine's; the test above has the fit's accuracy.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fit_runs_the_fit_trace_live_then_gates() -> Result<()> {
    let tmp = TempDir::new("loadgen-calibrate-fit")?;
    let fit_trace = fixture("trace_fit.jsonl");
    let gate_trace = fixture("trace_small.jsonl");
    let profile = tmp.join("live.npz");
    let mut flags = vec![gate_trace.as_str(), "--fit", &fit_trace];
    let p = profile.display().to_string();
    flags.extend(["--fit-profile", &p, "--windows", "0"]);
    flags.extend_from_slice(&SLOW);
    let a = args::<CalibrateArgs>(&flags);
    let run = within(300, loadgen::calibrate::calibrate(&a)).await??;
    let fit = &run.json["fit"];
    assert_eq!(fit["trace"], fit_trace);
    assert!(fit["records"].is_null());
    assert_eq!(fit["requests"], 24);
    assert_eq!(fit["engine_timed"], fit["equations"], "{fit}");
    assert!(fit["decode_phases"].as_u64() >= Some(8), "{fit}");
    assert_eq!(run.json["counts"]["matched"], 20);
    assert!(profile.exists());
    Ok(())
}
