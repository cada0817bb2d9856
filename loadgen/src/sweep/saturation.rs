//! When a point is over capacity: stopped early while it runs ([`Overload`]), saturated once
//! measured ([`saturation`]), and the knee of the points ([`knee`]).

use serde_json::Value;

use super::point::{trim, LoadPoint, Point};
use crate::report::replay_report::LiveRecord;
use crate::run::driver::Sample;

/// An open-loop point achieving less than this share of its offered rate is saturated.
pub const RATE_SHORTFALL: f64 = 0.9;

/// A closed-loop point whose throughput is less than this factor above a smaller point's is
/// saturated (more load bought no throughput).
pub const MIN_GAIN: f64 = 1.1;

/// Watches a running point for a server clearly over capacity, from its completed requests.
#[derive(Debug, Default)]
pub struct Overload {
    /// Judge TTFT growth (open loop only: a closed loop bounds its queue).
    pub open_loop: bool,
    completed: usize,
    errors: usize,
    /// TTFTs (ms) of successful requests in completion order.
    ttfts: Vec<f64>,
}

/// Requests a point needs before [`Overload`] judges it.
pub const OVERLOAD_MIN_REQUESTS: usize = 40;

/// Growth of the median TTFT from the first to the last quarter of a point's completed
/// requests that marks queueing without bound.
pub const OVERLOAD_TTFT_GROWTH: f64 = 4.0;

impl Overload {
    /// A watch with nothing seen yet; `open_loop` judges TTFT growth too.
    pub fn new(open_loop: bool) -> Overload {
        Overload {
            open_loop,
            ..Overload::default()
        }
    }

    /// Records one completed request.
    pub fn observe(&mut self, s: &Sample) {
        self.completed += 1;
        match s.ttft_us(crate::run::client::FirstToken::Any) {
            Some(t) => self.ttfts.push(t as f64 / 1000.0),
            None => self.errors += 1,
        }
    }

    /// Why the server is over capacity, if it clearly is: half or more of at least 10 requests
    /// failed, or the median TTFT of the last quarter of completions is
    /// [`OVERLOAD_TTFT_GROWTH`] times the first quarter's (after [`OVERLOAD_MIN_REQUESTS`]).
    pub fn verdict(&self) -> Option<String> {
        if self.completed >= 10 && self.errors * 2 >= self.completed {
            return Some(format!(
                "{} of {} requests failed",
                self.errors, self.completed
            ));
        }
        if !self.open_loop {
            return None;
        }
        let growth = ttft_growth(&self.ttfts)?;
        (self.ttfts.len() >= OVERLOAD_MIN_REQUESTS && growth >= OVERLOAD_TTFT_GROWTH).then(|| {
            format!("TTFT grows without bound (last quarter's median {growth:.1}x the first's)")
        })
    }
}

/// Median of the last quarter over median of the first quarter (None with fewer than 8).
pub fn ttft_growth(ttfts: &[f64]) -> Option<f64> {
    if ttfts.len() < 8 {
        return None;
    }
    let q = ttfts.len() / 4;
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        servesim::metrics::Distribution::percentile_multiturn(&v, 500)
    };
    let first = median(&ttfts[..q])?;
    let last = median(&ttfts[ttfts.len() - q..])?;
    (first > 0.0).then(|| last / first)
}

