//! The work budget of one request: each cap is a 400 naming its parameter and stating the cap,
//! the work within the caps is bounded (stop matching, recursive schemas, prompt batches,
//! log-probabilities), and `/health` answers promptly while the costliest accepted bodies run.

use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use mock_server::api::budget::{
    MAX_CHOICES, MAX_LOGPROB_ENTRIES, MAX_OUTPUT_TOKENS, MAX_PROMPTS, MAX_STOPS, MAX_STOP_BYTES,
    MAX_STOP_TOKEN_IDS, MAX_WORD_BYTES,
};
use mock_server::api::AppState;
use serde_json::{json, Value};
use tokio::time::{timeout, Instant};

use crate::common::*;

/// Generous bound for the heaviest accepted requests on a loaded 2-core debug build; without
/// the budget they take minutes or never end.
const HEAVY: Duration = Duration::from_secs(120);

fn chat(extra: Value) -> Value {
    chat_body(&json!([user("hi")]), extra)
}

fn completion(extra: Value) -> Value {
    let mut body = json!({"model": "mock-model"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// The recursive schema: every array holds at least two arrays like itself.
fn recursive_schema() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "tree", "schema": {
        "$defs": {"n": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/n"}}},
        "$ref": "#/$defs/n"
    }}})
}

/// `count` stop strings of `bytes` bytes each that the answers never contain.
fn long_stops(count: usize, bytes: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("{i:02}{}", "q".repeat(bytes - 2)))
        .collect()
}

/// Asserts a 400 naming `param` whose message states `cap`.
async fn refused(
    state: &AppState,
    path: &str,
    body: &Value,
    param: &str,
    cap: usize,
) -> Result<()> {
    let (status, b) = post(state, path, body).await?;
    let error = error_of(status, &b, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], param, "{b}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&cap.to_string()),
        "{message} should state {cap}"
    );
    Ok(())
}

