//! The report of a live `replay` or `bench` run, with the same keys as `mockserve replay`: driver
//! [`Sample`]s are fed to servesim's [`Collector`] on the wall clock (µs since the run start) and
//! become a [`ReplayReport`] plus one [`LiveRecord`] per request; schedule lag, expected prefix
//! reuse and goodput go in extra keys after `mockserve replay`'s.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use servesim::ids::{RequestId, WorkerId};
use servesim::metrics::{Collector, Distribution, ReplayReport, RequestRecord};
use servesim::time::SimTime;

use crate::error::LoadgenError;
use crate::observe::scrape::OwnRouting;
use crate::run::client::{Response, Timing, TokenSource};
use crate::run::driver::Sample;
use crate::run::failure::Failure;
use crate::run::failure::FailureSummary;

/// What loadgen intended for one request (the driver only sees bodies).
#[derive(Clone, Debug, Default)]
pub struct RequestInfo {
    /// Intended prompt tokens.
    pub input_length: usize,
    /// Requested output tokens.
    pub max_output: usize,
    /// Trace session, if any.
    pub session: Option<String>,
    /// Position in the session.
    pub turn: usize,
    /// Prompt tokens the trace's hash ids say were seen before (replay only).
    pub expected_reused_tokens: Option<usize>,
    /// The `--lora-mix` entry it was sent under, if any.
    pub adapter: Option<std::sync::Arc<str>>,
}

/// One per-request JSONL line: `mockserve replay`'s record, then loadgen's fields.
#[derive(Clone, Debug, Serialize)]
pub struct LiveRecord {
    /// The same keys as `mockserve replay --per-request-jsonl` (`worker` is unknown: null;
    /// `reused_input_tokens` is the server's `cached_tokens`; `first_admit_ms` is the response
    /// headers).
    #[serde(flatten)]
    pub record: RequestRecord,
    /// When the request was due (ms from the run start; latencies count from here).
    pub scheduled_ms: f64,
    /// When it was sent.
    pub sent_ms: f64,
    /// `sent_ms - scheduled_ms`.
    pub schedule_lag_ms: f64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens expected from the prefix cache (trace hash ids; replay only).
    pub expected_reused_tokens: Option<usize>,
    /// Chunks that carried a token.
    pub chunks: u64,
    /// `usage.completion_tokens` as the server sent it (`output_length` is this unless
    /// `usage_mismatch`).
    pub usage_output_tokens: Option<u64>,
    /// The server's usage contradicts the counted chunks (fewer tokens than chunks, or more than
    /// 32 per chunk): `output_length` is the chunk count.
    pub usage_mismatch: bool,
    /// Why it failed, with the server's message (`HTTP 429: rate limited`, `empty stream`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The failure's class: `http`, `transport`, `timeout`, `stream`, `server_error`,
    /// `empty_stream`, `line_too_long`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
    /// The HTTP status of an HTTP failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_status: Option<u16>,
    /// The stream's last `finish_reason` (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// The server's own TTFT from its engine's submission, when it said (`nvext.timing`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_ttft_ms: Option<f64>,
    /// The server's own submission-to-last-token time, when it said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_e2e_ms: Option<f64>,
    /// Everything the driver measured, unrounded: `loadgen merge` rebuilds the report from it.
    pub raw: RawSample,
    /// For an agentic trace, the node the request was (`request_id`, `play_id`,
    /// `conversation_id`, `parent_id`, `lane_id`), as `mockserve replay` labels its records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agentic: Option<Value>,
}

