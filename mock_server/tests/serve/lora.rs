//! LoRA adapters as extra model names, runtime loading, `vllm:lora_requests_info`, the loading
//! delay, and the startup errors of the vLLM-worker flags (through the binary).

use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use serde_json::{json, Value};
use tokio::time::timeout;
use tower::ServiceExt;

use crate::common::*;

fn lora_config() -> mock_server::config::ServerConfig {
    let mut cfg = config(Some((2.0, 1.0)));
    cfg.lora_modules = vec![("ad1".into(), "/adapters/ad1".into())];
    cfg.max_loras = 2;
    cfg
}

async fn text_post(state: &AppState, path: &str, body: &Value) -> Result<(StatusCode, String)> {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))?;
    let response = within(app(state.clone()).oneshot(request)).await??;
    let status = response.status();
    let bytes = within(response.into_body().collect()).await??.to_bytes();
    Ok((status, String::from_utf8(bytes.to_vec())?))
}

fn cached(body: &Value) -> u64 {
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(u64::MAX)
}

#[tokio::test]
async fn adapters_are_served_and_never_share_blocks_with_the_base_model() -> Result<()> {
    let server = TestServer::start(lora_config()).await?;
    let q = long_question();
    let ask =
        |model: &str| json!({"model": model, "messages": [user(&q)], "max_tokens": 3}).to_string();
    let (s, _, base) = post_json(&server, ask("mock-model")).await?;
    assert_eq!(s, StatusCode::OK);
    let (s, _, first) = post_json(&server, ask("ad1")).await?;
    assert_eq!(s, StatusCode::OK, "{first}");
    assert_eq!(first["model"], "ad1");
    assert_eq!(
        cached(&first),
        0,
        "an adapter never reuses base-model blocks"
    );
    let (s, _, again) = post_json(&server, ask("ad1")).await?;
    assert_eq!(s, StatusCode::OK);
    assert!(cached(&again) > 0, "its own blocks are reused: {again}");
    assert_eq!(cached(&again), cached(&ask_base_again(&server, &q).await?));
    assert!(cached(&base) == 0);

    let models: Value = server
        .client
        .get(format!("{}/v1/models", server.base))
        .send()
        .await?
        .json()
        .await?;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .context("data")?
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["mock-model", "ad1"]);
    assert_eq!(models["data"][1]["parent"], "mock-model");
    assert_eq!(models["data"][1]["root"], "/adapters/ad1");

    let m = server.scrape().await?;
    assert_eq!(
        m.get("servesim_lora_requests_total{adapter=\"ad1\"}"),
        Some(&2.0)
    );
    let info = m
        .iter()
        .find(|(k, _)| k.starts_with("vllm:lora_requests_info{"))
        .context("vllm:lora_requests_info")?;
    assert!(
        info.0.contains("running_lora_adapters=\"\"")
            && info.0.contains("waiting_lora_adapters=\"\"")
            && info.0.contains("max_lora=\"2\""),
        "{info:?}"
    );
    assert!(*info.1 > 1.0e9, "the Unix time of the update");
    Ok(())
}

async fn ask_base_again(server: &TestServer, q: &str) -> Result<Value> {
    let body = json!({"model": "mock-model", "messages": [user(q)], "max_tokens": 3});
    let (s, _, b) = post_json(server, body.to_string()).await?;
    assert_eq!(s, StatusCode::OK);
    Ok(b)
}

#[tokio::test]
async fn adapters_load_and_unload_at_run_time() -> Result<()> {
    let state = AppState::new(lora_config())?;
    let load = |name: &str| json!({"lora_name": name, "lora_path": format!("/a/{name}")});
    let (status, text) = text_post(&state, "/v1/load_lora_adapter", &load("ad2")).await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, "Success: LoRA adapter 'ad2' added successfully.");
    let chat = json!({"model": "ad2", "messages": [user("hi")], "max_tokens": 2});
    let (status, _) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(status, StatusCode::OK);
    for twice in ["ad1", "ad2", "mock-model"] {
        let (status, body) = post(&state, "/v1/load_lora_adapter", &load(twice)).await?;
        let e = error_of(status, &body, StatusCode::BAD_REQUEST)?;
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(twice)),
            "{body}"
        );
    }
    let (status, body) = post(&state, "/v1/load_lora_adapter", &json!({"lora_name": "x"})).await?;
    error_of(status, &body, StatusCode::BAD_REQUEST)?;
    let (status, text) = text_post(
        &state,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "ad2"}),
    )
    .await?;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(text, "Success: LoRA adapter 'ad2' removed successfully.");
    let (status, body) = post(
        &state,
        "/v1/unload_lora_adapter",
        &json!({"lora_name": "ad2"}),
    )
    .await?;
    let e = error_of(status, &body, StatusCode::BAD_REQUEST)?;
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains("ad2")),
        "{body}"
    );
    let (status, body) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(
        error_of(status, &body, StatusCode::NOT_FOUND)?["code"],
        "model_not_found"
    );
    Ok(())
}

#[tokio::test]
async fn the_server_reports_loading_during_the_startup_delay() -> Result<()> {
    let mut cfg = config(None);
    cfg.startup_delay = Duration::from_secs(3600);
    let state = AppState::new(cfg)?;
    let get = |path: &str| Request::get(path).body(Body::empty());
    let (status, body) = oneshot_raw(&state, get("/health")?).await?;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, json!({"status": "loading"}));
    let response = within(app(state.clone()).oneshot(get("/ping")?)).await??;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let chat = json!({"model": "mock-model", "messages": [user("hi")], "max_tokens": 2});
    let (status, body) = post(&state, "/v1/chat/completions", &chat).await?;
    assert_eq!(
        error_of(status, &body, StatusCode::SERVICE_UNAVAILABLE)?["code"],
        "model_loading"
    );
    // Without a delay the server is ready at once.
    let state = AppState::new(config(None))?;
    let (status, _) = oneshot_raw(&state, get("/health")?).await?;
    assert_eq!(status, StatusCode::OK);
    Ok(())
}

