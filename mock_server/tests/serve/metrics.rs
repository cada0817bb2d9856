//! `GET /metrics`: the exposition parses and its counters and histograms move.

use anyhow::{Context, Result};
use axum::http::StatusCode;
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn metrics_parse_and_move() -> Result<()> {
    let mut cfg = config(Some((2.0, 1.0)));
    cfg.cluster.num_workers = 2;
    let server = TestServer::start(cfg).await?;
    let before = server.scrape().await?;
    let names = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ];
    for name in names {
        for w in 0..2 {
            let key = format!("{name}{{model_name=\"mock-model\",engine=\"{w}\"}}");
            assert_eq!(before.get(&key), Some(&0.0), "{key}");
        }
    }
    // Two turns pinned to worker 1: the second hits the prefix cache.
    let q = long_question();
    let body = chat_body(
        &json!([user(&q)]),
        json!({"max_tokens": 5, "nvext": {"backend_instance_id": 1}}),
    );
    let (s, _, b1) = post_json(&server, body.to_string()).await?;
    assert_eq!(s, StatusCode::OK);
    let (s, _, b2) = post_json(&server, body.to_string()).await?;
    assert_eq!(s, StatusCode::OK);
    let after = server.scrape().await?;
    let at = |name: &str, w: u32| {
        let labels = if name.starts_with("vllm:") {
            format!("model_name=\"mock-model\",engine=\"{w}\"")
        } else {
            format!("worker=\"{w}\"")
        };
        after
            .get(&format!("{name}{{{labels}}}"))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let prompt = b1["usage"]["prompt_tokens"].as_f64().context("prompt")?;
    let hits = b2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .context("cached")?;
    assert!(hits > 0.0);
    assert_eq!(at("vllm:prompt_tokens_total", 1), 2.0 * prompt);
    assert_eq!(at("vllm:prefix_cache_queries_total", 1), 2.0 * prompt);
    assert_eq!(at("vllm:prefix_cache_hits_total", 1), hits);
    assert_eq!(at("vllm:generation_tokens_total", 1), 10.0);
    assert_eq!(at("vllm:time_to_first_token_seconds_count", 1), 2.0);
    assert_eq!(at("vllm:inter_token_latency_seconds_count", 1), 8.0);
    assert_eq!(at("vllm:e2e_request_latency_seconds_count", 1), 2.0);
    // Two 2 ms prefills on an idle engine, on the engine's stamps: exact whatever the load.
    let ttft_sum = at("vllm:time_to_first_token_seconds_sum", 1);
    assert!((ttft_sum - 0.004).abs() < 1e-9, "{ttft_sum}");
    assert_eq!(at("vllm:generation_tokens_total", 0), 0.0);
    assert_eq!(at("servesim_router_requests_total", 1), 2.0);
    assert_eq!(
        after.get("servesim_router_pinned_requests_total"),
        Some(&2.0)
    );
    assert_eq!(
        after.get("servesim_http_requests_total{endpoint=\"chat\"}"),
        Some(&2.0)
    );
    assert_eq!(
        after
            .get("vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"mock-model\",engine=\"1\"}")
            .or_else(|| after.get(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"mock-model\",engine=\"1\",le=\"+Inf\"}"
            )),
        Some(&2.0)
    );
    Ok(())
}

/// Every token handed to a client is on `servesim_token_lateness_seconds`, and a server held up
/// while its tokens fall due (its runtime, this test's only thread, blocked) reports them late
/// by the hold-up: the server says when its own timing is not to be trusted.
#[tokio::test]
async fn tokens_report_how_late_the_server_handed_them_over() -> Result<()> {
    // A 1 ms prefill and 10 ms decode steps: 40 tokens due over about 390 ms after the first.
    let server = TestServer::start(config(Some((1.0, 10.0)))).await?;
    let body = chat_body(
        &json!([user("hello")]),
        json!({"max_tokens": 40, "stream": true}),
    );
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), StatusCode::OK);
    // The headers came with the first token. Held up 200 ms from here: every token due in the
    // first 100 ms of the hold-up (about ten, however late the headers were read, as long as
    // it was within 290 ms) reaches its handler 100 ms or more after its simulated time.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let events = read_sse(response, tokio::time::Instant::now()).await?;
    assert!(events.len() >= 40, "{} events", events.len());
    let m = server.scrape().await?;
    let get = |k: &str| m.get(k).copied().unwrap_or(f64::NAN);
    assert_eq!(get("servesim_token_lateness_seconds_count"), 40.0);
    assert_eq!(
        get("servesim_token_lateness_seconds_bucket{le=\"+Inf\"}"),
        40.0
    );
    let late = 40.0 - get("servesim_token_lateness_seconds_bucket{le=\"0.1\"}");
    assert!(late >= 5.0, "{late} tokens over 100 ms late");
    assert!(get("servesim_token_lateness_seconds_sum") >= late * 0.1);
    assert!(get("servesim_behind_schedule_seconds") >= 0.0);
    Ok(())
}
