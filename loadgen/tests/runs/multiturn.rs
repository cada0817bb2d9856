//! End-to-end tests of `loadgen multiturn` and `loadgen compare`: in-process against the embedded
//! mockserve and against tiny axum stubs on 127.0.0.1:0, plus one smoke test of the binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use loadgen::config::MultiturnArgs;
use loadgen::multiturn_report::Results;
use loadgen::{Command, LoadgenError};
use serde_json::{json, Value};

use crate::common::{args, cli, command, within, TempDir};

/// Runs `loadgen multiturn FLAGS` in-process; returns the results and the verdict.
async fn multiturn(flags: &[&str]) -> Result<(Results, Result<(), LoadgenError>)> {
    let config = args::<MultiturnArgs>(flags).config()?;
    let results = within(30, loadgen::multiturn::multiturn(&config)).await??;
    let verdict = loadgen::multiturn::verdict(&results, &config);
    Ok((results, verdict))
}

/// Serves `app` on 127.0.0.1:0; returns its base URL (the task ends with the test's runtime).
async fn stub(app: Router) -> Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(format!("http://{addr}"))
}

fn models(ids: &[&str]) -> Router {
    let data: Vec<Value> = ids
        .iter()
        .map(|id| json!({"id": id, "object": "model"}))
        .collect();
    let body = json!({"object": "list", "data": data});
    Router::new().route("/v1/models", get(move || async move { Json(body) }))
}

