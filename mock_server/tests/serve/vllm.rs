//! vLLM's HTTP surface besides generation (`/tokenize`, `/detokenize`, `/version`, `/ping`,
//! `/v1/models/{model}`) with exact bodies, and the vLLM metric set routers scrape.

use anyhow::Result;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::text::default_codec;
use serde_json::json;
use tower::ServiceExt;

use crate::common::*;

#[tokio::test]
async fn tokenize_and_detokenize_answer_as_vllm() -> Result<()> {
    let state = AppState::new(config(None))?;
    let codec = default_codec();
    let (status, body) = post(&state, "/tokenize", &json!({"prompt": "once upon a time"})).await?;
    assert_eq!(status, StatusCode::OK);
    let ids = codec.encode("once upon a time");
    assert_eq!(
        body,
        json!({"count": ids.len(), "max_model_len": 131072, "tokens": ids, "token_strs": null})
    );
    // Chat messages render with the template the generation endpoints use.
    let messages = json!([{"role": "user", "content": "hello there"}]);
    let (status, body) = post(
        &state,
        "/tokenize",
        &json!({"model": "mock-model", "messages": messages, "add_generation_prompt": true}),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    let rendered = codec.render_chat(
        &[servesim::tokenizer::ChatMessage::new(
            servesim::tokenizer::Role::User,
            "hello there",
        )],
        true,
    );
    assert_eq!(body["tokens"], json!(rendered));
    assert_eq!(body["count"], json!(rendered.len()));
    let (status, body) = post(
        &state,
        "/tokenize",
        &json!({"prompt": "ab", "return_token_strs": true}),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    let strs: Vec<String> = codec
        .encode("ab")
        .iter()
        .map(|&t| codec.decode(&[t]))
        .collect();
    assert_eq!(body["token_strs"], json!(strs));

    let (status, body) = post(&state, "/detokenize", &json!({"tokens": ids})).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"prompt": "once upon a time"}));

    // Another model is a 404; a malformed body a 400 naming the field.
    let (status, body) = post(
        &state,
        "/tokenize",
        &json!({"model": "other", "prompt": "x"}),
    )
    .await?;
    assert_eq!(
        error_of(status, &body, StatusCode::NOT_FOUND)?["code"],
        "model_not_found"
    );
    let (status, body) = post(&state, "/detokenize", &json!({"tokens": ["a"]})).await?;
    assert_eq!(
        error_of(status, &body, StatusCode::BAD_REQUEST)?["param"],
        "tokens"
    );
    let (status, body) = post(&state, "/tokenize", &json!({"text": "x"})).await?;
    assert_eq!(
        error_of(status, &body, StatusCode::BAD_REQUEST)?["param"],
        "prompt"
    );
    Ok(())
}

#[tokio::test]
async fn version_ping_and_model_card() -> Result<()> {
    let state = AppState::new(config(None))?;
    let get = |path: &str| Request::get(path).body(Body::empty());
    let (status, body) = oneshot_raw(&state, get("/version")?).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"version": env!("CARGO_PKG_VERSION")}));
    for request in [get("/ping")?, Request::post("/ping").body(Body::empty())?] {
        let response = within(app(state.clone()).oneshot(request)).await??;
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = within(response.into_body().collect()).await??.to_bytes();
        assert!(bytes.is_empty(), "vLLM's /ping has an empty body");
    }
    let (status, body) = oneshot_raw(&state, get("/v1/models/mock-model")?).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["id"], "mock-model");
    assert_eq!(body["object"], "model");
    assert_eq!(body["root"], "mock-model");
    assert_eq!(body["parent"], json!(null));
    assert_eq!(body["max_model_len"], 131072);
    let (status, body) = oneshot_raw(&state, get("/v1/models/nope")?).await?;
    assert_eq!(
        error_of(status, &body, StatusCode::NOT_FOUND)?["code"],
        "model_not_found"
    );
    Ok(())
}

#[tokio::test]
async fn metrics_carry_vllms_set_and_cache_config() -> Result<()> {
    let mut cfg = config(Some((2.0, 1.0)));
    cfg.cluster.num_workers = 2;
    cfg.cluster.engine.num_gpu_blocks = 512;
    let server = TestServer::start(cfg).await?;
    let body = chat_body(
        &json!([user("tell me a story")]),
        json!({"max_tokens": 4, "nvext": {"backend_instance_id": 1}}),
    );
    let (status, _, _) = post_json(&server, body.to_string()).await?;
    assert_eq!(status, StatusCode::OK);
    let m = server.scrape().await?;
    let engine1 = "model_name=\"mock-model\",engine=\"1\"";
    for name in [
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
        "vllm:request_inference_time_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
        "vllm:request_params_max_tokens_count",
    ] {
        assert_eq!(m.get(&format!("{name}{{{engine1}}}")), Some(&1.0), "{name}");
    }
    assert_eq!(
        m.get(&format!("vllm:request_generation_tokens_sum{{{engine1}}}")),
        Some(&4.0)
    );
    // Two 1 ms decode steps after the first token's 2 ms prefill.
    let decode = m
        .get(&format!(
            "vllm:request_decode_time_seconds_sum{{{engine1}}}"
        ))
        .copied()
        .unwrap_or(f64::NAN);
    assert!((decode - 0.003).abs() < 1e-9, "{decode}");
    // vLLM's 1-2-5 buckets up to the context length.
    let mut prompt_buckets: Vec<f64> = m
        .keys()
        .filter(|k| k.starts_with("vllm:request_prompt_tokens_bucket") && k.contains(engine1))
        .filter_map(|k| k.split("le=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    prompt_buckets.sort_by(f64::total_cmp);
    let mut want = Vec::new();
    for e in 0..6 {
        for b in [1.0, 2.0, 5.0] {
            let v = b * 10f64.powi(e);
            if v <= 131072.0 {
                want.push(v);
            }
        }
    }
    want.push(f64::INFINITY);
    assert_eq!(prompt_buckets, want);
    assert!(
        m.get(&format!("vllm:iteration_tokens_total_count{{{engine1}}}"))
            .is_some_and(|n| *n >= 1.0),
        "{m:?}"
    );
    for engine in 0..2 {
        let key = format!(
            "vllm:cache_config_info{{engine=\"{engine}\",block_size=\"16\",cache_dtype=\"auto\",\
             enable_prefix_caching=\"True\",gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"0\",\
             num_gpu_blocks=\"512\"}}"
        );
        assert_eq!(m.get(&key), Some(&1.0), "{key}");
    }
    // The servesim_* figures stay.
    assert_eq!(
        m.get("servesim_router_requests_total{worker=\"1\"}"),
        Some(&1.0)
    );
    Ok(())
}
