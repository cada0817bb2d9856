//! The routing judge scored against a router of the test's own: four workers, four prompt
//! families, and a fixed choice of worker per request, so the test knows what each worker holds
//! at every arrival and checks every decision and the judge's sums and hit rates exactly.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use axum::body::Bytes;
use clap::Parser;
use mock_server::fleet::judge::Decision;
use mock_server::fleet::{launch, FleetConfig, RunningFleet};
use mock_server::kv_events::END_OF_REPLAY;
use mock_server::{Cli, Command};
use serde_json::{json, Value};

use crate::common::*;

/// Tokens per block of the fleet.
const BLOCK: usize = 16;

/// The prompt of family `f`: its first words are its own, so no two families share a block.
fn family(f: usize) -> String {
    (0..40)
        .map(|i| format!("family{f}word{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The test's router: the worker of request `k` (of family `k % 4`), a fixed mix of hits,
/// misses and requests sent away from the worker that holds the prompt.
fn route(k: usize) -> usize {
    [
        0, 1, 2, 3, 0, 2, 2, 1, 3, 3, 0, 0, 1, 1, 2, 3, 0, 1, 2, 3, 2, 0, 3, 1,
    ][k]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_judge_scores_a_known_router_exactly() -> Result<()> {
    score_a_known_router(&[]).await
}

/// The same with KV events published at once (no fault, no lag): what the events announced is
/// the truth at every arrival of a sequential workload, so no decision is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_without_faults_leave_no_decision_stale() -> Result<()> {
    score_a_known_router(&["--kv-events-endpoint", "tcp://*:0"]).await
}

/// A fleet of `workers` workers on free ports with an admin listener, blocks of 16 tokens,
/// `extra` flags added (`--speedup-ratio inf` unless they give one).
async fn fleet_with(workers: usize, extra: &[&str]) -> Result<RunningFleet> {
    let workers = workers.to_string();
    let mut argv = vec![
        "mockserve",
        "fleet",
        "--workers",
        &workers,
        "--port",
        "0",
        "--admin-port",
        "0",
        "--block-size",
        "16",
    ];
    if !extra.contains(&"--speedup-ratio") {
        argv.extend(["--speedup-ratio", "inf"]);
    }
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv)?;
    let Some(Command::Fleet(args)) = cli.command else {
        bail!("expected fleet");
    };
    Ok(within(launch(FleetConfig::from_args(&args)?)).await??)
}

/// `GET /fleet/decisions`, parsed.
async fn decisions(client: &reqwest::Client, admin: &str) -> Result<Vec<Decision>> {
    let response = within(client.get(format!("{admin}/fleet/decisions")).send()).await??;
    within(response.text())
        .await??
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| l.to_string()))
        .collect()
}

/// The admin `/metrics`, parsed.
async fn admin_metrics(client: &reqwest::Client, admin: &str) -> Result<BTreeMap<String, f64>> {
    let response = within(client.get(format!("{admin}/metrics")).send()).await??;
    parse_exposition(&within(response.text()).await??)
}

