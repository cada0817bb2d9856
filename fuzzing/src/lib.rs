//! Fuzzing for servesim: one property checker per input the project takes from outside, and a
//! seeded mutation runner that drives them on stable Rust.
//!
//! Every checker is a `fn(&[u8])` that panics only when a property is violated, so the same
//! function serves the stable [`runner`] (in `cargo test`), the libFuzzer targets under `fuzz/`
//! (`cargo +nightly fuzz run NAME`) and the replay of saved inputs:
//!
//! - [`http::chat_body`] / [`http::completions_body`]: a request body to `/v1/chat/completions`
//!   or `/v1/completions` gets an answer in time: never a 5xx (a 503 only while the engine stays
//!   alive), an OpenAI error body on every 4xx, a well-formed completion or SSE stream on a 200,
//!   and the engine still answers a small request afterwards.
//! - [`trace::trace_line`]: a Mooncake trace parses or fails naming a line; a parsed trace replays
//!   on a tiny cluster to the end, every request completed or rejected, the same way twice.
//! - [`graph::agentic_line`] / [`graph::weka_play`]: an agentic Mooncake or weka trace reads
//!   into a consistent request graph or fails naming a line; the graph's replay starts and
//!   hands out every node once.
//! - [`sse::sse_stream`]: loadgen's SSE parser gives the same events however the bytes are split,
//!   and holds no more than its bound.
//! - [`metrics::metrics_text`]: loadgen reads the same serving figures from any `/metrics` answer
//!   whether it parses every line or only those of the metrics it knows.
//! - [`zmtp::zmtp_frames`]: bytes from a peer of mockserve's KV-event sockets are closed on in
//!   time, cost a bounded heap and answer, and leave the sockets serving.
//! - [`tokenizer::prompt_text`]: the `tiktoken` encodings give tiktoken's own ids for any text
//!   (servesim splits ASCII text by hand and caches pieces), the same twice, and decode back.
//! - [`fleet::fleet_admin`]: a request to a `mockserve fleet`'s admin listener is refused
//!   without the key, costs no more than a body's budget, answers no 5xx, an OpenAI error with
//!   a short message or a bounded page of decisions, and the fleet still answers afterwards.
//!
//! The HTTP checkers also hold every body to a **cost budget** ([`cost::BODY_BUDGET`]): while
//! the server answers, its heap may grow by at most 64 MiB + 64 bytes per body byte + 32 per
//! answer byte (answers are at most 8 MiB), and the answer must be complete within 5 s + 1 s
//! per MiB of body. The heap is counted by this crate's global allocator ([`meter`]), per
//! server: each server's runtime threads and the thread that sends the request are charged to
//! its [`meter::Meter`], one input at a time, so other checks running at once do not count.
//! Growth past 4 times the heap budget of the body alone (2 GiB at least) aborts the process
//! with a message and the input, before a body built without bound takes the machine's memory.
//! [`costly::COSTLY_BODIES`] are bodies that can break the budget at full size, checked on a
//! server with mockserve's default limits; their scaled-down seeds are the `cost_*` files of
//! `fuzz/corpus/`, which the stable runner leaves to the cost test (`fuzzing/tests/fuzz/cost.rs`,
//! which runs the `servesim-fuzz-check` binary in child processes).
//!
//! [`TARGETS`] lists them with the tokens and field names the [`mutate::Mutator`] splices in.
//! [`runner::fuzz`] loads a seed corpus, mutates it with a seeded ChaCha generator for a time
//! budget and stops at the first violation with a [`runner::Finding`] that can be replayed.
//!
//! ```
//! use servesim_fuzzing::{sse, target};
//!
//! // A checker returns when the property holds (here: any split gives the same events).
//! sse::sse_stream(b"\x02\x03\x05data: a\n\ndata: [DONE]\n\n");
//! assert!(target("sse_stream").is_some());
//! assert!(target("no_such_target").is_none());
//! ```

pub mod cost;
pub mod costly;
pub mod fleet;
pub mod graph;
pub mod http;
pub mod meter;
pub mod metrics;
pub mod mutate;
pub mod runner;
pub mod sse;
pub mod targets;
pub mod tokenizer;
pub mod trace;
pub mod zmtp;

use std::path::PathBuf;

pub use targets::Target;

/// JSON tokens and awkward values shared by every JSON format.
const JSON_TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"false",
    b"\"\"",
    b"[]",
    b"{}",
    b"[\"\"]",
    b"[[]]",
    b"0",
    b"-1",
    b"-0",
    b"1e308",
    b"1e999",
    b"-1e999",
    b"NaN",
    b"Infinity",
    b"\"NaN\"",
    b"\"inf\"",
    b"18446744073709551615",
    b"18446744073709551616",
    b"-9223372036854775808",
    b"4294967296",
    b"9007199254740993",
    b"0.000001",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"\\",
    b"\xff",
    b"\xc3",
    b"\xe2\x80\xa8",
    b"\xef\xbb\xbf",
    b"\n",
    b"\r\n",
];

