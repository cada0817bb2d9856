//! What the answers say: sampled output lengths and `ignore_eos`, stop strings and stop token
//! ids, tool calls, log-probabilities, JSON mode, `n` choices, completions `echo` and prompt
//! batches, checked on the wire (streamed and whole) and for determinism.

use anyhow::{Context, Result};
use axum::http::StatusCode;
use mock_server::config::ServerConfig;
use mock_server::output_length::OutputLengthDist;
use mock_server::text::default_codec;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::common::*;

/// The server's defaults for answers (sampled lengths), no pass delays.
fn sampled() -> ServerConfig {
    ServerConfig {
        output_length: OutputLengthDist::default(),
        ..config(None)
    }
}

/// The chunks of a streamed request (without `[DONE]`, which is checked to come last).
async fn stream_chunks(server: &TestServer, path: &str, body: &Value) -> Result<Vec<Value>> {
    let response = within(
        server
            .client
            .post(format!("{}{path}", server.base))
            .json(body)
            .send(),
    )
    .await??;
    let events = read_sse(response, Instant::now()).await?;
    let (last, rest) = events.split_last().context("no events")?;
    assert_eq!(last.0, "[DONE]");
    let chunks: Vec<Value> = rest
        .iter()
        .map(|(d, _)| serde_json::from_str(d))
        .collect::<Result<_, _>>()?;
    for c in &chunks {
        assert!(c.get("error").is_none(), "{c}");
        assert_eq!(c["id"], chunks[0]["id"]);
        assert_eq!(c["created"], chunks[0]["created"]);
    }
    Ok(chunks)
}

async fn ok(server: &TestServer, path: &str, body: &Value) -> Result<Value> {
    let (status, value) = post(&server.state, path, body).await?;
    assert_eq!(status, StatusCode::OK, "{value}");
    Ok(value)
}

fn chat(extra: Value) -> Value {
    chat_body(&json!([user("tell me about the sea")]), extra)
}

/// The content text of a streamed chat choice, its chunk count with content and its finish
/// chunk.
fn streamed_content(chunks: &[Value], index: u64) -> (String, usize, Value) {
    let mut text = String::new();
    let mut count = 0;
    let mut finish = Value::Null;
    for c in chunks {
        for choice in c["choices"].as_array().into_iter().flatten() {
            if choice["index"] != index {
                continue;
            }
            if let Some(t) = choice["delta"]["content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                text.push_str(t);
                count += 1;
            }
            if !choice["finish_reason"].is_null() {
                assert!(finish.is_null(), "one finish chunk per choice");
                finish = choice.clone();
            }
        }
    }
    (text, count, finish)
}

#[tokio::test]
async fn lengths_are_sampled_and_ignore_eos_runs_to_the_limit() -> Result<()> {
    let server = TestServer::start(sampled()).await?;
    let codec = default_codec();
    let mut stopped = 0;
    for seed in 0..24 {
        let body = chat(json!({"max_tokens": 64, "seed": seed}));
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        let choice = &whole["choices"][0];
        let tokens = whole["usage"]["completion_tokens"]
            .as_u64()
            .context("usage")?;
        let content = choice["message"]["content"].as_str().context("content")?;
        // The engine ran exactly the tokens of the text.
        assert_eq!(codec.encode(content).len() as u64, tokens);
        match choice["finish_reason"].as_str() {
            Some("stop") => {
                stopped += 1;
                assert!(tokens < 64, "{tokens}");
            }
            Some("length") => assert_eq!(tokens, 64),
            other => panic!("finish_reason {other:?}"),
        }
        assert_eq!(choice["stop_reason"], Value::Null);

        // Streamed, the same seed gives the same text, one chunk per token.
        let streamed = stream_chunks(
            &server,
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 64, "seed": seed, "stream": true})),
        )
        .await?;
        let (text, count, finish) = streamed_content(&streamed, 0);
        assert_eq!(text, content);
        assert_eq!(count as u64, tokens);
        assert_eq!(finish["finish_reason"], choice["finish_reason"]);

        // ignore_eos: the limit, always.
        let body = chat(json!({"max_tokens": 64, "seed": seed, "ignore_eos": true}));
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        assert_eq!(whole["usage"]["completion_tokens"], 64);
        assert_eq!(whole["choices"][0]["finish_reason"], "length");

        // min_tokens: never shorter.
        let body = chat(json!({"max_tokens": 64, "seed": seed, "min_tokens": 48}));
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        let tokens = whole["usage"]["completion_tokens"]
            .as_u64()
            .context("usage")?;
        assert!((48..=64).contains(&tokens), "{tokens}");
    }
    assert!(
        stopped >= 12,
        "only {stopped} of 24 answers stopped before the limit"
    );
    Ok(())
}

