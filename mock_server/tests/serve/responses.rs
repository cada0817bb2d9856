//! `/v1/responses`: the whole response and the streamed events in their exact order, the same
//! token accounting as chat, function calls, `previous_response_id` chains with cached
//! prefixes, stored responses read and deleted, and bad input answered as OpenAI does.

use anyhow::{Context, Result};
use axum::http::StatusCode;
use futures_util::StreamExt;
use mock_server::api::responses::wire::MAX_INPUT_ITEMS;
use mock_server::api::responses::MAX_CONVERSATION_BYTES;
use mock_server::config::ServerConfig;
use mock_server::text::{default_codec, ChatMessage};
use serde_json::{json, Value};

use crate::common::{chat_body, config, error_of, long_question, post, user, within, TestServer};

fn reasoning_config() -> ServerConfig {
    ServerConfig {
        reasoning_ratio: 0.5,
        ..config(None)
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}})
}

/// Posts a Responses body over the socket: status and parsed body.
async fn create(server: &TestServer, body: &Value) -> Result<(StatusCode, Value)> {
    let response = within(
        server
            .client
            .post(format!("{}/v1/responses", server.base))
            .json(body)
            .send(),
    )
    .await??;
    let status = StatusCode::from_u16(response.status().as_u16())?;
    Ok((status, within(response.json::<Value>()).await??))
}

/// A streamed response's events: `(event name, data)`, each checked to carry its `type` and
/// the next `sequence_number`.
async fn stream(server: &TestServer, body: &Value) -> Result<Vec<(String, Value)>> {
    stream_with_fault(server, body, "none").await
}

/// [`stream`] with the fault `fault` forced.
async fn stream_with_fault(
    server: &TestServer,
    body: &Value,
    fault: &str,
) -> Result<Vec<(String, Value)>> {
    stream_and(server, body, fault, || {}).await
}

/// [`stream_with_fault`], calling `after_first` once the first event is in.
async fn stream_and(
    server: &TestServer,
    body: &Value,
    fault: &str,
    after_first: impl FnOnce(),
) -> Result<Vec<(String, Value)>> {
    let mut after_first = Some(after_first);
    let response = within(
        server
            .client
            .post(format!("{}/v1/responses", server.base))
            .header("x-servesim-fault", fault)
            .json(body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let mut bytes = response.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = within(bytes.next()).await? {
        buffer.push_str(std::str::from_utf8(&chunk?)?);
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let (head, data) = event.trim_end().split_once('\n').context("two lines")?;
            let name = head.strip_prefix("event: ").context("an event line")?;
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").context("data")?)?;
            assert_eq!(data["type"], json!(name), "{data}");
            assert_eq!(data["sequence_number"], json!(events.len()), "{data}");
            events.push((name.to_string(), data));
            if let Some(call) = after_first.take() {
                call();
            }
        }
    }
    assert!(buffer.is_empty(), "trailing bytes {buffer:?}");
    Ok(events)
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

#[tokio::test]
async fn a_whole_response_counts_and_answers_as_chat_does() -> Result<()> {
    let server = TestServer::start(reasoning_config()).await?;
    let (status, body) = create(
        &server,
        &json!({"model": "mock-model", "instructions": "Be brief.", "input": "Weather in Paris?",
                "max_output_tokens": 8, "seed": 7, "temperature": 0.2, "top_p": 0.9}),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    let messages = json!([{"role": "system", "content": "Be brief."}, user("Weather in Paris?")]);
    let chat = chat_body(&messages, json!({"max_tokens": 8, "seed": 7}));
    let (status, chat) = create_chat(&server, &chat).await?;
    assert_eq!(status, 200, "{chat}");
    assert!(body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("resp_")));
    assert_eq!(body["object"], "response");
    // Every answer runs to its limit here (`--output-length-dist fixed`).
    assert_eq!(body["status"], "incomplete");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(body["instructions"], "Be brief.");
    assert_eq!(body["max_output_tokens"], 8);
    assert_eq!(
        (body["temperature"].as_f64(), body["top_p"].as_f64()),
        (Some(0.2), Some(0.9))
    );
    let usage = &body["usage"];
    let chat_usage = &chat["usage"];
    assert_eq!(usage["input_tokens"], chat_usage["prompt_tokens"]);
    assert_eq!(usage["output_tokens"], chat_usage["completion_tokens"]);
    assert_eq!(usage["output_tokens"], 8);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 4);
    assert_eq!(usage["total_tokens"], chat_usage["total_tokens"]);
    assert_eq!(usage["input_tokens_details"]["cached_tokens"], 0);
    let output = body["output"].as_array().context("output")?;
    assert_eq!(output.len(), 2, "{body}");
    assert_eq!(output[0]["type"], "reasoning");
    assert_eq!(output[0]["status"], "completed");
    let message = &chat["choices"][0]["message"];
    assert_eq!(
        output[0]["content"][0]["text"],
        message["reasoning_content"]
    );
    assert_eq!(output[1]["type"], "message");
    assert_eq!(output[1]["role"], "assistant");
    assert_eq!(output[1]["status"], "incomplete");
    assert_eq!(
        output[1]["content"],
        json!([{"type": "output_text", "text": message["content"], "annotations": [],
                "logprobs": []}])
    );
    Ok(())
}

async fn create_chat(server: &TestServer, body: &Value) -> Result<(StatusCode, Value)> {
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(body)
            .send(),
    )
    .await??;
    let status = StatusCode::from_u16(response.status().as_u16())?;
    Ok((status, within(response.json::<Value>()).await??))
}

