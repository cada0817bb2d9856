//! Latency distributions, a streaming quantile sketch, the request-lifecycle [`Collector`] and the
//! [`ReplayReport`] it produces (Dynamo's offline-replay report: same keys, same formulas).
//!
//! The collector keeps O(1) state per request; per-token gaps go straight into
//! [`QuantileSketch`]es, so millions of tokens cost no per-token memory. Every figure is a pure
//! function of the hook calls, except the wall-clock keys listed in [`WALL_CLOCK_KEYS`].

use std::collections::BTreeMap;
use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::ids::{RequestId, WorkerId};
use crate::time::{SimDuration, SimTime};

/// Report keys that depend on host wall-clock time; blank them to compare reports byte for byte.
pub const WALL_CLOCK_KEYS: [&str; 3] = [
    "wall_time_ms",
    "processed_tokens_per_s",
    "processed_output_tokens_per_s",
];

/// Relative accuracy of [`QuantileSketch`] quantiles (Dynamo's DDSketch setting).
pub const SKETCH_RELATIVE_ACCURACY: f64 = 0.001;

/// Positive values below this go to the sketch's zero bucket (bounds the number of bins).
const SKETCH_MIN_INDEXABLE: f64 = 1e-9;

/// Index of the element reported as percentile `p` of `n` sorted values.
fn percentile_rank(n: usize, p: f64) -> usize {
    if n == 0 {
        return 0;
    }
    let r = ((n - 1) as f64 * p / 100.0).round();
    (r.max(0.0) as usize).min(n - 1)
}

/// Summary of a sample: what every latency row of the report shows.
///
/// Percentiles are the value at rank `round((n - 1) * p / 100)` of the sorted sample; `std` is the
/// population standard deviation. An empty sample gives all zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Distribution {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
    /// 50th percentile.
    pub median: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation (divides by n).
    pub std: f64,
}

impl Distribution {
    /// All zeros: the distribution of an empty sample.
    pub const ZERO: Distribution = Distribution {
        mean: 0.0,
        min: 0.0,
        max: 0.0,
        median: 0.0,
        p75: 0.0,
        p90: 0.0,
        p95: 0.0,
        p99: 0.0,
        std: 0.0,
    };

    /// The exact distribution of `samples` (sorted in place; NaNs sort last).
    pub fn from_samples(samples: &mut [f64]) -> Distribution {
        let n = samples.len();
        if n == 0 {
            return Distribution::ZERO;
        }
        samples.sort_by(f64::total_cmp);
        let mean = samples.iter().sum::<f64>() / n as f64;
        let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        let at = |p: f64| samples[percentile_rank(n, p)];
        Distribution {
            mean,
            min: samples[0],
            max: samples[n - 1],
            median: at(50.0),
            p75: at(75.0),
            p90: at(90.0),
            p95: at(95.0),
            p99: at(99.0),
            std: var.sqrt(),
        }
    }

    /// The values in report order, with their key stems (`median` is `median`, not `p50`).
    fn named(&self) -> [(&'static str, f64); 9] {
        [
            ("mean", self.mean),
            ("min", self.min),
            ("max", self.max),
            ("median", self.median),
            ("p75", self.p75),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("std", self.std),
        ]
    }
}

/// Streaming quantiles with bounded relative error (DDSketch with unbounded logarithmic bins).
///
/// Values `x > 0` land in bin `ceil(log_gamma(x))` with `gamma = (1 + a) / (1 - a)`,
/// `a = `[`SKETCH_RELATIVE_ACCURACY`]; a bin's estimate `2 gamma^i / (gamma + 1)` is within `a` of
/// every value in it. Zero (and tiny positive) values have their own bucket. Count, min, max, mean
/// and std are exact (Welford). Negative inputs count as zero; non-finite inputs are ignored.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantileSketch {
    /// Number of values in the zero bucket.
    zero_count: u64,
    /// Bin index of `bins[0]`.
    offset: i64,
    /// Counts of consecutive bins starting at `offset`.
    bins: Vec<u64>,
    /// Number of values added.
    count: u64,
    /// Exact smallest value (meaningless while `count == 0`).
    min: f64,
    /// Exact largest value (meaningless while `count == 0`).
    max: f64,
    /// Running mean (Welford).
    mean: f64,
    /// Running sum of squared deviations from the mean (Welford).
    m2: f64,
}

impl Default for QuantileSketch {
    fn default() -> Self {
        QuantileSketch::new()
    }
}

impl QuantileSketch {
    /// An empty sketch.
    pub fn new() -> QuantileSketch {
        QuantileSketch {
            zero_count: 0,
            offset: 0,
            bins: Vec::new(),
            count: 0,
            min: 0.0,
            max: 0.0,
            mean: 0.0,
            m2: 0.0,
        }
    }

    fn gamma() -> f64 {
        (1.0 + SKETCH_RELATIVE_ACCURACY) / (1.0 - SKETCH_RELATIVE_ACCURACY)
    }

    fn bin_index(x: f64) -> i64 {
        (x.ln() / Self::gamma().ln()).ceil() as i64
    }

    fn bin_value(index: i64) -> f64 {
        let gamma = Self::gamma();
        2.0 * (index as f64 * gamma.ln()).exp() / (gamma + 1.0)
    }

