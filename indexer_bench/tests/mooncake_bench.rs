//! `mooncake_bench` end to end on a fixture trace: every indexer's counts and JSON, the sweep.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use clap::Parser;
use indexer_bench::cli::{run, sweep_json_path, MooncakeArgs};

/// Path of a file under the repository's `fixtures/`.
fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures")).join(name)
}

fn args(extra: &[&str]) -> MooncakeArgs {
    let trace = fixture("trace_small.jsonl");
    let mut argv = vec![
        "mooncake_bench".to_string(),
        trace.to_str().unwrap().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    MooncakeArgs::try_parse_from(argv).expect("flags parse")
}

/// A fresh directory, removed with its contents when dropped (also when a test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("servesim-mooncake-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn every_indexer_replays_the_fixture_and_writes_valid_json() {
    let dir = TempDir::new("all");
    // 20 requests over 3 unique workers, each copied twice, and the trace duplicated twice.
    let common = [
        "-n",
        "3",
        "-d",
        "2",
        "--trace-duplication-factor",
        "2",
        "--block-size",
        "16",
        "--benchmark-duration-ms",
        "100",
    ];
    let indexers: [&[&str]; 5] = [
        &["radix-tree"],
        &[
            "concurrent-radix-tree-compressed",
            "--num-event-workers",
            "2",
        ],
        &["branch-sharded", "--num-shards", "2", "--prefix-depth", "2"],
        &["approximate"],
        &["flat"],
    ];
    let mut radix_totals = None;
    for indexer in indexers {
        let out = dir.join(format!("{}.json", indexer[0]));
        let mut flags: Vec<&str> = common.to_vec();
        flags.extend(["--result-json-output", out.to_str().unwrap()]);
        flags.extend(indexer);
        let results = run(&args(&flags)).expect("bench runs");
        assert_eq!(results.len(), 1);
        let r = &results[0];
        // Only the wall-clock criterion may fail on a loaded test machine.
        assert!(
            r.failure_reasons
                .iter()
                .all(|f| f.starts_with("issuing took")),
            "{}: {:?}",
            indexer[0],
            r.failure_reasons
        );
        // 20 rows x 2 trace copies x 2 worker copies.
        assert_eq!(r.totals.requests, 80, "{}", indexer[0]);
        assert_eq!(r.query_service.count, 80);
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(json["backend"], indexer[0]);
        assert_eq!(json["totals"]["requests"], 80);
        assert_eq!(json["provenance"]["inference_worker_duplication_factor"], 2);
        for key in [
            "offered_block_ops_per_sec",
            "achieved_block_ops_per_sec",
            "offered_logical_ops_per_sec",
            "achieved_logical_ops_per_sec",
        ] {
            assert!(json[key].as_f64().unwrap() > 0.0, "{key}");
        }
        assert!(json["query_service"]["p99_ns"].as_u64().unwrap() > 0);
        assert!(json["kept_up"].is_boolean());
        if indexer[0] == "approximate" {
            assert_eq!(r.totals.events, 0);
            assert_eq!(r.totals.routing_writes, 80);
        } else {
            // Every KV-event indexer sees the same corpus and applies all of it.
            assert!(r.totals.stored_events > 0);
            assert_eq!(r.indexer_stats.events_applied, r.totals.events);
            match radix_totals {
                None => radix_totals = Some(r.totals),
                Some(t) => assert_eq!(t, r.totals, "{}", indexer[0]),
            }
        }
    }
}

#[test]
fn sweep_writes_one_json_per_window() {
    let dir = TempDir::new("sweep");
    let out = dir.join("res.json");
    let results = run(&args(&[
        "-n",
        "2",
        "--block-size",
        "16",
        "--sweep",
        "--sweep-min-ms",
        "20",
        "--sweep-max-ms",
        "80",
        "--sweep-steps",
        "3",
        "--result-json-output",
        out.to_str().unwrap(),
        "radix-tree",
    ]))
    .expect("sweep runs");
    let windows: Vec<f64> = results.iter().map(|r| r.benchmark_duration_ms).collect();
    assert_eq!(windows, vec![80.0, 40.0, 20.0]);
    for ms in [80, 40, 20] {
        let path = sweep_json_path(&out, "radix-tree", ms);
        assert!(path.ends_with(format!("res_radix-tree_{ms}ms.json")));
        let _: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    }
}

#[test]
fn bad_settings_are_errors() {
    assert!(run(&args(&["-n", "0", "radix-tree"])).is_err());
    assert!(run(&args(&["branch-sharded", "--num-shards", "0"])).is_err());
    assert!(
        MooncakeArgs::try_parse_from(["mooncake_bench", "t.jsonl", "no-such-indexer"]).is_err()
    );
}
