//! `mockserve fleet --elastic`: scaling through `PUT /fleet/scale`, a provisioned worker that
//! answers only once loaded, a drain that loses no request of a client following the discovery
//! file, a drained worker's KV lost, the replica gauges, and bad flags and bodies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use mock_server::fleet::{launch, RunningFleet};
use serde_json::{json, Value};

use crate::common::*;
use crate::fleet::{fleet_config, refused, scrape_url};

/// An elastic fleet with an admin listener, fixed pass times and `extra` flags.
async fn elastic(min: &str, max: &str, extra: &[&str]) -> Result<RunningFleet> {
    let mut flags = vec![
        "--elastic",
        "--min-workers",
        min,
        "--max-workers",
        max,
        "--port",
        "0",
        "--admin-port",
        "0",
        "--block-size",
        "16",
    ];
    flags.extend_from_slice(extra);
    within(launch(fleet_config(&flags)?))
        .await?
        .map_err(Into::into)
}

fn admin(fleet: &RunningFleet) -> Result<String> {
    fleet.manifest.admin_url.clone().context("admin url")
}

/// `PUT /fleet/scale` with `body`: the status and the JSON answer.
async fn put_scale(client: &reqwest::Client, admin: &str, body: &str) -> Result<(u16, Value)> {
    let response = within(
        client
            .put(format!("{admin}/fleet/scale"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send(),
    )
    .await??;
    let status = response.status().as_u16();
    Ok((status, within(response.json::<Value>()).await??))
}

fn scale_to(n: usize) -> String {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale", "spec": {"replicas": n}}).to_string()
}

/// `GET url`: status and body text.
async fn get(client: &reqwest::Client, url: &str) -> Result<(u16, String)> {
    let response = within(client.get(url).send()).await??;
    let status = response.status().as_u16();
    Ok((status, within(response.text()).await??))
}

/// Polls until `check` holds (every 20 ms, at most 20 s).
async fn until<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    for _ in 0..1000 {
        if check().await? {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("{what}: not within 20 s")
}

/// The URLs of the discovery file's endpoints, by name order.
fn discovered(path: &std::path::Path) -> Result<Vec<String>> {
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    file["endpoints"]
        .as_array()
        .context("endpoints")?
        .iter()
        .map(|e| {
            let (a, p) = (e["address"].as_str(), e["port"].as_str());
            Ok(format!(
                "http://{}:{}",
                a.context("address")?,
                p.context("port")?
            ))
        })
        .collect()
}

fn scratch_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "mockserve-elastic-{name}-{}.json",
        std::process::id()
    ))
}

