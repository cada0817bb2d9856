//! `loadgen replay` end to end: live equals offline on a fixture trace, session handling,
//! pacing against known timestamps.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use loadgen::replay::{ReplayArgs, SessionMode};
use loadgen::{Cli, Command};
use servesim::replay::{replay as offline_replay, ReplayConfig};

async fn within<T>(secs: u64, f: impl Future<Output = T>) -> Result<T> {
    match tokio::time::timeout(Duration::from_secs(secs), f).await {
        Ok(v) => Ok(v),
        Err(_) => bail!("timed out after {secs}s"),
    }
}

fn fixture(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    root.join(name).display().to_string()
}

fn args(flags: &[&str]) -> ReplayArgs {
    let mut argv = vec!["loadgen", "replay"];
    argv.extend_from_slice(flags);
    match Cli::try_parse_from(argv).expect("valid flags").command {
        Command::Replay(a) => a,
        _ => unreachable!(),
    }
}

/// Same engine flags and trace: `mockserve replay` (virtual clock) and `loadgen replay` against
/// the embedded server (wall clock) agree. The engine runs at half speed so that the client's
/// fixed overhead (about 1 ms of tokio timer granularity per deadline, plus HTTP) stays small
/// against the latencies. Counts must match exactly; timings get bounds that hold on a loaded
/// 2-core machine (a late client adds latency, it never removes it), and the cache reuse may
/// shift a little when load reorders close arrivals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_equals_offline_on_the_small_trace() -> Result<()> {
    let trace = fixture("trace_small.jsonl");
    let flags = [
        "--arrival-speedup-ratio",
        "0.5",
        "--speedup-ratio",
        "0.5",
        "--quiet",
    ];
    let mut argv = vec![trace.as_str()];
    argv.extend_from_slice(&flags);
    let a = args(&argv);
    let offline = offline_replay(
        &loadgen::replay::load_trace(&a)?,
        &ReplayConfig {
            cluster: a.target.engine.cluster_config()?,
            trace_block_size: a.trace_block_size,
        },
        |_, _| {},
    )?
    .report;
    let live = within(60, loadgen::replay::replay(&a)).await??;
    let l = &live.live.report;
    assert_eq!(l.completed_requests, offline.completed_requests);
    assert_eq!(l.total_output_tokens, offline.total_output_tokens);
    assert_eq!(l.total_input_tokens, offline.total_input_tokens);
    assert!(
        (l.prefix_cache_reused_ratio - offline.prefix_cache_reused_ratio).abs() <= 0.1,
        "reuse live {} offline {}",
        l.prefix_cache_reused_ratio,
        offline.prefix_cache_reused_ratio
    );
    // Medians: a burst of load on the machine delays a few requests by far more than the rest.
    for (name, live_ms, offline_ms) in [
        ("TTFT", l.ttft.median, offline.ttft.median),
        ("E2E", l.e2e_latency.median, offline.e2e_latency.median),
    ] {
        assert!(
            live_ms >= 0.9 * offline_ms && live_ms <= 2.0 * offline_ms + 50.0,
            "{name} live {live_ms} ms, offline {offline_ms} ms"
        );
    }
    assert!(live.expected_prefix_reuse_ratio >= l.prefix_cache_reused_ratio);
    assert_eq!(live.json["completed_requests"], 20);
    assert!(live.json.get("schedule_lag_p99_ms").is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cumulative_and_incremental() -> Result<()> {
    for (file, mode, second_turn_tokens) in [
        ("sessions_cumulative.jsonl", SessionMode::Cumulative, 128u64),
        ("sessions_incremental.jsonl", SessionMode::Incremental, 128),
    ] {
        let path = fixture(file);
        let a = args(&[
            &path,
            "--trace-block-size",
            "32",
            "--block-size",
            "16",
            "--speedup-ratio",
            "inf",
            "--quiet",
        ]);
        let trace = loadgen::replay::load_trace(&a)?;
        assert_eq!(
            loadgen::replay::session_shape(&trace).detected(),
            mode,
            "{file}"
        );
        let run = within(30, loadgen::replay::replay(&a)).await??;
        assert_eq!(run.session_mode, mode);
        let recs = &run.live.records;
        assert_eq!(recs.len(), 4);
        let a1 = recs
            .iter()
            .find(|r| r.record.session_id.as_deref() == Some("a") && r.record.turn_index == 1)
            .expect("session a turn 1");
        // History is never doubled: cumulative rows as they are, incremental rows prefixed once.
        assert_eq!(a1.prompt_tokens, Some(second_turn_tokens), "{file}");
        // The second turn reuses the first turn's full KV blocks (64 tokens).
        assert_eq!(a1.record.reused_input_tokens, 64, "{file}");
        assert_eq!(a1.expected_reused_tokens, Some(64), "{file}");
        // Closed loop: sent its delay (20 ms / 4) after turn 0 completed, not at its timestamp.
        let a0 = recs
            .iter()
            .find(|r| r.record.session_id.as_deref() == Some("a") && r.record.turn_index == 0)
            .expect("session a turn 0");
        let a0_end = a0.record.finish_ms.expect("finished");
        assert!(
            a1.scheduled_ms >= a0_end + 5.0 - 0.01,
            "{} vs {}",
            a1.scheduled_ms,
            a0_end
        );
    }
    Ok(())
}

/// Scheduled send times are the trace's timestamps exactly; actual sends are never early and
/// late by little (a bound a loaded 2-core machine holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pacing_follows_the_trace_timestamps() -> Result<()> {
    let path = fixture("trace_pacing.jsonl");
    let a = args(&[
        &path,
        "--arrival-speedup-ratio",
        "1",
        "--speedup-ratio",
        "inf",
        "--quiet",
    ]);
    let run = within(30, loadgen::replay::replay(&a)).await??;
    let scheduled: Vec<f64> = run.live.records.iter().map(|r| r.scheduled_ms).collect();
    assert_eq!(scheduled, vec![0.0, 100.0, 250.0, 260.0, 400.0]);
    for r in &run.live.records {
        assert!(r.sent_ms >= r.scheduled_ms);
        assert!(r.schedule_lag_ms < 250.0, "lag {}", r.schedule_lag_ms);
        assert_eq!(r.record.arrival_ms, r.scheduled_ms);
    }
    Ok(())
}

