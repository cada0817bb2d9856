//! Results of a multi-turn run: Dynamo's statistics ([`StatsReport`], [`PerTurnStats`]), the JSON
//! document ([`Results`], Dynamo's keys plus loadgen's) and the console report.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use servesim::metrics::Distribution;

use crate::observe::scrape::Lateness;
use crate::run::client::{Failure, TokenSource};
use crate::run::failure::FailureSummary;

/// Dynamo's aggregate statistics (`LatencyStats`), plus the mean; all in µs.
///
/// Ranks as Dynamo's multi-turn bench reads them ([`Distribution::percentile_multiturn`]): sorted
/// `s`, `p50 = s[n/2]`, `p95 = s[n*95/100]`, `p99 = s[n*99/100]`. Not the replay's rule: these
/// figures are compared with that bench's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    /// Smallest.
    pub min_us: u64,
    /// Median (Dynamo's rank).
    pub p50_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
    /// Arithmetic mean (loadgen addition).
    #[serde(default)]
    pub mean_us: u64,
}

impl StatsReport {
    /// Statistics of a sample; None when empty.
    pub(crate) fn of(values: &[u64]) -> Option<StatsReport> {
        if values.is_empty() {
            return None;
        }
        let mut s = values.to_vec();
        s.sort_unstable();
        let at = |permille| Distribution::percentile_multiturn(&s, permille);
        Some(StatsReport {
            min_us: *s.first()?,
            p50_us: at(500)?,
            p95_us: at(950)?,
            p99_us: at(990)?,
            max_us: *s.last()?,
            mean_us: (s.iter().map(|&v| v as u128).sum::<u128>() / s.len() as u128) as u64,
        })
    }
}

/// Dynamo's per-turn statistics (no p99 in Dynamo; loadgen adds it and the mean).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PerTurnStats {
    /// 0-based turn.
    pub turn: usize,
    /// Successful requests of this turn.
    pub count: usize,
    /// Smallest.
    pub min_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// Largest.
    pub max_us: u64,
    /// 99th percentile (loadgen addition).
    #[serde(default)]
    pub p99_us: u64,
    /// Mean (loadgen addition).
    #[serde(default)]
    pub mean_us: u64,
}

/// One request as Dynamo's `raw_results` lists it, plus loadgen's fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RawResult {
    /// 0-based user (the global index in a `--shard` run).
    pub user_id: usize,
    /// 0-based turn.
    pub turn: usize,
    /// Scheduled send to the first answer token (Dynamo's key): `first_answer_us`, or 0 when
    /// the request failed or streamed no answer token (such requests are left out of the TTFT
    /// statistics).
    pub ttft_us: u64,
    /// Send to the end of the stream.
    pub total_latency_us: u64,
    /// Succeeded.
    pub success: bool,
    /// Scheduled send to the first answer token; None when failed or no answer token came.
    #[serde(default)]
    pub first_answer_us: Option<u64>,
    /// Scheduled send to the first token of any kind, reasoning included; None when failed.
    #[serde(default)]
    pub ttft_any_us: Option<u64>,
    /// Send to the response headers.
    #[serde(default)]
    pub headers_us: Option<u64>,
    /// Send to the first reasoning token.
    #[serde(default)]
    pub first_reasoning_us: Option<u64>,
    /// Token chunks received.
    #[serde(default)]
    pub chunks: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// `usage` or `chunks`.
    #[serde(default)]
    pub output_tokens_source: Option<TokenSource>,
    /// `usage.completion_tokens` as the server sent it.
    #[serde(default)]
    pub usage_output_tokens: Option<u64>,
    /// The server's usage contradicts the counted chunks (fewer tokens than chunks, or more
    /// than 32 per chunk); `output_tokens` is then the chunk count.
    #[serde(default)]
    pub usage_mismatch: bool,
    /// The user message's tokens, when known exactly.
    #[serde(default)]
    pub user_tokens: Option<usize>,
    /// `usage.prompt_tokens`.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`.
    #[serde(default)]
    pub cached_tokens: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    /// The `--lora-mix` entry its conversation was sent under (absent without `--lora-mix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
    /// The turn asked for a tool call (`--tool-wait-ms`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tool_call: bool,
    /// The turn sent a tool's result, after a tool wait.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_tool: bool,
    /// When the request was due, µs from the run start (its end is `start_us +
    /// total_latency_us`): the timing `loadgen trace convert` rebuilds sessions from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_us: Option<u64>,
    /// The prompt as the target's tokenizer and chat template render it, as block hashes (what
    /// `loadgen trace convert` names hash ids from); absent when the run had no tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_blocks: Option<crate::run::blocks::PromptBlocks>,
    /// `[I, N]` of a `--shard I/N` run (absent unsharded); `user_id` is the global user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<(u32, u32)>,
    /// What `loadgen merge` needs to rebuild the whole run's report from its shards (present
    /// only in a `--shard` run's records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<ShardSample>,
}