#[tokio::test]
async fn stop_strings_and_ids_end_the_text_before_them() -> Result<()> {
    let server = TestServer::start(sampled()).await?;
    let codec = default_codec();
    let reference = ok(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 40, "seed": 11, "ignore_eos": true})),
    )
    .await?;
    let text = reference["choices"][0]["message"]["content"]
        .as_str()
        .context("content")?
        .to_string();
    let ids = codec.encode(&text);
    // A stop string from the middle of the answer: the text ends right before its first
    // occurrence, streamed and whole, and the stop is named.
    let word = codec.decode(&ids[20..21]);
    let cut = text.find(&word).context("the word is in the text")?;
    for stream in [false, true] {
        let body = chat(json!({"max_tokens": 40, "seed": 11, "ignore_eos": true,
                               "stop": [word.clone(), "never-generated"], "stream": stream}));
        let (content, finish) = if stream {
            let c = stream_chunks(&server, "/v1/chat/completions", &body).await?;
            let (content, _, finish) = streamed_content(&c, 0);
            (content, finish)
        } else {
            let whole = ok(&server, "/v1/chat/completions", &body).await?;
            let choice = whole["choices"][0].clone();
            let content = choice["message"]["content"]
                .as_str()
                .context("content")?
                .into();
            (content, choice)
        };
        assert_eq!(content, text[..cut], "stream: {stream}");
        assert!(!content.contains(&word));
        assert_eq!(finish["finish_reason"], "stop");
        assert_eq!(finish["stop_reason"], json!(word));
    }

    // A stop token id: the text ends before that token; the token itself ran.
    let id = ids[25];
    let first = ids.iter().position(|&t| t == id).context("present")?;
    let whole = ok(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 40, "seed": 11, "ignore_eos": true, "stop_token_ids": [id]})),
    )
    .await?;
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["content"], codec.decode(&ids[..first]));
    assert_eq!(choice["stop_reason"], json!(id));
    assert_eq!(whole["usage"]["completion_tokens"], first + 1);

    // --stop-probability 1: every answer the model ends itself ends at the stop string, whose
    // tokens the engine runs, and the text never contains it.
    let server = TestServer::start(ServerConfig {
        stop_probability: 1.0,
        ..sampled()
    })
    .await?;
    let stop = "\n\n";
    let stop_tokens = codec.encode(stop).len() as u64;
    let mut at_stop = 0;
    for seed in 0..16 {
        let whole = ok(
            &server,
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 64, "seed": seed, "stop": stop})),
        )
        .await?;
        let choice = &whole["choices"][0];
        let content = choice["message"]["content"].as_str().context("content")?;
        assert!(!content.contains(stop));
        let tokens = whole["usage"]["completion_tokens"]
            .as_u64()
            .context("usage")?;
        if choice["finish_reason"] == "stop" {
            at_stop += 1;
            assert_eq!(choice["stop_reason"], stop);
            assert_eq!(tokens, codec.encode(content).len() as u64 + stop_tokens);
        }
    }
    assert!(at_stop >= 8, "{at_stop}");
    Ok(())
}

