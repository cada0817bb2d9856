//! `POST /v1/embeddings`: OpenAI's shapes, deterministic unit vectors, `dimensions` and base64,
//! token-id inputs, usage as `/tokenize` counts it, the prefill pass through the engine (prefix
//! cache, `/metrics`), and the request budget's caps as 400s naming their parameter.

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use http_body_util::BodyExt;
use mock_server::api::budget::{EMBEDDING_DIM, MAX_EMBEDDING_INPUTS, MAX_EMBEDDING_TOKENS};
use mock_server::api::{app, AppState};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::*;

const PATH: &str = "/v1/embeddings";

fn body(input: Value, extra: Value) -> Value {
    let mut body = json!({"model": "mock-model", "input": input});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// The raw bytes of a 200 answer.
async fn raw(state: &AppState, body: &Value) -> Result<Vec<u8>> {
    let request = Request::post(PATH)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))?;
    let response = within(app(state.clone()).oneshot(request)).await??;
    assert_eq!(response.status(), StatusCode::OK);
    Ok(within(response.into_body().collect())
        .await??
        .to_bytes()
        .to_vec())
}

/// The float vectors of a 200 answer, with its whole body.
async fn embed(state: &AppState, body: &Value) -> Result<(Vec<Vec<f32>>, Value)> {
    let (status, answer) = post(state, PATH, body).await?;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let data = answer["data"].as_array().context("data")?;
    let vectors = data
        .iter()
        .map(|d| serde_json::from_value::<Vec<f32>>(d["embedding"].clone()))
        .collect::<Result<_, _>>()?;
    Ok((vectors, answer))
}

fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

/// `/tokenize`'s ids of `text`.
async fn tokenize(state: &AppState, text: &str) -> Result<Vec<u32>> {
    let (status, answer) = post(state, "/tokenize", &json!({"prompt": text})).await?;
    assert_eq!(status, StatusCode::OK);
    Ok(serde_json::from_value(answer["tokens"].clone())?)
}

#[tokio::test]
async fn embeddings_have_openai_shapes_unit_norms_and_tokenize_usage() -> Result<()> {
    let state = AppState::new(config(None))?;
    let texts = ["The quick brown fox", "jumps over the lazy dog", "hi"];
    let (vectors, answer) = embed(&state, &body(json!(texts), json!({"user": "u1"}))).await?;
    assert_eq!(answer["object"], "list");
    assert_eq!(answer["model"], "mock-model");
    assert_eq!(vectors.len(), 3);
    for (i, (d, v)) in answer["data"]
        .as_array()
        .context("data")?
        .iter()
        .zip(&vectors)
        .enumerate()
    {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(v.len(), EMBEDDING_DIM);
        assert!((norm(v) - 1.0).abs() < 1e-5, "{}", norm(v));
    }
    let mut tokens = 0;
    for text in texts {
        tokens += tokenize(&state, text).await?.len();
    }
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens})
    );
    // A string input is one vector.
    let (one, _) = embed(&state, &body(json!("hi"), json!({}))).await?;
    assert_eq!(one, vec![vectors[2].clone()]);
    Ok(())
}

#[tokio::test]
async fn vectors_depend_on_the_tokens_and_the_seed_only() -> Result<()> {
    let seeded = |seed| {
        let mut cfg = config(None);
        cfg.seed = seed;
        AppState::new(cfg)
    };
    let (a, b, c) = (seeded(1)?, seeded(1)?, seeded(2)?);
    let request = body(json!(["one input", "another input"]), json!({}));
    let first = raw(&a, &request).await?;
    assert_eq!(first, raw(&a, &request).await?);
    assert_eq!(first, raw(&b, &request).await?);
    assert_ne!(first, raw(&c, &request).await?);
    // Token ids that are the text's tokens give the text's vector.
    let text = "Token ids or text, the same vector.";
    let ids = tokenize(&a, text).await?;
    let (by_text, t) = embed(&a, &body(json!(text), json!({}))).await?;
    let (by_ids, i) = embed(&a, &body(json!(ids), json!({}))).await?;
    let (by_list, _) = embed(&a, &body(json!([ids]), json!({}))).await?;
    assert_eq!(by_text, by_ids);
    assert_eq!(by_text, by_list);
    assert_eq!(t["usage"], i["usage"]);
    assert_eq!(i["usage"]["prompt_tokens"], ids.len());
    Ok(())
}

