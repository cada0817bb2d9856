//! The server never hangs on a request the engine can never run: empty prompts and prompts over
//! the no-chunking budget are 400s, streamed or not, and the server keeps serving (generation
//! and `/metrics`) afterwards; a dead engine task turns `/health` into a 503.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use anyhow::Result;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::config::ServerConfig;
use mock_server::test_kit::{within, TestServer};
use mock_server::text::{ChatMessage, TextCodec};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use servesim::cluster::ClusterConfig;
use servesim::perf::{DecodeBatch, Fixed, LatencyModel, PrefillBatch};
use tower::ServiceExt;

fn config(edit: impl FnOnce(&mut ClusterConfig)) -> ServerConfig {
    let mut cluster = ClusterConfig::default();
    cluster.engine.block_size = 16;
    cluster.engine.latency.model = Arc::new(Fixed {
        prefill_ms: 2.0,
        decode_ms: 1.0,
    });
    edit(&mut cluster);
    ServerConfig::new(cluster)
}

/// What the tests ask of the server besides starting it.
trait Probe {
    async fn post(&self, path: &str, body: &Value) -> Result<(StatusCode, String)>;
    async fn get(&self, path: &str) -> Result<(StatusCode, String)>;
    async fn still_serves(&self) -> Result<()>;
}

impl Probe for TestServer {
    /// POSTs `body` and reads the whole answer (a stream to its end).
    async fn post(&self, path: &str, body: &Value) -> Result<(StatusCode, String)> {
        let response = within(
            self.client
                .post(format!("{}{path}", self.base))
                .json(body)
                .send(),
        )
        .await??;
        let status = StatusCode::from_u16(response.status().as_u16())?;
        let text = within(response.text()).await??;
        Ok((status, text))
    }

    async fn get(&self, path: &str) -> Result<(StatusCode, String)> {
        let response = within(self.client.get(format!("{}{path}", self.base)).send()).await??;
        let status = StatusCode::from_u16(response.status().as_u16())?;
        Ok((status, within(response.text()).await??))
    }

    /// A small completion and `/metrics` both still answer.
    async fn still_serves(&self) -> Result<()> {
        let body = json!({"model": "mock-model", "prompt": "still alive", "max_tokens": 2});
        let (status, text) = self.post("/v1/completions", &body).await?;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (status, _) = self.get("/metrics").await?;
        assert_eq!(status, StatusCode::OK);
        Ok(())
    }
}

fn error_code(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    v["error"]["code"].clone()
}

#[tokio::test]
async fn empty_prompts_are_400_and_the_server_keeps_serving() -> Result<()> {
    let server = TestServer::start(config(|_| {})).await?;
    for prompt in [json!(""), json!([""]), json!([[]])] {
        for stream in [false, true] {
            let body = json!({"model": "mock-model", "prompt": prompt, "stream": stream});
            let (status, text) = server.post("/v1/completions", &body).await?;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{prompt} {stream}: {text}");
            assert_eq!(error_code(&text), "empty_prompt", "{text}");
        }
    }
    server.still_serves().await
}

/// A tokenizer (as a real one may) that turns some text into no token at all, and renders
/// chats to nothing: such prompts get past the parser and reach the engine empty.
#[derive(Debug)]
struct Vanishing;

impl TextCodec for Vanishing {
    fn render_chat(&self, _: &[ChatMessage], _: bool) -> Vec<u32> {
        Vec::new()
    }
    fn encode(&self, _: &str) -> Vec<u32> {
        Vec::new()
    }
    fn answer_tokens(&self, _: &mut ChaCha8Rng, _: usize, n: usize) -> Vec<u32> {
        vec![7; n]
    }
    fn decode(&self, ids: &[u32]) -> String {
        "x".repeat(ids.len())
    }
}

#[tokio::test]
async fn a_prompt_that_tokenizes_to_nothing_is_refused_by_the_engine() -> Result<()> {
    let server = TestServer::start(ServerConfig {
        codec: Arc::new(Vanishing),
        ..config(|_| {})
    })
    .await?;
    for stream in [false, true] {
        let completion = json!({"model": "mock-model", "prompt": "hi", "stream": stream});
        let chat = json!({"model": "mock-model", "stream": stream,
                          "messages": [{"role": "user", "content": "hi"}]});
        for (path, body) in [
            ("/v1/completions", completion),
            ("/v1/chat/completions", chat),
        ] {
            let (status, text) = server.post(path, &body).await?;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {stream}: {text}");
            assert_eq!(error_code(&text), "empty_prompt", "{text}");
        }
    }
    let (status, _) = server.get("/metrics").await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}

#[tokio::test]
async fn prompts_over_the_no_chunking_budget_are_400() -> Result<()> {
    let server = TestServer::start(config(|c| {
        c.engine.max_num_batched_tokens = 16;
        c.engine.enable_chunked_prefill = false;
    }))
    .await?;
    let long: Vec<u32> = (0..40).collect();
    for stream in [false, true] {
        let body =
            json!({"model": "mock-model", "prompt": long, "stream": stream, "max_tokens": 2});
        let (status, text) = server.post("/v1/completions", &body).await?;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert_eq!(error_code(&text), "batch_budget_exceeded", "{text}");
    }
    let short = json!({"model": "mock-model", "prompt": [[1, 2, 3]], "max_tokens": 2});
    let (status, text) = server.post("/v1/completions", &short).await?;
    assert_eq!(status, StatusCode::OK, "{text}");
    server.still_serves().await
}

/// A latency model that fails: the engine task panics at its first pass.
#[derive(Debug)]
struct Explodes;

impl LatencyModel for Explodes {
    fn prefill_ms(&self, _: &PrefillBatch) -> f64 {
        panic!("injected latency-model failure")
    }
    fn decode_ms(&self, _: &DecodeBatch) -> f64 {
        1.0
    }
}

#[tokio::test]
async fn health_fails_once_the_engine_task_is_dead() -> Result<()> {
    let state = AppState::new(config(|c| c.engine.latency.model = Arc::new(Explodes)))?;
    let health = || async {
        let request = Request::get("/health").body(Body::empty())?;
        let response = within(app(state.clone()).oneshot(request)).await??;
        let status = response.status();
        let body = within(response.into_body().collect()).await??.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    assert_eq!(health().await?.0, StatusCode::OK);
    let body = json!({"model": "mock-model", "prompt": "boom", "max_tokens": 2});
    let request = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))?;
    let response = within(app(state.clone()).oneshot(request)).await??;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let (status, text) = health().await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    Ok(())
}
