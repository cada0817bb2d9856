//! Requests the server refuses or accepts: OpenAI error bodies through `app().oneshot`,
//! authentication, the queue bound, engine rejections and oversize bodies.

use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::*;

#[tokio::test]
async fn request_errors_have_openai_bodies() -> Result<()> {
    let state = AppState::new(config(None))?;
    let msgs = json!([user("hi")]);

    let malformed = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Body::from("{\"model\": "))?;
    let (s, b) = oneshot_raw(&state, malformed).await?;
    assert_eq!(
        error_of(s, &b, StatusCode::BAD_REQUEST)?["type"],
        "invalid_request_error"
    );

    let text = Request::post("/v1/chat/completions")
        .header("content-type", "text/plain")
        .body(Body::from(chat_body(&msgs, json!({})).to_string()))?;
    let (s, b) = oneshot_raw(&state, text).await?;
    error_of(s, &b, StatusCode::UNSUPPORTED_MEDIA_TYPE)?;

    let cases: Vec<(Value, StatusCode, Option<&str>, Option<&str>)> = vec![
        (
            json!({"messages": msgs}),
            StatusCode::BAD_REQUEST,
            Some("model"),
            None,
        ),
        (
            json!({"model": "mock-model"}),
            StatusCode::BAD_REQUEST,
            Some("messages"),
            None,
        ),
        (
            json!({"model": "mock-model", "messages": "hi"}),
            StatusCode::BAD_REQUEST,
            Some("messages"),
            None,
        ),
        (
            json!({"model": "mock-model", "messages": []}),
            StatusCode::BAD_REQUEST,
            Some("messages"),
            None,
        ),
        (
            json!({"model": "mock-model", "messages": [{"role": "wizard", "content": "x"}]}),
            StatusCode::BAD_REQUEST,
            Some("messages[0].role"),
            None,
        ),
        (
            json!({"model": 3, "messages": msgs}),
            StatusCode::BAD_REQUEST,
            Some("model"),
            None,
        ),
        (
            chat_body(&msgs, json!({"max_tokens": 0})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
            None,
        ),
        (
            chat_body(&msgs, json!({"max_completion_tokens": -3})),
            StatusCode::BAD_REQUEST,
            Some("max_completion_tokens"),
            None,
        ),
        (
            chat_body(&msgs, json!({"max_tokens": "ten"})),
            StatusCode::BAD_REQUEST,
            Some("max_tokens"),
            None,
        ),
        (
            chat_body(&msgs, json!({"stream": "yes"})),
            StatusCode::BAD_REQUEST,
            Some("stream"),
            None,
        ),
        (
            chat_body(&msgs, json!({"n": 129})),
            StatusCode::BAD_REQUEST,
            Some("n"),
            None,
        ),
        (
            chat_body(&msgs, json!({"max_tokens": 131072})),
            StatusCode::BAD_REQUEST,
            Some("messages"),
            Some("context_length_exceeded"),
        ),
        (
            json!({"model": "gpt-9", "messages": msgs}),
            StatusCode::NOT_FOUND,
            Some("model"),
            Some("model_not_found"),
        ),
    ];
    for (body, want, param, code) in cases {
        let (s, b) = post(&state, "/v1/chat/completions", &body).await?;
        let error = error_of(s, &b, want).with_context(|| body.to_string())?;
        assert_eq!(error["param"].as_str(), param, "{body} -> {b}");
        if let Some(code) = code {
            assert_eq!(error["code"], code, "{b}");
        }
    }

    let hints = chat_body(
        &msgs,
        json!({"nvext": {"agent_hints": {"speculative": true}}}),
    );
    let (s, b) = post(&state, "/v1/chat/completions", &hints).await?;
    let message = error_of(s, &b, StatusCode::BAD_REQUEST)?["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for allowed in [
        "priority",
        "strict_priority",
        "osl",
        "speculative_prefill",
        "latency_sensitivity",
    ] {
        assert!(message.contains(allowed), "{message}");
    }

    let (s, b) = post(&state, "/v1/nope", &json!({})).await?;
    error_of(s, &b, StatusCode::NOT_FOUND)?;
    let (s, b) = post(&state, "/v1/completions", &json!({"model": "mock-model"})).await?;
    assert_eq!(error_of(s, &b, StatusCode::BAD_REQUEST)?["param"], "prompt");
    Ok(())
}

