//! Start-up of an agentic replay and parsing of weka files, over trace sizes: both were
//! quadratic before issue 43 (80k roots took 24.6 s to start, 40k weka plays 31.8 s to parse).
//!
//! Run with: cargo bench --bench trace_startup
//!
//! Traces are generated in memory from a fixed seed. `agentic_parse` reads an
//! `agentic_mooncake` v2 text into a checked graph (rows, ids, plays, cycles); `readiness_new`
//! starts a replay of that graph (floors, edges, the id order of ties, the roots due), with
//! lanes and without; `weka_parse` reads a JSONL file of one-request plays. Throughput counts
//! nodes (plays for weka).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servesim::replay::Readiness;
use servesim::trace::{parse_graph, RequestGraph, TraceFormat};

const NODES: [usize; 3] = [10_000, 100_000, 1_000_000];
const WEKA_PLAYS: [usize; 3] = [1_000, 10_000, 40_000];

/// An `agentic_mooncake` v2 trace of `nodes` rows: plays of 1 to 8 nodes, each node after the
/// first depending on the one before (completion) or spawned from the play's first (dispatch),
/// floors spread over an hour.
fn agentic_text(nodes: usize) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(nodes as u64);
    let mut text = String::from(
        r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64,"hash_id_scope":"global","source":{"format":"bench","digest":"x"}}"#,
    );
    text.push('\n');
    let (mut n, mut play) = (0, 0);
    while n < nodes {
        let len = rng.gen_range(1..=8).min(nodes - n);
        let first = n;
        for k in 0..len {
            let deps = match k {
                0 => String::new(),
                _ if rng.gen_bool(0.2) => format!(
                    r#"{{"request_id":"r{first}","trigger":"dispatch","relation":"spawn","delay_ms":{}}}"#,
                    rng.gen_range(0..100)
                ),
                _ => format!(
                    r#"{{"request_id":"r{}","trigger":"completion","relation":"sequence","delay_ms":{}}}"#,
                    n - 1,
                    rng.gen_range(0..5_000)
                ),
            };
            let shared: u64 = rng.gen_range(0..64);
            text.push_str(&format!(
                r#"{{"request_id":"r{n}","play_id":"p{play}","session_id":"s{play}","model":"M","input_length":256,"output_length":{},"hash_ids":[{shared},{},{},{}],"not_before_ms":{},"dependencies":[{deps}]}}"#,
                rng.gen_range(1..512),
                4 * n + 1,
                4 * n + 2,
                4 * n + 3,
                rng.gen_range(0..3_600_000),
            ));
            text.push('\n');
            n += 1;
        }
        play += 1;
    }
    text
}

/// A weka JSONL file of `plays` one-request plays.
fn weka_text(plays: usize) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(plays as u64);
    (0..plays)
        .map(|i| {
            format!(
                r#"{{"id":"play-{i}","block_size":64,"hash_id_scope":"local","requests":[{{"type":"n","t":{},"model":"M","in":256,"out":{},"hash_ids":[1,2,3,4],"api_time":1.5}}]}}"#,
                rng.gen_range(0..3_600),
                rng.gen_range(1..512)
            ) + "\n"
        })
        .collect()
}

fn graph(text: &str) -> RequestGraph {
    parse_graph(text.as_bytes(), "bench", TraceFormat::AgenticMooncake, 64)
        .expect("the generated trace parses")
}

fn bench_agentic(c: &mut Criterion) {
    let mut parse = c.benchmark_group("agentic_parse");
    parse.measurement_time(Duration::from_secs(5));
    parse.sample_size(10);
    let texts: Vec<(usize, String)> = NODES.iter().map(|&n| (n, agentic_text(n))).collect();
    for (nodes, text) in &texts {
        parse.throughput(Throughput::Elements(*nodes as u64));
        parse.bench_with_input(BenchmarkId::from_parameter(nodes), text, |b, text| {
            b.iter(|| black_box(graph(text)))
        });
    }
    parse.finish();
    let mut start = c.benchmark_group("readiness_new");
    start.measurement_time(Duration::from_secs(5));
    start.sample_size(10);
    for (nodes, text) in &texts {
        let g = graph(text);
        let plays: Vec<usize> = (0..g.plays.len()).collect();
        start.throughput(Throughput::Elements(*nodes as u64));
        for (name, lanes) in [("unlaned", None), ("64_lanes", Some(64))] {
            start.bench_with_input(BenchmarkId::new(name, nodes), &g, |b, g| {
                b.iter(|| black_box(Readiness::new(g, 1.0, lanes, &plays).next_due()))
            });
        }
    }
    start.finish();
}

fn bench_weka(c: &mut Criterion) {
    let mut group = c.benchmark_group("weka_parse");
    group.measurement_time(Duration::from_secs(5));
    group.sample_size(10);
    for plays in WEKA_PLAYS {
        let text = weka_text(plays);
        group.throughput(Throughput::Elements(plays as u64));
        group.bench_with_input(BenchmarkId::from_parameter(plays), &text, |b, text| {
            b.iter(|| {
                black_box(
                    parse_graph(text.as_bytes(), "bench.jsonl", TraceFormat::Weka, 64)
                        .expect("the generated trace parses"),
                )
            })
        });
    }
    group.finish();
}

/// Every group, with criterion's command-line configuration.
fn benches() {
    let mut c = Criterion::default().configure_from_args();
    bench_agentic(&mut c);
    bench_weka(&mut c);
}

criterion_main!(benches);