async fn score_a_known_router(extra: &[&str]) -> Result<()> {
    let fleet = fleet_with(4, extra).await?;
    let events = !extra.is_empty();
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    // What the test knows: which worker holds which family (whole prompt blocks).
    let mut holds = [[false; 4]; 4];
    let mut expected = Vec::new();
    let mut prompt_tokens = [0usize; 4];
    for k in 0..24 {
        let (f, w) = (k % 4, route(k));
        let body = chat_body(
            &json!([user(&family(f))]),
            json!({"max_tokens": 2, "ignore_eos": true}),
        );
        let url = &fleet.manifest.workers[w].url;
        let response = within(
            client
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 200);
        let answer: Value = within(response.json()).await??;
        let tokens = answer["usage"]["prompt_tokens"]
            .as_u64()
            .context("prompt_tokens")? as usize;
        prompt_tokens[f] = tokens;
        let full = tokens / BLOCK * BLOCK;
        let chosen = if holds[w][f] { full } else { 0 };
        let best = if holds.iter().any(|h| h[f]) { full } else { 0 };
        // The reported hit is the chosen worker's cached prefix.
        let hit = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .context("cached_tokens")? as usize;
        assert!(hit <= chosen, "request {k}: {hit} cached of {chosen}");
        expected.push((w as u32, tokens, chosen, best, best - chosen));
        holds[w][f] = true;
    }
    let log = decisions(&client, &admin).await?;
    let got: Vec<(u32, usize, usize, usize, usize)> = log
        .iter()
        .map(|d| {
            (
                d.worker,
                d.prompt_tokens,
                d.chosen_overlap_tokens,
                d.best_overlap_tokens,
                d.regret_tokens,
            )
        })
        .collect();
    assert_eq!(got, expected);
    // Sequential requests: every worker idle at each arrival.
    assert!(
        log.iter().all(|d| (d.chosen_load, d.best_load) == (0, 0)),
        "{log:?}"
    );
    // With events, each announced prefix is the true one; without, none is given.
    for d in &log {
        let announced = (
            d.announced_chosen_overlap_tokens,
            d.announced_best_overlap_tokens,
        );
        if events {
            let truth = (Some(d.chosen_overlap_tokens), Some(d.best_overlap_tokens));
            assert_eq!(announced, truth, "{d:?}");
        } else {
            assert_eq!(announced, (None, None), "{d:?}");
        }
        assert!(!d.stale(), "{d:?}");
    }
    assert!(
        prompt_tokens.iter().all(|&t| t >= 2 * BLOCK),
        "{prompt_tokens:?}"
    );
    let sum = |i: usize| -> f64 {
        expected
            .iter()
            .map(|e| [e.1, e.2, e.3, e.4][i] as f64)
            .sum()
    };
    let (prompt, achieved, oracle, regret) = (sum(0), sum(1), sum(2), sum(3));
    // The router above gives up some hits: achieved below oracle, neither zero.
    assert!(0.0 < achieved && achieved < oracle, "{achieved} {oracle}");
    let samples = admin_metrics(&client, &admin).await?;
    let get = |name: &str| samples.get(name).copied();
    assert_eq!(get("servesim_routing_decisions_total"), Some(24.0));
    let stale = events.then_some(0.0);
    for kind in ["", "_evicted", "_missed"] {
        let name = format!("servesim_routing_stale{kind}_decisions_total");
        assert_eq!(get(&name), stale, "{name}");
    }
    assert_eq!(get("servesim_routing_prompt_tokens_total"), Some(prompt));
    assert_eq!(
        get("servesim_routing_achieved_hit_tokens_total"),
        Some(achieved)
    );
    assert_eq!(
        get("servesim_routing_oracle_hit_tokens_total"),
        Some(oracle)
    );
    assert_eq!(get("servesim_routing_regret_tokens_sum"), Some(regret));
    let best_choices = expected.iter().filter(|e| e.4 == 0).count() as f64;
    assert_eq!(
        get("servesim_routing_regret_tokens_bucket{le=\"0.0\"}"),
        Some(best_choices)
    );
    within(fleet.shutdown()).await?;
    Ok(())
}

/// A fleet endpoint's `POST /reset_prefix_cache` empties its own worker's cache only, as a vLLM
/// server resets its own engine: the judge then sees the prompt cached on the other worker
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_endpoint_resets_its_own_cache_only() -> Result<()> {
    let cli = Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--workers",
        "2",
        "--port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
    ])?;
    let Some(Command::Fleet(args)) = cli.command else {
        bail!("expected fleet");
    };
    let fleet = within(launch(FleetConfig::from_args(&args)?)).await??;
    let client = reqwest::Client::new();
    let urls = fleet_worker_urls(&fleet);
    let cached = |url: String| {
        let client = client.clone();
        async move {
            let body = chat_body(
                &json!([user(&family(0))]),
                json!({"max_tokens": 2, "ignore_eos": true}),
            );
            let response = within(
                client
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&body)
                    .send(),
            )
            .await??;
            let v: Value = within(response.json()).await??;
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .context("cached_tokens")
        }
    };
    for url in &urls {
        assert_eq!(cached(url.clone()).await?, 0);
    }
    let reset = within(
        client
            .post(format!("{}/reset_prefix_cache", urls[1]))
            .send(),
    )
    .await??;
    assert_eq!(reset.status(), 200);
    let answer: Value = within(reset.json()).await??;
    assert_eq!(answer, json!({"reset_workers": [1], "busy_workers": []}));
    assert!(
        cached(urls[0].clone()).await? > 0,
        "worker 0 kept its cache"
    );
    assert_eq!(cached(urls[1].clone()).await?, 0, "worker 1 forgot it");
    within(fleet.shutdown()).await?;
    Ok(())
}