/// One request exactly as the driver measured it (µs, relative to its process's run start)
/// and what loadgen intended for it: the per-request JSONL's `raw` object. A report rebuilt
/// from these (`RawSample::to_sample` then [`build`]) is the report of the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RawSample {
    /// Wall-clock time (µs since the Unix epoch) of the run start of the process that sent it:
    /// aligns the clocks of several processes.
    pub run_start_unix_us: u64,
    /// Session (script) index: within its process, or the global index with `shard`.
    pub session: usize,
    /// Position within the session.
    pub turn: usize,
    /// Send order within its process.
    pub seq: u64,
    /// Due time.
    pub scheduled_us: u64,
    /// Send time.
    pub sent_us: u64,
    /// Time waited for the in-flight cap.
    pub cap_wait_us: u64,
    /// Time a tied request waited for the one before it (absent in older records: 0).
    #[serde(default)]
    pub tie_wait_us: u64,
    /// Response headers, from the send.
    pub headers_us: Option<u64>,
    /// First SSE event, from the send.
    pub first_chunk_us: Option<u64>,
    /// First reasoning token, from the send.
    pub first_reasoning_us: Option<u64>,
    /// First answer token, from the send.
    pub first_answer_us: Option<u64>,
    /// Every chunk that carried a token, from the send.
    pub token_chunks_us: Vec<u64>,
    /// End of the stream, from the send.
    pub end_us: u64,
    /// Output tokens counted.
    pub output_tokens: u64,
    /// Where they came from.
    pub output_tokens_source: Option<TokenSource>,
    /// Token chunks.
    pub chunks: u64,
    /// `usage.completion_tokens`.
    pub usage_output_tokens: Option<u64>,
    /// Usage contradicted the chunks.
    pub usage_mismatch: bool,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `cached_tokens`.
    pub cached_tokens: Option<u64>,
    /// The serving worker, when the server said.
    pub worker: Option<u32>,
    /// The stream's last `finish_reason`.
    pub finish_reason: Option<String>,
    /// Why it failed.
    pub failure: Option<Failure>,
    /// Intended prompt tokens.
    pub input_length: usize,
    /// Requested output tokens.
    pub max_output: usize,
    /// Trace session id.
    pub session_id: Option<String>,
    /// Expected prefix-cache tokens (replay).
    pub expected_reused_tokens: Option<usize>,
    /// `[I, N]` of a `--shard I/N` run (absent unsharded); `session` is then the global index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<(u32, u32)>,
    /// The `--lora-mix` entry it was sent under (absent without `--lora-mix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter: Option<String>,
}

impl RawSample {
    /// The raw record of a sample and its intent (the run start is filled in later).
    pub fn of(s: &Sample, info: &RequestInfo) -> RawSample {
        let r = &s.response;
        RawSample {
            run_start_unix_us: 0,
            session: s.session,
            turn: s.turn,
            seq: s.seq,
            scheduled_us: s.scheduled_us,
            sent_us: s.sent_us,
            cap_wait_us: s.cap_wait_us,
            tie_wait_us: s.tie_wait_us,
            headers_us: r.timing.headers_us,
            first_chunk_us: r.timing.first_chunk_us,
            first_reasoning_us: r.timing.first_reasoning_us,
            first_answer_us: r.timing.first_answer_us,
            token_chunks_us: r.timing.token_chunks_us.clone(),
            end_us: r.timing.end_us,
            output_tokens: r.output_tokens,
            output_tokens_source: Some(r.output_tokens_source),
            chunks: r.chunks,
            usage_output_tokens: r.usage_output_tokens,
            usage_mismatch: r.usage_mismatch,
            prompt_tokens: r.prompt_tokens,
            cached_tokens: r.cached_tokens,
            worker: r.worker,
            finish_reason: r.finish_reason.clone(),
            failure: r.failure.clone(),
            input_length: info.input_length,
            max_output: info.max_output,
            session_id: info.session.clone(),
            expected_reused_tokens: info.expected_reused_tokens,
            shard: None,
            adapter: info.adapter.as_deref().map(str::to_string),
        }
    }

    /// The sample and intent back, with `shift_us` added to the scheduled and send times (clock
    /// alignment) and `session_base` to the session index (sessions of different processes
    /// stay apart).
    pub(crate) fn to_sample(&self, shift_us: u64, session_base: usize) -> (Sample, RequestInfo) {
        let sample = Sample {
            session: session_base + self.session,
            turn: self.turn,
            seq: self.seq,
            scheduled_us: self.scheduled_us + shift_us,
            sent_us: self.sent_us + shift_us,
            cap_wait_us: self.cap_wait_us,
            tie_wait_us: self.tie_wait_us,
            response: Response {
                timing: Timing {
                    headers_us: self.headers_us,
                    first_chunk_us: self.first_chunk_us,
                    first_reasoning_us: self.first_reasoning_us,
                    first_answer_us: self.first_answer_us,
                    token_chunks_us: self.token_chunks_us.clone(),
                    end_us: self.end_us,
                    // Not kept in the raw record.
                    engine_ttft_ms: None,
                    engine_e2e_ms: None,
                },
                content: String::new(),
                output_tokens: self.output_tokens,
                output_tokens_source: self.output_tokens_source.unwrap_or(TokenSource::Chunks),
                chunks: self.chunks,
                usage_output_tokens: self.usage_output_tokens,
                usage_mismatch: self.usage_mismatch,
                prompt_tokens: self.prompt_tokens,
                cached_tokens: self.cached_tokens,
                finish_reason: self.finish_reason.clone(),
                worker: self.worker,
                tool_calls: Vec::new(),
                response_id: None,
                failure: self.failure.clone(),
            },
        };
        let info = RequestInfo {
            input_length: self.input_length,
            max_output: self.max_output,
            session: self.session_id.clone(),
            turn: self.turn,
            expected_reused_tokens: self.expected_reused_tokens,
            adapter: self.adapter.as_deref().map(std::sync::Arc::from),
        };
        (sample, info)
    }
}