/// Why a point is saturated, given its records (in scheduled order) and the points measured
/// before it.
pub fn saturation(
    load: LoadPoint,
    json: &Value,
    records: &[LiveRecord],
    earlier: &[Point],
    max_failure_rate: f64,
) -> Vec<String> {
    let mut why = Vec::new();
    if let Some(reason) = json["stopped_early"].as_str() {
        why.push(format!("stopped early: {reason}"));
    }
    let rps = json["request_throughput_rps"].as_f64().unwrap_or(0.0);
    let total = records.len() as f64;
    let failed = records.iter().filter(|r| r.error.is_some()).count() as f64;
    if total > 0.0 && failed / total > max_failure_rate {
        why.push(format!("{failed} of {total} requests failed"));
    }
    match load {
        LoadPoint::RequestRate(_) | LoadPoint::ArrivalSpeedup(_) => {
            let r = match load {
                LoadPoint::RequestRate(r) => r,
                _ => f64::INFINITY,
            };
            // What a server keeping up would achieve: every request done by its send time plus
            // the run's fastest latency (a finite run drains after its last send).
            let last_ms = records.iter().map(|r| r.scheduled_ms).fold(0.0, f64::max);
            let fastest_ms = records
                .iter()
                .filter_map(|r| r.record.e2e_latency_ms)
                .fold(f64::INFINITY, f64::min);
            let fastest_ms = if fastest_ms.is_finite() {
                fastest_ms
            } else {
                0.0
            };
            let keeping_up = total / ((last_ms + fastest_ms) / 1000.0).max(1e-9);
            let expected = r.min(keeping_up);
            if rps < RATE_SHORTFALL * expected {
                why.push(format!("achieved {rps:.2} req/s of {} offered", trim(r)));
            }
            let ttfts: Vec<f64> = records.iter().filter_map(|r| r.record.ttft_ms).collect();
            if let Some(g) = ttft_growth(&ttfts).filter(|&g| g >= OVERLOAD_TTFT_GROWTH) {
                why.push(format!(
                    "TTFT grew {g:.1}x from the first to the last quarter"
                ));
            }
        }
        LoadPoint::Concurrency(n) => {
            let best_below = earlier
                .iter()
                .filter(|p| matches!(p.load, LoadPoint::Concurrency(m) if m < n))
                .map(Point::rps)
                .fold(0.0, f64::max);
            if best_below > 0.0 && rps < MIN_GAIN * best_below {
                why.push(format!(
                    "throughput {rps:.2} req/s, not {MIN_GAIN}x above a smaller concurrency's {best_below:.2}"
                ));
            }
        }
    }
    why
}

/// Index of the knee. With an SLO, the point of the highest goodput (good requests per
/// second); without, the last point (in load order) before the first saturated one, or the last
/// point when none saturated (None when the first point already saturated).
pub fn knee(points: &[Point]) -> Option<usize> {
    let goodput = |p: &Point| p.json["goodput"]["rate_rps"].as_f64();
    if points.iter().any(|p| goodput(p).is_some()) {
        return points
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, goodput(p)?)))
            .filter(|(_, g)| *g > 0.0)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i);
    }
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| points[a].load.value().total_cmp(&points[b].load.value()));
    let mut knee = None;
    for i in order {
        if !points[i].saturation.is_empty() {
            break;
        }
        knee = Some(i);
    }
    knee
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn point(load: LoadPoint, rps: f64, saturated: bool, goodput: Option<f64>) -> Point {
        Point {
            load,
            json: json!({"request_throughput_rps": rps, "goodput": goodput.map(|g| json!({"rate_rps": g}))}),
            saturation: if saturated { vec!["x".into()] } else { vec![] },
            attainment: None,
            records: vec![],
        }
    }

    #[test]
    fn the_knee_and_saturation() {
        let c = LoadPoint::Concurrency;
        let pts = vec![
            point(c(1), 10.0, false, None),
            point(c(4), 30.0, false, None),
            point(c(2), 18.0, false, None),
            point(c(8), 31.0, true, None),
        ];
        assert_eq!(knee(&pts), Some(1));
        assert_eq!(knee(&pts[3..]), None);
        let with_slo = vec![
            point(c(1), 10.0, false, Some(10.0)),
            point(c(2), 18.0, false, Some(17.0)),
            point(c(4), 30.0, false, Some(5.0)),
        ];
        assert_eq!(knee(&with_slo), Some(1));
        // A closed loop that buys no throughput is saturated; one that does is not.
        let earlier = vec![point(c(4), 30.0, false, None)];
        let flat = json!({"request_throughput_rps": 31.0});
        assert_eq!(saturation(c(8), &flat, &[], &earlier, 0.05).len(), 1);
        let more = json!({"request_throughput_rps": 40.0});
        assert!(saturation(c(8), &more, &[], &earlier, 0.05).is_empty());
        assert_eq!(ttft_growth(&[1.0; 8]), Some(1.0));
        assert_eq!(
            ttft_growth(&[1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 9.0]),
            Some(9.0)
        );
        assert_eq!(ttft_growth(&[1.0; 7]), None);
    }
}