    /// Number of values added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Exact largest value added (0 when empty).
    pub fn max(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.max
        }
    }

    /// Adds one value.
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        let x = x.max(0.0);
        if x < SKETCH_MIN_INDEXABLE {
            self.zero_count += 1;
        } else {
            self.add_to_bin(Self::bin_index(x), 1);
        }
        if self.count == 0 {
            self.min = x;
            self.max = x;
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.count += 1;
        let delta = x - self.mean;
        self.mean += delta / self.count as f64;
        self.m2 += delta * (x - self.mean);
    }

    fn add_to_bin(&mut self, index: i64, n: u64) {
        if self.bins.is_empty() {
            self.offset = index;
            self.bins.push(0);
        } else if index < self.offset {
            let grow = (self.offset - index) as usize;
            self.bins.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = index;
        }
        let pos = (index - self.offset) as usize;
        if pos >= self.bins.len() {
            self.bins.resize(pos + 1, 0);
        }
        self.bins[pos] += n;
    }

    /// Adds every value of `other` to this sketch.
    pub fn merge(&mut self, other: &QuantileSketch) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        self.zero_count += other.zero_count;
        for (k, &c) in other.bins.iter().enumerate() {
            if c > 0 {
                self.add_to_bin(other.offset + k as i64, c);
            }
        }
        let n_a = self.count as f64;
        let n_b = other.count as f64;
        let n = n_a + n_b;
        let delta = other.mean - self.mean;
        self.mean += delta * n_b / n;
        self.m2 += other.m2 + delta * delta * n_a * n_b / n;
        self.count += other.count;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Estimated percentile `p` (0..=100) by the same rank rule as [`Distribution`]; rank 0 and
    /// the last rank are the exact min and max. Zero when empty.
    pub fn quantile(&self, p: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let n = usize::try_from(self.count).unwrap_or(usize::MAX);
        let rank = percentile_rank(n, p) as u64;
        if rank == 0 {
            return self.min;
        }
        if rank + 1 >= self.count {
            return self.max;
        }
        if rank < self.zero_count {
            return 0.0_f64.clamp(self.min, self.max);
        }
        let mut seen = self.zero_count;
        for (k, &c) in self.bins.iter().enumerate() {
            seen += c;
            if seen > rank {
                return Self::bin_value(self.offset + k as i64).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// The summary of every value added (percentiles estimated, the rest exact).
    pub fn distribution(&self) -> Distribution {
        if self.count == 0 {
            return Distribution::ZERO;
        }
        Distribution {
            mean: self.mean,
            min: self.min,
            max: self.max,
            median: self.quantile(50.0),
            p75: self.quantile(75.0),
            p90: self.quantile(90.0),
            p95: self.quantile(95.0),
            p99: self.quantile(99.0),
            std: (self.m2 / self.count as f64).max(0.0).sqrt(),
        }
    }
}

/// What happened to a request by the end of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestStatus {
    /// Admitted by a worker and finished.
    Completed,
    /// Refused (never ran to completion).
    Rejected,
    /// Still waiting or running when the run ended, or finished without ever being admitted.
    Incomplete,
}

/// One request's measurements, written as one JSONL line per request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The request id.
    pub request_id: u64,
    /// The trace session the request belongs to, if any.
    pub session_id: Option<String>,
    /// Position of the request within its session (0 for single-turn requests).
    pub turn_index: usize,
    /// Worker of the latest admission.
    pub worker: Option<u32>,
    /// When the request arrived (became ready to send).
    pub arrival_ms: f64,
    /// When a worker first admitted it.
    pub first_admit_ms: Option<f64>,
    /// When its first token was emitted.
    pub first_token_ms: Option<f64>,
    /// When its last token was emitted.
    pub last_token_ms: Option<f64>,
    /// Terminal time: completion or rejection.
    pub finish_ms: Option<f64>,
    /// First token minus arrival.
    pub ttft_ms: Option<f64>,
    /// Second token minus first token.
    pub ttst_ms: Option<f64>,
    /// Last token minus arrival.
    pub e2e_latency_ms: Option<f64>,
    /// Mean inter-token gap of this request: (last − first) / (tokens − 1).
    pub itl_ms: Option<f64>,
    /// Prompt length in tokens.
    pub input_length: usize,
    /// Tokens emitted.
    pub output_length: u64,
    /// Output tokens requested.
    pub max_output_tokens: usize,
    /// Prompt tokens found in the prefix cache at the latest admission.
    pub reused_input_tokens: usize,
    /// Of those, tokens onboarded from the host tier (G2).
    pub g2_reused_input_tokens: usize,
    /// Disaggregated mode: time its prompt KV took to reach the decode worker.
    pub kv_transfer_ms: Option<f64>,
    /// Completed, rejected or incomplete.
    pub status: RequestStatus,
}

/// Summary of a replay, with Dynamo's `--report-json` keys in Dynamo's order.
///
/// Serialises as one flat object: the scalar fields, then for each distribution `ttft`, `ttst`,
/// `tpot`, `itl`, `e2e_latency` the keys `{mean,min,max,median,p75,p90,p95,p99,std}_{name}_ms`,
/// then `{stat}_output_token_throughput_per_user`. Dynamo lists `max_itl_ms` after the
/// distributions; it is the same figure as the ITL distribution's `max_itl_ms` key, so it is
/// written once (a second copy would make a duplicate JSON key).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    /// Requests that arrived.
    pub num_requests: u64,
    /// Requests admitted and finished.
    pub completed_requests: u64,
    /// Σ input length of completed requests.
    pub total_input_tokens: u64,
    /// Σ tokens emitted by completed requests.
    pub total_output_tokens: u64,
    /// Latest completion time (simulated ms).
    pub duration_ms: f64,
    /// Host time the run took (wall clock).
    pub wall_time_ms: f64,
    /// Completed requests per simulated second.
    pub request_throughput_rps: f64,
    /// Input tokens per simulated second.
    pub input_throughput_tok_s: f64,
    /// Output tokens per simulated second.
    pub output_throughput_tok_s: f64,
    /// Input plus output tokens per simulated second.
    pub total_throughput_tok_s: f64,
    /// Input plus output tokens of completed requests.
    pub processed_tokens: u64,
    /// `processed_tokens` per wall-clock second (simulator speed).
    pub processed_tokens_per_s: f64,
    /// Output tokens per wall-clock second (simulator speed).
    pub processed_output_tokens_per_s: f64,
    /// Σ reused prompt tokens at the latest admission / Σ input tokens.
    pub prefix_cache_reused_ratio: f64,
    /// Σ reused prompt tokens at the first admission / Σ input tokens.
    pub first_admission_prefix_cache_reused_ratio: f64,
    /// Time to first token (ms).
    pub ttft: Distribution,
    /// Time from first to second token (ms).
    pub ttst: Distribution,
    /// Per-request mean time per output token after the first (ms).
    pub tpot: Distribution,
    /// Every consecutive token gap (ms; sketch percentiles).
    pub itl: Distribution,
    /// Arrival to last token (ms).
    pub e2e_latency: Distribution,
    /// `1000 / gap_ms` over every positive token gap (tokens/s; sketch percentiles).
    pub output_token_throughput_per_user: Distribution,
    /// Disaggregated-serving figures (extra keys after Dynamo's), when disaggregated.
    pub disagg: Option<DisaggFigures>,
    /// Host-tier (G2) figures (extra keys after Dynamo's), when G2 is on.
    pub g2: Option<G2Figures>,
    /// Requests the engine refused or rejected (an extra key after Dynamo's, written when
    /// not 0).
    pub rejected_requests: u64,
}

