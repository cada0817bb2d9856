//! Histogram bucket boundaries: vLLM's, the 1-2-5 token-count buckets up to the context
//! length, and servesim's own (token lateness).

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

pub(super) type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

// vLLM's bucket boundaries (vllm/v1/metrics/loggers.py).
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// `servesim_token_lateness_seconds` buckets: 50 µs to 10 s.
pub(crate) const LATENESS_BUCKETS: [f64; 17] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// `vllm:iteration_tokens_total` buckets (vLLM's default CUDA-graph capture sizes).
const ITERATION_BUCKETS: [f64; 13] = [
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to the limit.
pub(crate) fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut exponent = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * exponent;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        exponent = match exponent.checked_mul(10) {
            Some(e) => e,
            None => return out,
        };
    }
}

/// Builds token-count histograms with the 1-2-5 buckets up to the context length.
#[derive(Clone, Debug)]
pub struct TokenBuckets(pub(super) Vec<f64>);

impl prometheus_client::metrics::family::MetricConstructor<Histogram> for TokenBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

pub(super) fn iteration_histogram() -> Histogram {
    Histogram::new(ITERATION_BUCKETS)
}

pub(super) fn ttft_histogram() -> Histogram {
    Histogram::new(TTFT_BUCKETS)
}
pub(super) fn itl_histogram() -> Histogram {
    Histogram::new(ITL_BUCKETS)
}
pub(super) fn e2e_histogram() -> Histogram {
    Histogram::new(E2E_BUCKETS)
}
