//! The HTTP edge of `mockserve serve` over real `127.0.0.1:0` sockets: header-read, body-read
//! and idle timeouts, the connection cap, `Connection: close` where the server closes, OpenAI
//! error bodies on every status the server writes, and the shutdown drain (in-process and of the
//! real binary on SIGTERM). Raw `TcpStream`s play the slow and malformed clients; reqwest the
//! well-behaved ones.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use mock_server::config::{HttpLimits, ServerConfig};
use mock_server::test_kit::{within, TestServer};
use serde_json::{json, Value};
use servesim::cluster::ClusterConfig;
use servesim::perf::Fixed;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

/// Bound on any single wait; generous for a loaded CI box.
const WAIT: Duration = Duration::from_secs(15);

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Limits that stay out of the way unless a test tightens one.
fn relaxed() -> HttpLimits {
    HttpLimits {
        header_read_timeout: secs(30.0),
        body_read_timeout: secs(30.0),
        idle_timeout: secs(30.0),
        max_connections: 1000,
        shutdown_timeout: secs(5.0),
    }
}

/// One worker, no delay (or fixed pass times), the given limits.
fn config(http: HttpLimits, fixed_ms: Option<(f64, f64)>) -> ServerConfig {
    let mut cluster = ClusterConfig::default();
    cluster.engine.block_size = 16;
    match fixed_ms {
        Some((prefill_ms, decode_ms)) => {
            cluster.engine.latency.model = Arc::new(Fixed {
                prefill_ms,
                decode_ms,
            });
        }
        None => cluster.engine.latency.speedup_ratio = f64::INFINITY,
    }
    ServerConfig {
        http,
        ..ServerConfig::new(cluster)
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "mock-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 2,
    });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// Asserts the OpenAI error shape and returns the `error` object.
fn openai_error(body: &Value) -> Result<&Value> {
    let error = body
        .get("error")
        .with_context(|| format!("no error: {body}"))?;
    ensure!(error["message"].is_string(), "message: {body}");
    ensure!(error["type"].is_string(), "type: {body}");
    for key in ["param", "code"] {
        ensure!(error.get(key).is_some(), "{key} missing: {body}");
    }
    Ok(error)
}

/// A response read off a raw socket.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    /// Lower-cased names.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Reads one `Content-Length` response (no chunked bodies: errors and `/health` only).
async fn read_response(stream: &mut TcpStream) -> Result<RawResponse> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = within(stream.read(&mut chunk)).await??;
        ensure!(n > 0, "closed before a response head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = std::str::from_utf8(&buf[..head_end])?.to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("no status line")?;
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .context("no status")?
        .parse()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse::<usize>())
        .transpose()?;
    let mut body = buf[head_end..].to_vec();
    // Without a length, the body runs to the end of the connection.
    while length.is_none_or(|length| body.len() < length) {
        let mut chunk = [0u8; 4096];
        let n = within(stream.read(&mut chunk)).await??;
        if n == 0 {
            ensure!(length.is_none(), "closed inside a body");
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length.unwrap_or(body.len()));
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

/// Waits until the server closes `stream` (EOF or reset), writing `trickle` one byte every
/// 100 ms meanwhile; returns how long that took.
async fn closed_after(stream: &mut TcpStream, trickle: &[u8]) -> Result<Duration> {
    let t0 = Instant::now();
    let mut trickle = trickle.iter();
    let mut sink = [0u8; 1024];
    loop {
        ensure!(t0.elapsed() < WAIT, "still open after {WAIT:?}");
        tokio::select! {
            read = stream.read(&mut sink) => match read {
                Ok(0) | Err(_) => return Ok(t0.elapsed()),
                Ok(_) => {}
            },
            () = sleep(secs(0.1)) => {
                if let Some(byte) = trickle.next() {
                    if stream.write_all(&[*byte]).await.is_err() {
                        return Ok(t0.elapsed());
                    }
                }
            }
        }
    }
}

/// True if the server has not closed `stream` within `wait` (nothing is sent).
async fn still_open(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut sink = [0u8; 64];
    timeout(wait, stream.read(&mut sink)).await.is_err()
}

#[test]
fn http_flags_become_limits() -> Result<()> {
    use clap::Parser;
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "serve",
        "--header-read-timeout",
        "2.5",
        "--body-read-timeout",
        "3",
        "--idle-timeout",
        "4",
        "--max-connections",
        "7",
        "--shutdown-timeout",
        "0",
    ])?;
    let Some(mock_server::Command::Serve(args)) = cli.command else {
        bail!("expected serve");
    };
    let limits = ServerConfig::from_args(&args.serve)?.http;
    assert_eq!(
        limits,
        HttpLimits {
            header_read_timeout: secs(2.5),
            body_read_timeout: secs(3.0),
            idle_timeout: secs(4.0),
            max_connections: 7,
            shutdown_timeout: Duration::ZERO,
        }
    );
    // Bare `mockserve` takes them too; a zero read timeout is refused.
    let cli = mock_server::Cli::try_parse_from(["mockserve", "--idle-timeout", "0"])?;
    assert!(ServerConfig::from_args(&cli.serve).is_err());
    Ok(())
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n";