/// Figures of a disaggregated run (not in Dynamo's report; written after its keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DisaggFigures {
    /// Prefill→decode hand-offs.
    pub kv_transfers: u64,
    /// Mean hand-off time (ms).
    pub mean_kv_transfer_ms: f64,
    /// Summed hand-off time (ms).
    pub total_kv_transfer_ms: f64,
    /// Prefill workers.
    pub num_prefill_workers: u64,
    /// Decode workers.
    pub num_decode_workers: u64,
    /// Share of the run's duration the prefill workers spent in passes (mean over workers).
    pub prefill_pool_utilization: f64,
    /// Share of the run's duration the decode workers spent in passes (mean over workers).
    pub decode_pool_utilization: f64,
}

/// Figures of the host tier (not in Dynamo's report; written after its keys).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct G2Figures {
    /// Σ prompt tokens onboarded from G2 at the latest admission (completed requests); they are
    /// also counted in `prefix_cache_reused_ratio`.
    pub g2_reused_tokens: u64,
    /// `g2_reused_tokens` / Σ input tokens.
    pub g2_prefix_cache_reused_ratio: f64,
    /// Blocks offloaded G1→G2 (transfers completed), all workers.
    pub g2_offloaded_blocks: u64,
    /// Blocks onboarded G2→G1 (transfers completed), all workers.
    pub g2_onboarded_blocks: u64,
}

/// A report value: integers stay integers in JSON.
enum Figure {
    Count(u64),
    Real(f64),
}

impl Serialize for Figure {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Figure::Count(n) => s.serialize_u64(*n),
            Figure::Real(x) => s.serialize_f64(*x),
        }
    }
}

impl ReplayReport {
    /// Every key and value in output order.
    fn figures(&self) -> Vec<(String, Figure)> {
        use Figure::{Count, Real};
        let mut out: Vec<(String, Figure)> = vec![
            ("num_requests".into(), Count(self.num_requests)),
            ("completed_requests".into(), Count(self.completed_requests)),
            ("total_input_tokens".into(), Count(self.total_input_tokens)),
            (
                "total_output_tokens".into(),
                Count(self.total_output_tokens),
            ),
            ("duration_ms".into(), Real(self.duration_ms)),
            ("wall_time_ms".into(), Real(self.wall_time_ms)),
            (
                "request_throughput_rps".into(),
                Real(self.request_throughput_rps),
            ),
            (
                "input_throughput_tok_s".into(),
                Real(self.input_throughput_tok_s),
            ),
            (
                "output_throughput_tok_s".into(),
                Real(self.output_throughput_tok_s),
            ),
            (
                "total_throughput_tok_s".into(),
                Real(self.total_throughput_tok_s),
            ),
            ("processed_tokens".into(), Count(self.processed_tokens)),
            (
                "processed_tokens_per_s".into(),
                Real(self.processed_tokens_per_s),
            ),
            (
                "processed_output_tokens_per_s".into(),
                Real(self.processed_output_tokens_per_s),
            ),
            (
                "prefix_cache_reused_ratio".into(),
                Real(self.prefix_cache_reused_ratio),
            ),
            (
                "first_admission_prefix_cache_reused_ratio".into(),
                Real(self.first_admission_prefix_cache_reused_ratio),
            ),
        ];
        for (name, dist) in self.latencies() {
            for (stat, v) in dist.named() {
                out.push((format!("{stat}_{name}_ms"), Real(v)));
            }
        }
        for (stat, v) in self.output_token_throughput_per_user.named() {
            out.push((format!("{stat}_output_token_throughput_per_user"), Real(v)));
        }
        out.extend(self.extra_figures());
        out
    }

    /// The keys beyond Dynamo's (disaggregation, host tier), in output order.
    fn extra_figures(&self) -> Vec<(String, Figure)> {
        use Figure::{Count, Real};
        let mut out: Vec<(String, Figure)> = Vec::new();
        if self.rejected_requests > 0 {
            out.push(("rejected_requests".into(), Count(self.rejected_requests)));
        }
        if let Some(d) = &self.disagg {
            out.extend([
                ("num_prefill_workers".into(), Count(d.num_prefill_workers)),
                ("num_decode_workers".into(), Count(d.num_decode_workers)),
                ("kv_transfers".into(), Count(d.kv_transfers)),
                ("mean_kv_transfer_ms".into(), Real(d.mean_kv_transfer_ms)),
                ("total_kv_transfer_ms".into(), Real(d.total_kv_transfer_ms)),
                (
                    "prefill_pool_utilization".into(),
                    Real(d.prefill_pool_utilization),
                ),
                (
                    "decode_pool_utilization".into(),
                    Real(d.decode_pool_utilization),
                ),
            ]);
        }
        if let Some(g) = &self.g2 {
            out.extend([
                ("g2_reused_tokens".into(), Count(g.g2_reused_tokens)),
                (
                    "g2_prefix_cache_reused_ratio".into(),
                    Real(g.g2_prefix_cache_reused_ratio),
                ),
                ("g2_offloaded_blocks".into(), Count(g.g2_offloaded_blocks)),
                ("g2_onboarded_blocks".into(), Count(g.g2_onboarded_blocks)),
            ]);
        }
        out
    }

