//! The measuring half of `loadgen profile`: the client overhead, the prefill points and the
//! decode points, against a connected target.

use tokio::time::Instant;

use super::fit::{median, DecodePoint, Measurements, PrefillPoint};
use super::ProfilePlan;
use crate::client::{self, FirstToken, Response};
use crate::failure::Failure;
use crate::prompt::PromptSynth;
use crate::target::{completion_body, Connected};

/// A run that stopped early: what was measured, and why it stopped.
pub type Interrupted = (Measurements, String);

/// Distinct prompts for one run: each takes a fresh id, spelled in its first tokens, so no two
/// prompts share a block (and a rerun against a warm server does not hit the last run's cache).
struct Prompts {
    synth: PromptSynth,
    next_id: u64,
}

impl Prompts {
    fn new(c: &Connected, longest: usize) -> Prompts {
        let salt = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Prompts {
            synth: c.synth(longest.max(1)),
            next_id: salt.rotate_left(17) | 1,
        }
    }

    fn next(&mut self, tokens: usize) -> String {
        self.next_id = self.next_id.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let pieces = self.synth.prompt_pieces(&[self.next_id], tokens);
        self.synth.text(&pieces)
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Measures every point of `plan`; on a failed request, the points measured so far and the
/// reason. Points the time budget leaves no room for are skipped with a warning.
pub async fn run(c: &Connected, plan: &ProfilePlan) -> Result<Measurements, Interrupted> {
    let started = Instant::now();
    let longest = plan
        .prefill_isl
        .iter()
        .chain(plan.decode.iter().map(|(_, ctx)| ctx))
        .copied()
        .max()
        .unwrap_or(1);
    let mut prompts = Prompts::new(c, longest);
    let mut m = Measurements::default();
    let progress = |line: String| {
        if plan.progress {
            eprintln!("profile: {line}");
        }
    };

    // Client overhead: an empty prompt is refused (or answered) without running the model. The
    // first request also opens the connection, so it is not counted.
    let mut overhead = Vec::new();
    for i in 0..=plan.prefill_samples.max(5) {
        let r = client::send(&c.endpoint, &completion_body(&c.model, String::new(), 1)).await;
        match &r.failure {
            None | Some(Failure::Http { .. }) => {}
            Some(f) => return Err((m, format!("client overhead request: {f}"))),
        }
        if i > 0 {
            overhead.push(ms(r.timing.end_us));
        }
    }
    m.client_overhead_ms = median(&overhead);
    progress(format!("client overhead {:.3} ms", m.client_overhead_ms));

    let total = plan.prefill_isl.len() + plan.decode.len();
    let mut done = 0;
    for &isl in &plan.prefill_isl {
        done += 1;
        if started.elapsed() > plan.time_budget {
            progress(format!(
                "time budget spent: prefill point {isl} and later skipped"
            ));
            break;
        }
        let mut ttft_ms = Vec::new();
        let mut prompt_tokens = isl;
        for _ in 0..plan.prefill_samples {
            let body = completion_body(&c.model, prompts.next(isl), 1);
            let r = client::send(&c.endpoint, &body).await;
            let ttft = checked(&r, &format!("prefill request ({isl} tokens)"))
                .map_err(|e| (m.clone(), e))?;
            ttft_ms.push(ttft);
            prompt_tokens = r.prompt_tokens.map_or(isl, |n| n as usize);
        }
        let prefill_ms = median(&ttft_ms) - m.client_overhead_ms;
        progress(format!(
            "[{done}/{total}] prefill {prompt_tokens} tokens: TTFT {:.3} ms, prefill {prefill_ms:.3} ms",
            median(&ttft_ms)
        ));
        m.prefill.push(PrefillPoint {
            isl,
            prompt_tokens,
            ttft_ms,
            prefill_ms,
        });
    }

    for &(batch_size, context_length) in &plan.decode {
        done += 1;
        if started.elapsed() > plan.time_budget {
            progress(format!(
                "time budget spent: decode point batch {batch_size}, context {context_length} \
                 and later skipped"
            ));
            break;
        }
        let max_tokens = plan.stream_tokens(batch_size, context_length);
        let t0 = Instant::now();
        let mut tasks = Vec::with_capacity(batch_size);
        for _ in 0..batch_size {
            let endpoint = c.endpoint.clone();
            let body = completion_body(&c.model, prompts.next(context_length), max_tokens);
            tasks.push(tokio::spawn(async move {
                let offset_us = t0.elapsed().as_micros() as u64;
                (offset_us, client::send(&endpoint, &body).await)
            }));
        }
        let mut streams = Vec::with_capacity(batch_size);
        for task in tasks {
            let (offset_us, r) = task
                .await
                .map_err(|e| (m.clone(), format!("decode stream task: {e}")))?;
            let what = format!("decode stream (batch {batch_size}, context {context_length})");
            checked(&r, &what).map_err(|e| (m.clone(), e))?;
            streams.push((offset_us, r));
        }
        match steady(&streams, context_length) {
            Some(point) => {
                progress(format!(
                    "[{done}/{total}] decode batch {batch_size}, context {context_length}: ITL \
                     {:.3} ms over {} gaps",
                    point.itl_ms, point.gaps
                ));
                m.decode.push(DecodePoint {
                    batch_size,
                    context_length,
                    ..point
                });
            }
            None => progress(format!(
                "[{done}/{total}] decode batch {batch_size}, context {context_length}: no steady \
                 part (the streams never all decoded at once; raise --decode-tokens or lower \
                 --prefill-chunk); point skipped"
            )),
        }
    }
    Ok(m)
}

/// The TTFT in ms of a successful response, or why it is unusable.
fn checked(r: &Response, what: &str) -> Result<f64, String> {
    if let Some(f) = &r.failure {
        return Err(format!("{what} failed: {f}"));
    }
    r.timing
        .first_token_us(FirstToken::Any)
        .map(ms)
        .ok_or_else(|| format!("{what} returned no token"))
}

/// The steady part of concurrent streams (each with its send offset from a common start): the
/// window from the last first token to the first last token. Its median gap, and the streams'
/// context at its middle. None when the window holds no gap.
fn steady(streams: &[(u64, Response)], context_length: usize) -> Option<DecodePoint> {
    let times: Vec<Vec<u64>> = streams
        .iter()
        .map(|(offset, r)| r.timing.token_chunks_us.iter().map(|t| offset + t).collect())
        .collect();
    let start = times.iter().map(|t| t.first().copied()).max()??;
    let end = times.iter().map(|t| t.last().copied()).min()??;
    if end <= start {
        return None;
    }
    let gaps: Vec<f64> = times
        .iter()
        .flat_map(|t| t.windows(2))
        .filter(|w| w[0] >= start && w[1] <= end)
        .map(|w| ms(w[1] - w[0]))
        .collect();
    if gaps.is_empty() {
        return None;
    }
    let mid = start + (end - start) / 2;
    let contexts: Vec<f64> = streams
        .iter()
        .zip(&times)
        .map(|((_, r), t)| {
            let prompt = r.prompt_tokens.map_or(context_length, |n| n as usize);
            (prompt + t.iter().filter(|&&x| x <= mid).count()) as f64
        })
        .collect();
    let active_kv_tokens: f64 = contexts.iter().sum();
    Some(DecodePoint {
        batch_size: streams.len(),
        context_length,
        mean_context: active_kv_tokens / contexts.len() as f64,
        active_kv_tokens,
        itl_ms: median(&gaps),
        gaps: gaps.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Timing, TokenSource};

    fn stream(offset_us: u64, chunks_us: Vec<u64>, prompt: u64) -> (u64, Response) {
        (
            offset_us,
            Response {
                timing: Timing {
                    token_chunks_us: chunks_us,
                    ..Timing::default()
                },
                content: String::new(),
                output_tokens: 0,
                output_tokens_source: TokenSource::Chunks,
                chunks: 0,
                usage_output_tokens: None,
                usage_mismatch: false,
                prompt_tokens: Some(prompt),
                cached_tokens: None,
                failure: None,
                finish_reason: None,
                worker: None,
            },
        )
    }

    #[test]
    fn the_steady_window_runs_from_the_last_first_token_to_the_first_last_token() {
        // Stream A decodes every 10 ms from 100; stream B starts later (first token at 140) and
        // its steps are the same passes. A ends at 200, B at 240: the window is [140, 200].
        let a = stream(0, (0..=10).map(|k| 100_000 + 10_000 * k).collect(), 100);
        let b = stream(20_000, (0..=10).map(|k| 120_000 + 10_000 * k).collect(), 300);
        let p = steady(&[a, b], 100).expect("steady");
        // A: gaps 140..200 (6), B: gaps 140..200 (6); all 10 ms.
        assert_eq!(p.gaps, 12);
        assert_eq!(p.itl_ms, 10.0);
        // Middle 170: A has 8 tokens (100..170), B 4 (140..170).
        assert_eq!(p.active_kv_tokens, (100 + 8 + 300 + 4) as f64);
        assert_eq!(p.mean_context, 206.0);
        // Streams that never overlap have no steady part.
        let early = stream(0, vec![1_000, 2_000], 10);
        let late = stream(0, vec![5_000, 6_000], 10);
        assert!(steady(&[early, late], 10).is_none());
    }
}
