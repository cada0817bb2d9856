//! The serving figures of one scrape ([`Snapshot`], per worker [`WorkerFigures`]): the known
//! metric names of vLLM, SGLang, Dynamo and mockserve, and which figure each carries.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::observe::scrape::lateness::{Buckets, LATENESS_METRIC};
use crate::observe::scrape::parse::{is_name_char, parse_line, PromSample};
use crate::observe::scrape::routing::{RoutingFigures, ROUTING_PREFIX};

/// Names of the running-requests gauge.
const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "dynamo_frontend_inflight_requests",
];
/// Names of the waiting-requests gauge.
const WAITING: &[&str] = &[
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "dynamo_frontend_queued_requests",
    "servesim_router_parked_requests",
];
/// Names of the KV-usage gauge (0..1, or percent for Dynamo's `_percent`).
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
    "dynamo_component_kvstats_gpu_cache_usage_percent",
];
/// Prefix-cache hit counters: (hits, queries).
const PREFIX_COUNTERS: &[(&str, &str)] = &[
    ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
    (
        "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries",
    ),
];
/// Prefix-cache hit-rate gauges (0..1).
const PREFIX_RATE: &[&str] = &[
    "sglang:cache_hit_rate",
    "dynamo_component_kvstats_gpu_prefix_cache_hit_rate",
];
/// Preemption counters.
const PREEMPTIONS: &[&str] = &["vllm:num_preemptions", "sglang:num_preemptions"];

/// Labels naming a worker.
const WORKER_LABELS: &[&str] = &["worker", "worker_id", "engine", "dp_rank"];

/// A worker's figure that a known metric carries.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Figure {
    Running,
    Waiting,
    KvUsage,
    PrefixHits,
    PrefixQueries,
    PrefixRate,
    Preemptions,
}

/// The figure the metric `name` carries, if it is a known one (counters may carry `_total`).
fn figure(name: &str) -> Option<Figure> {
    let is = |known: &str| name == known || name.strip_suffix("_total") == Some(known);
    let any = |names: &[&str]| names.iter().any(|n| is(n));
    if any(RUNNING) {
        Some(Figure::Running)
    } else if any(WAITING) {
        Some(Figure::Waiting)
    } else if any(KV_USAGE) {
        Some(Figure::KvUsage)
    } else if PREFIX_COUNTERS.iter().any(|(h, _)| is(h)) {
        Some(Figure::PrefixHits)
    } else if PREFIX_COUNTERS.iter().any(|(_, q)| is(q)) {
        Some(Figure::PrefixQueries)
    } else if any(PREFIX_RATE) {
        Some(Figure::PrefixRate)
    } else if any(PREEMPTIONS) {
        Some(Figure::Preemptions)
    } else {
        None
    }
}

/// A `_bucket` or `_count` series of [`LATENESS_METRIC`].
fn is_lateness(name: &str) -> bool {
    name.strip_prefix(LATENESS_METRIC)
        .is_some_and(|rest| rest == "_bucket" || rest == "_count")
}

fn worker_of(s: &PromSample) -> String {
    WORKER_LABELS
        .iter()
        .find_map(|k| s.label(k))
        .unwrap_or("")
        .to_string()
}

/// The serving figures of one scrape, per worker (`""` = no worker label).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Per worker: running, waiting, KV usage, prefix hits, prefix queries, hit-rate gauge,
    /// preemptions.
    pub workers: BTreeMap<String, WorkerFigures>,
    /// mockserve's `servesim_token_lateness_seconds` histogram, summed over its series.
    pub lateness: Option<Buckets>,
    /// A mockserve fleet's routing judge (`servesim_routing_*`), when the target has one.
    pub routing: Option<RoutingFigures>,
}

