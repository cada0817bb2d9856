//! Starting up: every socket is bound and every port range checked before the address is
//! printed, failures are one error line naming the flag, flags of sane size only, and the idle
//! timeout flag.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use mock_server::api::AppState;
use mock_server::cmd::serve::HttpArgs;
use mock_server::config::ServerConfig;
use mock_server::test_kit::TestServer;
use mock_server::Cli;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Generous bound for each wait on a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// The configuration `mockserve serve FLAGS` describes, or its error (clap's or ours).
fn serve_config(flags: &[&str]) -> Result<ServerConfig> {
    let mut argv = vec!["mockserve", "serve"];
    argv.extend_from_slice(flags);
    let cli = Cli::try_parse_from(&argv)?;
    let Some(mock_server::Command::Serve(args)) = cli.command else {
        bail!("expected serve");
    };
    Ok(ServerConfig::from_serve_args(&args.serve, &args.vllm)?)
}

#[test]
fn bad_server_flags_are_refused_naming_the_flag() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--api-key", ""], &["--api-key must not be empty"]),
        (&["--api-key", "  "], &["--api-key must not be empty"]),
        (&["--model-name", ""], &["--model-name must not be empty"]),
        (
            &["--fixed-latency", "1e308,5"],
            &["--fixed-latency", "at most 3600000 ms", "got 1e308"],
        ),
        (
            &["--idle-timeout-s", "1e308"],
            &["--idle-timeout", "got 1e308"],
        ),
        (&["--idle-timeout", "0"], &["--idle-timeout", "above 0"]),
        (
            &["--header-read-timeout=-1"],
            &["--header-read-timeout", "got -1"],
        ),
        (&["--body-read-timeout", "nan"], &["--body-read-timeout"]),
        (
            &["--shutdown-timeout", "86401"],
            &["--shutdown-timeout", "up to 86400"],
        ),
        (&["--startup-delay", "inf"], &["--startup-delay", "got inf"]),
        (&["--fault-rate", "1e308"], &["--fault-rate", "got 1e308"]),
        (
            &["--max-inflight-bytes", "0"],
            &["--max-inflight-bytes must be between 1 and 2^50"],
        ),
        (
            &["--max-inflight-bytes", "1125899906842625"],
            &["--max-inflight-bytes must be between 1 and 2^50"],
        ),
        (&["--fault-rate=-1e300"], &["--fault-rate", "got -1e300"]),
        (
            &["--router-temperature", "nan"],
            &["--router-temperature", "got NaN"],
        ),
        (
            &["--max-model-len", "2000000000000"],
            &["--max-model-len must be between 1 and 2^40"],
        ),
        (
            &["--default-max-tokens", "2000000000000"],
            &["--default-max-tokens must be between 1 and 2^40"],
        ),
        (
            &["--max-body-bytes", "2000000000"],
            &["--max-body-bytes must be between 1 and 2^30"],
        ),
        (
            &["--speedup-ratio", "1e-308"],
            &["--speedup-ratio", "got 1e-308"],
        ),
        (
            &[
                "--num-workers",
                "2",
                "--kv-events-endpoint",
                "tcp://*:65535",
            ],
            &[
                "--kv-events-endpoint tcp://*:65535",
                "worker 1",
                "port 65536",
            ],
        ),
        (
            &[
                "--num-workers",
                "3",
                "--kv-events-endpoint",
                "tcp://*:5557",
                "--kv-events-replay-endpoint",
                "tcp://*:65534",
            ],
            &["--kv-events-replay-endpoint tcp://*:65534", "port 65536"],
        ),
        (
            &[
                "--num-workers",
                "4",
                "--kv-events-endpoint",
                "tcp://*:5557",
                "--kv-events-replay-endpoint",
                "tcp://*:5559",
            ],
            &[
                "--kv-events-replay-endpoint tcp://*:5559",
                "5559..=5562",
                "publish ports 5557..=5560",
            ],
        ),
        (
            &[
                "--serving-mode",
                "disagg",
                "--num-prefill-workers",
                "2",
                "--num-decode-workers",
                "2",
                "--kv-events-endpoint",
                "tcp://*:65533",
            ],
            &["--kv-events-endpoint", "worker 3", "port 65536"],
        ),
    ];
    for (flags, needles) in cases {
        let message = match serve_config(flags) {
            Ok(_) => panic!("{flags:?} accepted"),
            Err(e) => format!("{e:#}"),
        };
        for needle in *needles {
            assert!(message.contains(needle), "{flags:?}: {message}");
        }
        assert!(
            !message.contains("0000000000000000"),
            "{flags:?}: a huge number written out: {message}"
        );
        // HTTP and KV-event flags are no engine settings (issue 43).
        assert!(!message.contains("engine setting"), "{flags:?}: {message}");
    }
    // The in-flight bound has its default, and 2^50 lifts it.
    let default = serve_config(&[]).expect("valid");
    assert_eq!(
        default.max_inflight_bytes,
        mock_server::config::DEFAULT_MAX_INFLIGHT_BYTES
    );
    assert_eq!(default.max_inflight_bytes, 2 << 30);
    let lifted = serve_config(&["--max-inflight-bytes", "1125899906842624"]).expect("valid");
    assert_eq!(lifted.max_inflight_bytes, 1 << 50);
    // Ranges that fit, and replay ports apart from the publish ones, are fine.
    serve_config(&[
        "--num-workers",
        "2",
        "--kv-events-endpoint",
        "tcp://*:65534",
        "--kv-events-replay-endpoint",
        "tcp://*:5600",
    ])
    .expect("valid");
}

