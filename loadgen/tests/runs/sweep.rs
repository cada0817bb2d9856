//! `loadgen sweep`, `merge`, server metrics and the HTML report against the embedded server:
//! a rate sweep saturates where the engine model says it must (the same cluster replayed on a
//! virtual clock), merging a run's split records rebuilds its report, a bench run records the
//! server's series and draws them, and a run against a `mockserve fleet` its routing judge's
//! figures. And the flags' bounds: every numeric flag is range-checked
//! before anything runs (huge values are an error naming the flag, never a panic, an abort or
//! a wait), output paths are checked first, and merge refuses a file given twice. Sharded
//! runs (`--shard I/N`) of bench, replay and multiturn merge into the unsharded run's requests,
//! and merge checks the shard set.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use loadgen::Command;
use serde_json::Value;
use servesim::replay::{replay, ReplayConfig};
use servesim::time::{SimDuration, SimTime};
use servesim::trace::{Session, Trace, TraceRequest};

use crate::common::{cli, command, quiet_args, run_err, run_ok, within, TempDir};
use loadgen::bench::BenchArgs;
use loadgen::sweep::SweepArgs;

/// Input and output tokens of every request of the calibration and the sweep.
const INPUT: usize = 2048;
const OUTPUT: usize = 2;

/// The engine's capacity (completed requests per second) for the embedded server of `flags`:
/// 200 requests all due at once, replayed on the virtual clock with the same cluster.
fn capacity_rps(flags: &[&str]) -> Result<f64> {
    let args = quiet_args::<SweepArgs>(flags);
    let spec = args
        .bench
        .run
        .target
        .spec(&loadgen::target::EmbeddedOptions::default())?;
    let cluster = spec.server.context("embedded")?.cluster;
    let block = 64;
    let sessions = (0..200u64)
        .map(|i| Session {
            id: format!("r{i}"),
            first_arrival: SimTime::from_micros(0),
            turns: vec![TraceRequest {
                line: i as usize + 1,
                request_id: None,
                input_length: INPUT,
                requested_input_length: None,
                output_length: OUTPUT,
                hash_ids: (0..(INPUT / block) as u64).map(|b| i * 1000 + b).collect(),
                delay: SimDuration::ZERO,
            }],
        })
        .collect();
    let outcome = replay(
        &Trace { sessions },
        &ReplayConfig {
            cluster,
            trace_block_size: block,
        },
        |_, _| {},
    )?;
    Ok(outcome.report.request_throughput_rps)
}

/// A rate sweep over the embedded server: points well below the capacity the engine model
/// predicts are not saturated, points well above it are, and the knee lies between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_sweep_saturates_where_the_engine_model_says() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    // One worker, calibrated so that the engine (not this client) is the bottleneck: about
    // 25 requests per second.
    let base = ["--num-workers", "1", "--seed", "3"];
    let c1 = capacity_rps(&[&base[..], &["--request-rate", "1"]].concat())?;
    let speedup = format!("{}", 25.0 / c1);
    let mut engine: Vec<&str> = base.to_vec();
    engine.extend(["--speedup-ratio", &speedup]);
    let c = capacity_rps(&[&engine[..], &["--request-rate", "1"]].concat())?;
    assert!((c - 25.0).abs() < 5.0, "calibration: {c} req/s");
    let rates = [0.25 * c, 0.5 * c, 2.0 * c, 4.0 * c];
    let list = rates
        .iter()
        .map(|r| format!("{r:.3}"))
        .collect::<Vec<_>>()
        .join(",");
    let report = tmp.join("rates.json");
    let rp = report.display().to_string();
    let (input, output) = (INPUT.to_string(), OUTPUT.to_string());
    let mut flags = engine.clone();
    flags.extend([
        "--request-rate",
        &list,
        "--arrival",
        "constant",
        "--num-requests",
        "40",
        "--input-tokens",
        &input,
        "--output-tokens",
        &output,
        "--report-json",
        &rp,
    ]);
    let run = within(240, loadgen::sweep::sweep(&quiet_args::<SweepArgs>(&flags))).await??;
    let sat: Vec<bool> = run
        .points
        .iter()
        .map(|p| !p.saturation.is_empty())
        .collect();
    let why: Vec<_> = run
        .points
        .iter()
        .map(|p| (&p.saturation, p.rps()))
        .collect();
    eprintln!("capacity {c:.1} req/s: {why:?}");
    assert_eq!(
        sat,
        [false, false, true, true],
        "capacity {c:.1} req/s: {why:?}"
    );
    assert_eq!(run.knee, Some(1), "{why:?}");
    // Above capacity, the achieved rate is the engine's capacity (generous bounds).
    let top = run.points[3].rps();
    assert!(top > 0.4 * c && top < 1.6 * c, "achieved {top} vs {c}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    let points = json["points"].as_array().context("points")?;
    assert_eq!(points.len(), 4);
    for key in [
        "median_ttft_ms",
        "p99_itl_ms",
        "request_throughput_rps",
        "failures",
        "load",
    ] {
        assert!(points[0].get(key).is_some(), "{key}");
    }
    assert_eq!(json["sweep"]["knee_index"], 1);
    let _ = std::fs::remove_file(report);
    Ok(())
}

/// `--find-max-goodput` ramps to the first bad point and bisects: the best point meets the SLO,
/// every higher point tried does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_search_finds_the_highest_load_meeting_the_slo() -> Result<()> {
    let flags = [
        "--num-workers",
        "1",
        "--speedup-ratio",
        "2",
        "--find-max-goodput",
        "--search-axis",
        "concurrency",
        "--slo",
        "ttft=400ms",
        "--search-steps",
        "2",
        "--max-points",
        "8",
        "--num-requests",
        "24",
        "--input-tokens",
        "512",
        "--output-tokens",
        "8",
    ];
    let run = within(240, loadgen::sweep::sweep(&quiet_args::<SweepArgs>(&flags))).await??;
    let best = run.best.context("some point met the SLO")?;
    let good = |p: &loadgen::sweep::Point| p.good(loadgen::sweep::DEFAULT_MIN_ATTAINMENT);
    assert!(good(&run.points[best]));
    let best_load = run.points[best].load.value();
    assert!(
        run.points
            .iter()
            .filter(|p| p.load.value() > best_load)
            .all(|p| !good(p)),
        "{:?}",
        run.points
            .iter()
            .map(|p| (p.load, p.attainment))
            .collect::<Vec<_>>()
    );
    assert!(run.points.len() >= 3 && run.points.len() <= 8);
    Ok(())
}

