//! What a run shows besides its report: the live view on the terminal (`live`) and the
//! target's Prometheus metrics sampled while it runs ([`scrape`]); the HTML report is
//! `crate::report::html`'s. [`ObserveArgs`] are the flags every run command shares;
//! `Observe` runs beside the driver and [`Observed`] is what it saw.

pub(crate) mod live;
pub mod scrape;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::error::LoadgenError;
use crate::limits;
use crate::observe::live::LiveView;
use crate::observe::scrape::{Lateness, OwnRouting, Scraper, ServerMetrics};
use crate::run::driver::RunHooks;
use crate::run::target::Connected;
use mock_server::args::ReportArgs;

/// Server metrics and HTML report flags (shared by every run command).
#[derive(Args, Clone, Debug, Default)]
pub struct ObserveArgs {
    /// Sample the target's Prometheus `/metrics` while the run lasts (running and waiting
    /// requests, KV usage, prefix-cache hit rate, preemptions, per worker) [default: on when the
    /// target serves /metrics].
    #[arg(long, overrides_with = "no_scrape_metrics")]
    pub scrape_metrics: bool,

    /// Never read the target's `/metrics`.
    #[arg(long, overrides_with = "scrape_metrics")]
    pub no_scrape_metrics: bool,

    /// Sample this Prometheus endpoint instead of the target's `/metrics`: the workers' or a
    /// `mockserve fleet` admin's behind a router (whose routing judge adds a routing-quality
    /// line to the summary).
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,

    /// Interval between two samples of `/metrics`, in ms; a slow scrape (a large exposition)
    /// pushes the next one back to ten times its duration, so that scraping takes at most a
    /// tenth of the run. At most 3600000 (one hour); below 50 counts as 50.
    #[arg(long, default_value_t = 500)]
    pub scrape_interval_ms: u64,

    /// Write a self-contained HTML report (latency CDFs, time series, server metrics, the
    /// configuration) to this file.
    #[arg(long, value_name = "PATH")]
    pub html: Option<PathBuf>,

    /// Fail the run (exit status 1, after its report) when the server fell behind its own
    /// schedule: its 99th-percentile token lateness over the run (mockserve's
    /// `servesim_token_lateness_seconds`, read from /metrics) is above this many ms, so the
    /// latencies measured include host delay. A target that does not report it fails the
    /// check (0 to 3600000).
    #[arg(long, value_name = "MS")]
    pub max_server_lateness: Option<f64>,
}

impl ObserveArgs {
    /// Checks the flags' ranges (`--scrape-interval-ms` and `--max-server-lateness` at most
    /// `limits::MAX_DELAY_MS`; the latter needs the metrics scraped).
    pub fn check(&self) -> Result<(), LoadgenError> {
        if let Some(ms) = self.max_server_lateness {
            if !(0.0..=limits::MAX_DELAY_MS as f64).contains(&ms) {
                return Err(LoadgenError::OutOfRange {
                    flag: "--max-server-lateness".into(),
                    got: ms.to_string(),
                    allowed: format!("from 0 to {}", limits::MAX_DELAY_MS),
                });
            }
            if self.no_scrape_metrics {
                return Err(LoadgenError::Config(
                    "--max-server-lateness reads the server's /metrics, which \
                     --no-scrape-metrics turns off"
                        .into(),
                ));
            }
        }
        if self.scrape_interval_ms > limits::MAX_DELAY_MS {
            return Err(LoadgenError::OutOfRange {
                flag: "--scrape-interval-ms".into(),
                got: self.scrape_interval_ms.to_string(),
                allowed: format!("from 0 to {}", limits::MAX_DELAY_MS),
            });
        }
        Ok(())
    }

    /// The scrape interval, at least 50 ms.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.scrape_interval_ms.max(50))
    }
}

/// Report flags with `--quiet` set and no files: observers without a live view.
pub fn quiet() -> ReportArgs {
    ReportArgs {
        report_json: None,
        per_request_jsonl: None,
        quiet: true,
    }
}