/// A `--shard` run's record's share of the run: the whole run's shape, the shard's wall-clock
/// start and this request's samples that the report pools (so the merged report is built from
/// raw samples, as an unsharded run's is).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardSample {
    /// Users of the whole (unsharded) run.
    pub num_users: usize,
    /// Turns per user.
    pub num_turns: usize,
    /// The speculative-prefill hint was sent.
    pub speculative_prefill: bool,
    /// Wall-clock start of the shard's run, µs since the Unix epoch (offset 0 of `end_us`).
    pub run_start_unix_us: u64,
    /// End of the request, µs from the shard's run start.
    pub end_us: u64,
    /// Gaps between consecutive token chunks (empty unless the request succeeded).
    pub chunk_gaps_us: Vec<u64>,
    /// Output tokens per second of a successful request with two tokens or more
    /// (`crate::run::client::Timing::output_tokens_per_s`).
    pub output_tokens_per_s: Option<f64>,
}

/// Statistics of a rate (per request), with the ranks of [`StatsReport`]
/// ([`Distribution::percentile_multiturn`]) so one report reads one rule.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateStats {
    /// Smallest.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

impl RateStats {
    /// Statistics of a sample; None when empty.
    pub(crate) fn of(values: &[f64]) -> Option<RateStats> {
        if values.is_empty() {
            return None;
        }
        let mut s = values.to_vec();
        s.sort_by(f64::total_cmp);
        let at = |permille| Distribution::percentile_multiturn(&s, permille);
        Some(RateStats {
            min: *s.first()?,
            p50: at(500)?,
            p95: at(950)?,
            p99: at(990)?,
            max: *s.last()?,
            mean: s.iter().sum::<f64>() / s.len() as f64,
        })
    }
}

/// Throughput over the run's wall time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// From the first send to the last end, in seconds.
    pub duration_s: f64,
    /// Output tokens of successful requests.
    pub output_tokens: u64,
    /// `usage` when every successful request reported usage, else `chunks` (or `mixed`).
    pub output_tokens_source: String,
    /// Output tokens per second.
    pub output_tokens_per_s: f64,
    /// Per-user output throughput, per request: output tokens after the first over the time
    /// from the first to the last token (tokens/s), over successful requests with two tokens
    /// or more.
    #[serde(default)]
    pub per_user_output_tokens_per_s: Option<RateStats>,
    /// Successful requests per second.
    pub requests_per_s: f64,
}

