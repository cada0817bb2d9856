//! The live elastic fleet against `mockserve replay --autoscale`: the same tiny trace and
//! scripted external policy, offline on the virtual clock and live at `--speedup-ratio 100`
//! through the fleet's front endpoint, judged by the same judge in trace time. The policy's
//! answers depend only on how many ticks have passed, so both runs scale at the same ticks; the
//! test checks the judge's keys, the scale events, the attainment, and GPU-seconds within a
//! loose bound (the live clock's jitter is milliseconds of wall time, a tenth of a second of
//! trace time per millisecond at this speed-up).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use mock_server::fleet::launch;
use mock_server::test_kit::TempDir;
use serde_json::{json, Value};
use servesim::metrics::{RequestRecord, RequestStatus};

use crate::common::*;
use crate::fleet::fleet_config;

/// Requests of the trace, one every `GAP_MS` of trace time.
const REQUESTS: u64 = 8;
const GAP_MS: u64 = 20_000;
/// The live fleet's speed-up.
const SPEEDUP: f64 = 100.0;
/// Two workers for the first two ticks (30 s, 60 s), then one.
const POLICY: &str = r#"external:n=0; while read line; do n=$((n+1)); if [ $n -le 2 ]; then echo '{"workers": 2}'; else echo '{"workers": 1}'; fi; done"#;
/// Lifecycle flags shared by both sides (simulated time).
const LIFECYCLE: [&str; 12] = [
    "--min-workers",
    "1",
    "--max-workers",
    "2",
    "--model-load",
    "40s",
    "--model-load-jitter",
    "0s",
    "--autoscale-tick",
    "30s",
    "--scrape-delay",
    "15s",
];
const SLO: &str = "ttft=60000ms";

fn trace_lines() -> String {
    (0..REQUESTS)
        .map(|k| {
            format!(
                "{}\n",
                json!({"timestamp": k * GAP_MS, "input_length": 32, "output_length": 4,
                       "hash_ids": [k]})
            )
        })
        .collect()
}

/// The offline judge's `autoscale` section.
fn offline(dir: &TempDir) -> Result<Value> {
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, trace_lines())?;
    let report = dir.join("offline.json");
    let mut argv = vec![
        "mockserve",
        "replay",
        trace.to_str().context("path")?,
        "--arrival-speedup-ratio",
        "1",
        "--router-mode",
        "round-robin",
        "--autoscale",
        POLICY,
        "--slo",
        SLO,
        "--no-oracle",
        "--quiet",
        "--report-json",
        report.to_str().context("path")?,
    ];
    argv.extend_from_slice(&LIFECYCLE);
    mock_server::run(mock_server::Cli::try_parse_from(argv)?)?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    Ok(v["autoscale"].clone())
}

/// One request's record from the client's side, wall milliseconds from the run's start.
fn record(k: u64, arrival_ms: f64, finish_ms: f64, ok: bool) -> RequestRecord {
    let e2e = finish_ms - arrival_ms;
    RequestRecord {
        request_id: k,
        session_id: None,
        turn_index: 0,
        worker: None,
        arrival_ms,
        first_admit_ms: None,
        first_token_ms: ok.then_some(finish_ms),
        last_token_ms: ok.then_some(finish_ms),
        finish_ms: Some(finish_ms),
        ttft_ms: ok.then_some(e2e),
        ttst_ms: None,
        e2e_latency_ms: ok.then_some(e2e),
        itl_ms: None,
        input_length: 32,
        output_length: if ok { 4 } else { 0 },
        max_output_tokens: 4,
        reused_input_tokens: 0,
        g2_reused_input_tokens: 0,
        kv_transfer_ms: None,
        status: if ok {
            RequestStatus::Completed
        } else {
            RequestStatus::Rejected
        },
    }
}

