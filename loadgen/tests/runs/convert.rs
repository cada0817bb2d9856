//! `loadgen trace convert` end to end: a multiturn run's records, converted to Mooncake and to
//! `agentic_mooncake` and replayed against the embedded mockserve, give the same prompt, output
//! and cached tokens request by request; the same input converts to the same bytes; a log's
//! prompt lengths are the server's; the command line names the malformed line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use loadgen::convert::ConvertArgs;
use loadgen::multiturn_report::Results;
use loadgen::replay::{ReplayArgs, SessionMode};
use loadgen::Command;

use crate::common::{args, cli, command, s, within, TempDir};

/// The engine flags both runs share: the embedded server's defaults (4 workers behind the KV
/// router, 64-token blocks), at infinite speed.
const ENGINE: [&str; 2] = ["--speedup-ratio", "inf"];

/// (prompt tokens, output tokens, cached tokens) by request id (`user-U-turn-T`).
type Counts = HashMap<String, (Option<u64>, u64, Option<u64>)>;

/// A multiturn run of 3 users x 3 turns against the embedded server, its records written.
async fn multiturn_run(records: &Path) -> Result<(Results, Counts)> {
    let rec = s(records);
    let mut argv = vec![
        "multiturn",
        "--num-users",
        "3",
        "--num-turns",
        "3",
        "--num-user-tokens",
        "90",
        // 200 tokens: one of them reasoning at the default share, so no turn's prompt can hit
        // its previous answer's decoded blocks (a trace holds prompts, not outputs).
        "--max-completion-tokens",
        "200",
        "--mean-delay-ms",
        "20",
        "--per-request-jsonl",
        &rec,
        "--quiet",
    ];
    argv.extend_from_slice(&ENGINE);
    let Command::Multiturn(a) = command(&argv) else {
        unreachable!()
    };
    let results = within(60, loadgen::multiturn::multiturn(&a.config()?)).await??;
    let counts: Counts = results
        .raw_results
        .iter()
        .map(|r| {
            (
                format!("user-{}-turn-{}", r.user_id, r.turn),
                (r.prompt_tokens, r.output_tokens, r.cached_tokens),
            )
        })
        .collect();
    assert_eq!(counts.len(), 9);
    assert!(results.raw_results.iter().all(|r| r.success));
    Ok((results, counts))
}

/// The replay's counts by request id: the agentic node id, else the Mooncake session and turn.
async fn replay_counts(trace: &Path, block_size: &str) -> Result<(Counts, SessionMode)> {
    let t = s(trace);
    let mut argv = vec![
        t.as_str(),
        "--trace-block-size",
        block_size,
        "--arrival-speedup-ratio",
        "10",
        "--quiet",
    ];
    argv.extend_from_slice(&ENGINE);
    let run = within(60, loadgen::replay::replay(&args::<ReplayArgs>(&argv))).await??;
    let mut counts = Counts::new();
    for r in &run.live.records {
        let id = match &r.agentic {
            Some(node) => node["request_id"]
                .as_str()
                .context("an agentic node id")?
                .to_string(),
            None => format!(
                "{}-turn-{}",
                r.record.session_id.as_deref().context("a session id")?,
                r.record.turn_index
            ),
        };
        counts.insert(
            id,
            (
                r.raw.prompt_tokens,
                r.raw.output_tokens,
                r.raw.cached_tokens,
            ),
        );
    }
    Ok((counts, run.session_mode))
}

/// The round trip: a multiturn run's records converted (Mooncake and agentic_mooncake, at the
/// engine's block size and at a quarter of it) and replayed give, request by request, the
/// prompt tokens, output tokens and cached tokens the run saw; converting again writes the same
/// bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multiturn_run_converts_and_replays_with_the_same_tokens_and_cache_hits() -> Result<()> {
    let tmp = TempDir::new("loadgen-convert")?;
    let records = tmp.join("records.jsonl");
    let (results, original) = multiturn_run(&records).await?;
    // The run is worth replaying: later turns hit the cache, first turns do not.
    for r in &results.raw_results {
        let cached = r.cached_tokens.unwrap_or(0);
        assert_eq!(cached > 0, r.turn > 0, "user {} turn {}", r.user_id, r.turn);
    }
    for (to, block_size) in [
        ("mooncake", "64"),
        ("agentic-mooncake", "64"),
        ("mooncake", "16"),
    ] {
        let trace = tmp.join(&format!("{to}-{block_size}.jsonl"));
        let again = tmp.join(&format!("{to}-{block_size}-again.jsonl"));
        for out in [&trace, &again] {
            let a = args::<ConvertArgs>(&[
                &s(&records),
                "--to",
                to,
                "--block-size",
                block_size,
                "-o",
                &s(out),
            ]);
            let summary = loadgen::convert::convert(&a)?;
            assert_eq!(
                (summary.converted.requests, summary.converted.sessions),
                (9, 3)
            );
            assert_eq!(summary.usage_differs, 0);
        }
        assert_eq!(std::fs::read(&trace)?, std::fs::read(&again)?);
        let (replayed, mode) = replay_counts(&trace, block_size).await?;
        if to == "mooncake" {
            assert_eq!(mode, SessionMode::Cumulative, "{to} {block_size}");
        }
        let mut ids: Vec<&String> = original.keys().collect();
        ids.sort();
        for id in ids {
            assert_eq!(
                replayed.get(id),
                original.get(id),
                "{id} ({to}, block size {block_size})"
            );
        }
        assert_eq!(replayed.len(), original.len());
        let _ = std::fs::remove_file(&trace);
        let _ = std::fs::remove_file(&again);
    }
    let _ = std::fs::remove_file(&records);
    Ok(())
}