/// Schedule lag figures (ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LagFigures {
    /// Median actual − scheduled send.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Largest lag not explained by waiting for the in-flight cap (the pacer's own).
    pub max_pacer_ms: f64,
}

/// How the per-user output throughput of a live report is computed (said in the report).
pub const PER_USER_DEFINITION: &str =
    "per request: (output tokens - 1) / (last token - first token)";

/// Pacer lag above which the run is flagged: the client could not keep up.
pub(crate) const LAG_WARN_MS: f64 = 10.0;

/// A live run's report.
#[derive(Clone, Debug)]
pub struct LiveReport {
    /// `mockserve replay`'s figures.
    pub report: ReplayReport,
    /// One per request, in id (scheduled) order.
    pub records: Vec<LiveRecord>,
    /// Schedule lag.
    pub lag: LagFigures,
    /// Failed requests by reason (they are left out of every latency figure).
    pub failures: FailureSummary,
    /// Requests whose usage contradicted their chunks.
    pub usage_mismatches: usize,
    /// Completed requests by `finish_reason` (`none` when the stream carried none).
    pub finish_reasons: BTreeMap<String, usize>,
}

/// Builds the report from `(sample, info)` pairs; `wall` is the run's wall time. Times are
/// rebased on the earliest scheduled time among `items` (warmup excluded from the duration).
pub fn build(items: &[(&Sample, &RequestInfo)], wall: std::time::Duration) -> LiveReport {
    let raws: Vec<RawSample> = items.iter().map(|(s, i)| RawSample::of(s, i)).collect();
    let base = items.iter().map(|(s, _)| s.scheduled_us).min().unwrap_or(0);
    let rebased: Vec<Sample> = items
        .iter()
        .map(|(s, _)| {
            let mut s = (*s).clone();
            s.scheduled_us -= base;
            s.sent_us -= base.min(s.sent_us);
            s
        })
        .collect();
    let items: Vec<(&Sample, &RequestInfo)> = rebased
        .iter()
        .zip(items)
        .map(|(s, (_, info))| (s, *info))
        .collect();
    let items = &items[..];
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].0.scheduled_us, items[i].0.session, items[i].0.turn));
    let mut collector = Collector::new();
    let mut lags = Vec::with_capacity(items.len());
    let mut pacer_max: f64 = 0.0;
    for (id, &i) in order.iter().enumerate() {
        let (s, info) = items[i];
        let id = RequestId(id as u64);
        let r = &s.response;
        let input_length = r
            .prompt_tokens
            .map(|n| n as usize)
            .unwrap_or(info.input_length);
        collector.on_arrival(
            id,
            SimTime::from_micros(s.scheduled_us),
            input_length,
            info.max_output,
            info.session.as_deref(),
            info.turn,
        );
        lags.push(s.lag_us() as f64 / 1000.0);
        pacer_max = pacer_max.max(s.pacer_lag_us() as f64 / 1000.0);
        if r.failure.is_some() {
            collector.on_reject(id, SimTime::from_micros(s.end_us()));
            continue;
        }
        let admitted = s.at(r.timing.headers_us.unwrap_or(0));
        collector.on_admit(
            id,
            SimTime::from_micros(admitted),
            r.cached_tokens.unwrap_or(0) as usize,
            WorkerId(0),
        );
        // Tokens at their chunks' times: the collector's TTFT is the first token of any kind from
        // the scheduled send, `Sample::ttft_us(FirstToken::Any)` (checked in the tests below).
        let chunks = &r.timing.token_chunks_us;
        if r.chunks == 0 {
            // A success without token chunks is an answer read whole (embeddings): TTFT and E2E
            // at its end, no output token, no ITL.
            if let Some(&t) = chunks.last() {
                collector.on_answer(id, SimTime::from_micros(s.at(t)));
            }
            collector.on_finish(id, SimTime::from_micros(s.end_us()));
            continue;
        }
        for &t in chunks {
            collector.on_token(id, SimTime::from_micros(s.at(t)));
        }
        // A chunk carrying several tokens: the rest count at the last chunk's time.
        if let Some(&last) = chunks.last() {
            for _ in chunks.len() as u64..r.output_tokens {
                collector.on_token(id, SimTime::from_micros(s.at(last)));
            }
        }
        collector.on_finish(id, SimTime::from_micros(s.end_us()));
    }
    let (mut report, records) = collector.finish(wall);
    // Per-user output throughput per request (as other tools define it), not per token gap.
    let mut per_user: Vec<f64> = items
        .iter()
        .filter(|(s, _)| s.response.failure.is_none())
        .filter_map(|(s, _)| {
            s.response
                .timing
                .output_tokens_per_s(s.response.output_tokens)
        })
        .collect();
    report.output_token_throughput_per_user = Distribution::from_samples(&mut per_user);
    let records = records
        .into_iter()
        .zip(&order)
        .map(|(mut record, &i)| {
            let (s, info) = items[i];
            record.worker = s.response.worker;
            LiveRecord {
                record,
                scheduled_ms: s.scheduled_us as f64 / 1000.0,
                sent_ms: s.sent_us as f64 / 1000.0,
                schedule_lag_ms: s.lag_us() as f64 / 1000.0,
                prompt_tokens: s.response.prompt_tokens,
                expected_reused_tokens: info.expected_reused_tokens,
                chunks: s.response.chunks,
                usage_output_tokens: s.response.usage_output_tokens,
                usage_mismatch: s.response.usage_mismatch,
                error: s.response.failure.as_ref().map(|f| f.reason()),
                error_kind: s.response.failure.as_ref().map(|f| f.kind()),
                error_status: s.response.failure.as_ref().and_then(|f| f.status()),
                finish_reason: s.response.finish_reason.clone(),
                engine_ttft_ms: s.response.timing.engine_ttft_ms,
                engine_e2e_ms: s.response.timing.engine_e2e_ms,
                raw: raws[i].clone(),
                agentic: None,
            }
        })
        .collect();
    let failures = FailureSummary::of(
        items
            .iter()
            .filter_map(|(s, _)| s.response.failure.as_ref()),
    );
    let usage_mismatches = items
        .iter()
        .filter(|(s, _)| s.response.usage_mismatch)
        .count();
    let mut finish_reasons = BTreeMap::new();
    for (s, _) in items.iter().filter(|(s, _)| s.response.failure.is_none()) {
        let reason = s.response.finish_reason.as_deref().unwrap_or("none");
        *finish_reasons.entry(reason.to_string()).or_insert(0) += 1;
    }
    let d = Distribution::from_samples(&mut lags);
    LiveReport {
        report,
        records,
        lag: LagFigures {
            p50_ms: d.median,
            p99_ms: d.p99,
            max_ms: d.max,
            max_pacer_ms: pacer_max,
        },
        failures,
        usage_mismatches,
        finish_reasons,
    }
}

