//! How late mockserve handed its tokens to clients: the histogram of one scrape ([`Buckets`])
//! and the lateness over a run ([`Lateness`]), with the warning when the server fell behind.

use serde::Serialize;

use crate::observe::scrape::parse::PromSample;

/// mockserve's histogram of how late it handed each token to its client against the token's
/// simulated time.
pub(crate) const LATENESS_METRIC: &str = "servesim_token_lateness_seconds";

/// A cumulative Prometheus histogram: `(upper bound, count at or below it)` by bound (`+Inf`
/// last), and the total count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets {
    /// Cumulative counts by upper bound, ascending.
    pub cumulative: Vec<(f64, f64)>,
    /// Observations.
    pub count: f64,
}

impl Buckets {
    /// Adds one `_bucket` or `_count` sample (another series of the same histogram adds up).
    pub(super) fn add(&mut self, s: &PromSample) {
        if s.name.ends_with("_count") {
            self.count += s.value;
            return;
        }
        let Some(le) = s.label("le").and_then(|v| match v {
            "+Inf" | "Inf" | "inf" => Some(f64::INFINITY),
            v => v.parse::<f64>().ok().filter(|b| !b.is_nan()),
        }) else {
            return;
        };
        match self.cumulative.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += s.value,
            None => {
                self.cumulative.push((le, s.value));
                self.cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// What was observed between `earlier` and `self` (counts subtracted bound by bound; a
    /// bound missing from `earlier` counts from 0).
    fn since(&self, earlier: Option<&Buckets>) -> Buckets {
        let before = |le: f64| {
            earlier
                .and_then(|e| e.cumulative.iter().find(|(b, _)| *b == le))
                .map_or(0.0, |(_, c)| *c)
        };
        Buckets {
            cumulative: self
                .cumulative
                .iter()
                .map(|&(le, c)| (le, (c - before(le)).max(0.0)))
                .collect(),
            count: (self.count - earlier.map_or(0.0, |e| e.count)).max(0.0),
        }
    }

    /// The upper bound of the bucket holding quantile `q` (0..1): the smallest bound whose
    /// cumulative count reaches `q` of the total (`+Inf` when only the last bucket does). None
    /// without observations.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let total = self
            .cumulative
            .last()
            .map_or(0.0, |(_, c)| *c)
            .max(self.count);
        if total <= 0.0 {
            return None;
        }
        let rank = (q * total).ceil().max(1.0);
        self.cumulative
            .iter()
            .find(|(_, c)| *c >= rank)
            .map(|(le, _)| *le)
            .or(Some(f64::INFINITY))
    }
}

/// How late the server handed tokens to clients against its own schedule over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Lateness {
    /// Tokens sent during the run.
    pub tokens: u64,
    /// Upper bound of the histogram bucket holding the median, ms (None: beyond the largest
    /// bucket).
    pub p50_ms: Option<f64>,
    /// The same for the 99th percentile.
    pub p99_ms: Option<f64>,
    /// The largest finite bucket bound, ms: a quantile beyond it is `None`.
    pub largest_bucket_ms: f64,
}

impl Lateness {
    /// From the histogram at the first and at the last scrape; None when no token was sent.
    pub(super) fn of(first: Option<&Buckets>, last: &Buckets) -> Option<Lateness> {
        let run = last.since(first);
        // Bounds in ms, rounded to the µs (5e-5 s is 0.05 ms, not 0.05000000000000001).
        let ms = |b: f64| (b * 1e6).round() / 1e3;
        let quantile = |q: f64| run.quantile(q).filter(|b| b.is_finite()).map(ms);
        let tokens = run.count.round() as u64;
        (tokens > 0).then(|| Lateness {
            tokens,
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
            largest_bucket_ms: ms(run
                .cumulative
                .iter()
                .map(|(b, _)| *b)
                .filter(|b| b.is_finite())
                .fold(0.0, f64::max)),
        })
    }

    /// The 99th percentile in ms for comparisons: beyond the largest bucket counts as infinite.
    pub(crate) fn p99_or_inf_ms(&self) -> f64 {
        self.p99_ms.unwrap_or(f64::INFINITY)
    }

    /// `≤ 0.5 ms`, or `> 10000 ms` beyond the largest bucket.
    pub(super) fn show(&self, v: Option<f64>) -> String {
        match v {
            Some(v) => format!("<= {v} ms"),
            None => format!("> {} ms", self.largest_bucket_ms),
        }
    }