#[tokio::test]
async fn each_cap_is_a_400_naming_its_parameter() -> Result<()> {
    let state = AppState::new(config(None))?;
    let chat_path = "/v1/chat/completions";
    let text_path = "/v1/completions";
    // At the caps, accepted.
    let at_cap = chat(
        json!({"max_tokens": 4, "stop": long_stops(MAX_STOPS, MAX_STOP_BYTES),
                             "stop_token_ids": vec![5; MAX_STOP_TOKEN_IDS]}),
    );
    let (status, b) = post(&state, chat_path, &at_cap).await?;
    assert_eq!(status, StatusCode::OK, "{b}");
    // One beyond each.
    let stops = long_stops(MAX_STOPS + 1, 4);
    refused(
        &state,
        chat_path,
        &chat(json!({"stop": stops})),
        "stop",
        MAX_STOPS,
    )
    .await?;
    let long = long_stops(1, MAX_STOP_BYTES + 1);
    refused(
        &state,
        text_path,
        &completion(json!({"prompt": "a", "stop": long})),
        "stop",
        MAX_STOP_BYTES,
    )
    .await?;
    let ids = vec![5; MAX_STOP_TOKEN_IDS + 1];
    refused(
        &state,
        chat_path,
        &chat(json!({"stop_token_ids": ids})),
        "stop_token_ids",
        MAX_STOP_TOKEN_IDS,
    )
    .await?;
    let batch = vec!["hi"; MAX_PROMPTS + 1];
    refused(
        &state,
        text_path,
        &completion(json!({"prompt": batch, "max_tokens": 1})),
        "prompt",
        MAX_PROMPTS,
    )
    .await?;
    let batch = vec!["hi"; 200];
    refused(
        &state,
        text_path,
        &completion(json!({"prompt": batch, "n": 101, "max_tokens": 1})),
        "n",
        MAX_CHOICES,
    )
    .await?;
    let batch = vec!["hi"; 20];
    refused(
        &state,
        text_path,
        &completion(json!({"prompt": batch, "max_tokens": 60_000})),
        "max_tokens",
        MAX_OUTPUT_TOKENS,
    )
    .await?;
    let logprobs = chat(json!({"max_tokens": 60_000, "logprobs": true, "top_logprobs": 20}));
    refused(
        &state,
        chat_path,
        &logprobs,
        "top_logprobs",
        MAX_LOGPROB_ENTRIES,
    )
    .await?;
    let batch = vec!["hi"; 16];
    let logprobs = completion(json!({"prompt": batch, "max_tokens": 4000, "logprobs": 20}));
    refused(
        &state,
        text_path,
        &logprobs,
        "logprobs",
        MAX_LOGPROB_ENTRIES,
    )
    .await?;
    // The same logprobs streamed cost the same to plan: refused alike.
    let streamed = chat(
        json!({"max_tokens": 60_000, "logprobs": true, "top_logprobs": 20,
                               "stream": true}),
    );
    refused(
        &state,
        chat_path,
        &streamed,
        "top_logprobs",
        MAX_LOGPROB_ENTRIES,
    )
    .await?;

    // min_tokens beyond the output limit, and token ids out of the vocabulary.
    let (status, b) = post(
        &state,
        chat_path,
        &chat(json!({"max_tokens": 4, "min_tokens": 5})),
    )
    .await?;
    assert_eq!(
        error_of(status, &b, StatusCode::BAD_REQUEST)?["param"],
        "min_tokens"
    );
    let (status, b) = post(
        &state,
        chat_path,
        &chat(json!({"max_tokens": 4, "min_tokens": 4})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{b}");
    for (path, body, param) in [
        (
            text_path,
            completion(json!({"prompt": [1, 4_000_000_000u32]})),
            "prompt",
        ),
        (
            text_path,
            completion(json!({"prompt": [[1], [300_000]]})),
            "prompt",
        ),
        (
            chat_path,
            chat(json!({"stop_token_ids": [7, 300_000]})),
            "stop_token_ids",
        ),
        ("/detokenize", json!({"tokens": [1, 300_000]}), "tokens"),
    ] {
        let (status, b) = post(&state, path, &body).await?;
        let error = error_of(status, &b, StatusCode::BAD_REQUEST)?;
        assert_eq!(error["param"], param, "{path}: {b}");
    }
    let (status, b) = post(&state, "/detokenize", &json!({"tokens": [1, 2]})).await?;
    assert_eq!(status, StatusCode::OK, "{b}");
    Ok(())
}

#[tokio::test]
async fn the_api_key_guards_the_v1_routes_only() -> Result<()> {
    let mut keyed = config(None);
    keyed.api_key = Some("sekrit".into());
    let state = AppState::new(keyed)?;
    let send = |path: &str, body: &Value, key: Option<&str>| {
        let mut request = Request::post(path).header("content-type", "application/json");
        if let Some(key) = key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        request.body(Body::from(body.to_string()))
    };
    let tokenize = json!({"prompt": "hello"});
    let detokenize = json!({"tokens": [1, 2]});
    let generate = completion(json!({"prompt": "hello", "max_tokens": 2}));
    for key in [None, Some("wrong"), Some("sekrit")] {
        let (s, b) = oneshot_raw(&state, send("/tokenize", &tokenize, key)?).await?;
        assert_eq!(s, StatusCode::OK, "{key:?}: {b}");
        assert!(b["count"].as_u64().is_some_and(|c| c > 0), "{b}");
        let (s, b) = oneshot_raw(&state, send("/detokenize", &detokenize, key)?).await?;
        assert_eq!(s, StatusCode::OK, "{key:?}: {b}");
        let (s, b) = oneshot_raw(&state, send("/v1/completions", &generate, key)?).await?;
        if key == Some("sekrit") {
            assert_eq!(s, StatusCode::OK, "{b}");
        } else {
            assert_eq!(
                error_of(s, &b, StatusCode::UNAUTHORIZED)?["code"],
                "invalid_api_key"
            );
        }
    }
    let models = Request::get("/v1/models").body(Body::empty())?;
    assert_eq!(
        oneshot_raw(&state, models).await?.0,
        StatusCode::UNAUTHORIZED
    );
    Ok(())
}

#[tokio::test]
async fn a_short_stop_among_long_ones_ends_the_answer_exactly() -> Result<()> {
    let state = AppState::new(config(None))?;
    let base = chat(json!({"max_tokens": 3000, "ignore_eos": true, "seed": 11}));
    let (status, whole) = post(&state, "/v1/chat/completions", &base).await?;
    assert_eq!(status, StatusCode::OK, "{whole}");
    let text = whole["choices"][0]["message"]["content"]
        .as_str()
        .context("content")?
        .to_string();
    // A word well into the answer is the stop; the others are as long as allowed and absent.
    let words: Vec<&str> = text.split_whitespace().collect();
    let word = words.get(words.len() / 2).context("words")?.to_string();
    let at = text.find(&word).context("in the text")?;
    let mut stops = long_stops(MAX_STOPS - 1, MAX_STOP_BYTES);
    stops.push(word.clone());
    let body = chat(json!({"max_tokens": 3000, "ignore_eos": true, "seed": 11, "stop": stops}));
    let t0 = Instant::now();
    let (status, cut) = timeout(HEAVY, post(&state, "/v1/chat/completions", &body)).await??;
    assert_eq!(status, StatusCode::OK, "{cut}");
    let choice = &cut["choices"][0];
    assert_eq!(
        choice["message"]["content"],
        text[..at],
        "cut just before the stop"
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], json!(word));
    eprintln!("stop answer in {:?}", t0.elapsed());
    Ok(())
}

#[tokio::test]
async fn a_recursive_schema_answer_is_cut_at_the_limit() -> Result<()> {
    let state = AppState::new(config(None))?;
    for max_tokens in [16, 4000] {
        let body = chat(
            json!({"max_tokens": max_tokens, "response_format": recursive_schema(),
                               "seed": 3}),
        );
        let (status, b) = timeout(HEAVY, post(&state, "/v1/chat/completions", &body)).await??;
        assert_eq!(status, StatusCode::OK, "{b}");
        let choice = &b["choices"][0];
        assert_eq!(choice["finish_reason"], "length", "{b}");
        assert_eq!(b["usage"]["completion_tokens"], max_tokens);
        let content = choice["message"]["content"].as_str().context("content")?;
        assert!(content.starts_with("[["), "{content}");
        // Well under what the limit's tokens could carry at the tokenizer's longest.
        assert!(content.len() <= max_tokens * 64, "{} bytes", content.len());
        // A tool whose arguments nest the same way is cut alike.
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "required": ["t"],
            "properties": {"t": {"$ref": "#/$defs/n"}},
            "$defs": {"n": {"type": "array", "minItems": 3, "items": {"$ref": "#/$defs/n"}}}}}}]);
        let body =
            chat(json!({"max_tokens": max_tokens, "tools": tools, "tool_choice": "required"}));
        let (status, b) = timeout(HEAVY, post(&state, "/v1/chat/completions", &body)).await??;
        assert_eq!(status, StatusCode::OK, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "length", "{b}");
        assert_eq!(b["usage"]["completion_tokens"], max_tokens);
    }
    Ok(())
}

