//! Anthropic's Messages API (`/v1/messages`): the whole answer's fields, the exact streamed event
//! sequence, token accounting equal to chat's for the same conversation, tool use and its
//! follow-up, stop sequences, and errors in Anthropic's shape from every layer.

use anyhow::{bail, Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures_util::StreamExt;
use mock_server::api::fault::FAULT_HEADER;
use mock_server::api::AppState;
use serde_json::{json, Value};

use crate::common::*;

fn messages_body(messages: Value, extra: Value) -> Value {
    let mut body = json!({"model": "mock-model", "max_tokens": 6, "messages": messages});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Asserts an Anthropic error body with `status` and `kind`, and returns its message.
fn anthropic_error(status: StatusCode, body: &Value, want: u16, kind: &str) -> String {
    assert_eq!(status.as_u16(), want, "{body}");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body.get("object").is_none() && body["error"].get("code").is_none());
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{body}");
    message.to_string()
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}})
}

/// A streamed message's events: `(event name, data)`, checking each data's `type` is its name.
async fn stream_messages(server: &TestServer, body: &Value) -> Result<Vec<(String, Value)>> {
    let response = within(
        server
            .client
            .post(format!("{}/v1/messages", server.base))
            .json(body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    assert!(response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")));
    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = within(stream.next()).await? {
        buffer.push_str(std::str::from_utf8(&chunk?)?);
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let (name, data) = event
                .trim_end()
                .split_once('\n')
                .context("an event line and a data line")?;
            let name = name.strip_prefix("event: ").context("event line")?;
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").context("data")?)?;
            assert_eq!(data["type"], name, "{data}");
            events.push((name.to_string(), data));
        }
    }
    if !buffer.is_empty() {
        bail!("trailing bytes {buffer:?}");
    }
    Ok(events)
}

#[tokio::test]
async fn a_whole_message_has_anthropic_fields_and_chat_token_counts() -> Result<()> {
    let state = AppState::new(config(None))?;
    let conversation = json!([
        {"role": "user", "content": "What is the capital of France? Answer at length."},
        {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
        {"role": "user", "content": [{"type": "text", "text": "And of"},
                                     {"type": "text", "text": "Italy?"}]},
    ]);
    let body = messages_body(
        conversation,
        json!({"system": "Be brief.", "temperature": 0.5,
        "top_p": 0.9, "top_k": 5, "metadata": {"user_id": "u1"}}),
    );
    let (s, b) = post(&state, "/v1/messages", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(
        b["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
        "{b}"
    );
    assert_eq!(b["type"], "message");
    assert_eq!(b["role"], "assistant");
    assert_eq!(b["model"], "mock-model");
    assert_eq!(b["content"].as_array().map(Vec::len), Some(1), "{b}");
    assert_eq!(b["content"][0]["type"], "text");
    assert!(b["content"][0]["text"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert_eq!(b["stop_reason"], "max_tokens");
    assert_eq!(b["stop_sequence"], Value::Null);
    assert_eq!(b["usage"]["output_tokens"], 6);
    assert_eq!(b["usage"]["cache_creation_input_tokens"], 0);

    // The same conversation over chat counts the same prompt tokens.
    let chat = chat_body(
        &json!([
            {"role": "system", "content": "Be brief."},
            user("What is the capital of France? Answer at length."),
            {"role": "assistant", "content": "Paris."},
            user("And of\nItaly?"),
        ]),
        json!({"max_tokens": 6}),
    );
    let (s, c) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(s, StatusCode::OK, "{c}");
    let prompt = c["usage"]["prompt_tokens"].as_u64().context("prompt")?;
    assert_eq!(b["usage"]["input_tokens"], prompt);

    // A repeat reads its prefix from the cache, as chat's repeat does.
    let (_, again) = post(&state, "/v1/messages", &body).await?;
    let cached = again["usage"]["cache_read_input_tokens"]
        .as_u64()
        .context("cache_read_input_tokens")?;
    assert!(cached >= (prompt - 1) / BLOCK_SIZE as u64 * BLOCK_SIZE as u64 && cached > 0);
    let (_, c2) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(
        c2["usage"]["prompt_tokens_details"]["cached_tokens"],
        cached
    );
    assert_eq!(again["usage"]["input_tokens"], prompt);

    // count_tokens gives the same count without running the engine.
    let mut count = body.clone();
    count.as_object_mut().map(|b| b.remove("max_tokens"));
    let (s, n) = post(&state, "/v1/messages/count_tokens", &count).await?;
    assert_eq!(s, StatusCode::OK, "{n}");
    assert_eq!(n, json!({"input_tokens": prompt}));
    Ok(())
}

#[tokio::test]
async fn the_stream_sends_anthropic_events_in_order() -> Result<()> {
    let server = TestServer::start(config(Some((1.0, 1.0)))).await?;
    let body = messages_body(json!([user("Tell me a story.")]), json!({"stream": true}));
    let events = stream_messages(&server, &body).await?;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let mut want = vec!["message_start", "content_block_start", "ping"];
    // One delta per output token: every token of a plain answer shows text.
    want.extend(std::iter::repeat_n("content_block_delta", 6));
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want);
    let deltas = 6;

    let start = &events[0].1["message"];
    assert!(start["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["stop_reason"], Value::Null);
    assert_eq!(start["usage"]["output_tokens"], 0);
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events[3..3 + deltas]
        .iter()
        .map(|(_, d)| {
            assert_eq!(d["index"], 0);
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().unwrap_or_default().to_string()
        })
        .collect();
    assert!(!text.is_empty());
    let delta = &events[names.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["delta"]["stop_sequence"], Value::Null);
    assert_eq!(delta["usage"]["output_tokens"], 6);
    assert_eq!(
        delta["usage"]["input_tokens"],
        start["usage"]["input_tokens"]
    );
    let samples = server.scrape().await?;
    let counted = |endpoint: &str| {
        samples
            .get(&format!(
                "servesim_http_requests_total{{endpoint=\"{endpoint}\"}}"
            ))
            .copied()
    };
    assert_eq!(counted("messages"), Some(1.0));
    assert_eq!(counted("chat"), Some(0.0));
    Ok(())
}

#[tokio::test]
async fn tool_use_and_its_result_follow_up() -> Result<()> {
    let state = AppState::new(config(None))?;
    let body = messages_body(
        json!([user("Weather in Oslo?")]),
        json!({"max_tokens": 200, "tools": [weather_tool()],
               "tool_choice": {"type": "tool", "name": "get_weather"}}),
    );
    let (s, b) = post(&state, "/v1/messages", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["stop_reason"], "tool_use", "{b}");
    let call = b["content"]
        .as_array()
        .and_then(|c| c.iter().find(|block| block["type"] == "tool_use"))
        .context("a tool_use block")?
        .clone();
    assert!(call["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("toolu_")));
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{call}");

    // The follow-up: the call and its result, counted as chat counts the same turns.
    let follow = messages_body(
        json!([
            user("Weather in Oslo?"),
            {"role": "assistant", "content": [call.clone()]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call["id"],
                 "content": [{"type": "text", "text": "Cold, -3 C."}]},
                {"type": "text", "text": "Thanks."},
            ]},
        ]),
        json!({"tools": [weather_tool()]}),
    );
    let (s, f) = post(&state, "/v1/messages", &follow).await?;
    assert_eq!(s, StatusCode::OK, "{f}");
    let chat = chat_body(
        &json!([
            user("Weather in Oslo?"),
            {"role": "assistant", "content": null, "tool_calls": [{"id": call["id"],
                "type": "function", "function": {"name": "get_weather",
                "arguments": call["input"].to_string()}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Cold, -3 C."},
            user("Thanks."),
        ]),
        json!({"max_tokens": 6, "tool_choice": "none", "tools": [{"type": "function",
            "function": {"name": "get_weather", "description": "The weather in a city.",
            "parameters": weather_tool()["input_schema"]}}]}),
    );
    let (s, c) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(f["usage"]["input_tokens"], c["usage"]["prompt_tokens"]);

    // Streamed, the call is a tool_use block of input_json_delta fragments.
    let server = TestServer::start(config(None)).await?;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = stream_messages(&server, &streamed).await?;
    let start = events
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .context("a block")?;
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    assert_eq!(start.1["content_block"]["input"], json!({}));
    let json_text: String = events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| {
            d["delta"]["partial_json"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let input: Value = serde_json::from_str(&json_text)?;
    assert!(input["city"].is_string(), "{input}");
    let delta = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .context("message_delta")?;
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    Ok(())
}

#[tokio::test]
async fn stop_sequences_end_the_text_and_are_named() -> Result<()> {
    let state = AppState::new(config(None))?;
    let body = messages_body(
        json!([user("Say several words.")]),
        json!({"max_tokens": 40, "stop_sequences": [" "]}),
    );
    let (s, b) = post(&state, "/v1/messages", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["stop_reason"], "stop_sequence", "{b}");
    assert_eq!(b["stop_sequence"], " ");
    let text = b["content"][0]["text"].as_str().unwrap_or_default();
    assert!(!text.contains(' '), "{text:?}");
    assert!(b["usage"]["output_tokens"].as_u64().is_some_and(|n| n < 40));
    Ok(())
}

#[tokio::test]
async fn errors_are_anthropic_shaped_from_every_layer() -> Result<()> {
    let state = AppState::new(config(None))?;
    let malformed = messages_body(
        json!([{"role": "user", "content": [{"text": "hi"}]}]),
        json!({}),
    );
    let (s, b) = post(&state, "/v1/messages", &malformed).await?;
    let message = anthropic_error(s, &b, 400, "invalid_request_error");
    assert!(
        message.starts_with("messages.0.content.0.type"),
        "{message}"
    );

    let mut missing = messages_body(json!([user("hi")]), json!({}));
    missing.as_object_mut().map(|b| b.remove("max_tokens"));
    let (s, b) = post(&state, "/v1/messages", &missing).await?;
    assert!(anthropic_error(s, &b, 400, "invalid_request_error").starts_with("max_tokens"));

    let image = messages_body(
        json!([{"role": "user", "content": [{"type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]),
        json!({}),
    );
    let (s, b) = post(&state, "/v1/messages", &image).await?;
    assert!(anthropic_error(s, &b, 400, "invalid_request_error").contains("text only"));

    // 100,001 tiny messages fit the body limit and exceed the request budget.
    let huge: Vec<Value> = (0..100_001).map(|_| user("a")).collect();
    let (s, b) = post(
        &state,
        "/v1/messages",
        &messages_body(json!(huge), json!({})),
    )
    .await?;
    let message = anthropic_error(s, &b, 400, "invalid_request_error");
    assert!(
        message.contains("100001 messages given") && message.contains("100000"),
        "{message}"
    );
    assert!(message.len() < 300);

    // The JSON extractor, an unknown model, a wrong method.
    let request = Request::post("/v1/messages")
        .header("content-type", "application/json")
        .body(Body::from("{not json"))?;
    let (s, b) = oneshot_raw(&state, request).await?;
    anthropic_error(s, &b, 400, "invalid_request_error");
    let mut unknown = messages_body(json!([user("hi")]), json!({}));
    unknown["model"] = json!("no-such-model");
    let (s, b) = post(&state, "/v1/messages", &unknown).await?;
    anthropic_error(s, &b, 404, "not_found_error");
    let get = Request::get("/v1/messages").body(Body::empty())?;
    let (s, b) = oneshot_raw(&state, get).await?;
    anthropic_error(s, &b, 405, "invalid_request_error");

    // The edge's body limit.
    let mut small = config(None);
    small.max_body_bytes = 1024;
    let small = AppState::new(small)?;
    let long = messages_body(json!([user(&"word ".repeat(400))]), json!({}));
    let (s, b) = post(&small, "/v1/messages", &long).await?;
    anthropic_error(s, &b, 413, "request_too_large");

    // The key: refused in Anthropic's shape, accepted as `x-api-key` or a bearer token.
    let mut keyed = config(None);
    keyed.api_key = Some("sekrit".into());
    let keyed = AppState::new(keyed)?;
    let ok = messages_body(json!([user("hi")]), json!({}));
    let send = |key: Option<(&'static str, &'static str)>| {
        let mut request = Request::post("/v1/messages").header("content-type", "application/json");
        if let Some((name, value)) = key {
            request = request.header(name, value);
        }
        request.body(Body::from(ok.to_string()))
    };
    let (s, b) = oneshot_raw(&keyed, send(Some(("x-api-key", "wrong")))?).await?;
    anthropic_error(s, &b, 401, "authentication_error");
    let (s, b) = oneshot_raw(&keyed, send(None)?).await?;
    anthropic_error(s, &b, 401, "authentication_error");
    let (s, b) = oneshot_raw(&keyed, send(Some(("x-api-key", "sekrit")))?).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, _) = oneshot_raw(&keyed, send(Some(("authorization", "Bearer sekrit")))?).await?;
    assert_eq!(s, StatusCode::OK);

    // Injected faults, and the chat route keeps OpenAI's shape.
    for (fault, status, kind) in [
        ("rate-limit", 429, "rate_limit_error"),
        ("unavailable", 529, "overloaded_error"),
        ("server-error", 500, "api_error"),
    ] {
        let request = Request::post("/v1/messages")
            .header("content-type", "application/json")
            .header(FAULT_HEADER, fault)
            .body(Body::from(ok.to_string()))?;
        let (s, b) = oneshot_raw(&state, request).await?;
        anthropic_error(s, &b, status, kind);
    }
    let request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header(FAULT_HEADER, "rate-limit")
        .body(Body::from(
            chat_body(&json!([user("hi")]), json!({})).to_string(),
        ))?;
    let (s, b) = oneshot_raw(&state, request).await?;
    error_of(s, &b, StatusCode::TOO_MANY_REQUESTS)?;
    Ok(())
}

#[tokio::test]
async fn an_error_mid_stream_is_an_error_event() -> Result<()> {
    let server = TestServer::start(config(Some((1.0, 1.0)))).await?;
    let body = messages_body(json!([user("hi")]), json!({"stream": true}));
    let response = within(
        server
            .client
            .post(format!("{}/v1/messages", server.base))
            .header(FAULT_HEADER, "stream-error")
            .json(&body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let text = within(response.text()).await??;
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let (name, data) = last.split_once('\n').context("event")?;
    assert_eq!(name, "event: error", "{text}");
    let data: Value = serde_json::from_str(data.strip_prefix("data: ").context("data")?)?;
    assert_eq!(data["type"], "error");
    assert_eq!(data["error"]["type"], "api_error");
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(
        !text.contains("[DONE]") && !text.contains("message_stop"),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn reasoning_is_a_signed_thinking_block_before_the_text() -> Result<()> {
    let mut cfg = config(None);
    cfg.reasoning_ratio = 0.5;
    cfg.reasoning_format = mock_server::config::ReasoningFormat::Separate;
    let server = TestServer::start(cfg).await?;
    let body = messages_body(json!([user("Think first.")]), json!({"max_tokens": 8}));
    let (s, b) = post(&server.state, "/v1/messages", &body).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["content"][0]["type"], "thinking", "{b}");
    assert!(b["content"][0]["thinking"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));
    assert!(b["content"][0]["signature"]
        .as_str()
        .is_some_and(|t| t.starts_with("sig_")));
    assert_eq!(b["content"][1]["type"], "text");
    assert_eq!(b["content"].as_array().map(Vec::len), Some(2));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events = stream_messages(&server, &streamed).await?;
    let names: Vec<String> = events
        .iter()
        .map(|(n, d)| match d["delta"]["type"].as_str() {
            Some(delta) => format!("{n}:{delta}"),
            None => n.clone(),
        })
        .collect();
    let mut want = vec!["message_start", "content_block_start", "ping"];
    want.extend(["content_block_delta:thinking_delta"; 4]);
    want.extend([
        "content_block_delta:signature_delta",
        "content_block_stop",
        "content_block_start",
    ]);
    want.extend(["content_block_delta:text_delta"; 4]);
    want.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, want);
    assert_eq!(events[1].1["content_block"]["type"], "thinking");
    assert_eq!(events[9].1["index"], 1);
    assert_eq!(events[9].1["content_block"]["type"], "text");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_worker_serves_messages_and_its_faults_in_anthropic_shape() -> Result<()> {
    let flags = [
        "--workers",
        "2",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--block-size",
        "16",
        "--fixed-latency",
        "1,1",
    ];
    let fleet = within(mock_server::fleet::launch(crate::fleet::fleet_config(
        &flags,
    )?))
    .await??;
    let admin = fleet_admin(&fleet)?;
    let urls = fleet_worker_urls(&fleet);
    let client = reqwest::Client::new();
    let body = messages_body(json!([user("hi")]), json!({}));
    let send = |url: String| {
        let request = client.post(format!("{url}/v1/messages")).json(&body).send();
        async move {
            let response = within(request).await??;
            let status = StatusCode::from_u16(response.status().as_u16())?;
            anyhow::Ok((status, within(response.json::<Value>()).await??))
        }
    };
    let (s, b) = send(urls[1].clone()).await?;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["type"], "message");
    let set = client
        .post(format!("{admin}/fleet/workers/1/fault"))
        .json(&json!({"state": "503"}))
        .send();
    assert_eq!(within(set).await??.status(), 200);
    let (s, b) = send(urls[1].clone()).await?;
    anthropic_error(s, &b, 529, "overloaded_error");
    assert_eq!(send(urls[0].clone()).await?.0, StatusCode::OK);
    Ok(())
}