/// Sends family `f`'s prompt to `url` and waits for the whole answer.
async fn ask(client: &reqwest::Client, url: &str, f: usize) -> Result<()> {
    let body = chat_body(
        &json!([user(&family(f))]),
        json!({"max_tokens": 2, "ignore_eos": true}),
    );
    let response = within(
        client
            .post(format!("{url}/v1/chat/completions"))
            .json(&body)
            .send(),
    )
    .await??;
    ensure!(response.status() == 200, "{}", response.status());
    within(response.bytes()).await??;
    Ok(())
}

/// Each decision's (stale_evicted, stale_missed).
fn stale_kinds(log: &[Decision]) -> Vec<(bool, bool)> {
    log.iter()
        .map(|d| (d.stale_evicted, d.stale_missed))
        .collect()
}

/// Without faults, a pass's KV events leave when the pass ends (as vLLM publishes at the end of
/// its engine step), while its blocks are cached from its start: a prompt sent to another worker
/// during worker 0's 3-second prefill of the same prompt finds the best worker's blocks not
/// announced yet (missed); after the pass, nothing is stale. That lag is the only source of
/// stale decisions without faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_faults_only_a_running_pass_makes_a_decision_stale() -> Result<()> {
    let fleet = fleet_with(
        2,
        &[
            "--kv-events-endpoint",
            "tcp://*:0",
            "--speedup-ratio",
            "1",
            "--fixed-latency",
            "3000,1",
        ],
    )
    .await?;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    let urls = fleet_worker_urls(&fleet);
    let first = tokio::spawn({
        let (client, url) = (client.clone(), urls[0].clone());
        async move { ask(&client, &url, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    ask(&client, &urls[1], 0).await?;
    within(first).await???;
    ask(&client, &urls[1], 0).await?;
    let log = decisions(&client, &admin).await?;
    assert_eq!(
        stale_kinds(&log),
        [(false, false), (false, true), (false, false)],
        "{log:?}"
    );
    assert_eq!(
        (log[1].best_worker, log[1].announced_best_overlap_tokens),
        (0, Some(0))
    );
    assert!(log[1].best_overlap_tokens >= 32, "{log:?}");
    within(fleet.shutdown()).await?;
    Ok(())
}

/// `delay=3000`: every batch leaves 3 s after its step. A prompt sent to another worker right
/// after the first cached it finds the events not announcing it yet (missed); once announced,
/// a prefix-cache reset of worker 0 is not, so a request sent there at once was chosen on
/// blocks already gone (evicted); once everything is announced, nothing is stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_events_make_decisions_stale_of_each_kind() -> Result<()> {
    let fleet = fleet_with(
        2,
        &[
            "--kv-events-endpoint",
            "tcp://*:0",
            "--kv-events-faults",
            "delay=3000",
        ],
    )
    .await?;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    let urls = fleet_worker_urls(&fleet);
    let settle = Duration::from_millis(4_500);
    ask(&client, &urls[0], 0).await?;
    ask(&client, &urls[1], 0).await?;
    tokio::time::sleep(settle).await;
    let reset = within(
        client
            .post(format!("{}/reset_prefix_cache", urls[0]))
            .send(),
    )
    .await??;
    assert_eq!(reset.status(), 200);
    ask(&client, &urls[0], 0).await?;
    tokio::time::sleep(settle).await;
    ask(&client, &urls[1], 0).await?;
    let log = decisions(&client, &admin).await?;
    assert_eq!(
        stale_kinds(&log),
        [(false, false), (false, true), (true, false), (false, false)],
        "{log:?}"
    );
    let full = log[1].best_overlap_tokens;
    assert!(full >= 32, "{log:?}");
    // Missed: worker 0 held the prompt, the events said nothing yet.
    assert_eq!(
        (log[1].best_worker, log[1].announced_best_overlap_tokens),
        (0, Some(0))
    );
    // Evicted: worker 0 was credited with the prompt it had just dropped.
    assert_eq!(
        (
            log[2].chosen_overlap_tokens,
            log[2].announced_chosen_overlap_tokens
        ),
        (0, Some(full))
    );
    let samples = admin_metrics(&client, &admin).await?;
    let get = |name: &str| samples.get(name).copied();
    assert_eq!(get("servesim_routing_stale_decisions_total"), Some(2.0));
    assert_eq!(
        get("servesim_routing_stale_evicted_decisions_total"),
        Some(1.0)
    );
    assert_eq!(
        get("servesim_routing_stale_missed_decisions_total"),
        Some(1.0)
    );
    within(fleet.shutdown()).await?;
    Ok(())
}

/// Asks the replay socket at `endpoint` for every batch from 0; the number served.
async fn replay_all(endpoint: &str) -> Result<usize> {
    use zeromq::{Socket, SocketRecv, SocketSend};
    let mut dealer = zeromq::DealerSocket::new();
    within(dealer.connect(endpoint)).await??;
    let start = Bytes::copy_from_slice(&0u64.to_be_bytes());
    let request =
        zeromq::ZmqMessage::try_from(vec![start]).map_err(|_| anyhow::anyhow!("empty message"))?;
    within(dealer.send(request)).await??;
    let mut served = 0;
    loop {
        let frames = within(dealer.recv()).await??.into_vec();
        ensure!(frames.len() == 2, "[seq, payload]: {frames:?}");
        if frames[0].as_ref() == END_OF_REPLAY {
            return Ok(served);
        }
        served += 1;
    }
}

/// `drop=1`: no batch is sent, so the prompt cached on worker 0 is missed by the decision that
/// follows; once a subscriber recovers worker 0's batches from its replay endpoint, the events
/// announce the truth again and the next decision is not stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_events_are_missed_until_replayed() -> Result<()> {
    let fleet = fleet_with(
        2,
        &[
            "--kv-events-endpoint",
            "tcp://*:0",
            "--kv-events-replay-endpoint",
            "tcp://*:0",
            "--kv-events-faults",
            "drop=1",
        ],
    )
    .await?;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    let workers = fleet.manifest.workers.clone();
    ask(&client, &workers[0].url, 0).await?;
    ask(&client, &workers[1].url, 0).await?;
    let replay = workers[0]
        .kv_events_replay_endpoint
        .clone()
        .context("a replay endpoint")?;
    let served = replay_all(&replay).await?;
    assert!(served >= 1, "{served} batches replayed");
    // Worker 1's batches stay lost, but worker 0 (the best, by index) is announced again.
    ask(&client, &workers[1].url, 0).await?;
    let log = decisions(&client, &admin).await?;
    assert_eq!(
        stale_kinds(&log),
        [(false, false), (false, true), (false, false)],
        "{log:?}"
    );
    assert_eq!(
        (log[2].best_worker, log[2].announced_best_overlap_tokens),
        (0, Some(log[2].best_overlap_tokens))
    );
    // Worker 1 held the prompt too, unannounced: a chosen worker's missing blocks are no
    // stale decision of their own (the best worker's are).
    assert_eq!(log[2].announced_chosen_overlap_tokens, Some(0));
    let samples = admin_metrics(&client, &admin).await?;
    assert_eq!(
        samples.get("servesim_routing_stale_decisions_total"),
        Some(&1.0)
    );
    within(fleet.shutdown()).await?;
    Ok(())
}

/// The sequence numbers a subscriber receives until `quiet` passes without a message.
async fn received_seqs(sub: &mut zeromq::SubSocket, quiet: Duration) -> Result<Vec<u64>> {
    use zeromq::SocketRecv;
    let mut seqs = Vec::new();
    while let Ok(message) = tokio::time::timeout(quiet, sub.recv()).await {
        let frames = message?.into_vec();
        ensure!(frames.len() == 3, "[topic, seq, payload]: {frames:?}");
        seqs.push(u64::from_be_bytes(<[u8; 8]>::try_from(frames[1].as_ref())?));
    }
    Ok(seqs)
}

/// `POST /fleet/workers/{i}/kv-events/restart`: worker i's publisher starts over as a restarted
/// vLLM engine's does: its replay buffer is empty at once, its next batch is numbered 0, and the
/// restart is counted; an unknown worker, or a fleet without KV events, is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restarts_on_demand() -> Result<()> {
    use zeromq::Socket;
    let fleet = fleet_with(
        2,
        &[
            "--kv-events-endpoint",
            "tcp://*:0",
            "--kv-events-replay-endpoint",
            "tcp://*:0",
        ],
    )
    .await?;
    let client = reqwest::Client::new();
    let admin = fleet_admin(&fleet)?;
    let worker = fleet.manifest.workers[0].clone();
    let publish = worker.kv_events_endpoint.clone().context("an endpoint")?;
    let replay = worker
        .kv_events_replay_endpoint
        .clone()
        .context("a replay endpoint")?;
    let mut sub = zeromq::SubSocket::new();
    within(sub.connect(&publish)).await??;
    within(sub.subscribe("")).await??;
    // Let the subscription reach the publisher before the first batch.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ask(&client, &worker.url, 0).await?;
    ask(&client, &worker.url, 1).await?;
    let before = received_seqs(&mut sub, Duration::from_millis(700)).await?;
    let n = before.len() as u64;
    ensure!(n >= 2, "{before:?}");
    assert_eq!(before, (0..n).collect::<Vec<_>>());
    assert_eq!(replay_all(&replay).await?, n as usize);
    let restart = |i: usize| {
        let client = client.clone();
        let url = format!("{admin}/fleet/workers/{i}/kv-events/restart");
        async move {
            let response = within(client.post(url).send()).await??;
            let status = response.status().as_u16();
            let body: Value = within(response.json()).await??;
            Ok::<_, anyhow::Error>((status, body))
        }
    };
    assert_eq!(
        restart(0).await?,
        (200, json!({"worker": 0, "kv_events_restarted": true}))
    );
    assert_eq!(replay_all(&replay).await?, 0, "the replay buffer is empty");
    ask(&client, &worker.url, 2).await?;
    let after = received_seqs(&mut sub, Duration::from_millis(700)).await?;
    let m = after.len() as u64;
    ensure!(m >= 1, "{after:?}");
    assert_eq!(after, (0..m).collect::<Vec<_>>());
    assert_eq!(replay_all(&replay).await?, m as usize);
    let metrics = within(client.get(format!("{admin}/metrics")).send())
        .await??
        .text()
        .await?;
    let restarts: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("servesim_kv_events_faults_total{") && l.contains("restart"))
        .collect();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(
        restarts[0].contains("worker=\"0\"") && restarts[0].ends_with(" 1"),
        "{restarts:?}"
    );
    let (status, body) = restart(7).await?;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("worker_not_found"))
    );
    within(fleet.shutdown()).await?;

    let quiet = fleet_with(1, &[]).await?;
    let admin = fleet_admin(&quiet)?;
    let response = within(
        client
            .post(format!("{admin}/fleet/workers/0/kv-events/restart"))
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 400);
    let body: Value = within(response.json()).await??;
    assert_eq!(body["error"]["code"], "kv_events_off", "{body}");
    within(quiet.shutdown()).await?;
    Ok(())
}