/// Runs the binary with `args` and returns its exit success and stderr.
async fn run_binary(args: &[&str]) -> Result<(bool, String)> {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let output = timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("the binary did not exit")??;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn bad_vllm_worker_flags_are_clear_startup_errors() -> Result<()> {
    let base = ["--port", "0", "--speedup-ratio", "inf"];
    let held = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = held.local_addr()?.port();
    let in_use = format!("tcp://*:{port}");
    for (extra, needle) in [
        (
            vec!["--kv-events-endpoint", "5557"],
            "--kv-events-endpoint: invalid KV events endpoint \"5557\"",
        ),
        (
            vec!["--kv-events-endpoint", "tcp://*:notaport"],
            "the port must be a number",
        ),
        (
            vec!["--kv-events-endpoint", in_use.as_str()],
            "worker 0 cannot bind 0.0.0.0:",
        ),
        (
            vec!["--lora-modules", "mock-model"],
            "is the base model's name",
        ),
        (vec!["--lora-modules", "a,a"], "is given twice"),
        (vec!["--startup-delay=-1"], "--startup-delay"),
    ] {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra.iter().copied());
        let (ok, stderr) = run_binary(&args).await?;
        assert!(!ok, "{args:?} must fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    drop(held);
    Ok(())
}

/// `/metrics` of `state`, as text.
async fn metrics_text(state: &AppState) -> Result<String> {
    let request = Request::get("/metrics").body(Body::empty())?;
    let response = within(app(state.clone()).oneshot(request)).await??;
    let bytes = within(response.into_body().collect()).await??.to_bytes();
    Ok(String::from_utf8(bytes.to_vec())?)
}

/// Issue 43: an unloaded adapter's series leaves `/metrics`, at most `MAX_LORA_ADAPTERS` are
/// loaded at once, and names and paths are bounded (so no error echoes a long one).
#[tokio::test]
async fn unloaded_adapters_leave_the_metrics_and_their_number_is_capped() -> Result<()> {
    use mock_server::api::lora::{MAX_LORA_ADAPTERS, MAX_LORA_NAME_BYTES, MAX_LORA_PATH_BYTES};
    let state = AppState::new(lora_config())?;
    let load = |name: &str| json!({"lora_name": name, "lora_path": "/a"});
    let series = |name: &str| format!("servesim_lora_requests_total{{adapter=\"{name}\"}}");
    for name in ["gone1", "gone2", "kept"] {
        let (status, _) = text_post(&state, "/v1/load_lora_adapter", &load(name)).await?;
        assert_eq!(status, StatusCode::OK);
        let chat = json!({"model": name, "messages": [user("hi")], "max_tokens": 1});
        let (status, body) = post(&state, "/v1/chat/completions", &chat).await?;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let text = metrics_text(&state).await?;
    for name in ["gone1", "gone2", "kept"] {
        assert!(text.contains(&format!("{} 1", series(name))), "{text}");
    }
    for name in ["gone1", "gone2"] {
        let body = json!({"lora_name": name});
        let (status, _) = text_post(&state, "/v1/unload_lora_adapter", &body).await?;
        assert_eq!(status, StatusCode::OK);
    }
    let text = metrics_text(&state).await?;
    assert!(!text.contains("gone1") && !text.contains("gone2"), "{text}");
    assert!(text.contains(&format!("{} 1", series("kept"))), "{text}");

    // ad1 (from the flags) and kept are loaded: fill the registry to its cap.
    for i in 2..MAX_LORA_ADAPTERS {
        let (status, text) =
            text_post(&state, "/v1/load_lora_adapter", &load(&format!("a{i}"))).await?;
        assert_eq!(status, StatusCode::OK, "{text}");
    }
    let (status, body) = post(&state, "/v1/load_lora_adapter", &load("one-more")).await?;
    let e = error_of(status, &body, StatusCode::BAD_REQUEST)?;
    assert_eq!(e["code"], "request_too_large", "{body}");
    assert_eq!(e["param"], "lora_name", "{body}");
    let unload = json!({"lora_name": "a2"});
    let (status, _) = text_post(&state, "/v1/unload_lora_adapter", &unload).await?;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = text_post(&state, "/v1/load_lora_adapter", &load("one-more")).await?;
    assert_eq!(status, StatusCode::OK);

    // Names and paths past their caps: a 400 that does not echo them.
    let long_name = "n".repeat(MAX_LORA_NAME_BYTES + 1);
    let long_path = json!({"lora_name": "p", "lora_path": "/".repeat(MAX_LORA_PATH_BYTES + 1)});
    for (body, param) in [
        (load(&long_name), "lora_name"),
        (json!({"lora_name": long_name}), "lora_name"),
        (long_path, "lora_path"),
    ] {
        for route in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"] {
            if param == "lora_path" && route.contains("unload") {
                continue;
            }
            let (status, b) = post(&state, route, &body).await?;
            let e = error_of(status, &b, StatusCode::BAD_REQUEST)?;
            assert_eq!(e["param"], param, "{b}");
            assert!(b.to_string().len() < 400, "{b}");
        }
    }
    Ok(())
}
