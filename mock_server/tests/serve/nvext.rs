//! Dynamo's `nvext` request extension and the response `nvext` (worker ids, timing).

use anyhow::{Context, Result};
use axum::http::StatusCode;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::common::*;

#[tokio::test]
async fn nvext_is_strict_and_pins_workers() -> Result<()> {
    let mut cfg = config(Some((20.0, 5.0)));
    cfg.cluster.num_workers = 3;
    let server = TestServer::start(cfg).await?;
    let msgs = json!([user("hello there")]);
    let cases = [
        (json!({"nvext": {"bogus": 1}}), "nvext.bogus"),
        (
            json!({"nvext": {"agent_hints": {"speculative": true}}}),
            "nvext.agent_hints.speculative",
        ),
        (json!({"nvext": {"backend_instance_id": "one"}}), "nvext"),
        (json!({"nvext": 7}), "nvext"),
        (
            json!({"nvext": {"backend_instance_id": 3}}),
            "nvext.backend_instance_id",
        ),
    ];
    for (extra, param) in cases {
        let body = chat_body(&msgs, extra);
        let (s, _, b) = post_json(&server, body.to_string()).await?;
        let error = error_of(s, &b, StatusCode::BAD_REQUEST).with_context(|| body.to_string())?;
        assert_eq!(error["param"], param, "{b}");
    }
    // Every field of Dynamo's nvext (union across versions) is accepted.
    let everything = json!({"nvext": {
        "greed_sampling": true, "use_raw_prompt": false, "annotations": ["a"],
        "backend_instance_id": 2, "token_data": [1, 2], "max_thinking_tokens": 10,
        "cache_salt": "s", "extra_fields": ["worker_id", "timing", "stop_reason"],
        "metadata_upload": {"url": "http://x"}, "prefill_worker_id": 2, "decode_worker_id": 2,
        "dp_rank": 0, "prefill_dp_rank": 0,
        "agent_hints": {"priority": 1, "strict_priority": 0, "osl": 3,
                        "speculative_prefill": false, "latency_sensitivity": 1.2},
        "agent_context": {"session_id": "s"}, "request_timestamp_ms": 1.5,
        "session_control": {"session_id": "s", "action": "open"},
        "routing_constraints": {"required_taints": []}, "router": {"ttft_target": 100.0},
        "speculative_prefill": false,
    }, "max_tokens": 3});
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    let (s, _, b) = post_json(&server, chat_body(&msgs, everything).to_string()).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    let nvext = &b["nvext"];
    assert_eq!(nvext["worker_id"]["decode_worker_id"], 2, "{b}");
    assert_eq!(nvext["worker_id"]["prefill_worker_id"], 2, "{b}");
    let timing = &nvext["timing"];
    let received = timing["request_received_ms"].as_u64().context("received")?;
    // The server maps its monotonic clock to Unix time once, at start: allow a millisecond.
    assert!(
        received + 1 >= started_ms && received < started_ms + 60_000,
        "{timing}"
    );
    let ttft = timing["ttft_ms"].as_f64().context("ttft")?;
    let total = timing["total_time_ms"].as_f64().context("total")?;
    // One 20 ms prefill, then two 5 ms decode steps: the engine's stamps, exact whatever the
    // host's load.
    assert!((ttft - 20.0).abs() < 1e-6, "{timing}");
    assert!((total - 30.0).abs() < 1e-6, "{timing}");
    let first = timing["first_token_ms"].as_u64().context("first")?;
    let last = timing["last_token_ms"].as_u64().context("last")?;
    assert!(received <= first && first <= last, "{timing}");
    assert!((9..=11).contains(&(last - first)), "{timing}");
    // `/metrics` measures the same stamps: worker 2 served this request only.
    let scraped = server.scrape().await?;
    let sum = |name: &str| {
        scraped
            .get(&format!("{name}{{model_name=\"mock-model\",engine=\"2\"}}"))
            .copied()
            .unwrap_or(f64::NAN)
    };
    assert!(
        (sum("vllm:time_to_first_token_seconds_sum") - ttft / 1e3).abs() < 1e-9,
        "{scraped:?}"
    );
    assert!(
        (sum("vllm:e2e_request_latency_seconds_sum") - total / 1e3).abs() < 1e-9,
        "{scraped:?}"
    );
    assert!(
        (sum("vllm:inter_token_latency_seconds_sum") - (total - ttft) / 1e3).abs() < 1e-9,
        "{scraped:?}"
    );

    // The header wins over the body; streamed, nvext rides on the finish chunk only.
    let t0 = Instant::now();
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .header("x-dynamo-worker-instance-id", "1")
            .json(&chat_body(
                &msgs,
                json!({"stream": true, "max_tokens": 2,
                       "nvext": {"backend_instance_id": 2, "extra_fields": ["worker_id"]}}),
            ))
            .send(),
    )
    .await??;
    let events = read_sse(response, t0).await?;
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(d, _)| serde_json::from_str(d))
        .collect::<Result<_, _>>()?;
    let with_nvext: Vec<&Value> = chunks.iter().filter(|c| c.get("nvext").is_some()).collect();
    assert_eq!(with_nvext.len(), 1, "{chunks:?}");
    assert_eq!(with_nvext[0]["choices"][0]["finish_reason"], "length");
    assert_eq!(with_nvext[0]["nvext"]["worker_id"]["decode_worker_id"], 1);
    assert!(with_nvext[0]["nvext"].get("timing").is_none());

    for bad in ["7", "x"] {
        let response = within(
            server
                .client
                .post(format!("{}/v1/chat/completions", server.base))
                .header("x-worker-instance-id", bad)
                .json(&chat_body(&msgs, json!({"max_tokens": 1})))
                .send(),
        )
        .await??;
        let status = StatusCode::from_u16(response.status().as_u16())?;
        let b: Value = within(response.json()).await??;
        error_of(status, &b, StatusCode::BAD_REQUEST)?;
    }
    // Without extra_fields there is no response nvext.
    let (_, _, b) = post_json(
        &server,
        chat_body(&msgs, json!({"max_tokens": 1})).to_string(),
    )
    .await?;
    assert!(b.get("nvext").is_none(), "{b}");
    Ok(())
}
