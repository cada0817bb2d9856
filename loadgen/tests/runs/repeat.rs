//! `--num-runs K` and `--lora-mix`: K runs on a deterministic embedded mockserve
//! (`--speedup-ratio inf`) are identical in every count (CV 0, the same per-run counts), the
//! report JSON holds each run and the aggregate, each run's records are kept; a LoRA mix is
//! seeded, follows its weights, is broken down per adapter and is what the server's `/metrics`
//! counted; bad values are refused naming the flag.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Parser;
use loadgen::Command;
use serde_json::Value;

use crate::common::{cli, run_ok, TempDir};

fn read_json(path: &Path) -> Result<Value> {
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

fn lines(path: &Path) -> Result<Vec<Value>> {
    std::fs::read_to_string(path)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// The figure `name` of the aggregate: its values and CV.
fn figure<'a>(report: &'a Value, name: &str) -> Result<&'a Value> {
    report["aggregate"]["figures"]
        .get(name)
        .with_context(|| format!("no aggregate figure {name}: {}", report["aggregate"]))
}

/// Five bench runs on a deterministic server: every count has CV 0 and the same value in each
/// run; each run's report and records are kept; the interval uses t(0.975, 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_bench_runs_on_a_deterministic_server_have_cv_0_for_every_count() -> Result<()> {
    let tmp = TempDir::new("loadgen-repeat")?;
    let (report, records) = (tmp.join("bench.json"), tmp.join("bench.jsonl"));
    let (r, p) = (report.display().to_string(), records.display().to_string());
    run_ok(
        120,
        &[
            "bench",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "12",
            "--concurrency",
            "3",
            "--input-tokens",
            "40",
            "--output-tokens",
            "6",
            "--slo",
            "ttft=10s",
            "--num-runs",
            "5",
            "--report-json",
            &r,
            "--per-request-jsonl",
            &p,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["num_runs"], 5);
    let runs = json["runs"].as_array().context("runs")?;
    assert_eq!(runs.len(), 5);
    for run in runs {
        assert_eq!(run["num_requests"], 12, "each run's own report");
        assert_eq!(run["total_output_tokens"], 72);
        assert!(run["config"]["seed"].is_u64(), "{}", run["config"]);
    }
    let agg = &json["aggregate"];
    assert_eq!(agg["num_runs"], 5);
    assert!((agg["t_critical"].as_f64().unwrap_or(0.0) - 2.776_445_105).abs() < 1e-9);
    for (name, value) in [
        ("num_requests", 12.0),
        ("completed_requests", 12.0),
        ("failed_requests", 0.0),
        ("total_input_tokens", 12.0 * 40.0),
        ("total_output_tokens", 72.0),
        ("goodput_requests", 12.0),
    ] {
        let f = figure(&json, name)?;
        assert_eq!(f["values"], serde_json::json!(vec![value; 5]), "{name}");
        assert_eq!(
            (f["std"].as_f64(), f["cv"].as_f64()),
            (Some(0.0), Some(0.0))
        );
        assert_eq!(f["ci95_low"], f["ci95_high"], "{name}");
    }
    // Latencies vary from run to run: the interval holds the mean.
    for name in ["mean_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms"] {
        let f = figure(&json, name)?;
        let (lo, mean, hi) = (
            f["ci95_low"].as_f64().context("low")?,
            f["mean"].as_f64().context("mean")?,
            f["ci95_high"].as_f64().context("high")?,
        );
        assert!(lo <= mean && mean <= hi, "{name}: {f}");
    }
    for name in [
        "median_itl_ms",
        "p90_e2e_latency_ms",
        "output_throughput_tok_s",
    ] {
        figure(&json, name)?;
    }
    // One record file per run, each the run's 12 requests.
    for i in 1..=5 {
        let path = tmp.join(&format!("bench.run{i}.jsonl"));
        assert_eq!(lines(&path)?.len(), 12, "{}", path.display());
        std::fs::remove_file(path)?;
    }
    assert!(!records.exists(), "K runs write one file per run, not PATH");
    std::fs::remove_file(report)?;
    Ok(())
}

