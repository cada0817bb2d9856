//! The test kit (feature `test-kit`): what the tests and benches of mockserve and of the crates
//! that embed it share: a bound on every await ([`within`]), an in-process server on
//! `127.0.0.1:0` ([`TestServer`]), an SSE reader ([`read_sse`], [`sse_data`]), a checking
//! parser of the Prometheus text exposition ([`parse_exposition`]) and a temporary directory
//! that removes itself ([`TempDir`]).
//!
//! ```
//! # fn main() -> anyhow::Result<()> {
//! use mock_server::config::ServerConfig;
//! use mock_server::test_kit::{within, TestServer};
//! tokio::runtime::Runtime::new()?.block_on(async {
//!     let server = TestServer::start(ServerConfig::default()).await?;
//!     let health = within(server.client.get(server.url("/health")).send()).await??;
//!     assert_eq!(health.status(), 200);
//!     server.shutdown().await
//! })
//! # }
//! ```
//!
//! Failures are errors naming what was wrong (the line of exposition text, the SSE frame), so a
//! test reports them through `?` without panicking in the kit.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures_util::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::api::AppState;
use crate::cmd::serve::serve_state;
use crate::config::ServerConfig;

/// The bound on one await in a test: generous, for a loaded 2-core CI box. A test that hits it
/// has hung, and says so instead of hanging CI.
pub const WAIT: Duration = Duration::from_secs(30);

/// Awaits `f` for at most [`WAIT`]; past it, the error "timed out after 30s".
pub async fn within<T>(f: impl Future<Output = T>) -> Result<T> {
    within_for(WAIT, f).await
}

/// Awaits `f` for at most `bound`; past it, an error naming the bound.
pub async fn within_for<T>(bound: Duration, f: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(bound, f)
        .await
        .with_context(|| format!("timed out after {bound:?}"))
}

/// mockserve on `127.0.0.1:0`, in this process, on the caller's runtime. Dropping it stops the
/// server (the accept loop ends and open requests drain); [`TestServer::shutdown`] also waits
/// for the drain and returns the server's own result.
pub struct TestServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// `http://ADDR`, without a trailing slash.
    pub base: String,
    /// The server's state: its engine handle (snapshots), config and metrics.
    pub state: AppState,
    /// A client for the tests' requests (no proxy, no TLS).
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl TestServer {
    /// Starts a server with `config` (its KV-event publishers bound first, as `mockserve serve`
    /// does).
    pub async fn start(config: ServerConfig) -> Result<TestServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = AppState::start(config).await?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_state(listener, state.clone(), async {
            let _ = stopped.await;
        }));
        Ok(TestServer {
            addr,
            base: format!("http://{addr}"),
            state,
            client: reqwest::Client::new(),
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The URL of `path` (which starts with `/`) on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Signals shutdown without waiting; the server stops accepting and drains.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// The server's task, once (for tests that watch the drain themselves); `None` after
    /// [`TestServer::shutdown`] or an earlier call.
    pub fn take_task(&mut self) -> Option<JoinHandle<Result<()>>> {
        self.task.take()
    }

    /// Stops the server and waits (at most [`WAIT`]) for it to drain; its error, if any.
    pub async fn shutdown(mut self) -> Result<()> {
        self.stop();
        match self.task.take() {
            Some(task) => within(task).await?.context("the server task panicked")?,
            None => Ok(()),
        }
    }

    /// Scrapes `/metrics` and parses it with [`parse_exposition`].
    pub async fn scrape(&self) -> Result<BTreeMap<String, f64>> {
        let response = within(self.client.get(self.url("/metrics")).send()).await??;
        ensure!(response.status() == 200, "/metrics: {}", response.status());
        parse_exposition(&within(response.text()).await??)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads a streamed answer to its end: the `data:` payload of each event with the time it
/// arrived since `t0`. The answer must be `200 text/event-stream`, every event one `data:` line
/// ending in a blank line, and nothing may trail the last one; each chunk is awaited with
/// [`within`]. A body that breaks off is an error; [`read_sse_until_cut`] returns what came.
pub async fn read_sse(response: reqwest::Response, t0: Instant) -> Result<Vec<(String, Duration)>> {
    let (events, cut) = read_sse_until_cut(response, t0).await?;
    match cut {
        Some(error) => Err(error).context("the body broke off"),
        None => Ok(events),
    }
}

/// [`read_sse`] for answers that may break off (injected faults, a shutdown): the events read
/// until the body ended, and the transport error that ended it early, if one did. Bytes left
/// after the last whole event are an error only when the body ended cleanly.
pub async fn read_sse_until_cut(
    response: reqwest::Response,
    t0: Instant,
) -> Result<(Vec<(String, Duration)>, Option<reqwest::Error>)> {
    ensure!(response.status() == 200, "status {}", response.status());
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    ensure!(
        content_type.starts_with("text/event-stream"),
        "content-type {content_type:?}"
    );
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    while let Some(chunk) = within(stream.next()).await? {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(error) => return Ok((events, Some(error))),
        };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let event = std::str::from_utf8(&event).context("an event that is not UTF-8")?;
            events.push((data_of(event)?.to_string(), t0.elapsed()));
        }
    }
    if !buffer.is_empty() {
        bail!("trailing bytes {:?}", String::from_utf8_lossy(&buffer));
    }
    Ok((events, None))
}

/// The `data:` payloads of a whole SSE body, checked as [`read_sse`] checks a stream.
pub fn sse_data(body: &str) -> Result<Vec<&str>> {
    let mut rest = body;
    let mut events = Vec::new();
    while let Some(end) = rest.find("\n\n") {
        events.push(data_of(&rest[..end + 2])?);
        rest = &rest[end + 2..];
    }
    ensure!(rest.is_empty(), "trailing bytes {rest:?}");
    Ok(events)
}

/// The payload of one event, `data: PAYLOAD\n\n`.
fn data_of(event: &str) -> Result<&str> {
    let line = event.trim_end_matches('\n');
    ensure!(!line.contains('\n'), "an event of several lines: {event:?}");
    line.strip_prefix("data: ")
        .with_context(|| format!("an event without data: {event:?}"))
}

/// Whether `name` is a valid metric or label name (`[a-zA-Z_:][a-zA-Z0-9_:]*`).
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses OpenMetrics text as `/metrics` serves it and returns the samples by `name{labels}`.
/// Checks each line: names, the `# TYPE` (counter, gauge, histogram) before a family's samples,
/// quoted label values, parseable values, and the closing `# EOF`; the error names the line.
pub fn parse_exposition(text: &str) -> Result<BTreeMap<String, f64>> {
    let mut samples = BTreeMap::new();
    let mut typed = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    ensure!(lines.last() == Some(&"# EOF"), "no closing # EOF");
    for (i, line) in lines[..lines.len() - 1].iter().enumerate() {
        let at = || format!("line {}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            ensure!(valid_name(name), "bad name, {}", at());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let (name, kind) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            ensure!(valid_name(name), "bad name, {}", at());
            ensure!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "unknown type, {}",
                at()
            );
            typed.insert(name.to_string(), kind.to_string());
        } else {
            let (series, value) = line
                .rsplit_once(' ')
                .with_context(|| format!("no value, {}", at()))?;
            let value: f64 = value
                .parse()
                .with_context(|| format!("bad value, {}", at()))?;
            let name = series.split('{').next().unwrap_or_default();
            ensure!(valid_name(name), "bad name, {}", at());
            let labels = &series[name.len()..];
            if !labels.is_empty() {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .with_context(|| format!("bad labels, {}", at()))?;
                for pair in inner.split(',') {
                    let (k, v) = pair
                        .split_once('=')
                        .with_context(|| format!("bad label, {}", at()))?;
                    ensure!(
                        valid_name(k) && !k.contains(':'),
                        "bad label name, {}",
                        at()
                    );
                    ensure!(
                        v.len() >= 2 && v.starts_with('"') && v.ends_with('"'),
                        "unquoted label value, {}",
                        at()
                    );
                }
            }
            let family = ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains_key(*f)))
                .unwrap_or(name);
            ensure!(
                typed.contains_key(family),
                "sample before its TYPE, {}",
                at()
            );
            samples.insert(series.to_string(), value);
        }
    }
    Ok(samples)
}