#[tokio::test]
async fn streamed_events_come_in_openai_order() -> Result<()> {
    let server = TestServer::start(reasoning_config()).await?;
    let events = stream(
        &server,
        &json!({"model": "mock-model", "input": "Hello", "max_output_tokens": 4,
                "stream": true}),
    )
    .await?;
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",
        ]
    );
    let created = &events[0].1["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    assert_eq!(created["usage"], Value::Null);
    assert_eq!(events[2].1["item"]["type"], "reasoning");
    assert_eq!(events[9].1["output_index"], 1);
    assert_eq!(
        events[10].1["part"],
        json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
    );
    let deltas: String = events[11..13]
        .iter()
        .map(|(_, d)| d["delta"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(events[13].1["text"], json!(deltas));
    let item_id = &events[9].1["item"]["id"];
    for (_, data) in &events[10..15] {
        assert_eq!(&data["item_id"], item_id);
    }
    let last = &events[16].1["response"];
    assert_eq!(last["id"], created["id"]);
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["output"][1]["content"][0]["text"], json!(deltas));
    assert_eq!(last["output"][1], events[15].1["item"]);
    assert_eq!(last["usage"]["output_tokens"], 4);
    assert_eq!(
        last["usage"]["output_tokens_details"]["reasoning_tokens"],
        2
    );
    Ok(())
}

#[tokio::test]
async fn function_calls_are_output_items_whole_and_streamed() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = json!({"model": "mock-model", "input": "Weather in Paris?",
                      "tools": [weather_tool()], "tool_choice": "required",
                      "max_output_tokens": 400});
    let (status, whole) = create(&server, &body).await?;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["status"], "completed");
    assert_eq!(whole["tools"], json!([weather_tool()]));
    let output = whole["output"].as_array().context("output")?;
    assert_eq!(output.len(), 1, "{whole}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert!(call["call_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().context("text")?)?;
    assert!(arguments["city"].is_string(), "{arguments}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["tool_choice"] = json!({"type": "function", "name": "get_weather"});
    let events = stream(&server, &streamed).await?;
    let kinds = names(&events);
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.function_call_arguments.delta")
        .count();
    assert!(deltas > 1, "{kinds:?}");
    let mut want = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
    ];
    want.extend(std::iter::repeat_n(
        "response.function_call_arguments.delta",
        deltas,
    ));
    want.extend([
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(kinds, want);
    let joined: String = events
        .iter()
        .filter(|(k, _)| k == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap_or_default())
        .collect();
    let done = &events[events.len() - 3].1;
    assert_eq!(done["arguments"], json!(joined));
    let item = &events[events.len() - 1].1["response"]["output"][0];
    assert_eq!(item["arguments"], json!(joined));
    assert_eq!(events[2].1["item"]["call_id"], item["call_id"]);
    // Counted as their own endpoint.
    let metrics = server.scrape().await?;
    let key = "servesim_http_requests_total{endpoint=\"responses\"}";
    assert_eq!(metrics.get(key), Some(&2.0));
    Ok(())
}

#[tokio::test]
async fn a_previous_response_chain_continues_with_its_prefix_cached() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let (status, first) = create(
        &server,
        &json!({"model": "mock-model", "input": long_question(), "max_output_tokens": 20,
                "tools": [weather_tool()], "tool_choice": "required"}),
    )
    .await?;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().context("id")?;
    let call_id = first["output"][0]["call_id"].clone();
    let follow = json!({"model": "mock-model", "previous_response_id": id,
                        "tools": [weather_tool()], "max_output_tokens": 5, "input": [
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"}]});
    let (status, second) = create(&server, &follow).await?;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], json!(id));
    let first_usage = &first["usage"];
    let usage = &second["usage"];
    let cached = usage["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .context("cached")?;
    // The first turn's prompt is the second's prefix: its full blocks are hits.
    let first_input = first_usage["input_tokens"].as_u64().context("input")?;
    assert!(cached >= first_input / 16 * 16 && cached > 0, "{usage}");
    assert!(
        usage["input_tokens"].as_u64()
            > Some(first_input + first_usage["output_tokens"].as_u64().context("output")?),
        "{usage}"
    );
    // Resending the whole conversation as items counts the same prompt.
    let mut resent = follow.clone();
    resent["previous_response_id"] = Value::Null;
    resent["input"] = json!([{"role": "user", "content": long_question()}, first["output"][0],
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"}]);
    let (status, third) = create(&server, &resent).await?;
    assert_eq!(status, 200, "{third}");
    assert_eq!(third["usage"]["input_tokens"], usage["input_tokens"]);
    // A stored response is read back, then deleted; its continuation is then a 404.
    let url = format!("{}/v1/responses/{id}", server.base);
    let stored: Value = within(within(server.client.get(&url).send()).await??.json()).await??;
    assert_eq!(stored, first);
    let deleted = within(server.client.delete(&url).send()).await??;
    assert_eq!(deleted.status(), 200);
    let deleted: Value = within(deleted.json()).await??;
    assert_eq!(
        deleted,
        json!({"id": id, "object": "response.deleted", "deleted": true})
    );
    let (status, body) = create(&server, &follow).await?;
    let error = error_of(status, &body, StatusCode::NOT_FOUND)?;
    assert_eq!(error["code"], "previous_response_not_found");
    // `store: false` is answered and not kept.
    let (_, unstored) = create(
        &server,
        &json!({"model": "mock-model", "input": "hi", "store": false}),
    )
    .await?;
    assert_eq!(unstored["store"], false);
    let url = format!(
        "{}/v1/responses/{}",
        server.base,
        unstored["id"].as_str().context("id")?
    );
    let missing = within(server.client.get(&url).send()).await??;
    assert_eq!(missing.status(), 404);
    Ok(())
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_param_and_unknown_ids_404() -> Result<()> {
    let state = mock_server::api::AppState::new(config(None))?;
    let long_id = "resp_".to_string() + &"x".repeat(10_000);
    let (status, body) = post(
        &state,
        "/v1/responses",
        &json!({"model": "mock-model", "input": "hi", "previous_response_id": long_id}),
    )
    .await?;
    let error = error_of(status, &body, StatusCode::NOT_FOUND)?;
    assert_eq!(error["param"], "previous_response_id");
    assert_eq!(error["code"], "previous_response_not_found");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(
        error["message"].as_str().is_some_and(|m| m.len() < 200),
        "{error}"
    );
    let many = vec![json!({"role": "user", "content": "x"}); MAX_INPUT_ITEMS + 1];
    let max_len = config(None).max_model_len;
    for (body, param, code) in [
        (
            json!({"model": "mock-model", "input": many}),
            "input",
            json!("request_too_large"),
        ),
        (
            json!({"model": "mock-model", "input": [{"role": "user", "content": [{"type": "image"}]}]}),
            "input[0].content[0]",
            Value::Null,
        ),
        (
            json!({"model": "mock-model", "input": [{"type": "function_call_output", "output": "x"}]}),
            "input[0].call_id",
            Value::Null,
        ),
        (
            json!({"model": "mock-model", "input": "hi", "max_output_tokens": max_len}),
            "input",
            json!("context_length_exceeded"),
        ),
        (
            json!({"model": "mock-model", "input": "hi", "max_output_tokens": u64::MAX}),
            "input",
            json!("context_length_exceeded"),
        ),
        (
            json!({"model": "mock-model", "input": "x".repeat(70_000)}),
            "input",
            json!("request_too_large"),
        ),
        (
            json!({"model": "mock-model", "input": "hi", "tools": [{"type": "function", "name": ""}]}),
            "tools[0].name",
            Value::Null,
        ),
    ] {
        let (status, answer) = post(&state, "/v1/responses", &body).await?;
        let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
        assert_eq!(error["param"], param, "{answer}");
        assert_eq!(error["code"], code, "{answer}");
    }
    // A conversation over its cap is refused before it is tokenized.
    let big = ServerConfig {
        max_body_bytes: 32 << 20,
        ..config(None)
    };
    let big = mock_server::api::AppState::new(big)?;
    let text = "word ".repeat((MAX_CONVERSATION_BYTES + 5) / 5);
    let (status, answer) = post(
        &big,
        "/v1/responses",
        &json!({"model": "mock-model", "input": text}),
    )
    .await?;
    let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "input");
    assert_eq!(error["code"], "request_too_large");
    let (status, body) = crate::common::oneshot_raw(
        &state,
        axum::http::Request::get("/v1/responses/resp_unknown").body(axum::body::Body::empty())?,
    )
    .await?;
    let error = error_of(status, &body, StatusCode::NOT_FOUND)?;
    assert_eq!(
        error["message"],
        "Response with id 'resp_unknown' not found."
    );
    Ok(())
}

#[tokio::test]
async fn faults_apply_to_responses_in_their_own_shape() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = json!({"model": "mock-model", "input": "Hello", "max_output_tokens": 40,
                      "stream": true});
    let events = stream_with_fault(&server, &body, "stream-error").await?;
    let (last, error) = events.last().context("events")?;
    assert_eq!(last, "error");
    assert_eq!(error["code"], "internal_error");
    let kinds = names(&events);
    assert!(!kinds.contains(&"response.completed"), "{kinds:?}");
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert!(deltas < 40, "{kinds:?}");
    let response = within(
        server
            .client
            .post(format!("{}/v1/responses", server.base))
            .header("x-servesim-fault", "rate-limit")
            .json(&json!({"model": "mock-model", "input": "Hello"}))
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 429);
    let body: Value = within(response.json()).await??;
    error_of(
        StatusCode::TOO_MANY_REQUESTS,
        &body,
        StatusCode::TOO_MANY_REQUESTS,
    )?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fleet_worker_keeps_its_own_responses() -> Result<()> {
    let config = crate::fleet::fleet_config(&[
        "--workers",
        "2",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
    ])?;
    let fleet = within(mock_server::fleet::launch(config)).await??;
    let client = reqwest::Client::new();
    let urls = crate::common::fleet_worker_urls(&fleet);
    let post = |url: String, body: Value| {
        let client = client.clone();
        async move {
            let response = within(
                client
                    .post(format!("{url}/v1/responses"))
                    .json(&body)
                    .send(),
            )
            .await??;
            let status = response.status().as_u16();
            anyhow::Ok((status, within(response.json::<Value>()).await??))
        }
    };
    let (status, first) = post(
        urls[0].clone(),
        json!({"model": "mock-model", "input": long_question(), "max_output_tokens": 8}),
    )
    .await?;
    assert_eq!(status, 200, "{first}");
    let follow = json!({"model": "mock-model", "input": "And then?",
                        "previous_response_id": first["id"], "max_output_tokens": 4});
    let (status, second) = post(urls[0].clone(), follow.clone()).await?;
    assert_eq!(status, 200, "{second}");
    assert!(second["usage"]["input_tokens_details"]["cached_tokens"].as_u64() > Some(0));
    let (status, elsewhere) = post(urls[1].clone(), follow).await?;
    assert_eq!(status, 404, "{elsewhere}");
    assert_eq!(elsewhere["error"]["code"], "previous_response_not_found");
    within(fleet.shutdown()).await?;
    Ok(())
}

#[tokio::test]
async fn an_error_after_the_first_byte_is_an_error_and_a_failed_response() -> Result<()> {
    // 50 tokens at 100 ms each: the shutdown deadline comes while they run.
    let server = TestServer::start(config(Some((100.0, 100.0)))).await?;
    let body = json!({"model": "mock-model", "input": "Hello", "max_output_tokens": 50,
                      "stream": true});
    let stop = server.state.stop_generations.clone();
    let events = stream_and(&server, &body, "none", move || stop.cancel()).await?;
    let kinds = names(&events);
    let n = kinds.len();
    assert!(n >= 4, "{kinds:?}");
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(kinds[n - 2..], ["error", "response.failed"]);
    assert!(!kinds.contains(&"response.output_text.done"), "{kinds:?}");
    let error = &events[n - 2].1;
    assert_eq!(error["code"], "service_unavailable");
    assert_eq!(error["message"], "The server is shutting down.");
    let failed = &events[n - 1].1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(
        failed["error"],
        json!({"code": "service_unavailable", "message": "The server is shutting down."})
    );
    Ok(())
}

#[tokio::test]
async fn speculative_prefill_warms_the_next_turn_as_on_chat() -> Result<()> {
    // Half of each answer is reasoning, which the history drops: without the hint the next
    // turn reuses only the first turn's prompt, with it the whole first turn.
    let server = TestServer::start(reasoning_config()).await?;
    for spec in [false, true] {
        let question = format!("{spec} {}", long_question());
        let (status, first) = create(
            &server,
            &json!({"model": "mock-model", "input": question, "max_output_tokens": 40,
                    "nvext": {"agent_hints": {"speculative_prefill": spec}}}),
        )
        .await?;
        assert_eq!(status, 200, "{first}");
        let (status, second) = create(
            &server,
            &json!({"model": "mock-model", "input": "go on", "max_output_tokens": 4,
                    "previous_response_id": first["id"]}),
        )
        .await?;
        assert_eq!(status, 200, "{second}");
        let text = first["output"][1]["content"][0]["text"]
            .as_str()
            .context("text")?;
        let history = [
            ChatMessage::user(question.clone()),
            ChatMessage::assistant(text),
        ];
        let conversation = default_codec().render_chat(&history, false).len() as u64;
        let whole = conversation / 16 * 16;
        let cached = second["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .context("cached")?;
        if spec {
            assert!(cached >= whole, "{cached} < {whole}");
        } else {
            assert!(cached < whole, "{cached} >= {whole} without the hint");
        }
    }
    let metrics = server.scrape().await?;
    assert_eq!(
        metrics.get("servesim_speculative_prefill_submitted_total"),
        Some(&1.0)
    );
    Ok(())
}