/// The observers of one run, started before the driver.
pub(crate) struct Observe {
    scraper: Option<Scraper>,
    live: Option<LiveView>,
}

impl Observe {
    /// Starts the scraper (when asked, or by default when the target serves `/metrics`) and,
    /// with `live_view` (not `-q`), the live view (a refreshed line on a terminal, else a plain
    /// line now and then).
    pub(crate) async fn start(
        args: &ObserveArgs,
        live_view: bool,
        target: &Connected,
        expected_requests: Option<usize>,
    ) -> Observe {
        let scraper = if args.no_scrape_metrics {
            None
        } else {
            Scraper::start(
                target,
                args.metrics_url.as_deref(),
                args.interval(),
                args.scrape_metrics,
            )
            .await
        };
        let live = live_view.then(|| LiveView::start(expected_requests));
        Observe { scraper, live }
    }

    /// The driver hooks that feed the live view.
    pub(crate) fn hooks(&self) -> RunHooks {
        RunHooks {
            observer: self.live.as_ref().map(LiveView::observer),
            sent: self.live.as_ref().map(LiveView::sent_counter),
            ..RunHooks::default()
        }
    }

    /// Stops everything; what was seen.
    pub(crate) async fn finish(self) -> Observed {
        if let Some(live) = self.live {
            live.finish().await;
        }
        let server = match self.scraper {
            Some(s) => Some(s.finish().await),
            None => None,
        };
        Observed { server }
    }
}

/// What the observers saw.
#[derive(Debug, Default)]
pub struct Observed {
    /// The server's metrics over time, when scraped.
    pub server: Option<ServerMetrics>,
}

impl Observed {
    /// How late the server handed its tokens to clients during the run, when it said.
    pub fn lateness(&self) -> Option<Lateness> {
        self.server.as_ref()?.summary.token_lateness
    }

    /// Console lines: the server metrics' summary, its routing line attributed to the run's
    /// own requests (`own`) when given.
    pub fn console(&self, own: Option<OwnRouting>) -> String {
        self.attributed(own)
            .map(|server| server.console())
            .unwrap_or_default()
    }

    /// The server metrics with the routing judge's window attributed to the run's own requests
    /// ([`scrape::RoutingSummary::attribute`]).
    pub(crate) fn attributed(
        &self,
        own: Option<OwnRouting>,
    ) -> Option<std::borrow::Cow<'_, ServerMetrics>> {
        let server = self.server.as_ref()?;
        match (own, server.summary.routing) {
            (Some(own), Some(mut routing)) => {
                routing.attribute(own);
                let mut server = server.clone();
                server.summary.routing = Some(routing);
                Some(std::borrow::Cow::Owned(server))
            }
            _ => Some(std::borrow::Cow::Borrowed(server)),
        }
    }
}

/// `--max-server-lateness`: fails when the server's 99th-percentile token lateness over the run
/// (`lateness`) is above `args`' limit, or unknown (the target did not report it).
pub fn lateness_verdict(
    lateness: Option<Lateness>,
    args: &ObserveArgs,
) -> Result<(), LoadgenError> {
    let Some(max_ms) = args.max_server_lateness else {
        return Ok(());
    };
    match lateness {
        None => Err(LoadgenError::ServerLate(format!(
            "--max-server-lateness {max_ms}: the target reported no token lateness \
             ({}; mockserve reports it on /metrics): the run's latencies cannot be told free \
             of host delay",
            crate::observe::scrape::LATENESS_METRIC
        ))),
        Some(l) if l.p99_or_inf_ms() > max_ms => Err(LoadgenError::ServerLate(format!(
            "the server fell behind its own schedule by {} p99 over {} tokens, above \
             --max-server-lateness {max_ms} ms: the run's latencies include host delay",
            match l.p99_ms {
                Some(ms) => format!("up to {ms} ms"),
                None => format!("more than {} ms", l.largest_bucket_ms),
            },
            l.tokens
        ))),
        Some(_) => Ok(()),
    }
}