fn sse_ok(content: &str) -> String {
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": content}}]});
    let usage = json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
    format!("data: {chunk}\r\n\r\ndata:{usage}\n\ndata: [DONE]\n\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_json_schema() -> Result<()> {
    let tmp = TempDir::new("loadgen-multiturn")?;
    let out = tmp.join("schema.json");
    let out_s = out.display().to_string();
    let (results, verdict) = multiturn(&[
        "--num-users",
        "3",
        "--num-turns",
        "2",
        "--num-user-tokens",
        "40",
        "--max-completion-tokens",
        "20",
        "--mean-delay-ms",
        "0",
        "--speedup-ratio",
        "inf",
        "--reasoning-ratio",
        "0.25",
        "--output",
        &out_s,
    ])
    .await?;
    verdict?;
    assert_eq!(
        (results.total_requests, results.successful_requests),
        (6, 6)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let _ = std::fs::remove_file(&out);
    for key in [
        "num_users",
        "num_turns",
        "total_requests",
        "successful_requests",
        "failed_requests",
        "speculative_prefill",
        "aggregate_ttft",
        "aggregate_latency",
        "per_turn_ttft",
        "per_turn_latency",
        "raw_results",
        "config",
        "aggregate_ttft_any",
        "throughput",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(v.get("server_metrics").is_none(), "sampled unasked");
    assert_eq!(v["num_users"], 3);
    assert_eq!(v["failed_requests"], 0);
    assert_eq!(v["speculative_prefill"], false);
    for k in ["min_us", "p50_us", "p95_us", "p99_us", "max_us"] {
        assert!(v["aggregate_ttft"][k].is_u64(), "{k}");
    }
    let turns = v["per_turn_ttft"].as_array().context("per_turn_ttft")?;
    assert_eq!(turns.len(), 2);
    assert_eq!(
        (turns[1]["turn"].clone(), turns[1]["count"].clone()),
        (json!(1), json!(3))
    );
    let raw = v["raw_results"].as_array().context("raw_results")?;
    assert_eq!(raw.len(), 6);
    let order: Vec<(u64, u64)> = raw
        .iter()
        .map(|r| {
            (
                r["user_id"].as_u64().unwrap_or(99),
                r["turn"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]);
    for r in raw {
        assert_eq!(r["success"], true);
        assert_eq!(r["output_tokens"], 20);
        assert_eq!(r["output_tokens_source"], "usage");
        assert_eq!(r["user_tokens"], 40);
        // 5 of 20 tokens are reasoning: the first token of any kind comes before the answer.
        // (Compare numbers, not Options: a missing field must fail, not pass as None.)
        let any = r["ttft_any_us"].as_u64().context("ttft_any_us")?;
        let answer = r["ttft_us"].as_u64().context("ttft_us")?;
        assert!(any < answer, "{any} vs {answer}");
        assert_eq!(r["first_answer_us"].as_u64(), Some(answer));
        assert!(r["first_reasoning_us"].is_u64());
    }
    // The second turn resends the history: its prompt is longer and partly cached.
    let prompt = |i: usize| raw[i]["prompt_tokens"].as_u64().context("prompt_tokens");
    assert!(prompt(1)? > prompt(0)?);
    assert_eq!(v["config"]["target"], "embedded");
    assert_eq!(v["config"]["seed"], 42);
    assert_eq!(v["config"]["user_tokens_exact"], true);
    Ok(())
}

/// `--scrape-metrics` samples the embedded server's `/metrics` into the results (and the HTML
/// report), its token lateness feeds `--max-server-lateness`, and the flags every run command
/// shares are checked as in bench.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scraped_metrics_go_into_the_results() -> Result<()> {
    let tmp = TempDir::new("loadgen-multiturn")?;
    let out = tmp.join("scraped.json");
    let html = tmp.join("scraped.html");
    let (out_s, html_s) = (out.display().to_string(), html.display().to_string());
    let flags = [
        "--num-users",
        "2",
        "--num-turns",
        "2",
        "--num-user-tokens",
        "40",
        "--max-completion-tokens",
        "200",
        "--mean-delay-ms",
        "0",
        "--decode-speedup-ratio",
        "1",
        "--scrape-metrics",
        "--scrape-interval-ms",
        "50",
        "--output",
        &out_s,
        "--html",
        &html_s,
    ];
    let config = args::<MultiturnArgs>(&flags).config()?;
    assert!(config.observe.is_some());
    let results = within(60, loadgen::multiturn::multiturn(&config)).await??;
    loadgen::multiturn::verdict(&results, &config)?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)?;
    let page = std::fs::read_to_string(&html)?;
    let _ = (std::fs::remove_file(&out), std::fs::remove_file(&html));
    let server = &v["server_metrics"];
    assert!(
        server["samples"].as_array().is_some_and(|s| s.len() >= 2),
        "{server}"
    );
    assert!(
        server["summary"]["running"]["peak"]
            .as_f64()
            .is_some_and(|p| p >= 1.0),
        "{server}"
    );
    // The server counted every token it streamed in this run: 4 answers of 200.
    assert_eq!(server["summary"]["token_lateness"]["tokens"], 800);
    assert_eq!(results.server_lateness.map(|l| l.tokens), Some(800));
    assert!(
        page.contains("Server: KV-cache usage"),
        "no server series in the HTML"
    );
    let observe = &args::<MultiturnArgs>(&flags).run.observe;
    let mut limit = observe.clone();
    limit.max_server_lateness = Some(3_600_000.0);
    loadgen::observe::lateness_verdict(results.server_lateness, &limit)?;
    limit.max_server_lateness = Some(0.0);
    assert!(loadgen::observe::lateness_verdict(results.server_lateness, &limit).is_err());
    // --max-server-lateness alone turns sampling on; without a scrape it cannot be judged.
    assert!(args::<MultiturnArgs>(&["--max-server-lateness", "10"])
        .config()?
        .observe
        .is_some());
    let e = args::<MultiturnArgs>(&["--max-server-lateness", "10", "--no-scrape-metrics"])
        .config()
        .expect_err("contradiction");
    assert!(
        e.to_string().contains("--no-scrape-metrics turns off"),
        "{e}"
    );
    assert!(
        args::<MultiturnArgs>(&["--metrics-url", "http://h:1/metrics", "--no-scrape-metrics"])
            .config()?
            .observe
            .is_none()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_is_one_short_request() -> Result<()> {
    let (results, verdict) = multiturn(&["--ping", "--speedup-ratio", "inf"]).await?;
    verdict?;
    assert_eq!(
        (results.num_users, results.num_turns, results.total_requests),
        (1, 1, 1)
    );
    assert_eq!(results.raw_results[0].output_tokens, 50);
    assert_eq!(results.raw_results[0].user_tokens, Some(50));
    assert_eq!(results.config["mean_delay_ms"], 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_detection_errors_and_override() -> Result<()> {
    let none = stub(models(&[])).await?;
    let err = multiturn(&["--url", &none, "--num-users", "1"]).await.err();
    let err = err.context("expected an error")?;
    assert!(
        matches!(
            err.downcast_ref::<LoadgenError>(),
            Some(LoadgenError::NoModels { .. })
        ),
        "{err}"
    );

    let two = stub(models(&["a", "b"])).await?;
    let err = multiturn(&["--url", &two])
        .await
        .err()
        .context("expected an error")?;
    match err.downcast_ref::<LoadgenError>() {
        Some(LoadgenError::MultipleModels { models, .. }) => assert_eq!(models, &["a", "b"]),
        _ => panic!("unexpected {err}"),
    }
    assert!(err.to_string().contains("--model"));

    let app = models(&["a", "b"]).route(
        "/v1/chat/completions",
        post(|Json(body): Json<Value>| async move {
            assert_eq!(body["model"], "b");
            sse_ok("hi ")
        }),
    );
    let url = stub(app).await?;
    let (results, verdict) = multiturn(&[
        "--url",
        &url,
        "--model",
        "b",
        "--num-users",
        "2",
        "--num-turns",
        "2",
        "--mean-delay-ms",
        "0",
    ])
    .await?;
    verdict?;
    assert_eq!(results.successful_requests, 4);
    assert_eq!(results.raw_results[0].prompt_tokens, Some(7));
    assert_eq!(
        results.raw_results[0].user_tokens, None,
        "heuristic sizing with --url"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_counted_with_reasons() -> Result<()> {
    let app = models(&["m"]).route(
        "/v1/chat/completions",
        post(|| async {
            (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "{\"error\":{\"message\":\"boom\"}}",
            )
        }),
    );
    let url = stub(app).await?;
    let (results, verdict) = multiturn(&[
        "--url",
        &url,
        "--num-users",
        "2",
        "--num-turns",
        "2",
        "--mean-delay-ms",
        "0",
    ])
    .await?;
    assert!(matches!(verdict, Err(LoadgenError::AllFailed { total: 4 })));
    assert_eq!(
        (results.failed_requests, results.successful_requests),
        (4, 0)
    );
    assert_eq!(results.failures.count("HTTP 500: boom"), 4);
    assert!(results.aggregate_ttft.is_none());

    // One user of three gets a stream that breaks after the first chunk; others succeed.
    let app = models(&["m"]).route(
        "/v1/chat/completions",
        post(|Json(body): Json<Value>| async move {
            let system = body["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if system.contains("user 0.") {
                // The first chunk, a pause (so the headers are flushed), then a broken body.
                let chunks = futures_util::stream::unfold(0, |step| async move {
                    match step {
                        0 => Some((
                            Ok::<_, std::io::Error>(Bytes::from(
                                "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n",
                            )),
                            1,
                        )),
                        1 => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Some((Err(std::io::Error::other("dropped")), 2))
                        }
                        _ => None,
                    }
                });
                Body::from_stream(chunks)
            } else if system.contains("user 1.") {
                Body::from("data: {\"error\":{\"message\":\"engine stopped\"}}\n\ndata: [DONE]\n\n")
            } else {
                Body::from(sse_ok("fine "))
            }
        }),
    );
    let url = stub(app).await?;
    let flags = [
        "--url",
        &url,
        "--num-users",
        "4",
        "--num-turns",
        "1",
        "--mean-delay-ms",
        "0",
    ];
    let (results, verdict) = multiturn(&flags).await?;
    assert!(matches!(
        verdict,
        Err(LoadgenError::TooManyFailures {
            failed: 2,
            total: 4,
            ..
        })
    ));
    assert_eq!(results.failed_requests, 2);
    assert!(
        results
            .failures
            .by_reason
            .iter()
            .any(|r| r.kind == "stream"),
        "{:?}",
        results.failures
    );
    assert_eq!(results.failures.count("server error: engine stopped"), 1);
    let mut lenient = flags.to_vec();
    lenient.extend(["--max-failure-rate", "0.5"]);
    let (_, verdict) = multiturn(&lenient).await?;
    verdict?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workload_is_determined_by_the_seed() -> Result<()> {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(
                |State(seen): State<Arc<Mutex<Vec<Value>>>>, Json(body): Json<Value>| async move {
                    // Short critical section, never across an await.
                    if let Ok(mut s) = seen.lock() {
                        s.push(body["messages"].clone());
                    }
                    sse_ok("same answer ")
                },
            ),
        )
        .with_state(seen.clone())
        .merge(models(&["m"]));
    let url = stub(app).await?;
    let mut runs = Vec::new();
    for seed in ["5", "5", "6"] {
        let (_, verdict) = multiturn(&[
            "--url",
            &url,
            "--num-users",
            "3",
            "--num-turns",
            "3",
            "--mean-delay-ms",
            "1",
            "--seed",
            seed,
        ])
        .await?;
        verdict?;
        let mut bodies: Vec<String> = std::mem::take(&mut *seen.lock().expect("lock"))
            .iter()
            .map(Value::to_string)
            .collect();
        bodies.sort();
        runs.push(bodies);
    }
    assert_eq!(runs[0].len(), 9);
    assert_eq!(runs[0], runs[1]);
    assert_ne!(runs[0], runs[2]);
    // Full history resent: the third turn carries system + 3 user + 2 assistant messages.
    assert!(runs[0]
        .iter()
        .any(|b| b.matches("\"role\":\"user\"").count() == 3
            && b.matches("\"role\":\"assistant\"").count() == 2));
    Ok(())
}

/// The speculative-prefill A/B with the embedded defaults (fewer users, turns and think time so
/// that it runs in seconds): from the second turn on, the hinted run finds its history cached,
/// so the prompt tokens its later turns must prefill (what their TTFT is made of) drop. The
/// wall-clock TTFT gain is a timing claim left to the README's `loadgen compare` run: with the
/// other tests of a loaded 2-core machine competing, a hinted turn's p50 was seen at 4x the
/// baseline's, so no wall-clock bound here would both hold and mean anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_prefill_warms_the_later_turns() -> Result<()> {
    let base = [
        "--num-users",
        "4",
        "--num-turns",
        "3",
        "--mean-delay-ms",
        "300",
    ];
    let mut spec = base.to_vec();
    spec.push("--speculative-prefill");
    // One after the other: concurrent runs would compete for the CPU of a small machine.
    let (a, va) = multiturn(&base).await?;
    let (b, vb) = multiturn(&spec).await?;
    va?;
    vb?;
    // The mechanism: the hinted run's later turns find their history cached.
    let cached = |r: &Results| -> u64 {
        r.raw_results
            .iter()
            .filter(|x| x.turn > 0)
            .filter_map(|x| x.cached_tokens)
            .sum()
    };
    assert!(
        cached(&b) > 2 * cached(&a),
        "cached {} vs {}",
        cached(&b),
        cached(&a)
    );
    assert!(b.speculative_prefill && !a.speculative_prefill);
    // Prompt tokens left to prefill on later turns (prompt minus cached), every one reported.
    let prefilled = |r: &Results| -> Result<u64> {
        let mut sum = 0;
        for x in r.raw_results.iter().filter(|x| x.turn > 0) {
            let prompt = x.prompt_tokens.context("prompt_tokens")?;
            sum += prompt - x.cached_tokens.context("cached_tokens")?;
        }
        Ok(sum)
    };
    let (pa, pb) = (prefilled(&a)?, prefilled(&b)?);
    assert!(
        pb < pa,
        "prefilled on later turns: baseline {pa}, speculative {pb}"
    );
    for turn in 1..3 {
        let (ta, tb) = (a.per_turn_ttft[turn], b.per_turn_ttft[turn]);
        assert_eq!((ta.turn, tb.turn), (turn, turn));
        assert_eq!((ta.count, tb.count), (4, 4), "every later turn has a TTFT");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_reads_two_results_files() -> Result<()> {
    let tmp = TempDir::new("loadgen-multiturn")?;
    let (a, b) = (tmp.join("cmp-a.json"), tmp.join("cmp-b.json"));
    let svg = tmp.join("cmp.svg");
    let (sa, sb) = (a.display().to_string(), b.display().to_string());
    for (path, extra) in [(&sa, None), (&sb, Some("--speculative-prefill"))] {
        let mut flags = vec![
            "--num-users",
            "2",
            "--num-turns",
            "2",
            "--mean-delay-ms",
            "0",
            "--max-completion-tokens",
            "10",
            "--speedup-ratio",
            "inf",
            "--output",
            path,
        ];
        flags.extend(extra);
        multiturn(&flags).await?.1?;
    }
    let svg_s = svg.display().to_string();
    let Command::Compare(cmp) = command(&["compare", &sa, &sb, "--svg", &svg_s]) else {
        panic!("compare")
    };
    let table = loadgen::compare::run(&cmp)?;
    assert_eq!(
        table
            .lines()
            .filter(|l| l.trim_start().starts_with(['1', '2']))
            .count(),
        2,
        "{table}"
    );
    let chart = std::fs::read_to_string(&svg)?;
    assert!(chart.starts_with("<svg") && chart.contains("<polyline"));
    for p in [a, b, svg] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_smoke_ping() -> Result<()> {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["multiturn", "--ping", "--speedup-ratio", "inf"])
        .kill_on_drop(true)
        .output();
    let out = within(30, child).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Multiturn Benchmark Results"));
    assert!(stdout.contains("Completed: 1/1"));
    assert!(stdout.contains("Auto-detected model: mock-model"));

    let bad = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["multiturn", "--num-users", "0"])
        .kill_on_drop(true)
        .output();
    let out = within(30, bad).await??;
    assert!(!out.status.success());
    Ok(())
}

/// Tool turns on the wire: every request carries the tool, a tool turn asks for a call with
/// `tool_choice: "required"` (the others `"none"`), the answer's call goes back into the
/// history with its id, the next turn sends the tool's result for that id, and it leaves the
/// tool's wait after the call's answer ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_turns_send_the_result_of_the_call_after_the_tool_wait() -> Result<()> {
    type Seen = Arc<Mutex<Vec<(Value, std::time::Instant)>>>;
    let seen: Seen = Arc::default();
    let answer = |State(seen): State<Seen>, Json(body): Json<Value>| async move {
        let n = {
            let mut s = seen.lock().expect("lock");
            s.push((body.clone(), std::time::Instant::now()));
            s.len() - 1
        };
        let sse = if body["tool_choice"] == "required" {
            let call = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": "lookup", "arguments": ""}}]}}]});
            let args = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "function": {"arguments": "{\"query\": \"q\"}"}}]}}]});
            let end =
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]});
            let usage =
                json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
            format!(
                "data: {call}\n\ndata: {args}\n\ndata: {end}\n\ndata: {usage}\n\ndata: [DONE]\n\n"
            )
        } else {
            sse_ok("done")
        };
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(sse))
            .expect("response")
    };
    let app = models(&["m"]).merge(
        Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(seen.clone()),
    );
    let url = stub(app).await?;
    let (results, verdict) = multiturn(&[
        "--url",
        &url,
        "--num-users",
        "1",
        "--num-turns",
        "3",
        "--mean-delay-ms",
        "0",
        "--tool-call-share",
        "1",
        "--tool-wait-ms",
        "fixed:150",
    ])
    .await?;
    verdict?;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    let tool_def = &seen[0].0["tools"][0]["function"]["name"];
    assert_eq!(tool_def, "lookup");
    let choices: Vec<&Value> = seen.iter().map(|(b, _)| &b["tool_choice"]).collect();
    assert_eq!(
        choices,
        [&json!("required"), &json!("required"), &json!("none")]
    );
    for (turn, (body, _)) in seen.iter().enumerate().skip(1) {
        let messages = body["messages"].as_array().context("messages")?;
        let n = messages.len();
        let call_id = format!("call_{}", turn - 1);
        assert_eq!(messages[n - 2]["role"], "assistant");
        assert_eq!(messages[n - 2]["content"], Value::Null);
        assert_eq!(messages[n - 2]["tool_calls"][0]["id"], json!(call_id));
        assert_eq!(
            messages[n - 2]["tool_calls"][0]["function"]["arguments"],
            "{\"query\": \"q\"}"
        );
        assert_eq!(messages[n - 1]["role"], "tool");
        assert_eq!(messages[n - 1]["tool_call_id"], json!(call_id));
        assert!(messages[n - 1]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty()));
        // The tool ran 150 ms after the call's answer (which ended at once).
        let gap = seen[turn].1 - seen[turn - 1].1;
        assert!(gap >= Duration::from_millis(150), "turn {turn}: {gap:?}");
    }
    let tools = results.tool_turns.clone().context("tool turn stats")?;
    assert_eq!(tools.tool_calls, 2);
    assert_eq!(
        (tools.after_tool.requests, tools.after_user.requests),
        (2, 0)
    );
    let flags: Vec<(bool, bool)> = results
        .raw_results
        .iter()
        .map(|r| (r.tool_call, r.after_tool))
        .collect();
    assert_eq!(flags, [(true, false), (true, true), (false, true)]);
    // The tool-call answers have a TTFT: their argument text is the answer.
    assert!(results
        .raw_results
        .iter()
        .all(|r| r.first_answer_us.is_some()));
    assert_eq!(results.config["tool_wait_ms"], "fixed:150");
    Ok(())
}

