//! The result of one open-loop run, serialised as Dynamo's `OpenLoopResult` JSON (our subset).

use std::fmt;

use servesim::indexer::IndexerStats;
use servesim::metrics::Distribution as Summary;

/// Operation and block counts actually issued in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunTotals {
    /// Lookups.
    pub requests: u64,
    /// KV events of every kind.
    pub events: u64,
    /// Stored events.
    pub stored_events: u64,
    /// Removed events.
    pub removed_events: u64,
    /// Cleared events.
    pub cleared_events: u64,
    /// Routing-decision writes (approximate indexer only, one per request).
    pub routing_writes: u64,
    /// Block hashes over all lookups.
    pub request_blocks: u64,
    /// Blocks over all Stored events.
    pub stored_blocks: u64,
    /// Hashes over all Removed events.
    pub removed_blocks: u64,
    /// Blocks over all routing-decision writes.
    pub routing_blocks: u64,
    /// Requests + events + routing writes.
    pub logical_ops: u64,
    /// Request hashes + Stored blocks + Removed hashes + routing blocks.
    pub block_ops: u64,
}

/// Percentiles of a latency sample in nanoseconds: the JSON shape of Dynamo's `OpenLoopResult`
/// distributions. The ranks are read by [`servesim::metrics::Distribution::percentile_mooncake`]
/// (index `(n-1)*p/100` of the sorted sample, rounded down, as Dynamo's indexer bench reads them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Distribution {
    /// Number of samples.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest sample.
    pub max_ns: u64,
}

impl Distribution {
    /// The percentiles of `samples` (all zero when empty).
    pub fn of(mut samples: Vec<u64>) -> Distribution {
        samples.sort_unstable();
        let at = |permille| Summary::percentile_mooncake(&samples, permille).unwrap_or(0);
        Distribution {
            count: samples.len() as u64,
            p50_ns: at(500),
            p99_ns: at(990),
            p999_ns: at(999),
            max_ns: samples.last().copied().unwrap_or(0),
        }
    }
}

/// The indexer's event counters at the end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexerCounters {
    /// Events applied.
    pub events_applied: u64,
    /// Stored events skipped for an unknown parent.
    pub unknown_parent_events: u64,
    /// Removed hashes the worker did not hold.
    pub unknown_removed_hashes: u64,
    /// Events dropped as not newer than the worker's last.
    pub stale_events: u64,
    /// Events ignored (approximate indexer).
    pub ignored_events: u64,
}

impl From<IndexerStats> for IndexerCounters {
    fn from(s: IndexerStats) -> IndexerCounters {
        IndexerCounters {
            events_applied: s.events_applied,
            unknown_parent_events: s.unknown_parent_events,
            unknown_removed_hashes: s.unknown_removed_hashes,
            stale_events: s.stale_events,
            ignored_events: s.ignored_events,
        }
    }
}

/// Where a result came from: the command line and the corpus settings.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Provenance {
    /// The benchmark's arguments.
    pub argv: Vec<String>,
    /// The trace file.
    pub trace_path: String,
    /// Engine block size (tokens).
    pub block_size: usize,
    /// Tokens per trace hash id.
    pub trace_block_size: usize,
    /// `-n`.
    pub num_unique_inference_workers: usize,
    /// `-d`.
    pub inference_worker_duplication_factor: usize,
    /// `--trace-length-factor`.
    pub trace_length_factor: usize,
    /// `--trace-duplication-factor`.
    pub trace_duplication_factor: usize,
    /// KV blocks per mock engine.
    pub num_gpu_blocks: usize,
    /// Seed of the partition and engines.
    pub seed: u64,
    /// Indexer flags, as given.
    pub indexer_flags: String,
}

