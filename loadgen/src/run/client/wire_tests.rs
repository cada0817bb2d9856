//! Every wire end to end: recorded streams of each API read through the bounded SSE parser,
//! seeded properties over mutated bytes and mistyped events (never a panic, memory within the
//! bound, every outcome a success with tokens or a classified failure), and the headers and
//! bodies on a real socket.

use mock_server::test_kit::within;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::stream::{StreamState, MAX_TOOL_CALLS};
use super::*;

/// A chat stream: two tokens, usage with cached tokens.
const CHAT: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":\"length\"}]}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n",
    "data: [DONE]\n\n",
);

/// The same answer as OpenAI's Responses stream.
const RESPONSES: &str = concat!(
    "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n",
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"message\",\"id\":\"msg_1\"}}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"Hello\"}\n\n",
    "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\" world\"}\n\n",
    "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"\"}}\n\n",
    "event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":1,\"delta\":\"{}\"}\n\n",
    "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":9,\"input_tokens_details\":{\"cached_tokens\":4},\"output_tokens\":3}}}\n\n",
);

/// The same answer as Anthropic's Messages stream.
const MESSAGES: &str = concat!(
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":9,\"cache_read_input_tokens\":4,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: ping\ndata: {\"type\":\"ping\"}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" world\"}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":3}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
);

const STREAMS: [(Wire, &str); 3] = [
    (Wire::OpenAi, CHAT),
    (Wire::Responses, RESPONSES),
    (Wire::Messages, MESSAGES),
];

/// Reads `bytes` as a response body of `wire`, in reads of the given sizes, with a parser
/// bounded at `limit`; checks the parser's memory after every read.
fn read(wire: Wire, bytes: &[u8], splits: &[usize], limit: usize) -> Response {
    let mut parser = SseParser::with_limit(limit);
    let mut state = StreamState::new(Instant::now());
    let mut rest = bytes;
    let mut sizes = splits.iter().cycle();
    while !rest.is_empty() {
        let n = sizes
            .next()
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        let outcome = feed(wire, &mut parser, &mut state, piece);
        assert!(parser.buffered_bytes() <= 2 * parser.limit());
        if let Some(outcome) = outcome {
            return state.finish(outcome);
        }
    }
    let outcome = at_end(wire, &mut parser, &mut state);
    state.finish(outcome)
}

/// What holds of every outcome, whatever the bytes.
fn check_outcome(r: &Response, input_len: usize) {
    assert_eq!(r.timing.token_chunks_us.len() as u64, r.chunks);
    assert!(r.tool_calls.len() <= MAX_TOOL_CALLS);
    assert!(r.content.len() <= input_len);
    if r.failure.is_none() {
        assert!(r.chunks > 0, "a success carries a token");
        assert!(r.timing.first_token_us(FirstToken::Any).is_some());
    }
    match (r.output_tokens_source, r.usage_output_tokens) {
        (TokenSource::Usage, Some(u)) => assert_eq!(r.output_tokens, u),
        (TokenSource::Chunks, _) => assert_eq!(r.output_tokens, r.chunks),
        (TokenSource::Usage, None) => panic!("usage source without usage"),
    }
}

/// The three recorded streams give the same accounting: 2 answer tokens of text (plus a
/// tool call on Responses and Messages), 9 prompt tokens of which 4 cached, split anywhere.
#[test]
fn recorded_streams_of_every_api_read_alike() {
    for (wire, stream) in STREAMS {
        for splits in [&[usize::MAX][..], &[1], &[7, 3], &[64]] {
            let r = read(wire, stream.as_bytes(), splits, 1 << 20);
            assert_eq!(r.failure, None, "{wire:?}");
            assert_eq!(r.content, "Hello world", "{wire:?}");
            assert_eq!((r.prompt_tokens, r.cached_tokens), (Some(9), Some(4)));
            let tools = usize::from(wire != Wire::OpenAi);
            assert_eq!(r.tool_calls.len(), tools, "{wire:?}");
            assert_eq!(r.output_tokens, 2 + tools as u64, "{wire:?}");
            assert_eq!(r.output_tokens_source, TokenSource::Usage);
            check_outcome(&r, stream.len());
        }
        // Cut before its end event: a stream failure naming the event it waited for.
        let cut = &stream[..stream.len() - 20];
        let r = read(wire, cut.as_bytes(), &[usize::MAX], 1 << 20);
        let end = wire.end_event();
        assert_eq!(
            r.failure,
            Some(Failure::Stream(format!("ended before {end}"))),
            "{wire:?}"
        );
        // A line over the bound fails the request, never buffered whole.
        let r = read(wire, stream.as_bytes(), &[5], 64);
        assert_eq!(
            r.failure,
            Some(Failure::LineTooLong { limit: 64 }),
            "{wire:?}"
        );
    }
}