#[tokio::test]
async fn slowloris_headers_are_cut_at_the_header_read_timeout() -> Result<()> {
    let server = TestServer::start(config(
        HttpLimits {
            header_read_timeout: secs(0.5),
            ..relaxed()
        },
        None,
    ))
    .await?;
    // Headers trickled a byte every 100 ms never complete: closed at the deadline although
    // bytes keep coming (an idle timeout would not fire).
    // (Timed from before the connect: the deadline runs from the server's accept, later.)
    let t0 = Instant::now();
    let mut slow = within(TcpStream::connect(server.addr)).await??;
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\n")
        .await?;
    let trickle = b"x-slow: ".repeat(100);
    closed_after(&mut slow, &trickle).await?;
    let took = t0.elapsed();
    assert!(took >= secs(0.5), "closed too early: {took:?}");

    // A connection that never sends anything is closed at the same deadline.
    let mut silent = within(TcpStream::connect(server.addr)).await??;
    closed_after(&mut silent, b"").await?;

    // A request whose headers arrive in time is served.
    let mut ok = within(TcpStream::connect(server.addr)).await??;
    ok.write_all(HEALTH).await?;
    assert_eq!(read_response(&mut ok).await?.status, 200);
    Ok(())
}

#[tokio::test]
async fn a_body_slower_than_the_body_read_timeout_is_408_and_closed() -> Result<()> {
    let server = TestServer::start(config(
        HttpLimits {
            body_read_timeout: secs(0.5),
            ..relaxed()
        },
        None,
    ))
    .await?;
    let mut stream = within(TcpStream::connect(server.addr)).await??;
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"model\":",
        )
        .await?;
    let response = read_response(&mut stream).await?;
    assert_eq!(response.status, 408, "{response:?}");
    assert_eq!(response.header("connection"), Some("close"));
    assert_eq!(openai_error(&response.json()?)?["code"], "request_timeout");
    closed_after(&mut stream, b"").await?;

    // A whole body in time is served.
    let body = chat(json!({})).to_string();
    let response = within(
        server
            .client
            .post(format!("{}/v1/chat/completions", server.base))
            .header("content-type", "application/json")
            .body(body)
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 200);
    Ok(())
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() -> Result<()> {
    // Header deadline shorter than the idle one: an idle connection outlives the former.
    let server = TestServer::start(config(
        HttpLimits {
            header_read_timeout: secs(0.3),
            idle_timeout: secs(4.0),
            ..relaxed()
        },
        None,
    ))
    .await?;
    let mut stream = within(TcpStream::connect(server.addr)).await??;
    stream.write_all(HEALTH).await?;
    let response = read_response(&mut stream).await?;
    assert_eq!(response.status, 200);
    assert_ne!(response.header("connection"), Some("close"));
    // Kept alive past the header deadline: the server cannot close before idle_timeout (3 s
    // of slack for a slow client on a loaded machine).
    assert!(still_open(&mut stream, secs(0.8)).await);
    // Still usable, and then closed once idle for idle_timeout.
    stream.write_all(HEALTH).await?;
    assert_eq!(read_response(&mut stream).await?.status, 200);
    // (The server's idle clock starts a little before the client has read the response.)
    let took = closed_after(&mut stream, b"").await?;
    assert!(took >= secs(1.0), "closed too early: {took:?}");
    Ok(())
}

