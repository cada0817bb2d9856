//! Prefix caching across turns and speculative prefill.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use mock_server::config::ReasoningFormat;
use mock_server::text::{default_codec, ChatMessage};
use serde_json::json;
use tokio::time::Instant;

use crate::common::*;

#[tokio::test]
async fn next_turn_hits_the_prefix_cache() -> Result<()> {
    let server = TestServer::start(config(None)).await?;
    let stream =
        json!({"stream": true, "max_tokens": 20, "stream_options": {"include_usage": true}});
    let turn1_msgs = json!([user(&long_question())]);
    let turn1 = stream_chat(&server, &chat_body(&turn1_msgs, stream.clone())).await?;
    let turn2_msgs = json!([
        user(&long_question()),
        {"role": "assistant", "content": turn1.content},
        user("and then?"),
    ]);
    let turn2 = stream_chat(&server, &chat_body(&turn2_msgs, stream)).await?;
    let cached = turn2.usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .context("cached")?;
    let turn1_len = turn1.usage["total_tokens"].as_u64().context("total")?;
    // Everything of turn 1 in full blocks, prompt and answer, is reused.
    let block = BLOCK_SIZE as u64;
    assert!(
        cached >= (turn1_len - 1) / block * block,
        "{cached} of {turn1_len}"
    );
    Ok(())
}

#[tokio::test]
async fn speculative_prefill_warms_the_whole_conversation() -> Result<()> {
    // Half of each answer is reasoning, which the template drops from history: without
    // speculative prefill the next turn reuses only turn 1's prompt.
    let mut cfg = config(None);
    cfg.reasoning_ratio = 0.5;
    cfg.reasoning_format = ReasoningFormat::Separate;
    let server = TestServer::start(cfg).await?;
    let block = BLOCK_SIZE as u64;
    for (question, spec) in [("first", false), ("second", true)] {
        let q = format!("{question} {}", long_question());
        let extra = json!({"stream": true, "max_tokens": 40,
            "stream_options": {"include_usage": true},
            "nvext": {"agent_hints": {"speculative_prefill": spec}}});
        let turn1 = stream_chat(&server, &chat_body(&json!([user(&q)]), extra.clone())).await?;
        assert_eq!(default_codec().encode(&turn1.reasoning).len(), 20);
        let history = [
            ChatMessage::user(q.clone()),
            ChatMessage::assistant(turn1.content.clone()),
        ];
        let conversation = default_codec().render_chat(&history, false).len() as u64;
        let turn2_msgs = json!([user(&q), {"role": "assistant", "content": turn1.content},
                                user("go on")]);
        let turn2 = stream_chat(&server, &chat_body(&turn2_msgs, extra)).await?;
        let cached = turn2.usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .context("cached")?;
        let whole = conversation / block * block;
        if spec {
            assert!(cached >= whole, "{cached} < {whole}");
        } else {
            assert!(
                cached < whole,
                "{cached} >= {whole} without speculative prefill"
            );
        }
    }
    // Turn 1 and turn 2 of the second conversation both asked for it.
    let m = server.scrape().await?;
    assert_eq!(
        m.get("servesim_speculative_prefill_submitted_total"),
        Some(&2.0)
    );
    Ok(())
}

/// Speculative prefill makes turn 2 faster by exactly what the latency model charges for the
/// prompt tokens it no longer computes.
#[tokio::test]
async fn speculative_prefill_cuts_ttft_as_the_model_predicts() -> Result<()> {
    use servesim::perf::{LatencyModel, Polynomial, PrefillBatch};
    // 4 ms per new prompt token (+5 ms per pass), 1 ms per decode step: big, clean differences.
    let model = Polynomial {
        prefill: [0.0, 4.0, 5.0],
        decode: [0.0, 0.0, 1.0],
    };
    let mut cfg = config(None);
    cfg.cluster.engine.latency.model = Arc::new(model);
    cfg.cluster.engine.latency.speedup_ratio = 1.0;
    cfg.reasoning_ratio = 0.5;
    let server = TestServer::start(cfg).await?;
    let idle = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let live = within(server.state.engine.snapshot()).await??;
            if live.cluster.active_requests == 0 {
                return Ok::<(), anyhow::Error>(());
            }
            if Instant::now() > deadline {
                bail!("engine never idle: {live:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let mut diffs = Vec::new();
    let mut predicted = Vec::new();
    for round in 0..3 {
        // (prompt tokens, cached tokens, TTFT in ms) of turn 2 without and with the hint, TTFT
        // from the engine's stamps (`nvext.timing`), so no host delay enters the comparison.
        let mut turn2 = Vec::new();
        for spec in [false, true] {
            let q = format!("round{round} spec{spec} {}", long_question());
            let extra = json!({"stream": true, "max_tokens": 40,
                "stream_options": {"include_usage": true},
                "nvext": {"agent_hints": {"speculative_prefill": spec}}});
            let turn1 = stream_chat(&server, &chat_body(&json!([user(&q)]), extra.clone())).await?;
            idle().await?;
            let msgs = json!([user(&q), {"role": "assistant", "content": turn1.content},
                              user("go on")]);
            let extra = json!({"stream": true, "max_tokens": 2,
                "stream_options": {"include_usage": true},
                "nvext": {"extra_fields": ["timing"]}});
            let t = stream_chat(&server, &chat_body(&msgs, extra)).await?;
            idle().await?;
            let prompt = t.usage["prompt_tokens"].as_u64().context("prompt")? as usize;
            let cached = t.usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .context("cached")? as usize;
            let ttft_ms = t.nvext["timing"]["ttft_ms"].as_f64().context("ttft")?;
            // The client cannot see its first token before the engine emitted it.
            assert!(
                t.token_times[0].as_secs_f64() * 1e3 >= ttft_ms,
                "{}",
                t.nvext
            );
            turn2.push((prompt, cached, ttft_ms));
        }
        let (without, with) = (turn2[0], turn2[1]);
        assert!(with.1 > without.1, "cached {} <= {}", with.1, without.1);
        let ms = |(prompt, cached, _): (usize, usize, f64)| {
            model.prefill_ms(&PrefillBatch {
                num_requests: 1,
                total_isl: prompt,
                total_prefix: cached,
            })
        };
        predicted.push(ms(without) - ms(with));
        diffs.push(without.2 - with.2);
    }
    let expected = predicted.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(
        expected >= 40.0,
        "predicted saving {expected} ms is too small to test"
    );
    // The engine's stamps: the saving is the model's, up to the microsecond rounding of each
    // pass, whatever the host's load.
    for (d, p) in diffs.iter().zip(&predicted) {
        assert!(
            (d - p).abs() <= 0.01,
            "TTFT saved {diffs:?} ms, the model predicts {predicted:?} ms"
        );
    }
    Ok(())
}