/// `vllm:request_params_max_tokens` counts the request's `max_tokens`, also for answers that
/// stop before it; `vllm:request_generation_tokens` counts what was generated.
#[tokio::test]
async fn max_tokens_metric_counts_the_requests_limit() -> Result<()> {
    let server = TestServer::start(sampled()).await?;
    let (mut generated, mut stopped) = (0, 0);
    for seed in 0..8 {
        let body = chat(json!({"max_tokens": 64, "seed": seed}));
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        let tokens = whole["usage"]["completion_tokens"]
            .as_u64()
            .context("usage")?;
        generated += tokens;
        stopped += u64::from(tokens < 64);
    }
    assert!(stopped > 0, "no answer stopped before its limit");
    let m = server.scrape().await?;
    let engine = "model_name=\"mock-model\",engine=\"0\"";
    let sum = |name: &str| m.get(&format!("vllm:{name}_sum{{{engine}}}")).copied();
    assert_eq!(sum("request_params_max_tokens"), Some(8.0 * 64.0));
    assert_eq!(sum("request_generation_tokens"), Some(generated as f64));
    Ok(())
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather at a place",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 10},
                "where": {"type": "object", "properties": {
                    "lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat", "lon"]},
                "hours": {"type": "array", "items": {"type": "integer"}, "minItems": 1}
            },
            "required": ["city", "unit", "days", "where", "hours"]
        }
    }})
}

fn search_tool() -> Value {
    json!({"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}})
}

/// Checks arguments against [`weather_tool`]'s schema.
fn check_weather(arguments: &str) -> Result<()> {
    let args: Value = serde_json::from_str(arguments).context("arguments are JSON")?;
    assert!(args["city"].is_string(), "{args}");
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().context("unit")?));
    let days = args["days"].as_i64().context("days")?;
    assert!((1..=10).contains(&days));
    assert!(args["where"]["lat"].is_number() && args["where"]["lon"].is_number());
    let hours = args["hours"].as_array().context("hours")?;
    assert!(!hours.is_empty() && hours.iter().all(Value::is_i64));
    Ok(())
}

