//! The server's time series over a run: one [`ServerSample`] per scrape, the [`ServerSummary`]
//! (peak and mean, rates over the run, routing quality, token lateness), and the
//! [`ServerMetrics`] a report carries, with its console lines.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::observe::scrape::fetch::SCRAPE_TIMEOUT;
use crate::observe::scrape::lateness::Lateness;
use crate::observe::scrape::routing::RoutingSummary;
use crate::observe::scrape::snapshot::{Snapshot, WorkerFigures};

/// One point of the server's time series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerSample {
    /// ms since the scraper started (just before the run).
    pub t_ms: f64,
    /// Requests running, all workers.
    pub running: Option<f64>,
    /// Requests waiting, all workers.
    pub waiting: Option<f64>,
    /// KV-cache usage, mean over workers (0..1).
    pub kv_usage: Option<f64>,
    /// Prefix-cache hit rate since the previous sample (0..1).
    pub prefix_hit_rate: Option<f64>,
    /// Preemptions since the first sample.
    pub preemptions: Option<f64>,
    /// Per worker (when the series name workers): running, waiting, KV usage.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub workers: BTreeMap<String, WorkerFigures>,
}

/// Peak and mean of one series.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PeakMean {
    /// Largest sample.
    pub peak: f64,
    /// Mean of the samples.
    pub mean: f64,
}

impl PeakMean {
    fn of(v: impl Iterator<Item = f64>) -> Option<PeakMean> {
        let v: Vec<f64> = v.collect();
        if v.is_empty() {
            return None;
        }
        Some(PeakMean {
            peak: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            mean: v.iter().sum::<f64>() / v.len() as f64,
        })
    }
}

/// Summary of the scraped series.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerSummary {
    /// Requests running.
    pub running: Option<PeakMean>,
    /// Requests waiting.
    pub waiting: Option<PeakMean>,
    /// KV-cache usage.
    pub kv_usage: Option<PeakMean>,
    /// Prefix-cache hit rate over the whole run (hits / queries between the first and last
    /// sample, or the mean of a hit-rate gauge).
    pub prefix_hit_rate: Option<f64>,
    /// Preemptions during the run.
    pub preemptions: Option<f64>,
    /// Load imbalance across workers: per sample, the busiest worker's requests (running plus
    /// waiting) over the mean worker's, over the samples with any load (1 is even; N workers
    /// with everything on one give N). Only when the series name two workers or more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_imbalance: Option<PeakMean>,
    /// The routing judge's figures, when the target is (or fronts) a `mockserve fleet`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingSummary>,
    /// Scrapes that failed or found no known metric.
    pub failed_scrapes: u64,
    /// Of those, scrapes that got no answer within `SCRAPE_TIMEOUT` (a stalled `/metrics`).
    #[serde(skip_serializing_if = "is_zero")]
    pub timed_out_scrapes: u64,
    /// How late the server (mockserve) handed its tokens to clients against its own schedule
    /// during the run, when it says (`LATENESS_METRIC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_lateness: Option<Lateness>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the scraper saw: the `server_metrics` key of a report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerMetrics {
    /// The scraped URL.
    pub url: String,
    /// Interval asked for between samples, ms (slow scrapes space them further apart).
    pub interval_ms: u64,
    /// Peak and mean.
    pub summary: ServerSummary,
    /// The time series.
    pub samples: Vec<ServerSample>,
}

/// Builds the series and summary from timed snapshots.
pub fn series(
    snaps: &[(f64, Snapshot)],
    failed_scrapes: u64,
) -> (Vec<ServerSample>, ServerSummary) {
    series_with_timeouts(snaps, failed_scrapes, 0)
}

