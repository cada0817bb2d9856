//! Helpers shared by the serve tests: configs and request bodies. The in-process server, the
//! bound on awaits, the SSE reader and the `/metrics` parser are the crate's test kit
//! (`mock_server::test_kit`), re-exported here.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::config::ServerConfig;
use mock_server::fleet::RunningFleet;
use mock_server::output_length::OutputLengthDist;
pub(crate) use mock_server::test_kit::{
    parse_exposition, read_sse, read_sse_until_cut, within, TestServer,
};
use serde_json::{json, Value};
use servesim::cluster::ClusterConfig;
use servesim::perf::Fixed;
use tokio::time::Instant;
use tower::ServiceExt;

pub(crate) const BLOCK_SIZE: usize = 16;

/// A running fleet's admin URL.
pub(crate) fn fleet_admin(fleet: &RunningFleet) -> Result<String> {
    fleet
        .manifest
        .admin_url
        .clone()
        .context("an admin listener")
}

/// A running fleet's worker URLs, in worker order.
pub(crate) fn fleet_worker_urls(fleet: &RunningFleet) -> Vec<String> {
    fleet
        .manifest
        .workers
        .iter()
        .map(|w| w.url.clone())
        .collect()
}

/// One worker, 16-token blocks, fixed pass times (None = no delay); every answer runs to its
/// output limit (`--output-length-dist fixed`), so token counts are exact.
pub(crate) fn config(fixed_ms: Option<(f64, f64)>) -> ServerConfig {
    let mut cluster = ClusterConfig::default();
    cluster.engine.block_size = BLOCK_SIZE;
    match fixed_ms {
        Some((prefill_ms, decode_ms)) => {
            cluster.engine.latency.model = Arc::new(Fixed {
                prefill_ms,
                decode_ms,
            });
        }
        None => cluster.engine.latency.speedup_ratio = f64::INFINITY,
    }
    ServerConfig {
        output_length: OutputLengthDist::LIMIT,
        ..ServerConfig::new(cluster)
    }
}

pub(crate) fn chat_body(messages: &Value, extra: Value) -> Value {
    let mut body = json!({"model": "mock-model", "messages": messages});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

pub(crate) fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

pub(crate) async fn oneshot_raw(
    state: &AppState,
    request: Request<Body>,
) -> Result<(StatusCode, Value)> {
    let response = within(app(state.clone()).oneshot(request)).await??;
    let status = response.status();
    let bytes = within(response.into_body().collect()).await??.to_bytes();
    let value = serde_json::from_slice(&bytes)
        .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&bytes)))?;
    Ok((status, value))
}

pub(crate) async fn post(
    state: &AppState,
    path: &str,
    body: &Value,
) -> Result<(StatusCode, Value)> {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))?;
    oneshot_raw(state, request).await
}

/// Asserts an OpenAI error body and returns its `error` object.
pub(crate) fn error_of(status: StatusCode, body: &Value, want: StatusCode) -> Result<&Value> {
    assert_eq!(status, want, "body: {body}");
    let error = &body["error"];
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "missing {key} in {body}");
    }
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    Ok(error)
}

/// A streamed chat turn, checked against the wire checklist.
pub(crate) struct Streamed {
    pub(crate) content: String,
    pub(crate) reasoning: String,
    pub(crate) usage: Value,
    /// The response `nvext` on the finish chunk (null when not asked for).
    pub(crate) nvext: Value,
    /// Arrival of each chunk with text.
    pub(crate) token_times: Vec<Duration>,
}

pub(crate) async fn stream_chat(server: &TestServer, body: &Value) -> Result<Streamed> {
    let t0 = Instant::now();
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(body)
            .send(),
    )
    .await??;
    let events = read_sse(response, t0).await?;
    let (last, _) = events.last().context("no events")?;
    assert_eq!(last, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(d, _)| serde_json::from_str(d))
        .collect::<Result<_, _>>()?;
    let first = &chunks[0];
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["choices"][0]["delta"]["content"], "");
    assert!(first["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("chatcmpl-")));
    for c in &chunks {
        assert!(c.get("error").is_none(), "{c}");
        assert_eq!(c["object"], "chat.completion.chunk");
        for key in ["id", "created", "model", "system_fingerprint"] {
            assert_eq!(c[key], first[key], "{key} differs: {c}");
        }
    }
    let usage_chunk = chunks.last().filter(|c| c["choices"] == json!([]));
    let with_choices = &chunks[..chunks.len() - usize::from(usage_chunk.is_some())];
    let (finish, body_chunks) = with_choices.split_last().context("no finish chunk")?;
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let mut streamed = Streamed {
        content: String::new(),
        reasoning: String::new(),
        usage: usage_chunk
            .map(|c| c["usage"].clone())
            .unwrap_or(Value::Null),
        nvext: finish.get("nvext").cloned().unwrap_or(Value::Null),
        token_times: Vec::new(),
    };
    for (i, c) in body_chunks.iter().enumerate() {
        assert!(c["choices"][0]["finish_reason"].is_null(), "{c}");
        if i == 0 {
            continue;
        }
        let delta = &c["choices"][0]["delta"];
        streamed
            .content
            .push_str(delta["content"].as_str().unwrap_or_default());
        streamed
            .reasoning
            .push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        streamed.token_times.push(events[i].1);
    }
    Ok(streamed)
}

pub(crate) fn long_question() -> String {
    (0..40)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Posts a JSON body over the socket and returns status, headers and the parsed body.
pub(crate) async fn post_json(
    server: &TestServer,
    body: String,
) -> Result<(StatusCode, reqwest::header::HeaderMap, Value)> {
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .header("content-type", "application/json")
            .body(body)
            .send(),
    )
    .await??;
    let status = StatusCode::from_u16(response.status().as_u16())?;
    let headers = response.headers().clone();
    let body = within(response.json::<Value>()).await??;
    Ok((status, headers, body))
}

/// Polls worker 0's scheduler counters until `ok` holds (30 s at most).
pub(crate) async fn wait_for(
    server: &TestServer,
    ok: impl Fn(&servesim::scheduler::SchedulerStats) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = within(server.state.engine.snapshot()).await??;
        if ok(&live.cluster.workers[0].scheduler) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("condition never held: {live:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