/// A fresh directory under the system's temporary directory, removed with its contents when
/// dropped (a failed test leaves nothing behind either).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `servesim-NAME-PID-N`, N counting the directories this process made, so tests
    /// running at once never share one.
    pub fn new(name: &str) -> Result<TempDir> {
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let n = MADE.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("servesim-{name}-{}-{n}", std::process::id()));
        // A directory left by a killed run of an earlier process with the same id.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `NAME` inside the directory (not created).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_parser_reads_samples_and_names_the_bad_line() -> Result<()> {
        let text = "# HELP a_total A.\n# TYPE a counter\na_total{x=\"1\"} 2\n# TYPE g gauge\n\
                    g 0.5\n# EOF\n";
        let samples = parse_exposition(text)?;
        assert_eq!(samples.get("a_total{x=\"1\"}"), Some(&2.0));
        assert_eq!(samples.get("g"), Some(&0.5));
        assert_eq!(samples.len(), 2);
        let cases = [
            ("# TYPE a counter\na_total 1\n", "no closing # EOF"),
            ("a 1\n# EOF\n", "sample before its TYPE, line 1"),
            ("# TYPE a gauge\na x\n# EOF\n", "bad value, line 2"),
            (
                "# TYPE a gauge\na{k=v} 1\n# EOF\n",
                "unquoted label value, line 2",
            ),
            ("# TYPE a summary\n# EOF\n", "unknown type, line 1"),
            ("# TYPE 1a gauge\n# EOF\n", "bad name, line 1"),
        ];
        for (text, want) in cases {
            let error = parse_exposition(text)
                .err()
                .context("accepted")?
                .to_string();
            assert!(error.starts_with(want), "{text:?}: {error}");
        }
        Ok(())
    }

    #[test]
    fn sse_data_reads_whole_bodies_and_refuses_partial_ones() -> Result<()> {
        assert_eq!(
            sse_data("data: {\"a\":1}\n\ndata: [DONE]\n\n")?,
            ["{\"a\":1}", "[DONE]"]
        );
        assert_eq!(sse_data("")?, Vec::<&str>::new());
        let error = sse_data("data: x\n\ndata: y").err().context("accepted")?;
        assert_eq!(error.to_string(), "trailing bytes \"data: y\"");
        let error = sse_data("event: e\n\n").err().context("accepted")?;
        assert!(
            error.to_string().starts_with("an event without data"),
            "{error}"
        );
        Ok(())
    }

    #[test]
    fn a_temp_dir_is_new_and_removed_with_its_contents() -> Result<()> {
        let (a, b) = (TempDir::new("kit")?, TempDir::new("kit")?);
        assert_ne!(a.path(), b.path());
        std::fs::create_dir_all(a.join("sub"))?;
        std::fs::write(a.path().join("sub/file"), "x")?;
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists(), "{} left behind", path.display());
        assert!(b.path().is_dir());
        Ok(())
    }

    #[tokio::test]
    async fn within_names_its_bound() {
        let slow = within_for(Duration::from_millis(1), std::future::pending::<()>()).await;
        let error = slow.err().map(|e| e.to_string());
        assert_eq!(error.as_deref(), Some("timed out after 1ms"));
    }
}