/// The `--output` document: Dynamo's keys first, loadgen's after.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    /// Users.
    pub num_users: usize,
    /// Turns per user.
    pub num_turns: usize,
    /// Requests sent.
    pub total_requests: usize,
    /// Succeeded.
    pub successful_requests: usize,
    /// Failed.
    pub failed_requests: usize,
    /// The hint was sent.
    pub speculative_prefill: bool,
    /// TTFT (first answer token) of successful requests.
    pub aggregate_ttft: Option<StatsReport>,
    /// End-to-end latency of successful requests.
    pub aggregate_latency: Option<StatsReport>,
    /// TTFT per turn.
    pub per_turn_ttft: Vec<PerTurnStats>,
    /// Latency per turn.
    pub per_turn_latency: Vec<PerTurnStats>,
    /// Every request, by user then turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_results: Vec<RawResult>,
    /// Time to the first token of any kind (reasoning included).
    #[serde(default)]
    pub aggregate_ttft_any: Option<StatsReport>,
    /// Same, per turn.
    #[serde(default)]
    pub per_turn_ttft_any: Vec<PerTurnStats>,
    /// Gaps between consecutive token chunks, pooled over successful requests.
    #[serde(default)]
    pub aggregate_inter_chunk: Option<StatsReport>,
    /// Throughput.
    #[serde(default)]
    pub throughput: Option<Throughput>,
    /// Failed requests by reason (the same shape in every mode's report).
    #[serde(default)]
    pub failures: FailureSummary,
    /// Requests whose usage contradicted the counted chunks.
    #[serde(default)]
    pub usage_mismatches: usize,
    /// Every setting and the target.
    #[serde(default)]
    pub config: Value,
    /// Turns after a tool call against turns after a user's think time (runs with tool turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_turns: Option<ToolTurnStats>,
    /// The target's `/metrics` over the run (time series and summary), when sampled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_metrics: Option<Value>,
    /// `--lora-mix`'s figures by adapter (`crate::report::lora`), when it was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Value>,
    /// The server's token lateness over the run, when sampled and reported (for
    /// `--max-server-lateness`; in the file, inside `server_metrics`).
    #[serde(skip)]
    pub server_lateness: Option<Lateness>,
}

/// What tool waits do: the later turns (2 and on) that sent a tool's result after its wait,
/// against those that sent a user message after a think time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolTurnStats {
    /// Turns that asked for a tool call.
    pub tool_calls: usize,
    /// Turns that sent a tool's result.
    pub after_tool: TurnGroup,
    /// Later turns that sent a user message.
    pub after_user: TurnGroup,
}

/// Successful requests of one kind of turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnGroup {
    /// Successful requests.
    pub requests: usize,
    /// Their TTFT (first answer token).
    pub ttft: Option<StatsReport>,
    /// Prompt tokens (`usage.prompt_tokens`).
    pub prompt_tokens: u64,
    /// Of those, served from the prefix cache (`cached_tokens`).
    pub cached_tokens: u64,
}

impl TurnGroup {
    fn of<'a>(records: impl Iterator<Item = &'a RawResult>) -> TurnGroup {
        let ok: Vec<&RawResult> = records.filter(|r| r.success).collect();
        let ttft: Vec<u64> = ok.iter().filter_map(|r| r.first_answer_us).collect();
        TurnGroup {
            requests: ok.len(),
            ttft: StatsReport::of(&ttft),
            prompt_tokens: ok.iter().filter_map(|r| r.prompt_tokens).sum(),
            cached_tokens: ok.iter().filter_map(|r| r.cached_tokens).sum(),
        }
    }

    /// The console line.
    fn line(&self, name: &str) -> String {
        let ttft = match &self.ttft {
            Some(s) => format!("TTFT p50 {:.1}ms p99 {:.1}ms", ms(s.p50_us), ms(s.p99_us)),
            None => "no TTFT".to_string(),
        };
        let cached = if self.prompt_tokens > 0 {
            format!(
                "{:.1}% of prompt tokens cached",
                100.0 * self.cached_tokens as f64 / self.prompt_tokens as f64
            )
        } else {
            "no prompt tokens reported".to_string()
        };
        format!(
            "  {name:<11} {:>6} requests, {ttft}, {cached}",
            self.requests
        )
    }
}

impl ToolTurnStats {
    /// None when the run had no tool turns.
    fn of(records: &[RawResult]) -> Option<ToolTurnStats> {
        if !records.iter().any(|r| r.tool_call || r.after_tool) {
            return None;
        }
        Some(ToolTurnStats {
            tool_calls: records.iter().filter(|r| r.tool_call).count(),
            after_tool: TurnGroup::of(records.iter().filter(|r| r.after_tool)),
            after_user: TurnGroup::of(records.iter().filter(|r| r.turn > 0 && !r.after_tool)),
        })
    }
}