#[tokio::test]
async fn accepted_extras_auth_and_queue_bound() -> Result<()> {
    let state = AppState::new(config(None))?;
    let body = chat_body(
        &json!([{"role": "system", "content": [{"type": "text", "text": "be brief"}]}, user("hi")]),
        json!({
            "max_tokens": 4, "temperature": 0.7, "seed": 3, "ignore_eos": true, "min_tokens": 1,
            "stop": ["\n"], "tools": [], "some_vendor_field": {"x": 1}, "n": 1,
            "nvext": {"agent_hints": {"priority": 1, "osl": 4, "latency_sensitivity": 1.5},
                      "greed_sampling": true},
        }),
    );
    let (s, b) = post(&state, "/v1/chat/completions", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["object"], "chat.completion");
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    assert_eq!(b["usage"]["completion_tokens"], 4);

    let mut keyed = config(None);
    keyed.api_key = Some("sekrit".into());
    let keyed = AppState::new(keyed)?;
    let (s, b) = post(&keyed, "/v1/chat/completions", &body).await?;
    assert_eq!(
        error_of(s, &b, StatusCode::UNAUTHORIZED)?["code"],
        "invalid_api_key"
    );
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sekrit")
        .body(Body::from(body.to_string()))?;
    assert_eq!(oneshot_raw(&keyed, request).await?.0, StatusCode::OK);

    let mut bounded = config(None);
    bounded.max_waiting = Some(0);
    let bounded = AppState::new(bounded)?;
    let (s, b) = post(&bounded, "/v1/chat/completions", &body).await?;
    assert_eq!(
        error_of(s, &b, StatusCode::TOO_MANY_REQUESTS)?["code"],
        "rate_limit_exceeded"
    );

    let models = Request::get("/v1/models").body(Body::empty())?;
    let (s, b) = oneshot_raw(&state, models).await?;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["data"][0]["id"], "mock-model");
    let health = Request::get("/health").body(Body::empty())?;
    assert_eq!(oneshot_raw(&state, health).await?.0, StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn engine_rejection_is_a_400_streamed_or_not() -> Result<()> {
    let mut cfg = config(None);
    cfg.cluster.engine.num_gpu_blocks = 2;
    let server = TestServer::start(cfg).await?;
    // The engine refuses at submission a request its KV pool can never hold: a plain 400
    // before any byte of the stream, as for a request too long for the context.
    for extra in [
        json!({"stream": true, "max_tokens": 4}),
        json!({"max_tokens": 4}),
    ] {
        let body = chat_body(&json!([user(&long_question())]), extra);
        let response = within(
            server
                .client
                .post(format!("{}/v1/chat/completions", server.base))
                .json(&body)
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await?;
        assert_eq!(error["error"]["code"], "kv_capacity_exceeded", "{error}");
    }
    Ok(())
}

#[tokio::test]
async fn overload_and_oversize_errors_leave_other_requests_alone() -> Result<()> {
    let mut cfg = config(Some((5.0, 5.0)));
    cfg.cluster.engine.max_num_seqs = 1;
    cfg.max_waiting = Some(1);
    cfg.max_body_bytes = 4096;
    let server = Arc::new(TestServer::start(cfg).await?);
    let stream =
        json!({"stream": true, "max_tokens": 40, "stream_options": {"include_usage": true}});
    let running = {
        let server = Arc::clone(&server);
        let body = chat_body(&json!([user("first")]), stream.clone());
        tokio::spawn(async move { stream_chat(&server, &body).await })
    };
    wait_for(&server, |w| w.running == 1).await?;
    let waiting = {
        let server = Arc::clone(&server);
        let body = chat_body(&json!([user("second")]), stream);
        tokio::spawn(async move { stream_chat(&server, &body).await })
    };
    wait_for(&server, |w| w.running == 1 && w.waiting == 1).await?;

    // Queue full: 429 with retry-after.
    let small = chat_body(&json!([user("third")]), json!({"max_tokens": 2}));
    let (s, headers, b) = post_json(&server, small.to_string()).await?;
    assert_eq!(
        error_of(s, &b, StatusCode::TOO_MANY_REQUESTS)?["code"],
        "rate_limit_exceeded"
    );
    let retry: u64 = headers
        .get("retry-after")
        .context("no retry-after")?
        .to_str()?
        .parse()?;
    assert!(retry >= 1);

    // Body over --max-body-bytes: 413, OpenAI-shaped.
    let huge = chat_body(&json!([user(&"x ".repeat(4000))]), json!({}));
    let (s, _, b) = post_json(&server, huge.to_string()).await?;
    assert_eq!(
        error_of(s, &b, StatusCode::PAYLOAD_TOO_LARGE)?["code"],
        "request_too_large"
    );
    // Malformed JSON on the same server.
    let (s, _, b) = post_json(&server, "{\"model\":".into()).await?;
    error_of(s, &b, StatusCode::BAD_REQUEST)?;

    // The two accepted streams run to completion untouched.
    for task in [running, waiting] {
        let turn = within(task).await???;
        assert_eq!(turn.token_times.len(), 40);
        assert_eq!(turn.usage["completion_tokens"], 40);
    }
    let live = within(server.state.engine.snapshot()).await??;
    assert_eq!(live.cluster.active_requests, 0);
    Ok(())
}

#[tokio::test]
async fn oversized_body_is_413_through_the_router() -> Result<()> {
    let mut cfg = config(None);
    cfg.max_body_bytes = 100;
    let state = AppState::new(cfg)?;
    let body = chat_body(&json!([user(&"y".repeat(200))]), json!({}));
    let (s, b) = post(&state, "/v1/chat/completions", &body).await?;
    error_of(s, &b, StatusCode::PAYLOAD_TOO_LARGE)?;
    // Without a Content-Length (a streamed body), the limit still holds.
    let chunks: Vec<Result<String, std::io::Error>> = vec![Ok(body.to_string())];
    let request = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))?;
    let (s, b) = oneshot_raw(&state, request).await?;
    error_of(s, &b, StatusCode::PAYLOAD_TOO_LARGE)?;
    let ok = chat_body(&json!([user("hi")]), json!({"max_tokens": 1}));
    assert_eq!(
        post(&state, "/v1/chat/completions", &ok).await?.0,
        StatusCode::OK
    );
    Ok(())
}