#[test]
fn trace_errors_are_line_numbered_as_in_mockserve() {
    let dir = std::env::temp_dir().join(format!("loadgen-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1}\n",
    )
    .expect("write");
    let a = args(&[path.to_str().expect("utf-8")]);
    let err = loadgen::replay::load_trace(&a).expect_err("bad row");
    assert!(err.to_string().contains("bad.jsonl:2:"), "{err}");
}

/// A row due in the far future (timestamp 1e300, a session delay of 1e18 ms, or ten days of
/// schedule at the speed-up) makes `loadgen replay` fail at once, naming the row, instead of
/// waiting for it; `--allow-long-schedule` accepts the ten days (and only loads here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_future_row_fails_fast_with_its_line() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("loadgen-replay-far-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let first =
        "{\"timestamp\": 0, \"session_id\": \"s\", \"output_length\": 1, \"hash_ids\": [1]}";
    let cases = [
        (
            "{\"timestamp\": 1e300, \"output_length\": 1, \"hash_ids\": [2]}",
            "far.jsonl:2: \"timestamp\" must be finite, >= 0 and at most 9.007199254740992e15 ms, got 1e300",
        ),
        (
            "{\"session_id\": \"s\", \"delay\": 1e18, \"output_length\": 1, \"hash_ids\": [2]}",
            "far.jsonl:2: \"delay\" must be finite, >= 0 and at most 1e12 ms, got 1e18",
        ),
        (
            // 40 days of trace time: 10 days at the default speed-up of 4.
            "{\"session_id\": \"s\", \"delay\": 3456000000, \"output_length\": 1, \"hash_ids\": [2]}",
            "far.jsonl:2: turn 1 of session \"s\" is due (its arrival plus its delays) at least \
             10.0 days after the trace's start, beyond the 7.0 days a trace's schedule may run; \
             pass --allow-long-schedule",
        ),
    ];
    let path = dir.join("far.jsonl");
    let path_str = path.to_str().expect("utf-8");
    for (row, says) in cases {
        std::fs::write(&path, format!("{first}\n{row}\n"))?;
        let cli = Cli::try_parse_from(["loadgen", "replay", path_str, "--quiet"])?;
        let err = within(30, loadgen::run_async(cli))
            .await?
            .expect_err("refused");
        let text = loadgen::error::chain(&err);
        assert!(
            matches!(err, loadgen::LoadgenError::Trace(_)) && text.contains(says),
            "{text}"
        );
    }
    let allowed = args(&[path_str, "--allow-long-schedule"]);
    let trace = loadgen::replay::load_trace(&allowed)?;
    assert_eq!(
        trace.sessions[0].turns[1].delay.as_micros(),
        864_000_000_000,
        "ten days, sped up"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