/// The live judge's section: the trace sent on its schedule (sped up) to the front endpoint.
async fn live(dir: &TempDir) -> Result<Value> {
    let log = dir.join("lifecycle.json");
    let speedup = SPEEDUP.to_string();
    let mut flags = vec![
        "--elastic",
        "--port",
        "0",
        "--front-port",
        "0",
        "--drain-grace",
        "0s",
        "--speedup-ratio",
        &speedup,
        "--autoscale",
        POLICY,
        "--lifecycle-log",
        log.to_str().context("path")?,
    ];
    flags.extend_from_slice(&LIFECYCLE);
    let fleet = within(launch(fleet_config(&flags)?)).await??;
    let front = fleet
        .elastic
        .as_ref()
        .and_then(|l| l.front_url.clone())
        .context("the front endpoint")?;
    let client = reqwest::Client::new();
    let start = tokio::time::Instant::now();
    let mut sent = tokio::task::JoinSet::new();
    for k in 0..REQUESTS {
        let (client, url) = (client.clone(), format!("{front}/v1/completions"));
        let due = Duration::from_secs_f64((k * GAP_MS) as f64 / 1e3 / SPEEDUP);
        sent.spawn(async move {
            tokio::time::sleep_until(start + due).await;
            let body = json!({"model": "mock-model", "prompt": format!("request {k} of the trace"),
                              "max_tokens": 4, "ignore_eos": true});
            let ok = matches!(
                within(client.post(url).json(&body).send()).await,
                Ok(Ok(r)) if r.status() == 200
            );
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            record(k, ms(due), ms(start.elapsed()), ok)
        });
    }
    let mut records = Vec::new();
    while let Some(r) = sent.join_next().await {
        records.push(r?);
    }
    records.sort_by_key(|r| r.request_id);
    let lifecycle = fleet.elastic.as_ref().context("elastic")?.lifecycle_log();
    within(fleet.shutdown()).await?;
    // The file holds what the fleet serves.
    let written: mock_server::fleet::elastic::LifecycleLog =
        serde_json::from_str(&std::fs::read_to_string(&log)?)?;
    ensure!(written.speedup == SPEEDUP && written.started, "{written:?}");
    let slo: servesim::slo::Slo = SLO.parse().map_err(anyhow::Error::msg)?;
    let report = lifecycle.judge(&records, &slo, SPEEDUP)?;
    Ok(serde_json::to_value(report)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_fleet_agrees_with_the_offline_replay() -> Result<()> {
    let dir = TempDir::new("elastic-live")?;
    let off = offline(&dir)?;
    let live = live(&dir).await?;
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(keys(&off), keys(&live), "{live}");
    for k in [
        "gpu_seconds",
        "mean_gpus",
        "peak_gpus",
        "slo_attainment",
        "violation_seconds",
        "scale_events",
        "oscillations",
        "oracle_gpu_seconds",
        "regret_gpu_seconds",
        "regret_slo_seconds",
    ] {
        ensure!(live.get(k).is_some(), "{k} missing: {live}");
    }
    // Up at the first tick, down at the third, on both sides.
    let events = |v: &Value| -> Vec<(u64, u64)> {
        v["events"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|e| {
                        (
                            e["from"].as_u64().unwrap_or(0),
                            e["to"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(events(&off), vec![(1, 2), (2, 1)], "{off}");
    assert_eq!(events(&live), events(&off), "{live}");
    for (a, b) in off["events"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(live["events"].as_array().into_iter().flatten())
    {
        let (a, b) = (a["time_s"].as_f64(), b["time_s"].as_f64());
        let (a, b) = (a.context("time")?, b.context("time")?);
        // The tick is 30 s; the live one lands within a few trace seconds of it.
        ensure!((a - b).abs() < 5.0, "event at {a} s offline, {b} s live");
    }
    assert_eq!(off["slo_attainment"], 1.0);
    assert_eq!(live["slo_attainment"], 1.0);
    assert_eq!(live["peak_gpus"], 2);
    assert_eq!(live["oracle_gpu_seconds"], Value::Null);
    let (a, b) = (
        off["gpu_seconds"].as_f64().context("gpu_seconds")?,
        live["gpu_seconds"].as_f64().context("gpu_seconds")?,
    );
    ensure!(
        (b - a).abs() / a < 0.15,
        "GPU-seconds {a} offline, {b} live"
    );
    Ok(())
}