/// One open-loop run (Dynamo's `OpenLoopResult`, the fields this benchmark measures).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct OpenLoopResult {
    /// Version of this layout.
    pub schema_version: u32,
    /// Indexer name.
    pub backend: String,
    /// How issuers wait for deadlines.
    pub timer: String,
    /// The window the workload was compressed into.
    pub benchmark_duration_ms: f64,
    /// Issuer threads.
    pub issuer_threads: usize,
    /// Lookup threads (1 for single-threaded indexers: the owner thread).
    pub query_lanes: usize,
    /// Event threads of concurrent indexers (0 otherwise).
    pub event_workers: usize,
    /// Spin before each deadline.
    pub issuer_spin_us: u64,
    /// What was issued.
    pub totals: RunTotals,
    /// Logical ops / window.
    pub offered_logical_ops_per_sec: f64,
    /// Logical ops / issue span.
    pub actual_issue_logical_ops_per_sec: f64,
    /// Logical ops / (issue + drain).
    pub achieved_logical_ops_per_sec: f64,
    /// Block ops / window.
    pub offered_block_ops_per_sec: f64,
    /// Block ops / issue span.
    pub actual_issue_block_ops_per_sec: f64,
    /// Block ops / (issue + drain).
    pub achieved_block_ops_per_sec: f64,
    /// Lookup issue time minus deadline.
    pub read_issue_lag: Distribution,
    /// Write issue time minus deadline.
    pub update_issue_lag: Distribution,
    /// Lookup issue to service start.
    pub query_queue_wait: Distribution,
    /// Lookup service time (`find_matches` alone).
    pub query_service: Distribution,
    /// Lookup deadline to completion.
    pub query_scheduled_to_finished: Distribution,
    /// Write issue to completion.
    pub update_accepted_to_finished: Distribution,
    /// Write deadline to completion.
    pub update_scheduled_to_finished: Distribution,
    /// Lookups issued later than the lag threshold.
    pub delayed_reads: u64,
    /// Writes issued later than the lag threshold.
    pub delayed_updates: u64,
    /// Time issuers spent handing operations over.
    pub issuer_cpu_ns: u64,
    /// Start to last issue.
    pub issue_span_ns: u64,
    /// Last issue to last completion.
    pub drain_ns: u64,
    /// Start to last completion.
    pub total_ns: u64,
    /// Every operation issued within 1.01 x the window, sent, applied and drained.
    pub generator_valid: bool,
    /// Valid and finished (drain included) within 1.10 x the window.
    pub kept_up: bool,
    /// Why `generator_valid` is false.
    pub failure_reasons: Vec<String>,
    /// The indexer's counters after the run.
    pub indexer_stats: IndexerCounters,
    /// Command line and corpus, filled in by the CLI.
    pub provenance: Option<Provenance>,
}

impl fmt::Display for OpenLoopResult {
    /// The console summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |ns: u64| ns as f64 / 1e3;
        writeln!(
            f,
            "{}: window {:.0} ms, {} logical ops ({} requests, {} events, {} routing writes), {} block ops",
            self.backend,
            self.benchmark_duration_ms,
            self.totals.logical_ops,
            self.totals.requests,
            self.totals.events,
            self.totals.routing_writes,
            self.totals.block_ops
        )?;
        writeln!(
            f,
            "  logical ops/s  offered {:>14.0}  achieved {:>14.0}",
            self.offered_logical_ops_per_sec, self.achieved_logical_ops_per_sec
        )?;
        writeln!(
            f,
            "  block ops/s    offered {:>14.0}  achieved {:>14.0}",
            self.offered_block_ops_per_sec, self.achieved_block_ops_per_sec
        )?;
        writeln!(
            f,
            "  query service p50 {:.2} us  p99 {:.2} us   queue wait p99 {:.2} us",
            us(self.query_service.p50_ns),
            us(self.query_service.p99_ns),
            us(self.query_queue_wait.p99_ns)
        )?;
        writeln!(
            f,
            "  generator_valid {}  kept_up {}  issue_span {:.3} s  drain {:.3} s",
            self.generator_valid,
            self.kept_up,
            self.issue_span_ns as f64 / 1e9,
            self.drain_ns as f64 / 1e9
        )?;
        for r in &self.failure_reasons {
            writeln!(f, "  failure: {r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_reads_dynamo_indexer_ranks() {
        // Unsorted input; (n-1)*p/1000 rounded down: 999*500/1000 = 499, *990 -> 989, *999 -> 998.
        let d = Distribution::of((0..1000).rev().map(|i| i * 10).collect());
        assert_eq!(
            (d.count, d.p50_ns, d.p99_ns, d.p999_ns, d.max_ns),
            (1000, 4990, 9890, 9980, 9990)
        );
        let two = Distribution::of(vec![20, 10]);
        assert_eq!((two.p50_ns, two.p99_ns, two.max_ns), (10, 10, 20));
        assert_eq!(Distribution::of(Vec::new()), Distribution::default());
    }
}
