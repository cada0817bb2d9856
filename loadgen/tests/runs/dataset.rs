//! `--dataset`: bench and multiturn send a dataset's prompts to the embedded mockserve, and the
//! server's usage counts the dataset's tokens; flag errors come before anything connects.

use std::path::{Path, PathBuf};

use anyhow::Result;
use loadgen::dataset::{Dataset, DatasetFormat, DatasetSpec};
use loadgen::{Command, LoadgenError};

use crate::common::{command, within, TempDir};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/datasets")
        .join(name)
        .display()
        .to_string()
}

/// The fixture as the embedded server counts it (its tokenizer: servesim's default).
fn dataset(format: DatasetFormat, name: &str) -> Dataset {
    let tok = servesim::tokenizer::default_tokenizer().expect("the default tokenizer");
    let spec = DatasetSpec {
        format,
        path: PathBuf::from(fixture(name)),
    };
    loadgen::dataset::read(&spec, &tok, (1, 1 << 22), None).expect("the fixture loads")
}

/// Requests `0..n` of a bench over `d` with seed `seed`, in order: (prompt tokens, output
/// tokens), the output `fallback` when the data has none.
fn expected(d: &Dataset, seed: u64, n: usize, fallback: usize) -> Vec<(u64, u64)> {
    let order = d.order(seed);
    (0..n)
        .map(|k| {
            let t = &d.conversation(order[k % order.len()]).turns[0];
            (t.input_tokens as u64, d.output_tokens(t, fallback) as u64)
        })
        .collect()
}

/// A bench run over each fixture: every request's prompt tokens, as the server reports them in
/// its usage, are a dataset prompt's count, and its output length is the data's (or
/// `--output-tokens` for a line without one), in the seeded order (one user sends them one
/// after the other); another seed sends them in another order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_sends_the_dataset_prompts() -> Result<()> {
    for (format, name, spec) in [
        (DatasetFormat::ShareGpt, "sharegpt_small.json", "sharegpt:"),
        (DatasetFormat::Jsonl, "prompts.jsonl", "jsonl:"),
    ] {
        let flag = format!("{spec}{}", fixture(name));
        let Command::Bench(args) = command(&[
            "bench",
            "--dataset",
            &flag,
            "--num-requests",
            "15",
            "--concurrency",
            "1",
            "--output-tokens",
            "9",
            "--seed",
            "5",
            "--speedup-ratio",
            "inf",
            "--quiet",
        ]) else {
            unreachable!()
        };
        let run = within(60, loadgen::bench::bench(&args)).await??;
        let d = dataset(format, name);
        let got: Vec<(u64, u64)> = run
            .live
            .records
            .iter()
            .map(|r| {
                assert!(r.error.is_none(), "{:?}", r.error);
                (r.prompt_tokens.unwrap_or(0), r.record.output_length)
            })
            .collect();
        assert_eq!(got, expected(&d, 5, 15, 9), "{name}");
        assert_ne!(
            got,
            expected(&d, 6, 15, 9),
            "{name}: seed 6 orders them otherwise"
        );
        // The report's own input lengths are the dataset's counts too.
        let inputs: Vec<u64> = run
            .live
            .records
            .iter()
            .map(|r| r.record.input_length as u64)
            .collect();
        let want: Vec<u64> = got.iter().map(|e| e.0).collect();
        assert_eq!(inputs, want, "{name}");
        assert_eq!(run.json["config"]["dataset"]["conversations_kept"], 6);
    }
    Ok(())
}

/// ShareGPT conversations become multiturn sessions: user `u` runs the seed's conversation
/// `u`, one request per human turn, each asking for the next gpt turn's length (or
/// --max-completion-tokens for an unanswered turn), its user tokens the dataset's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiturn_runs_sharegpt_conversations() -> Result<()> {
    let flag = format!("sharegpt:{}", fixture("sharegpt_small.json"));
    let Command::Multiturn(args) = command(&[
        "multiturn",
        "--dataset",
        &flag,
        "--num-users",
        "6",
        "--num-turns",
        "10",
        "--max-completion-tokens",
        "17",
        "--mean-delay-ms",
        "0",
        "--reasoning-ratio",
        "0",
        "--speedup-ratio",
        "inf",
        "--seed",
        "3",
        "--quiet",
    ]) else {
        unreachable!()
    };
    let config = args.config()?;
    // The longest conversation has three human turns.
    assert_eq!(config.workload.num_turns, 3);
    let results = within(60, loadgen::multiturn::multiturn(&config)).await??;
    let d = dataset(DatasetFormat::ShareGpt, "sharegpt_small.json");
    let order = d.order(3);
    let mut turns_seen = 0;
    for (u, &i) in order.iter().enumerate() {
        let conversation = d.conversation(i);
        let mut records: Vec<_> = results
            .raw_results
            .iter()
            .filter(|r| r.user_id == u)
            .collect();
        records.sort_by_key(|r| r.turn);
        assert_eq!(records.len(), conversation.turns.len(), "user {u}");
        for (r, t) in records.iter().zip(&conversation.turns) {
            assert!(r.success, "user {u} turn {}: {:?}", r.turn, r.error);
            assert_eq!(r.output_tokens, d.output_tokens(t, 17) as u64, "user {u}");
            assert_eq!(r.user_tokens, Some(t.input_tokens), "user {u}");
        }
        turns_seen += records.len();
    }
    // Six conversations of 1, 3, 2, 1, 2 and 1 human turns.
    assert_eq!((results.total_requests, turns_seen), (10, 10));
    Ok(())
}

/// Bad dataset flags and unusable files are refused before anything connects, naming the flag
/// or the file's line.
#[test]
fn dataset_errors_come_before_the_run() {
    let tmp = TempDir::new("loadgen-dataset").expect("a temporary directory");
    let bad_line = tmp.join("bad.jsonl");
    std::fs::write(&bad_line, "\"ok\"\n{\"prompt\": 3}\n").expect("write");
    let bad_flag = format!("jsonl:{}", bad_line.display());
    let sharegpt = format!("sharegpt:{}", fixture("sharegpt_small.json"));
    // A sweep's points share bench's dataset flags.
    let sweep = command(&[
        "sweep",
        "--dataset",
        &format!("jsonl:{}", fixture("prompts.jsonl")),
        "--concurrency",
        "1,2",
    ]);
    loadgen::validate(&sweep).expect("a sweep over a dataset");
    let cases: [(&[&str], String); 5] = [
        (
            &["bench", "--dataset-output-tokens", "5"],
            "--dataset-output-tokens needs --dataset".into(),
        ),
        (
            &["bench", "--dataset", &bad_flag],
            format!("{}:2: \"prompt\" must be a string", bad_line.display()),
        ),
        (
            &[
                "bench",
                "--dataset",
                &sharegpt,
                "--dataset-min-input-tokens",
                "100000",
            ],
            "no conversation left to send: 6 read".into(),
        ),
        (
            &[
                "bench",
                "--dataset",
                &sharegpt,
                "--shared-prefix-tokens",
                "8",
            ],
            "--shared-prefix-tokens does not apply".into(),
        ),
        (
            &[
                "multiturn",
                "--dataset",
                &sharegpt,
                "--dataset-min-input-tokens",
                "9",
                "--dataset-max-input-tokens",
                "8",
            ],
            "--dataset-min-input-tokens 9 is above --dataset-max-input-tokens 8".into(),
        ),
    ];
    for (flags, says) in cases {
        let e: LoadgenError = loadgen::validate(&command(flags)).expect_err("refused");
        assert!(e.to_string().contains(&says), "{flags:?}: {e}");
    }
}
