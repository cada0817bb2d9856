//! Failed requests are never reported as a success, in any mode: tiny misbehaving servers on
//! 127.0.0.1:0 (HTTP 500 to everything, 429 to a share, empty streams, garbage, endless lines,
//! contradicting usage, no answer at all) against `loadgen bench`, `replay` and `multiturn`, and
//! the exit status of the real binary.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use loadgen::bench::{BenchArgs, BenchRun};
use loadgen::{Command, LoadgenError};
use serde_json::{json, Value};

use crate::common::{cli, quiet_args, within, TempDir};

/// Serves `app` on 127.0.0.1:0; returns its base URL (the task ends with the test's runtime).
async fn stub(app: Router) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

/// A server answering every request on both endpoints with `handler(n)`, n = 0, 1, 2, ...
fn counting(handler: fn(usize) -> Response) -> Router {
    let count = Arc::new(AtomicUsize::new(0));
    let route = post(move |State(count): State<Arc<AtomicUsize>>| async move {
        handler(count.fetch_add(1, Ordering::Relaxed))
    });
    Router::new()
        .route("/v1/completions", route.clone())
        .route("/v1/chat/completions", route)
        .with_state(count)
}

fn sse(body: String) -> Response {
    ([("content-type", "text/event-stream")], body).into_response()
}

/// A good stream for either endpoint: `n` one-token chunks, usage, `[DONE]`.
fn good_stream(n: usize, usage: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        let chunk = json!({"choices": [{"index": 0, "text": "x ", "delta": {"content": "x "}}]});
        s.push_str(&format!("data: {chunk}\n\n"));
    }
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": usage}});
    s.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    s
}

fn openai_error(status: StatusCode, message: &str) -> Response {
    let body =
        json!({"error": {"message": message, "type": "server_error", "param": null, "code": null}});
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Runs `loadgen bench` in-process with report files; returns the run, the verdict, the report
/// JSON and the JSONL lines.
async fn bench(
    url: &str,
    flags: &[&str],
) -> Result<(BenchRun, Result<(), LoadgenError>, Value, Vec<Value>)> {
    let tmp = TempDir::new("loadgen-failures")?;
    let name = format!("{:x}", xxhash(url, flags));
    let (json_path, jsonl_path) = (
        tmp.join(&format!("{name}.json")),
        tmp.join(&format!("{name}.jsonl")),
    );
    let (jp, lp) = (
        json_path.display().to_string(),
        jsonl_path.display().to_string(),
    );
    let mut all = flags.to_vec();
    all.extend(["--report-json", &jp, "--per-request-jsonl", &lp]);
    let args: BenchArgs = quiet_args(&[&["--url", url, "--model", "m"], &all[..]].concat());
    let run = within(60, loadgen::bench::bench(&args)).await??;
    let verdict = run.live.verdict(args.run.failures.max_failure_rate);
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path)?)?;
    let lines = std::fs::read_to_string(&jsonl_path)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    let _ = std::fs::remove_file(json_path);
    let _ = std::fs::remove_file(jsonl_path);
    Ok((run, verdict, json, lines))
}

/// A file name per call (tests run in parallel in one process).
fn xxhash(url: &str, flags: &[&str]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (url, flags).hash(&mut h);
    h.finish()
}

