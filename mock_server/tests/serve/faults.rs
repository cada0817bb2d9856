//! Fault injection: every type on the wire, forcing by header, KV freed after a faulted stream,
//! and seeded draws that repeat.

use std::time::Duration;

use anyhow::Result;
use axum::http::StatusCode;
use clap::Parser;
use mock_server::api::fault::FAULT_HEADER;
use mock_server::cmd::serve::ServeArgs;
use mock_server::config::ServerConfig;
use mock_server::fault::{FaultConfig, FaultType};
use mock_server::Cli;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::common::*;

/// A server with `faults` and pass times of 1 ms.
async fn faulty(faults: FaultConfig) -> Result<TestServer> {
    let config = ServerConfig {
        faults,
        ..config(Some((1.0, 1.0)))
    };
    TestServer::start(config).await
}

/// Posts a chat request with an optional forced fault.
async fn send(server: &TestServer, fault: Option<&str>, body: &Value) -> Result<reqwest::Response> {
    let mut request = server
        .client
        .post(format!("{}/v1/chat/completions", server.base))
        .json(body);
    if let Some(f) = fault {
        request = request.header(FAULT_HEADER, f);
    }
    Ok(within(request.send()).await??)
}

/// The SSE `data:` payloads of a response, with arrival times, and whether the body broke off.
async fn events(response: reqwest::Response) -> Result<(Vec<(String, Duration)>, bool)> {
    let (events, cut) = read_sse_until_cut(response, Instant::now()).await?;
    Ok((events, cut.is_some()))
}

fn is_token(data: &str) -> bool {
    serde_json::from_str::<Value>(data).is_ok_and(|c| {
        c["choices"][0]["finish_reason"].is_null()
            && c["choices"][0]["delta"].get("content").is_some()
            && c["choices"][0]["delta"].get("role").is_none()
    })
}

