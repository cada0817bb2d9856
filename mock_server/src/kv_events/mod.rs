//! KV events over ZeroMQ, as vLLM publishes them, so that KV-aware routers outside the process
//! (Dynamo's standalone indexer, llm-d's precise prefix scorer) can index mockserve's caches.
//!
//! - [`KvEventsArgs`] are the flags; [`KvEventsConfig`] their validated value.
//! - [`KvEventPublisher`] owns one ZeroMQ PUB socket per simulated worker (the worker is the
//!   data-parallel rank: it publishes on the endpoint's port + rank) and, with a replay
//!   endpoint, one ROUTER socket per rank that serves missed batches. Both speak ZMTP 3.0
//!   through `zmtp`, which explains why the `zeromq` crate's sockets are not used.
//! - `KvExport` is what the live driver holds: the `tokens::BlockTokens` side table (the
//!   engine keeps hashes only) and the publisher. After every engine advance it turns the
//!   cluster's exported [`servesim::kv::KvEvent`]s into one [`wire::WireBatch`] per worker.
//!
//! Each message is three frames: the topic, the batch's sequence number (8 bytes big-endian,
//! from 0 per rank) and the MessagePack payload ([`wire::WireFormat`]). The driver encodes and
//! numbers each batch, keeps the last [`REPLAY_BUFFER`] per rank (and at most
//! [`REPLAY_BUFFER_BYTES`] of payload) for replay, and queues it for every subscriber of the
//! rank whose subscription matches the topic (`peer`: decided when the subscription arrives,
//! so publishing looks at no subscription; a subscriber holds at most 256 of them and 16 KiB).
//!
//! Peers are isolated from each other, as libzmq's per-peer high-water mark isolates them in
//! vLLM: each subscriber has its own queue of at most [`PEER_QUEUE`] batches and
//! [`PEER_QUEUE_BYTES`], and its own task writing it. A subscriber that reads too slowly (or
//! not at all) loses its oldest queued batches, counted per worker in
//! `servesim_kv_events_dropped` and logged once per subscriber (and again with its total when
//! it leaves); the others, the engine and the HTTP path never wait for it. It sees the gap in
//! the sequence numbers and can ask the replay socket for it. Each replay client is answered
//! by its own task too, so one that stops reading delays only itself. A socket serves at most
//! `MAX_PEERS` connections at once; one that completes no handshake within 3 s, or a replay
//! client idle for 30 s, is closed so that its slot goes to the next peer.
//!
//! `--kv-events-faults` injects seeded faults on delivery (`faults`): batches dropped,
//! duplicated, reordered or delayed (a delayed batch waits on a task of its rank), while
//! numbering and the replay buffer stay exact; and publisher restarts, after which numbering
//! starts over at 0 with an empty replay buffer.
//!
//! With a `view::PublishedView` (`KvEventPublisher::with_view`, as `mockserve fleet` does)
//! every batch is also applied to it when it is sent (or replayed after it was not), so the
//! routing judge knows what the events announced at every arrival.

mod config;
mod export;
pub(crate) mod faults;
mod peer;
mod publisher;
mod replay;
mod socket;
pub(crate) mod tokens;
pub(crate) mod view;
pub mod wire;
pub(crate) mod zmtp;

pub use config::{KvEventsArgs, KvEventsConfig, KvEventsError, ZmqEndpoint};
pub(crate) use export::{JsonlSink, KvExport, KvSink};
pub use publisher::KvEventPublisher;
pub(crate) use publisher::RestartSwitch;

/// Batches kept per rank for replay (vLLM's buffer size).
pub const REPLAY_BUFFER: usize = 10_000;

/// Payload bytes kept per rank for replay at most (32 MiB): past it the oldest batches go even
/// below [`REPLAY_BUFFER`] batches, so long prompts (an 8,000-token batch is about 40 KB) do
/// not make the buffer hundreds of MB per worker.
pub const REPLAY_BUFFER_BYTES: usize = 32 << 20;

/// Batches a rank's `delay=MS` fault holds at most (past it a batch is dropped for every
/// subscriber and counted in `servesim_kv_events_dropped`): the delay's memory is bounded
/// whatever the event rate.
pub(crate) const LATE_QUEUE: usize = PEER_QUEUE;

/// Batches queued for one subscriber at most (its high-water mark); past it the subscriber's
/// oldest queued batch is dropped (and counted).
pub const PEER_QUEUE: usize = 4096;

/// Bytes of encoded batches queued for one subscriber at most (16 MiB); past it the oldest are
/// dropped as past [`PEER_QUEUE`]. Subscribers share the bytes of a batch, and a stalled one
/// holds the newest batches, so stalled subscribers together hold about this much.
pub const PEER_QUEUE_BYTES: usize = 16 << 20;

/// Connections one socket serves at once at most (subscribers of a PUB socket, clients of a
/// replay socket); a connection beyond is closed at once, and logged (at most once per 10 s).
pub(crate) const MAX_PEERS: usize = 256;

/// The replay answer's end marker: -1 as an 8-byte signed big-endian integer.
pub const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();