    /// The latency distributions with their key names, in report order.
    fn latencies(&self) -> [(&'static str, &Distribution); 5] {
        [
            ("ttft", &self.ttft),
            ("ttst", &self.ttst),
            ("tpot", &self.tpot),
            ("itl", &self.itl),
            ("e2e_latency", &self.e2e_latency),
        ]
    }

    /// Largest token gap (ms): the ITL distribution's exact max.
    pub fn max_itl_ms(&self) -> f64 {
        self.itl.max
    }

    /// A copy with the wall-clock figures ([`WALL_CLOCK_KEYS`]) set to zero, for determinism
    /// checks: two runs of the same input must then serialise identically.
    pub fn without_wall_clock(&self) -> ReplayReport {
        ReplayReport {
            wall_time_ms: 0.0,
            processed_tokens_per_s: 0.0,
            processed_output_tokens_per_s: 0.0,
            ..self.clone()
        }
    }
}

impl Serialize for ReplayReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let figures = self.figures();
        let mut map = s.serialize_map(Some(figures.len()))?;
        for (k, v) in &figures {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const W: usize = 42;
        writeln!(f, "Requests and throughput")?;
        writeln!(f, "  {:<W$} {}", "num_requests", self.num_requests)?;
        writeln!(
            f,
            "  {:<W$} {}",
            "completed_requests", self.completed_requests
        )?;
        writeln!(
            f,
            "  {:<W$} {}",
            "total_input_tokens", self.total_input_tokens
        )?;
        writeln!(
            f,
            "  {:<W$} {}",
            "total_output_tokens", self.total_output_tokens
        )?;
        writeln!(f, "  {:<W$} {:.3}", "duration_ms", self.duration_ms)?;
        writeln!(f, "  {:<W$} {:.3}", "wall_time_ms", self.wall_time_ms)?;
        let rates = [
            ("request_throughput_rps", self.request_throughput_rps),
            ("input_throughput_tok_s", self.input_throughput_tok_s),
            ("output_throughput_tok_s", self.output_throughput_tok_s),
            ("total_throughput_tok_s", self.total_throughput_tok_s),
        ];
        for (k, v) in rates {
            writeln!(f, "  {k:<W$} {v:.6}")?;
        }
        writeln!(f, "  {:<W$} {}", "processed_tokens", self.processed_tokens)?;
        writeln!(
            f,
            "  {:<W$} {:.3}",
            "processed_tokens_per_s", self.processed_tokens_per_s
        )?;
        writeln!(
            f,
            "  {:<W$} {:.3}",
            "processed_output_tokens_per_s", self.processed_output_tokens_per_s
        )?;
        writeln!(f, "Prefix cache reuse")?;
        writeln!(
            f,
            "  {:<W$} {:.6}",
            "prefix_cache_reused_ratio", self.prefix_cache_reused_ratio
        )?;
        writeln!(
            f,
            "  {:<W$} {:.6}",
            "first_admission_prefix_cache_reused_ratio",
            self.first_admission_prefix_cache_reused_ratio
        )?;
        writeln!(f, "Latency (ms)")?;
        let heads = [
            "mean", "min", "p50", "p75", "p90", "p95", "p99", "max", "std",
        ];
        write!(f, "  {:<14}", "")?;
        for h in heads {
            write!(f, " {h:>11}")?;
        }
        writeln!(f)?;
        let row = |f: &mut fmt::Formatter<'_>, label: &str, d: &Distribution| {
            write!(f, "  {label:<14}")?;
            for v in [
                d.mean, d.min, d.median, d.p75, d.p90, d.p95, d.p99, d.max, d.std,
            ] {
                write!(f, " {v:>11.3}")?;
            }
            writeln!(f)
        };
        let labels = ["TTFT", "TTST", "TPOT", "ITL", "E2E"];
        for (label, (_, d)) in labels.iter().zip(self.latencies()) {
            row(f, label, d)?;
        }
        writeln!(f, "Per-user output throughput (tokens/s)")?;
        row(f, "tok/s/user", &self.output_token_throughput_per_user)?;
        let extras = self.extra_figures();
        if !extras.is_empty() {
            writeln!(f, "Rejections, disaggregation and host tier")?;
            for (k, v) in extras {
                match v {
                    Figure::Count(n) => writeln!(f, "  {k:<W$} {n}")?,
                    Figure::Real(x) => writeln!(f, "  {k:<W$} {x:.6}")?,
                }
            }
        }
        Ok(())
    }
}

/// O(1) lifecycle state of one request.
#[derive(Clone, Debug)]
struct RequestState {
    arrival: SimTime,
    input_length: usize,
    max_output: usize,
    session: Option<Box<str>>,
    turn: usize,
    worker: Option<WorkerId>,
    first_admit: Option<SimTime>,
    first_reused: usize,
    latest_reused: usize,
    latest_g2_reused: usize,
    kv_transfer: Option<SimDuration>,
    first_token: Option<SimTime>,
    second_token: Option<SimTime>,
    last_token: Option<SimTime>,
    num_tokens: u64,
    finished: Option<SimTime>,
    rejected: Option<SimTime>,
}

/// Ids up to this far beyond the dense table's end extend it; sparser ids go to a map.
const DENSE_SLACK: u64 = 1 << 16;