/// Multiturn and replay repeat too: identical counts per run, CV 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiturn_and_replay_runs_repeat_the_same_schedule() -> Result<()> {
    let tmp = TempDir::new("loadgen-repeat")?;
    let report = tmp.join("multiturn.json");
    let r = report.display().to_string();
    run_ok(
        120,
        &[
            "multiturn",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-users",
            "3",
            "--num-turns",
            "2",
            "--num-user-tokens",
            "20",
            "--max-completion-tokens",
            "5",
            "--mean-delay-ms",
            "0",
            "--num-runs",
            "3",
            "--output",
            &r,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(3));
    for name in ["total_requests", "successful_requests", "output_tokens"] {
        let f = figure(&json, name)?;
        assert_eq!(f["cv"], 0.0, "{name}: {f}");
    }
    assert_eq!(figure(&json, "total_requests")?["mean"], 6.0);
    assert_eq!(figure(&json, "output_tokens")?["mean"], 30.0);
    figure(&json, "p99_ttft_us")?;

    let trace = tmp.join("trace.jsonl");
    let rows: String = (0..6)
        .map(|i| {
            format!(
                "{{\"timestamp\": {i}, \"input_length\": 16, \"output_length\": 3, \"hash_ids\": [{i}]}}\n"
            )
        })
        .collect();
    std::fs::write(&trace, rows)?;
    let t = trace.display().to_string();
    run_ok(
        120,
        &[
            "replay",
            &t,
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--trace-block-size",
            "16",
            "--arrival-speedup-ratio",
            "100",
            "--num-runs",
            "2",
            "--report-json",
            &r,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(2));
    for name in ["num_requests", "total_input_tokens", "total_output_tokens"] {
        assert_eq!(figure(&json, name)?["cv"], 0.0, "{name}");
    }
    assert_eq!(
        figure(&json, "total_output_tokens")?["values"],
        serde_json::json!([18.0, 18.0])
    );
    std::fs::remove_file(report)?;
    std::fs::remove_file(trace)?;
    Ok(())
}

/// A mockserve serving two adapters on 127.0.0.1:0; its base URL (it runs until the test's
/// runtime ends).
async fn lora_server() -> Result<String> {
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "--speedup-ratio",
        "inf",
        "--lora-modules",
        "sql-lora,chat-lora",
    ])?;
    let config = mock_server::config::ServerConfig::from_serve_args(&cli.serve, &cli.vllm)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(mock_server::cmd::serve::serve(
        listener,
        config,
        std::future::pending(),
    ));
    Ok(format!("http://{addr}"))
}

