//! `mockserve`'s integration tests, one binary (one link) with a module per topic. In-process
//! servers listen on `127.0.0.1:0` and stop with the test; awaits are bounded by timeouts sized
//! for a loaded 2-core CI box, and no test asserts a tight wall-clock figure (those belong in
//! benchmarks; exact latencies are asserted on the engine's own stamps).

// Shared helpers: configs, request bodies, the in-process server, SSE and `/metrics` parsing.
mod common;

// What answers say: lengths, stops, tool calls, logprobs, JSON mode, n, echo, prompt batches.
mod answers;
// The work budget of one request: caps, bounded answers, a responsive server meanwhile.
mod budget;
// The `mockserve` binary and its command line: flags, smoke test, stdout closed early.
mod binary;
// Prefix caching across turns and speculative prefill.
mod cache;
// `/v1/embeddings`: shapes, deterministic unit vectors, dimensions, base64, the prefill pass,
// the caps.
mod embeddings;
// Refused and accepted requests: OpenAI error bodies, auth, the queue bound, oversize bodies.
mod errors;
// Fault injection: each type on the wire, header forcing, KV freed, seeded draws.
mod faults;
// `mockserve fleet`: N endpoints in one process, the manifest, pinning, the routing judge.
mod fleet;
// `mockserve fleet --elastic`: scale requests, model loads, drains that lose no request.
mod fleet_elastic;
// The live elastic fleet against the offline replay: the same judge, the same scale events.
mod fleet_elastic_live;
// Faults on fleet workers (down, slow, stalled, 503): on the wire, by schedule and admin route.
mod fleet_faults;
// The routing judge against a router of the test's own: every decision and sum exact; a fleet
// endpoint's prefix-cache reset is its own worker's.
mod judge;
// The HTTP edge over raw sockets: read timeouts, the connection cap, the shutdown drain.
mod http_edge;
// KV events over ZeroMQ: wire format, a live subscriber, replay.
mod kv_events;
// KV-event peers are isolated: a stalled subscriber or replay client holds back only itself.
mod peers;
// LoRA adapters, runtime loading, the loading delay, bad vLLM-worker flags.
mod lora;
// Requests the engine can never run, and a dead engine task.
mod liveness;
// Anthropic's Messages API: fields, the event sequence, chat's token counts, tools, errors.
mod messages;
// `GET /metrics`: the exposition parses and moves.
mod metrics;
// `/v1/responses`: events in order, chat's accounting, function calls, stored chains.
mod responses;
// `mockserve replay TRACE` parsed and run in-process: flags, the report and records, errors.
mod replay_cli;
// Dynamo's `nvext`: strict parsing, pinning, response worker ids and timing.
mod nvext;
// Starting up: sockets bound and port ranges checked before the address is printed, bad
// flags named, the idle timeout flag.
mod startup;
// vLLM's surface besides generation: tokenize, version, ping, model card, its metric set.
mod vllm;
// The streaming wire format, determinism, pacing and cancellation.
mod wire;