/// A log's prompts are counted as the server counts them: each request of a small log (a
/// conversation with a tool call and its result, tools offered) sent to the embedded server
/// reports as many prompt tokens (`usage.prompt_tokens`) as the converted trace's
/// `input_length`, with the default tokenizer and with a HuggingFace `tokenizer.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logs_prompt_lengths_are_the_servers() -> Result<()> {
    let tmp = TempDir::new("loadgen-convert")?;
    let tool = serde_json::json!({"type": "function", "function": {"name": "lookup",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
    let bodies = [
        serde_json::json!({"model": "m", "max_completion_tokens": 3, "messages": [
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is a KV cache?"}]}),
        serde_json::json!({"model": "m", "max_completion_tokens": 3, "tools": [tool],
            "messages": [
            {"role": "user", "content": "Look up paged attention, please."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\":\"paged attention\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Blocks of KV memory, paged."}]}),
    ];
    let log: String = bodies
        .iter()
        .enumerate()
        .map(|(i, b)| {
            serde_json::json!({"timestamp": i * 10, "session_id": "s", "request": b}).to_string()
                + "\n"
        })
        .collect();
    let input = tmp.join("server-log.jsonl");
    std::fs::write(&input, log)?;
    let tiny =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tokenizer/tiny_bpe.json");
    for tokenizer in [None, Some(s(&tiny))] {
        let out = tmp.join("server-trace.jsonl");
        let mut argv = vec![
            s(&input),
            "--block-size".into(),
            "8".into(),
            "-o".into(),
            s(&out),
        ];
        let mut engine: Vec<String> = ENGINE.iter().map(|f| f.to_string()).collect();
        if let Some(t) = &tokenizer {
            argv.extend(["--tokenizer".to_string(), t.clone()]);
            engine.extend(["--tokenizer".to_string(), t.clone()]);
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        loadgen::convert::convert(&args::<ConvertArgs>(&argv))?;
        let lengths: Vec<u64> = std::fs::read_to_string(&out)?
            .lines()
            .map(|l| {
                let row: serde_json::Value = serde_json::from_str(l).expect("a JSON row");
                row["input_length"].as_u64().expect("an input length")
            })
            .collect();
        let mut bench = vec!["bench".to_string()];
        bench.extend(engine);
        let bench: Vec<&str> = bench.iter().map(String::as_str).collect();
        let Command::Bench(a) = command(&bench) else {
            unreachable!()
        };
        let spec = a
            .run
            .target
            .spec(&loadgen::target::EmbeddedOptions::default())?;
        let target = within(30, spec.connect(loadgen::target::Api::Chat)).await??;
        let client = reqwest::Client::new();
        let mut served = Vec::new();
        for body in &bodies {
            let mut body = body.clone();
            body["model"] = serde_json::json!(target.model);
            let answer: serde_json::Value = within(
                30,
                client
                    .post(format!("{}/v1/chat/completions", target.url))
                    .json(&body)
                    .send(),
            )
            .await??
            .json()
            .await?;
            served.push(
                answer["usage"]["prompt_tokens"]
                    .as_u64()
                    .with_context(|| format!("usage.prompt_tokens in {answer}"))?,
            );
        }
        target.shutdown().await;
        assert_eq!(lengths, served, "tokenizer {tokenizer:?}");
        let _ = std::fs::remove_file(&out);
    }
    let _ = std::fs::remove_file(&input);
    Ok(())
}

/// Through the command line: a malformed line is an error naming the file and the line; an
/// empty input is an error of its own; nothing is written either way.
#[test]
fn the_command_line_names_the_bad_line_and_refuses_an_empty_input() -> Result<()> {
    let tmp = TempDir::new("loadgen-convert")?;
    let input = tmp.join("bad.jsonl");
    let out = tmp.join("bad-out.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"timestamp":0,"request":{"model":"m","messages":[{"role":"user","content":"hi"}]},"output_tokens":1}"#,
            "\n\n",
            r#"{"timestamp":"noon","request":{"model":"m","messages":[]}}"#,
            "\n"
        ),
    )?;
    let run = |argv: &[&str]| {
        loadgen::run(cli(&[&["trace", "convert"], argv].concat()).expect("valid flags"))
    };
    let err = run(&[&s(&input), "--block-size", "4", "-o", &s(&out)]).expect_err("bad line");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:3: \"timestamp\" must be a number of milliseconds, got \"noon\"",
            s(&input)
        )
    );
    assert_eq!(err.exit_code(), 1);
    assert!(!out.exists());
    std::fs::write(&input, "\n \n")?;
    let err = run(&[&s(&input), "--block-size", "4", "-o", &s(&out)]).expect_err("empty");
    assert_eq!(
        err.to_string(),
        format!(
            "{}: no requests to convert (the file is empty or blank)",
            s(&input)
        )
    );
    assert!(!out.exists());
    let _ = std::fs::remove_file(&input);
    Ok(())
}