/// Records request lifecycle events and turns them into a [`ReplayReport`].
///
/// Hooks for ids that never arrived are ignored. Token gaps are streamed into sketches as they
/// happen, so the ITL and per-user figures include the gaps of requests that later do not complete
/// (Dynamo counts completed requests only; in a replay that runs to the end every request that
/// emits tokens completes).
#[derive(Clone, Debug, Default)]
pub struct Collector {
    /// Requests by id while ids are dense (the usual case: ids count up from 0).
    dense: Vec<Option<RequestState>>,
    /// Requests whose ids are far beyond the dense table.
    sparse: BTreeMap<u64, RequestState>,
    /// Every consecutive token gap (ms).
    itl: QuantileSketch,
    /// `1000 / gap_ms` for every positive gap.
    per_user_throughput: QuantileSketch,
}

/// The state of request `id`, wherever it is stored.
fn lookup<'a>(
    dense: &'a mut [Option<RequestState>],
    sparse: &'a mut BTreeMap<u64, RequestState>,
    id: RequestId,
) -> Option<&'a mut RequestState> {
    match usize::try_from(id.0).ok().and_then(|i| dense.get_mut(i)) {
        Some(Some(state)) => Some(state),
        _ => sparse.get_mut(&id.0),
    }
}

fn ms(t: SimTime) -> f64 {
    t.as_millis_f64()
}