    /// The report's warning when the server fell behind (p99 above `LATE_WARNING_MS`).
    pub fn warning(&self) -> Option<String> {
        (self.p99_or_inf_ms() > LATE_WARNING_MS).then(|| {
            format!(
                "WARNING: the server fell behind its own schedule by {} p99 over {} tokens \
                 ({LATENESS_METRIC}): latencies include host delay",
                self.show(self.p99_ms),
                self.tokens
            )
        })
    }
}

/// A server whose 99th-percentile token lateness is above this many ms is reported as having
/// fallen behind its schedule.
pub(crate) const LATE_WARNING_MS: f64 = 1.0;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::scrape::parse::parse;
    use crate::observe::scrape::series::series;
    use crate::observe::scrape::snapshot::Snapshot;

    /// The lateness histogram is read from either parser, summed over series, taken over the
    /// run (last scrape minus first) and its quantiles are bucket bounds; a p99 above 1 ms is
    /// a warning, one beyond the largest bucket is "more than" it.
    #[test]
    fn token_lateness_over_the_run() {
        let exposition = |counts: [u64; 4]| {
            format!(
                "# TYPE servesim_token_lateness_seconds histogram\n\
                 servesim_token_lateness_seconds_bucket{{le=\"0.00005\"}} {}\n\
                 servesim_token_lateness_seconds_bucket{{le=\"0.001\"}} {}\n\
                 servesim_token_lateness_seconds_bucket{{le=\"0.01\"}} {}\n\
                 servesim_token_lateness_seconds_bucket{{le=\"+Inf\"}} {}\n\
                 servesim_token_lateness_seconds_count {}\n\
                 servesim_token_lateness_seconds_sum 0.5\n",
                counts[0], counts[1], counts[2], counts[3], counts[3]
            )
        };
        let before = exposition([10, 10, 10, 10]);
        assert_eq!(Snapshot::read(&before), Snapshot::of(&parse(&before)));
        let early = Snapshot::read(&before);
        assert!(!early.is_empty());
        // 100 tokens during the run: 98 within 50 µs, one within 1 ms, one within 10 ms.
        let late = Snapshot::read(&exposition([108, 109, 110, 110]));
        let (_, summary) = series(&[(0.0, early.clone()), (1.0, late)], 0);
        let l = summary.token_lateness.expect("lateness");
        assert_eq!(
            l,
            Lateness {
                tokens: 100,
                p50_ms: Some(0.05),
                p99_ms: Some(1.0),
                largest_bucket_ms: 10.0
            }
        );
        assert_eq!(l.warning(), None);
        // Two tokens beyond 1 ms out of 100: p99 is the 10 ms bucket.
        let (_, summary) = series(
            &[
                (0.0, early.clone()),
                (1.0, Snapshot::read(&exposition([108, 108, 110, 110]))),
            ],
            0,
        );
        let l = summary.token_lateness.expect("lateness");
        assert_eq!(l.p99_ms, Some(10.0));
        assert_eq!(
            l.warning().as_deref(),
            Some(
                "WARNING: the server fell behind its own schedule by <= 10 ms p99 over 100 \
                 tokens (servesim_token_lateness_seconds): latencies include host delay"
            )
        );
        // Beyond the largest bucket.
        let (_, summary) = series(
            &[
                (0.0, early.clone()),
                (1.0, Snapshot::read(&exposition([10, 10, 10, 20]))),
            ],
            0,
        );
        let l = summary.token_lateness.expect("lateness");
        assert_eq!((l.p50_ms, l.p99_ms), (None, None));
        assert!(l.warning().is_some_and(|w| w.contains("by > 10 ms p99")));
        // No token during the run: nothing to say.
        let (_, summary) = series(&[(0.0, early.clone()), (1.0, early)], 0);
        assert_eq!(summary.token_lateness, None);
        // Two series (two servers behind one URL) add up bound by bound.
        let two = "servesim_token_lateness_seconds_bucket{le=\"0.001\",w=\"a\"} 3\n\
                   servesim_token_lateness_seconds_bucket{le=\"0.001\",w=\"b\"} 4\n\
                   servesim_token_lateness_seconds_bucket{le=\"+Inf\",w=\"a\"} 3\n\
                   servesim_token_lateness_seconds_bucket{le=\"+Inf\",w=\"b\"} 5\n\
                   servesim_token_lateness_seconds_count{w=\"a\"} 3\n\
                   servesim_token_lateness_seconds_count{w=\"b\"} 5\n";
        let b = Snapshot::read(two).lateness.expect("buckets");
        assert_eq!(b.cumulative, vec![(0.001, 7.0), (f64::INFINITY, 8.0)]);
        assert_eq!(b.count, 8.0);
        assert_eq!(b.quantile(0.5), Some(0.001));
        assert_eq!(b.quantile(0.99), Some(f64::INFINITY));
    }
}