#[tokio::test]
async fn tool_calls_stream_as_fragments_that_reassemble() -> Result<()> {
    let server = TestServer::start(sampled()).await?;
    let tools = json!([search_tool(), weather_tool()]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for seed in 0..4 {
        let body = chat(json!({"tools": tools, "tool_choice": named, "seed": seed,
                               "max_tokens": 512, "stream": true}));
        let chunks = stream_chunks(&server, "/v1/chat/completions", &body).await?;
        let mut arguments = String::new();
        let mut headers = 0;
        let mut finish = Value::Null;
        for c in &chunks[1..] {
            let choice = &c["choices"][0];
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
                continue;
            }
            if choice.is_null() {
                continue;
            }
            assert!(choice["delta"].get("content").is_none(), "{c}");
            let calls = choice["delta"]["tool_calls"]
                .as_array()
                .context("tool_calls")?;
            assert_eq!(calls.len(), 1);
            let call = &calls[0];
            assert_eq!(call["index"], 0);
            if call.get("id").is_some() {
                headers += 1;
                assert!(call["id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("call_")));
                assert_eq!(call["type"], "function");
                assert_eq!(call["function"]["name"], "get_weather");
                assert_eq!(call["function"]["arguments"], "");
            } else {
                assert_eq!(call.as_object().map(|o| o.len()), Some(2), "{call}");
                arguments.push_str(call["function"]["arguments"].as_str().context("fragment")?);
            }
        }
        assert_eq!(headers, 1);
        assert_eq!(finish, "tool_calls");
        check_weather(&arguments)?;

        // Whole: the same call, content null.
        let body = chat(json!({"tools": tools, "tool_choice": named, "seed": seed,
                               "max_tokens": 512}));
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], arguments.as_str());
        let usage = whole["usage"]["completion_tokens"]
            .as_u64()
            .context("usage")?;
        assert_eq!(usage as usize, default_codec().encode(&arguments).len());
    }

    // required: some tool; auto follows --tool-call-probability; none never calls.
    let required = chat(json!({"tools": tools, "tool_choice": "required", "max_tokens": 512}));
    let whole = ok(&server, "/v1/chat/completions", &required).await?;
    assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
    // A limit too small for the arguments cuts them: finish_reason length, partial arguments.
    let cut = chat(json!({"tools": tools, "tool_choice": named, "max_tokens": 3, "seed": 0}));
    let full = chat(json!({"tools": tools, "tool_choice": named, "max_tokens": 512, "seed": 0}));
    let full = ok(&server, "/v1/chat/completions", &full).await?;
    let full = full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .context("arguments")?
        .to_string();
    let whole = ok(&server, "/v1/chat/completions", &cut).await?;
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 3);
    let partial = choice["message"]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .context("arguments")?;
    assert!(
        full.starts_with(partial) && partial.len() < full.len(),
        "{partial}"
    );
    assert!(serde_json::from_str::<Value>(partial).is_err());
    for (p, want) in [(0.0, false), (1.0, true)] {
        let server = TestServer::start(ServerConfig {
            tool_call_probability: p,
            ..sampled()
        })
        .await?;
        for seed in 0..4 {
            let body = chat(json!({"tools": tools, "seed": seed, "max_tokens": 512}));
            let whole = ok(&server, "/v1/chat/completions", &body).await?;
            let called = whole["choices"][0]["message"]["tool_calls"].is_array();
            assert_eq!(called, want, "p = {p}: {whole}");
        }
    }
    let none = chat(json!({"tools": tools, "tool_choice": "none", "max_tokens": 8}));
    let whole = ok(&server, "/v1/chat/completions", &none).await?;
    assert!(whole["choices"][0]["message"].get("tool_calls").is_none());

    // History with a call and its result is accepted and rendered into the prompt.
    let history = json!([
        user("weather in Paris?"),
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    ]);
    let short = json!([user("weather in Paris?")]);
    let with = ok(
        &server,
        "/v1/chat/completions",
        &chat_body(
            &history,
            json!({"tools": tools, "max_tokens": 4, "tool_choice": "none"}),
        ),
    )
    .await?;
    let without = ok(
        &server,
        "/v1/chat/completions",
        &chat_body(
            &short,
            json!({"tools": tools, "max_tokens": 4, "tool_choice": "none"}),
        ),
    )
    .await?;
    let bare = ok(
        &server,
        "/v1/chat/completions",
        &chat_body(&short, json!({"max_tokens": 4})),
    )
    .await?;
    let prompt = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(
        prompt(&with) > prompt(&without) + 10,
        "the call and its result are in the prompt"
    );
    assert!(
        prompt(&without) > prompt(&bare) + 20,
        "the tool definitions are in the prompt"
    );

    // Malformed tools: OpenAI-shaped 400s naming the field.
    for (tools, choice, param) in [
        (
            json!([{"type": "function", "function": {"name": "f", "parameters":
            {"type": "object", "properties": {"x": {"type": "strng"}}}}}]),
            json!("auto"),
            "tools[0].function.parameters",
        ),
        (
            json!([{"type": "function", "function": {"name": "f", "parameters":
            {"type": "object", "required": "x"}}}]),
            json!("auto"),
            "tools[0].function.parameters",
        ),
        (
            json!([{"type": "function"}]),
            json!("auto"),
            "tools[0].function",
        ),
        (
            json!([weather_tool()]),
            json!({"type": "function", "function": {"name": "nope"}}),
            "tool_choice",
        ),
    ] {
        let (status, body) = post(
            &server.state,
            "/v1/chat/completions",
            &chat(json!({"tools": tools, "tool_choice": choice})),
        )
        .await?;
        let error = error_of(status, &body, StatusCode::BAD_REQUEST)?;
        assert_eq!(error["param"], param, "{body}");
        assert_eq!(error["type"], "invalid_request_error");
    }
    Ok(())
}