/// Against the embedded server every tool turn runs (mockserve answers `required` with a
/// call and takes the tool's result), and the result's turn reuses the cached conversation;
/// the flags are checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_turns_run_against_the_embedded_server() -> Result<()> {
    let (results, verdict) = multiturn(&[
        "--num-users",
        "2",
        "--num-turns",
        "3",
        "--num-user-tokens",
        "48",
        "--max-completion-tokens",
        "16",
        "--speedup-ratio",
        "inf",
        "--tool-call-share",
        "1",
        "--tool-wait-ms",
        "fixed:20",
    ])
    .await?;
    verdict?;
    assert_eq!(results.successful_requests, 6);
    let tools = results.tool_turns.clone().context("tool turn stats")?;
    assert_eq!(tools.tool_calls, 4);
    assert_eq!(tools.after_tool.requests, 4);
    assert!(tools.after_tool.cached_tokens > 0, "{tools:?}");
    let console = results.console();
    assert!(
        console.contains("Tool turns (4 asked for a tool call"),
        "{console}"
    );
    for (flags, message) in [
        (
            vec!["--tool-call-share", "0.5"],
            "--tool-call-share needs --tool-wait-ms",
        ),
        (
            vec!["--tool-call-share", "1.5", "--tool-wait-ms", "exp:10"],
            "--tool-call-share must be from 0 to 1",
        ),
    ] {
        let e = args::<MultiturnArgs>(&flags).config().expect_err("refused");
        assert!(e.to_string().contains(message), "{e}");
    }
    let e = cli(&["multiturn", "--tool-wait-ms", "uniform:5,1"]).expect_err("bad distribution");
    assert!(e.to_string().contains("LO must not be above HI"), "{e}");
    Ok(())
}