fn per_turn(
    records: &[RawResult],
    num_turns: usize,
    f: impl Fn(&RawResult) -> Option<u64>,
) -> Vec<PerTurnStats> {
    // One pass over the records, grouped by turn (not one pass per turn).
    let mut by_turn: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
    for r in records.iter().filter(|r| r.success && r.turn < num_turns) {
        if let Some(v) = f(r) {
            by_turn.entry(r.turn).or_default().push(v);
        }
    }
    by_turn
        .into_iter()
        .filter_map(|(turn, v)| {
            StatsReport::of(&v).map(|s| PerTurnStats {
                turn,
                count: v.len(),
                min_us: s.min_us,
                p50_us: s.p50_us,
                p95_us: s.p95_us,
                max_us: s.max_us,
                p99_us: s.p99_us,
                mean_us: s.mean_us,
            })
        })
        .collect()
}

/// What the driver hands the report: records plus the pooled chunk gaps.
#[derive(Clone, Debug, Default)]
pub struct RunData {
    /// Requests in (user, turn) order.
    pub records: Vec<RawResult>,
    /// Inter-chunk gaps of successful requests, µs.
    pub chunk_gaps_us: Vec<u64>,
    /// Per-request output throughput of successful requests (`crate::run::client::Timing::output_tokens_per_s`).
    pub output_tokens_per_s_per_user: Vec<f64>,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
}

impl Results {
    /// Computes the statistics of a run.
    pub fn build(
        data: RunData,
        num_users: usize,
        num_turns: usize,
        speculative_prefill: bool,
        config: Value,
    ) -> Results {
        let records = data.records;
        let ok: Vec<&RawResult> = records.iter().filter(|r| r.success).collect();
        let ttft: Vec<u64> = ok.iter().filter_map(|r| r.first_answer_us).collect();
        let latency: Vec<u64> = ok.iter().map(|r| r.total_latency_us).collect();
        let ttft_any: Vec<u64> = ok.iter().filter_map(|r| r.ttft_any_us).collect();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let usage = ok
            .iter()
            .filter(|r| r.output_tokens_source == Some(TokenSource::Usage))
            .count();
        let source = if usage == ok.len() {
            "usage"
        } else if usage == 0 {
            "chunks"
        } else {
            "mixed"
        };
        let failures = FailureSummary::of(records.iter().filter_map(|r| r.error.as_ref()));
        let usage_mismatches = records.iter().filter(|r| r.usage_mismatch).count();
        let d = data.duration_s.max(1e-9);
        Results {
            num_users,
            num_turns,
            total_requests: records.len(),
            successful_requests: ok.len(),
            failed_requests: records.len() - ok.len(),
            speculative_prefill,
            aggregate_ttft: StatsReport::of(&ttft),
            aggregate_latency: StatsReport::of(&latency),
            per_turn_ttft: per_turn(&records, num_turns, |r| r.first_answer_us),
            per_turn_latency: per_turn(&records, num_turns, |r| Some(r.total_latency_us)),
            aggregate_ttft_any: StatsReport::of(&ttft_any),
            per_turn_ttft_any: per_turn(&records, num_turns, |r| r.ttft_any_us),
            aggregate_inter_chunk: StatsReport::of(&data.chunk_gaps_us),
            throughput: Some(Throughput {
                duration_s: data.duration_s,
                output_tokens,
                output_tokens_source: source.to_string(),
                output_tokens_per_s: output_tokens as f64 / d,
                per_user_output_tokens_per_s: RateStats::of(&data.output_tokens_per_s_per_user),
                requests_per_s: ok.len() as f64 / d,
            }),
            failures,
            usage_mismatches,
            tool_turns: ToolTurnStats::of(&records),
            raw_results: records,
            config,
            server_metrics: None,
            lora: None,
            server_lateness: None,
        }
    }

    /// True when TTFT-any differs from TTFT somewhere (reasoning came first).
    fn ttft_any_differs(&self) -> bool {
        self.raw_results
            .iter()
            .any(|r| r.success && r.ttft_any_us != r.first_answer_us)
    }