/// Splitting one run's per-request records in two and merging them gives the run's report;
/// the run also recorded the embedded server's metrics and drew them in its HTML report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merging_split_records_gives_the_original_report() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let (json_path, jsonl_path, html_path) = (
        tmp.join("run.json"),
        tmp.join("run.jsonl"),
        tmp.join("run.html"),
    );
    let (jp, lp, hp) = (
        json_path.display().to_string(),
        jsonl_path.display().to_string(),
        html_path.display().to_string(),
    );
    let args = quiet_args::<BenchArgs>(&[
        "--speedup-ratio",
        "5",
        "--request-rate",
        "40",
        "--num-requests",
        "30",
        "--output-tokens",
        "16",
        "--output-tokens-stddev",
        "4",
        "--scrape-interval-ms",
        "100",
        "--endpoint",
        "chat",
        "--report-json",
        &jp,
        "--per-request-jsonl",
        &lp,
        "--html",
        &hp,
    ]);
    let run = within(120, loadgen::bench::bench(&args)).await??;
    assert_eq!(run.live.failures.total, 0);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_path)?)?;
    // Server metrics: the embedded mockserve serves vLLM names per worker.
    let server = &report["server_metrics"];
    assert!(
        server["samples"].as_array().is_some_and(|s| s.len() >= 2),
        "{server}"
    );
    assert!(
        server["summary"]["running"]["peak"]
            .as_f64()
            .is_some_and(|p| p >= 1.0),
        "{server}"
    );
    // The server said how late it handed over every token of the run.
    let tokens: u64 = run.live.records.iter().map(|r| r.raw.output_tokens).sum();
    assert_eq!(server["summary"]["token_lateness"]["tokens"], tokens);
    let lateness = run.server_lateness.context("token lateness")?;
    assert_eq!(lateness.tokens, tokens);
    let judge = |max: f64| {
        let mut observe = args.run.observe.clone();
        observe.max_server_lateness = Some(max);
        loadgen::observe::lateness_verdict(run.server_lateness, &observe)
    };
    // Every bucket bound is above 0: a limit of 0 always fails, and one hour never does.
    let e = judge(0.0).expect_err("late");
    assert!(matches!(e, loadgen::LoadgenError::ServerLate(_)), "{e}");
    assert!(
        e.to_string()
            .contains("the server fell behind its own schedule by")
            && e.to_string().contains("above --max-server-lateness 0 ms"),
        "{e}"
    );
    judge(3_600_000.0)?;
    // Chat endpoint, workers and finish reasons recorded.
    assert_eq!(report["config"]["endpoint"], "chat");
    assert_eq!(report["finish_reasons"]["length"], 30);
    assert!(run.live.records.iter().all(|r| r.record.worker.is_some()));
    let html = std::fs::read_to_string(&html_path)?;
    assert!(html.contains("Server: requests running") && html.contains("TTFT CDF"));

    // Split the records in two files (alternate lines) and merge.
    let text = std::fs::read_to_string(&jsonl_path)?;
    let lines: Vec<&str> = text.lines().collect();
    let (a, b) = (tmp.join("a.jsonl"), tmp.join("b.jsonl"));
    let pick = |odd: usize| {
        lines
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == odd)
            .map(|(_, l)| format!("{l}\n"))
            .collect::<String>()
    };
    std::fs::write(&a, pick(0))?;
    std::fs::write(&b, pick(1))?;
    let merged_path = tmp.join("merged.json");
    let mp = merged_path.display().to_string();
    let (ap, bp) = (a.display().to_string(), b.display().to_string());
    let merge = match command(&["merge", &ap, &bp, "--report-json", &mp]) {
        Command::Merge(m) => m,
        _ => unreachable!(),
    };
    let loadgen::merge::Merged::Live(merged) = loadgen::merge::run(&merge)? else {
        anyhow::bail!("bench records merged into a multiturn report");
    };
    assert_eq!(
        merged.report.without_wall_clock(),
        run.live.report.without_wall_clock()
    );
    assert_eq!(merged.failures, run.live.failures);
    assert_eq!(merged.finish_reasons, run.live.finish_reasons);
    assert_eq!(merged.records.len(), run.live.records.len());
    let merged_json: Value = serde_json::from_str(&std::fs::read_to_string(&merged_path)?)?;
    for key in [
        "num_requests",
        "total_output_tokens",
        "duration_ms",
        "request_throughput_rps",
        "p99_ttft_ms",
        "median_itl_ms",
        "p99_e2e_latency_ms",
        "mean_output_token_throughput_per_user",
        "schedule_lag_p99_ms",
    ] {
        assert_eq!(merged_json[key], report[key], "{key}");
    }
    // A second process started 2 s later: clocks aligned by wall-clock start, the window is
    // the union of both.
    let later: String = lines
        .iter()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("json line");
            let start = v["raw"]["run_start_unix_us"].as_u64().unwrap_or(0);
            v["raw"]["run_start_unix_us"] = (start + 2_000_000).into();
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&b, later)?;
    let (both, _) = loadgen::merge::read(&[a.clone(), b.clone()])?;
    let union = loadgen::merge::merge(&both);
    assert_eq!(
        union.records.len(),
        lines.len() / 2 + lines.len() % 2 + lines.len()
    );
    let d = union.report.duration_ms;
    assert!(
        d > 2000.0 && d < 2000.0 + 2.0 * run.live.report.duration_ms,
        "{d}"
    );
    for p in [json_path, jsonl_path, html_path, a, b, merged_path] {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// A sweep in which every request fails (a model the server does not serve) measured nothing:
/// it ends in an error (a non-zero exit status), not in a table of empty points.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_of_only_failures_is_an_error() -> Result<()> {
    let flags = [
        "--model",
        "no-such-model",
        "--concurrency",
        "1,2",
        "--num-requests",
        "4",
        "--output-tokens",
        "2",
    ];
    let result = within(120, loadgen::sweep::sweep(&quiet_args::<SweepArgs>(&flags))).await?;
    match result {
        Err(loadgen::LoadgenError::AllFailed { total }) => assert_eq!(total, 8),
        other => anyhow::bail!(
            "expected every request to fail, got {:?}",
            other.map(|r| r.points.len())
        ),
    }
    Ok(())
}

