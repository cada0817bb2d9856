//! The per-adapter figures of a `--lora-mix` run: for each adapter, its requests (completed and
//! failed), prompt and output tokens, and TTFT, ITL and E2E p50 and p99, from the per-request
//! records (`bench` and `replay`: [`LiveRecord`]s; `multiturn`: its raw results). The report
//! JSON holds them under `lora` (by adapter name), the console prints one line per adapter.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use servesim::metrics::Distribution;

use crate::multiturn::report::RawResult;
use crate::report::replay_report::LiveRecord;

/// One adapter's figures (latencies in ms).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub(crate) struct AdapterFigures {
    /// Requests sent under it.
    pub requests: usize,
    /// Of those, completed.
    pub completed: usize,
    /// Of those, failed.
    pub failed: usize,
    /// Σ prompt tokens (the server's count when it gave one).
    pub input_tokens: u64,
    /// Σ output tokens.
    pub output_tokens: u64,
    /// TTFT p50 and p99.
    pub p50_ttft_ms: f64,
    /// TTFT p99.
    pub p99_ttft_ms: f64,
    /// Per-request mean inter-token latency, p50.
    pub p50_itl_ms: f64,
    /// Per-request mean inter-token latency, p99.
    pub p99_itl_ms: f64,
    /// End-to-end latency, p50.
    pub p50_e2e_latency_ms: f64,
    /// End-to-end latency, p99.
    pub p99_e2e_latency_ms: f64,
}

/// Samples of one adapter before the percentiles.
#[derive(Default)]
struct Acc {
    figures: AdapterFigures,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    e2e: Vec<f64>,
}

impl Acc {
    fn finish(mut self) -> AdapterFigures {
        let p = |v: &mut Vec<f64>| {
            let d = Distribution::from_samples(v);
            (d.median, d.p99)
        };
        let f = &mut self.figures;
        (f.p50_ttft_ms, f.p99_ttft_ms) = p(&mut self.ttft);
        (f.p50_itl_ms, f.p99_itl_ms) = p(&mut self.itl);
        (f.p50_e2e_latency_ms, f.p99_e2e_latency_ms) = p(&mut self.e2e);
        self.figures
    }
}

/// The figures of each adapter of `records` (None when no record has one).
pub(crate) fn of_live(records: &[LiveRecord]) -> Option<BTreeMap<String, AdapterFigures>> {
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for r in records {
        let Some(adapter) = &r.raw.adapter else {
            continue;
        };
        let a = by.entry(adapter.clone()).or_default();
        a.figures.requests += 1;
        if r.error.is_some() {
            a.figures.failed += 1;
            continue;
        }
        a.figures.completed += 1;
        a.figures.input_tokens += r.prompt_tokens.unwrap_or(r.record.input_length as u64);
        a.figures.output_tokens += r.record.output_length;
        a.ttft.extend(r.record.ttft_ms);
        a.itl.extend(r.record.itl_ms);
        a.e2e.extend(r.record.e2e_latency_ms);
    }
    (!by.is_empty()).then(|| by.into_iter().map(|(k, a)| (k, a.finish())).collect())
}

/// The figures of each adapter of a multiturn run's results (None when none has one). ITL is
/// each turn's `(latency - TTFT) / (output tokens - 1)`.
pub(crate) fn of_multiturn(results: &[RawResult]) -> Option<BTreeMap<String, AdapterFigures>> {
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for r in results {
        let Some(adapter) = &r.adapter else {
            continue;
        };
        let a = by.entry(adapter.clone()).or_default();
        a.figures.requests += 1;
        if !r.success {
            a.figures.failed += 1;
            continue;
        }
        a.figures.completed += 1;
        a.figures.input_tokens += r.prompt_tokens.unwrap_or(0);
        a.figures.output_tokens += r.output_tokens;
        let ms = |us: u64| us as f64 / 1000.0;
        if let Some(ttft) = r.ttft_any_us {
            a.ttft.push(ms(ttft));
            if r.output_tokens > 1 {
                let rest = r.total_latency_us.saturating_sub(ttft);
                a.itl.push(ms(rest) / (r.output_tokens - 1) as f64);
            }
        }
        a.e2e.push(ms(r.total_latency_us));
    }
    (!by.is_empty()).then(|| by.into_iter().map(|(k, a)| (k, a.finish())).collect())
}

/// The report JSON's `lora` object.
pub(crate) fn to_json(by: &BTreeMap<String, AdapterFigures>) -> Value {
    serde_json::to_value(by).unwrap_or(Value::Null)
}

/// One console line per adapter.
pub(crate) fn lines(by: &BTreeMap<String, AdapterFigures>) -> String {
    let width = by.keys().map(String::len).max().unwrap_or(0);
    let mut s = String::from(
        "Per LoRA adapter: requests (failed), input/output tokens, TTFT / ITL / E2E p50 and p99 \
         (ms)\n",
    );
    for (name, f) in by {
        s.push_str(&format!(
            "  {name:<width$}  {} ({} failed)  in {} out {}  TTFT {:.2} / {:.2}  ITL {:.2} / \
             {:.2}  E2E {:.2} / {:.2}\n",
            f.requests,
            f.failed,
            f.input_tokens,
            f.output_tokens,
            f.p50_ttft_ms,
            f.p99_ttft_ms,
            f.p50_itl_ms,
            f.p99_itl_ms,
            f.p50_e2e_latency_ms,
            f.p99_e2e_latency_ms
        ));
    }
    s
}