/// Each route with `--api-key` set: its status without the key (or with it, where marked), and
/// what it counts in `servesim_http_request_failures_total`,
/// `servesim_http_requests_overloaded_total` and `servesim_http_requests_total{endpoint}`.
#[tokio::test]
async fn the_api_key_and_the_failure_counts_route_by_route() -> Result<()> {
    use mock_server::metrics::EndpointLabel;

    let mut keyed = config(None);
    keyed.api_key = Some("sekrit".into());
    keyed.max_waiting = Some(0);
    let state = AppState::new(keyed)?;
    let chat = chat_body(&json!([user("hi")]), json!({"max_tokens": 2}));
    let text = json!({"model": "mock-model", "prompt": "hi", "max_tokens": 2});
    let lora = json!({"lora_name": "a", "lora_path": "/a"});
    let words = json!({"prompt": "hi"});
    let not_words = json!({"prompt": 1});
    let ids = json!({"tokens": [1]});
    let unauthorized = json!({"error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": null,
        "code": "invalid_api_key",
    }});
    // (request, body, key sent, status, failures counted, [chat, completions] requests counted)
    type Case<'a> = (&'a str, Option<&'a Value>, bool, u16, u64, [u64; 2]);
    #[rustfmt::skip]
    let cases: [Case; 20] = [
        ("POST /v1/chat/completions", Some(&chat), false, 401, 1, [1, 0]),
        ("POST /v1/completions", Some(&text), false, 401, 1, [0, 1]),
        ("GET /v1/models", None, false, 401, 0, [0, 0]),
        ("GET /v1/models/mock-model", None, false, 401, 0, [0, 0]),
        ("POST /v1/load_lora_adapter", Some(&lora), false, 401, 1, [0, 0]),
        ("POST /v1/unload_lora_adapter", Some(&lora), false, 401, 1, [0, 0]),
        ("POST /reset_prefix_cache", None, false, 401, 1, [0, 0]),
        // Outside `/v1`: no key needed.
        ("POST /tokenize", Some(&words), false, 200, 0, [0, 0]),
        ("POST /detokenize", Some(&ids), false, 200, 0, [0, 0]),
        ("GET /health", None, false, 200, 0, [0, 0]),
        ("GET /metrics", None, false, 200, 0, [0, 0]),
        ("GET /version", None, false, 200, 0, [0, 0]),
        ("GET /ping", None, false, 200, 0, [0, 0]),
        // Failures past the key: counted on the generation, tokenizer and LoRA routes, not on
        // the model cards; unknown routes and methods are not counted. A 429 is overloaded too.
        ("POST /tokenize", Some(&not_words), false, 400, 1, [0, 0]),
        ("POST /v1/unload_lora_adapter", Some(&lora), true, 400, 1, [0, 0]),
        ("GET /v1/models/other", None, true, 404, 0, [0, 0]),
        ("GET /v1/chat/completions", None, false, 405, 0, [0, 0]),
        ("POST /v1/models", None, true, 405, 0, [0, 0]),
        ("GET /v1/nowhere", None, false, 404, 0, [0, 0]),
        ("POST /v1/chat/completions", Some(&chat), true, 429, 1, [1, 0]),
    ];
    let metrics = &state.metrics;
    let requests = |endpoint| {
        metrics
            .http_requests
            .get_or_create(&EndpointLabel { endpoint })
            .get()
    };
    let counts = || {
        (
            metrics.http_failures.get(),
            metrics.overloaded.get(),
            [requests("chat"), requests("completions")],
        )
    };
    for (line, body, key, status, failures, [chats, texts]) in cases {
        let (method, path) = line.split_once(' ').context("a request line")?;
        let (failed, overloaded, [chat_requests, text_requests]) = counts();
        let mut request = Request::builder().method(method).uri(path);
        if key {
            request = request.header("authorization", "Bearer sekrit");
        }
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))?,
            None => request.body(Body::empty())?,
        };
        let response = within(app(state.clone()).oneshot(request)).await??;
        let got = response.status();
        let bytes = within(response.into_body().collect()).await??.to_bytes();
        assert_eq!(got.as_u16(), status, "{line}: {bytes:?}");
        if status == 401 {
            assert_eq!(
                serde_json::from_slice::<Value>(&bytes)?,
                unauthorized,
                "{line}"
            );
        }
        let refused = u64::from(status == 429);
        assert_eq!(
            counts(),
            (
                failed + failures,
                overloaded + refused,
                [chat_requests + chats, text_requests + texts]
            ),
            "{line}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn engine_rejections_of_a_completion_name_its_prompt() -> Result<()> {
    // A pool of 4 blocks (64 tokens): a 100-token prompt can never be admitted.
    let mut small = config(None);
    small.cluster.engine.num_gpu_blocks = 4;
    let state = AppState::new(small)?;
    let body = json!({"model": "mock-model", "prompt": vec![1; 100], "max_tokens": 1});
    let (s, b) = post(&state, "/v1/completions", &body).await?;
    let error = error_of(s, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["code"], "kv_capacity_exceeded", "{b}");
    assert_eq!(error["param"], "prompt", "{b}");
    let chat = chat_body(
        &json!([user(&"word ".repeat(100))]),
        json!({"max_tokens": 1}),
    );
    let (s, b) = post(&state, "/v1/chat/completions", &chat).await?;
    let error = error_of(s, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "messages", "{b}");
    Ok(())
}