#[tokio::test]
async fn a_whole_logprob_batch_is_one_body_the_size_of_what_it_says() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let body = chat(
        json!({"max_tokens": 1000, "n": 4, "logprobs": true, "top_logprobs": 20,
                           "seed": 4}),
    );
    let response = timeout(
        HEAVY,
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .json(&body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let bytes = timeout(HEAVY, response.bytes()).await??;
    let whole: Value = serde_json::from_slice(&bytes)?;
    let choices = whole["choices"].as_array().context("choices")?;
    assert_eq!(choices.len(), 4);
    let mut entries = 0;
    for c in choices {
        let content = c["logprobs"]["content"].as_array().context("content")?;
        assert_eq!(content.len(), 1000);
        for t in content {
            let top = t["top_logprobs"].as_array().context("top")?;
            assert_eq!(top.len(), 20, "{t}");
            entries += 1 + top.len();
        }
    }
    assert_eq!(entries, 4 * 1000 * 21);
    // About 50 bytes of JSON an entry: the body is the size of what it says.
    let per_entry = bytes.len() / entries;
    assert!(
        (20..=120).contains(&per_entry),
        "{per_entry} bytes an entry"
    );
    eprintln!("logprobs body {} bytes", bytes.len());
    Ok(())
}

/// `GET /health`'s latency, probed every 20 ms until `done` is set.
async fn probe_health(server: &TestServer, done: &tokio::sync::Notify) -> Result<Vec<Duration>> {
    let mut latencies = Vec::new();
    let finished = done.notified();
    tokio::pin!(finished);
    loop {
        let t0 = Instant::now();
        let response = timeout(
            Duration::from_secs(30),
            server.client.get(format!("{}/health", server.base)).send(),
        )
        .await??;
        assert_eq!(response.status(), 200);
        latencies.push(t0.elapsed());
        tokio::select! {
            () = &mut finished => return Ok(latencies),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "real time: .ci/run runs it alone, after the test command"]
async fn health_answers_while_the_costliest_accepted_bodies_run() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let heavy = [
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 20_000, "ignore_eos": true,
                        "stop": long_stops(MAX_STOPS, MAX_STOP_BYTES)})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 20_000, "response_format": recursive_schema()})),
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 3000, "n": 4, "logprobs": true, "top_logprobs": 20})),
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": vec!["hi"; MAX_PROMPTS], "max_tokens": 1})),
        ),
    ];
    let done = tokio::sync::Notify::new();
    let requests = async {
        let sent = heavy.iter().map(|(path, body)| {
            let request = server
                .client
                .post(format!("{}{path}", server.base))
                .json(body)
                .send();
            async move {
                let response = timeout(HEAVY, request).await??;
                let status = response.status();
                let bytes = timeout(HEAVY, response.bytes()).await??;
                anyhow::ensure!(status == 200, "{path}: {}", String::from_utf8_lossy(&bytes));
                Ok::<_, anyhow::Error>(bytes)
            }
        });
        let bodies = futures_util::future::try_join_all(sent).await;
        done.notify_one();
        bodies
    };
    let (bodies, latencies) = tokio::join!(requests, probe_health(&server, &done));
    let (bodies, mut latencies) = (bodies?, latencies?);
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let max = latencies[latencies.len() - 1];
    let sizes: Vec<usize> = bodies.iter().map(|b| b.len()).collect();
    eprintln!(
        "{} probes while bodies of {sizes:?} bytes ran: median {median:?}, max {max:?}",
        latencies.len()
    );
    assert!(median <= Duration::from_millis(100), "median {median:?}");
    assert!(max <= Duration::from_secs(1), "max {max:?}");

    // Each ran to its end with what it asked for.
    for body in &bodies[..2] {
        let b: Value = serde_json::from_slice(body)?;
        assert_eq!(b["choices"][0]["finish_reason"], "length", "{b}");
        assert_eq!(b["usage"]["completion_tokens"], 20_000);
    }
    // The logprob batch is counted in its bytes, not parsed (a value tree of it is large).
    let count = |body: &[u8], pattern: &[u8]| {
        body.windows(pattern.len())
            .filter(|w| *w == pattern)
            .count()
    };
    assert_eq!(count(&bodies[2], b"\"top_logprobs\":["), 4 * 3000);
    assert_eq!(count(&bodies[2], b"\"token\":"), 4 * 3000 * 21);
    assert_eq!(count(&bodies[2], b"\"finish_reason\":\"length\""), 4);
    let batch: Value = serde_json::from_slice(&bodies[3])?;
    let choices = batch["choices"].as_array().context("choices")?;
    assert_eq!(choices.len(), MAX_PROMPTS);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
    }
    assert_eq!(batch["usage"]["completion_tokens"], MAX_PROMPTS);
    Ok(())
}

