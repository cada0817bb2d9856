//! One scrape of `/metrics`: the request, at most [`SCRAPE_TIMEOUT`] long, why it gave no
//! snapshot ([`ScrapeFailure`]), and the warning when the first scrape finds nothing to sample.

use std::time::Duration;

use crate::observe::scrape::snapshot::Snapshot;

/// How long one scrape may take before it counts as failed (timed out).
pub(crate) const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a scrape of `/metrics` gave no snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScrapeFailure {
    /// No complete answer within the timeout: the endpoint stalled.
    TimedOut(Duration),
    /// The request failed or was answered with an error status.
    Failed(String),
}

impl std::fmt::Display for ScrapeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScrapeFailure::TimedOut(t) => {
                write!(
                    f,
                    "the scrape timed out (no answer within {} s)",
                    t.as_secs_f64()
                )
            }
            ScrapeFailure::Failed(why) => write!(f, "the scrape failed: {why}"),
        }
    }
}

/// One scrape of `url`, at most `timeout` long.
pub(super) async fn fetch(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<Snapshot, ScrapeFailure> {
    let failure = |e: reqwest::Error| {
        if e.is_timeout() {
            ScrapeFailure::TimedOut(timeout)
        } else {
            ScrapeFailure::Failed(crate::error::chain(&e))
        }
    };
    let mut request = client.get(url).timeout(timeout);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(failure)?;
    if !response.status().is_success() {
        return Err(ScrapeFailure::Failed(format!(
            "answered {}",
            response.status()
        )));
    }
    let body = response.bytes().await.map_err(failure)?;
    // The text format is UTF-8; a body that is not is read with its bad bytes replaced.
    let text = match std::str::from_utf8(&body) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(&body),
    };
    Ok(Snapshot::read(&text))
}

/// The warning for a first scrape that found nothing to sample (None when there is nothing to
/// say): a stall is always reported, since it cost the run [`SCRAPE_TIMEOUT`]; other failures
/// and an exposition without a known metric only when `--scrape-metrics` asked for the series.
pub(crate) fn first_scrape_warning(
    url: &str,
    first: &Result<Snapshot, ScrapeFailure>,
    forced: bool,
) -> Option<String> {
    match first {
        Ok(s) if !s.is_empty() => None,
        Ok(_) => forced.then(|| format!("{url} serves no known server metric; not scraping")),
        Err(e @ ScrapeFailure::TimedOut(_)) => Some(format!(
            "{url}: {e}; not scraping the server's metrics (--no-scrape-metrics skips the try)"
        )),
        Err(e) => forced.then(|| format!("{url}: {e}; not scraping")),
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::scrape::parse::parse;
    use crate::observe::scrape::series::{series_with_timeouts, ServerMetrics};

    /// A `/metrics` that never answers is reported as a timed-out scrape (not as an exposition
    /// without known metrics), even when `--scrape-metrics` was not given; the console counts
    /// failed and timed-out scrapes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_metrics_endpoint_is_reported_as_timed_out() {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "vllm:num_requests_running 1\n"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let first = tokio::time::timeout(
            Duration::from_secs(30),
            fetch(
                &reqwest::Client::new(),
                &url,
                None,
                Duration::from_millis(200),
            ),
        )
        .await
        .expect("the scrape's own timeout ends it");
        server.abort();
        assert_eq!(
            first,
            Err(ScrapeFailure::TimedOut(Duration::from_millis(200)))
        );
        for forced in [false, true] {
            assert_eq!(
                first_scrape_warning(&url, &first, forced).as_deref(),
                Some(
                    format!(
                        "{url}: the scrape timed out (no answer within 0.2 s); not scraping the \
                         server's metrics (--no-scrape-metrics skips the try)"
                    )
                    .as_str()
                )
            );
        }
        let refused = Err(ScrapeFailure::Failed("answered 404 Not Found".into()));
        assert_eq!(first_scrape_warning(&url, &refused, false), None);
        assert_eq!(
            first_scrape_warning(&url, &refused, true).as_deref(),
            Some(
                format!("{url}: the scrape failed: answered 404 Not Found; not scraping").as_str()
            )
        );
        let unknown = Ok(Snapshot::of(&parse("unrelated 1\n")));
        assert_eq!(
            first_scrape_warning(&url, &unknown, true).as_deref(),
            Some(format!("{url} serves no known server metric; not scraping").as_str())
        );
        let known = Snapshot::of(&parse("vllm:num_requests_running 2\n"));
        let (samples, summary) = series_with_timeouts(&[(0.0, known)], 3, 2);
        let metrics = ServerMetrics {
            url: url.clone(),
            interval_ms: 500,
            summary,
            samples,
        };
        assert_eq!(
            metrics.console(),
            format!(
                "Server metrics (1 samples of {url}): running peak 2.0 mean 2.0; 3 scrapes \
                 failed (2 got no answer within 5 s)\n"
            )
        );
        assert_eq!(
            serde_json::to_value(&metrics.summary).expect("json")["timed_out_scrapes"],
            2
        );
    }
}