/// True when `text` holds a run of more than 20 digits (a number printed in full).
fn has_long_number(text: &str) -> bool {
    let mut run = 0;
    for c in text.chars() {
        run = if c.is_ascii_digit() { run + 1 } else { 0 };
        if run > 20 {
            return true;
        }
    }
    false
}

/// Values that used to panic (Duration from 1e308 seconds), abort on allocation (4294967296
/// users, tokens or block size) or print 309-digit numbers are refused before anything runs,
/// by an error naming the flag and its range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_flag_values_are_refused_by_name_before_anything_runs() -> Result<()> {
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/trace_small.jsonl");
    let trace = trace.to_str().context("utf-8")?;
    let big = "4294967296";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["bench", "--duration", "1e308"],
            "--duration must be above 0 and at most 604800, got 1e308",
        ),
        (
            vec!["bench", "--request-timeout-s", "1e308"],
            "--request-timeout-s must be above 0 and at most 86400, got 1e308",
        ),
        (
            vec!["bench", "--input-tokens-stddev", "1e308"],
            "--input-tokens-stddev must be from 0 to 4194304, got 1e308",
        ),
        (
            vec!["bench", "--concurrency", big],
            "--concurrency must be from 1 to 100000, got 4294967296",
        ),
        (
            vec!["bench", "--input-tokens", big],
            "--input-tokens must be from 0 to 4194304, got 4294967296",
        ),
        (
            vec!["bench", "--shared-prefix-tokens", big],
            "--shared-prefix-tokens must be from 0 to 4194304, got 4294967296",
        ),
        (
            vec!["bench", "--request-rate", "1e308", "--duration", "10"],
            "--request-rate must be above 0 and at most 1000000, or inf, got 1e308",
        ),
        (
            vec!["bench", "--request-rate", "100000", "--duration", "604800"],
            "schedules about 6.048e10 requests",
        ),
        (
            vec!["multiturn", "--num-users", big],
            "--num-users must be from 1 to 100000, got 4294967296",
        ),
        (
            vec!["multiturn", "--num-turns", big],
            "--num-turns must be from 1 to 10000, got 4294967296",
        ),
        (
            vec!["multiturn", "--num-users", "100000", "--num-turns", "10000"],
            "--num-users x --num-turns is 1e9, above the 10000000",
        ),
        (
            vec!["replay", trace, "--trace-block-size", big],
            "--trace-block-size must be from 1 to 1048576, got 4294967296",
        ),
        (
            vec!["replay", trace, "--arrival-speedup-ratio", "1e-308"],
            "--arrival-speedup-ratio must be from 1e-6 to 1000000, got 1e-308",
        ),
        (
            vec!["profile", "--prefill-isl", "64,4294967296"],
            "--prefill-isl must be from 0 to 4194304, got 4294967296",
        ),
        (
            vec![
                "profile",
                "--decode-batch-sizes",
                "100000",
                "--decode-context-lengths",
                "4096,8192",
            ],
            "a decode point's batch size x (context length + output tokens) is",
        ),
        (
            vec!["sweep", "--concurrency", "1,4294967296"],
            "--concurrency must be from 1 to 100000, got 4294967296",
        ),
    ];
    for (argv, says) in cases {
        let e = run_err(30, &argv).await?;
        let text = loadgen::error::chain(&e);
        assert!(text.contains(says), "{argv:?}: {text}");
        assert!(!has_long_number(&text), "{argv:?}: {text}");
        assert_eq!(e.exit_code(), 1, "{argv:?}");
    }
    Ok(())
}

/// Output paths are checked before anything connects: the run against an address where nothing
/// listens fails on the path, not on the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_output_paths_fail_before_the_run() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let dir = tmp.join("outputs");
    std::fs::create_dir_all(&dir)?;
    let missing = dir.join("no/such/folder/r.json");
    let missing = missing.to_str().context("utf-8")?;
    let missing_npz = dir.join("no/such/folder/p.npz");
    let missing_npz = missing_npz.to_str().context("utf-8")?;
    let folder = dir.to_str().context("utf-8")?;
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/trace_small.jsonl");
    let trace = trace.to_str().context("utf-8")?;
    let url = "http://127.0.0.1:9";
    for (argv, says) in [
        (
            vec!["bench", "--url", url, "--report-json", missing],
            "--report-json",
        ),
        (vec!["bench", "--url", url, "--html", folder], "--html"),
        (
            vec!["bench", "--url", url, "--per-request-jsonl", missing],
            "--per-request-jsonl",
        ),
        (
            vec!["replay", trace, "--url", url, "--html", missing],
            "--html",
        ),
        (
            vec!["multiturn", "--url", url, "--output", folder],
            "--output",
        ),
        (
            vec![
                "sweep",
                "--url",
                url,
                "--concurrency",
                "1",
                "--report-json",
                missing,
            ],
            "--report-json",
        ),
        (
            vec!["profile", "--url", url, "--output", missing_npz],
            "--output",
        ),
        (
            vec!["merge", trace, "--report-json", folder],
            "--report-json",
        ),
    ] {
        let e = run_err(30, &argv).await?;
        let text = e.to_string();
        assert!(
            matches!(e, loadgen::LoadgenError::Config(_)) && text.contains(says),
            "{argv:?}: {text}"
        );
        assert!(
            text.contains("is a directory") || text.contains("does not exist"),
            "{argv:?}: {text}"
        );
    }
    assert_eq!(std::fs::read_dir(&dir)?.count(), 0, "no probe file is left");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `merge a a` (or `a` and a path to the same file, or a copy of it) would count every record
