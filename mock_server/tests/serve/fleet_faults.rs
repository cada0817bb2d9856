//! Faults on fleet workers: `down` refuses connections, `503` answers OpenAI-shaped 503s,
//! `stalled` holds a request until the worker recovers, `slow:K` stretches token times K
//! times; the admin routes set and list them, `--worker-faults` switches them on schedule, and
//! the judge never names an unavailable worker as the best choice.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use mock_server::fleet::{launch, RunningFleet};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::common::*;
use crate::fleet::{chat, decisions, fleet_config, refused, scrape_url};

/// A fleet of `workers` with an admin listener, fixed pass times and `extra` flags.
async fn fleet(workers: &str, fixed: &str, extra: &[&str]) -> Result<RunningFleet> {
    let mut flags = vec![
        "--workers",
        workers,
        "--port",
        "0",
        "--admin-port",
        "0",
        "--block-size",
        "16",
        "--fixed-latency",
        fixed,
    ];
    flags.extend_from_slice(extra);
    within(launch(fleet_config(&flags)?))
        .await?
        .map_err(Into::into)
}

/// `POST /fleet/workers/{i}/fault` with `body`; the status and the JSON answer.
async fn set(client: &reqwest::Client, admin: &str, i: usize, body: Value) -> Result<(u16, Value)> {
    let response = within(
        client
            .post(format!("{admin}/fleet/workers/{i}/fault"))
            .json(&body)
            .send(),
    )
    .await??;
    let status = response.status().as_u16();
    Ok((status, within(response.json::<Value>()).await??))
}

