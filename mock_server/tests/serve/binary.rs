//! The `mockserve` binary and its command line: flag parsing, a smoke test and stdout
//! closed early.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mock_server::cmd::serve::ServeArgs;
use mock_server::config::ServerConfig;
use mock_server::Cli;
use serde_json::Value;
use tokio::time::{timeout, Instant};

use crate::common::*;

#[test]
fn bare_mockserve_means_serve() -> Result<()> {
    let cli = Cli::try_parse_from(["mockserve", "--port", "0", "--speedup-ratio", "inf"])?;
    assert!(cli.command.is_none());
    assert_eq!(cli.serve.port, 0);
    let config = ServerConfig::from_args(&cli.serve)?;
    // An infinite speed-up makes every pass take no time.
    let latency = config.live_cluster().engine.latency;
    let batch = servesim::perf::DecodeBatch {
        num_requests: 4,
        active_kv_tokens: 1000,
        total_kv_tokens: 1 << 20,
    };
    assert_eq!(latency.decode(&batch), servesim::time::SimDuration::ZERO);
    assert_eq!(config.cluster.engine.max_model_len, Some(131072));

    let cli = Cli::try_parse_from([
        "mockserve",
        "serve",
        "--reasoning-ratio",
        "0.25",
        "--reasoning-format",
        "inline",
        "--fixed-latency",
        "20,5",
    ])?;
    let Some(mock_server::Command::Serve(args)) = cli.command else {
        bail!("expected serve");
    };
    let args: ServeArgs = args.serve;
    assert_eq!(ServerConfig::from_args(&args)?.reasoning_ratio, 0.25);
    assert!(Cli::try_parse_from(["mockserve", "--reasoning-ratio", "2"])
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(ServerConfig::from_args(&c.serve)?))
        .is_err());
    assert!(Cli::try_parse_from(["mockserve", "replay", "trace.jsonl"])?
        .command
        .is_some());
    Ok(())
}

/// The real binary prints its address and serves.
#[tokio::test]
async fn binary_smoke_test() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args([
            "--port",
            "0",
            "--speedup-ratio",
            "inf",
            "--num-workers",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    within(tokio::io::BufReader::new(stdout).read_line(&mut line)).await??;
    let url = line
        .trim()
        .strip_prefix("mockserve listening on ")
        .context("no address line")?
        .to_string();
    let response = within(reqwest::get(format!("{url}/health"))).await??;
    assert_eq!(response.status(), 200);
    child.kill().await?;
    Ok(())
}

/// `mockserve replay … | head`: the reader is gone before the report is printed. The command
/// ends quietly (no panic, exit 0) and still writes its report file.
#[tokio::test]
async fn replay_to_a_closed_pipe_exits_quietly() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("mockserve-pipe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let report = dir.join("report.json");
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/trace_small.jsonl");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(["replay", trace, "--quiet", "--report-json"])
        .arg(&report)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    // Close the read end at once: the replay has not printed anything yet.
    drop(child.stdout.take());
    let output = timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("replay timed out")??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
    assert!(
        written["completed_requests"].as_u64() > Some(0),
        "{written}"
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `mockserve serve` with nobody reading stdout: the listening line is dropped and the server
/// serves anyway.
#[tokio::test]
async fn serve_with_a_closed_stdout_keeps_serving() -> Result<()> {
    // A port free a moment ago: the address is not printed where anyone can read it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(["--port", &port.to_string(), "--speedup-ratio", "inf"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    drop(child.stdout.take());
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let output = child.wait_with_output().await?;
            bail!(
                "mockserve exited ({status}): {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let health = client
            .get(format!("http://127.0.0.1:{port}/health"))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if health.is_ok_and(|r| r.status() == 200) {
            break;
        }
        if Instant::now() > deadline {
            bail!("mockserve never answered on port {port}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().await?;
    Ok(())
}

/// `--exit-on-stdin-eof`: the server shuts down (exit 0, after the drain) once its stdin
/// closes, as when the parent holding the pipe dies; without the flag stdin is not read.
#[tokio::test]
async fn serve_exits_when_stdin_closes_with_exit_on_stdin_eof() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args([
            "--port",
            "0",
            "--speedup-ratio",
            "inf",
            "--tokenizer",
            "builtin",
            "--exit-on-stdin-eof",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let line = timeout(Duration::from_secs(60), stdout.next_line())
        .await??
        .context("no output")?;
    assert!(line.starts_with("mockserve listening on "), "{line}");
    // Still serving while stdin is open.
    assert!(child.try_wait()?.is_none());
    drop(child.stdin.take());
    let output = timeout(Duration::from_secs(30), child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("mockserve: stdin closed; shutting down"),
        "{stderr}"
    );
    Ok(())
}

/// `mockserve fleet` stops as `serve` does (one shutdown path): with `--exit-on-stdin-eof` the
/// fleet drains and exits 0 once its stdin closes.
#[tokio::test]
async fn fleet_exits_when_stdin_closes_with_exit_on_stdin_eof() -> Result<()> {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args([
            "fleet",
            "--workers",
            "2",
            "--port",
            "0",
            "--speedup-ratio",
            "inf",
            "--tokenizer",
            "builtin",
            "--exit-on-stdin-eof",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    for worker in 0..2 {
        let line = timeout(Duration::from_secs(60), stdout.next_line())
            .await??
            .context("no output")?;
        assert!(
            line.starts_with(&format!("mockserve fleet worker {worker} listening on ")),
            "{line}"
        );
    }
    assert!(child.try_wait()?.is_none());
    drop(child.stdin.take());
    let output = timeout(Duration::from_secs(30), child.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("mockserve: stdin closed; shutting down"),
        "{stderr}"
    );
    Ok(())
}
