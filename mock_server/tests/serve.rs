//! `mockserve serve`: error bodies through `app().oneshot`, streaming and caching over a real
//! `127.0.0.1:0` socket with reqwest.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use clap::Parser;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::config::{ReasoningFormat, ServerConfig};
use mock_server::server::{serve_state, ServeArgs};
use mock_server::text::{default_codec, ChatMessage};
use mock_server::Cli;
use serde_json::{json, Value};
use servesim::cluster::ClusterConfig;
use servesim::perf::Fixed;
use tokio::time::{timeout, Instant};
use tower::ServiceExt;

const BLOCK_SIZE: usize = 16;

async fn within<T>(f: impl Future<Output = T>) -> Result<T> {
    timeout(Duration::from_secs(10), f)
        .await
        .context("timed out")
}

/// One worker, 16-token blocks, fixed pass times (None = no delay).
fn config(fixed_ms: Option<(f64, f64)>) -> ServerConfig {
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
    ServerConfig::new(cluster)
}

fn chat_body(messages: &Value, extra: Value) -> Value {
    let mut body = json!({"model": "mock-model", "messages": messages});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

async fn oneshot_raw(state: &AppState, request: Request<Body>) -> Result<(StatusCode, Value)> {
    let response = within(app(state.clone()).oneshot(request)).await??;
    let status = response.status();
    let bytes = within(response.into_body().collect()).await??.to_bytes();
    let value = serde_json::from_slice(&bytes)
        .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&bytes)))?;
    Ok((status, value))
}

async fn post(state: &AppState, path: &str, body: &Value) -> Result<(StatusCode, Value)> {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))?;
    oneshot_raw(state, request).await
}

/// Asserts an OpenAI error body and returns its `error` object.
fn error_of(status: StatusCode, body: &Value, want: StatusCode) -> Result<&Value> {
    assert_eq!(status, want, "body: {body}");
    let error = &body["error"];
    for key in ["message", "type", "param", "code"] {
        assert!(error.get(key).is_some(), "missing {key} in {body}");
    }
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    Ok(error)
}

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
            chat_body(&msgs, json!({"n": 2})),
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

/// A server on 127.0.0.1:0; dropping it shuts the server down.
struct TestServer {
    base: String,
    state: AppState,
    client: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn start(config: ServerConfig) -> Result<TestServer> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let state = AppState::new(config)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_state(listener, state.clone(), async {
        let _ = stopped.await;
    }));
    Ok(TestServer {
        base: format!("http://{addr}"),
        state,
        client: reqwest::Client::new(),
        _stop: stop,
    })
}

/// SSE `data:` payloads with the time each arrived (since `t0`).
async fn read_sse(response: reqwest::Response, t0: Instant) -> Result<Vec<(String, Duration)>> {
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = within(stream.next()).await? {
        buffer.push_str(std::str::from_utf8(&chunk?)?);
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event
                .trim_end()
                .strip_prefix("data: ")
                .context("event without data")?;
            events.push((data.to_string(), t0.elapsed()));
        }
    }
    if !buffer.is_empty() {
        bail!("trailing bytes {buffer:?}");
    }
    Ok(events)
}

/// A streamed chat turn, checked against the wire checklist.
struct Streamed {
    content: String,
    reasoning: String,
    usage: Value,
    /// Arrival of each chunk with text.
    token_times: Vec<Duration>,
}