/// twice: it is refused, naming both files.
#[test]
fn merge_refuses_a_file_given_twice() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let dir = tmp.join("merge-twice");
    std::fs::create_dir_all(dir.join("sub"))?;
    let a = dir.join("a.jsonl");
    std::fs::write(&a, "{\"no_raw\": 1}\n")?;
    let copy = dir.join("copy.jsonl");
    std::fs::copy(&a, &copy)?;
    let other = dir.join("other.jsonl");
    std::fs::write(&other, "{\"no_raw\": 2}\n")?;
    let a_str = a.to_str().context("utf-8")?;
    let dotted = dir.join("sub/../a.jsonl");
    for (second, says) in [
        (a.clone(), "are the same file"),
        (dotted, "are the same file"),
        (copy, "hold the same records"),
    ] {
        let e = loadgen::merge::read(&[a.clone(), second.clone()]).expect_err("twice");
        let text = e.to_string();
        assert!(
            text.contains(says)
                && text.contains(a_str)
                && text.contains(&second.display().to_string()),
            "{text}"
        );
    }
    let (records, skipped) = loadgen::merge::read(&[a, other])?;
    assert_eq!((records.len(), skipped), (0, 2));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `replay` and `bench` have no `--max-model-len`: their embedded server's context length is
/// what a worker can serve, so the server does not warn about a flag the user cannot set.
#[test]
fn the_embedded_context_fits_the_engine_without_a_warning() -> Result<()> {
    for (flags, context) in [
        (vec![], 16384 * 64),
        (vec!["--num-gpu-blocks", "100000"], 1 << 22),
        (vec!["--no-chunked-prefill"], 8192),
        (vec!["--num-gpu-blocks", "10", "--block-size", "16"], 160),
    ] {
        let spec = quiet_args::<BenchArgs>(&flags)
            .run
            .target
            .spec(&loadgen::target::EmbeddedOptions::default())?;
        let server = spec.server.context("embedded")?;
        assert_eq!(server.max_model_len, context, "{flags:?}");
        assert_eq!(
            server.live_cluster().warnings(),
            Vec::<String>::new(),
            "{flags:?}"
        );
    }
    Ok(())
}

/// Seeded random numeric strings for every numeric flag of every command: each command line
/// either fails to parse or validates to a value or an error, never a panic; every error names
/// its flag and prints no number in full.
#[test]
fn any_numeric_flag_value_validates_or_errors_without_panicking() {
    use rand::{Rng, SeedableRng};
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/trace_small.jsonl");
    let trace = trace.to_str().expect("utf-8");
    let flags: Vec<(Vec<&str>, &str)> = [
        (
            vec!["bench"],
            vec![
                "--concurrency",
                "--request-rate",
                "--num-requests",
                "--duration",
                "--input-tokens",
                "--input-tokens-stddev",
                "--output-tokens",
                "--output-tokens-stddev",
                "--shared-prefix-tokens",
                "--num-prefix-groups",
                "--request-timeout-s",
                "--max-line-bytes",
                "--max-failure-rate",
                "--scrape-interval-ms",
                "--warmup",
            ],
        ),
        (
            vec!["bench", "--request-rate", "5", "--arrival", "gamma"],
            vec!["--burstiness"],
        ),
        (
            vec!["multiturn"],
            vec![
                "--num-users",
                "--num-turns",
                "--num-user-tokens",
                "--max-completion-tokens",
                "--mean-delay-ms",
                "--reasoning-ratio",
                "--max-model-len",
                "--request-timeout-s",
            ],
        ),
        (
            vec!["replay", trace],
            vec![
                "--arrival-speedup-ratio",
                "--trace-block-size",
                "--max-requests",
                "--max-in-flight",
            ],
        ),
        (vec!["sweep"], vec!["--concurrency", "--request-rate"]),
        (
            vec!["sweep", "--find-max-goodput", "--slo", "ttft=1s"],
            vec![
                "--search-start",
                "--search-factor",
                "--search-steps",
                "--max-points",
                "--min-attainment",
            ],
        ),
        (
            vec!["sweep", "--trace", trace],
            vec!["--arrival-speedup-ratio", "--trace-block-size"],
        ),
        (
            vec!["profile"],
            vec![
                "--prefill-isl",
                "--prefill-samples",
                "--decode-batch-sizes",
                "--decode-context-lengths",
                "--decode-tokens",
                "--prefill-chunk",
                "--time-budget-s",
            ],
        ),
    ]
    .into_iter()
    .flat_map(|(prefix, flags)| flags.into_iter().map(move |f| (prefix.clone(), f)))
    .collect();
    let fixed = [
        "0",
        "1",
        "-1",
        "-0",
        "inf",
        "-inf",
        "nan",
        "NaN",
        "1e308",
        "1e-308",
        "4294967296",
        "18446744073709551615",
        "18446744073709551616",
        ".5",
        "1e",
        "0x10",
        "7s",
        "1e3s",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let (mut valid, mut refused, mut unparsed) = (0, 0, 0);
    for (prefix, flag) in &flags {
        for i in 0..40 {
            let value = match i {
                i if i < fixed.len() => fixed[i].to_string(),
                _ => match rng.gen_range(0..4) {
                    0 => {
                        let digits = rng.gen_range(1..400);
                        (0..digits)
                            .map(|_| char::from(b'0' + rng.gen_range(0..10u8)))
                            .collect()
                    }
                    1 => {
                        let shift = rng.gen_range(0..64);
                        rng.gen_range(0u64..u64::MAX >> shift).to_string()
                    }
                    2 => format!(
                        "{}{}e{}",
                        if rng.gen_bool(0.2) { "-" } else { "" },
                        rng.gen::<f64>() * 10.0,
                        rng.gen_range(-400..400)
                    ),
                    _ => format!("{}", rng.gen_range(0.0..1e7)),
                },
            };
            let pair = format!("{flag}={value}");
            let mut argv = prefix.to_vec();
            argv.push(&pair);
            let Ok(cli) = cli(&argv) else {
                unparsed += 1;
                continue;
            };
            match loadgen::validate(&cli.command) {
                Ok(()) => valid += 1,
                Err(e) => {
                    refused += 1;
                    let text = e.to_string();
                    assert!(!has_long_number(&text), "{argv:?}: {text}");
                    if let loadgen::LoadgenError::OutOfRange { flag: named, .. } = &e {
                        assert!(named.starts_with(flag), "{argv:?}: {text}");
                    }
                }
            }
        }
    }
    // Each outcome happens: the generator reaches valid, refused and unparsable values.
    assert!(
        valid > 100 && refused > 100 && unparsed > 100,
        "{valid} {refused} {unparsed}"
    );
}

/// The `raw` records of a per-request JSONL file.
fn raw_records(path: &std::path::Path) -> Result<Vec<loadgen::replay_report::RawSample>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)?;
            Ok(serde_json::from_value(v["raw"].clone())?)
        })
        .collect()
}