/// `/tokenize` and `/detokenize` of large bodies run on the blocking pool, as completions do:
/// four 2 MB texts (one as chat messages, one asking for every token's string) and 600,000 ids
/// to decode leave `/health` as prompt as the generation bodies above (issue 43: on the
/// runtime's threads, four 6.5 MB bodies made it take 1.9 s at the median).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "real time: .ci/run runs it alone, after the test command"]
async fn health_answers_while_large_bodies_are_tokenized() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let text = "The quick brown fox jumps over the lazy dog, 1234 times. ".repeat(36_000);
    let ids: Vec<u32> = (0..600_000u32).map(|i| 100 + i % 5_000).collect();
    let heavy = [
        ("/tokenize", json!({"prompt": text})),
        (
            "/tokenize",
            json!({"prompt": text, "return_token_strs": true}),
        ),
        ("/tokenize", json!({"messages": [user(&text)]})),
        ("/tokenize", json!({"prompt": text})),
        ("/detokenize", json!({"tokens": ids})),
    ];
    // Written and read as bytes here, parsed after: the test's own JSON work stays off the
    // runtime while `/health` is probed.
    let heavy: Vec<(&str, String)> = heavy.iter().map(|(p, b)| (*p, b.to_string())).collect();
    let done = tokio::sync::Notify::new();
    let requests = async {
        let sent = heavy.iter().map(|(path, body)| {
            let request = server
                .client
                .post(format!("{}{path}", server.base))
                .header("content-type", "application/json")
                .body(body.clone())
                .send();
            async move {
                let response = timeout(HEAVY, request).await??;
                let status = response.status();
                let bytes = timeout(HEAVY, response.bytes()).await??;
                anyhow::ensure!(status == 200, "{path}: {}", String::from_utf8_lossy(&bytes));
                Ok::<_, anyhow::Error>(bytes)
            }
        });
        let bodies = futures_util::future::try_join_all(sent).await;
        done.notify_one();
        bodies
    };
    let (bodies, latencies) = tokio::join!(requests, probe_health(&server, &done));
    let (bodies, mut latencies) = (bodies?, latencies?);
    let bodies = bodies
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<Vec<Value>, _>>()?;
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let max = latencies[latencies.len() - 1];
    eprintln!(
        "{} probes while large bodies were tokenized: median {median:?}, max {max:?}",
        latencies.len()
    );
    assert!(median <= Duration::from_millis(100), "median {median:?}");
    assert!(max <= Duration::from_secs(1), "max {max:?}");

    // Each answered in full.
    let count = bodies[0]["count"].as_u64().context("count")?;
    assert!(count > 100_000, "{count} tokens");
    assert_eq!(
        bodies[0]["tokens"].as_array().map(Vec::len),
        Some(count as usize)
    );
    assert_eq!(bodies[3]["count"], count);
    assert_eq!(
        bodies[1]["token_strs"].as_array().map(Vec::len),
        Some(count as usize)
    );
    assert!(
        bodies[2]["count"].as_u64() > Some(count),
        "{}",
        bodies[2]["count"]
    );
    let decoded = bodies[4]["prompt"].as_str().context("prompt")?;
    assert!(decoded.len() > 600_000, "{} bytes", decoded.len());
    Ok(())
}