async fn stream_chat(server: &TestServer, body: &Value) -> Result<Streamed> {
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

#[tokio::test]
async fn streams_per_the_wire_checklist() -> Result<()> {
    let server = start(config(None)).await?;
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

    let m = scrape(&server).await?;
    assert_eq!(
        m.get("vllm:request_success_total{worker=\"0\"}"),
        Some(&4.0)
    );
    assert_eq!(m.get("vllm:num_requests_running{worker=\"0\"}"), Some(&0.0));
    Ok(())
}

fn long_question() -> String {
    (0..40)
        .map(|i| format!("word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn next_turn_hits_the_prefix_cache() -> Result<()> {
    let server = start(config(None)).await?;
    let stream =
        json!({"stream": true, "max_tokens": 20, "stream_options": {"include_usage": true}});
    let turn1_msgs = json!([user(&long_question())]);
    let turn1 = stream_chat(&server, &chat_body(&turn1_msgs, stream.clone())).await?;
    let turn2_msgs = json!([
        user(&long_question()),
        {"role": "assistant", "content": turn1.content},
        user("and then?"),
    ]);
    let turn2 = stream_chat(&server, &chat_body(&turn2_msgs, stream)).await?;
    let cached = turn2.usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .context("cached")?;
    let turn1_len = turn1.usage["total_tokens"].as_u64().context("total")?;
    // Everything of turn 1 in full blocks, prompt and answer, is reused.
    let block = BLOCK_SIZE as u64;
    assert!(
        cached >= (turn1_len - 1) / block * block,
        "{cached} of {turn1_len}"
    );
    Ok(())
}

#[tokio::test]
async fn speculative_prefill_warms_the_whole_conversation() -> Result<()> {
    // Half of each answer is reasoning, which the template drops from history: without
    // speculative prefill the next turn reuses only turn 1's prompt.
    let mut cfg = config(None);
    cfg.reasoning_ratio = 0.5;
    cfg.reasoning_format = ReasoningFormat::Separate;
    let server = start(cfg).await?;
    let block = BLOCK_SIZE as u64;
    for (question, spec) in [("first", false), ("second", true)] {
        let q = format!("{question} {}", long_question());
        let extra = json!({"stream": true, "max_tokens": 40,
            "stream_options": {"include_usage": true},
            "nvext": {"agent_hints": {"speculative_prefill": spec}}});
        let turn1 = stream_chat(&server, &chat_body(&json!([user(&q)]), extra.clone())).await?;
        assert_eq!(default_codec().encode(&turn1.reasoning).len(), 20);
        let history = [
            ChatMessage::user(q.clone()),
            ChatMessage::assistant(turn1.content.clone()),
        ];
        let conversation = default_codec().render_chat(&history, false).len() as u64;
        let turn2_msgs = json!([user(&q), {"role": "assistant", "content": turn1.content},
                                user("go on")]);
        let turn2 = stream_chat(&server, &chat_body(&turn2_msgs, extra)).await?;
        let cached = turn2.usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .context("cached")?;
        let whole = conversation / block * block;
        if spec {
            assert!(cached >= whole, "{cached} < {whole}");
        } else {
            assert!(
                cached < whole,
                "{cached} >= {whole} without speculative prefill"
            );
        }
    }
    // Turn 1 and turn 2 of the second conversation both asked for it.
    let m = scrape(&server).await?;
    assert_eq!(
        m.get("servesim_speculative_prefill_submitted_total"),
        Some(&2.0)
    );
    Ok(())
}

#[tokio::test]
async fn fixed_latency_sets_ttft_and_token_gaps() -> Result<()> {
    let server = start(config(Some((20.0, 5.0)))).await?;
    let body = chat_body(
        &json!([user("timing")]),
        json!({"stream": true, "max_tokens": 10}),
    );
    let turn = stream_chat(&server, &body).await?;
    let times = &turn.token_times;
    assert_eq!(times.len(), 10);
    assert!(times[0] >= Duration::from_millis(20), "ttft {:?}", times[0]);
    assert!(times[0] < Duration::from_millis(500), "ttft {:?}", times[0]);
    let span = times[9] - times[0];
    // Nine gaps of 5 ms, with generous slack for a loaded CI machine.
    assert!(span >= Duration::from_millis(36), "span {span:?}");
    assert!(span < Duration::from_millis(900), "span {span:?}");
    Ok(())
}

#[tokio::test]
async fn dropping_the_stream_frees_the_request() -> Result<()> {
    let server = start(config(Some((1.0, 2.0)))).await?;
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
    let deadline = Instant::now() + Duration::from_secs(5);
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

#[test]
fn bare_mockserve_means_serve() -> Result<()> {
    let cli = Cli::try_parse_from(["mockserve", "--port", "0", "--speedup-ratio", "inf"])?;
    assert!(cli.command.is_none());
    assert_eq!(cli.serve.port, 0);
    let config = ServerConfig::from_args(&cli.serve)?;
    // An infinite speed-up makes every pass take no time.
    let latency = config.live_cluster().engine.latency;
    let batch = servesim::perf::DecodeBatch {
        num_requests: 4,
        active_kv_tokens: 1000,
        total_kv_tokens: 1 << 20,
    };
    assert_eq!(latency.decode(&batch), servesim::time::SimDuration::ZERO);
    assert_eq!(config.cluster.engine.max_model_len, Some(131072));

    let cli = Cli::try_parse_from([
        "mockserve",
        "serve",
        "--reasoning-ratio",
        "0.25",
        "--reasoning-format",
        "inline",
        "--fixed-latency",
        "20,5",
    ])?;
    let Some(mock_server::Command::Serve(args)) = cli.command else {
        bail!("expected serve");
    };
    let args: ServeArgs = args;
    assert_eq!(ServerConfig::from_args(&args)?.reasoning_ratio, 0.25);
    assert!(Cli::try_parse_from(["mockserve", "--reasoning-ratio", "2"])
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(ServerConfig::from_args(&c.serve)?))
        .is_err());
    assert!(Cli::try_parse_from(["mockserve", "replay", "trace.jsonl"])?
        .command
        .is_some());
    Ok(())
}

#[tokio::test]
async fn engine_rejection_is_a_400_streamed_or_not() -> Result<()> {
    let mut cfg = config(None);
    cfg.cluster.engine.num_gpu_blocks = 2;
    let server = start(cfg).await?;
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

/// The real binary prints its address and serves.
#[tokio::test]
async fn binary_smoke_test() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args([
            "--port",
            "0",
            "--speedup-ratio",
            "inf",
            "--num-workers",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    within(tokio::io::BufReader::new(stdout).read_line(&mut line)).await??;
    let url = line
        .trim()
        .strip_prefix("mockserve listening on ")
        .context("no address line")?
        .to_string();
    let response = within(reqwest::get(format!("{url}/health"))).await??;
    assert_eq!(response.status(), 200);
    child.kill().await?;
    Ok(())
}

/// `mockserve replay … | head`: the reader is gone before the report is printed. The command
/// ends quietly (no panic, exit 0) and still writes its report file.
#[tokio::test]
async fn replay_to_a_closed_pipe_exits_quietly() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("mockserve-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let report = dir.join("report.json");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/trace_small.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(["replay", trace, "--quiet", "--report-json"])
        .arg(&report)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    // Close the read end at once: the replay has not printed anything yet.
    drop(child.stdout.take());
    let output = timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("replay timed out")??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert!(
        written["completed_requests"].as_u64() > Some(0),
        "{written}"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `mockserve serve` with nobody reading stdout: the listening line is dropped and the server
/// serves anyway.
#[tokio::test]
async fn serve_with_a_closed_stdout_keeps_serving() -> Result<()> {
    // A port free a moment ago: the address is not printed where anyone can read it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(["--port", &port.to_string(), "--speedup-ratio", "inf"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    drop(child.stdout.take());
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let output = child.wait_with_output().await?;
            bail!(
                "mockserve exited ({status}): {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let health = client
            .get(format!("http://127.0.0.1:{port}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if health.is_ok_and(|r| r.status() == 200) {
            break;
        }
        if Instant::now() > deadline {
            bail!("mockserve never answered on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().await?;
    Ok(())
}

/// Posts a JSON body over the socket and returns status, headers and the parsed body.
async fn post_json(
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

/// Polls worker 0's scheduler counters until `ok` holds (5 s at most).
async fn wait_for(
    server: &TestServer,
    ok: impl Fn(&servesim::scheduler::SchedulerStats) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
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

#[tokio::test]
async fn overload_and_oversize_errors_leave_other_requests_alone() -> Result<()> {
    let mut cfg = config(Some((5.0, 5.0)));
    cfg.cluster.engine.max_num_seqs = 1;
    cfg.max_waiting = Some(1);
    cfg.max_body_bytes = 4096;
    let server = Arc::new(start(cfg).await?);
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

/// Scrapes `/metrics`, checks every line is valid exposition text and returns the samples by
/// `name{labels}`.
async fn scrape(server: &TestServer) -> Result<std::collections::BTreeMap<String, f64>> {
    let response = within(server.client.get(format!("{}/metrics", server.base)).send()).await??;
    assert_eq!(response.status(), 200);
    let text = within(response.text()).await??;
    parse_exposition(&text)
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_exposition(text: &str) -> Result<std::collections::BTreeMap<String, f64>> {
    let mut samples = std::collections::BTreeMap::new();
    let mut typed = std::collections::BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "{text}");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            assert!(valid_name(name), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            assert!(valid_name(name), "{line}");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            typed.insert(name.to_string(), kind.to_string());
        } else {
            let (series, value) = line.rsplit_once(' ').context("no value")?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("bad value in {line}"))?;
            let name = series.split('{').next().unwrap_or_default();
            assert!(valid_name(name), "{line}");
            if let Some(labels) = series.strip_prefix(name) {
                if !labels.is_empty() {
                    let inner = labels
                        .strip_prefix('{')
                        .and_then(|l| l.strip_suffix('}'))
                        .context("bad labels")?;
                    for pair in inner.split(',') {
                        let (k, v) = pair.split_once('=').context("bad label")?;
                        assert!(valid_name(k) && !k.contains(':'), "{line}");
                        assert!(v.starts_with('"') && v.ends_with('"'), "{line}");
                    }
                }
            }
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains_key(*f)))
                .unwrap_or(name);
            assert!(typed.contains_key(family), "sample before its TYPE: {line}");
            samples.insert(series.to_string(), value);
        }
    }
    Ok(samples)
}

#[tokio::test]
async fn metrics_parse_and_move() -> Result<()> {
    let mut cfg = config(Some((2.0, 1.0)));
    cfg.cluster.num_workers = 2;
    let server = start(cfg).await?;
    let before = scrape(&server).await?;
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
            let key = format!("{name}{{worker=\"{w}\"}}");
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
    let after = scrape(&server).await?;
    let at = |name: &str, w: u32| {
        after
            .get(&format!("{name}{{worker=\"{w}\"}}"))
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
    // Two 2 ms prefills, at most a pass late each.
    let ttft_sum = at("vllm:time_to_first_token_seconds_sum", 1);
    assert!((0.004..0.5).contains(&ttft_sum), "{ttft_sum}");
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
            .get("vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",worker=\"1\"}")
            .or_else(
                || after.get("vllm:time_to_first_token_seconds_bucket{worker=\"1\",le=\"+Inf\"}")
            ),
        Some(&2.0)
    );
    Ok(())
}

#[tokio::test]
async fn nvext_is_strict_and_pins_workers() -> Result<()> {
    let mut cfg = config(Some((20.0, 5.0)));
    cfg.cluster.num_workers = 3;
    let server = start(cfg).await?;
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
    let scraped = scrape(&server).await?;
    let sum = |name: &str| {
        scraped
            .get(&format!("{name}{{worker=\"2\"}}"))
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

#[tokio::test]
async fn same_seed_same_answers() -> Result<()> {
    let mut answers = Vec::new();
    for _ in 0..2 {
        let cli = Cli::try_parse_from(["mockserve", "--seed", "42", "--speedup-ratio", "inf"])?;
        let server = start(ServerConfig::from_args(&cli.serve)?).await?;
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
    let cli = Cli::try_parse_from(["mockserve", "--seed", "43", "--speedup-ratio", "inf"])?;
    let server = start(ServerConfig::from_args(&cli.serve)?).await?;
    let stream = json!({"stream": true, "max_tokens": 16});
    let other = stream_chat(&server, &chat_body(&json!([user("same")]), stream)).await?;
    assert_ne!(other.content, answers[0].0);
    Ok(())
}

/// Speculative prefill makes turn 2 faster by exactly what the latency model charges for the
/// prompt tokens it no longer computes.
#[tokio::test]
async fn speculative_prefill_cuts_ttft_as_the_model_predicts() -> Result<()> {
    use servesim::perf::{LatencyModel, Polynomial, PrefillBatch};
    // 4 ms per new prompt token (+5 ms per pass), 1 ms per decode step: big, clean differences.
    let model = Polynomial {
        prefill: [0.0, 4.0, 5.0],
        decode: [0.0, 0.0, 1.0],
    };
    let mut cfg = config(None);
    cfg.cluster.engine.latency.model = Arc::new(model);
    cfg.cluster.engine.latency.speedup_ratio = 1.0;
    cfg.reasoning_ratio = 0.5;
    let server = start(cfg).await?;
    let idle = || async {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let live = within(server.state.engine.snapshot()).await??;
            if live.cluster.active_requests == 0 {
                return Ok::<(), anyhow::Error>(());
            }
            if Instant::now() > deadline {
                bail!("engine never idle: {live:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let mut diffs = Vec::new();
    let mut predicted = Vec::new();
    for round in 0..3 {
        // (prompt tokens, cached tokens, observed TTFT) of turn 2 without and with the hint.
        let mut turn2 = Vec::new();
        for spec in [false, true] {
            let q = format!("round{round} spec{spec} {}", long_question());
            let extra = json!({"stream": true, "max_tokens": 40,
                "stream_options": {"include_usage": true},
                "nvext": {"agent_hints": {"speculative_prefill": spec}}});
            let turn1 = stream_chat(&server, &chat_body(&json!([user(&q)]), extra.clone())).await?;
            idle().await?;
            let msgs = json!([user(&q), {"role": "assistant", "content": turn1.content},
                              user("go on")]);
            let extra = json!({"stream": true, "max_tokens": 2,
                "stream_options": {"include_usage": true}});
            let t = stream_chat(&server, &chat_body(&msgs, extra)).await?;
            idle().await?;
            let prompt = t.usage["prompt_tokens"].as_u64().context("prompt")? as usize;
            let cached = t.usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .context("cached")? as usize;
            turn2.push((prompt, cached, t.token_times[0]));
        }
        let (without, with) = (turn2[0], turn2[1]);
        assert!(with.1 > without.1, "cached {} <= {}", with.1, without.1);
        let ms = |(prompt, cached, _): (usize, usize, Duration)| {
            model.prefill_ms(&PrefillBatch {
                num_requests: 1,
                total_isl: prompt,
                total_prefix: cached,
            })
        };
        predicted.push(ms(without) - ms(with));
        diffs.push((without.2.as_secs_f64() - with.2.as_secs_f64()) * 1e3);
    }
    let mut residuals: Vec<f64> = diffs.iter().zip(&predicted).map(|(d, p)| d - p).collect();
    residuals.sort_by(f64::total_cmp);
    let expected = predicted.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        expected >= 40.0,
        "predicted saving {expected} ms is too small to test"
    );
    // Both sides are measured the same way, so HTTP and timer overheads cancel; the median of
    // three rounds keeps one slow scheduling on a busy machine from deciding.
    let residual = residuals[1];
    let tolerance = 15.0 + 0.1 * expected;
    eprintln!("TTFT saved {diffs:?} ms, predicted {predicted:?} ms");
    assert!(
        residual.abs() <= tolerance,
        "TTFT saved {diffs:?} ms, the model predicts {predicted:?} ms"
    );
    Ok(())
}
