//! What one request's outcome is: its [`Response`], the [`Timing`] of its stream, the tool calls
//! it streamed, and the rule that decides whether the server's usage is believed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::run::failure::Failure;

/// Most tokens one streamed chunk is assumed to carry before a server's `usage` is called into
/// question: servers batch tokens into chunks (stream intervals, speculative decoding), so usage
/// above the chunk count is normal, but not by more than this factor.
pub(crate) const MAX_TOKENS_PER_CHUNK: u64 = 32;

/// The warning line for `count` requests whose `usage.completion_tokens` contradicted their
/// streamed chunks (fewer tokens than chunks, or more than [`MAX_TOKENS_PER_CHUNK`] a chunk).
pub(crate) fn usage_warning(count: usize) -> String {
    format!(
        "WARNING: {count} requests reported usage.completion_tokens that contradicts the streamed chunks (fewer tokens than chunks, or more than {MAX_TOKENS_PER_CHUNK} per chunk); their counted chunks were used instead"
    )
}

/// True when `usage.completion_tokens` contradicts the `chunks` that carried tokens: fewer
/// tokens than chunks (every counted chunk carries at least one token) or more than
/// [`MAX_TOKENS_PER_CHUNK`] per chunk.
pub(crate) fn usage_disagrees(usage_tokens: u64, chunks: u64) -> bool {
    usage_tokens < chunks || usage_tokens > MAX_TOKENS_PER_CHUNK.saturating_mul(chunks)
}

/// Where `output_tokens` came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The server's `usage.completion_tokens`.
    Usage,
    /// Counted content/reasoning chunks (no usage chunk arrived).
    Chunks,
}

/// Which token a time-to-first-token counts to. Both are figures of one [`Timing`], computed in
/// one place ([`Timing::first_token_us`], and from the scheduled send
/// [`crate::run::driver::Sample::ttft_us`]) for every mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FirstToken {
    /// The first token of any kind: content, reasoning or completion text. The replay and bench
    /// reports' TTFT (`mockserve replay`'s key; AIPerf's and vLLM's TTFT).
    Any,
    /// The first answer (content) token, reasoning excluded: multiturn's TTFT (Dynamo's
    /// `multiturn_bench`; AIPerf's TTFO).
    Answer,
}

/// Everything measured about one request; times in µs from the send.
#[derive(Clone, Debug, Default)]
pub struct Timing {
    /// Response headers arrived.
    pub headers_us: Option<u64>,
    /// First SSE event arrived.
    pub first_chunk_us: Option<u64>,
    /// First reasoning token.
    pub first_reasoning_us: Option<u64>,
    /// First answer (content) token.
    pub first_answer_us: Option<u64>,
    /// Every chunk carrying a token (content or reasoning), in order.
    pub token_chunks_us: Vec<u64>,
    /// The stream ended (or the request failed).
    pub end_us: u64,
    /// The server's own TTFT, from its engine's submission (`nvext.timing.ttft_ms`, asked for
    /// with the worker id; mockserve's is the engine model's, free of HTTP and client cost).
    pub engine_ttft_ms: Option<f64>,
    /// The server's own submission-to-last-token time (`nvext.timing.total_time_ms`).
    pub engine_e2e_ms: Option<f64>,
}

impl Timing {
    /// Time from the send to the first token of `kind`; None when no such token came.
    pub(crate) fn first_token_us(&self, kind: FirstToken) -> Option<u64> {
        match kind {
            FirstToken::Any => self.token_chunks_us.first().copied(),
            FirstToken::Answer => self.first_answer_us,
        }
    }

    /// Per-request output throughput (tokens/s), as other tools define it: the output tokens
    /// after the first over the time from the first to the last token chunk. None with fewer
    /// than two tokens or no time between the first and last chunk.
    pub(crate) fn output_tokens_per_s(&self, output_tokens: u64) -> Option<f64> {
        let (first, last) = (self.token_chunks_us.first()?, self.token_chunks_us.last()?);
        let span_s = last.checked_sub(*first).filter(|&d| d > 0)? as f64 / 1e6;
        (output_tokens >= 2).then(|| (output_tokens - 1) as f64 / span_s)
    }
}

/// The outcome of one request.
#[derive(Clone, Debug)]
pub struct Response {
    /// Measured times.
    pub timing: Timing,
    /// Concatenated `delta.content` (what goes back into the history).
    pub content: String,
    /// Completion tokens: the server's usage, else (no usage, or usage that contradicts the
    /// chunks, see `usage_disagrees`) the counted token chunks.
    pub output_tokens: u64,
    /// Where `output_tokens` came from.
    pub output_tokens_source: TokenSource,
    /// Chunks that carried a token (content, reasoning or completion text).
    pub chunks: u64,
    /// `usage.completion_tokens` as the server sent it.
    pub usage_output_tokens: Option<u64>,
    /// The server's usage contradicts the counted chunks (and was not used).
    pub usage_mismatch: bool,
    /// `usage.prompt_tokens`, when sent.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens`, when sent.
    pub cached_tokens: Option<u64>,
    /// The last `finish_reason` the stream carried (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// The worker that served it, when the server said so (`nvext.worker_id`, asked for with
    /// `nvext.extra_fields`; the decode worker of a disaggregated pair).
    pub worker: Option<u32>,
    /// The tool calls the answer streamed (`delta.tool_calls`), pieced together by index.
    pub tool_calls: Vec<ToolCall>,
    /// The server's id of this response (Responses API), what `previous_response_id` names.
    pub response_id: Option<String>,
    /// None on success.
    pub failure: Option<Failure>,
}

/// One tool call of a streamed answer: its id, function name and the concatenated argument
/// text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    /// `id` (sent with the call's first delta).
    pub id: String,
    /// `function.name`.
    pub name: String,
    /// `function.arguments`, concatenated over the deltas.
    pub arguments: String,
}

impl ToolCall {
    /// The call as an assistant message's `tool_calls` entry.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_tolerance() {
        // Several tokens per chunk is normal; fewer tokens than chunks or far more are not.
        assert!(!usage_disagrees(3, 3));
        assert!(!usage_disagrees(96, 3));
        assert!(usage_disagrees(2, 3));
        assert!(usage_disagrees(1000, 3));
        assert!(usage_disagrees(1, 0));
        assert!(!usage_disagrees(0, 0));
    }
}
