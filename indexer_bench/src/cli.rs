//! `mooncake_bench TRACE [flags] INDEXER [indexer flags]`: the KV indexer benchmark's command
//! line (Dynamo's `mooncake_bench` flags and defaults, with thread defaults for small machines).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use servesim::indexer::ApproximateConfig;
use servesim::scheduler::EngineConfig;
use servesim::time::SimDuration;
use servesim::trace::{self, TraceOptions};

use crate::{IndexerConfig, IndexerKind, OpenLoopResult, Provenance, RunConfig, WorkloadConfig};

/// KV indexer benchmark: a Mooncake trace replayed on mock engines into KV events and lookups,
/// then issued open loop at deadlines compressed into a window.
#[derive(Parser, Debug, Clone)]
#[command(name = "mooncake_bench")]
pub struct MooncakeArgs {
    /// Mooncake JSONL trace.
    pub trace: PathBuf,

    /// KV blocks per mock engine.
    #[arg(long, default_value_t = 16384)]
    pub num_gpu_blocks: usize,

    /// Tokens per KV block (engine and indexer).
    #[arg(long, default_value_t = 128)]
    pub block_size: usize,

    /// Prompt tokens per trace hash id.
    #[arg(long, default_value_t = 512)]
    pub trace_block_size: usize,

    /// Window the workload is compressed into.
    #[arg(long, default_value_t = 60000)]
    pub benchmark_duration_ms: u64,

    /// Workers the trace's sessions are partitioned over.
    #[arg(short = 'n', long, default_value_t = 1000)]
    pub num_unique_inference_workers: usize,

    /// Copies of every worker (distinct worker ids, same timeline).
    #[arg(short = 'd', long, default_value_t = 1)]
    pub inference_worker_duplication_factor: usize,

    /// Each hash id becomes this many, prompts this many times longer.
    #[arg(long, default_value_t = 1)]
    pub trace_length_factor: usize,

    /// Copies of the trace in disjoint hash spaces.
    #[arg(long, default_value_t = 1)]
    pub trace_duplication_factor: usize,

    /// Seed of the session partition and the engines.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Divides the mock engines' prefill and decode times.
    #[arg(long, default_value_t = 10.0)]
    pub speedup_ratio: f64,

    /// Run a series of log-spaced windows (longest first) and print a table.
    #[arg(long)]
    pub sweep: bool,

    /// Shortest sweep window.
    #[arg(long, default_value_t = 1000)]
    pub sweep_min_ms: u64,

    /// Longest sweep window.
    #[arg(long, default_value_t = 50000)]
    pub sweep_max_ms: u64,

    /// Sweep windows.
    #[arg(long, default_value_t = 10)]
    pub sweep_steps: usize,

    /// Threads issuing operations at their deadlines.
    #[arg(long, default_value_t = 1)]
    pub issuer_threads: usize,

    /// Lookup threads of concurrent indexers.
    #[arg(long, default_value_t = 2)]
    pub query_lanes: usize,

    /// Issuers spin this long before each deadline (0 = sleep only).
    #[arg(long, default_value_t = 0)]
    pub issuer_spin_us: u64,

    /// Operations issued later than this count as delayed.
    #[arg(long, default_value_t = 50)]
    pub issue_lag_diagnostic_threshold_us: u64,

    /// Write the result JSON here (sweep: `{stem}_{indexer}_{ms}ms.json` next to it).
    #[arg(long, value_name = "PATH")]
    pub result_json_output: Option<PathBuf>,

    /// The indexer under test.
    #[command(subcommand)]
    pub indexer: IndexerCmd,
}

/// Indexers and their flags.
#[derive(Subcommand, Debug, Clone)]
pub enum IndexerCmd {
    /// Single-threaded reference radix tree (one owner thread).
    RadixTree,
    /// Path-compressed concurrent radix tree: lookups on query lanes, events on event workers.
    ConcurrentRadixTreeCompressed {
        /// Event threads (workers hashed onto them).
        #[arg(long, default_value_t = 2)]
        num_event_workers: usize,
    },
    /// Reference trees sharded by a hash of the first K blocks.
    BranchSharded {
        /// Shards.
        #[arg(long, default_value_t = 2)]
        num_shards: usize,
        /// K: leading blocks whose hash picks the shard.
        #[arg(long, default_value_t = 2)]
        prefix_depth: usize,
        /// Event threads (workers hashed onto them).
        #[arg(long, default_value_t = 2)]
        num_event_workers: usize,
    },
    /// The KV router's map from sequence hash to workers (one owner thread).
    Flat,
    /// Routing decisions with a TTL instead of KV events (one owner thread).
    Approximate {
        /// Seconds a routed block is assumed cached.
        #[arg(long, default_value_t = 120.0)]
        ttl_secs: f64,
    },
}

impl IndexerCmd {
    /// The kind, its settings, and the event threads it uses.
    pub fn config(&self) -> anyhow::Result<(IndexerKind, IndexerConfig, usize)> {
        let mut config = IndexerConfig::default();
        Ok(match *self {
            IndexerCmd::RadixTree => (IndexerKind::RadixTree, config, 0),
            IndexerCmd::Flat => (IndexerKind::Flat, config, 0),
            IndexerCmd::ConcurrentRadixTreeCompressed { num_event_workers } => (
                IndexerKind::ConcurrentRadixTreeCompressed,
                config,
                num_event_workers,
            ),
            IndexerCmd::BranchSharded {
                num_shards,
                prefix_depth,
                num_event_workers,
            } => {
                anyhow::ensure!(num_shards > 0, "--num-shards must be positive");
                anyhow::ensure!(prefix_depth > 0, "--prefix-depth must be positive");
                config.num_shards = num_shards;
                config.prefix_depth = prefix_depth;
                (IndexerKind::BranchSharded, config, num_event_workers)
            }
            IndexerCmd::Approximate { ttl_secs } => {
                anyhow::ensure!(
                    ttl_secs.is_finite() && ttl_secs > 0.0,
                    "--ttl-secs must be positive"
                );
                config.approximate = ApproximateConfig {
                    ttl: SimDuration::from_millis_f64(ttl_secs * 1e3),
                    ..ApproximateConfig::default()
                };
                (IndexerKind::Approximate, config, 0)
            }
        })
    }

