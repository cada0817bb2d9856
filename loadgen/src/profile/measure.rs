//! The measuring half of `loadgen profile`: the client overhead, the prefill points and the
//! decode points, against a connected target.

use tokio::time::Instant;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;

use super::fit::{median, DecodePoint, Measurements, PrefillPoint};
use super::{PrefillMethod, ProfilePlan};
use crate::run::client::{self, Endpoint, FirstToken, Response};
use crate::run::failure::Failure;
use crate::run::prompt::PromptSynth;
use crate::run::target::{completion_body, Connected};

/// A run that stopped early: what was measured, and why it stopped.
pub(crate) type Interrupted = (Measurements, String);

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
pub(crate) async fn run(c: &Connected, plan: &ProfilePlan) -> Result<Measurements, Interrupted> {
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
            crate::stdout::errln!("profile: {line}");
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
        let mut decode_gap_ms = Vec::new();
        let mut prompt_tokens = isl;
        // The decode stream the prefills delay (decode-gap), reset for every prompt length.
        let background = match plan.prefill_from {
            PrefillMethod::Ttft => None,
            PrefillMethod::DecodeGap => Some(
                Background::start(c, prompts.next(64))
                    .await
                    .map_err(|e| (m.clone(), e))?,
            ),
        };
        for _ in 0..plan.prefill_samples {
            let body = completion_body(&c.model, prompts.next(isl), 1);
            let sent_us = background.as_ref().map(Background::now_us);
            let r = client::send(&c.endpoint, &body).await;
            let ttft = checked(&r, &format!("prefill request ({isl} tokens)"));
            let ttft = match ttft {
                Ok(t) => t,
                Err(e) => {
                    if let Some(b) = background {
                        b.stop();
                    }
                    return Err((m.clone(), e));
                }
            };
            ttft_ms.push(ttft);
            prompt_tokens = r.prompt_tokens.map_or(isl, |n| n as usize);
            if let (Some(b), Some(sent_us)) = (&background, sent_us) {
                let first_us = sent_us + (ttft * 1000.0) as u64;
                match b.delay_ms(sent_us, first_us).await {
                    Ok(d) => decode_gap_ms.push(d),
                    Err(e) => {
                        if let Some(b) = background {
                            b.stop();
                        }
                        return Err((m.clone(), e));
                    }
                }
            }
        }
        if let Some(b) = background {
            b.stop();
        }
        let prefill_ms = match plan.prefill_from {
            PrefillMethod::Ttft => median(&ttft_ms) - m.client_overhead_ms,
            PrefillMethod::DecodeGap => median(&decode_gap_ms),
        };
        progress(format!(
            "[{done}/{total}] prefill {prompt_tokens} tokens: TTFT {:.3} ms, prefill {prefill_ms:.3} ms",
            median(&ttft_ms)
        ));
        m.prefill.push(PrefillPoint {
            isl,
            prompt_tokens,
            ttft_ms,
            prefill_ms,
            decode_gap_ms,
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

/// A long decode stream whose token arrival times are recorded as they come (`decode-gap`):
/// a prefill scheduled beside it lengthens the gap in which it runs by the prefill time.
struct Background {
    /// The common clock of the stream's times and the prefill requests' send times.
    t0: Instant,
    /// Arrival of every token event, µs from `t0`. Locked only to push or copy, never across
    /// an await.
    times: Arc<Mutex<Vec<u64>>>,
    /// The reader; aborting it drops the connection, which cancels the request.
    task: tokio::task::JoinHandle<Result<(), String>>,
}

/// Tokens the background stream asks for: far more than a profile point needs (it is dropped
/// when the point is done).
const BACKGROUND_TOKENS: usize = 100_000;

/// Gaps of the background stream before a prefill that make its baseline.
const BASELINE_GAPS: usize = 8;

impl Background {
    /// Starts the stream and waits until it decodes steadily.
    async fn start(c: &Connected, prompt: String) -> Result<Background, String> {
        let t0 = Instant::now();
        let times = Arc::new(Mutex::new(Vec::new()));
        let body = completion_body(&c.model, prompt, BACKGROUND_TOKENS);
        let task = tokio::spawn(read_stream(c.endpoint.clone(), body, t0, times.clone()));
        let b = Background { t0, times, task };
        b.wait_for(BASELINE_GAPS + 2, Duration::from_secs(60))
            .await?;
        Ok(b)
    }

    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    fn snapshot(&self) -> Vec<u64> {
        // A poisoned lock only means the reader panicked; its times are still valid.
        match self.times.lock() {
            Ok(t) => t.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Waits until the stream has `n` tokens in all.
    async fn wait_for(&self, n: usize, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            if self.snapshot().len() >= n {
                return Ok(());
            }
            if self.task.is_finished() || Instant::now() > deadline {
                return Err(format!(
                    "the decode stream of --prefill-from decode-gap stopped or stalled after {}                      tokens",
                    self.snapshot().len()
                ));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The delay a prefill sent at `sent_us` whose first token came at `first_us` added to the
    /// stream: the excess over the baseline gap of the gaps ending in between (plus half a
    /// gap's slack for the client reading the two streams). Waits for a few tokens after it,
    /// which also lets the next sample start from a steady stream.
    async fn delay_ms(&self, sent_us: u64, first_us: u64) -> Result<f64, String> {
        let before = self.snapshot().iter().filter(|&&t| t <= first_us).count();
        self.wait_for(before + BASELINE_GAPS, Duration::from_secs(60))
            .await?;
        let times = self.snapshot();
        let gaps_before: Vec<f64> = times
            .windows(2)
            .filter(|w| w[1] <= sent_us)
            .map(|w| ms(w[1] - w[0]))
            .collect();
        let baseline = median(&gaps_before[gaps_before.len().saturating_sub(BASELINE_GAPS)..]);
        let slack_us = (baseline * 500.0) as u64;
        Ok(times
            .windows(2)
            .filter(|w| w[1] > sent_us && w[1] <= first_us + slack_us)
            .map(|w| (ms(w[1] - w[0]) - baseline).max(0.0))
            .sum())
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// The key every completion chunk with a token carries.
const TEXT_KEY: &[u8] = b"\"text\"";

/// Reads a streamed completion, stamping every token event's arrival (µs from `t0`).
async fn read_stream(
    endpoint: Endpoint,
    body: serde_json::Value,
    t0: Instant,
    times: Arc<Mutex<Vec<u64>>>,
) -> Result<(), String> {
    let mut request = endpoint.client.post(&endpoint.url).json(&body);
    if let Some(key) = &endpoint.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("HTTP {}", response.status()));
    }
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let bytes = chunk.map_err(|e| e.to_string())?;
        let now = t0.elapsed().as_micros() as u64;
        let events = bytes
            .windows(TEXT_KEY.len())
            .filter(|w| *w == TEXT_KEY)
            .count();
        // Short section, never across an await.
        let mut t = match times.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        t.extend(std::iter::repeat_n(now, events));
    }
    Ok(())
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
        .map(|(offset, r)| {
            r.timing
                .token_chunks_us
                .iter()
                .map(|t| offset + t)
                .collect()
        })
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
    use crate::run::client::{Timing, TokenSource};

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
                tool_calls: Vec::new(),
                response_id: None,
            },
        )
    }

    #[test]
    fn the_steady_window_runs_from_the_last_first_token_to_the_first_last_token() {
        // Stream A decodes every 10 ms from 100; stream B starts later (first token at 140) and
        // its steps are the same passes. A ends at 200, B at 240: the window is [140, 200].
        let a = stream(0, (0..=10).map(|k| 100_000 + 10_000 * k).collect(), 100);
        let b = stream(
            20_000,
            (0..=10).map(|k| 120_000 + 10_000 * k).collect(),
            300,
        );
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