/// Property (seeded loop): mutated bytes of every recorded stream, read in random pieces with
/// small and large bounds, never panic, stay within the bound, and end as a success with
/// tokens or a classified failure.
#[test]
fn mutated_streams_never_panic_and_end_classified() {
    let mut rng = ChaCha8Rng::seed_from_u64(48);
    let mut kinds = std::collections::BTreeSet::new();
    for _ in 0..3000 {
        let (wire, stream) = STREAMS[rng.gen_range(0..STREAMS.len())];
        let mut bytes = stream.as_bytes().to_vec();
        for _ in 0..rng.gen_range(1..6) {
            let at = rng.gen_range(0..bytes.len().max(1));
            match rng.gen_range(0..6) {
                0 if !bytes.is_empty() => bytes[at] = rng.gen(),
                1 => bytes.insert(at.min(bytes.len()), rng.gen()),
                2 => {
                    let end = (at + rng.gen_range(1..40)).min(bytes.len());
                    bytes.drain(at.min(end)..end);
                }
                3 => {
                    let end = (at + rng.gen_range(1..200)).min(bytes.len());
                    let copy = bytes[at.min(end)..end].to_vec();
                    bytes.splice(at..at, copy);
                }
                4 => {
                    let run = vec![b'x'; rng.gen_range(1..400)];
                    bytes.splice(at.min(bytes.len())..at.min(bytes.len()), run);
                }
                _ => bytes.truncate(at),
            }
        }
        let splits: Vec<usize> = (0..4).map(|_| rng.gen_range(1..50)).collect();
        let limit = [32, 200, 1 << 20][rng.gen_range(0..3)];
        let r = read(wire, &bytes, &splits, limit);
        check_outcome(&r, bytes.len());
        kinds.insert(r.failure.as_ref().map_or("ok", Failure::kind));
    }
    // The mutations reach successes and each kind of stream failure.
    for kind in ["ok", "stream", "line_too_long", "empty_stream"] {
        assert!(kinds.contains(kind), "{kind} never reached: {kinds:?}");
    }
}

/// A random JSON value, nested at most `depth` deep.
fn random_value(rng: &mut ChaCha8Rng, depth: u32) -> Value {
    match rng.gen_range(0..if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen::<u64>()),
        3 => json!(-rng.gen_range(0..1000_i64)),
        4 => json!(rng.gen::<f64>() * 1e300),
        5 => json!(["", "x", "{", "response.completed", "message_stop"][rng.gen_range(0..5)]),
        6 => Value::Array((0..3).map(|_| random_value(rng, depth - 1)).collect()),
        _ => json!({"type": random_value(rng, depth - 1), "delta": random_value(rng, depth - 1)}),
    }
}