#[tokio::test]
async fn dimensions_truncate_and_renormalise_and_base64_is_the_f32_bytes() -> Result<()> {
    let state = AppState::new(config(None))?;
    let input = json!(["shorter vectors", "x"]);
    let (full, _) = embed(&state, &body(input.clone(), json!({}))).await?;
    for dims in [1, 7, 256, EMBEDDING_DIM] {
        let (short, _) = embed(&state, &body(input.clone(), json!({"dimensions": dims}))).await?;
        for (s, f) in short.iter().zip(&full) {
            assert_eq!(s.len(), dims);
            assert!((norm(s) - 1.0).abs() < 1e-5);
            let scale = norm(&f[..dims]);
            for (x, y) in s.iter().zip(&f[..dims]) {
                assert!((f64::from(*x) - f64::from(*y) / scale).abs() < 1e-5);
            }
        }
        let (status, b64) = post(
            &state,
            PATH,
            &body(
                input.clone(),
                json!({"dimensions": dims, "encoding_format": "base64"}),
            ),
        )
        .await?;
        assert_eq!(status, StatusCode::OK);
        for (d, s) in b64["data"].as_array().context("data")?.iter().zip(&short) {
            let text = d["embedding"].as_str().context("a base64 string")?;
            let bytes = base64::engine::general_purpose::STANDARD.decode(text)?;
            assert_eq!(bytes.len(), 4 * dims);
            let decoded: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(&decoded, s);
        }
    }
    Ok(())
}

#[tokio::test]
async fn inputs_run_a_prefill_pass_each_and_repeats_hit_the_prefix_cache() -> Result<()> {
    let server = TestServer::start(config(Some((2.0, 1.0)))).await?;
    let q = long_question();
    let request = body(json!([q]), json!({}));
    let url = format!("{}{PATH}", server.base);
    let mut prompt = 0;
    for _ in 0..2 {
        let answer: Value = within(server.client.post(&url).json(&request).send())
            .await??
            .json()
            .await?;
        prompt = answer["usage"]["prompt_tokens"].as_u64().context("usage")?;
    }
    assert!(prompt > 2 * BLOCK_SIZE as u64);
    let m = server.scrape().await?;
    let at = |name: &str| {
        m.get(&format!("{name}{{model_name=\"mock-model\",engine=\"0\"}}"))
            .copied()
            .unwrap_or(f64::NAN)
    };
    assert_eq!(at("vllm:prompt_tokens_total"), 2.0 * prompt as f64);
    // The second pass found every full block of the first but the last token's.
    let cached = ((prompt as usize - 1) / BLOCK_SIZE * BLOCK_SIZE) as f64;
    assert_eq!(at("vllm:prefix_cache_hits_total"), cached);
    assert_eq!(at("vllm:generation_tokens_total"), 2.0);
    assert_eq!(at("vllm:time_to_first_token_seconds_count"), 2.0);
    assert_eq!(
        m.get("servesim_http_requests_total{endpoint=\"embeddings\"}"),
        Some(&2.0)
    );
    Ok(())
}

#[tokio::test]
async fn bad_inputs_and_the_caps_are_400s_naming_their_parameter() -> Result<()> {
    let mut cfg = config(None);
    cfg.max_model_len = 4096;
    let state = AppState::new(cfg)?;
    let cases = [
        (body(json!(""), json!({})), "input", "empty"),
        (body(json!([]), json!({})), "input", "expected"),
        (body(json!([[]]), json!({})), "input", "empty"),
        (body(json!(["a", [1]]), json!({})), "input", "expected"),
        (
            body(json!("x"), json!({"dimensions": 0})),
            "dimensions",
            "between 1 and 1024",
        ),
        (
            body(json!("x"), json!({"dimensions": 1_000_000_000u64})),
            "dimensions",
            "between 1 and 1024",
        ),
        (
            body(json!("x"), json!({"encoding_format": "int8"})),
            "encoding_format",
            "base64",
        ),
        (json!({"input": "x"}), "model", "model"),
        (
            body(json!([vec![1u32; 5000]]), json!({})),
            "input",
            "maximum context length is 4096 tokens; input 0 has 5000 tokens",
        ),
        (body(json!([-1]), json!({})), "input", "expected"),
        (body(json!([1.5]), json!({})), "input", "expected"),
    ];
    for (request, param, says) in cases {
        let (status, answer) = post(&state, PATH, &request).await?;
        let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
        assert_eq!(error["param"], param, "{answer}");
        assert_eq!(error["type"], "invalid_request_error");
        let message = error["message"].as_str().context("message")?;
        assert!(message.contains(says), "{message}");
    }
    // A million inputs, of text or of token ids, are refused on their count.
    for one in [json!("a"), json!([1])] {
        let many = Value::Array(vec![one; 1_000_000]);
        let (status, answer) = post(&state, PATH, &body(many, json!({}))).await?;
        let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
        assert_eq!(error["param"], "input");
        assert_eq!(
            error["message"],
            format!(
                "Invalid 'input': 1000000 inputs given; at most {MAX_EMBEDDING_INPUTS} inputs \
                 per request are accepted."
            )
        );
    }
    // A million token ids are one input, beyond the context.
    let (status, answer) =
        post(&state, PATH, &body(json!(vec![7u32; 1_000_000]), json!({}))).await?;
    let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["code"], "context_length_exceeded");
    // Within the input cap, beyond the token cap.
    let per_input = 4000usize;
    let inputs = vec![vec![7u32; per_input]; MAX_EMBEDDING_TOKENS / per_input + 1];
    let (status, answer) = post(&state, PATH, &body(json!(inputs), json!({}))).await?;
    let error = error_of(status, &answer, StatusCode::BAD_REQUEST)?;
    assert_eq!(error["param"], "input");
    let message = error["message"].as_str().context("message")?;
    assert!(
        message.contains(&format!(
            "at most {MAX_EMBEDDING_TOKENS} tokens per request"
        )),
        "{message}"
    );
    // An unknown model is a 404.
    let (status, answer) = post(&state, PATH, &json!({"model": "nope", "input": "x"})).await?;
    error_of(status, &answer, StatusCode::NOT_FOUND)?;
    Ok(())
}