/// A word (one run of letters, spaces or symbols) is one piece for a byte-pair tokenizer, merged
/// in time that grows with the square of its length: a word at the cap is tokenized and
/// answered, one byte more is a 400 naming the field before any tokenizing, on every route that
/// tokenizes text. Digits split every three, so a long number is no such word.
#[tokio::test]
async fn a_word_beyond_the_cap_is_refused_before_tokenizing() -> Result<()> {
    let state = AppState::new(config(None))?;
    let at_cap = "a".repeat(MAX_WORD_BYTES);
    let (status, b) = post(
        &state,
        "/v1/completions",
        &completion(json!({"prompt": format!("x {at_cap} y"), "max_tokens": 1})),
    )
    .await?;
    assert_eq!(status, StatusCode::OK, "{b}");
    let digits = "7".repeat(MAX_WORD_BYTES + 1);
    let (status, b) = post(&state, "/tokenize", &json!({"prompt": digits})).await?;
    assert_eq!(status, StatusCode::OK, "{b}");
    let beyond = "a".repeat(MAX_WORD_BYTES + 1);
    let spaces = " ".repeat(MAX_WORD_BYTES + 1);
    let symbols = "~".repeat(MAX_WORD_BYTES + 1);
    for (path, body, param) in [
        (
            "/v1/completions",
            completion(json!({"prompt": ["hi", beyond.clone()]})),
            "prompt",
        ),
        (
            "/v1/completions",
            completion(json!({"prompt": spaces})),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            chat_body(&json!([user(&symbols)]), json!({})),
            "messages",
        ),
        (
            "/v1/chat/completions",
            chat_body(&json!([user(&beyond)]), json!({})),
            "messages",
        ),
        ("/tokenize", json!({"prompt": beyond.clone()}), "prompt"),
    ] {
        refused(&state, path, &body, param, MAX_WORD_BYTES).await?;
    }
    Ok(())
}

