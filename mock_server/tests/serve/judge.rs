//! The routing judge scored against a router of the test's own: four workers, four prompt
//! families, and a fixed choice of worker per request, so the test knows what each worker holds
//! at every arrival and checks every decision and the judge's sums and hit rates exactly.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mock_server::fleet::judge::Decision;
use mock_server::fleet::{launch, FleetConfig};
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
    let cli = Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--workers",
        "4",
        "--port",
        "0",
        "--admin-port",
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
    let admin = fleet.manifest.admin_url.clone().context("an admin URL")?;
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
    let response = within(client.get(format!("{admin}/fleet/decisions")).send()).await??;
    let log: Vec<Decision> = within(response.text())
        .await??
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| l.to_string()))
        .collect::<Result<_>>()?;
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
    assert!(log.iter().all(|d| d.loads == [0, 0, 0, 0]), "{log:?}");
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
    let response = within(client.get(format!("{admin}/metrics")).send()).await??;
    let samples: BTreeMap<String, f64> = parse_exposition(&within(response.text()).await??)?;
    let get = |name: &str| samples.get(name).copied();
    assert_eq!(get("servesim_routing_decisions_total"), Some(24.0));
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
    let urls: Vec<String> = fleet
        .manifest
        .workers
        .iter()
        .map(|w| w.url.clone())
        .collect();
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
