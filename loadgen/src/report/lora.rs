//! The per-adapter figures of a `--lora-mix` run: for each adapter, its requests (completed and
//! failed), prompt and output tokens, and TTFT, ITL and E2E p50 and p99, from the per-request
//! records (`bench` and `replay`: the live records; `multiturn`: its raw results, each turned
//! into an [`AdapterSample`] by its report). The report
//! JSON holds them under `lora` (by adapter name), the console prints one line per adapter.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use servesim::metrics::Distribution;

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

/// One request as the per-adapter figures see it.
pub(crate) struct AdapterSample<'a> {
    /// The `--lora-mix` entry it was sent under.
    pub adapter: &'a str,
    /// It failed (its latencies and tokens are not counted).
    pub failed: bool,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// TTFT (ms).
    pub ttft_ms: Option<f64>,
    /// The request's mean inter-token gap (ms).
    pub itl_ms: Option<f64>,
    /// End-to-end latency (ms).
    pub e2e_ms: Option<f64>,
}

/// The figures of each adapter of `samples` (None when there is none).
pub(crate) fn figures<'a>(
    samples: impl IntoIterator<Item = AdapterSample<'a>>,
) -> Option<BTreeMap<String, AdapterFigures>> {
    let mut by: BTreeMap<String, Acc> = BTreeMap::new();
    for r in samples {
        let a = by.entry(r.adapter.to_string()).or_default();
        a.figures.requests += 1;
        if r.failed {
            a.figures.failed += 1;
            continue;
        }
        a.figures.completed += 1;
        a.figures.input_tokens += r.input_tokens;
        a.figures.output_tokens += r.output_tokens;
        a.ttft.extend(r.ttft_ms);
        a.itl.extend(r.itl_ms);
        a.e2e.extend(r.e2e_ms);
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