#[tokio::test]
async fn connections_over_the_cap_get_an_openai_503_then_close() -> Result<()> {
    let server = TestServer::start(config(
        HttpLimits {
            max_connections: 2,
            ..relaxed()
        },
        None,
    ))
    .await?;
    let mut first = within(TcpStream::connect(server.addr)).await??;
    let _second = within(TcpStream::connect(server.addr)).await??;
    // Both are served once accepted (the accept loop takes them in order).
    first.write_all(HEALTH).await?;
    assert_eq!(read_response(&mut first).await?.status, 200);

    let mut third = within(TcpStream::connect(server.addr)).await??;
    third
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}")
        .await?;
    let response = read_response(&mut third).await?;
    assert_eq!(response.status, 503, "{response:?}");
    assert_eq!(response.header("connection"), Some("close"));
    assert!(response.header("retry-after").is_some());
    let body = response.json()?;
    let error = openai_error(&body)?;
    assert_eq!(error["code"], "too_many_connections");
    assert_eq!(error["type"], "server_error");
    closed_after(&mut third, b"").await?;

    // Once a slot frees, a new connection is served again.
    drop(first);
    let t0 = Instant::now();
    loop {
        let status = within(
            server
                .client
                .get(format!("{}/health", server.base))
                .header("connection", "close")
                .send(),
        )
        .await??
        .status();
        if status == 200 {
            break;
        }
        assert_eq!(status, 503);
        ensure!(t0.elapsed() < WAIT, "the freed slot was never reused");
        sleep(secs(0.05)).await;
    }
    Ok(())
}

#[tokio::test]
async fn payload_too_large_closes_with_connection_close_and_the_pool_recovers() -> Result<()> {
    let mut cfg = config(relaxed(), None);
    cfg.max_body_bytes = 1024;
    let server = TestServer::start(cfg).await?;
    let url = format!("{}/v1/chat/completions", server.base);
    let small = chat(json!({})).to_string();
    let post = |body: String| {
        server
            .client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // A pooled connection, then bodies over the limit: a little over, and far over (the
    // server answers on Content-Length alone and drops the rest of the body).
    assert_eq!(within(post(small.clone())).await??.status(), 200);
    for size in [4 << 10, 4 << 20] {
        let big = chat(json!({"padding": "p".repeat(size)})).to_string();
        let response = within(post(big)).await??;
        assert_eq!(response.status(), 413);
        let close = response
            .headers()
            .get("connection")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(close.as_deref(), Some("close"));
        let body: Value = within(response.json()).await??;
        assert_eq!(openai_error(&body)?["code"], "request_too_large");
        // The same client's next request succeeds (on a new connection).
        assert_eq!(within(post(small.clone())).await??.status(), 200);
    }

    // On a raw socket: the server closes after the 413.
    let mut stream = within(TcpStream::connect(server.addr)).await??;
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
              content-length: 5000\r\n\r\n",
        )
        .await?;
    let response = read_response(&mut stream).await?;
    assert_eq!(response.status, 413);
    closed_after(&mut stream, b"").await?;
    // Lingering close: the server only half-closed and drops what the client still sends, so a
    // client still writing its body meets no reset (which could destroy the unread 413).
    for _ in 0..3 {
        stream.write_all(&[b' '; 1000]).await?;
        sleep(secs(0.05)).await;
    }
    Ok(())
}