impl LiveReport {
    /// The run's own requests as routing decisions: those that reached a worker (successes, and
    /// failures whose response named one), their prompt and cached tokens, the workers named.
    pub(crate) fn own_routing(&self) -> OwnRouting {
        let mut own = OwnRouting::default();
        let mut workers = std::collections::BTreeSet::new();
        for rec in &self.records {
            let raw = &rec.raw;
            if raw.failure.is_some() && raw.worker.is_none() {
                continue;
            }
            own.requests += 1;
            if let Some(w) = raw.worker {
                workers.insert(w);
            }
            if let (None, Some(prompt)) = (&raw.failure, raw.prompt_tokens) {
                own.prompt_tokens += prompt;
                own.cached_tokens += raw.cached_tokens.unwrap_or(0).min(prompt);
            }
        }
        own.workers = workers.len();
        own
    }

    /// Stamps every record with the wall-clock time of its run start.
    pub(crate) fn set_started_at(&mut self, started_at: std::time::SystemTime) {
        let us = started_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        for r in &mut self.records {
            r.raw.run_start_unix_us = us;
        }
    }

    /// Stamps every record with the shard of its process (records already carry global
    /// session indices: `crate::run::shard::Shard::global`).
    pub(crate) fn set_shard(&mut self, shard: Option<crate::run::shard::Shard>) {
        for r in &mut self.records {
            r.raw.shard = shard.map(|s| s.pair());
        }
    }

