//! The streaming wire format and the answers: chunk shapes, usage, text completions,
//! determinism, pacing by the latency model and cancellation on a dropped stream.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::http::StatusCode;
use clap::Parser;
use futures_util::StreamExt;
use mock_server::api::AppState;
use mock_server::config::ServerConfig;
use mock_server::text::default_codec;
use mock_server::Cli;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::common::*;

#[tokio::test]
async fn streams_per_the_wire_checklist() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = chat_body(
        &json!([user("tell me a story")]),
        json!({"stream": true, "max_tokens": 12, "stream_options": {"include_usage": true}}),
    );
    let turn = stream_chat(&server, &body).await?;
    assert_eq!(turn.token_times.len(), 12);
    assert_eq!(turn.usage["completion_tokens"], 12);
    let prompt = turn.usage["prompt_tokens"]
        .as_u64()
        .context("prompt_tokens")?;
    assert_eq!(turn.usage["total_tokens"], prompt + 12);
    assert!(turn.usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(default_codec().encode(&turn.content).len(), 12);

    // Without include_usage there is no usage chunk.
    let plain = chat_body(
        &json!([user("again")]),
        json!({"stream": true, "max_completion_tokens": 3}),
    );
    assert!(stream_chat(&server, &plain).await?.usage.is_null());

    // Non-streaming gives the same usage shape.
    let whole = chat_body(&json!([user("tell me a story")]), json!({"max_tokens": 5}));
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&whole)
            .send(),
    )
    .await??;
    let b: Value = within(response.json()).await??;
    assert_eq!(b["object"], "chat.completion");
    assert_eq!(b["choices"][0]["message"]["role"], "assistant");
    assert_eq!(b["usage"]["completion_tokens"], 5);
    assert_eq!(b["usage"]["prompt_tokens"], prompt);

    // Legacy completions stream text_completion chunks.
    let response = within(
        server
            .client
            .post(format!("{}/v1/completions", server.base))
            .json(
                &json!({"model": "mock-model", "prompt": "once upon a time", "max_tokens": 4,
                          "stream": true, "stream_options": {"include_usage": true}}),
            )
            .send(),
    )
    .await??;
    let events = read_sse(response, Instant::now()).await?;
    assert_eq!(events.len(), 4 + 1 + 1 + 1);
    let first: Value = serde_json::from_str(&events[0].0)?;
    assert_eq!(first["object"], "text_completion");
    assert!(first["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("cmpl-")));
    let usage: Value = serde_json::from_str(&events[5].0)?;
    let prompt_tokens = default_codec().encode("once upon a time").len();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt_tokens);

    let m = server.scrape().await?;
    assert_eq!(
        m.get("vllm:request_success_total{model_name=\"mock-model\",engine=\"0\",finished_reason=\"length\"}"),
        Some(&4.0)
    );
    assert_eq!(
        m.get("vllm:num_requests_running{model_name=\"mock-model\",engine=\"0\"}"),
        Some(&0.0)
    );
    Ok(())
}

#[tokio::test]
async fn fixed_latency_sets_ttft_and_token_gaps() -> Result<()> {
    let server = TestServer::start(config(Some((20.0, 5.0)))).await?;
    let body = chat_body(
        &json!([user("timing")]),
        json!({"stream": true, "max_tokens": 10}),
    );
    let turn = stream_chat(&server, &body).await?;
    let times = &turn.token_times;
    assert_eq!(times.len(), 10);
    assert!(times[0] >= Duration::from_millis(20), "ttft {:?}", times[0]);
    assert!(times[0] < Duration::from_secs(10), "ttft {:?}", times[0]);
    let span = times[9] - times[0];
    // Nine gaps of 5 ms: never sooner; later only by a loaded machine's delays (the exact
    // figures are the engine's stamps, checked in `nvext`).
    assert!(span >= Duration::from_millis(36), "span {span:?}");
    assert!(span < Duration::from_secs(20), "span {span:?}");
    Ok(())
}

#[tokio::test]
async fn dropping_the_stream_frees_the_request() -> Result<()> {
    let server = TestServer::start(config(Some((1.0, 2.0)))).await?;
    let body = chat_body(
        &json!([user(&long_question())]),
        json!({"stream": true, "max_tokens": 5000}),
    );
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&body)
            .send(),
    )
    .await??;
    let mut stream = response.bytes_stream();
    for _ in 0..3 {
        within(stream.next()).await?.context("stream ended")??;
    }
    let live = within(server.state.engine.snapshot()).await??;
    assert_eq!(live.cluster.active_requests, 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = within(server.state.engine.snapshot()).await??;
        if live.cluster.active_requests == 0 {
            assert_eq!(live.cluster.workers[0].scheduler.active_blocks, 0);
            assert_eq!(live.cancelled, 1);
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("request still active: {live:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn completions_take_token_id_prompts() -> Result<()> {
    let state = AppState::new(config(None))?;
    let body = json!({"model": "mock-model", "prompt": [[5, 6, 7, 8, 9]], "max_tokens": 3});
    let (s, b) = post(&state, "/v1/completions", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["object"], "text_completion");
    assert_eq!(b["usage"]["prompt_tokens"], 5);
    assert_eq!(b["usage"]["completion_tokens"], 3);
    assert_eq!(
        default_codec()
            .encode(b["choices"][0]["text"].as_str().unwrap_or(""))
            .len(),
        3
    );
    Ok(())
}

#[tokio::test]
async fn same_seed_same_answers() -> Result<()> {
    let mut answers = Vec::new();
    for _ in 0..2 {
        let cli = Cli::try_parse_from([
            "mockserve",
            "--seed",
            "42",
            "--speedup-ratio",
            "inf",
            "--output-length-dist",
            "fixed",
        ])?;
        let server = TestServer::start(ServerConfig::from_args(&cli.serve)?).await?;
        let stream =
            json!({"stream": true, "max_tokens": 16, "stream_options": {"include_usage": true}});
        let turn = stream_chat(&server, &chat_body(&json!([user("same")]), stream)).await?;
        let (_, _, whole) = post_json(
            &server,
            chat_body(&json!([user("same")]), json!({"max_tokens": 16})).to_string(),
        )
        .await?;
        answers.push((
            turn.content,
            turn.usage,
            whole["choices"][0]["message"]["content"].clone(),
            whole["usage"].clone(),
        ));
    }
    assert_eq!(answers[0], answers[1]);
    assert!(!answers[0].0.is_empty());
    // Another seed gives other words.
    let cli = Cli::try_parse_from([
        "mockserve",
        "--seed",
        "43",
        "--speedup-ratio",
        "inf",
        "--output-length-dist",
        "fixed",
    ])?;
    let server = TestServer::start(ServerConfig::from_args(&cli.serve)?).await?;
    let stream = json!({"stream": true, "max_tokens": 16});
    let other = stream_chat(&server, &chat_body(&json!([user("same")]), stream)).await?;
    assert_ne!(other.content, answers[0].0);
    Ok(())
}