/// (session, turn) → (prompt tokens, output tokens, cached tokens) of every request.
type Tokens = std::collections::BTreeMap<(usize, usize), (Option<u64>, u64, Option<u64>)>;

fn tokens(raws: &[loadgen::replay_report::RawSample]) -> Tokens {
    raws.iter()
        .map(|r| {
            (
                (r.session, r.turn),
                (r.prompt_tokens, r.output_tokens, r.cached_tokens),
            )
        })
        .collect()
}

/// `--max-server-lateness` fails a run whose server fell behind (a limit of 0 ms: every token
/// is in a bucket above it) with exit status 1 after the report, passes one within it, fails
/// one whose target does not report lateness, and is refused without scraping and in a sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_server_lateness_turns_a_late_server_into_a_failed_run() -> Result<()> {
    let run = |limit: &'static str, extra: &'static [&'static str]| async move {
        let mut argv = vec![
            "bench",
            "--quiet",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "5",
            "--request-rate",
            "100",
            "--output-tokens",
            "4",
            "--max-server-lateness",
            limit,
        ];
        argv.extend_from_slice(extra);
        anyhow::Ok(within(120, loadgen::run_async(cli(&argv)?)).await?)
    };
    let e = run("0", &[]).await?.expect_err("late");
    assert!(matches!(e, loadgen::LoadgenError::ServerLate(_)), "{e}");
    assert_eq!(e.exit_code(), 1);
    run("3600000", &[]).await??;
    let e = run("5", &["--no-scrape-metrics"])
        .await?
        .expect_err("no scrape");
    assert!(
        e.to_string().contains("--no-scrape-metrics turns off"),
        "{e}"
    );
    let e = run("1e9", &[]).await?.expect_err("range");
    assert!(
        e.to_string().contains("--max-server-lateness must be"),
        "{e}"
    );
    // A target without the metric: nothing says its timing is sound.
    let observe = loadgen::observe::ObserveArgs {
        max_server_lateness: Some(5.0),
        ..Default::default()
    };
    let e = loadgen::observe::lateness_verdict(None, &observe).expect_err("unknown");
    assert!(e.to_string().contains("reported no token lateness"), "{e}");
    let e = run_err(
        60,
        &[
            "sweep",
            "--request-rate",
            "10,20",
            "--max-server-lateness",
            "5",
        ],
    )
    .await?;
    assert!(e.to_string().contains("not a sweep"), "{e}");
    Ok(())
}

/// Merges `files` into `out` (per-request JSONL); the merged report.
fn merge_files(
    files: &[PathBuf],
    out: &std::path::Path,
) -> Result<loadgen::replay_report::LiveReport, loadgen::LoadgenError> {
    match merge_any(files, out)? {
        loadgen::merge::Merged::Live(live) => Ok(*live),
        loadgen::merge::Merged::Multiturn(_) => Err(loadgen::LoadgenError::Config(
            "multiturn records where bench or replay records were expected".into(),
        )),
    }
}

fn merge_any(
    files: &[PathBuf],
    out: &std::path::Path,
) -> Result<loadgen::merge::Merged, loadgen::LoadgenError> {
    let mut argv = vec!["merge".to_string()];
    argv.extend(files.iter().map(|p| p.display().to_string()));
    argv.extend(["--per-request-jsonl".to_string(), out.display().to_string()]);
    match command(&argv.iter().map(String::as_str).collect::<Vec<_>>()) {
        Command::Merge(m) => loadgen::merge::run(&m),
        _ => unreachable!(),
    }
}

/// A trace of four two-turn sessions that share no hash id with each other.
const SHARD_TRACE: &str = r#"{"timestamp": 0, "session_id": "s0", "input_length": 32, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 5, "session_id": "s1", "input_length": 48, "output_length": 5, "hash_ids": [11, 12, 13]}
{"timestamp": 9, "session_id": "s2", "input_length": 16, "output_length": 3, "hash_ids": [21]}
{"timestamp": 14, "session_id": "s3", "input_length": 40, "output_length": 6, "hash_ids": [31, 32, 33]}
{"timestamp": 20, "session_id": "s0", "delay": 5, "input_length": 64, "output_length": 4, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 25, "session_id": "s1", "delay": 5, "input_length": 64, "output_length": 2, "hash_ids": [11, 12, 13, 14]}
{"timestamp": 30, "session_id": "s2", "delay": 5, "input_length": 48, "output_length": 7, "hash_ids": [21, 22, 23]}
{"timestamp": 35, "session_id": "s3", "delay": 5, "input_length": 64, "output_length": 8, "hash_ids": [31, 32, 33, 34]}
"#;

