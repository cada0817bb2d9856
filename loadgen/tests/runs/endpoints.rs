//! `--endpoint responses|messages|embeddings` against the embedded mockserve: the same token
//! accounting as chat on the same workload (multiturn and bench, request by request), cached
//! tokens over a `previous_response_id` chain, and embeddings' latency-only records.

use anyhow::Result;
use loadgen::multiturn_report::{RawResult, Results};
use loadgen::Command;

use crate::common::{command, within};

/// Runs `loadgen multiturn` on the embedded server (2 users, 3 turns, no think time, exact
/// counts) with `extra` flags; every request must succeed.
async fn multiturn(extra: &[&str]) -> Result<Results> {
    let mut argv = vec![
        "multiturn",
        "--num-users",
        "2",
        "--num-turns",
        "3",
        "--num-user-tokens",
        "40",
        "--max-completion-tokens",
        "12",
        "--mean-delay-ms",
        "0",
        "--speedup-ratio",
        "inf",
    ];
    argv.extend_from_slice(extra);
    let Command::Multiturn(args) = command(&argv) else {
        anyhow::bail!("not multiturn");
    };
    let config = args.config()?;
    let results = within(60, loadgen::multiturn::multiturn(&config)).await??;
    assert_eq!(
        results.failures.total, 0,
        "{extra:?}: {:?}",
        results.failures
    );
    assert_eq!(results.successful_requests, 6, "{extra:?}");
    Ok(results)
}

/// (user, turn, prompt, output, cached tokens) of a multiturn request.
type Turn = (usize, usize, Option<u64>, u64, Option<u64>);

/// The accounting of every request, by user and turn.
fn accounting(results: &Results) -> Vec<Turn> {
    let mut rows: Vec<_> = results
        .raw_results
        .iter()
        .map(|r: &RawResult| {
            (
                r.user_id,
                r.turn,
                r.prompt_tokens,
                r.output_tokens,
                r.cached_tokens,
            )
        })
        .collect();
    rows.sort();
    rows
}

/// Responses (resending the history) and Messages count the prompt, output and cached tokens
/// of every turn as chat does; over a `previous_response_id` chain the prompts are the same
/// and the later turns hit the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_conversation_api_counts_tokens_as_chat_does() -> Result<()> {
    let chat = accounting(&multiturn(&["--endpoint", "chat"]).await?);
    assert!(chat
        .iter()
        .all(|r| r.2.is_some_and(|p| p > 40) && r.3 == 12));
    assert!(chat.iter().any(|r| r.4.is_some_and(|c| c > 0)), "{chat:?}");
    let responses = accounting(&multiturn(&["--endpoint", "responses"]).await?);
    assert_eq!(responses, chat, "--endpoint responses");
    let chained = multiturn(&[
        "--endpoint",
        "responses",
        "--responses-history",
        "previous-id",
    ])
    .await?;
    assert_eq!(accounting(&chained), chat, "previous-id");
    for r in chained.raw_results.iter().filter(|r| r.turn > 0) {
        assert!(r.cached_tokens.is_some_and(|c| c > 0), "{r:?}");
    }
    let messages = accounting(&multiturn(&["--endpoint", "messages"]).await?);
    assert_eq!(messages, chat, "--endpoint messages");
    Ok(())
}

/// (request, prompt, output, cached tokens) of a bench request.
type Row = (u64, Option<u64>, u64, Option<u64>);

/// Runs `loadgen bench` on the embedded server (5 requests of 300 tokens, 256 of them shared, 4 out) to `endpoint`;
/// every request must succeed.
async fn bench(endpoint: &str) -> Result<(Vec<Row>, loadgen::bench::BenchRun)> {
    let argv = [
        "bench",
        "--quiet",
        "--speedup-ratio",
        "inf",
        "--num-requests",
        "5",
        "--request-rate",
        "50",
        "--input-tokens",
        "300",
        "--output-tokens",
        "4",
        "--shared-prefix-tokens",
        "256",
        "--endpoint",
        endpoint,
    ];
    let Command::Bench(args) = command(&argv) else {
        anyhow::bail!("not bench");
    };
    let run = within(60, loadgen::bench::bench(&args)).await??;
    assert_eq!(
        run.live.failures.total, 0,
        "{endpoint}: {:?}",
        run.live.failures
    );
    let mut rows: Vec<Row> = run
        .live
        .records
        .iter()
        .map(|r| {
            let raw = &r.raw;
            (
                r.record.request_id,
                r.prompt_tokens,
                raw.output_tokens,
                raw.cached_tokens,
            )
        })
        .collect();
    rows.sort();
    Ok((rows, run))
}

/// bench (and so sweep and replay, which build their bodies alike) counts the same prompt,
/// output and cached tokens of every request on chat, Responses and Messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_counts_tokens_alike_on_every_route() -> Result<()> {
    let (chat, _) = bench("chat").await?;
    assert!(chat.iter().all(|r| r.2 == 4));
    assert!(chat.iter().any(|r| r.3.is_some_and(|c| c > 0)), "{chat:?}");
    for endpoint in ["responses", "messages"] {
        assert_eq!(bench(endpoint).await?.0, chat, "--endpoint {endpoint}");
    }
    Ok(())
}

/// Embeddings: every request succeeds with its prompt counted, no output tokens and no
/// inter-token gaps; TTFT is the whole latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embeddings_are_latency_only() -> Result<()> {
    let results = multiturn(&["--endpoint", "embeddings"]).await?;
    for r in &results.raw_results {
        assert_eq!((r.output_tokens, r.chunks), (0, 0), "{r:?}");
        assert!(r.prompt_tokens.is_some_and(|p| p > 40), "{r:?}");
        assert_eq!(r.first_answer_us, r.ttft_any_us);
    }
    assert!(results.aggregate_inter_chunk.is_none());

    // bench: a raw prompt embeds to as many tokens as it completes with.
    let (completions, _) = bench("completions").await?;
    let (embeddings, run) = bench("embeddings").await?;
    let prompts = |rows: &[Row]| -> Vec<_> { rows.iter().map(|r| (r.0, r.1)).collect() };
    assert_eq!(prompts(&embeddings), prompts(&completions));
    assert!(embeddings.iter().all(|r| r.2 == 0));
    assert!(run.live.records.iter().all(|r| r.record.itl_ms.is_none()));
    assert_eq!(run.live.report.total_output_tokens, 0);
    let text = run.live.report.to_string();
    assert!(
        text.contains("(no output tokens: no TTST, TPOT or ITL)"),
        "{text}"
    );
    let report = serde_json::to_value(&run.live.report)?;
    assert!(!report.to_string().contains("NaN"), "{report}");
    Ok(())
}