#[tokio::test]
async fn logprobs_have_openai_shapes() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = chat(json!({"max_tokens": 6, "logprobs": true, "top_logprobs": 3, "seed": 1}));
    let whole = ok(&server, "/v1/chat/completions", &body).await?;
    let choice = &whole["choices"][0];
    let content = choice["message"]["content"].as_str().context("content")?;
    let entries = choice["logprobs"]["content"]
        .as_array()
        .context("logprobs")?;
    assert_eq!(entries.len(), 6);
    assert_eq!(choice["logprobs"]["refusal"], Value::Null);
    let joined: String = entries.iter().filter_map(|e| e["token"].as_str()).collect();
    assert_eq!(joined, content);
    for e in entries {
        let token = e["token"].as_str().context("token")?;
        let lp = e["logprob"].as_f64().context("logprob")?;
        assert!(lp <= 0.0);
        assert_eq!(e["bytes"], json!(token.as_bytes()));
        let top = e["top_logprobs"].as_array().context("top")?;
        assert_eq!(top.len(), 3);
        assert!(top
            .iter()
            .all(|t| t["logprob"].as_f64().is_some_and(|l| l <= 0.0)));
        assert!(top
            .windows(2)
            .all(|w| w[0]["logprob"].as_f64() >= w[1]["logprob"].as_f64()));
    }
    // Streamed: one entry per content chunk, the same values.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = stream_chunks(&server, "/v1/chat/completions", &streamed).await?;
    let per_chunk: Vec<&Value> = chunks
        .iter()
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .map(|c| &c["choices"][0]["logprobs"]["content"][0])
        .collect();
    assert_eq!(per_chunk, entries.iter().collect::<Vec<_>>());
    // Without logprobs: null.
    let plain = ok(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 2})),
    )
    .await?;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
    // top_logprobs without logprobs is refused.
    let (status, body) = post(
        &server.state,
        "/v1/chat/completions",
        &chat(json!({"top_logprobs": 2})),
    )
    .await?;
    assert_eq!(
        error_of(status, &body, StatusCode::BAD_REQUEST)?["param"],
        "top_logprobs"
    );

    // Completions: parallel arrays, text offsets into the text.
    let whole = ok(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model",
        "prompt": "once upon a time", "max_tokens": 5, "logprobs": 2}),
    )
    .await?;
    let choice = &whole["choices"][0];
    let text = choice["text"].as_str().context("text")?;
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .context("tokens")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tokens.concat(), text);
    assert_eq!(lp["token_logprobs"].as_array().map(Vec::len), Some(5));
    let mut offset = 0;
    for (i, token) in tokens.iter().enumerate() {
        assert_eq!(lp["text_offset"][i], offset);
        offset += token.chars().count();
        let top = lp["top_logprobs"][i].as_object().context("top")?;
        assert!(
            top.contains_key(*token) && top.len() <= 3 && top.len() >= 2,
            "{top:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn json_mode_answers_parse() -> Result<()> {
    let server = TestServer::start(sampled()).await?;
    let schema = weather_tool()["function"]["parameters"].clone();
    for seed in 0..6 {
        let object = chat(
            json!({"response_format": {"type": "json_object"}, "seed": seed,
                                 "max_tokens": 400}),
        );
        let whole = ok(&server, "/v1/chat/completions", &object).await?;
        let content = whole["choices"][0]["message"]["content"]
            .as_str()
            .context("content")?;
        assert!(
            serde_json::from_str::<Value>(content)?.is_object(),
            "{content}"
        );
        assert_eq!(whole["choices"][0]["finish_reason"], "stop");

        let body = chat(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "weather", "schema": schema, "strict": true}},
            "seed": seed, "max_tokens": 400, "stream": true}));
        let chunks = stream_chunks(&server, "/v1/chat/completions", &body).await?;
        let (text, count, finish) = streamed_content(&chunks, 0);
        assert!(count > 5, "streamed token by token");
        check_weather(&text)?;
        assert_eq!(finish["finish_reason"], "stop");
    }
    // Too small a limit cuts the document: finish_reason length.
    let small = chat(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema}}, "max_tokens": 3}));
    let whole = ok(&server, "/v1/chat/completions", &small).await?;
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 3);
    let (status, body) = post(
        &server.state,
        "/v1/chat/completions",
        &chat(
            json!({"response_format": {"type": "json_schema", "json_schema":
            {"schema": {"type": "objekt"}}}}),
        ),
    )
    .await?;
    let error = error_of(status, &body, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "response_format.json_schema.schema");
    Ok(())
}