/// `failures.by_reason` as (reason, kind, count).
fn reasons(json: &Value) -> Vec<(String, String, u64)> {
    json["failures"]["by_reason"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    (
                        r["reason"].as_str().unwrap_or("?").to_string(),
                        r["kind"].as_str().unwrap_or("?").to_string(),
                        r["count"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn trace_file(tmp: &TempDir, name: &str, rows: usize) -> Result<PathBuf> {
    let path = tmp.join(name);
    let text: String = (0..rows)
        .map(|i| {
            format!(
                "{{\"timestamp\": {i}, \"input_length\": 8, \"output_length\": 2, \"hash_ids\": [{i}]}}\n"
            )
        })
        .collect();
    std::fs::write(&path, text)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_fails_when_the_server_answers_500_to_everything() -> Result<()> {
    let tmp = TempDir::new("loadgen-failures")?;
    let url = stub(counting(|_| {
        openai_error(StatusCode::INTERNAL_SERVER_ERROR, "boom")
    }))
    .await?;

    // bench: report, JSON, JSONL and verdict.
    let (run, verdict, json, lines) =
        bench(&url, &["--num-requests", "4", "--concurrency", "2"]).await?;
    assert!(
        matches!(verdict, Err(LoadgenError::AllFailed { total: 4 })),
        "{verdict:?}"
    );
    assert_eq!(json["failures"]["total"], 4);
    assert_eq!(
        reasons(&json),
        [("HTTP 500: boom".to_string(), "http".to_string(), 4)]
    );
    assert_eq!(json["failures"]["by_reason"][0]["status"], 500);
    assert_eq!(json["completed_requests"], 0);
    assert_eq!(json["mean_ttft_ms"], 0.0, "no latency figure from failures");
    let text = run.live.failure_lines();
    assert!(
        text.starts_with("Failed requests: 4 of 4 (100.0%)"),
        "{text}"
    );
    assert!(text.contains("HTTP 500: boom"), "{text}");
    assert_eq!(lines.len(), 4);
    for l in &lines {
        assert_eq!(l["error"], "HTTP 500: boom");
        assert_eq!(l["error_kind"], "http");
        assert_eq!(l["error_status"], 500);
        assert_eq!(l["status"], "rejected");
        assert!(l["ttft_ms"].is_null());
    }

    // replay: the same verdict through `run_async`, the path the binary takes.
    let trace = trace_file(&tmp, "500.jsonl", 3)?;
    let parsed = cli(&[
        "replay",
        trace.to_str().context("utf-8")?,
        "--url",
        &url,
        "--model",
        "m",
        "--trace-block-size",
        "8",
        "--arrival-speedup-ratio",
        "100",
        "--quiet",
    ])?;
    let err = within(60, loadgen::run_async(parsed)).await?;
    let _ = std::fs::remove_file(&trace);
    assert!(
        matches!(err, Err(LoadgenError::AllFailed { total: 3 })),
        "{err:?}"
    );

    // multiturn: the same shape of `failures`.
    let parsed = cli(&[
        "multiturn",
        "--url",
        &url,
        "--model",
        "m",
        "--num-users",
        "2",
        "--num-turns",
        "1",
        "--mean-delay-ms",
        "0",
    ])?;
    let Command::Multiturn(a) = parsed.command else {
        bail!("multiturn")
    };
    let results = within(60, loadgen::multiturn::multiturn(&a.config()?)).await??;
    let v = serde_json::to_value(&results)?;
    assert_eq!(v["failures"]["total"], 2);
    assert_eq!(
        reasons(&v),
        [("HTTP 500: boom".to_string(), "http".to_string(), 2)]
    );
    assert!(results.console().contains("HTTP 500: boom"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_of_429s_is_counted_and_fails_the_run_above_the_threshold() -> Result<()> {
    let url = stub(counting(|n| {
        if n % 2 == 1 {
            openai_error(StatusCode::TOO_MANY_REQUESTS, "rate limited")
        } else {
            sse(good_stream(2, 2))
        }
    }))
    .await?;
    let flags = ["--num-requests", "10", "--concurrency", "1"];
    let (run, verdict, json, lines) = bench(&url, &flags).await?;
    assert!(
        matches!(
            verdict,
            Err(LoadgenError::TooManyFailures {
                failed: 5,
                total: 10,
                ..
            })
        ),
        "{verdict:?}"
    );
    assert_eq!(json["completed_requests"], 5);
    assert_eq!(
        reasons(&json),
        [("HTTP 429: rate limited".to_string(), "http".to_string(), 5)]
    );
    assert!(run
        .live
        .failure_lines()
        .starts_with("Failed requests: 5 of 10 (50.0%)"));
    // Latency figures come from the five successes only.
    let ttfts = lines.iter().filter(|l| l["ttft_ms"].is_number()).count();
    assert_eq!(ttfts, 5);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["error"] == "HTTP 429: rate limited")
            .count(),
        5
    );

    let mut lenient = flags.to_vec();
    lenient.extend(["--max-failure-rate", "0.5"]);
    let (_, verdict, _, _) = bench(&url, &lenient).await?;
    verdict?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_without_tokens_are_failures_without_a_ttft() -> Result<()> {
    let url = stub(counting(|n| {
        sse(match n % 3 {
            // Only [DONE].
            0 => "data: [DONE]\n\n".to_string(),
            // Chunks without choices and a usage chunk.
            1 => "data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"completion_tokens\":0}}\n\ndata: [DONE]\n\n".to_string(),
            // Lines that are not chunks.
            _ => "data: not json\n\n: comment\ngarbage line\n\ndata: {\"x\":1}\n\ndata: [DONE]\n\n"
                .to_string(),
        })
    }))
    .await?;
    let (_, verdict, json, lines) =
        bench(&url, &["--num-requests", "3", "--concurrency", "1"]).await?;
    assert!(
        matches!(verdict, Err(LoadgenError::AllFailed { total: 3 })),
        "{verdict:?}"
    );
    assert_eq!(
        reasons(&json),
        [("empty stream".to_string(), "empty_stream".to_string(), 3)]
    );
    for l in &lines {
        assert_eq!(l["error_kind"], "empty_stream");
        assert!(l["ttft_ms"].is_null() && l["first_token_ms"].is_null());
    }

    // multiturn: no TTFT of any kind for an empty stream.
    let cli = cli(&[
        "multiturn",
        "--url",
        &url,
        "--model",
        "m",
        "--num-users",
        "3",
        "--num-turns",
        "1",
        "--mean-delay-ms",
        "0",
    ])?;
    let Command::Multiturn(a) = cli.command else {
        bail!("multiturn")
    };
    let config = a.config()?;
    let results = within(60, loadgen::multiturn::multiturn(&config)).await??;
    assert_eq!(results.failed_requests, 3);
    assert!(results.aggregate_ttft.is_none() && results.aggregate_ttft_any.is_none());
    assert!(results
        .raw_results
        .iter()
        .all(|r| !r.success && r.ttft_any_us.is_none() && r.ttft_us == 0));
    assert!(matches!(
        loadgen::multiturn::verdict(&results, &config),
        Err(LoadgenError::AllFailed { total: 3 })
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_fails_its_request_at_the_bound() -> Result<()> {
    // An endless `data:` line, 64 KiB at a time, never a line end: unbounded buffering would
    // hold it until the request timeout (and grow without limit).
    let url = stub(counting(|_| {
        let head =
            futures_util::stream::once(async { Ok::<_, std::io::Error>(Bytes::from("data: ")) });
        let tail = futures_util::stream::repeat_with(|| Ok(Bytes::from(vec![b'x'; 64 * 1024])));
        use futures_util::StreamExt;
        Response::new(Body::from_stream(head.chain(tail)))
    }))
    .await?;
    let (_, verdict, json, lines) = bench(
        &url,
        &[
            "--num-requests",
            "2",
            "--concurrency",
            "2",
            "--max-line-bytes",
            "200000",
            "--request-timeout-s",
            "40",
        ],
    )
    .await?;
    assert!(matches!(verdict, Err(LoadgenError::AllFailed { total: 2 })));
    assert_eq!(
        reasons(&json),
        [(
            "SSE line longer than --max-line-bytes (200000)".to_string(),
            "line_too_long".to_string(),
            2
        )]
    );
    // Failed at the bound, not at the timeout.
    for l in &lines {
        let end = l["finish_ms"].as_f64().context("finish_ms")?
            - l["arrival_ms"].as_f64().context("arrival")?;
        assert!(end < 30_000.0, "{end} ms");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_that_contradicts_the_chunks_is_flagged() -> Result<()> {
    // Three chunks, usage 1000 (the second request: consistent usage, 3 chunks, 6 tokens).
    let url = stub(counting(|n| {
        sse(if n == 0 {
            good_stream(3, 1000)
        } else {
            good_stream(3, 6)
        })
    }))
    .await?;
    let (run, verdict, json, lines) =
        bench(&url, &["--num-requests", "2", "--concurrency", "1"]).await?;
    verdict?;
    assert_eq!(json["usage_mismatches"], 1);
    assert_eq!(json["failures"]["total"], 0);
    assert!(run.live.failure_lines().contains("WARNING: 1 requests"));
    let flagged: Vec<&Value> = lines
        .iter()
        .filter(|l| l["usage_mismatch"] == true)
        .collect();
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0]["usage_output_tokens"], 1000);
    assert_eq!(
        flagged[0]["output_length"], 3,
        "the counted chunks are used"
    );
    let fine: Vec<&Value> = lines
        .iter()
        .filter(|l| l["usage_mismatch"] == false)
        .collect();
    assert_eq!(fine.len(), 1);
    assert_eq!(
        fine[0]["output_length"], 6,
        "several tokens per chunk is normal"
    );

    // multiturn flags it the same way.
    let url = stub(counting(|_| sse(good_stream(3, 1000)))).await?;
    let cli = cli(&[
        "multiturn",
        "--url",
        &url,
        "--model",
        "m",
        "--num-users",
        "1",
        "--num-turns",
        "1",
        "--mean-delay-ms",
        "0",
    ])?;
    let Command::Multiturn(a) = cli.command else {
        bail!("multiturn")
    };
    let results = within(60, loadgen::multiturn::multiturn(&a.config()?)).await??;
    assert_eq!(results.usage_mismatches, 1);
    assert!(results.raw_results[0].usage_mismatch);
    assert_eq!(results.raw_results[0].usage_output_tokens, Some(1000));
    assert!(results.console().contains("WARNING: 1 requests"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_refused_connections_have_their_own_reasons() -> Result<()> {
    let url = stub(counting(|_| {
        let slow = futures_util::stream::once(async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok::<_, std::io::Error>(Bytes::from("data: [DONE]\n\n"))
        });
        Response::new(Body::from_stream(slow))
    }))
    .await?;
    let (_, verdict, json, _) =
        bench(&url, &["--num-requests", "1", "--request-timeout-s", "0.5"]).await?;
    assert!(verdict.is_err());
    assert_eq!(reasons(&json)[0].1, "timeout", "{:?}", reasons(&json));

    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", l.local_addr()?)
    };
    let (_, verdict, json, _) = bench(&closed, &["--num-requests", "1"]).await?;
    assert!(verdict.is_err());
    assert_eq!(reasons(&json)[0].1, "transport", "{:?}", reasons(&json));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exits_non_zero_on_failures_and_names_os_errors() -> Result<()> {
    let tmp = TempDir::new("loadgen-failures")?;
    let url = stub(counting(|_| {
        openai_error(StatusCode::INTERNAL_SERVER_ERROR, "boom")
    }))
    .await?;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "bench",
            "--url",
            &url,
            "--model",
            "m",
            "--num-requests",
            "2",
            "--quiet",
        ])
        .kill_on_drop(true)
        .output();
    let out = within(60, child).await??;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(
        out.status.code(),
        Some(i32::from(loadgen::error::EXIT_TOO_MANY_FAILURES)),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("Failed requests: 2 of 2"), "{stdout}");
    assert!(stdout.contains("HTTP 500: boom"), "{stdout}");
    assert!(stderr.contains("all 2 requests failed"), "{stderr}");

    let missing = tmp.join("missing-trace.jsonl");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["replay", missing.to_str().context("utf-8")?])
        .kill_on_drop(true)
        .output();
    let out = within(60, child).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("missing-trace.jsonl"), "{stderr}");
    assert!(stderr.contains("os error 2"), "{stderr}");
    Ok(())
}