/// Request fields of both completion APIs, with Dynamo's `nvext`.
const REQUEST_FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "role",
    "content",
    "text",
    "type",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "include_usage",
    "n",
    "seed",
    "temperature",
    "top_p",
    "stop",
    "ignore_eos",
    "min_tokens",
    "tools",
    "tool_choice",
    "logprobs",
    "reasoning_content",
    "nvext",
    "agent_hints",
    "speculative_prefill",
    "backend_instance_id",
    "extra_fields",
    "worker_id",
    "timing",
    "priority",
    "osl",
    "token_data",
    "annotations",
    "cache_salt",
    "request_timestamp_ms",
];

/// Fields of a Mooncake trace row, aliases included.
const TRACE_FIELDS: &[&str] = &[
    "timestamp",
    "created_time",
    "input_length",
    "input_tokens",
    "output_length",
    "output_tokens",
    "hash_ids",
    "session_id",
    "delay",
    "delay_ms",
    "request_id",
];

/// Fields of agentic Mooncake rows and headers, and of weka plays and entries.
const AGENTIC_FIELDS: &[&str] = &[
    "schema",
    "version",
    "block_size",
    "request_id",
    "play_id",
    "session_id",
    "model",
    "input_length",
    "output_length",
    "output_token_ids",
    "hash_ids",
    "not_before_ms",
    "dependencies",
    "trigger",
    "relation",
    "delay_ms",
    "wait_for",
    "source_play_ordinal",
    "id",
    "hash_id_scope",
    "requests",
    "type",
    "t",
    "in",
    "out",
    "api_time",
    "agent_id",
    "subagent_type",
    "status",
    "duration_ms",
    "source",
    "nested_timestamp_basis",
];

/// SSE line prefixes, line ends and payloads a stream may hold.
const SSE_TOKENS: &[&[u8]] = &[
    b"data:",
    b"data: ",
    b"data: [DONE]\n\n",
    b"event: ",
    b"event: error\n",
    b"id: 1\n",
    b"retry: 10\n",
    b": keep-alive\n",
    b":",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"\r\n\r\n",
    b"\r\r",
    b"{\"error\":{\"message\":\"x\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
    b"{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}",
    b"\xef\xbb\xbf",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\0",
];

/// Metric names loadgen reads, label sets, values and separators of the Prometheus text format.
const METRICS_TOKENS: &[&[u8]] = &[
    b"vllm:num_requests_running",
    b"vllm:num_requests_waiting",
    b"vllm:kv_cache_usage_perc",
    b"vllm:prefix_cache_hits",
    b"vllm:prefix_cache_queries",
    b"vllm:num_preemptions",
    b"sglang:num_running_reqs",
    b"sglang:cache_hit_rate",
    b"dynamo_component_kvstats_gpu_cache_usage_percent",
    b"servesim_router_parked_requests",
    b"vllm:e2e_request_latency_seconds_bucket",
    b"_total",
    b"{engine=\"0\"}",
    b"{worker=\"1\",model_name=\"m\"}",
    b"{dp_rank=\"2\"}",
    b"{le=\"+Inf\"}",
    b"{}",
    b"{",
    b"}",
    b"=",
    b",",
    b"\"",
    b"\\",
    b"\\\"",
    b" ",
    b"\t",
    b"\n",
    b"\r\n",
    b"# HELP ",
    b"# TYPE ",
    b" 0",
    b" 1",
    b" 150",
    b" +Inf",
    b" -Inf",
    b" NaN",
    b" 1e308",
    b" -0.5",
    b" 1700000000",
    b"\xe2\x80\x83",
    b"\xc3\xa9",
    b"\xff",
    b"\0",
];

/// Text where pre-tokenizers split differently: contractions, digit runs, symbol runs before
/// line ends, every whitespace mix, letters of other cases and scripts, special-token strings.
const TEXT_TOKENS: &[&[u8]] = &[
    b"'s",
    b"'S",
    b"'re",
    b"'LL",
    b"'ve",
    b"'d",
    b"'m",
    b"'t",
    b"'x",
    b"'",
    b"123",
    b"1234567",
    b" ",
    b"  ",
    b"\t",
    b"\n",
    b"\r\n",
    b"\r",
    b"\x0b",
    b"\x0c",
    b" \n ",
    b"\n\n  ",
    b"!",
    b"...",
    b"/",
    b"//\n",
    b" (",
    b"HTTP",
    b"Hello",
    b"hello",
    b"aBc",
    b"\xc3\xa9",
    b"e\xcc\x81",
    b"\xc2\xa0",
    b"\xe6\x97\xa5\xe6\x9c\xac",
    b"\xf0\x9f\xa6\x80",
    b"\xc7\x85",
    b"<|im_start|>",
    b"<|endoftext|>",
    b"\0",
    b"\x7f",
    b"\xff",
];