    /// `--lora-mix`'s figures by adapter (None without it).
    pub(crate) fn by_adapter(
        &self,
    ) -> Option<BTreeMap<String, crate::report::lora::AdapterFigures>> {
        crate::report::lora::figures(self.records.iter().filter_map(|r| {
            Some(crate::report::lora::AdapterSample {
                adapter: r.raw.adapter.as_deref()?,
                failed: r.error.is_some(),
                input_tokens: r.prompt_tokens.unwrap_or(r.record.input_length as u64),
                output_tokens: r.record.output_length,
                ttft_ms: r.record.ttft_ms,
                itl_ms: r.record.itl_ms,
                e2e_ms: r.record.e2e_latency_ms,
            })
        }))
    }

    /// Requests in the report.
    pub fn total_requests(&self) -> usize {
        self.records.len()
    }

    /// The pass/fail verdict of the run: an error when every request failed or more than
    /// `max_failure_rate` of them did.
    pub fn verdict(&self, max_failure_rate: f64) -> Result<(), LoadgenError> {
        crate::run::failure::verdict(self.total_requests(), self.failures.total, max_failure_rate)
    }

    /// The report as JSON: `mockserve replay`'s keys, then `failures`, `usage_mismatches`,
    /// `schedule_lag_*`, then `extra`'s.
    pub fn to_json(&self, extra: &[(&str, Value)]) -> Value {
        let mut v = serde_json::to_value(&self.report).unwrap_or_else(|_| json!({}));
        if let Some(map) = v.as_object_mut() {
            map.insert(
                "output_token_throughput_per_user_definition".into(),
                json!(PER_USER_DEFINITION),
            );
            map.insert("failures".into(), json!(self.failures));
            map.insert("usage_mismatches".into(), json!(self.usage_mismatches));
            map.insert("finish_reasons".into(), json!(self.finish_reasons));
            map.insert("schedule_lag_p50_ms".into(), json!(self.lag.p50_ms));
            map.insert("schedule_lag_p99_ms".into(), json!(self.lag.p99_ms));
            map.insert("schedule_lag_max_ms".into(), json!(self.lag.max_ms));
            map.insert(
                "schedule_lag_max_pacer_ms".into(),
                json!(self.lag.max_pacer_ms),
            );
            if let Some(by) = self.by_adapter() {
                map.insert("lora".into(), crate::report::lora::to_json(&by));
            }
            for (k, val) in extra {
                map.insert((*k).to_string(), val.clone());
            }
        }
        v
    }

    /// The failure lines of the console report (always: `Failed requests: 0 of N` says the run
    /// was checked), and the usage warning when a server's usage contradicted its chunks.
    pub fn failure_lines(&self) -> String {
        let mut s = self.failures.lines(self.total_requests());
        if !self.finish_reasons.is_empty() {
            let list: Vec<String> = self
                .finish_reasons
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            s.push_str(&format!("Finish reasons: {}\n", list.join(", ")));
        }
        if self.usage_mismatches > 0 {
            s.push_str(&crate::run::client::usage_warning(self.usage_mismatches));
            s.push('\n');
        }
        s
    }

    /// `mockserve replay`'s console report, with the per-user throughput's definition.
    pub(crate) fn report_lines(&self) -> String {
        let mut s = format!("{}  (tok/s/user: {PER_USER_DEFINITION})\n", self.report);
        if let Some(by) = self.by_adapter() {
            s.push_str(&crate::report::lora::lines(&by));
        }
        s
    }