#[tokio::test]
async fn every_status_the_router_writes_has_an_openai_body() -> Result<()> {
    let mut cfg = config(relaxed(), None);
    cfg.max_model_len = 64;
    let server = TestServer::start(cfg).await?;
    let client = &server.client;
    let get = |path: &str| client.get(format!("{}{path}", server.base)).send();

    // 404: unknown route.
    let response = within(get("/v1/nope")).await??;
    assert_eq!(response.status(), 404);
    let body: Value = within(response.json()).await??;
    assert_eq!(openai_error(&body)?["code"], "not_found");

    // 405: known route, wrong method; `Allow` names the right one.
    let response = within(get("/v1/chat/completions")).await??;
    assert_eq!(response.status(), 405);
    assert_eq!(
        response
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok()),
        Some("POST")
    );
    let body: Value = within(response.json()).await??;
    assert_eq!(openai_error(&body)?["code"], "method_not_allowed");
    let response = within(client.delete(format!("{}/health", server.base)).send()).await??;
    assert_eq!(response.status(), 405);
    let body: Value = within(response.json()).await??;
    openai_error(&body)?;

    // 431: headers over the handlers' limit (well inside hyper's own).
    let response = within(
        client
            .get(format!("{}/health", server.base))
            .header("x-big", "b".repeat(100 << 10))
            .send(),
    )
    .await??;
    assert_eq!(response.status(), 431);
    let body: Value = within(response.json()).await??;
    assert_eq!(
        openai_error(&body)?["code"],
        "request_header_fields_too_large"
    );

    // Context length: `param` names the field that holds the prompt.
    let long = "word ".repeat(200);
    for (path, body, param) in [
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": long, "max_tokens": 4}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"model": "mock-model", "prompt": long}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"messages": [{"role": "user", "content": long}]})),
            "messages",
        ),
    ] {
        let response = within(
            client
                .post(format!("{}{path}", server.base))
                .json(&body)
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 400);
        let body: Value = within(response.json()).await??;
        let error = openai_error(&body)?;
        assert_eq!(error["code"], "context_length_exceeded", "{body}");
        assert_eq!(error["param"], param, "{path}: {body}");
    }

    // What hyper answers itself, before any service sees the request: a malformed request line
    // is a 400 with an empty body, and the connection is closed.
    let mut stream = within(TcpStream::connect(server.addr)).await??;
    stream.write_all(b"NOT HTTP AT ALL\r\n\r\n").await?;
    let response = read_response(&mut stream).await?;
    assert_eq!(response.status, 400);
    assert!(response.body.is_empty());
    closed_after(&mut stream, b"").await?;
    Ok(())
}

/// SSE `data:` payloads of a streamed response, until the body ends.
async fn sse_events(response: reqwest::Response) -> Result<Vec<String>> {
    let events = crate::common::read_sse(response, Instant::now()).await?;
    Ok(events.into_iter().map(|(data, _)| data).collect())
}

/// Asserts a stream that the shutdown deadline cut: some tokens, then an OpenAI error event,
/// then `[DONE]`.
fn assert_cut_by_shutdown(events: &[String], max_tokens: usize) -> Result<()> {
    let [.., error, done] = events else {
        bail!("too few events: {events:?}");
    };
    assert_eq!(done, "[DONE]");
    let error: Value = serde_json::from_str(error)?;
    assert_eq!(
        openai_error(&error)?["code"],
        "service_unavailable",
        "{error}"
    );
    // Role chunk + tokens + error + [DONE]: fewer tokens than asked for.
    assert!(events.len() - 3 < max_tokens, "{} events", events.len());
    Ok(())
}

