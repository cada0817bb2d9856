//! The target's Prometheus metrics over a run: [`parse`] reads the text exposition format
//! (any line it cannot read is skipped, never an error), [`Snapshot::of`] picks the serving
//! figures out of known metric names (vLLM `vllm:*`, SGLang `sglang:*`, Dynamo `dynamo_*`,
//! mockserve's `vllm:*` per worker and `servesim_*`; [`Snapshot::read`] parses only their
//! lines), and `Scraper` samples `{url}/metrics` every interval while the run lasts (further
//! apart after a slow scrape). The result, [`ServerMetrics`], is a time series plus a
//! summary (peak and mean) in the report's `server_metrics` key.
//!
//! Figures per sample: requests running and waiting (summed over workers), KV-cache usage (the
//! mean over workers, 0..1), the prefix-cache hit rate over the interval (from the hit and query
//! counters, or a hit-rate gauge), preemptions since the first sample, and the same per worker
//! when the series carry a worker label (`worker`, `worker_id`, `engine`, `dp_rank`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::run::target::Connected;

/// One sample of the text format: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    /// Metric name (with its `_total` / `_bucket` suffix as written).
    pub name: String,
    /// Labels in written order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl PromSample {
    /// The value of label `key`.
    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus (or OpenMetrics) text format; comments, blank lines and lines that do
/// not parse are skipped.
pub fn parse(text: &str) -> Vec<PromSample> {
    text.lines().filter_map(parse_line).collect()
}

/// True for the characters a metric name is made of.
fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

fn parse_line(line: &str) -> Option<PromSample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(is_name_char) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let value_text = rest.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().ok()?,
    };
    Some(PromSample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Labels after the `{`: `(labels, text after the closing brace)`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(tail) = s.strip_prefix('}') {
            return Some((labels, tail));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, e) = chars.next()?;
                    value.push(match e {
                        'n' => '\n',
                        other => other,
                    });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

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

/// The prefix of the routing judge's series (`mockserve fleet`).
const ROUTING_PREFIX: &str = "servesim_routing_";

/// The routing judge's counters in one scrape (cumulative): how the decisions of the router in
/// front of a `mockserve fleet` compare with the best worker at each arrival.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoutingFigures {
    /// Decisions judged.
    pub decisions: f64,
    /// Their prompt tokens.
    pub prompt_tokens: f64,
    /// Prompt tokens cached on the chosen workers.
    pub achieved_hit_tokens: f64,
    /// Prompt tokens cached on the best workers.
    pub oracle_hit_tokens: f64,
    /// The sum of every decision's regret, in tokens.
    pub regret_sum: f64,
    /// The regret histogram: (upper bound, cumulative count), as scraped.
    pub regret_buckets: Vec<(f64, f64)>,
    /// Decisions made on stale KV events, when the fleet publishes them.
    pub stale_decisions: Option<f64>,
    /// Of those, decisions where the events credited the chosen worker with evicted blocks.
    pub stale_evicted_decisions: Option<f64>,
    /// Of those, decisions where the events showed the best worker with fewer blocks.
    pub stale_missed_decisions: Option<f64>,
}

impl RoutingFigures {
    /// Adds sample `s` of a `servesim_routing_*` series.
    fn add(&mut self, s: &PromSample) {
        let name = s.name.strip_prefix(ROUTING_PREFIX).unwrap_or_default();
        let slot = match name {
            "decisions_total" => &mut self.decisions,
            "prompt_tokens_total" => &mut self.prompt_tokens,
            "achieved_hit_tokens_total" => &mut self.achieved_hit_tokens,
            "oracle_hit_tokens_total" => &mut self.oracle_hit_tokens,
            "regret_tokens_sum" => &mut self.regret_sum,
            "stale_decisions_total" => self.stale_decisions.insert(0.0),
            "stale_evicted_decisions_total" => self.stale_evicted_decisions.insert(0.0),
            "stale_missed_decisions_total" => self.stale_missed_decisions.insert(0.0),
            "regret_tokens_bucket" => {
                let le = match s.label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => match le.parse::<f64>() {
                        Ok(le) => le,
                        Err(_) => return,
                    },
                    None => return,
                };
                self.regret_buckets.push((le, s.value));
                return;
            }
            _ => return,
        };
        *slot = s.value;
    }
}