/// Replaces random members of `v` (its leaves and subtrees) with random values.
fn mistype(v: &mut Value, rng: &mut ChaCha8Rng) {
    match v {
        Value::Object(map) => {
            for (_, member) in map.iter_mut() {
                if rng.gen_range(0..4) == 0 {
                    *member = random_value(rng, 2);
                } else {
                    mistype(member, rng);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| mistype(i, rng)),
        _ => {}
    }
}

/// Property (seeded loop): every event of every recorded stream with members of the wrong
/// type (numbers for strings, huge and negative numbers, arrays for objects) is read without
/// a panic, and the outcome is classified.
#[test]
fn mistyped_events_never_panic() {
    let mut rng = ChaCha8Rng::seed_from_u64(4848);
    for _ in 0..1500 {
        let (wire, stream) = STREAMS[rng.gen_range(0..STREAMS.len())];
        let mut state = StreamState::new(Instant::now());
        let mut outcome = None;
        let mut input_len = 0;
        for data in stream.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let mut v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
            mistype(&mut v, &mut rng);
            let text = v.to_string();
            input_len += text.len();
            if let Err(f) = on_event(wire, &mut state, &text) {
                outcome = Some(Some(f));
                break;
            }
            if state.done {
                outcome = Some(None);
                break;
            }
        }
        let failure = outcome.unwrap_or(Some(Failure::Stream("cut".into())));
        check_outcome(&state.finish(failure), input_len);
    }
}

/// Serves one route on 127.0.0.1:0 answering `body` with `content_type`, after checking the
/// request's headers with `check`; returns the URL of the route.
async fn stub(
    path: &'static str,
    content_type: &'static str,
    body: String,
    check: fn(&axum::http::HeaderMap) -> bool,
) -> String {
    use axum::http::{HeaderMap, StatusCode};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = axum::Router::new().route(
        path,
        axum::routing::post(move |headers: HeaderMap| async move {
            if !check(&headers) {
                return (
                    StatusCode::UNAUTHORIZED,
                    [("content-type", "text/plain")],
                    String::new(),
                );
            }
            (StatusCode::OK, [("content-type", content_type)], body)
        }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}{path}")
}

fn endpoint(url: String, wire: Wire, max_line_bytes: usize) -> Endpoint {
    Endpoint {
        client: client(Duration::from_secs(10)).expect("client"),
        url,
        wire,
        api_key: Some("k".into()),
        max_line_bytes,
    }
}

/// Messages sends the key as `x-api-key` (no bearer) with `anthropic-version: 2023-06-01`; the
/// others send a bearer token.
#[tokio::test]
async fn each_wire_sends_its_own_headers() {
    let url = stub("/v1/messages", "text/event-stream", MESSAGES.into(), |h| {
        h.get("x-api-key").is_some_and(|v| v == "k")
            && h.get("anthropic-version")
                .is_some_and(|v| v == "2023-06-01")
            && h.get("authorization").is_none()
    })
    .await;
    let r = within(send(&endpoint(url, Wire::Messages, 1 << 20), &json!({})))
        .await
        .expect("bounded");
    assert_eq!((r.failure, r.output_tokens), (None, 3));
    let url = stub(
        "/v1/responses",
        "text/event-stream",
        RESPONSES.into(),
        |h| h.get("authorization").is_some_and(|v| v == "Bearer k") && h.get("x-api-key").is_none(),
    )
    .await;
    let r = within(send(&endpoint(url, Wire::Responses, 1 << 20), &json!({})))
        .await
        .expect("bounded");
    assert_eq!(r.failure, None);
    assert_eq!(r.response_id.as_deref(), Some("resp_1"));
}

/// An embeddings answer: one JSON body, TTFT its whole latency, no output tokens; a body over
/// `--max-line-bytes` fails as `body_too_long`.
#[tokio::test]
async fn embeddings_answers_are_read_whole_and_bounded() {
    let vector: Vec<f64> = vec![0.0625; 300];
    let body = json!({"object": "list", "model": "m",
        "data": [{"object": "embedding", "index": 0, "embedding": vector}],
        "usage": {"prompt_tokens": 12, "total_tokens": 12}})
    .to_string();
    let url = stub("/v1/embeddings", "application/json", body.clone(), |h| {
        h.get("authorization").is_some_and(|v| v == "Bearer k")
    })
    .await;
    let r = within(send(
        &endpoint(url.clone(), Wire::Embeddings, 1 << 20),
        &json!({}),
    ))
    .await
    .expect("bounded");
    assert_eq!(r.failure, None);
    assert_eq!(
        (r.prompt_tokens, r.output_tokens, r.chunks),
        (Some(12), 0, 0)
    );
    assert_eq!(r.timing.token_chunks_us, [r.timing.end_us]);
    assert_eq!(
        r.timing.first_token_us(FirstToken::Answer),
        Some(r.timing.end_us)
    );
    let limit = body.len() - 1;
    let r = within(send(&endpoint(url, Wire::Embeddings, limit), &json!({})))
        .await
        .expect("bounded");
    assert_eq!(r.failure, Some(Failure::BodyTooLong { limit }));
    assert_eq!(r.failure.as_ref().map(Failure::kind), Some("body_too_long"));
}