fn span_ms(later: SimTime, earlier: SimTime) -> f64 {
    later.saturating_since(earlier).as_millis_f64()
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Collector {
        Collector::default()
    }

    fn get_mut(&mut self, id: RequestId) -> Option<&mut RequestState> {
        lookup(&mut self.dense, &mut self.sparse, id)
    }

    /// A request became ready to send at `t` (its latency clock starts here). A repeated
    /// arrival for the same id starts it over.
    pub fn on_arrival(
        &mut self,
        id: RequestId,
        t: SimTime,
        input_len: usize,
        max_output: usize,
        session: Option<&str>,
        turn: usize,
    ) {
        let state = RequestState {
            arrival: t,
            input_length: input_len,
            max_output,
            session: session.map(Box::from),
            turn,
            worker: None,
            first_admit: None,
            first_reused: 0,
            latest_reused: 0,
            latest_g2_reused: 0,
            kv_transfer: None,
            first_token: None,
            second_token: None,
            last_token: None,
            num_tokens: 0,
            finished: None,
            rejected: None,
        };
        let dense_len = self.dense.len() as u64;
        match usize::try_from(id.0) {
            Ok(i) if id.0 <= dense_len + DENSE_SLACK => {
                if i >= self.dense.len() {
                    self.dense.resize_with(i + 1, || None);
                }
                self.sparse.remove(&id.0);
                self.dense[i] = Some(state);
            }
            _ => {
                self.sparse.insert(id.0, state);
            }
        }
    }

    /// A worker admitted the request at `t` with `reused_tokens` prompt tokens already cached.
    /// Called again after a preemption; the first admission's reuse is kept separately.
    pub fn on_admit(&mut self, id: RequestId, t: SimTime, reused_tokens: usize, worker: WorkerId) {
        if let Some(s) = self.get_mut(id) {
            if s.first_admit.is_none() {
                s.first_admit = Some(t);
                s.first_reused = reused_tokens;
            }
            s.latest_reused = reused_tokens;
            s.worker = Some(worker);
        }
    }

    /// The admission just recorded by [`Collector::on_admit`] had `tokens` of its reused prompt
    /// tokens onboarded from the host tier (G2).
    pub fn on_g2_reuse(&mut self, id: RequestId, tokens: usize) {
        if let Some(s) = self.get_mut(id) {
            s.latest_g2_reused = tokens;
        }
    }

    /// Disaggregated mode: the request's prompt KV takes `duration` to reach its decode worker.
    pub fn on_kv_transfer(&mut self, id: RequestId, duration: SimDuration) {
        if let Some(s) = self.get_mut(id) {
            let total = s.kv_transfer.unwrap_or(SimDuration::ZERO) + duration;
            s.kv_transfer = Some(total);
        }
    }

    /// The request emitted one token at `t`.
    pub fn on_token(&mut self, id: RequestId, t: SimTime) {
        let Collector {
            dense,
            sparse,
            itl,
            per_user_throughput,
        } = self;
        let Some(s) = lookup(dense, sparse, id) else {
            return;
        };
        if let Some(prev) = s.last_token {
            let gap = span_ms(t, prev);
            itl.add(gap);
            if gap > 0.0 {
                per_user_throughput.add(1000.0 / gap);
            }
        }
        match s.num_tokens {
            0 => s.first_token = Some(t),
            1 => s.second_token = Some(t),
            _ => {}
        }
        s.last_token = Some(t);
        s.num_tokens += 1;
    }

    /// The request finished (all tokens emitted, or stopped) at `t`.
    pub fn on_finish(&mut self, id: RequestId, t: SimTime) {
        if let Some(s) = self.get_mut(id) {
            s.finished = Some(t);
        }
    }

    /// The request was refused at `t`.
    pub fn on_reject(&mut self, id: RequestId, t: SimTime) {
        if let Some(s) = self.get_mut(id) {
            s.rejected = Some(t);
        }
    }

    /// The report and one record per request (in id order). `wall_time` is the host time the
    /// run took; it only feeds [`WALL_CLOCK_KEYS`].
    pub fn finish(self, wall_time: std::time::Duration) -> (ReplayReport, Vec<RequestRecord>) {
        let Collector {
            dense,
            sparse,
            itl,
            per_user_throughput,
        } = self;
        let mut requests: Vec<(u64, RequestState)> = dense
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i as u64, s)))
            .collect();
        if !sparse.is_empty() {
            requests.extend(sparse);
            requests.sort_by_key(|(id, _)| *id);
        }

        let mut report = ReplayReport {
            num_requests: requests.len() as u64,
            ..ReplayReport::default()
        };
        let (mut ttft, mut ttst, mut tpot, mut e2e) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut reused, mut first_reused, mut g2_reused) = (0u64, 0u64, 0u64);
        let mut duration_ms: f64 = 0.0;
        let mut records = Vec::with_capacity(requests.len());
        for (id, s) in requests {
            let completed = s.first_admit.is_some() && s.finished.is_some() && s.rejected.is_none();
            let status = if completed {
                RequestStatus::Completed
            } else if s.rejected.is_some() {
                RequestStatus::Rejected
            } else {
                RequestStatus::Incomplete
            };
            let ttft_ms = s.first_token.map(|t| span_ms(t, s.arrival));
            let ttst_ms = s
                .first_token
                .zip(s.second_token)
                .map(|(a, b)| span_ms(b, a));
            let e2e_ms = s.last_token.map(|t| span_ms(t, s.arrival));
            let itl_ms = match (s.first_token, s.last_token) {
                (Some(a), Some(b)) if s.num_tokens > 1 => {
                    Some(span_ms(b, a) / (s.num_tokens - 1) as f64)
                }
                _ => None,
            };
            report.rejected_requests += u64::from(status == RequestStatus::Rejected);
            if completed {
                report.completed_requests += 1;
                report.total_input_tokens += s.input_length as u64;
                report.total_output_tokens += s.num_tokens;
                reused += s.latest_reused as u64;
                first_reused += s.first_reused as u64;
                g2_reused += s.latest_g2_reused as u64;
                if let Some(t) = s.finished {
                    duration_ms = duration_ms.max(ms(t));
                }
                ttft.extend(ttft_ms);
                ttst.extend(ttst_ms);
                tpot.extend(itl_ms);
                e2e.extend(e2e_ms);
            }
            records.push(RequestRecord {
                request_id: id,
                session_id: s.session.map(String::from),
                turn_index: s.turn,
                worker: s.worker.map(|w| w.0),
                arrival_ms: ms(s.arrival),
                first_admit_ms: s.first_admit.map(ms),
                first_token_ms: s.first_token.map(ms),
                last_token_ms: s.last_token.map(ms),
                finish_ms: s.finished.or(s.rejected).map(ms),
                ttft_ms,
                ttst_ms,
                e2e_latency_ms: e2e_ms,
                itl_ms,
                input_length: s.input_length,
                output_length: s.num_tokens,
                max_output_tokens: s.max_output,
                reused_input_tokens: s.latest_reused,
                g2_reused_input_tokens: s.latest_g2_reused,
                kv_transfer_ms: s.kv_transfer.map(SimDuration::as_millis_f64),
                status,
            });
        }

        let duration_s = (duration_ms / 1000.0).max(1e-9);
        let wall_ms = wall_time.as_secs_f64() * 1000.0;
        let per_wall_s = |n: u64| {
            if wall_ms > 0.0 {
                n as f64 / wall_ms * 1000.0
            } else {
                0.0
            }
        };
        let ratio = |num: u64, den: u64| {
            if den > 0 {
                num as f64 / den as f64
            } else {
                0.0
            }
        };
        report.duration_ms = duration_ms;
        report.wall_time_ms = wall_ms;
        report.request_throughput_rps = report.completed_requests as f64 / duration_s;
        report.input_throughput_tok_s = report.total_input_tokens as f64 / duration_s;
        report.output_throughput_tok_s = report.total_output_tokens as f64 / duration_s;
        report.processed_tokens = report.total_input_tokens + report.total_output_tokens;
        report.total_throughput_tok_s = report.processed_tokens as f64 / duration_s;
        report.processed_tokens_per_s = per_wall_s(report.processed_tokens);
        report.processed_output_tokens_per_s = per_wall_s(report.total_output_tokens);
        report.prefix_cache_reused_ratio = ratio(reused, report.total_input_tokens);
        report.first_admission_prefix_cache_reused_ratio =
            ratio(first_reused, report.total_input_tokens);
        report.ttft = Distribution::from_samples(&mut ttft);
        report.ttst = Distribution::from_samples(&mut ttst);
        report.tpot = Distribution::from_samples(&mut tpot);
        report.e2e_latency = Distribution::from_samples(&mut e2e);
        report.itl = itl.distribution();
        report.output_token_throughput_per_user = per_user_throughput.distribution();
        // Filled in by the replay when G2 is on; the token count is only known here.
        report.g2 = Some(G2Figures {
            g2_reused_tokens: g2_reused,
            g2_prefix_cache_reused_ratio: ratio(g2_reused, report.total_input_tokens),
            ..G2Figures::default()
        })
        .filter(|_| g2_reused > 0);
        (report, records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn t_ms(ms: u64) -> SimTime {
        SimTime(ms * 1000)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn exact_distribution_uses_rounded_rank_and_population_std() {
        let mut xs: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        let d = Distribution::from_samples(&mut xs);
        assert_eq!((d.min, d.max, d.mean), (1.0, 10.0, 5.5));
        // rank round(9 * 0.5) = round(4.5) = 5 -> 6; round(6.75) = 7 -> 8; round(8.1) = 8 -> 9.
        assert_eq!(
            (d.median, d.p75, d.p90, d.p95, d.p99),
            (6.0, 8.0, 9.0, 10.0, 10.0)
        );
        assert!(close(d.std, 8.25f64.sqrt()));
        assert_eq!(Distribution::from_samples(&mut []), Distribution::ZERO);
        let one = Distribution::from_samples(&mut [4.0]);
        assert_eq!((one.median, one.p99, one.std), (4.0, 4.0, 0.0));
    }

    #[test]
    fn sketch_matches_exact_percentiles_within_relative_accuracy() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for round in 0..4 {
            let n = [1, 3, 1000, 100_000][round];
            let mut xs: Vec<f64> = (0..n)
                .map(|i| {
                    if i % 17 == 3 {
                        0.0
                    } else {
                        // log-uniform over six decades plus a bulk around 20 ms
                        if rng.gen_bool(0.5) {
                            10f64.powf(rng.gen_range(-3.0..3.0))
                        } else {
                            rng.gen_range(15.0..25.0)
                        }
                    }
                })
                .collect();
            let mut sketch = QuantileSketch::new();
            for &x in &xs {
                sketch.add(x);
            }
            let exact = Distribution::from_samples(&mut xs);
            let approx = sketch.distribution();
            for ((name, e), (_, a)) in exact.named().into_iter().zip(approx.named()) {
                let tol = if name == "mean" || name == "std" {
                    1e-9 * e.abs().max(1.0)
                } else {
                    (SKETCH_RELATIVE_ACCURACY + 1e-9) * e.abs()
                };
                assert!((a - e).abs() <= tol, "n={n} {name}: sketch {a} exact {e}");
            }
            assert_eq!(sketch.count(), n as u64);
        }
    }

    #[test]
    fn sketch_merge_equals_single_sketch() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let xs: Vec<f64> = (0..5000).map(|_| rng.gen_range(0.0..500.0)).collect();
        let mut whole = QuantileSketch::new();
        let (mut a, mut b) = (QuantileSketch::new(), QuantileSketch::new());
        for &x in &xs {
            whole.add(x);
        }
        for (i, &x) in xs.iter().enumerate() {
            if i < 1234 {
                a.add(x);
            } else {
                b.add(x);
            }
        }
        a.merge(&b);
        let (m, w) = (a.distribution(), whole.distribution());
        assert_eq!(
            (m.median, m.p90, m.p99, m.min, m.max),
            (w.median, w.p90, w.p99, w.min, w.max)
        );
        assert!(close(m.mean, w.mean) && close(m.std, w.std));
        let mut empty = QuantileSketch::new();
        empty.merge(&whole);
        assert_eq!(empty.distribution(), w);
    }

    #[test]
    fn itl_uses_per_token_gaps() {
        // Dynamo's test_replay_itl_uses_per_token_gaps.
        let mut c = Collector::new();
        let id = RequestId(0);
        c.on_arrival(id, SimTime::ZERO, 100, 4, None, 0);
        c.on_admit(id, SimTime::ZERO, 0, WorkerId(0));
        for ms in [10, 11, 12, 110] {
            c.on_token(id, t_ms(ms));
        }
        c.on_finish(id, t_ms(110));
        let (r, records) = c.finish(std::time::Duration::from_millis(5));
        assert!(close(r.tpot.mean, 100.0 / 3.0));
        assert_eq!(r.itl.median, 1.0);
        assert_eq!(
            (r.itl.p75, r.itl.p90, r.itl.p95, r.itl.max),
            (98.0, 98.0, 98.0, 98.0)
        );
        assert_eq!(r.max_itl_ms(), 98.0);
        assert_eq!(r.ttst.mean, 1.0);
        assert_eq!(r.ttft.mean, 10.0);
        assert_eq!(r.e2e_latency.mean, 110.0);
        assert!(close(r.output_token_throughput_per_user.min, 1000.0 / 98.0));
        assert_eq!(r.output_token_throughput_per_user.max, 1000.0);
        assert_eq!(records[0].itl_ms, Some(100.0 / 3.0));
        assert_eq!(records[0].status, RequestStatus::Completed);
        assert_eq!(r.wall_time_ms, 5.0);
        assert!(close(r.processed_tokens_per_s, 104.0 / 5.0 * 1000.0));
    }

    #[test]
    fn two_request_report_by_hand() {
        let mut c = Collector::new();
        let (a, b) = (RequestId(0), RequestId(1));
        c.on_arrival(a, t_ms(0), 1000, 3, Some("s"), 0);
        c.on_arrival(b, t_ms(100), 3000, 2, Some("s"), 1);
        c.on_admit(a, t_ms(5), 0, WorkerId(0));
        c.on_admit(b, t_ms(100), 1000, WorkerId(1));
        for ms in [50, 60, 80] {
            c.on_token(a, t_ms(ms));
        }
        c.on_finish(a, t_ms(80));
        c.on_token(b, t_ms(300));
        // b is preempted and re-admitted with more reuse, then finishes.
        c.on_admit(b, t_ms(350), 2000, WorkerId(2));
        c.on_token(b, t_ms(400));
        c.on_finish(b, t_ms(400));
        let (r, records) = c.finish(std::time::Duration::from_millis(2));
        assert_eq!((r.num_requests, r.completed_requests), (2, 2));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (4000, 5));
        assert_eq!(r.duration_ms, 400.0);
        assert!(close(r.request_throughput_rps, 5.0));
        assert!(close(r.input_throughput_tok_s, 10_000.0));
        assert!(close(r.output_throughput_tok_s, 12.5));
        assert!(close(r.total_throughput_tok_s, 10_012.5));
        assert_eq!(r.processed_tokens, 4005);
        assert!(close(r.processed_tokens_per_s, 4005.0 / 2.0 * 1000.0));
        assert!(close(r.processed_output_tokens_per_s, 2500.0));
        assert!(close(r.prefix_cache_reused_ratio, 0.5));
        assert!(close(r.first_admission_prefix_cache_reused_ratio, 0.25));
        // TTFT a=50, b=200; E2E a=80, b=300; TTST a=10, b=100; TPOT a=15, b=100.
        assert_eq!((r.ttft.mean, r.ttft.min, r.ttft.max), (125.0, 50.0, 200.0));
        assert_eq!(r.ttft.median, 200.0); // rank round(0.5) = 1
        assert_eq!(r.ttft.std, 75.0);
        assert_eq!((r.e2e_latency.min, r.e2e_latency.max), (80.0, 300.0));
        assert_eq!((r.ttst.min, r.ttst.max), (10.0, 100.0));
        assert_eq!((r.tpot.min, r.tpot.max), (15.0, 100.0));
        // ITL gaps 10, 20, 100.
        assert!(close(r.itl.mean, 130.0 / 3.0));
        assert_eq!((r.itl.min, r.itl.max, r.max_itl_ms()), (10.0, 100.0, 100.0));
        assert!((r.itl.median - 20.0).abs() <= 20.0 * SKETCH_RELATIVE_ACCURACY);
        assert_eq!(records.len(), 2);
        let rb = &records[1];
        assert_eq!(rb.worker, Some(2));
        assert_eq!(rb.reused_input_tokens, 2000);
        assert_eq!(rb.session_id.as_deref(), Some("s"));
        assert_eq!(
            (rb.turn_index, rb.output_length, rb.max_output_tokens),
            (1, 2, 2)
        );
        assert_eq!(rb.first_admit_ms, Some(100.0));
        assert_eq!(rb.ttft_ms, Some(200.0));
    }

    #[test]
    fn rejected_and_incomplete_requests_are_counted_but_not_completed() {
        let mut c = Collector::new();
        c.on_arrival(RequestId(0), t_ms(0), 10, 2, None, 0);
        c.on_reject(RequestId(0), t_ms(1));
        c.on_arrival(RequestId(1), t_ms(0), 10, 2, None, 0);
        c.on_admit(RequestId(1), t_ms(1), 0, WorkerId(0));
        c.on_token(RequestId(1), t_ms(2));
        // Far-away id goes to the sparse map; unknown ids are ignored.
        c.on_arrival(RequestId(u64::MAX), t_ms(0), 10, 2, None, 0);
        c.on_token(RequestId(42), t_ms(3));
        c.on_finish(RequestId(43), t_ms(3));
        let (r, records) = c.finish(std::time::Duration::ZERO);
        assert_eq!((r.num_requests, r.completed_requests), (3, 0));
        assert_eq!(r.duration_ms, 0.0);
        assert_eq!(r.processed_tokens_per_s, 0.0);
        let statuses: Vec<_> = records.iter().map(|x| (x.request_id, x.status)).collect();
        assert_eq!(
            statuses,
            [
                (0, RequestStatus::Rejected),
                (1, RequestStatus::Incomplete),
                (u64::MAX, RequestStatus::Incomplete)
            ]
        );
        assert_eq!(records[0].finish_ms, Some(1.0));
        let line = serde_json::to_string(&records[0]).expect("serialises");
        assert!(line.contains("\"status\":\"rejected\""), "{line}");
        assert!(line.contains("\"first_token_ms\":null"), "{line}");
    }

    #[test]
    fn empty_collector_gives_zeros() {
        let (r, records) = Collector::new().finish(std::time::Duration::ZERO);
        assert!(records.is_empty());
        assert_eq!(r, ReplayReport::default());
        let json = serde_json::to_value(&r).expect("serialises");
        let obj = json.as_object().expect("object");
        assert!(obj.values().all(|v| v.as_f64() == Some(0.0)), "{json}");
    }

    #[test]
    fn json_keys_are_in_dynamo_order() {
        let json = serde_json::to_string(&ReplayReport::default()).expect("serialises");
        let mut expected: Vec<String> = [
            "num_requests",
            "completed_requests",
            "total_input_tokens",
            "total_output_tokens",
            "duration_ms",
            "wall_time_ms",
            "request_throughput_rps",
            "input_throughput_tok_s",
            "output_throughput_tok_s",
            "total_throughput_tok_s",
            "processed_tokens",
            "processed_tokens_per_s",
            "processed_output_tokens_per_s",
            "prefix_cache_reused_ratio",
            "first_admission_prefix_cache_reused_ratio",
        ]
        .map(String::from)
        .to_vec();
        let stats = [
            "mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std",
        ];
        for p in ["ttft", "ttst", "tpot", "itl", "e2e_latency"] {
            for s in stats {
                expected.push(format!("{s}_{p}_ms"));
            }
        }
        // Dynamo's trailing `max_itl_ms` is the ITL block's own `max_itl_ms`: written once.
        for s in stats {
            expected.push(format!("{s}_output_token_throughput_per_user"));
        }
        // Keys appear in the text in exactly this order.
        let mut keys = Vec::new();
        let mut rest = json.as_str();
        while let Some(start) = rest.find('"') {
            let end = rest[start + 1..].find('"').expect("closing quote") + start + 1;
            keys.push(rest[start + 1..end].to_string());
            rest = &rest[end + 1..];
        }
        assert_eq!(keys, expected);
        assert!(json.starts_with("{\"num_requests\":0,"), "{json}");
        for k in WALL_CLOCK_KEYS {
            assert!(expected.iter().any(|e| e == k));
        }
    }

    #[test]
    fn wall_clock_free_reports_compare_equal() {
        let run = |wall_ms| {
            let mut c = Collector::new();
            c.on_arrival(RequestId(0), t_ms(0), 8, 1, None, 0);
            c.on_admit(RequestId(0), t_ms(0), 4, WorkerId(0));
            c.on_token(RequestId(0), t_ms(7));
            c.on_finish(RequestId(0), t_ms(7));
            c.finish(std::time::Duration::from_millis(wall_ms)).0
        };
        let (a, b) = (run(3), run(9));
        assert_ne!(a, b);
        let ja = serde_json::to_string(&a.without_wall_clock()).expect("json");
        let jb = serde_json::to_string(&b.without_wall_clock()).expect("json");
        assert_eq!(ja, jb);
    }

    #[test]
    fn display_shows_every_section() {
        let mut c = Collector::new();
        c.on_arrival(RequestId(0), t_ms(0), 8, 2, None, 0);
        c.on_admit(RequestId(0), t_ms(0), 0, WorkerId(0));
        c.on_token(RequestId(0), t_ms(7));
        c.on_token(RequestId(0), t_ms(9));
        c.on_finish(RequestId(0), t_ms(9));
        let text = c.finish(std::time::Duration::from_millis(1)).0.to_string();
        for needle in [
            "completed_requests",
            "prefix_cache_reused_ratio",
            "TTFT",
            "E2E",
            "p99",
            "tok/s/user",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        let ttft_row = text
            .lines()
            .find(|l| l.trim_start().starts_with("TTFT"))
            .expect("row");
        assert!(ttft_row.contains("7.000"), "{ttft_row}");
    }
}