/// Waits until worker 0 holds no KV blocks, as `/metrics` reports it, and no request is active.
async fn kv_returns_to_zero(server: &TestServer) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = server.scrape().await?;
        let usage = m
            .get("vllm:kv_cache_usage_perc{model_name=\"mock-model\",engine=\"0\"}")
            .copied();
        let active = m.get("servesim_active_requests").copied();
        if usage == Some(0.0) && active == Some(0.0) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "KV never freed: {usage:?} {active:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn faults_of(m: &std::collections::BTreeMap<String, f64>, kind: &str) -> f64 {
    m.get(&format!("servesim_faults_total{{type=\"{kind}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

#[tokio::test]
async fn forced_immediate_faults_are_openai_errors() -> Result<()> {
    let server = faulty(FaultConfig::default()).await?;
    let body = chat_body(&json!([user("hi")]), json!({"max_tokens": 3}));
    let cases = [
        (
            "rate-limit",
            429,
            "rate_limit_error",
            None,
            "rate_limit_exceeded",
        ),
        ("server-error", 500, "server_error", None, "internal_error"),
        (
            "unavailable",
            503,
            "server_error",
            None,
            "service_unavailable",
        ),
        (
            "context-length",
            400,
            "invalid_request_error",
            Some("messages"),
            "context_length_exceeded",
        ),
        (
            "invalid-request",
            400,
            "invalid_request_error",
            None,
            "invalid_request",
        ),
    ];
    for (kind, status, error_type, param, code) in cases {
        let response = send(&server, Some(kind), &body).await?;
        assert_eq!(response.status().as_u16(), status, "{kind}");
        let retry = response.headers().get("retry-after").cloned();
        assert_eq!(retry.is_some(), status == 429, "{kind}: {retry:?}");
        let b: Value = within(response.json()).await??;
        let error = error_of(
            StatusCode::from_u16(status)?,
            &b,
            StatusCode::from_u16(status)?,
        )?;
        assert_eq!(error["type"], error_type, "{b}");
        assert_eq!(error["param"], json!(param), "{b}");
        assert_eq!(error["code"], code, "{b}");
        assert_eq!(b.as_object().map(|o| o.len()), Some(1), "{b}");
    }
    // `none` forces no fault; an unknown type is an OpenAI-shaped 400.
    let ok = send(&server, Some("none"), &body).await?;
    assert_eq!(ok.status(), 200);
    let bad = send(&server, Some("explode"), &body).await?;
    assert_eq!(bad.status(), 400);
    let b: Value = within(bad.json()).await??;
    let error = error_of(StatusCode::BAD_REQUEST, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["code"], "invalid_fault_type");
    assert_eq!(error["param"], FAULT_HEADER);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("'explode'") && message.contains("stream-cut"),
        "{message}"
    );

    let m = server.scrape().await?;
    for (kind, ..) in cases {
        assert_eq!(faults_of(&m, kind), 1.0, "{kind}");
    }
    assert_eq!(m.get("servesim_http_request_failures_total"), Some(&6.0));
    // Injected 429s are not queue overload.
    assert_eq!(m.get("servesim_http_requests_overloaded_total"), Some(&0.0));
    let succeeded: f64 = m
        .iter()
        .filter(|(series, _)| series.starts_with("vllm:request_success_total{"))
        .map(|(_, value)| value)
        .sum();
    assert_eq!(succeeded, 1.0);

    // On `/v1/completions` the prompt is `prompt`, not `messages` (issue 43).
    let response = within(
        server
            .client
            .post(format!("{}/v1/completions", server.base))
            .header(FAULT_HEADER, "context-length")
            .json(&json!({"model": "mock-model", "prompt": "hi", "max_tokens": 3}))
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 400);
    let b: Value = within(response.json()).await??;
    let error = error_of(StatusCode::BAD_REQUEST, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "prompt", "{b}");
    assert_eq!(error["code"], "context_length_exceeded", "{b}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("your prompt") && !message.contains("messages"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn stream_faults_on_the_wire_free_the_kv() -> Result<()> {
    let faults = FaultConfig {
        stall: Duration::from_millis(300),
        ..FaultConfig::default()
    };
    let server = faulty(faults.clone()).await?;
    let seed = server.state.config.seed;
    let body = chat_body(
        &json!([user(&long_question())]),
        json!({"stream": true, "max_tokens": 500, "stream_options": {"include_usage": true}}),
    );

    // Draw 0: stream-error after N tokens, then `[DONE]`.
    let n = faults.forced_after(seed, 0);
    let (ev, broken) = events(send(&server, Some("stream-error"), &body).await?).await?;
    assert!(!broken);
    let data: Vec<&str> = ev.iter().map(|(d, _)| d.as_str()).collect();
    assert_eq!(data.len(), 1 + n + 2, "{data:?}");
    assert!(data[1..=n].iter().all(|d| is_token(d)), "{data:?}");
    assert_eq!(
        data[n + 1],
        r#"{"error":{"code":"internal_error","message":"The server had an error while processing your request.","param":null,"type":"server_error"}}"#
    );
    assert_eq!(data[n + 2], "[DONE]");
    kv_returns_to_zero(&server).await?;

    // Draw 1: stream-cut after N tokens: the body breaks off, no `[DONE]`.
    let n = faults.forced_after(seed, 1);
    let (ev, broken) = events(send(&server, Some("stream-cut"), &body).await?).await?;
    assert!(broken, "{ev:?}");
    assert_eq!(ev.len(), 1 + n, "{ev:?}");
    assert!(ev[1..].iter().all(|(d, _)| is_token(d)), "{ev:?}");
    kv_returns_to_zero(&server).await?;

    // Draw 2: stream-stall after N tokens: a gap of the stall, then the whole answer.
    let n = faults.forced_after(seed, 2);
    let short = chat_body(
        &json!([user("stall")]),
        json!({"stream": true, "max_tokens": 20}),
    );
    let (ev, broken) = events(send(&server, Some("stream-stall"), &short).await?).await?;
    assert!(!broken);
    let tokens = ev.iter().filter(|(d, _)| is_token(d)).count();
    assert_eq!(tokens, 20);
    assert_eq!(ev.last().map(|(d, _)| d.as_str()), Some("[DONE]"));
    let gap = ev[n + 1].1 - ev[n].1;
    assert!(
        gap >= Duration::from_millis(300),
        "gap {gap:?} before event {}",
        n + 1
    );

    let m = server.scrape().await?;
    for kind in ["stream-error", "stream-cut", "stream-stall"] {
        assert_eq!(faults_of(&m, kind), 1.0, "{kind}");
    }
    // The stall is not a failure.
    assert_eq!(m.get("servesim_http_request_failures_total"), Some(&2.0));
    kv_returns_to_zero(&server).await
}

#[tokio::test]
async fn stream_faults_on_whole_responses() -> Result<()> {
    let faults = FaultConfig {
        stall: Duration::from_millis(200),
        ..FaultConfig::default()
    };
    let server = faulty(faults).await?;
    let body = chat_body(&json!([user("whole")]), json!({"max_tokens": 4}));
    let t0 = Instant::now();
    let stalled = send(&server, Some("stream-stall"), &body).await?;
    assert_eq!(stalled.status(), 200);
    let b: Value = within(stalled.json()).await??;
    assert_eq!(b["usage"]["completion_tokens"], 4);
    assert!(t0.elapsed() >= Duration::from_millis(200));

    let errored = send(&server, Some("stream-error"), &body).await?;
    assert_eq!(errored.status(), 500);
    let b: Value = within(errored.json()).await??;
    assert_eq!(b["error"]["code"], "internal_error");

    // The cut drops the connection: no complete answer arrives.
    let cut = server
        .client
        .post(format!("{}/v1/chat/completions", server.base))
        .header(FAULT_HEADER, "stream-cut")
        .json(&body)
        .send();
    let result = within(async {
        match cut.await {
            Ok(response) => response.bytes().await.map(|_| ()),
            Err(e) => Err(e),
        }
    })
    .await?;
    assert!(result.is_err(), "a cut answer arrived whole");
    kv_returns_to_zero(&server).await
}

#[tokio::test]
async fn seeded_draws_repeat_and_match_the_plan() -> Result<()> {
    let faults = FaultConfig {
        rate: 0.5,
        types: vec![
            FaultType::RateLimit,
            FaultType::ServerError,
            FaultType::Unavailable,
            FaultType::StreamError,
        ],
        ..FaultConfig::default()
    };
    let body = chat_body(&json!([user("again and again")]), json!({"max_tokens": 2}));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = faulty(faults.clone()).await?;
        let seed = server.state.config.seed;
        let mut statuses = Vec::new();
        for k in 0..24u64 {
            let status = send(&server, None, &body).await?.status().as_u16();
            let want = match faults.draw(seed, k) {
                None => 200,
                Some((FaultType::RateLimit, _)) => 429,
                Some((FaultType::Unavailable, _)) => 503,
                Some(_) => 500,
            };
            assert_eq!(status, want, "request {k}");
            statuses.push(status);
        }
        let m = server.scrape().await?;
        for kind in faults.types.iter() {
            let planned = (0..24u64)
                .filter(|&k| faults.draw(seed, k).is_some_and(|(t, _)| t == *kind))
                .count();
            assert_eq!(faults_of(&m, kind.name()), planned as f64, "{kind:?}");
        }
        kv_returns_to_zero(&server).await?;
        runs.push(statuses);
    }
    assert_eq!(runs[0], runs[1]);
    let faulted = runs[0].iter().filter(|&&s| s != 200).count();
    assert!((4..=20).contains(&faulted), "{:?}", runs[0]);
    Ok(())
}

#[test]
fn fault_flags_are_validated_at_startup() {
    let err = Cli::try_parse_from(["mockserve", "serve", "--fault-types", "rate-limit,explode"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("explode") && err.contains("stream-cut"),
        "{err}"
    );

    let parse = |flags: &[&str]| -> Result<ServerConfig> {
        let cli = Cli::try_parse_from(flags.iter().copied())?;
        let args: ServeArgs = match cli.command {
            Some(mock_server::Command::Serve(command)) => command.serve,
            _ => anyhow::bail!("not serve"),
        };
        Ok(ServerConfig::from_args(&args)?)
    };
    let bad = parse(&["mockserve", "serve", "--fault-rate", "1.5"]);
    assert!(bad
        .err()
        .is_some_and(|e| e.to_string().contains("--fault-rate")));
    let good = parse(&[
        "mockserve",
        "serve",
        "--fault-rate",
        "0.25",
        "--fault-types",
        "stream-cut,rate-limit",
        "--fault-stall-ms",
        "50",
    ]);
    let faults = good.map(|c| c.faults).ok();
    assert_eq!(
        faults,
        Some(FaultConfig {
            rate: 0.25,
            types: vec![FaultType::RateLimit, FaultType::StreamCut],
            stall: Duration::from_millis(50),
        })
    );
}