/// Request lines, routes, query parameters, awkward indexes and fault bodies of the fleet's
/// admin listener.
const ADMIN_TOKENS: &[&[u8]] = &[
    b"GET ",
    b"POST ",
    b"DELETE ",
    b"!",
    b"/fleet/decisions",
    b"/fleet/manifest",
    b"/fleet/workers",
    b"/fleet/workers/1/fault",
    b"/fleet/workers/3/kv-events/restart",
    b"/metrics",
    b"/health",
    b"/fault",
    b"/kv-events/restart",
    b"?since=",
    b"&since=",
    b"?limit=",
    b"&limit=",
    b"&",
    b"=",
    b"%2B1",
    b"+1",
    b"-1",
    b"01",
    b"0000000000000000000000001",
    b"4",
    b"9999",
    b"10000",
    b"10001",
    b"24999",
    b"18446744073709551615",
    b"18446744073709551616",
    b"\n",
    b"\r\n",
    b"{\"state\":\"down\"}",
    b"{\"state\":\"slow\",\"factor\":4}",
    b"\"ok\"",
    b"\"503\"",
    b"\"stalled\"",
    b"\"slow\"",
    b"1e999",
    b"NaN",
    b"\xff",
];

/// ZMTP 3.0 pieces: greeting, commands, frame heads, subscriptions, replay requests.
const ZMTP_TOKENS: &[&[u8]] = &[
    b"\xff\0\0\0\0\0\0\0\x01\x7f\x03\x00NULL",
    b"\x04\x05READY",
    b"\x0bSocket-Type",
    b"\x04PING",
    b"\x09SUBSCRIBE",
    b"\x06CANCEL",
    b"\x00\x01\x01",
    b"\x00\x01\x00",
    b"\x00\x08",
    b"\x01\x00",
    b"\x02\x00\x00\x00\x00\x00\x01\x00\x00",
    b"\x06\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\x04\xff",
    b"\xff\xff\xff\xff\xff\xff\xff\xff",
    b"kv@fuzz",
    b"SUB",
    b"DEALER",
    b"REQ",
];

/// Every target, in a fixed order.
pub const TARGETS: [Target; 10] = [
    Target {
        name: "chat_body",
        check: http::chat_body,
        dictionary: JSON_TOKENS,
        fields: REQUEST_FIELDS,
        max_len: 96 << 10,
    },
    Target {
        name: "completions_body",
        check: http::completions_body,
        dictionary: JSON_TOKENS,
        fields: REQUEST_FIELDS,
        max_len: 96 << 10,
    },
    Target {
        name: "trace_line",
        check: trace::trace_line,
        dictionary: JSON_TOKENS,
        fields: TRACE_FIELDS,
        max_len: 32 << 10,
    },
    Target {
        name: "agentic_line",
        check: graph::agentic_line,
        dictionary: JSON_TOKENS,
        fields: AGENTIC_FIELDS,
        max_len: 32 << 10,
    },
    Target {
        name: "weka_play",
        check: graph::weka_play,
        dictionary: JSON_TOKENS,
        fields: AGENTIC_FIELDS,
        max_len: 32 << 10,
    },
    Target {
        name: "sse_stream",
        check: sse::sse_stream,
        dictionary: SSE_TOKENS,
        fields: &[],
        max_len: 64 << 10,
    },
    Target {
        name: "metrics_text",
        check: metrics::metrics_text,
        dictionary: METRICS_TOKENS,
        fields: &[],
        max_len: 64 << 10,
    },
    Target {
        name: "prompt_text",
        check: tokenizer::prompt_text,
        dictionary: TEXT_TOKENS,
        fields: &[],
        max_len: 4 << 10,
    },
    Target {
        name: "fleet_admin",
        check: fleet::fleet_admin,
        dictionary: ADMIN_TOKENS,
        fields: &["state", "factor"],
        max_len: 8 << 10,
    },
    Target {
        name: "zmtp_frames",
        check: zmtp::zmtp_frames,
        dictionary: ZMTP_TOKENS,
        fields: &[],
        max_len: 96 << 10,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The libFuzzer entry points of the target called `name`, for its binary under `fuzz/`
/// (which depends on `libfuzzer-sys`): the target's checker on every input, and a mutator that
/// leaves half the mutations to libFuzzer and makes the other half the target's own
/// structure-aware ones ([`mutate::mutate_in_place`]). A name not in [`TARGETS`] panics at the
/// first input.
#[macro_export]
macro_rules! libfuzzer_target {
    ($name:literal) => {
        libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            let target = $crate::target($name).expect("a known target");
            (target.check)(data)
        });

        libfuzzer_sys::fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
            if seed % 2 == 0 {
                libfuzzer_sys::fuzzer_mutate(data, size, max_size)
            } else {
                let target = $crate::target($name).expect("a known target");
                $crate::mutate::mutate_in_place(target, data, size, max_size, u64::from(seed))
            }
        });
    };
}

/// The `fuzz/` directory of the repository: `corpus/<target>/` holds the seed inputs,
/// `regressions/<target>/` the inputs that once violated a property.
pub fn fuzz_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz"))
}