/// [`series`] with the count of failed scrapes that timed out.
pub(crate) fn series_with_timeouts(
    snaps: &[(f64, Snapshot)],
    failed_scrapes: u64,
    timed_out_scrapes: u64,
) -> (Vec<ServerSample>, ServerSummary) {
    let mut out = Vec::with_capacity(snaps.len());
    let first_preempt = snaps.first().and_then(|(_, s)| s.sum(|w| w.preemptions));
    let mut previous: Option<&Snapshot> = None;
    for (t, snap) in snaps {
        let rate_gauge = snap.mean(|w| w.prefix_hit_rate);
        let from_counters = previous.and_then(|p| {
            let dh = snap.sum(|w| w.prefix_hits)? - p.sum(|w| w.prefix_hits)?;
            let dq = snap.sum(|w| w.prefix_queries)? - p.sum(|w| w.prefix_queries)?;
            (dq > 0.0).then(|| (dh / dq).clamp(0.0, 1.0))
        });
        let workers = if snap.workers.len() > 1 || snap.workers.keys().any(|k| !k.is_empty()) {
            snap.workers.clone()
        } else {
            BTreeMap::new()
        };
        out.push(ServerSample {
            t_ms: *t,
            running: snap.sum(|w| w.running),
            waiting: snap.sum(|w| w.waiting),
            kv_usage: snap.mean(|w| w.kv_usage),
            prefix_hit_rate: from_counters.or(rate_gauge),
            preemptions: snap
                .sum(|w| w.preemptions)
                .map(|p| p - first_preempt.unwrap_or(0.0)),
            workers,
        });
        previous = Some(snap);
    }
    let overall_rate = match (snaps.first(), snaps.last()) {
        (Some((_, a)), Some((_, b))) => {
            let dh = b.sum(|w| w.prefix_hits).zip(a.sum(|w| w.prefix_hits));
            let dq = b.sum(|w| w.prefix_queries).zip(a.sum(|w| w.prefix_queries));
            match (dh, dq) {
                (Some((h1, h0)), Some((q1, q0))) if q1 > q0 => Some((h1 - h0) / (q1 - q0)),
                _ => PeakMean::of(
                    snaps
                        .iter()
                        .filter_map(|(_, s)| s.mean(|w| w.prefix_hit_rate)),
                )
                .map(|p| p.mean),
            }
        }
        _ => None,
    };
    let summary = ServerSummary {
        running: PeakMean::of(out.iter().filter_map(|s| s.running)),
        waiting: PeakMean::of(out.iter().filter_map(|s| s.waiting)),
        kv_usage: PeakMean::of(out.iter().filter_map(|s| s.kv_usage)),
        prefix_hit_rate: overall_rate,
        preemptions: out.last().and_then(|s| s.preemptions),
        load_imbalance: PeakMean::of(snaps.iter().filter_map(|(_, s)| s.imbalance())),
        routing: routing_between(snaps),
        failed_scrapes,
        timed_out_scrapes,
        token_lateness: snaps.last().and_then(|(_, last)| {
            let first = snaps.first().and_then(|(_, s)| s.lateness.as_ref());
            Lateness::of(first, last.lateness.as_ref()?)
        }),
    };
    (out, summary)
}

/// The routing judge's figures between the first and the last scrape that carry them.
fn routing_between(snaps: &[(f64, Snapshot)]) -> Option<RoutingSummary> {
    let mut routed = snaps.iter().filter_map(|(_, s)| s.routing.as_ref());
    let first = routed.next()?;
    let last = routed.next_back().unwrap_or(first);
    // The first scrape is taken just before the run: the difference is the run's.
    RoutingSummary::between(first, last)
}

