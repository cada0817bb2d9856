//! What a run reports: the [`ReplayReport`] summary (Dynamo's `--report-json` keys and order)
//! and one [`RequestRecord`] per request.

use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use super::distribution::Distribution;

/// Report keys that depend on host wall-clock time; blank them to compare reports byte for byte.
pub const WALL_CLOCK_KEYS: [&str; 3] = [
    "wall_time_ms",
    "processed_tokens_per_s",
    "processed_output_tokens_per_s",
];

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
    pub(crate) input_throughput_tok_s: f64,
    /// Output tokens per simulated second.
    pub(crate) output_throughput_tok_s: f64,
    /// Input plus output tokens per simulated second.
    pub(crate) total_throughput_tok_s: f64,
    /// Input plus output tokens of completed requests.
    pub(crate) processed_tokens: u64,
    /// `processed_tokens` per wall-clock second (simulator speed).
    pub processed_tokens_per_s: f64,
    /// Output tokens per wall-clock second (simulator speed).
    pub processed_output_tokens_per_s: f64,
    /// Σ reused prompt tokens at the latest admission / Σ input tokens.
    pub prefix_cache_reused_ratio: f64,
    /// Σ reused prompt tokens at the first admission / Σ input tokens.
    pub(crate) first_admission_prefix_cache_reused_ratio: f64,
    /// Time to first token (ms).
    pub ttft: Distribution,
    /// Time from first to second token (ms).
    pub(crate) ttst: Distribution,
    /// Per-request mean time per output token after the first (ms).
    pub(crate) tpot: Distribution,
    /// Every consecutive token gap (ms; sketch percentiles).
    pub(crate) itl: Distribution,
    /// Arrival to last token (ms).
    pub e2e_latency: Distribution,
    /// `1000 / gap_ms` over every positive token gap (tokens/s; sketch percentiles).
    ///
    /// This is Dynamo's offline-replay definition, kept so `mockserve replay` matches Dynamo key
    /// for key. It weighs every gap, not every request, so short gaps (tokens that come out
    /// nearly together) drive the mean and upper percentiles far above any request's rate. The
    /// live reports of `loadgen replay` and `loadgen bench` overwrite this field with the
    /// per-request rate `(output tokens - 1) / (last token - first token)`
    /// (`loadgen::replay_report::PER_USER_DEFINITION`), as benchmark clients define it; the two
    /// figures do not compare.
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
    pub(crate) total_kv_transfer_ms: f64,
    /// Prefill workers.
    pub(crate) num_prefill_workers: u64,
    /// Decode workers.
    pub(crate) num_decode_workers: u64,
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
    pub(crate) g2_prefix_cache_reused_ratio: f64,
    /// Blocks offloaded G1→G2 (transfers completed), all workers.
    pub(crate) g2_offloaded_blocks: u64,
    /// Blocks onboarded G2→G1 (transfers completed), all workers.
    pub(crate) g2_onboarded_blocks: u64,
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
    #[cfg(test)]
    pub(crate) fn max_itl_ms(&self) -> f64 {
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
        // Answers without output tokens (embeddings) have no token gaps to show.
        let gapless = self.completed_requests > 0 && self.total_output_tokens == 0;
        for (label, (_, d)) in labels.iter().zip(self.latencies()) {
            if gapless && matches!(*label, "TTST" | "TPOT" | "ITL") {
                continue;
            }
            row(f, label, d)?;
        }
        if gapless {
            writeln!(f, "  (no output tokens: no TTST, TPOT or ITL)")?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
