//! Dynamo-compatible `mooncake_bench` entry point: the KV indexer benchmark.
//!
//! Indexers: radix-tree, concurrent-radix-tree-compressed (--num-event-workers), branch-sharded
//! (--num-shards, --prefix-depth, --num-event-workers), approximate (--ttl-secs), flat.
//!
//! Run with:
//! `cargo bench --bench mooncake_bench -- traces/mooncake_synthetic_trace.jsonl
//!  -n 128 --benchmark-duration-ms 10000 --result-json-output crtc.json
//!  concurrent-radix-tree-compressed --num-event-workers 2`
//!
//! A bare `cargo bench` passes only `--bench`; the entry point then skips (exit 0).

mod common;

use std::process::ExitCode;

use indexer_bench::cli::MooncakeArgs;

fn main() -> ExitCode {
    common::bench_main("mooncake_bench", |args: MooncakeArgs| {
        indexer_bench::cli::run(&args).map(|_| ())
    })
}