/// The route's layers are the generation routes': the key, the forced (or drawn) HTTP fault,
/// the request and failure counts, and the `--max-waiting` queue bound.
#[tokio::test]
async fn the_key_faults_counts_and_the_queue_bound_apply() -> Result<()> {
    use mock_server::metrics::EndpointLabel;

    let mut keyed = config(None);
    keyed.api_key = Some("sekrit".into());
    let state = AppState::new(keyed)?;
    let request = body(json!("hi"), json!({}));
    let send = |key: bool, fault: Option<&str>| {
        let mut builder = Request::post(PATH).header("content-type", "application/json");
        if key {
            builder = builder.header("authorization", "Bearer sekrit");
        }
        if let Some(fault) = fault {
            builder = builder.header(mock_server::api::fault::FAULT_HEADER, fault);
        }
        builder.body(Body::from(request.to_string()))
    };
    let (status, answer) = oneshot_raw(&state, send(false, None)?).await?;
    assert_eq!(
        error_of(status, &answer, StatusCode::UNAUTHORIZED)?["code"],
        "invalid_api_key"
    );
    let (status, answer) = oneshot_raw(&state, send(true, Some("rate-limit"))?).await?;
    error_of(status, &answer, StatusCode::TOO_MANY_REQUESTS)?;
    let (status, answer) = oneshot_raw(&state, send(true, Some("server-error"))?).await?;
    error_of(status, &answer, StatusCode::INTERNAL_SERVER_ERROR)?;
    let (status, answer) = oneshot_raw(&state, send(true, None)?).await?;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let metrics = &state.metrics;
    let endpoint = EndpointLabel {
        endpoint: "embeddings",
    };
    // As on chat, an injected fault answers before the route's request count; it is counted
    // as a failure (and a fault) all the same.
    assert_eq!(metrics.http_requests.get_or_create(&endpoint).get(), 2);
    assert_eq!(metrics.http_failures.get(), 3);

    // A full queue is a 429, as for chat.
    let mut bounded = config(None);
    bounded.max_waiting = Some(0);
    let state = AppState::new(bounded)?;
    let (status, answer) = post(&state, PATH, &request).await?;
    error_of(status, &answer, StatusCode::TOO_MANY_REQUESTS)?;
    assert_eq!(state.metrics.overloaded.get(), 1);
    Ok(())
}

/// On a fleet, a worker's listener runs each input's prefill on its own engine, and the judge
/// logs one routing decision per input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_worker_runs_each_input_and_the_judge_logs_it() -> Result<()> {
    let config =
        crate::fleet::fleet_config(&["--workers", "2", "--port", "0", "--speedup-ratio", "inf"])?;
    let fleet = within(mock_server::fleet::launch(config)).await??;
    let urls = fleet_worker_urls(&fleet);
    let client = reqwest::Client::new();
    let request = body(json!(["first input", "second input", "third"]), json!({}));
    let response = within(
        client
            .post(format!("{}{PATH}", urls[1]))
            .json(&request)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    let answer: Value = within(response.json()).await??;
    assert_eq!(answer["data"].as_array().map(Vec::len), Some(3));
    let log = crate::fleet::decisions(&client, &urls[0]).await?;
    assert_eq!(log.iter().map(|d| d.worker).collect::<Vec<_>>(), [1, 1, 1]);
    let samples = crate::fleet::scrape_url(&client, &format!("{}/metrics", urls[1])).await?;
    assert_eq!(
        samples.get("vllm:prompt_tokens_total{model_name=\"mock-model\",engine=\"1\"}"),
        answer["usage"]["prompt_tokens"].as_f64().as_ref()
    );
    assert_eq!(
        samples.get("servesim_http_requests_total{endpoint=\"embeddings\"}"),
        Some(&1.0)
    );
    within(fleet.shutdown()).await?;
    Ok(())
}
