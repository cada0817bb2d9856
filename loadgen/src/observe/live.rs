//! The live view of a running run on stderr: requests per second and output tokens per second
//! over the last refresh, requests in flight, errors, and TTFT p50/p99 so far. On a terminal
//! the line is redrawn in place every [`TERMINAL_REFRESH`]; otherwise (a log, CI) a plain line is
//! printed every [`PLAIN_REFRESH`]. `-q` turns it off.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::run::client::FirstToken;
use crate::run::driver::{Observer, Sample};

/// Redraw interval on a terminal.
pub(crate) const TERMINAL_REFRESH: Duration = Duration::from_millis(500);

/// Interval of the plain progress line when stderr is not a terminal.
pub(crate) const PLAIN_REFRESH: Duration = Duration::from_secs(5);

/// TTFT samples kept for the live percentiles (a uniform thinning beyond).
const MAX_TTFT_SAMPLES: usize = 20_000;

/// What the live view has seen so far.
#[derive(Debug, Default, Clone)]
pub(crate) struct LiveStats {
    /// Requests completed (successes and failures).
    pub completed: u64,
    /// Failed requests.
    pub errors: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    /// TTFTs (ms) of successful requests (thinned past a bound).
    ttfts_ms: Vec<f64>,
    /// Every `stride`-th TTFT is kept once the bound is reached.
    stride: u64,
    seen: u64,
}

impl LiveStats {
    /// Adds one completed request.
    pub(crate) fn add(&mut self, s: &Sample) {
        self.completed += 1;
        if s.response.failure.is_some() {
            self.errors += 1;
            return;
        }
        self.output_tokens += s.response.output_tokens;
        let Some(t) = s.ttft_us(FirstToken::Any) else {
            return;
        };
        self.seen += 1;
        if self.stride == 0 {
            self.stride = 1;
        }
        if self.seen % self.stride == 0 {
            self.ttfts_ms.push(t as f64 / 1000.0);
        }
        if self.ttfts_ms.len() >= MAX_TTFT_SAMPLES {
            // Keep every other sample and halve the rate from now on.
            let kept: Vec<f64> = self.ttfts_ms.iter().copied().step_by(2).collect();
            self.ttfts_ms = kept;
            self.stride *= 2;
        }
    }

    /// TTFT p50 and p99 so far (ms).
    pub(crate) fn ttft_p50_p99(&self) -> Option<(f64, f64)> {
        if self.ttfts_ms.is_empty() {
            return None;
        }
        let mut v = self.ttfts_ms.clone();
        v.sort_by(f64::total_cmp);
        let at = |p: f64| servesim::metrics::Distribution::percentile(&v, p);
        Some((at(50.0)?, at(99.0)?))
    }
}

/// One status line.
pub(crate) fn line(
    stats: &LiveStats,
    previous: &LiveStats,
    interval_s: f64,
    in_flight: u64,
    elapsed_s: f64,
    expected: Option<usize>,
) -> String {
    let rps = (stats.completed - previous.completed.min(stats.completed)) as f64 / interval_s;
    let tps =
        (stats.output_tokens - previous.output_tokens.min(stats.output_tokens)) as f64 / interval_s;
    let ttft = stats
        .ttft_p50_p99()
        .map_or("-".into(), |(a, b)| format!("{a:.1}/{b:.1} ms"));
    let done = match expected {
        Some(n) => format!("{}/{n}", stats.completed),
        None => stats.completed.to_string(),
    };
    format!(
        "[{elapsed_s:>6.1}s] done {done}  {rps:>7.1} req/s  {tps:>9.1} tok/s  in flight {in_flight}  errors {}  TTFT p50/p99 {ttft}",
        stats.errors
    )
}

/// The running live view.
pub(crate) struct LiveView {
    stats: Arc<Mutex<LiveStats>>,
    sent: Arc<AtomicU64>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl LiveView {
    /// Starts the refresh task (`expected` requests in all, when known).
    pub(crate) fn start(expected: Option<usize>) -> LiveView {
        let stats = Arc::new(Mutex::new(LiveStats::default()));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop, mut stopped) = oneshot::channel();
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal {
            TERMINAL_REFRESH
        } else {
            PLAIN_REFRESH
        };
        let (st, se) = (stats.clone(), sent.clone());
        let task = tokio::spawn(async move {
            let start = Instant::now();
            let mut previous = LiveStats::default();
            let mut ticker = tokio::time::interval_at(start + every, every);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stopped => break,
                    _ = ticker.tick() => {}
                }
                // Short section, never across an await.
                let now = st.lock().map(|s| s.clone()).unwrap_or_default();
                let in_flight = se.load(Ordering::Relaxed).saturating_sub(now.completed);
                let text = line(
                    &now,
                    &previous,
                    every.as_secs_f64(),
                    in_flight,
                    start.elapsed().as_secs_f64(),
                    expected,
                );
                let mut err = std::io::stderr();
                if terminal {
                    let _ = write!(err, "\r\x1b[2K{text}");
                } else {
                    let _ = writeln!(err, "{text}");
                }
                let _ = err.flush();
                previous = now;
            }
            if terminal {
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
            }
        });
        LiveView {
            stats,
            sent,
            stop,
            task,
        }
    }

    /// The driver observer that feeds it.
    pub(crate) fn observer(&self) -> Observer {
        let stats = self.stats.clone();
        Arc::new(move |s: &Sample| {
            // Short section, never across an await.
            if let Ok(mut st) = stats.lock() {
                st.add(s);
            }
        })
    }

    /// The counter the driver increments per sent request.
    pub(crate) fn sent_counter(&self) -> Arc<AtomicU64> {
        self.sent.clone()
    }

    /// Stops the refresh and clears the line.
    pub(crate) async fn finish(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_rates_in_flight_errors_and_percentiles() {
        let now = LiveStats {
            completed: 30,
            errors: 2,
            output_tokens: 3000,
            ttfts_ms: (1..=100).map(f64::from).collect(),
            ..LiveStats::default()
        };
        let before = LiveStats {
            completed: 10,
            output_tokens: 1000,
            ..LiveStats::default()
        };
        let l = line(&now, &before, 2.0, 5, 12.0, Some(100));
        assert!(l.contains("done 30/100"), "{l}");
        assert!(
            l.contains("10.0 req/s") && l.contains("1000.0 tok/s"),
            "{l}"
        );
        assert!(l.contains("in flight 5") && l.contains("errors 2"), "{l}");
        assert!(l.contains("TTFT p50/p99 51.0/99.0 ms"), "{l}");
        assert!(line(&LiveStats::default(), &before, 1.0, 0, 0.0, None).contains("TTFT p50/p99 -"));
    }
}