#[tokio::test]
async fn n_choices_and_prompt_batches_are_indexed() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = chat(json!({"n": 3, "max_tokens": 5, "stream": true,
                           "stream_options": {"include_usage": true}}));
    let chunks = stream_chunks(&server, "/v1/chat/completions", &body).await?;
    for (i, role) in chunks[..3].iter().enumerate() {
        assert_eq!(role["choices"][0]["index"], i);
        assert_eq!(role["choices"][0]["delta"]["role"], "assistant");
    }
    let mut texts = Vec::new();
    for i in 0..3 {
        let (text, count, finish) = streamed_content(&chunks, i);
        assert_eq!(count, 5);
        assert_eq!(finish["finish_reason"], "length");
        texts.push(text);
    }
    assert!(
        texts[0] != texts[1] && texts[1] != texts[2],
        "each choice has its own words"
    );
    let usage = &chunks.last().context("usage chunk")?["usage"];
    assert_eq!(usage["completion_tokens"], 15);
    let whole = ok(
        &server,
        "/v1/chat/completions",
        &chat(json!({"n": 3, "max_tokens": 5})),
    )
    .await?;
    let choices = whole["choices"].as_array().context("choices")?;
    assert_eq!(choices.len(), 3);
    assert_eq!(whole["usage"]["completion_tokens"], 15);
    let single = ok(
        &server,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 5})),
    )
    .await?;
    assert_eq!(
        whole["usage"]["prompt_tokens"],
        single["usage"]["prompt_tokens"]
    );

    // Completions with two prompts and n = 2: prompt-major indices, usage summed per prompt.
    let codec = default_codec();
    let prompts = ["one prompt", "and another longer prompt"];
    let whole = ok(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model",
        "prompt": prompts, "n": 2, "max_tokens": 4, "echo": true}),
    )
    .await?;
    let choices = whole["choices"].as_array().context("choices")?;
    assert_eq!(choices.len(), 4);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let text = choice["text"].as_str().context("text")?;
        assert!(text.starts_with(prompts[i / 2]), "echo: {text}");
    }
    let prompt_tokens: usize = prompts.iter().map(|p| codec.encode(p).len()).sum();
    assert_eq!(whole["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(whole["usage"]["completion_tokens"], 16);

    // Streamed echo: the prompt comes first, then the answer.
    let c = stream_chunks(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model",
        "prompt": [[5, 6, 7]], "max_tokens": 2, "echo": true, "stream": true}),
    )
    .await?;
    let first = c[0]["choices"][0]["text"].as_str().context("text")?;
    assert!(first.starts_with(&codec.decode(&[5, 6, 7])), "{first}");

    // n beyond what one worker's KV holds: a clear 400.
    let mut small = config(None);
    small.cluster.engine.num_gpu_blocks = 8;
    let server = TestServer::start(small).await?;
    let (status, body) = post(
        &server.state,
        "/v1/chat/completions",
        &chat(json!({"n": 4, "max_tokens": 64})),
    )
    .await?;
    let error = error_of(status, &body, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "n");
    assert_eq!(error["code"], "n_too_large");
    Ok(())
}