impl ServerMetrics {
    /// The console lines: peak and mean of each series, and the routing quality when the
    /// target has a routing judge.
    pub(crate) fn console(&self) -> String {
        let s = &self.summary;
        let pm = |name: &str, v: &Option<PeakMean>, scale: f64, unit: &str| {
            v.map(|v| {
                format!(
                    "{name} peak {:.1}{unit} mean {:.1}{unit}",
                    v.peak * scale,
                    v.mean * scale
                )
            })
        };
        let parts: Vec<String> = [
            pm("running", &s.running, 1.0, ""),
            pm("waiting", &s.waiting, 1.0, ""),
            pm("KV usage", &s.kv_usage, 100.0, "%"),
            s.prefix_hit_rate
                .map(|r| format!("prefix-cache hit rate {:.1}%", 100.0 * r)),
            s.preemptions.map(|p| format!("preemptions {p}")),
            s.load_imbalance.map(|l| {
                format!(
                    "load imbalance (busiest worker / mean) peak {:.2} mean {:.2}",
                    l.peak, l.mean
                )
            }),
            s.token_lateness.map(|l| {
                format!(
                    "token lateness p50 {} p99 {} ({} tokens)",
                    l.show(l.p50_ms),
                    l.show(l.p99_ms),
                    l.tokens
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let failures = match (s.failed_scrapes, s.timed_out_scrapes) {
            (0, _) => String::new(),
            (n, 0) => format!("; {n} scrapes failed"),
            (n, t) => format!(
                "; {n} scrapes failed ({t} got no answer within {} s)",
                SCRAPE_TIMEOUT.as_secs()
            ),
        };
        let warning = s
            .token_lateness
            .and_then(|l| l.warning())
            .map(|w| w + "\n")
            .unwrap_or_default();
        let routing = s.routing.map(|r| r.console()).unwrap_or_default();
        format!(
            "Server metrics ({} samples of {}): {}{failures}\n{warning}{routing}",
            self.samples.len(),
            self.url,
            if parts.is_empty() {
                "no known series".to_string()
            } else {
                parts.join(", ")
            }
        )
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::scrape::fixtures::VLLM;
    use crate::observe::scrape::parse::parse;

    #[test]
    fn snapshots_sum_workers_and_the_series_derive_rates() {
        let a = Snapshot::of(&parse(VLLM));
        assert_eq!(a.workers.len(), 3, "{a:?}"); // workers 0, 1 and the unlabelled router
        let later = VLLM
            .replace(
                "queries_total{worker=\"0\"} 100",
                "queries_total{worker=\"0\"} 200",
            )
            .replace(
                "hits_total{worker=\"0\"} 40",
                "hits_total{worker=\"0\"} 120",
            )
            .replace(
                "preemptions_total{worker=\"0\"} 1",
                "preemptions_total{worker=\"0\"} 4",
            );
        let b = Snapshot::of(&parse(&later));
        let (samples, summary) = series(&[(0.0, a), (500.0, b)], 1);
        assert_eq!(samples[0].running, Some(4.0));
        assert_eq!(samples[0].waiting, Some(2.0));
        assert_eq!(samples[0].kv_usage, Some(0.375));
        assert_eq!(samples[0].prefix_hit_rate, None);
        assert_eq!(samples[1].prefix_hit_rate, Some(0.8));
        assert_eq!(samples[1].preemptions, Some(3.0));
        assert_eq!(samples[1].workers["0"].running, Some(3.0));
        assert_eq!(summary.prefix_hit_rate, Some(0.8));
        assert_eq!(
            summary.running,
            Some(PeakMean {
                peak: 4.0,
                mean: 4.0
            })
        );
        assert_eq!(summary.failed_scrapes, 1);
        let sglang = Snapshot::of(&parse(
            "sglang:num_running_reqs 5\nsglang:num_queue_reqs 7\nsglang:token_usage 0.9\nsglang:cache_hit_rate 0.3\n",
        ));
        let (s, summary) = series(&[(0.0, sglang)], 0);
        assert_eq!((s[0].running, s[0].waiting), (Some(5.0), Some(7.0)));
        assert_eq!(s[0].kv_usage, Some(0.9));
        assert_eq!(summary.prefix_hit_rate, Some(0.3));
        assert!(s[0].workers.is_empty());
        assert!(Snapshot::of(&parse("unrelated_metric 1\n")).is_empty());
    }
}