/// The routing judge's figures over a run (`mockserve fleet`; see docs/routers.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RoutingSummary {
    /// Decisions judged during the run.
    pub decisions: f64,
    /// Prompt tokens cached on the chosen workers, over all prompt tokens.
    pub achieved_hit_rate: Option<f64>,
    /// Prompt tokens cached on the best workers, over all prompt tokens.
    pub oracle_hit_rate: Option<f64>,
    /// Mean regret per decision, in tokens.
    pub regret_mean_tokens: Option<f64>,
    /// Median regret: the upper bound of the histogram bucket that holds it, in tokens.
    pub regret_p50_tokens: Option<f64>,
    /// 99th percentile of the regret, as the median.
    pub regret_p99_tokens: Option<f64>,
    /// Share of decisions with no regret (the chosen worker held the longest prefix).
    pub best_choice_share: Option<f64>,
    /// Decisions made on stale KV events (see docs/routers.md), when the fleet publishes them.
    pub stale_decisions: Option<f64>,
    /// Of those, the events credited the chosen worker with blocks it had evicted.
    pub stale_evicted_decisions: Option<f64>,
    /// Of those, the events showed the best worker with fewer blocks than it held.
    pub stale_missed_decisions: Option<f64>,
}

impl RoutingSummary {
    /// The figures between two scrapes (`None` when no decision was judged in between).
    fn between(first: &RoutingFigures, last: &RoutingFigures) -> Option<RoutingSummary> {
        let decisions = last.decisions - first.decisions;
        if decisions <= 0.0 {
            return None;
        }
        let prompt = last.prompt_tokens - first.prompt_tokens;
        let rate = |a: f64, b: f64| (prompt > 0.0).then(|| ((a - b) / prompt).clamp(0.0, 1.0));
        // Bucket counts during the run, by upper bound (both scrapes list the same bounds).
        let mut buckets: Vec<(f64, f64)> = last
            .regret_buckets
            .iter()
            .map(|&(le, n)| {
                let before = first
                    .regret_buckets
                    .iter()
                    .find(|(l, _)| *l == le)
                    .map_or(0.0, |(_, n)| *n);
                (le, n - before)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map_or(0.0, |(_, n)| *n);
        let quantile = |q: f64| {
            (total > 0.0).then(|| {
                buckets
                    .iter()
                    .find(|(_, n)| *n >= q * total)
                    .map_or(f64::INFINITY, |(le, _)| *le)
            })
        };
        // A counter the first scrape lacks (created since) counts from 0.
        let counted = |a: Option<f64>, b: Option<f64>| b.map(|b| (b - a.unwrap_or(0.0)).max(0.0));
        let best = buckets
            .iter()
            .find(|(le, _)| *le == 0.0)
            .and_then(|(_, n)| (total > 0.0).then(|| n / total));
        Some(RoutingSummary {
            decisions,
            achieved_hit_rate: rate(last.achieved_hit_tokens, first.achieved_hit_tokens),
            oracle_hit_rate: rate(last.oracle_hit_tokens, first.oracle_hit_tokens),
            regret_mean_tokens: Some((last.regret_sum - first.regret_sum) / decisions),
            regret_p50_tokens: quantile(0.5),
            regret_p99_tokens: quantile(0.99),
            best_choice_share: best,
            stale_decisions: counted(first.stale_decisions, last.stale_decisions),
            stale_evicted_decisions: counted(
                first.stale_evicted_decisions,
                last.stale_evicted_decisions,
            ),
            stale_missed_decisions: counted(
                first.stale_missed_decisions,
                last.stale_missed_decisions,
            ),
        })
    }

    /// The console line.
    fn console(&self) -> String {
        let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.1}%", 100.0 * r));
        let tokens = |t: Option<f64>| match t {
            Some(t) if t.is_finite() => format!("<= {t:.0}"),
            Some(_) => "beyond the last bucket".to_string(),
            None => "-".to_string(),
        };
        let stale = match self.stale_decisions {
            Some(n) => format!(
                "; stale KV events behind {n:.0} decisions ({}): {:.0} credited evicted \
                 blocks, {:.0} missed stored ones",
                pct(Some(n / self.decisions)),
                self.stale_evicted_decisions.unwrap_or(0.0),
                self.stale_missed_decisions.unwrap_or(0.0),
            ),
            None => String::new(),
        };
        format!(
            "Routing quality ({:.0} decisions): prefix-cache hits {} of prompt tokens on the \
             chosen workers, {} on the best (oracle); regret p50 {} tokens, p99 {} tokens, mean \
             {:.1}; best choice {} of decisions{stale}\n",
            self.decisions,
            pct(self.achieved_hit_rate),
            pct(self.oracle_hit_rate),
            tokens(self.regret_p50_tokens),
            tokens(self.regret_p99_tokens),
            self.regret_mean_tokens.unwrap_or(0.0),
            pct(self.best_choice_share),
        )
    }
}

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
    fn add(&mut self, s: &PromSample) {
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
    fn of(first: Option<&Buckets>, last: &Buckets) -> Option<Lateness> {
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
    fn show(&self, v: Option<f64>) -> String {
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

    /// The known figures in `text`: what [`Snapshot::of`] gives for its [`parse`], but only the
    /// lines of known metrics are parsed (a server with many workers writes megabytes of
    /// histograms that nothing here reads).
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
    fn imbalance(&self) -> Option<f64> {
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

    fn sum(&self, f: impl Fn(&WorkerFigures) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.workers.values().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    fn mean(&self, f: impl Fn(&WorkerFigures) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.workers.values().filter_map(f).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

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
async fn fetch(
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
            eprintln!("loadgen: warning: {warning}");
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

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{worker="0",model_name="m"} 3
vllm:num_requests_running{worker="1",model_name="m"} 1
vllm:num_requests_waiting{worker="0"} 2
vllm:num_requests_waiting{worker="1"} 0
vllm:kv_cache_usage_perc{worker="0"} 0.5
vllm:kv_cache_usage_perc{worker="1"} 0.25
vllm:prefix_cache_queries_total{worker="0"} 100
vllm:prefix_cache_hits_total{worker="0"} 40
vllm:num_preemptions_total{worker="0"} 1
servesim_router_parked_requests 0
vllm:time_to_first_token_seconds_bucket{le="+Inf",worker="0"} 7
"#;

    #[test]
    fn the_text_format_is_read_and_garbage_is_skipped() {
        let s = parse(VLLM);
        assert_eq!(s.len(), 11);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("model_name"), Some("m"));
        assert_eq!(s[10].label("le"), Some("+Inf"));
        let odd = parse(
            "a{x=\"q\\\"uo,te}\"} 1 1700000000\nb +Inf\nc NaN\n{broken 1\nd{x=\"unterminated} 2\ne{} \nf{x=\"1\"} notanumber\n\u{0}\u{ff}garbage\n\n   \ng 3e-2",
        );
        let names: Vec<&str> = odd.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "g"]);
        assert_eq!(odd[0].label("x"), Some("q\"uo,te}"));
        assert_eq!(odd[1].value, f64::INFINITY);
        // Any bytes at all: never a panic.
        let mut junk = String::new();
        for i in 0..2000u32 {
            junk.push(char::from_u32((i * 7919) % 0x2FF).unwrap_or('x'));
            if i % 37 == 0 {
                junk.push('\n');
            }
        }
        let _ = parse(&junk);
        let _ = Snapshot::of(&parse(&junk));
    }

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

    /// A `mockserve fleet`'s routing judge: its counters and regret histogram at two scrapes.
    fn fleet_exposition(decisions: u64, achieved: u64, oracle: u64, buckets: [u64; 3]) -> String {
        let prompt = decisions * 100;
        let regret = oracle - achieved;
        format!(
            "# TYPE servesim_routing_decisions counter\n\
             servesim_routing_decisions_total {decisions}\n\
             servesim_routing_prompt_tokens_total {prompt}\n\
             servesim_routing_achieved_hit_tokens_total {achieved}\n\
             servesim_routing_oracle_hit_tokens_total {oracle}\n\
             servesim_routing_regret_tokens_sum {regret}.0\n\
             servesim_routing_regret_tokens_count {decisions}\n\
             servesim_routing_regret_tokens_bucket{{le=\"0.0\"}} {}\n\
             servesim_routing_regret_tokens_bucket{{le=\"64.0\"}} {}\n\
             servesim_routing_regret_tokens_bucket{{le=\"+Inf\"}} {}\n\
             vllm:num_requests_running{{model_name=\"m\",engine=\"0\"}} 1\n# EOF\n",
            buckets[0], buckets[1], buckets[2]
        )
    }

    #[test]
    fn a_fleets_routing_judge_gives_the_routing_quality_of_the_run() {
        let before = Snapshot::read(&fleet_exposition(10, 0, 0, [10, 10, 10]));
        assert_eq!(
            before,
            Snapshot::of(&parse(&fleet_exposition(10, 0, 0, [10, 10, 10])))
        );
        let routing = before.routing.as_ref().expect("routing figures");
        assert_eq!(routing.decisions, 10.0);
        assert_eq!(routing.regret_buckets.len(), 3);
        // 100 decisions during the run, 100 prompt tokens each: 5,000 hit on the chosen
        // workers, 6,000 on the best; 80 best choices, 19 at most 64 tokens off, 1 beyond.
        let after = Snapshot::read(&fleet_exposition(110, 5_000, 6_000, [90, 109, 110]));
        let (_, summary) = series(&[(0.0, before), (1000.0, after)], 0);
        let r = summary.routing.expect("a routing summary");
        assert_eq!(r.decisions, 100.0);
        assert_eq!(r.achieved_hit_rate, Some(0.5));
        assert_eq!(r.oracle_hit_rate, Some(0.6));
        assert_eq!(r.regret_mean_tokens, Some(10.0));
        assert_eq!(r.regret_p50_tokens, Some(0.0));
        assert_eq!(r.regret_p99_tokens, Some(64.0));
        assert_eq!(r.best_choice_share, Some(0.8));
        let metrics = ServerMetrics {
            summary,
            ..ServerMetrics::default()
        };
        let console = metrics.console();
        assert!(
            console.contains(
                "Routing quality (100 decisions): prefix-cache hits 50.0% of prompt \
                              tokens on the chosen workers, 60.0% on the best (oracle); regret \
                              p50 <= 0 tokens, p99 <= 64 tokens, mean 10.0; best choice 80.0%"
            ),
            "{console}"
        );
        // No decision during the run: no routing line.
        let idle = Snapshot::read(&fleet_exposition(10, 0, 0, [10, 10, 10]));
        let (_, summary) = series(&[(0.0, idle.clone()), (1000.0, idle)], 0);
        assert_eq!(summary.routing, None);
        assert!(!console.contains("stale"), "{console}");
    }

    #[test]
    fn a_fleet_publishing_kv_events_gives_its_stale_decisions() {
        let with_stale = |decisions: u64, evicted: u64, missed: u64, either: u64| {
            fleet_exposition(decisions, 0, 0, [decisions; 3]).replace(
                "# EOF\n",
                &format!(
                    "servesim_routing_stale_decisions_total {either}\n\
                     servesim_routing_stale_evicted_decisions_total {evicted}\n\
                     servesim_routing_stale_missed_decisions_total {missed}\n# EOF\n"
                ),
            )
        };
        let before = Snapshot::read(&with_stale(10, 1, 2, 3));
        let after = Snapshot::read(&with_stale(50, 3, 12, 13));
        let (_, summary) = series(&[(0.0, before), (1000.0, after)], 0);
        let r = summary.routing.expect("a routing summary");
        assert_eq!(r.decisions, 40.0);
        assert_eq!(r.stale_decisions, Some(10.0));
        assert_eq!(r.stale_evicted_decisions, Some(2.0));
        assert_eq!(r.stale_missed_decisions, Some(10.0));
        let console = r.console();
        assert!(
            console.contains(
                "; stale KV events behind 10 decisions (25.0%): 2 credited evicted blocks, 10 \
                 missed stored ones\n"
            ),
            "{console}"
        );
    }

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