/// The bound on the whole server (`--max-inflight-bytes`, issue 43): requests each within every
/// per-request cap are refused with a 503 `server_overloaded` (OpenAI body, `Retry-After`) once
/// their estimated memory does not fit beside those in flight, and succeed once it does.
#[tokio::test]
async fn requests_beyond_the_in_flight_bound_are_refused_until_it_has_room() -> Result<()> {
    use mock_server::api::budget::OUTPUT_TOKEN_BYTES;
    // Streams of 1,000 planned tokens (about 321 KB each, 20 ms a token): three fit in 1 MB.
    let server = TestServer::start(mock_server::config::ServerConfig {
        max_inflight_bytes: 1_000_000,
        ..config(Some((1.0, 20.0)))
    })
    .await?;
    let body = completion(
        json!({"prompt": "hi", "max_tokens": 1000, "ignore_eos": true,
                                 "stream": true}),
    );
    let send = |body: &Value| {
        within(
            server
                .client
                .post(format!("{}/v1/completions", server.base))
                .json(body)
                .send(),
        )
    };
    let mut streams = Vec::new();
    for _ in 0..3 {
        let response = send(&body).await??;
        anyhow::ensure!(
            response.status() == 200,
            "{}",
            within(response.text()).await??
        );
        let mut stream = response.bytes_stream();
        within(futures_util::StreamExt::next(&mut stream))
            .await?
            .context("a first chunk")??;
        streams.push(stream);
    }
    let in_use = |m: &std::collections::BTreeMap<String, f64>| {
        m.get("servesim_inflight_bytes").copied().unwrap_or(-1.0)
    };
    let m = server.scrape().await?;
    let held = in_use(&m);
    assert!(
        held > 3.0 * 1000.0 * OUTPUT_TOKEN_BYTES as f64 && held <= 1_000_000.0,
        "{held} bytes in flight"
    );

    // The fourth does not fit: 503, the OpenAI body, Retry-After, the connection closed.
    let refused = send(&body).await??;
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["connection"], "close");
    let b: Value = within(refused.json()).await??;
    let error = error_of(
        StatusCode::SERVICE_UNAVAILABLE,
        &b,
        StatusCode::SERVICE_UNAVAILABLE,
    )?;
    assert_eq!(error["type"], "server_error");
    assert_eq!(error["code"], "server_overloaded");
    assert_eq!(error["param"], Value::Null);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("1000000 bytes") && message.contains("--max-inflight-bytes"),
        "{message}"
    );
    // A body announced larger than the room left is refused before it is read.
    let text = "word ".repeat(20_000);
    let refused = within(
        server
            .client
            .post(format!("{}/tokenize", server.base))
            .json(&json!({"prompt": text}))
            .send(),
    )
    .await??;
    assert_eq!(refused.status(), 503);
    let b: Value = within(refused.json()).await??;
    assert_eq!(b["error"]["code"], "server_overloaded", "{b}");
    let m = server.scrape().await?;
    assert_eq!(
        m.get("servesim_http_requests_over_inflight_bound_total"),
        Some(&2.0)
    );

    // The streams' clients leave: their bytes come back, and the same requests succeed.
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(30);
    while in_use(&server.scrape().await?) != 0.0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the streams' bytes never came back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tokenized = within(
        server
            .client
            .post(format!("{}/tokenize", server.base))
            .json(&json!({"prompt": text}))
            .send(),
    )
    .await??;
    assert_eq!(tokenized.status(), 200);
    let short = completion(json!({"prompt": "hi", "max_tokens": 3}));
    let response = send(&short).await??;
    assert_eq!(response.status(), 200);
    // A request larger than the whole bound runs alone (its reservation is cut to the bound).
    let large = completion(json!({"prompt": "hi", "max_tokens": 5000, "ignore_eos": true}));
    let server_fast = TestServer::start(mock_server::config::ServerConfig {
        max_inflight_bytes: 1_000_000,
        ..config(None)
    })
    .await?;
    let response = within(
        server_fast
            .client
            .post(format!("{}/v1/completions", server_fast.base))
            .json(&large)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let b: Value = within(response.json()).await??;
    assert_eq!(b["usage"]["completion_tokens"], 5000);
    Ok(())
}