    /// The schedule-lag lines of the console report, with a warning when the pacer fell behind.
    pub(crate) fn lag_lines(&self) -> String {
        let l = &self.lag;
        let mut s = format!(
            "Schedule lag (actual - scheduled send): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (pacer alone: max {:.2} ms)\n",
            l.p50_ms, l.p99_ms, l.max_ms, l.max_pacer_ms
        );
        if l.max_pacer_ms > LAG_WARN_MS {
            s.push_str(&format!(
                "WARNING: the client could not keep up with the schedule (pacer lag up to {:.1} ms > {LAG_WARN_MS} ms); latencies still count from the scheduled times\n",
                l.max_pacer_ms
            ));
        }
        s
    }
}

/// Writes the report JSON and the per-request JSONL when asked to.
pub(crate) fn write_files(
    json: &Value,
    records: &[LiveRecord],
    report_json: Option<&Path>,
    per_request_jsonl: Option<&Path>,
) -> Result<(), LoadgenError> {
    if let Some(path) = report_json {
        crate::write::json(path, json)?;
        crate::stdout::outln!("Saved report to {}", path.display());
    }
    if let Some(path) = per_request_jsonl {
        crate::write::jsonl(path, records)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::client::{Failure, FirstToken, Response, Timing, TokenSource};

    fn sample(session: usize, lag_us: u64, chunks_us: &[u64], tokens: u64) -> Sample {
        Sample {
            session,
            turn: 0,
            seq: session as u64,
            scheduled_us: 1_000,
            sent_us: 1_000 + lag_us,
            cap_wait_us: 0,
            tie_wait_us: 0,
            response: Response {
                timing: Timing {
                    headers_us: Some(100),
                    first_chunk_us: chunks_us.first().copied(),
                    first_reasoning_us: None,
                    first_answer_us: chunks_us.first().copied(),
                    token_chunks_us: chunks_us.to_vec(),
                    end_us: chunks_us.last().copied().unwrap_or(200) + 10,
                    ..Timing::default()
                },
                content: String::new(),
                output_tokens: tokens,
                output_tokens_source: TokenSource::Usage,
                chunks: chunks_us.len() as u64,
                usage_output_tokens: Some(tokens),
                usage_mismatch: false,
                prompt_tokens: Some(8),
                cached_tokens: Some(0),
                finish_reason: Some("length".into()),
                worker: None,
                tool_calls: Vec::new(),
                response_id: None,
                failure: None,
            },
        }
    }

    #[test]
    fn one_ttft_and_per_request_throughput() {
        // Two chunks 1 ms apart carrying 5 tokens: 4 tokens after the first in 1 ms.
        let a = sample(0, 500, &[2_000, 3_000], 5);
        let mut failed = sample(1, 0, &[], 0);
        failed.response.failure = Some(Failure::Http {
            status: 429,
            message: "slow down".into(),
        });
        let mut lying = sample(2, 0, &[1_000, 2_000, 4_000], 3);
        lying.response.usage_mismatch = true;
        let info = RequestInfo::default();
        let live = build(
            &[(&a, &info), (&failed, &info), (&lying, &info)],
            std::time::Duration::from_secs(1),
        );
        let rec = &live.records[0];
        let ttft_us = a.ttft_us(FirstToken::Any).expect("tokens came");
        assert_eq!(ttft_us, 2_500);
        assert_eq!(rec.record.ttft_ms, Some(ttft_us as f64 / 1000.0));
        // Per request: 4000 tok/s for the first, (3 - 1) tokens / 3 ms for the third.
        let d = &live.report.output_token_throughput_per_user;
        assert_eq!((d.min, d.max), (2.0 / 0.003, 4000.0));
        assert_eq!(live.failures.total, 1);
        assert_eq!(live.failures.count("HTTP 429: slow down"), 1);
        assert_eq!(live.usage_mismatches, 1);
        assert_eq!(
            live.records[1].error.as_deref(),
            Some("HTTP 429: slow down")
        );
        assert!(live.records[1].record.ttft_ms.is_none());
        let json = live.to_json(&[]);
        assert_eq!(json["failures"]["total"], 1);
        assert_eq!(json["usage_mismatches"], 1);
        assert_eq!(
            json["output_token_throughput_per_user_definition"],
            PER_USER_DEFINITION
        );
        assert!(live.failure_lines().contains("Failed requests: 1 of 3"));
    }
}