/// Every worker's state name, from `GET /fleet/workers`.
async fn states(client: &reqwest::Client, admin: &str) -> Result<Vec<String>> {
    let response = within(client.get(format!("{admin}/fleet/workers")).send()).await??;
    let body: Value = within(response.json()).await??;
    let workers = body["workers"].as_array().context("workers")?;
    Ok(workers
        .iter()
        .map(|w| w["state"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// A chat request's status and body (JSON, or the error's text), on a fresh connection.
async fn try_chat(url: &str, text: &str) -> Result<(u16, Value)> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let body = chat_body(
        &json!([user(text)]),
        json!({"max_tokens": 3, "ignore_eos": true}),
    );
    let response = within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await??;
    let status = response.status().as_u16();
    Ok((status, within(response.json::<Value>()).await??))
}

/// Time to the first token and the mean gap between tokens of a streamed answer of 5 tokens
/// from `url`.
async fn token_times(client: &reqwest::Client, url: &str) -> Result<(Duration, Duration)> {
    let body = chat_body(
        &json!([user("How slow is this worker?")]),
        json!({"max_tokens": 5, "ignore_eos": true, "stream": true}),
    );
    let t0 = Instant::now();
    let response = within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await??;
    let events = read_sse(response, t0).await?;
    let tokens: Vec<Duration> = events
        .iter()
        .filter(|(data, _)| {
            serde_json::from_str::<Value>(data).is_ok_and(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
            })
        })
        .map(|(_, at)| *at)
        .collect();
    if tokens.len() != 5 {
        bail!("expected 5 tokens, got {events:?}");
    }
    let gaps = (tokens[4] - tokens[0]) / 4;
    Ok((tokens[0], gaps))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_worker_state_shows_on_the_wire() -> Result<()> {
    let fleet = fleet("3", "100,40", &[]).await?;
    let admin = fleet_admin(&fleet)?;
    let urls = fleet_worker_urls(&fleet);
    let client = reqwest::Client::new();
    assert_eq!(states(&client, &admin).await?, ["ok", "ok", "ok"]);

    // 503: OpenAI-shaped, and /health says so.
    let (status, entry) = set(&client, &admin, 1, json!({"state": "503"})).await?;
    assert_eq!((status, entry["state"].as_str()), (200, Some("503")));
    let (status, body) = try_chat(&urls[1], "hello").await?;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["code"], "service_unavailable", "{body}");
    let health = within(client.get(format!("{}/health", urls[1])).send()).await??;
    assert_eq!(health.status(), 503);
    // The other workers are untouched.
    assert_eq!(try_chat(&urls[0], "hello").await?.0, 200);

    // down: the connection is refused, /health too.
    set(&client, &admin, 1, json!({"state": "down"})).await?;
    assert_eq!(states(&client, &admin).await?, ["ok", "down", "ok"]);
    let mut refused_once = false;
    for _ in 0..100 {
        let fresh = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()?;
        match within(fresh.get(format!("{}/health", urls[1])).send()).await? {
            Err(e) if e.is_connect() || e.is_request() => {
                refused_once = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(refused_once, "a down worker still accepted connections");
    assert!(try_chat(&urls[1], "hello").await.is_err());

    // ok again: the same address serves.
    set(&client, &admin, 1, json!({"state": "ok"})).await?;
    let mut back = false;
    for _ in 0..100 {
        if let Ok((200, _)) = try_chat(&urls[1], "hello again").await {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "worker 1 never came back");

    // stalled: /health answers, a request waits until the worker recovers.
    set(&client, &admin, 2, json!({"state": "stalled"})).await?;
    let url = urls[2].clone();
    let mut held = tokio::spawn(async move { try_chat(&url, "held").await });
    assert!(
        tokio::time::timeout(Duration::from_millis(600), &mut held)
            .await
            .is_err(),
        "a stalled worker answered"
    );
    let health = within(client.get(format!("{}/health", urls[2])).send()).await??;
    assert_eq!(health.status(), 200);
    set(&client, &admin, 2, json!({"state": "ok"})).await?;
    let (status, answer) = within(held).await???;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 3);

    // slow:3: time to first token and inter-token gaps about 3 times worker 0's.
    let (ttft, itl) = token_times(&client, &urls[0]).await?;
    set(&client, &admin, 0, json!({"state": "slow", "factor": 3})).await?;
    let (slow_ttft, slow_itl) = token_times(&client, &urls[0]).await?;
    let ratio = |slow: Duration, plain: Duration| slow.as_secs_f64() / plain.as_secs_f64();
    assert!(
        (2.0..6.0).contains(&ratio(slow_ttft, ttft)),
        "TTFT {ttft:?} then {slow_ttft:?}"
    );
    assert!(
        (2.0..6.0).contains(&ratio(slow_itl, itl)),
        "ITL {itl:?} then {slow_itl:?}"
    );
    let listed = within(client.get(format!("{admin}/fleet/workers")).send()).await??;
    let listed: Value = within(listed.json()).await??;
    assert_eq!(listed["workers"][0]["factor"], 3.0, "{listed}");

    // Bad requests are OpenAI-shaped 400s.
    for (i, body, wanted) in [
        (0, json!({"state": "explode"}), "unknown worker state"),
        (0, json!({"state": "slow"}), "needs a factor"),
        (0, json!({"state": "slow", "factor": 0.5}), "between 1 and"),
        (0, json!({"stat": "ok"}), "expected"),
        (7, json!({"state": "ok"}), "no worker"),
    ] {
        let (status, error) = set(&client, &admin, i, body).await?;
        assert_eq!(status, 400, "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(wanted), "{error}");
    }

    // What was applied and met is counted.
    let samples = scrape_url(&client, &format!("{admin}/metrics")).await?;
    let count = |name: &str, worker: u32, state: &str| {
        samples
            .get(&format!(
                "{name}_total{{worker=\"{worker}\",state=\"{state}\"}}"
            ))
            .copied()
    };
    assert_eq!(count("servesim_worker_fault_changes", 1, "down"), Some(1.0));
    assert_eq!(count("servesim_worker_fault_changes", 1, "ok"), Some(1.0));
    assert_eq!(
        count("servesim_worker_faulted_requests", 1, "503"),
        Some(1.0)
    );
    assert_eq!(
        count("servesim_worker_faulted_requests", 2, "stalled"),
        Some(1.0)
    );
    assert_eq!(
        count("servesim_worker_faulted_requests", 0, "slow"),
        Some(1.0)
    );
    fleet.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_switches_states_in_order() -> Result<()> {
    let fleet = fleet(
        "2",
        "1,1",
        &[
            "--worker-faults",
            "1=503@200ms..700ms,1=down@1200ms..1700ms,0=stalled@0ms..400ms",
        ],
    )
    .await?;
    let admin = fleet_admin(&fleet)?;
    let client = reqwest::Client::new();
    // Every distinct state each worker showed, in order, polled until both settle.
    let mut seen: [Vec<String>; 2] = [vec![], vec![]];
    let mut answers = vec![];
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let now = states(&client, &admin).await?;
        for (i, state) in now.iter().enumerate() {
            if seen[i].last() != Some(state) {
                seen[i].push(state.clone());
            }
        }
        // What worker 1 answers while the schedule says 503.
        if now[1] == "503" {
            answers.push(
                try_chat(&fleet.manifest.workers[1].url, "scheduled")
                    .await?
                    .0,
            );
        }
        if seen[1].len() >= 4 && now[1] == "ok" && now[0] == "ok" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let dedup = |v: &[String]| -> Vec<String> {
        let mut out: Vec<String> = vec![];
        for s in v {
            if out.last() != Some(s) {
                out.push(s.clone());
            }
        }
        out
    };
    assert_eq!(dedup(&seen[0]), ["stalled", "ok"]);
    let worker1 = dedup(&seen[1]);
    let tail: Vec<&str> = worker1
        .iter()
        .map(String::as_str)
        .skip_while(|s| *s == "ok")
        .collect();
    assert_eq!(tail, ["503", "ok", "down", "ok"], "{worker1:?}");
    assert!(answers.contains(&503), "{answers:?}");
    // Back up after its down window: it serves again.
    let mut back = false;
    for _ in 0..100 {
        if let Ok((200, _)) = try_chat(&fleet.manifest.workers[1].url, "back").await {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back);
    fleet.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_never_names_an_unavailable_worker_best() -> Result<()> {
    let fleet = fleet("2", "1,1", &["--speedup-ratio", "inf"]).await?;
    let admin = fleet_admin(&fleet)?;
    let client = reqwest::Client::new();
    let urls = fleet_worker_urls(&fleet);
    let first = format!("First: {}", long_question());
    let second = format!("Second: {}", long_question());
    // Worker 0 caches both prompts; while it is 503, worker 1 is the best choice there is.
    chat(&client, &urls[0], &first).await?;
    chat(&client, &urls[0], &second).await?;
    set(&client, &admin, 0, json!({"state": "503"})).await?;
    chat(&client, &urls[1], &first).await?;
    let log = decisions(&client, &admin).await?;
    let last = log.last().context("a decision")?;
    assert_eq!(
        (last.worker, last.best_worker, last.regret_tokens),
        (1, 1, 0),
        "{last:?}"
    );
    // Worker 0 up again: the same kind of choice is judged against its cache.
    set(&client, &admin, 0, json!({"state": "ok"})).await?;
    chat(&client, &urls[1], &second).await?;
    let log = decisions(&client, &admin).await?;
    let last = log.last().context("a decision")?;
    assert_eq!((last.worker, last.best_worker), (1, 0), "{last:?}");
    assert!(last.regret_tokens > 0, "{last:?}");
    fleet.shutdown().await;
    Ok(())
}

#[test]
fn a_bad_worker_fault_schedule_is_refused_naming_the_flag() {
    let error = refused(&["--workers", "2", "--worker-faults", "5=down@1s.."]);
    assert!(
        error.contains("--worker-faults") && error.contains("worker 5"),
        "{error}"
    );
    let error = refused(&["--workers", "2", "--worker-faults", "1=down@2s..1s"]);
    assert!(error.contains("--worker-faults"), "{error}");
}

/// Issue 43: `mockserve fleet --worker-faults '0=down@0s..1e19s'` printed its addresses, then
/// panicked adding the window's end to the clock. Every time is now at most 365 days.
#[tokio::test]
async fn a_fault_window_beyond_the_clock_is_refused_not_a_panic() -> Result<()> {
    let error = refused(&["--workers", "2", "--worker-faults", "0=down@0s..1e19s"]);
    assert!(
        error.contains("--worker-faults") && error.contains("365 days"),
        "{error}"
    );
    let output = within(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
            .args([
                "fleet",
                "--workers",
                "2",
                "--port",
                "0",
                "--worker-faults",
                "0=down@0s..1e19s",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing listens");
    assert!(
        stderr.contains("--worker-faults") && !stderr.contains("panicked"),
        "{stderr}"
    );
    // The latest time there is runs (its end never comes within the test).
    let fleet = fleet(
        "2",
        "1,1",
        &["--worker-faults", "0=503@0s..31536000s,1=down@31536000s.."],
    )
    .await?;
    let admin = fleet_admin(&fleet)?;
    let client = reqwest::Client::new();
    let mut now = Vec::new();
    for _ in 0..100 {
        now = states(&client, &admin).await?;
        if now == ["503", "ok"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(now, ["503", "ok"]);
    fleet.shutdown().await;
    Ok(())
}

/// The answer to `method path` on `url` with `body`, and `Authorization: Bearer key` when a
/// key is given: the status and the body as JSON (null when it is not JSON).
async fn call(
    client: &reqwest::Client,
    (method, url): (reqwest::Method, String),
    key: Option<&str>,
    body: Option<Vec<u8>>,
) -> Result<(u16, Value)> {
    let mut request = client.request(method, url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let response = within(request.send()).await??;
    let status = response.status().as_u16();
    let text = within(response.text()).await??;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// Issue 43: without a key, `POST /fleet/workers/1/fault {"state":"down"}` took a worker down,
/// and the decisions, restart and metrics routes answered. With `--api-key`, every admin route
/// and every worker's `/fleet/*` routes answer an OpenAI-shaped 401 without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_guards_every_admin_route() -> Result<()> {
    use reqwest::Method;
    let fleet = fleet(
        "2",
        "1,1",
        &[
            "--speedup-ratio",
            "inf",
            "--api-key",
            "sekret",
            "--kv-events-endpoint",
            "tcp://*:0",
        ],
    )
    .await?;
    let admin = fleet_admin(&fleet)?;
    let urls = fleet_worker_urls(&fleet);
    let client = reqwest::Client::new();
    let down = || Some(br#"{"state":"down"}"#.to_vec());
    // The workers' routes first: worker 1 goes down (with the key) further on.
    let mut guarded = Vec::new();
    for url in &urls {
        for route in ["decisions", "manifest", "workers"] {
            guarded.push((Method::GET, format!("{url}/fleet/{route}"), None));
        }
    }
    guarded.extend([
        (Method::GET, format!("{admin}/metrics"), None),
        (Method::GET, format!("{admin}/health"), None),
        (Method::GET, format!("{admin}/fleet/decisions"), None),
        (Method::GET, format!("{admin}/fleet/manifest"), None),
        (Method::GET, format!("{admin}/fleet/workers"), None),
        (
            Method::POST,
            format!("{admin}/fleet/workers/1/fault"),
            down(),
        ),
        (
            Method::POST,
            format!("{admin}/fleet/workers/1/kv-events/restart"),
            None,
        ),
        (Method::GET, format!("{admin}/no/such/route"), None),
    ]);
    for (method, url, body) in &guarded {
        for key in [None, Some("wrong")] {
            let route = (method.clone(), url.clone());
            let (status, error) = call(&client, route, key, body.clone()).await?;
            assert_eq!(status, 401, "{method} {url} {key:?}: {error}");
            assert_eq!(error["error"]["code"], "invalid_api_key", "{url}: {error}");
            assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        }
    }
    assert_eq!(states_with_key(&client, &admin).await?, ["ok", "ok"]);
    // With the key, each answers.
    for (method, url, body) in &guarded {
        let route = (method.clone(), url.clone());
        let (status, answer) = call(&client, route, Some("sekret"), body.clone()).await?;
        let wanted = if url.ends_with("/no/such/route") {
            404
        } else {
            200
        };
        assert_eq!(status, wanted, "{method} {url}: {answer}");
    }
    assert_eq!(states_with_key(&client, &admin).await?, ["ok", "down"]);
    // A worker's own API stays as `serve`'s: `/health` open, `/v1` behind the key.
    let health = within(client.get(format!("{}/health", urls[0])).send()).await??;
    assert_eq!(health.status(), 200);
    fleet.shutdown().await;
    Ok(())
}

/// Every worker's state name, asked with the key `sekret`.
async fn states_with_key(client: &reqwest::Client, admin: &str) -> Result<Vec<String>> {
    let route = (reqwest::Method::GET, format!("{admin}/fleet/workers"));
    let (status, body) = call(client, route, Some("sekret"), None).await?;
    assert_eq!(status, 200, "{body}");
    let workers = body["workers"].as_array().context("workers")?;
    Ok(workers
        .iter()
        .map(|w| w["state"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Issue 43: admin indexes like `+1` or 5,000 zeros were accepted, the admin listener's 413
/// was plain text, and an unknown state echoed a 2 MB value. Indexes are canonical decimals
/// in range, every refusal is OpenAI-shaped, and no message quotes more than a short prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_requests_are_checked_and_answered_in_short() -> Result<()> {
    use reqwest::Method;
    let fleet = fleet("2", "1,1", &["--speedup-ratio", "inf"]).await?;
    let admin = fleet_admin(&fleet)?;
    let client = reqwest::Client::new();
    let down = br#"{"state":"down"}"#.to_vec();
    let zeros = format!("{}1", "0".repeat(5000));
    for index in [
        "+1",
        "01",
        zeros.as_str(),
        "2",
        "-0",
        "1.0",
        "18446744073709551616",
    ] {
        for route in ["fault", "kv-events/restart"] {
            let url = format!("{admin}/fleet/workers/{index}/{route}");
            let (status, error) =
                call(&client, (Method::POST, url), None, Some(down.clone())).await?;
            assert_eq!(status, 400, "{index}: {error}");
            assert_eq!(error["error"]["code"], "worker_not_found", "{error}");
            let message = error["error"]["message"].as_str().unwrap_or_default();
            assert!(message.len() < 300, "{} bytes", message.len());
        }
    }
    assert_eq!(states(&client, &admin).await?, ["ok", "ok"]);
    // A body over the admin cap: a 413 in OpenAI shape.
    let big = format!(r#"{{"state":"{}"}}"#, "x".repeat(2 << 20)).into_bytes();
    let url = format!("{admin}/fleet/workers/1/fault");
    let (status, error) = call(&client, (Method::POST, url.clone()), None, Some(big)).await?;
    assert_eq!(status, 413, "{error}");
    assert_eq!(error["error"]["code"], "request_too_large", "{error}");
    assert!(error["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("4096 bytes")));
    // An unknown state within the cap: named by a short prefix only.
    for body in [
        format!(r#"{{"state":"{}"}}"#, "x".repeat(4000)),
        format!(r#"{{"state":"down","{}":1}}"#, "k".repeat(4000)),
        format!(r#"{{"state":"slow","factor":"{}"}}"#, "9".repeat(4000)),
    ] {
        let route = (Method::POST, url.clone());
        let (status, error) = call(&client, route, None, Some(body.into_bytes())).await?;
        assert_eq!(status, 400, "{error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(message.len() < 400, "{} bytes: {message}", message.len());
    }
    // A long unknown route is named by a prefix.
    let long = format!("{admin}/{}", "r".repeat(20_000));
    let (status, error) = call(&client, (Method::GET, long), None, None).await?;
    assert_eq!(status, 404, "{error}");
    let message = error["error"]["message"].as_str().unwrap_or_default();
    assert!(message.len() < 400, "{} bytes", message.len());
    assert_eq!(states(&client, &admin).await?, ["ok", "ok"]);
    fleet.shutdown().await;
    Ok(())
}