#[tokio::test]
async fn a_huge_temperature_is_written_compactly() -> Result<()> {
    let state = AppState::new(config(None))?;
    let body = json!({"model": "mock-model", "prompt": "hi", "temperature": 1e308});
    let (s, b) = post(&state, "/v1/completions", &body).await?;
    let error = error_of(s, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "temperature");
    assert_eq!(
        error["message"],
        "Invalid 'temperature': 1e308. It must be between 0 and 2."
    );
    Ok(())
}

/// A path segment that is not UTF-8 once percent-decoded (`%F1`) names no model and no stored
/// response: a 404 with the OpenAI body, not axum's plain-text 400 (found by the `fleet_admin`
/// fuzzer on the fleet's admin routes, which answer a 400 `worker_not_found` for it).
#[tokio::test]
async fn a_path_that_is_not_utf8_is_an_openai_404() -> Result<()> {
    let state = AppState::new(config(None))?;
    for path in ["/v1/models/%F1", "/v1/responses/resp_%F1"] {
        for method in ["GET", "DELETE"] {
            if method == "DELETE" && path.starts_with("/v1/models") {
                continue;
            }
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(Body::empty())?;
            let (s, b) = oneshot_raw(&state, request).await?;
            let error = error_of(s, &b, StatusCode::NOT_FOUND).with_context(|| path.to_string())?;
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("not UTF-8")),
                "{path}: {error}"
            );
        }
    }
    Ok(())
}