/// One worker's raw figures in one scrape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct WorkerFigures {
    /// Requests running.
    pub running: Option<f64>,
    /// Requests waiting.
    pub waiting: Option<f64>,
    /// KV-cache usage, 0..1.
    pub kv_usage: Option<f64>,
    /// Prefix-cache hits (tokens, cumulative).
    #[serde(skip)]
    pub prefix_hits: Option<f64>,
    /// Prefix-cache queries (tokens, cumulative).
    #[serde(skip)]
    pub prefix_queries: Option<f64>,
    /// A hit-rate gauge, when the server exports one.
    #[serde(skip)]
    pub prefix_hit_rate: Option<f64>,
    /// Preemptions (cumulative).
    #[serde(skip)]
    pub preemptions: Option<f64>,
}

impl Snapshot {
    /// The known figures among `samples`.
    pub fn of(samples: &[PromSample]) -> Snapshot {
        let mut snap = Snapshot::default();
        for s in samples {
            if is_lateness(&s.name) {
                snap.lateness.get_or_insert_with(Buckets::default).add(s);
            } else if let Some(f) = figure(&s.name) {
                snap.add(s, f);
            } else if s.name.starts_with(ROUTING_PREFIX) {
                snap.routing.get_or_insert_with(Default::default).add(s);
            }
        }
        snap
    }

    /// The known figures in `text`: what [`Snapshot::of`] gives for its
    /// [`parse`](crate::observe::scrape::parse::parse), but only the lines of known metrics are
    /// parsed (a server with many workers writes megabytes of histograms that nothing here
    /// reads).
    pub fn read(text: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        for line in text.lines() {
            // The line's leading run of name characters: where the line parses, its name is
            // exactly that run, so a line whose run is no known name can be skipped unparsed.
            let line = line.trim_start();
            let end = line.find(|c: char| !is_name_char(c)).unwrap_or(line.len());
            if is_lateness(&line[..end]) {
                if let Some(s) = parse_line(line) {
                    snap.lateness.get_or_insert_with(Buckets::default).add(&s);
                }
                continue;
            }
            let Some(f) = figure(&line[..end]) else {
                if line[..end].starts_with(ROUTING_PREFIX) {
                    if let Some(s) = parse_line(line) {
                        snap.routing.get_or_insert_with(Default::default).add(&s);
                    }
                }
                continue;
            };
            if let Some(s) = parse_line(line) {
                snap.add(&s, f);
            }
        }
        snap
    }

    /// Adds `s`, a sample of figure `f`, to its worker's figures (a value that is not finite
    /// adds nothing).
    fn add(&mut self, s: &PromSample, f: Figure) {
        if !s.value.is_finite() {
            return;
        }
        let w = self.workers.entry(worker_of(s)).or_default();
        let slot = match f {
            Figure::Running => &mut w.running,
            Figure::Waiting => &mut w.waiting,
            Figure::KvUsage => &mut w.kv_usage,
            Figure::PrefixHits => &mut w.prefix_hits,
            Figure::PrefixQueries => &mut w.prefix_queries,
            Figure::PrefixRate => &mut w.prefix_hit_rate,
            Figure::Preemptions => &mut w.preemptions,
        };
        let v = if f == Figure::KvUsage && s.name.ends_with("_percent") && s.value > 1.0 {
            s.value / 100.0
        } else {
            s.value
        };
        *slot = Some(slot.unwrap_or(0.0) + v);
    }

    /// The busiest worker's requests (running plus waiting) over the mean worker's; None with
    /// fewer than two workers or no load.
    pub(super) fn imbalance(&self) -> Option<f64> {
        let loads: Vec<f64> = self
            .workers
            .iter()
            .filter(|(name, _)| !name.is_empty())
            .filter_map(|(_, w)| match (w.running, w.waiting) {
                (None, None) => None,
                (r, q) => Some(r.unwrap_or(0.0) + q.unwrap_or(0.0)),
            })
            .collect();
        if loads.len() < 2 {
            return None;
        }
        let mean = loads.iter().sum::<f64>() / loads.len() as f64;
        (mean > 0.0).then(|| loads.iter().copied().fold(0.0, f64::max) / mean)
    }