/// `servesim_lora_requests_total` per adapter from a `/metrics` text.
fn lora_counts(metrics: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("servesim_lora_requests_total{adapter=\""))
        .filter_map(|rest| {
            let (name, value) = rest.split_once("\"} ")?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// 300 bench requests over a 0.5/0.3/0.2 mix: the per-adapter counts are the same for the same
/// seed, within 8 points of the weights, in the report's `lora` breakdown and in each record,
/// and the server's `/metrics` counted the same requests under each adapter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lora_mix_is_seeded_reported_per_adapter_and_seen_by_the_server() -> Result<()> {
    let tmp = TempDir::new("loadgen-repeat")?;
    let url = lora_server().await?;
    let (report, records) = (tmp.join("lora.json"), tmp.join("lora.jsonl"));
    let (r, p) = (report.display().to_string(), records.display().to_string());
    let flags = |seed: &'static str| {
        vec![
            "bench".to_string(),
            "--quiet".into(),
            "--url".into(),
            url.clone(),
            "--num-requests".into(),
            "300".into(),
            "--concurrency".into(),
            "8".into(),
            "--input-tokens".into(),
            "8".into(),
            "--output-tokens".into(),
            "2".into(),
            "--seed".into(),
            seed.into(),
            "--lora-mix".into(),
            "base:0.5,sql-lora:0.3,chat-lora:0.2".into(),
            "--report-json".into(),
            r.clone(),
            "--per-request-jsonl".into(),
            p.clone(),
        ]
    };
    let counts = |json: &Value| -> Vec<u64> {
        ["base", "sql-lora", "chat-lora"]
            .iter()
            .map(|a| json["lora"][a]["requests"].as_u64().unwrap_or(0))
            .collect()
    };
    let argv = flags("7");
    run_ok(120, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let first = read_json(&report)?;
    let a = counts(&first);
    assert_eq!(a.iter().sum::<u64>(), 300, "{}", first["lora"]);
    for (n, share) in a.iter().zip([0.5, 0.3, 0.2]) {
        assert!((*n as f64 / 300.0 - share).abs() < 0.08, "{a:?}");
    }
    let sql = &first["lora"]["sql-lora"];
    assert_eq!(sql["failed"], 0);
    assert_eq!(sql["output_tokens"].as_u64(), Some(2 * a[1]));
    for key in [
        "p50_ttft_ms",
        "p99_ttft_ms",
        "p50_itl_ms",
        "p99_e2e_latency_ms",
        "input_tokens",
    ] {
        assert!(sql[key].is_number(), "{key}: {sql}");
    }
    assert_eq!(first["config"]["target"]["lora_mix"]["sql-lora"], 0.3);
    // Each record names its adapter (`raw.adapter`); the records agree with the breakdown.
    let recs = lines(&records)?;
    let sql_records = recs
        .iter()
        .filter(|l| l["raw"]["adapter"] == "sql-lora")
        .count();
    assert_eq!(sql_records as u64, a[1]);
    // The server counted the adapters' requests as the report did (base has no series).
    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    let mut seen = lora_counts(&metrics);
    seen.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        seen,
        [
            ("chat-lora".to_string(), a[2] as f64),
            ("sql-lora".to_string(), a[1] as f64)
        ],
        "{metrics}"
    );
    // The same seed sends the same mix; another seed another one.
    run_ok(120, &argv.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    assert_eq!(counts(&read_json(&report)?), a);
    let other = flags("8");
    run_ok(120, &other.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    assert_ne!(counts(&read_json(&report)?), a);
    std::fs::remove_file(report)?;
    std::fs::remove_file(records)?;
    Ok(())
}

/// Against the embedded server the adapters are loaded for the run: a multiturn conversation
/// keeps one adapter, and none of its requests fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_server_serves_the_mix_and_a_conversation_keeps_its_adapter() -> Result<()> {
    let tmp = TempDir::new("loadgen-repeat")?;
    let report = tmp.join("lora-multiturn.json");
    let r = report.display().to_string();
    run_ok(
        120,
        &[
            "multiturn",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-users",
            "8",
            "--num-turns",
            "3",
            "--num-user-tokens",
            "10",
            "--max-completion-tokens",
            "3",
            "--mean-delay-ms",
            "0",
            "--lora-mix",
            "mock-model:1,finance:1",
            "--output",
            &r,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["failed_requests"], 0, "{}", json["failures"]);
    let raw = json["raw_results"].as_array().context("raw_results")?;
    for user in 0..8 {
        let adapters: std::collections::BTreeSet<&str> = raw
            .iter()
            .filter(|r| r["user_id"] == user)
            .filter_map(|r| r["adapter"].as_str())
            .collect();
        assert_eq!(adapters.len(), 1, "user {user}: {adapters:?}");
    }
    let lora = json["lora"].as_object().context("lora breakdown")?;
    let total: u64 = lora.values().filter_map(|f| f["requests"].as_u64()).sum();
    assert_eq!(total, 24);
    assert!(lora.keys().all(|k| k == "mock-model" || k == "finance"));

    // Bench against the embedded server: adapters loaded, no failures.
    run_ok(
        120,
        &[
            "bench",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "20",
            "--lora-mix",
            "base:1,a:1,b:1",
            "--report-json",
            &r,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["failures"]["total"], 0, "{}", json["failures"]);
    assert_eq!(json["lora"].as_object().map(|m| m.len()), Some(3));

    // An agentic trace: each play under one adapter, every node counted.
    let trace =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/agentic/worked_example.jsonl");
    let t = trace.display().to_string();
    run_ok(
        120,
        &[
            "replay",
            &t,
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--arrival-speedup-ratio",
            "100",
            "--lora-mix",
            "base:1,agent-lora:1",
            "--report-json",
            &r,
        ],
    )
    .await?;
    let json = read_json(&report)?;
    assert_eq!(json["failures"]["total"], 0, "{}", json["failures"]);
    let total: u64 = json["lora"]
        .as_object()
        .context("lora breakdown")?
        .values()
        .filter_map(|f| f["requests"].as_u64())
        .sum();
    assert_eq!(Some(total), json["num_requests"].as_u64());
    std::fs::remove_file(report)?;
    Ok(())
}

/// Bad `--lora-mix` and `--num-runs` values are refused before anything runs, naming the flag.
#[test]
fn bad_values_are_refused_naming_the_flag() -> Result<()> {
    let refused = |flags: &[&str]| -> Result<String> {
        let cli = cli(flags)?;
        match loadgen::validate(&cli.command) {
            Ok(()) => bail!("{flags:?} was accepted"),
            Err(e) => Ok(e.to_string()),
        }
    };
    for mix in [
        "", "a", "a:0", "a:-1", "a:nan", "a:inf", ":1", "a:1,a:1", "a:x",
    ] {
        for mode in [&["bench"][..], &["multiturn"], &["replay", "t.jsonl"]] {
            let mut flags = vec![];
            flags.extend_from_slice(mode);
            flags.extend(["--lora-mix", mix]);
            let e = refused(&flags)?;
            assert!(e.contains("--lora-mix"), "{mix:?} {mode:?}: {e}");
        }
    }
    let huge = format!("{}:1", "x".repeat(100_000));
    let e = refused(&["bench", "--lora-mix", &huge])?;
    assert!(e.contains("--lora-mix") && e.len() < 300, "{}", e.len());
    for n in ["0", "101"] {
        let e = refused(&["bench", "--num-runs", n])?;
        assert!(
            e.contains("--num-runs") && e.contains("from 1 to 100"),
            "{e}"
        );
    }
    // Every run's records are kept: K x one run's requests is bounded.
    let e = refused(&["bench", "--num-runs", "100", "--num-requests", "1000000"])?;
    assert!(
        e.contains("--num-runs x --num-requests") && e.contains("MAX_REQUESTS"),
        "{e}"
    );
    let e = refused(&[
        "bench",
        "--concurrency",
        "4",
        "--num-runs",
        "2",
        "--shard",
        "0/2",
    ])?;
    assert!(e.contains("--num-runs") && e.contains("--shard"), "{e}");
    let e = refused(&["sweep", "--concurrency", "1,2", "--num-runs", "2"])?;
    assert!(e.contains("--num-runs"), "{e}");
    Ok(())
}

#[test]
fn the_flags_parse_in_every_run_command() -> Result<()> {
    for mode in [&["bench"][..], &["multiturn"], &["replay", "t.jsonl"]] {
        let mut flags = vec![];
        flags.extend_from_slice(mode);
        flags.extend(["--num-runs", "3", "--lora-mix", "base:1,x:2"]);
        let cli = cli(&flags)?;
        let run = match &cli.command {
            Command::Bench(a) => &a.run,
            Command::Multiturn(a) => &a.run,
            Command::Replay(a) => &a.run,
            _ => bail!("unexpected command"),
        };
        assert_eq!(run.runs.num_runs, 3);
        assert_eq!(run.runs.lora_mix.as_deref(), Some("base:1,x:2"));
    }
    Ok(())
}