    fn flags(&self) -> String {
        format!("{self:?}")
    }
}

/// Where a sweep step's JSON goes: `{stem}_{indexer}_{ms}ms.json` next to `path`.
pub fn sweep_json_path(path: &Path, indexer: &str, window_ms: u64) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "mooncake_result".to_string());
    path.with_file_name(format!("{stem}_{indexer}_{window_ms}ms.json"))
}

/// Prepares the workload, runs the window (or the sweep), prints and writes the results.
pub fn run(args: &MooncakeArgs) -> anyhow::Result<Vec<OpenLoopResult>> {
    let (kind, indexer, event_workers) = args.indexer.config()?;
    anyhow::ensure!(
        args.benchmark_duration_ms > 0,
        "--benchmark-duration-ms must be positive"
    );
    anyhow::ensure!(args.issuer_threads > 0, "--issuer-threads must be positive");
    anyhow::ensure!(args.query_lanes > 0, "--query-lanes must be positive");
    let options = TraceOptions {
        trace_block_size: args.trace_block_size,
        arrival_speedup_ratio: 1.0,
    };
    let trace = trace::load(&args.trace, &options)?;
    let mut engine = EngineConfig {
        num_gpu_blocks: args.num_gpu_blocks,
        block_size: args.block_size,
        // Dynamo's bench engines: unlimited sequences and tokens per pass.
        max_num_seqs: 1 << 20,
        max_num_batched_tokens: 1 << 30,
        ..EngineConfig::default()
    };
    engine.latency.speedup_ratio = args.speedup_ratio;
    let workload_config = WorkloadConfig {
        num_unique_workers: args.num_unique_inference_workers,
        worker_duplication_factor: args.inference_worker_duplication_factor,
        trace_length_factor: args.trace_length_factor,
        trace_duplication_factor: args.trace_duplication_factor,
        trace_block_size: args.trace_block_size,
        engine,
        seed: args.seed,
    };
    let prepared = std::time::Instant::now();
    let workload = crate::prepare(&trace, &workload_config)?;
    let t = workload.totals;
    println!(
        "workload: {} workers, {} requests, {} events ({} stored / {} removed / {} cleared), {} logical ops, {} block ops (prepared in {:.1} s)",
        workload.workers.len(),
        t.requests,
        t.events,
        t.stored_events,
        t.removed_events,
        t.cleared_events,
        t.logical_ops(),
        t.block_ops(),
        prepared.elapsed().as_secs_f64()
    );
    let provenance = Provenance {
        argv: std::env::args().collect(),
        trace_path: args.trace.display().to_string(),
        block_size: args.block_size,
        trace_block_size: args.trace_block_size,
        num_unique_inference_workers: args.num_unique_inference_workers,
        inference_worker_duplication_factor: args.inference_worker_duplication_factor,
        trace_length_factor: args.trace_length_factor,
        trace_duplication_factor: args.trace_duplication_factor,
        num_gpu_blocks: args.num_gpu_blocks,
        seed: args.seed,
        indexer_flags: args.indexer.flags(),
    };
    let windows = if args.sweep {
        crate::sweep_windows(args.sweep_min_ms, args.sweep_max_ms, args.sweep_steps)
    } else {
        vec![args.benchmark_duration_ms]
    };
    let mut results = Vec::new();
    for &ms in &windows {
        let config = RunConfig {
            benchmark_duration: Duration::from_millis(ms),
            issuer_threads: args.issuer_threads,
            query_lanes: args.query_lanes,
            event_workers,
            issuer_spin: Duration::from_micros(args.issuer_spin_us),
            issue_lag_threshold: Duration::from_micros(args.issue_lag_diagnostic_threshold_us),
        };
        let mut result = crate::run(&workload, kind, &indexer, &config);
        result.provenance = Some(provenance.clone());
        print!("{result}");
        if let Some(path) = &args.result_json_output {
            let path = if args.sweep {
                sweep_json_path(path, kind.name(), ms)
            } else {
                path.clone()
            };
            let json = serde_json::to_string_pretty(&result)?;
            std::fs::write(&path, json + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
            println!("  wrote {}", path.display());
        }
        results.push(result);
    }
    if args.sweep {
        print!("{}", sweep_table(&results));
    }
    Ok(results)
}

/// The sweep summary: one row per window.
pub fn sweep_table(results: &[OpenLoopResult]) -> String {
    let mut s = String::from(
        "| window ms | offered ops/s | achieved ops/s | offered block ops/s | achieved block ops/s | service p50 us | service p99 us | queue p99 us | kept up |\n|---:|---:|---:|---:|---:|---:|---:|---:|:---:|\n",
    );
    for r in results {
        s.push_str(&format!(
            "| {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |\n",
            r.benchmark_duration_ms,
            r.offered_logical_ops_per_sec,
            r.achieved_logical_ops_per_sec,
            r.offered_block_ops_per_sec,
            r.achieved_block_ops_per_sec,
            r.query_service.p50_ns as f64 / 1e3,
            r.query_service.p99_ns as f64 / 1e3,
            r.query_queue_wait.p99_ns as f64 / 1e3,
            if r.kept_up { "yes" } else { "no" },
        ));
    }
    s
}