    /// The console report (Dynamo's layout, then loadgen's additions).
    pub fn console(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "\n========================================");
        let _ = writeln!(o, "Multiturn Benchmark Results");
        let _ = writeln!(o, "========================================\n");
        let _ = writeln!(
            o,
            "Users: {}, Turns: {}, Completed: {}/{}\n",
            self.num_users, self.num_turns, self.successful_requests, self.total_requests
        );
        if self.failed_requests > 0 {
            let _ = writeln!(o, "{}", self.failures.lines(self.total_requests));
        }
        if self.usage_mismatches > 0 {
            let _ = writeln!(
                o,
                "{}\n",
                crate::run::client::usage_warning(self.usage_mismatches)
            );
        }
        aggregate(&mut o, "Aggregate TTFT:", self.aggregate_ttft.as_ref());
        aggregate(
            &mut o,
            "Aggregate Request Latency:",
            self.aggregate_latency.as_ref(),
        );
        table(&mut o, "Per-Turn TTFT:", &self.per_turn_ttft);
        table(&mut o, "Per-Turn Request Latency:", &self.per_turn_latency);
        if self.ttft_any_differs() {
            aggregate(
                &mut o,
                "Aggregate Time to First Token of any kind (reasoning included):",
                self.aggregate_ttft_any.as_ref(),
            );
            table(
                &mut o,
                "Per-Turn Time to First Token of any kind:",
                &self.per_turn_ttft_any,
            );
        }
        aggregate(
            &mut o,
            "Inter-Chunk Latency:",
            self.aggregate_inter_chunk.as_ref(),
        );
        if let Some(t) = &self.throughput {
            let _ = writeln!(o, "Throughput:");
            let _ = writeln!(
                o,
                "  output tokens/s: {:>10.1}   ({} tokens, counted from {})",
                t.output_tokens_per_s, t.output_tokens, t.output_tokens_source
            );
            let _ = writeln!(o, "  requests/s:      {:>10.2}", t.requests_per_s);
            if let Some(u) = &t.per_user_output_tokens_per_s {
                let _ = writeln!(
                    o,
                    "  per user:        {:>10.1}   tokens/s p50 (p95 {:.1}, mean {:.1}; per request: output tokens after the first / first-to-last token time)",
                    u.p50, u.p95, u.mean
                );
            }
        }
        if let Some(t) = &self.tool_turns {
            let _ = writeln!(
                o,
                "\nTool turns ({} asked for a tool call; later turns by what they sent):",
                t.tool_calls
            );
            let _ = writeln!(o, "{}", t.after_tool.line("tool result"));
            let _ = writeln!(o, "{}", t.after_user.line("user"));
        }
        o
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn aggregate(o: &mut String, title: &str, s: Option<&StatsReport>) {
    let _ = writeln!(o, "{title}");
    match s {
        Some(s) => {
            for (name, v) in [
                ("min", s.min_us),
                ("p50", s.p50_us),
                ("p95", s.p95_us),
                ("p99", s.p99_us),
                ("max", s.max_us),
                ("mean", s.mean_us),
            ] {
                let _ = writeln!(o, "  {:<5} {:>12.1}ms", format!("{name}:"), ms(v));
            }
        }
        None => {
            let _ = writeln!(o, "  (no successful requests)");
        }
    }
    let _ = writeln!(o);
}

fn table(o: &mut String, title: &str, rows: &[PerTurnStats]) {
    let _ = writeln!(o, "{title}");
    let _ = writeln!(
        o,
        "  {:>6} {:>8} {:>12} {:>12} {:>12} {:>12}",
        "Turn", "Count", "Min(ms)", "P50(ms)", "P95(ms)", "Max(ms)"
    );
    let _ = writeln!(o, "  {}", "-".repeat(66));
    for r in rows {
        let _ = writeln!(
            o,
            "  {:>6} {:>8} {:>12.1} {:>12.1} {:>12.1} {:>12.1}",
            r.turn + 1,
            r.count,
            ms(r.min_us),
            ms(r.p50_us),
            ms(r.p95_us),
            ms(r.max_us)
        );
    }
    let _ = writeln!(o);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamo_ranks() {
        let s = StatsReport::of(&[5, 1, 4, 2, 3]).unwrap();
        assert_eq!(
            (s.min_us, s.p50_us, s.p95_us, s.p99_us, s.max_us, s.mean_us),
            (1, 3, 5, 5, 5, 3)
        );
        let v: Vec<u64> = (1..=100).collect();
        let s = StatsReport::of(&v).unwrap();
        assert_eq!((s.p50_us, s.p95_us, s.p99_us), (51, 96, 100));
        assert!(StatsReport::of(&[]).is_none());
    }
}