/// `--shard I/N` then `merge` gives the unsharded run's requests: bench (open loop with a fixed
/// request count, closed loop with `--num-requests`) and replay, each run once unsharded and
/// as three shards run one after another, each on a fresh embedded server at
/// `--speedup-ratio inf`.
///
/// What is exactly equal, and why: prompt and output token counts are the request's own (its
/// body, `max_tokens` with `ignore_eos`), so they match per request, and the random lengths
/// (`--*-stddev`) make every bench request's pair depend on its index k: a shard sending the
/// wrong k fails. Cached tokens match per request because none of these workloads shares a
/// prefix between sessions (bench prompts are unique per request; the trace's sessions share no
/// hash id) and a session's later turn is sent after its earlier one completed: the cache state
/// a request meets depends only on its own session, whichever server and shard ran the others.
/// (A workload with cross-session sharing, e.g. `--shared-prefix-tokens`, would see different
/// hits when its sessions run in different processes; it is not asserted here.) Latencies
/// depend on wall time and are not compared. The closed loop's (user, turn) of a request
/// depends on which user was free first, so it is compared as the multiset of its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_merge_into_the_unsharded_run() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let dir = tmp.join("shards");
    std::fs::create_dir_all(&dir)?;
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, SHARD_TRACE)?;
    let trace = trace.display().to_string();
    let bench = |extra: &'static [&'static str]| {
        let mut argv = vec![
            "bench",
            "--quiet",
            "--no-scrape-metrics",
            "--speedup-ratio",
            "inf",
            "--input-tokens",
            "64",
            "--input-tokens-stddev",
            "20",
            "--output-tokens",
            "6",
            "--output-tokens-stddev",
            "3",
        ];
        argv.extend_from_slice(extra);
        argv
    };
    let modes: Vec<(&str, Vec<&str>)> = vec![
        (
            "open",
            bench(&["--request-rate", "inf", "--num-requests", "12"]),
        ),
        (
            "closed",
            bench(&["--concurrency", "3", "--num-requests", "11"]),
        ),
        (
            "replay",
            vec![
                "replay",
                &trace,
                "--quiet",
                "--no-scrape-metrics",
                "--speedup-ratio",
                "inf",
                "--trace-block-size",
                "16",
                "--block-size",
                "16",
            ],
        ),
    ];
    let mut shard_files: Vec<Vec<PathBuf>> = Vec::new();
    for (name, argv) in &modes {
        let whole = dir.join(format!("{name}-whole.jsonl"));
        let w = whole.display().to_string();
        let mut a = argv.clone();
        a.extend(["--per-request-jsonl", &w]);
        run_ok(120, &a).await?;
        let mut files = Vec::new();
        for i in 0..3 {
            let path = dir.join(format!("{name}-{i}.jsonl"));
            let p = path.display().to_string();
            let shard = format!("{i}/3");
            let mut a = argv.clone();
            a.extend(["--per-request-jsonl", &p, "--shard", &shard]);
            run_ok(120, &a).await?;
            // Every record carries the shard and a global session of that shard.
            let raws = raw_records(&path)?;
            assert!(!raws.is_empty(), "{name} shard {i}");
            for r in &raws {
                assert_eq!(r.shard, Some((i, 3)), "{name}");
                assert_eq!(r.session % 3, i as usize, "{name}: session {}", r.session);
            }
            files.push(path);
        }
        let merged_path = dir.join(format!("{name}-merged.jsonl"));
        let merged = merge_files(&files, &merged_path)?;
        let whole_raws = raw_records(&whole)?;
        let merged_raws = raw_records(&merged_path)?;
        assert!(whole_raws.iter().all(|r| r.shard.is_none()));
        let text = std::fs::read_to_string(&whole)?;
        assert!(
            !text.contains("\"shard\""),
            "unsharded records name no shard"
        );
        if *name == "closed" {
            let multiset = |raws: &[loadgen::replay_report::RawSample]| {
                let mut v: Vec<_> = raws
                    .iter()
                    .map(|r| (r.prompt_tokens, r.output_tokens, r.cached_tokens))
                    .collect();
                v.sort();
                v
            };
            assert_eq!(multiset(&merged_raws), multiset(&whole_raws), "{name}");
            // Three users, one per shard: each shard's records are one user's.
            let users: std::collections::BTreeSet<usize> =
                merged_raws.iter().map(|r| r.session).collect();
            assert_eq!(users.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
        } else {
            assert_eq!(tokens(&merged_raws), tokens(&whole_raws), "{name}");
        }
        if *name == "replay" {
            // Later turns hit their session's cache: the comparison covers real hits.
            assert!(
                merged_raws.iter().any(|r| r.cached_tokens.unwrap_or(0) > 0),
                "replay: no cache hit"
            );
        }
        let distinct: std::collections::BTreeSet<_> =
            whole_raws.iter().map(|r| r.prompt_tokens).collect();
        assert!(distinct.len() >= 4, "{name}: lengths vary by request");
        // The report figures that do not depend on wall time.
        let whole_report: Value = {
            let argv_json = dir.join(format!("{name}-whole.json"));
            let merged_again = merge_files(std::slice::from_ref(&whole), &argv_json)?;
            serde_json::to_value(merged_again.report)?
        };
        let merged_report = serde_json::to_value(&merged.report)?;
        for key in [
            "num_requests",
            "completed_requests",
            "total_input_tokens",
            "total_output_tokens",
            "prefix_cache_reused_ratio",
        ] {
            assert_eq!(merged_report[key], whole_report[key], "{name}: {key}");
        }
        assert_eq!(merged.failures.total, 0, "{name}");
        shard_files.push(files);
    }
    assert_eq!(raw_records(&dir.join("open-merged.jsonl"))?.len(), 12);
    assert_eq!(raw_records(&dir.join("closed-merged.jsonl"))?.len(), 11);
    assert_eq!(raw_records(&dir.join("replay-merged.jsonl"))?.len(), 8);

    // The shard set is checked.
    let out = dir.join("refused.jsonl");
    let open = &shard_files[0];
    let e = merge_files(&open[..2], &out).expect_err("a shard missing");
    assert!(
        e.to_string().contains("shards missing: 2/3 (given 2 of 3"),
        "{e}"
    );
    let e = merge_files(
        &[open[0].clone(), open[1].clone(), shard_files[1][1].clone()],
        &out,
    )
    .expect_err("a shard twice");
    assert!(e.to_string().contains("shard 1/3 is given twice"), "{e}");
    let mut with_whole = open.clone();
    with_whole.push(dir.join("open-whole.jsonl"));
    let e = merge_files(&with_whole, &out).expect_err("sharded and unsharded");
    assert!(e.to_string().contains("holds unsharded records"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// multiturn's shards: each user's conversation is the unsharded run's (the workload is
/// generated for every user, then filtered), so per (user, turn) the prompt, output and cached
/// tokens are equal (no prefix is shared between users: the system prompt names the user
/// within the first block of 32 tokens: first turns never hit, which the test checks).
/// `merge` of the shards gives the unsharded run's records and counts; an incomplete shard
/// set, an unsharded run and shards of two runs are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiturn_shards_hold_the_unsharded_conversations() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let dir = tmp.join("multiturn-shards");
    std::fs::create_dir_all(&dir)?;
    let argv = [
        "multiturn",
        "--quiet",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "32",
        "--num-users",
        "5",
        "--num-turns",
        "2",
        "--num-user-tokens",
        "64",
        "--max-completion-tokens",
        "6",
        "--mean-delay-ms",
        "0",
    ];
    let records = |path: &std::path::Path| -> Result<Vec<Value>> {
        std::fs::read_to_string(path)?
            .lines()
            .map(|l| Ok(serde_json::from_str(l)?))
            .collect()
    };
    // (user, turn) → (prompt, output, cached tokens) of a multiturn record.
    type Keyed = ((u64, u64), (Value, Value, Value));
    let key = |v: &Value| -> Result<Keyed> {
        Ok((
            (
                v["user_id"].as_u64().context("user_id")?,
                v["turn"].as_u64().context("turn")?,
            ),
            (
                v["prompt_tokens"].clone(),
                v["output_tokens"].clone(),
                v["cached_tokens"].clone(),
            ),
        ))
    };
    let whole = dir.join("whole.jsonl");
    let w = whole.display().to_string();
    let mut a = argv.to_vec();
    a.extend(["--per-request-jsonl", &w]);
    run_ok(120, &a).await?;
    let whole_records = records(&whole)?;
    assert!(whole_records.iter().all(|r| r.get("shard").is_none()));
    let expected = whole_records
        .iter()
        .map(key)
        .collect::<Result<std::collections::BTreeMap<_, _>>>()?;
    assert_eq!(expected.len(), 10);
    // No prefix is shared between users: first turns never hit. Second turns hit the cache
    // (their history): the comparison covers real hits.
    assert!(
        expected
            .iter()
            .all(|((_, turn), (_, _, cached))| *turn == 1 || cached.as_u64() == Some(0)),
        "a first turn hit another user's prefix: {expected:?}"
    );
    assert!(
        expected
            .iter()
            .any(|((_, turn), (_, _, cached))| *turn == 1 && cached.as_u64().unwrap_or(0) > 0),
        "no cache hit in {expected:?}"
    );
    let mut got = std::collections::BTreeMap::new();
    let mut files = Vec::new();
    for i in 0..3u64 {
        let path = dir.join(format!("shard-{i}.jsonl"));
        let p = path.display().to_string();
        let shard = format!("{i}/3");
        let mut a = argv.to_vec();
        a.extend(["--per-request-jsonl", &p, "--shard", &shard]);
        run_ok(120, &a).await?;
        for r in records(&path)? {
            assert_eq!(r["shard"], serde_json::json!([i, 3]));
            let (k, v) = key(&r)?;
            assert_eq!(k.0 % 3, i, "user {} in shard {i}", k.0);
            assert!(got.insert(k, v).is_none(), "{k:?} twice");
        }
        files.push(path);
    }
    assert_eq!(got, expected);
    // The merge of the shards is the unsharded run: the same requests with the same tokens and
    // cache hits, the same counts, and records shaped as an unsharded run writes them.
    let merged_path = dir.join("merged.jsonl");
    let loadgen::merge::Merged::Multiturn(merged) = merge_any(&files, &merged_path)? else {
        anyhow::bail!("multiturn shards merged into a bench report");
    };
    assert_eq!(
        (merged.num_users, merged.num_turns, merged.total_requests),
        (5, 2, 10)
    );
    assert_eq!(merged.successful_requests, 10);
    let merged_records = records(&merged_path)?;
    let keys: Vec<(u64, u64)> = merged_records
        .iter()
        .map(|r| Ok(key(r)?.0))
        .collect::<Result<_>>()?;
    let whole_keys: Vec<(u64, u64)> = whole_records
        .iter()
        .map(|r| Ok(key(r)?.0))
        .collect::<Result<_>>()?;
    assert_eq!(keys, whole_keys, "records in (user, turn) order");
    let merged_map = merged_records
        .iter()
        .map(key)
        .collect::<Result<std::collections::BTreeMap<_, _>>>()?;
    assert_eq!(merged_map, expected);
    for (m, w) in merged_records.iter().zip(&whole_records) {
        let fields = |v: &Value| -> Vec<String> {
            v.as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default()
        };
        assert_eq!(fields(m), fields(w));
    }
    // Pooled samples come from every shard: one inter-chunk gap per token after the first.
    let gaps: u64 = whole_records
        .iter()
        .map(|r| r["chunks"].as_u64().unwrap_or(0).saturating_sub(1))
        .sum();
    let merged_json = serde_json::to_value(&*merged)?;
    assert_eq!(
        merged_json["throughput"]["output_tokens"],
        serde_json::json!(whole_records
            .iter()
            .map(|r| r["output_tokens"].as_u64().unwrap_or(0))
            .sum::<u64>())
    );
    assert!(gaps > 0 && merged.aggregate_inter_chunk.is_some());
    // Shards of two runs, a shard given twice, a missing shard, and an unsharded run are
    // refused.
    let e = merge_any(&files[..2], &merged_path).expect_err("missing");
    assert!(e.to_string().contains("shards missing: 2/3"), "{e}");
    let e = merge_any(std::slice::from_ref(&whole), &merged_path).expect_err("unsharded");
    assert!(
        e.to_string()
            .contains("a multiturn record of an unsharded run"),
        "{e}"
    );
    let other = dir.join("other-run.jsonl");
    let text = std::fs::read_to_string(&files[2])?.replace("\"num_turns\":2", "\"num_turns\":3");
    std::fs::write(&other, text)?;
    let e = merge_any(&[files[0].clone(), files[1].clone(), other], &merged_path)
        .expect_err("two runs");
    assert!(e.to_string().contains("records of two runs"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `--shard` and `--start-at` are checked before anything runs, by errors naming the flag, on
/// every command that takes them; a sweep and a closed loop that could not send its share are
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_and_start_at_are_checked_by_name() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/trace_small.jsonl");
    let trace = trace.to_str().context("utf-8")?;
    for command in [vec!["bench"], vec!["replay", trace], vec!["multiturn"]] {
        for (flags, message) in [
            (
                ["--shard", "3/3"],
                "--shard must be I/N with I < N and 1 <= N <= 65536, got 3/3",
            ),
            (
                ["--shard", "0/65537"],
                "--shard must be I/N with I < N and 1 <= N <= 65536, got 0/65537",
            ),
            (
                ["--start-at", "2000-01-01T00:00:00Z"],
                "--start-at must be from 60 s ago to 24 h ahead",
            ),
            (
                ["--start-at", "4102444800"],
                "--start-at must be from 60 s ago to 24 h ahead",
            ),
        ] {
            let mut argv = command.clone();
            argv.extend_from_slice(&flags);
            let e = run_err(30, &argv).await?;
            assert!(e.to_string().contains(message), "{argv:?}: {e}");
        }
        for bad in ["1", "a/3", "1/3/4", "1/x"] {
            let mut argv = command.clone();
            argv.extend(["--shard", bad]);
            let e = cli(&argv).expect_err(bad);
            assert!(e.to_string().contains("--shard <I/N>"), "{e}");
        }
        let mut argv = command.clone();
        argv.extend(["--start-at", "2026-12-02T19:00:00+01:00"]);
        let e = cli(&argv).expect_err("not UTC");
        assert!(e.to_string().contains("only UTC"), "{e}");
    }
    let e = run_err(30, &["sweep", "--concurrency", "1,2", "--shard", "0/2"]).await?;
    assert!(e.to_string().contains("a sweep runs in one process"), "{e}");
    let e = run_err(
        30,
        &[
            "bench",
            "--concurrency",
            "2",
            "--num-requests",
            "10",
            "--shard",
            "0/3",
        ],
    )
    .await?;
    assert!(e.to_string().contains("every shard needs a user"), "{e}");
    // With --duration alone, a shard without a user runs and sends nothing.
    let jsonl = tmp.join("empty-shard.jsonl");
    let j = jsonl.display().to_string();
    run_ok(
        120,
        &[
            "bench",
            "--quiet",
            "--no-scrape-metrics",
            "--speedup-ratio",
            "inf",
            "--concurrency",
            "2",
            "--duration",
            "0.2",
            "--shard",
            "2/3",
            "--per-request-jsonl",
            &j,
        ],
    )
    .await?;
    assert_eq!(std::fs::read_to_string(&jsonl)?, "");
    // --start-at: the run sends nothing before that time.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_micros() as u64;
    let at_us = now_us + 1_500_000;
    let at = format!("{}.{:06}", at_us / 1_000_000, at_us % 1_000_000);
    run_ok(
        120,
        &[
            "bench",
            "--quiet",
            "--no-scrape-metrics",
            "--speedup-ratio",
            "inf",
            "--num-requests",
            "2",
            "--start-at",
            &at,
            "--per-request-jsonl",
            &j,
        ],
    )
    .await?;
    let raws = raw_records(&jsonl)?;
    assert_eq!(raws.len(), 2);
    assert!(
        raws.iter().all(|r| r.run_start_unix_us >= at_us),
        "started before --start-at {at}"
    );
    let _ = std::fs::remove_file(&jsonl);
    Ok(())
}

/// A run against one worker of a `mockserve fleet`, sampling the fleet's admin `/metrics`
/// (`--metrics-url`): the report's server metrics carry the routing judge's summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_against_a_fleet_reports_its_routing_quality() -> Result<()> {
    let tmp = TempDir::new("loadgen-sweep")?;
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "fleet",
        "--workers",
        "2",
        "--port",
        "0",
        "--admin-port",
        "0",
        "--speedup-ratio",
        "inf",
        "--block-size",
        "16",
    ])?;
    let Some(mock_server::Command::Fleet(fleet_args)) = cli.command else {
        bail!("expected fleet");
    };
    let config = mock_server::fleet::FleetConfig::from_args(&fleet_args)?;
    let fleet = within(60, mock_server::fleet::launch(config)).await??;
    let worker = fleet.manifest.workers[0].url.clone();
    let admin = fleet.manifest.admin_url.clone().context("admin URL")?;
    let json_path = tmp.join("fleet.json");
    let jp = json_path.display().to_string();
    let metrics_url = format!("{admin}/metrics");
    let args = quiet_args::<BenchArgs>(&[
        "--url",
        &worker,
        "--metrics-url",
        &metrics_url,
        "--scrape-interval-ms",
        "100",
        "--concurrency",
        "2",
        "--num-requests",
        "20",
        "--input-tokens",
        "64",
        "--output-tokens",
        "4",
        "--shared-prefix-tokens",
        "256",
        "--num-prefix-groups",
        "2",
        "--report-json",
        &jp,
    ]);
    let run = within(120, loadgen::bench::bench(&args)).await??;
    assert_eq!(run.live.failures.total, 0);
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json_path)?)?;
    let server = &report["server_metrics"];
    assert_eq!(server["url"], metrics_url.as_str());
    let routing = &server["summary"]["routing"];
    assert_eq!(routing["decisions"], 20.0, "{server}");
    // No other client: every decision in the window is one of loadgen's requests.
    assert_eq!(routing["loadgen"]["requests"], 20, "{routing}");
    assert_eq!(routing["other_decisions"], 0.0, "{routing}");
    // Every request ran on worker 0, the only one that ever cached anything: always the best.
    assert_eq!(routing["best_choice_share"], 1.0, "{routing}");
    assert_eq!(routing["achieved_hit_rate"], routing["oracle_hit_rate"]);
    assert!(
        routing["achieved_hit_rate"]
            .as_f64()
            .is_some_and(|r| r > 0.5),
        "the shared prefixes are cached: {routing}"
    );
    within(60, fleet.shutdown()).await?;
    std::fs::remove_file(&json_path)?;
    Ok(())
}