    /// True when no known figure was found.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty() && self.lateness.is_none() && self.routing.is_none()
    }

    pub(super) fn sum(&self, f: impl Fn(&WorkerFigures) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.workers.values().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    pub(super) fn mean(&self, f: impl Fn(&WorkerFigures) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.workers.values().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::scrape::parse::parse;
    use crate::observe::scrape::series::{series, PeakMean};

    /// Reading a snapshot straight from the text (only known lines parsed) gives what parsing
    /// every line and picking the known samples gives, on seeded random expositions: known and
    /// unknown names, `_total` suffixes, worker labels, odd values, separators that are not
    /// ASCII, and broken lines.
    #[test]
    fn a_snapshot_read_from_text_is_the_one_of_its_parsed_samples() {
        use rand::{Rng, SeedableRng};
        let names: Vec<&str> = [RUNNING, WAITING, KV_USAGE, PREFIX_RATE, PREEMPTIONS]
            .concat()
            .into_iter()
            .chain(PREFIX_COUNTERS.iter().flat_map(|&(h, q)| [h, q]))
            .chain([
                "vllm:e2e_request_latency_seconds_bucket",
                "other",
                "vllm:num",
            ])
            .collect();
        let labels = [
            "",
            "{worker=\"0\"}",
            "{engine=\"3\",le=\"+Inf\"}",
            "{model_name=\"m\", dp_rank=\"1\"}",
            "{worker=\"q\\\"uo}te\"}",
            "{worker=\"broken}",
            "{}",
        ];
        let values = ["1", "0", "42.5", "150", "+Inf", "NaN", "-3e-2", "x", ""];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        let mut with_workers = 0;
        for _ in 0..300 {
            let mut text = String::new();
            for _ in 0..rng.gen_range(0..40) {
                match rng.gen_range(0..10) {
                    0 => text.push_str("# HELP vllm:num_requests_running x\n"),
                    1 => text.push_str("  \n"),
                    _ => {
                        let name = names[rng.gen_range(0..names.len())];
                        let total = if rng.gen_bool(0.3) { "_total" } else { "" };
                        let label = labels[rng.gen_range(0..labels.len())];
                        let value = values[rng.gen_range(0..values.len())];
                        let lead = if rng.gen_bool(0.1) { " " } else { "" };
                        let gap = [" ", "\t", "\u{2003}", "é "][rng.gen_range(0..4)];
                        text.push_str(&format!("{lead}{name}{total}{label}{gap}{value}\n"));
                    }
                }
            }
            let read = Snapshot::read(&text);
            assert_eq!(read, Snapshot::of(&parse(&text)), "{text}");
            with_workers += usize::from(read.workers.len() > 1);
        }
        assert!(
            with_workers > 100,
            "{with_workers} of 300 name several workers"
        );
    }

    /// Load imbalance: the busiest worker's running plus waiting over the mean, per sample
    /// with load, over named workers only; none with one worker.
    #[test]
    fn load_imbalance_is_the_busiest_over_the_mean() {
        let snap = |loads: &[(u32, u32)]| {
            let text: String = loads
                .iter()
                .enumerate()
                .map(|(w, (r, q))| {
                    format!(
                        "vllm:num_requests_running{{engine=\"{w}\"}} {r}\n\
                         vllm:num_requests_waiting{{engine=\"{w}\"}} {q}\n"
                    )
                })
                .collect();
            Snapshot::read(&text)
        };
        // 4 + 0 + 2 + 2 over 4 workers: mean 2, busiest 4.
        assert_eq!(
            snap(&[(3, 1), (0, 0), (2, 0), (1, 1)]).imbalance(),
            Some(2.0)
        );
        assert_eq!(snap(&[(0, 0), (0, 0)]).imbalance(), None, "no load");
        assert_eq!(snap(&[(5, 5)]).imbalance(), None, "one worker");
        let (_, summary) = series(
            &[
                (0.0, snap(&[(0, 0), (0, 0)])),
                (1.0, snap(&[(2, 0), (0, 0)])),
                (2.0, snap(&[(1, 0), (1, 0)])),
            ],
            0,
        );
        assert_eq!(
            summary.load_imbalance,
            Some(PeakMean {
                peak: 2.0,
                mean: 1.5
            })
        );
    }
}