#[test]
fn the_idle_timeout_defaults_to_five_seconds_and_takes_a_flag() -> Result<()> {
    assert_eq!(HttpArgs::default().idle_timeout, 5.0);
    assert_eq!(serve_config(&[])?.http.idle_timeout, Duration::from_secs(5));
    assert_eq!(
        serve_config(&["--idle-timeout-s", "0.25"])?
            .http
            .idle_timeout,
        Duration::from_millis(250)
    );
    Ok(())
}

#[tokio::test]
async fn a_connection_idle_past_idle_timeout_s_is_closed() -> Result<()> {
    let config = serve_config(&["--idle-timeout-s", "0.5", "--speedup-ratio", "inf"])?;
    let server = TestServer::start(config).await?;
    let mut stream = timeout(WAIT, TcpStream::connect(server.addr)).await??;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n")
        .await?;
    // Reads the response, then waits for the server to close the idle connection: well within
    // the bound at 0.5 s, never at the former 120 s default.
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = timeout(WAIT, stream.read(&mut buf))
            .await
            .context("the idle connection was not closed")??;
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    Ok(())
}

#[tokio::test]
async fn a_kv_port_in_use_is_one_error_naming_the_flag_before_serving() -> Result<()> {
    let busy = std::net::TcpListener::bind("0.0.0.0:0")?;
    let port = busy.local_addr()?.port();
    let endpoint = format!("tcp://*:{port}");
    let config = serve_config(&["--num-workers", "1", "--kv-events-endpoint", &endpoint])?;
    let error = match AppState::start(config).await {
        Ok(_) => bail!("bound a port in use"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.starts_with(&format!(
            "--kv-events-endpoint {endpoint}: worker 0 cannot bind 0.0.0.0:{port}: "
        )),
        "{error}"
    );
    assert_eq!(error.matches("in use").count(), 1, "{error}");
    drop(busy);
    Ok(())
}

/// Runs the real binary with `flags`; it must fail at once.
async fn failing_binary(flags: &[&str]) -> Result<(String, String)> {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(flags)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let output = timeout(WAIT, child.wait_with_output())
        .await
        .context("the binary kept running")??;
    assert!(!output.status.success(), "{flags:?} exited 0");
    Ok((
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[tokio::test]
async fn the_binary_prints_no_address_when_a_kv_socket_cannot_start() -> Result<()> {
    let busy = std::net::TcpListener::bind("0.0.0.0:0")?;
    let port = busy.local_addr()?.port().to_string();
    let endpoint = format!("tcp://*:{port}");
    let cases: [(Vec<&str>, Vec<&str>); 2] = [
        (
            vec!["--num-workers", "1", "--kv-events-endpoint", &endpoint],
            vec!["--kv-events-endpoint", &port, "in use"],
        ),
        (
            vec![
                "--num-workers",
                "2",
                "--kv-events-endpoint",
                "tcp://*:65535",
            ],
            vec!["--kv-events-endpoint", "65536"],
        ),
    ];
    for (flags, needles) in cases {
        let mut argv = vec!["--port", "0", "--speedup-ratio", "inf"];
        argv.extend_from_slice(&flags);
        check_one_line(&argv, &needles).await?;
    }
    // The HTTP port itself in use: named by its flags.
    check_one_line(
        &["--host", "0.0.0.0", "--port", &port],
        &["--host 0.0.0.0 --port", &port, "in use"],
    )
    .await?;
    drop(busy);
    Ok(())
}

/// The binary run with `argv` fails, prints nothing on stdout and one error line holding `needles`.
async fn check_one_line(argv: &[&str], needles: &[&str]) -> Result<()> {
    let (stdout, stderr) = failing_binary(argv).await?;
    assert_eq!(stdout, "", "{argv:?}: no address printed");
    assert_eq!(stderr.lines().count(), 1, "{argv:?}: one line: {stderr}");
    assert!(stderr.starts_with("mockserve: error: "), "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "{argv:?}: {stderr}");
    }
    Ok(())
}