#[tokio::test]
async fn shutdown_drains_short_streams_and_cuts_long_ones_at_the_deadline() -> Result<()> {
    // 50 ms per token: the short stream (4 tokens, 0.2 s) ends inside the 3 s drain, the long
    // one (400 tokens, ~20 s) is cut at its deadline.
    let mut server = TestServer::start(config(
        HttpLimits {
            shutdown_timeout: secs(3.0),
            ..relaxed()
        },
        Some((5.0, 50.0)),
    ))
    .await?;
    let url = format!("{}/v1/chat/completions", server.base);
    // Response headers mean the request is in the engine and its stream open.
    let open = |max_tokens: usize| {
        server
            .client
            .post(&url)
            .json(&chat(json!({"stream": true, "max_tokens": max_tokens})))
            .send()
    };
    let long = tokio::spawn(sse_events(within(open(400)).await??));
    let short = tokio::spawn(sse_events(within(open(4)).await??));
    let task = server.take_task().context("the server's task")?;
    let shutdown_at = Instant::now();
    server.stop();

    // New connections are refused once the listener is closed.
    loop {
        match TcpStream::connect(server.addr).await {
            Err(_) => break,
            Ok(_) => {
                ensure!(shutdown_at.elapsed() < WAIT, "still accepting");
                sleep(secs(0.02)).await;
            }
        }
    }

    let short = within(short).await???;
    assert_eq!(short.last().map(String::as_str), Some("[DONE]"));
    assert!(
        short.iter().all(|e| !e.contains("\"error\"")),
        "short stream cut: {short:?}"
    );
    let finish: Value = serde_json::from_str(&short[short.len() - 2])?;
    assert_eq!(finish["choices"][0]["finish_reason"], "length");

    let long = within(long).await???;
    assert_cut_by_shutdown(&long, 400)?;
    within(task).await???;
    let took = shutdown_at.elapsed();
    assert!(took >= secs(2.9), "cut before the deadline: {took:?}");
    Ok(())
}

/// The real binary: SIGTERM drains until `--shutdown-timeout`, ends an open stream with an
/// error event and exits 0; a second signal exits at once.
#[cfg(unix)]
#[tokio::test]
async fn the_binary_drains_on_sigterm_and_exits_on_a_second_signal() -> Result<()> {
    for second_signal in [false, true] {
        let shutdown_timeout = if second_signal { "600" } else { "1" };
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mockserve"))
            .args([
                "serve",
                "--port",
                "0",
                "--fixed-latency",
                "5,50",
                "--shutdown-timeout",
                shutdown_timeout,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().context("no pid")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let mut stderr = BufReader::new(child.stderr.take().context("stderr")?).lines();
        let line = within(stdout.next_line()).await??.context("no output")?;
        let base = line
            .strip_prefix("mockserve listening on ")
            .with_context(|| format!("unexpected first line {line:?}"))?
            .to_string();

        let response = within(
            reqwest::Client::new()
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat(json!({"stream": true, "max_tokens": 400})))
                .send(),
        )
        .await??;
        assert_eq!(response.status(), 200);
        let stream = tokio::spawn(sse_events(response));
        sleep(secs(0.2)).await;

        let kill = |signal: &'static str| async move {
            let status = tokio::process::Command::new("kill")
                .args([signal, &pid.to_string()])
                .status()
                .await?;
            ensure!(status.success(), "kill {signal} failed");
            anyhow::Ok(())
        };
        let signalled = Instant::now();
        within(kill("-TERM")).await??;
        // The first signal is acknowledged before the second is sent (signals coalesce).
        loop {
            let line = within(stderr.next_line())
                .await??
                .context("stderr closed")?;
            if line.contains("shutting down") {
                break;
            }
        }
        if second_signal {
            within(kill("-INT")).await??;
            let status = within(child.wait()).await??;
            assert!(!status.success(), "a forced exit is an error: {status}");
            // The stream was not drained: it ends without [DONE] (or with an error).
            let _ = within(stream).await?;
        } else {
            let events = within(stream).await???;
            assert_cut_by_shutdown(&events, 400)?;
            let status = within(child.wait()).await??;
            assert!(status.success(), "{status}");
        }
        let took = signalled.elapsed();
        // Well under the ~20 s the undrained stream would take.
        assert!(took < secs(15.0), "took {took:?} to exit");
    }
    Ok(())
}
