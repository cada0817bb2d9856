//! Issue 43's bounds on loadgen itself: a closed stdout pipe ends the console quietly while the
//! run writes its files; `merge` checks every header field of the records it reads; report and
//! record reads are capped; an agentic replay has a default in-flight cap; the routing line
//! tells loadgen's own decisions from other clients'.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use loadgen::bench::BenchArgs;
use loadgen::LoadgenError;
use serde_json::Value;

use crate::common::{args, run_err, run_ok, s, within, TempDir};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_pipe_ends_the_console_and_the_report_is_still_written() -> Result<()> {
    let tmp = TempDir::new("loadgen-bounds")?;
    let report = tmp.join("closed-pipe.json");
    let _ = std::fs::remove_file(&report);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "bench",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "20",
            "--quiet",
            "--report-json",
            &s(&report),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    // The reader goes away before loadgen prints a line, as `| head -0` would.
    drop(child.stdout.take());
    let out = within(120, child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert_eq!(json["completed_requests"], 20, "{json}");
    let _ = std::fs::remove_file(&report);
    Ok(())
}

/// The first record of `path` as JSON.
fn first_record(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)?;
    Ok(serde_json::from_str(
        text.lines().next().context("a record")?,
    )?)
}

/// `loadgen merge` of `record` written alone to `path`: its error text.
async fn merge_err(path: &Path, record: &Value) -> Result<String> {
    std::fs::write(path, format!("{record}\n"))?;
    let e = run_err(60, &["merge", &s(path)]).await?;
    assert!(matches!(e, LoadgenError::Config(_)), "{e}");
    Ok(e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_refuses_forged_headers_naming_the_file_line_and_field() -> Result<()> {
    let tmp = TempDir::new("loadgen-bounds")?;
    let real = tmp.join("merge-real.jsonl");
    let forged = tmp.join("merge-forged.jsonl");
    run_ok(
        120,
        &[
            "bench",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "2",
            "--output-tokens",
            "4",
            "--per-request-jsonl",
            &s(&real),
        ],
    )
    .await?;
    let good = first_record(&real)?;
    // The real record merges.
    std::fs::write(&forged, format!("{good}\n"))?;
    run_ok(120, &["merge", &s(&forged)]).await?;
    let f = s(&forged);
    for (field, value, says) in [
        (
            "shard",
            serde_json::json!([0, 4294967295u32]),
            "raw field shard = [0,4294967295] is out of range: [I,N] with I < N and 1 <= N <= 65536",
        ),
        ("shard", serde_json::json!([0, 0]), "raw field shard = [0,0] is out of range"),
        ("shard", serde_json::json!([3, 2]), "raw field shard = [3,2] is out of range"),
        (
            "output_tokens",
            serde_json::json!(1u64 << 40),
            "raw field output_tokens = 1.099511627776e12 is out of range: at most 128 (32 per counted chunk)",
        ),
        (
            "session",
            serde_json::json!(1u64 << 40),
            "raw field session = 1.099511627776e12 is out of range: below 4.294967296e9",
        ),
        (
            "end_us",
            serde_json::json!(u64::MAX),
            "raw field end_us = 1.8446744073709552e19 is out of range: at most 4.503599627370496e15",
        ),
        (
            "run_start_unix_us",
            serde_json::json!(u64::MAX),
            "raw field run_start_unix_us = 1.8446744073709552e19 is out of range",
        ),
        (
            "input_length",
            serde_json::json!(1u64 << 23),
            "raw field input_length = 8388608 is out of range: at most 4194304",
        ),
        ("chunks", serde_json::json!(5), "raw field chunks = 5 is out of range: the 4 times"),
    ] {
        let mut record = good.clone();
        record["raw"][field] = value;
        let text = merge_err(&forged, &record).await?;
        let want = format!("invalid configuration: {f}:1: {says}");
        assert!(text.starts_with(&want), "{field}: {text}");
    }
    // A file given twice by another path, and a copy, are still refused.
    let copy = tmp.join("merge-copy.jsonl");
    std::fs::copy(&real, &copy)?;
    let e = run_err(60, &["merge", &s(&real), &s(&copy)]).await?;
    assert!(e.to_string().contains("hold the same records"), "{e}");
    for p in [&real, &forged, &copy] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_refuses_a_forged_multiturn_shape() -> Result<()> {
    let tmp = TempDir::new("loadgen-bounds")?;
    let real = tmp.join("merge-mt.jsonl");
    let forged = tmp.join("merge-mt-forged.jsonl");
    run_ok(
        120,
        &[
            "multiturn",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-users",
            "1",
            "--num-turns",
            "1",
            "--num-user-tokens",
            "16",
            "--max-completion-tokens",
            "4",
            "--mean-delay-ms",
            "0",
            "--shard",
            "0/1",
            "--per-request-jsonl",
            &s(&real),
        ],
    )
    .await?;
    let good = first_record(&real)?;
    let f = s(&forged);
    for (path, value, says) in [
        (
            ["merge", "num_turns"],
            serde_json::json!(1u64 << 40),
            "field merge.num_turns = 1.099511627776e12 is out of range: from 1 to 10000 (--num-turns)",
        ),
        (
            ["merge", "num_users"],
            serde_json::json!(0),
            "field merge.num_users = 0 is out of range: from 1 to 100000 (--num-users)",
        ),
    ] {
        let mut record = good.clone();
        record[path[0]][path[1]] = value;
        let text = merge_err(&forged, &record).await?;
        assert_eq!(text, format!("invalid configuration: {f}:1: {says}"), "{path:?}");
    }
    let mut record = good.clone();
    record["shard"] = serde_json::json!([0, 0]);
    let text = merge_err(&forged, &record).await?;
    assert!(
        text.contains(&format!("{f}:1: field shard = [0,0] is out of range")),
        "{text}"
    );
    let mut record = good.clone();
    record["merge"]["num_users"] = serde_json::json!(100_000);
    record["merge"]["num_turns"] = serde_json::json!(10_000);
    let text = merge_err(&forged, &record).await?;
    assert!(
        text.contains("merge.num_users x merge.num_turns = 1e9"),
        "{text}"
    );
    for p in [&real, &forged] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_merge_refuse_an_endless_file_at_once() -> Result<()> {
    let e = run_err(60, &["compare", "/dev/zero", "/dev/zero"]).await?;
    assert!(matches!(e, LoadgenError::BadResults { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("/dev/zero: not a multiturn results file"),
        "{e}"
    );
    let e = run_err(60, &["merge", "/dev/zero"]).await?;
    assert_eq!(
        e.to_string(),
        "/dev/zero: line 1 passes the 67108864-byte cap (MAX_RECORD_LINE_BYTES)"
    );
    Ok(())
}

/// Plays that all start at t=0, one request each (an agentic_mooncake v2 trace).
fn simultaneous_roots(plays: usize) -> String {
    let mut s = String::from(
        r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":16,"hash_id_scope":"local","source":{"format":"hand","digest":"x"}}"#,
    );
    s.push('\n');
    for p in 0..plays {
        s.push_str(&format!(
            r#"{{"request_id":"r{p}","play_id":"p{p}","session_id":"s{p}","model":"m","input_length":16,"output_length":1,"hash_ids":[{p}],"not_before_ms":0,"dependencies":[]}}"#
        ));
        s.push('\n');
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agentic_replay_is_capped_in_flight_by_default_and_its_console_is_bounded() -> Result<()>
{
    let tmp = TempDir::new("loadgen-bounds")?;
    use axum::response::IntoResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const PLAYS: usize = 600;
    // A server that holds each request 50 ms and keeps the peak of requests in flight.
    let counters = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let route = axum::routing::post(
        |axum::extract::State(c): axum::extract::State<Arc<(AtomicUsize, AtomicUsize)>>| async move {
            let now = c.0.fetch_add(1, Ordering::SeqCst) + 1;
            c.1.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            c.0.fetch_sub(1, Ordering::SeqCst);
            let chunk = serde_json::json!({"choices": [{"index": 0, "text": "x", "delta": {"content": "x"}}]});
            let usage = serde_json::json!({"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 1}});
            (
                [("content-type", "text/event-stream")],
                format!("data: {chunk}\n\ndata: {usage}\n\ndata: [DONE]\n\n"),
            )
                .into_response()
        },
    );
    let app = axum::Router::new()
        .route("/v1/completions", route.clone())
        .route("/v1/chat/completions", route)
        .with_state(counters.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let trace = tmp.join("roots.jsonl");
    let report = tmp.join("roots.json");
    std::fs::write(&trace, simultaneous_roots(PLAYS))?;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "replay",
            &s(&trace),
            "--url",
            &url,
            "--model",
            "m",
            "--quiet",
            "--report-json",
            &s(&report),
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = within(120, child).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let peak = counters.1.load(Ordering::SeqCst);
    assert!((2..=256).contains(&peak), "peak in flight {peak}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert_eq!(json["config"]["max_in_flight"], 256, "{}", json["config"]);
    assert_eq!(json["completed_requests"], PLAYS);
    assert_eq!(json["agentic"]["play_count"], PLAYS);
    // The cap's waits are said; the plays are summarized, not listed.
    assert!(
        stdout.contains("at most 256 in flight (the default"),
        "{stdout}"
    );
    assert!(stdout.contains("requests waited for a slot"), "{stdout}");
    assert!(
        stdout.contains(&format!("... and {} more plays", PLAYS - 10)),
        "{stdout}"
    );
    assert!(
        stdout.lines().count() < 60,
        "{} lines:\n{stdout}",
        stdout.lines().count()
    );
    let _ = std::fs::remove_file(&trace);
    let _ = std::fs::remove_file(&report);
    Ok(())
}

/// A fleet with loadgen and another client on it: the routing window holds both clients'
/// decisions; the report counts loadgen's own requests and names the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_line_counts_loadgens_requests_apart_from_another_clients() -> Result<()> {
    let tmp = TempDir::new("loadgen-bounds")?;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--workers",
        "2",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
    ])?;
    let Some(mock_server::Command::Fleet(fleet_args)) = cli.command else {
        bail!("expected fleet");
    };
    let config = mock_server::fleet::FleetConfig::from_args(&fleet_args)?;
    let fleet = within(60, mock_server::fleet::launch(config)).await??;
    let (ours, theirs) = (
        fleet.manifest.workers[0].url.clone(),
        fleet.manifest.workers[1].url.clone(),
    );
    let admin = fleet.manifest.admin_url.clone().context("admin URL")?;
    // The other client: requests to worker 1, back to back, until loadgen is done.
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let other = tokio::spawn({
        let (done, sent) = (done.clone(), sent.clone());
        async move {
            let client = reqwest::Client::new();
            while !done.load(Ordering::SeqCst) {
                let answer = client
                    .post(format!("{theirs}/v1/completions"))
                    .json(&serde_json::json!({"model": "mock-model", "prompt": "hello there", "max_tokens": 2}))
                    .send()
                    .await;
                if answer.is_ok_and(|a| a.status().is_success()) {
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    // Let the other client's traffic start before loadgen's first scrape.
    within(30, async {
        while sent.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    let report = tmp.join("fleet-two-clients.json");
    let metrics_url = format!("{admin}/metrics");
    let args: BenchArgs = args(&[
        "--quiet",
        "--url",
        &ours,
        "--model",
        "mock-model",
        "--metrics-url",
        &metrics_url,
        "--scrape-interval-ms",
        "100",
        "--concurrency",
        "2",
        "--num-requests",
        "20",
        "--input-tokens",
        "64",
        "--output-tokens",
        "4",
        "--report-json",
        &s(&report),
    ]);
    let run = within(120, loadgen::bench::bench(&args)).await;
    done.store(true, Ordering::SeqCst);
    within(30, other).await??;
    let run = run??;
    assert_eq!(run.live.failures.total, 0);
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    let routing = &json["server_metrics"]["summary"]["routing"];
    let decisions = routing["decisions"].as_f64().context("decisions")?;
    assert_eq!(routing["loadgen"]["requests"], 20, "{routing}");
    assert_eq!(routing["loadgen"]["workers"], 1, "{routing}");
    assert_eq!(
        routing["other_decisions"].as_f64(),
        Some(decisions - 20.0),
        "{routing}"
    );
    assert!(
        decisions > 20.0,
        "the other client's decisions fell in the window: {routing}"
    );
    within(60, fleet.shutdown()).await?;
    let _ = std::fs::remove_file(&report);
    Ok(())
}

#[test]
fn a_reversed_uniform_output_length_is_refused_naming_the_flag() {
    let e = mock_server::Cli::try_parse_from(["mockserve", "--output-length-dist", "uniform:10,5"])
        .expect_err("LO above HI");
    let text = e.to_string();
    assert!(text.contains("--output-length-dist"), "{text}");
    assert!(
        text.contains("uniform:10,5: LO must not be above HI"),
        "{text}"
    );
    assert!(mock_server::Cli::try_parse_from([
        "mockserve",
        "--output-length-dist",
        "uniform:5,10"
    ])
    .is_ok());
}