/// A chat completion of `max_tokens` tokens: status and JSON body.
async fn chat_at(
    client: &reqwest::Client,
    url: &str,
    text: &str,
    max_tokens: u32,
) -> Result<(u16, Value)> {
    let body = chat_body(
        &json!([user(text)]),
        json!({"max_tokens": max_tokens, "ignore_eos": true}),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provisioned_worker_answers_once_its_model_has_loaded() -> Result<()> {
    let discovery = scratch_file("up-discovery");
    let manifest = scratch_file("up-manifest");
    let fleet = elastic(
        "1",
        "3",
        &[
            "--speedup-ratio",
            "inf",
            "--model-load",
            "400ms",
            "--model-load-jitter",
            "0s",
            "--discovery-file",
            discovery.to_str().context("utf-8")?,
            "--fleet-manifest",
            manifest.to_str().context("utf-8")?,
        ],
    )
    .await?;
    let admin = admin(&fleet)?;
    let client = reqwest::Client::new();
    let urls: Vec<String> = fleet
        .manifest
        .workers
        .iter()
        .map(|w| w.url.clone())
        .collect();
    assert_eq!(urls.len(), 3, "a listener per slot");
    assert_eq!(discovered(&discovery)?, vec![urls[0].clone()]);
    // An absent slot refuses connections.
    assert!(client
        .get(format!("{}/health", urls[1]))
        .send()
        .await
        .is_err());

    let (status, scale) = put_scale(&client, &admin, &scale_to(2)).await?;
    assert_eq!(status, 200, "{scale}");
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["replicas"], 2);
    assert_eq!(scale["status"]["readyReplicas"], 1);
    assert_eq!(scale["status"]["loadingReplicas"], 1);
    assert_eq!(scale["status"]["workers"][1]["phase"], "loading");
    // Loading: the endpoint listens but is not ready, and is not yet discovered.
    let (status, body) = get(&client, &format!("{}/health", urls[1])).await?;
    assert_eq!((status, body.as_str()), (503, r#"{"status":"loading"}"#));
    let (status, answer) = chat_at(&client, &urls[1], "hello", 3).await?;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "model_loading");
    assert_eq!(discovered(&discovery)?.len(), 1);
    let metrics = scrape_url(&client, &format!("{admin}/metrics")).await?;
    assert_eq!(metrics.get("servesim_fleet_desired_replicas"), Some(&2.0));
    assert_eq!(metrics.get("servesim_fleet_loading_replicas"), Some(&1.0));

    until("worker 1 ready", || {
        let (client, url) = (client.clone(), urls[1].clone());
        async move { Ok(get(&client, &format!("{url}/health")).await?.0 == 200) }
    })
    .await?;
    assert_eq!(discovered(&discovery)?, urls[..2].to_vec());
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&manifest)?)?;
    assert_eq!(written["workers"].as_array().map(Vec::len), Some(2));
    let (status, answer) = chat_at(&client, &urls[1], "hello", 3).await?;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 3);
    let (status, text) = get(&client, &format!("{admin}/fleet/scale")).await?;
    assert_eq!(status, 200);
    let scale: Value = serde_json::from_str(&text)?;
    assert_eq!(scale["status"]["readyReplicas"], 2);
    let metrics = scrape_url(&client, &format!("{admin}/metrics")).await?;
    assert_eq!(metrics.get("servesim_fleet_ready_replicas"), Some(&2.0));
    assert_eq!(metrics.get("servesim_fleet_loading_replicas"), Some(&0.0));
    assert_eq!(
        metrics.get("servesim_fleet_scale_requests_total"),
        Some(&1.0)
    );
    // Opening and closing slots is no fault.
    let faults: Vec<_> = metrics
        .iter()
        .filter(|(k, v)| k.starts_with("servesim_worker_fault_changes") && **v != 0.0)
        .collect();
    assert!(faults.is_empty(), "{faults:?}");
    // A worker's own /metrics carries what autoscalers read, under vLLM's names.
    let own = get(&client, &format!("{}/metrics", urls[1])).await?.1;
    for name in [
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
    ] {
        ensure!(
            own.contains(name),
            "{name} missing from the worker's /metrics"
        );
    }
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&discovery);
    let _ = std::fs::remove_file(&manifest);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_down_loses_no_request_of_a_client_following_the_discovery_file() -> Result<()> {
    let discovery = scratch_file("down-discovery");
    let fleet = elastic(
        "1",
        "2",
        &[
            "--fixed-latency",
            "5,10",
            "--model-load",
            "0s",
            "--model-load-jitter",
            "0s",
            "--drain-grace",
            "300ms",
            "--discovery-file",
            discovery.to_str().context("utf-8")?,
        ],
    )
    .await?;
    let admin = admin(&fleet)?;
    let client = reqwest::Client::new();
    let urls: Vec<String> = fleet
        .manifest
        .workers
        .iter()
        .map(|w| w.url.clone())
        .collect();
    let (status, _) = put_scale(&client, &admin, &scale_to(2)).await?;
    assert_eq!(status, 200);
    let path = discovery.clone();
    until("two workers discovered", || {
        let path = path.clone();
        async move { Ok(discovered(&path)?.len() == 2) }
    })
    .await?;
    // Worker 1 warms its cache with a prompt.
    let warm = format!("warm {}", long_question());
    let (status, first) = chat_at(&client, &urls[1], &warm, 2).await?;
    assert_eq!(status, 200, "{first}");

    // A router of the test's own: each request goes to the next endpoint the discovery file
    // lists when it is sent.
    let sent = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..4 {
        let (client, path, sent, stop) = (
            client.clone(),
            discovery.clone(),
            sent.clone(),
            stop.clone(),
        );
        clients.spawn(async move {
            let mut failures = Vec::new();
            let mut done = 0usize;
            while !stop.is_cancelled() {
                let urls = discovered(&path)?;
                let n = sent.fetch_add(1, Ordering::SeqCst);
                let url = &urls[n % urls.len()];
                let (status, answer) =
                    chat_at(&client, url, &format!("client {c} request {n}"), 8).await?;
                if status != 200 || answer["usage"]["completion_tokens"] != 8 {
                    failures.push(format!("{url}: {status} {answer}"));
                }
                done += 1;
            }
            anyhow::Ok((done, failures))
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A long request in flight on worker 1 when its drain starts: 100 tokens, over 1 s.
    let long = tokio::spawn({
        let (client, url) = (client.clone(), urls[1].clone());
        async move { chat_at(&client, &url, "a long one", 100).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, scale) = put_scale(&client, &admin, &scale_to(1)).await?;
    assert_eq!(status, 200, "{scale}");
    assert_eq!(scale["status"]["drainingReplicas"], 1);
    assert_eq!(scale["status"]["workers"][1]["phase"], "draining");
    // Out of the discovery file at once; /health says so.
    assert_eq!(discovered(&discovery)?, vec![urls[0].clone()]);
    let (status, body) = get(&client, &format!("{}/health", urls[1])).await?;
    assert_eq!((status, body.as_str()), (503, r#"{"status":"draining"}"#));
    // After the grace, a new request straight to the draining worker is refused while the long
    // one still runs.
    tokio::time::sleep(Duration::from_millis(450)).await;
    ensure!(
        !long.is_finished(),
        "the long request ended before the check"
    );
    let (status, answer) = chat_at(&client, &urls[1], "too late", 2).await?;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "worker_draining");
    let (status, answer) = within(long).await???;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["usage"]["completion_tokens"], 100,
        "the in-flight request completed"
    );
    until("worker 1 gone", || {
        let client = client.clone();
        let url = urls[1].clone();
        async move { Ok(client.get(format!("{url}/health")).send().await.is_err()) }
    })
    .await?;
    stop.cancel();
    let mut total = 0;
    while let Some(result) = clients.join_next().await {
        let (done, failures) = result??;
        assert_eq!(failures, Vec::<String>::new());
        total += done;
    }
    ensure!(total >= 8, "only {total} requests ran");
    let (_, text) = get(&client, &format!("{admin}/fleet/scale")).await?;
    let scale: Value = serde_json::from_str(&text)?;
    assert_eq!(
        scale["status"]["workers"],
        json!([{"index": 0, "url": urls[0], "phase": "ready"}])
    );

    // Back up: the worker on slot 1 starts with an empty cache.
    let (status, _) = put_scale(&client, &admin, &scale_to(2)).await?;
    assert_eq!(status, 200);
    until("worker 1 back", || {
        let (client, url) = (client.clone(), urls[1].clone());
        async move {
            Ok(matches!(
                get(&client, &format!("{url}/health")).await,
                Ok((200, _))
            ))
        }
    })
    .await?;
    let (status, again) = chat_at(&client, &urls[1], &warm, 2).await?;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{again}"
    );
    fleet.shutdown().await;
    let _ = std::fs::remove_file(&discovery);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_scale_requests_get_openai_shaped_errors() -> Result<()> {
    let fleet = elastic("1", "3", &["--speedup-ratio", "inf", "--api-key", "k"]).await?;
    let admin = admin(&fleet)?;
    let client = reqwest::Client::new();
    // The key is required.
    let (status, body) = put_scale(&client, &admin, &scale_to(2)).await?;
    assert_eq!(status, 401, "{body}");
    let keyed = reqwest::Client::builder()
        .default_headers(
            [(
                reqwest::header::AUTHORIZATION,
                reqwest::header::HeaderValue::from_static("Bearer k"),
            )]
            .into_iter()
            .collect(),
        )
        .build()?;
    for (body, status, message, code) in [
        (
            scale_to(4),
            400,
            "spec.replicas 4 is outside this fleet's bounds: between 1 and 3 (--min-workers, \
             --max-workers)",
            "replicas_out_of_bounds",
        ),
        (
            scale_to(0),
            400,
            "spec.replicas 0 is outside this fleet's bounds: between 1 and 3 (--min-workers, \
             --max-workers)",
            "replicas_out_of_bounds",
        ),
        (
            r#"{"spec":{"replicas":-2}}"#.to_string(),
            400,
            "spec.replicas must be a whole number >= 0, got \"-2\"",
            "invalid_value",
        ),
    ] {
        let (got, answer) = put_scale(&keyed, &admin, &body).await?;
        assert_eq!(got, status, "{answer}");
        assert_eq!(answer["error"]["message"], message, "{answer}");
        assert_eq!(answer["error"]["type"], "invalid_request_error");
        if code != "invalid_value" {
            assert_eq!(answer["error"]["code"], code);
        }
        assert_eq!(answer["error"]["param"], "spec.replicas");
    }
    let (status, answer) = put_scale(&keyed, &admin, "garbage").await?;
    assert_eq!(status, 400);
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("The body is not JSON"), "{message}");
    // Nothing changed.
    let (_, text) = get(&keyed, &format!("{admin}/fleet/scale")).await?;
    let scale: Value = serde_json::from_str(&text)?;
    assert_eq!(scale["spec"]["replicas"], 1);
    let (status, text) = get(&keyed, &format!("{admin}/fleet/scale/prefill")).await?;
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("role_not_found"), "{text}");
    fleet.shutdown().await;

    // A fixed fleet says it cannot scale.
    let fixed = within(launch(fleet_config(&[
        "--workers",
        "1",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--speedup-ratio",
        "inf",
    ])?))
    .await??;
    let (status, answer) = put_scale(
        &client,
        &fixed.manifest.admin_url.clone().context("admin")?,
        &scale_to(1),
    )
    .await?;
    assert_eq!(status, 400);
    assert_eq!(answer["error"]["code"], "fleet_not_elastic");
    fixed.shutdown().await;
    Ok(())
}

#[test]
fn bad_elastic_flags_are_refused_naming_the_flag() {
    let base = ["--elastic", "--port", "0"];
    let with = |extra: &[&str]| {
        let mut flags = base.to_vec();
        flags.extend_from_slice(extra);
        refused(&flags)
    };
    assert_eq!(
        with(&["--min-workers", "4", "--max-workers", "2"]),
        "--min-workers 4 is above --max-workers 2"
    );
    assert_eq!(
        with(&["--max-workers", "2", "--model-load", "-1s"]),
        "--model-load: time \"-1s\" must be a finite duration >= 0"
    );
    assert_eq!(
        with(&["--max-workers", "2", "--model-load-jitter", "-30s"]),
        "--model-load-jitter: time \"-30s\" must be a finite duration >= 0"
    );
    assert_eq!(
        with(&["--max-workers", "2", "--drain-grace", "-1ms"]),
        "--drain-grace: time \"-1ms\" must be a finite duration >= 0"
    );
    let clap = with(&["--max-workers", "2", "--workers", "2"]);
    assert!(clap.contains("--workers"), "{clap}");
    assert_eq!(
        refused(&[
            "--elastic",
            "--max-workers",
            "3",
            "--listen",
            "127.0.0.1:0,127.0.0.1:0"
        ]),
        "--max-workers 3 but --listen gives 2 addresses: give one per slot"
    );
    let needs = refused(&["--workers", "2", "--min-workers", "1"]);
    assert!(needs.contains("--elastic"), "{needs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_file_that_cannot_be_written_stops_the_launch() -> Result<()> {
    let path = std::env::temp_dir().join("mockserve-elastic-no-such-dir/d.json");
    let config = fleet_config(&[
        "--elastic",
        "--max-workers",
        "2",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--discovery-file",
        path.to_str().context("utf-8")?,
    ])?;
    let error = within(launch(config)).await?.expect_err("no such folder");
    let message = error.to_string();
    ensure!(
        message.starts_with(&format!("--discovery-file {}: ", path.display())),
        "{message}"
    );
    Ok(())
}

/// An elastic fleet scaled by the external policy `command` every 100 ms (a chat first, so a
/// request is observed).
async fn autoscaled(command: &str, timeout: &str) -> Result<(RunningFleet, String)> {
    let policy = format!("external:{command}");
    let fleet = elastic(
        "1",
        "3",
        &[
            "--speedup-ratio",
            "inf",
            "--model-load",
            "0s",
            "--model-load-jitter",
            "0s",
            "--autoscale",
            &policy,
            "--autoscale-tick",
            "100ms",
            "--autoscale-timeout",
            timeout,
        ],
    )
    .await?;
    let admin = admin(&fleet)?;
    Ok((fleet, admin))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_policy_scales_the_live_fleet() -> Result<()> {
    // Answers 2 workers to every observation, after checking it is one JSON line with pools.
    let script = r#"while read line; do case "$line" in *'"pools"'*) echo '{"workers": 2}';; *) echo bad;; esac; done"#;
    let (fleet, admin) = autoscaled(script, "5s").await?;
    let client = reqwest::Client::new();
    let url = fleet.manifest.workers[0].url.clone();
    assert_eq!(chat_at(&client, &url, "hello", 2).await?.0, 200);
    until("two ready workers", || {
        let (client, admin) = (client.clone(), admin.clone());
        async move {
            let (_, text) = get(&client, &format!("{admin}/fleet/scale")).await?;
            let scale: Value = serde_json::from_str(&text)?;
            Ok(scale["status"]["readyReplicas"] == 2)
        }
    })
    .await?;
    let metrics = scrape_url(&client, &format!("{admin}/metrics")).await?;
    let decisions = metrics
        .get("servesim_fleet_autoscale_decisions_total")
        .copied()
        .unwrap_or_default();
    ensure!(decisions >= 1.0, "{metrics:?}");
    assert_eq!(metrics.get("servesim_fleet_desired_replicas"), Some(&2.0));
    fleet.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_policy_that_fails_holds_the_count() -> Result<()> {
    let client = reqwest::Client::new();
    // Garbage, a crash, and a hang past the timeout: each holds at the current count (1) while
    // the fleet serves.
    for script in ["while read line; do echo nope; done", "exit 3", "sleep 30"] {
        let (fleet, admin) = autoscaled(script, "200ms").await?;
        let url = fleet.manifest.workers[0].url.clone();
        for _ in 0..5 {
            assert_eq!(chat_at(&client, &url, "hello", 2).await?.0, 200, "{script}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let metrics = scrape_url(&client, &format!("{admin}/metrics")).await?;
        assert_eq!(
            metrics.get("servesim_fleet_autoscale_decisions_total"),
            Some(&0.0),
            "{script}"
        );
        let (_, text) = get(&client, &format!("{admin}/fleet/scale")).await?;
        let scale: Value = serde_json::from_str(&text)?;
        assert_eq!(scale["spec"]["replicas"], 1, "{script}");
        within(fleet.shutdown()).await?;
    }
    Ok(())
}

#[test]
fn bad_autoscale_flags_are_refused() {
    let bad = refused(&["--elastic", "--max-workers", "2", "--autoscale", "hpa"]);
    assert!(bad.contains("unknown autoscale policy \"hpa\""), "{bad}");
    assert_eq!(
        refused(&["--elastic", "--max-workers", "2", "--autoscale-tick", "0s"]),
        "--autoscale-tick: the tick must be above 0"
    );
    assert_eq!(
        refused(&[
            "--elastic",
            "--max-workers",
            "2",
            "--autoscale-timeout",
            "-1s"
        ]),
        "--autoscale-timeout: time \"-1s\" must be a finite duration >= 0"
    );
}
