//! The background sampler ([`Scraper`]): `/metrics` every interval while the run lasts, further
//! apart after a slow scrape, one last sample at the end, then the series.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::observe::scrape::fetch::{fetch, first_scrape_warning, ScrapeFailure, SCRAPE_TIMEOUT};
use crate::observe::scrape::series::{series_with_timeouts, ServerMetrics};
use crate::observe::scrape::snapshot::Snapshot;
use crate::run::target::Connected;

/// A scrape that takes longer than a tenth of the interval pushes the next one back to this
/// many times its duration, so that scraping a large exposition (a server with many workers
/// writes megabytes of histograms) takes at most a tenth of the run, on both sides.
const SLOW_SCRAPE_SPACING: u32 = 10;

/// Samples `/metrics` in the background, every interval, or less often when a scrape is slow
/// (the next waits ten times its duration).
pub(crate) struct Scraper {
    stop: oneshot::Sender<()>,
    task: JoinHandle<ServerMetrics>,
}

impl Scraper {
    /// Starts sampling `{target}/metrics` (or `metrics_url`, `--metrics-url`) every `interval`
    /// when it answers with a known metric; `forced` (`--scrape-metrics`) says so when it does
    /// not.
    pub(crate) async fn start(
        target: &Connected,
        metrics_url: Option<&str>,
        interval: Duration,
        forced: bool,
    ) -> Option<Scraper> {
        let url = match metrics_url {
            Some(url) => url.to_string(),
            None => format!("{}/metrics", target.url),
        };
        let client = target.endpoint.client.clone();
        let api_key = target.endpoint.api_key.clone();
        Scraper::sample(client, url, api_key, interval, forced).await
    }

    /// [`Scraper::start`] on the metrics at `url`.
    async fn sample(
        client: reqwest::Client,
        url: String,
        api_key: Option<String>,
        interval: Duration,
        forced: bool,
    ) -> Option<Scraper> {
        let began = Instant::now();
        let first = fetch(&client, &url, api_key.as_deref(), SCRAPE_TIMEOUT).await;
        let took = began.elapsed();
        if let Some(warning) = first_scrape_warning(&url, &first, forced) {
            crate::stdout::errln!("loadgen: warning: {warning}");
        }
        if first.as_ref().map_or(true, Snapshot::is_empty) {
            return None;
        }
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut snaps: Vec<(f64, Snapshot)> = Vec::new();
            let mut failed = 0u64;
            let mut timed_out = 0u64;
            if let Ok(s) = first {
                snaps.push((0.0, s));
            }
            let mut next = start + interval.max(took * SLOW_SCRAPE_SPACING);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => break,
                    _ = tokio::time::sleep_until(next) => {}
                }
                let began = Instant::now();
                let t = (began - start).as_secs_f64() * 1000.0;
                match fetch(&client, &url, api_key.as_deref(), SCRAPE_TIMEOUT).await {
                    Ok(s) if !s.is_empty() => snaps.push((t, s)),
                    Ok(_) | Err(ScrapeFailure::Failed(_)) => failed += 1,
                    Err(ScrapeFailure::TimedOut(_)) => {
                        failed += 1;
                        timed_out += 1;
                    }
                }
                next = began + interval.max(began.elapsed() * SLOW_SCRAPE_SPACING);
            }
            // One last sample at the end of the run.
            let t = start.elapsed().as_secs_f64() * 1000.0;
            if let Ok(s) = fetch(&client, &url, api_key.as_deref(), SCRAPE_TIMEOUT).await {
                if !s.is_empty() {
                    snaps.push((t, s));
                }
            }
            let (samples, summary) = series_with_timeouts(&snaps, failed, timed_out);
            ServerMetrics {
                url,
                interval_ms: interval.as_millis() as u64,
                summary,
                samples,
            }
        });
        Some(Scraper { stop, task })
    }

    /// Stops sampling; the series.
    pub(crate) async fn finish(self) -> ServerMetrics {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(10), self.task).await {
            Ok(Ok(m)) => m,
            _ => ServerMetrics::default(),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Samples `/metrics` served after `delay` every 50 ms for `run`; the samples' times.
    async fn sample_times(delay: Duration, run: Duration) -> Vec<f64> {
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || async move {
                tokio::time::sleep(delay).await;
                "vllm:num_requests_running 1\n"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let interval = Duration::from_millis(50);
        let scraper = Scraper::sample(reqwest::Client::new(), url, None, interval, true)
            .await
            .expect("the metrics are known");
        tokio::time::sleep(run).await;
        let metrics = scraper.finish().await;
        server.abort();
        assert_eq!(metrics.summary.failed_scrapes, 0);
        metrics.samples.iter().map(|s| s.t_ms).collect()
    }

    /// Fast scrapes come every interval; a scrape slower than a tenth of the interval pushes
    /// the next one back to ten times its duration (bounds generous for a loaded machine).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_scrapes_are_spaced_to_ten_times_their_duration() {
        let run = Duration::from_millis(900);
        let fast = sample_times(Duration::ZERO, run).await;
        assert!(fast.len() >= 6, "{fast:?}");
        let slow = sample_times(Duration::from_millis(60), run).await;
        // The first sample, the next at least 600 ms later, and the last at the end.
        assert!(slow.len() <= 4, "{slow:?}");
        for pair in slow[..slow.len() - 1].windows(2) {
            assert!(pair[1] - pair[0] >= 500.0, "{slow:?}");
        }
    }
}