#[tokio::test]
async fn same_seed_same_answer_bytes() -> Result<()> {
    let body = chat(
        json!({"max_tokens": 48, "seed": 5, "n": 2, "logprobs": true,
        "top_logprobs": 2, "stop": ["\n"], "tools": [weather_tool()]}),
    );
    let mut answers = Vec::new();
    for _ in 0..2 {
        let server = TestServer::start(sampled()).await?;
        let whole = ok(&server, "/v1/chat/completions", &body).await?;
        answers.push((whole["choices"].clone(), whole["usage"].clone()));
    }
    assert_eq!(answers[0], answers[1]);
    let mut other = body.clone();
    other["seed"] = json!(6);
    let server = TestServer::start(sampled()).await?;
    let whole = ok(&server, "/v1/chat/completions", &other).await?;
    assert_ne!(whole["choices"], answers[0].0);
    Ok(())
}

/// Issue 43: completions `echo` with `logprobs` carries the prompt's tokens too, first, as vLLM
/// and OpenAI answer it: the first prompt token's log-probability and alternatives are null,
/// its text offset 0; the answer's tokens follow at the echo's length. Streamed, they come with
/// the echo's chunk.
#[tokio::test]
async fn echo_with_logprobs_carries_the_prompt_tokens() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let codec = default_codec();
    let prompt = "Hello world, this is a prompt";
    let prompt_ids = codec.encode(prompt);
    let p = prompt_ids.len();
    assert!(p > 2, "{prompt_ids:?}");
    let whole = ok(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model", "prompt": prompt, "max_tokens": 3, "echo": true,
                "logprobs": 2, "ignore_eos": true}),
    )
    .await?;
    let choice = &whole["choices"][0];
    let lp = &choice["logprobs"];
    let tokens = lp["tokens"].as_array().context("tokens")?;
    assert_eq!(tokens.len(), p + 3, "{lp}");
    let prompt_text: String = tokens[..p].iter().filter_map(Value::as_str).collect();
    assert_eq!(prompt_text, prompt);
    assert_eq!(lp["token_logprobs"][0], Value::Null, "{lp}");
    assert_eq!(lp["top_logprobs"][0], Value::Null, "{lp}");
    for i in 1..p + 3 {
        assert!(
            lp["token_logprobs"][i].as_f64().is_some_and(|x| x <= 0.0),
            "{lp}"
        );
        let top = lp["top_logprobs"][i].as_object().context("top")?;
        assert!((1..=3).contains(&top.len()), "{lp}");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .context("offsets")?
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert_eq!(offsets.len(), p + 3);
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[p], prompt.chars().count() as u64);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    let text = choice["text"].as_str().context("text")?;
    assert!(text.starts_with(prompt), "{text}");

    // Streamed: the first text chunk has the echo and the prompt's entries before its token.
    let c = stream_chunks(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model", "prompt": prompt, "max_tokens": 3, "echo": true,
                "logprobs": 1, "ignore_eos": true, "stream": true}),
    )
    .await?;
    let first = &c[0]["choices"][0];
    assert!(
        first["text"]
            .as_str()
            .is_some_and(|t| t.starts_with(prompt)),
        "{first}"
    );
    let lp = &first["logprobs"];
    assert_eq!(lp["tokens"].as_array().map(Vec::len), Some(p + 1), "{lp}");
    assert_eq!(lp["token_logprobs"][0], Value::Null, "{lp}");
    assert_eq!(lp["text_offset"][p], prompt.chars().count(), "{lp}");
    // Without logprobs, echo has none.
    let plain = ok(
        &server,
        "/v1/completions",
        &json!({"model": "mock-model", "prompt": prompt, "max_tokens": 3, "echo": true}),
    )
    .await?;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
    Ok(())
}
