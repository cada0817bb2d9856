//! KV events over ZeroMQ, as vLLM publishes them, so that KV-aware routers outside the process
//! (Dynamo's standalone indexer, llm-d's precise prefix scorer) can index mockserve's caches.
//!
//! - [`KvEventsArgs`] are the flags; [`KvEventsConfig`] their validated value.
//! - [`KvEventPublisher`] owns one ZeroMQ PUB socket per simulated worker (the worker is the
//!   data-parallel rank: it publishes on the endpoint's port + rank) and, with a replay
//!   endpoint, one ROUTER socket per rank that serves missed batches.
//! - [`KvExport`] is what the live driver holds: the [`tokens::BlockTokens`] side table (the
//!   engine keeps hashes only) and the publisher. After every engine advance it turns the
//!   cluster's exported [`servesim::kv::KvEvent`]s into one [`wire::WireBatch`] per worker.
//!
//! Each message is three frames: the topic, the batch's sequence number (8 bytes big-endian,
//! from 0 per rank) and the MessagePack payload ([`wire::WireFormat`]). The driver encodes and
//! numbers each batch, keeps the last [`REPLAY_BUFFER`] per rank for replay, and hands it to the
//! rank's socket task through a bounded channel: when a subscriber is slow or a connect is
//! pending, batches beyond [`CHANNEL_CAPACITY`] are dropped and counted
//! (`servesim_kv_events_dropped`), never waited for, so the engine and the HTTP path never stall.
//! A subscriber sees the gap in the sequence numbers and can ask the replay socket for it.

pub mod tokens;
pub mod wire;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use clap::Args;
use servesim::cluster::Cluster;
use servesim::ids::RequestId;
use servesim::kv::KvEvent;
use servesim::time::SimTime;
use servesim::tokens::Token;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::metrics::{Metrics, WorkerLabel};
use tokens::{BlockTokens, LoraTag};
use wire::{WireBatch, WireFormat};

/// Batches kept per rank for replay (vLLM's buffer size).
pub const REPLAY_BUFFER: usize = 10_000;

/// Batches waiting for a rank's socket at most; more are dropped (and counted).
pub const CHANNEL_CAPACITY: usize = 4096;

/// The replay answer's end marker: -1 as an 8-byte signed big-endian integer.
pub const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// `mockserve serve` flags for publishing KV events.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
#[command(next_help_heading = "KV events")]
pub struct KvEventsArgs {
    /// Publish every worker's KV events on this ZeroMQ endpoint, as vLLM does (e.g.
    /// `tcp://*:5557`): `*` binds, a host connects; worker N publishes on the port + N.
    #[arg(long, value_name = "ENDPOINT")]
    pub kv_events_endpoint: Option<String>,

    /// Serve missed batches on this ZeroMQ ROUTER endpoint (port + N for worker N), e.g.
    /// `tcp://*:5600`.
    #[arg(long, value_name = "ENDPOINT", requires = "kv_events_endpoint")]
    pub kv_events_replay_endpoint: Option<String>,

    /// Topic frame of every message (vLLM's default is empty).
    #[arg(long, value_name = "TOPIC", default_value = "")]
    pub kv_events_topic: String,

    /// MessagePack encoding of the batches.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = WireFormat::Array)]
    pub kv_events_format: WireFormat,
}

impl KvEventsArgs {
    /// The validated configuration; None without `--kv-events-endpoint`.
    pub fn config(&self) -> Result<Option<KvEventsConfig>, KvEventsError> {
        let Some(endpoint) = &self.kv_events_endpoint else {
            return Ok(None);
        };
        Ok(Some(KvEventsConfig {
            endpoint: ZmqEndpoint::parse(endpoint)?,
            replay_endpoint: self
                .kv_events_replay_endpoint
                .as_deref()
                .map(ZmqEndpoint::parse)
                .transpose()?,
            topic: self.kv_events_topic.clone(),
            format: self.kv_events_format,
        }))
    }
}

/// Where and how KV events are published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsConfig {
    /// The PUB endpoint of rank 0.
    pub endpoint: ZmqEndpoint,
    /// The ROUTER endpoint of rank 0 for replay, if any.
    pub replay_endpoint: Option<ZmqEndpoint>,
    /// The topic frame.
    pub topic: String,
    /// The payload encoding.
    pub format: WireFormat,
}

/// Why KV events cannot be published.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// The endpoint is not `tcp://HOST:PORT`.
    #[error("invalid KV events endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// As given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The port of some rank is beyond 65535.
    #[error(
        "KV events endpoint {endpoint}: worker {rank} would publish on port {port}, beyond 65535"
    )]
    PortOverflow {
        /// As given.
        endpoint: String,
        /// The rank.
        rank: usize,
        /// Base port + rank.
        port: usize,
    },
    /// Binding failed (the port is in use, the address is not local, ...).
    #[error("cannot bind the KV events endpoint {endpoint}: {source}")]
    Bind {
        /// The rank's endpoint.
        endpoint: String,
        /// The socket's error.
        source: zeromq::ZmqError,
    },
}

/// A TCP ZeroMQ endpoint, bound (`*`, `0.0.0.0`, `::`) or connected (any other host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZmqEndpoint {
    /// As given (for messages).
    pub text: String,
    /// The host to bind or connect to (`*` already turned into an address).
    pub host: String,
    /// Rank 0's port.
    pub port: u16,
    /// Bind (`*` and the unspecified addresses) or connect.
    pub bind: bool,
}

impl ZmqEndpoint {
    /// Parses `tcp://HOST:PORT` (an IPv6 host in brackets).
    pub fn parse(text: &str) -> Result<ZmqEndpoint, KvEventsError> {
        let bad = |reason: &str| KvEventsError::BadEndpoint {
            endpoint: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = text
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("expected tcp://HOST:PORT (only TCP is supported)"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| bad("expected tcp://HOST:PORT"))?;
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port must be a number from 0 to 65535"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("the host is empty (use * to bind every interface)"));
        }
        let (host, bind) = match host {
            "*" | "0.0.0.0" => ("0.0.0.0".to_string(), true),
            "::" => ("[::]".to_string(), true),
            h if h.contains(':') => (format!("[{h}]"), false),
            h => (h.to_string(), false),
        };
        Ok(ZmqEndpoint {
            text: text.to_string(),
            host,
            port,
            bind,
        })
    }

    /// The endpoint of `rank`: the port offset by the rank (port 0 stays 0: any free port).
    pub fn for_rank(&self, rank: usize) -> Result<String, KvEventsError> {
        let port = if self.port == 0 {
            0
        } else {
            usize::from(self.port) + rank
        };
        if port > usize::from(u16::MAX) {
            return Err(KvEventsError::PortOverflow {
                endpoint: self.text.clone(),
                rank,
                port,
            });
        }
        Ok(format!("tcp://{}:{port}", self.host))
    }
}

/// The batches a rank published lately, for replay. A `std` mutex: held only to push or copy,
/// never across an await.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// One rank's sending side, held by the driver.
#[derive(Debug)]
struct Rank {
    /// The next batch's sequence number.
    next_seq: u64,
    /// To the rank's socket task.
    tx: mpsc::Sender<(u64, Bytes)>,
    /// Recent batches for the replay socket.
    replay: ReplayBuffer,
}

/// The ZeroMQ publishers of every rank. Dropping it stops their tasks and closes the sockets.
#[derive(Debug)]
pub struct KvEventPublisher {
    ranks: Vec<Rank>,
    format: WireFormat,
    metrics: Arc<Metrics>,
    /// Stops the replay tasks when the publisher goes.
    _stop: DropGuard,
}

impl KvEventPublisher {
    /// Binds (or starts connecting) one PUB socket per rank, and the replay sockets, on the
    /// current tokio runtime. Bind errors (a port in use) are returned here, before serving.
    pub async fn start(
        config: &KvEventsConfig,
        num_ranks: usize,
        metrics: Arc<Metrics>,
    ) -> Result<KvEventPublisher, KvEventsError> {
        let stop = CancellationToken::new();
        let mut ranks = Vec::with_capacity(num_ranks);
        for rank in 0..num_ranks {
            let endpoint = config.endpoint.for_rank(rank)?;
            let mut socket = zeromq::PubSocket::new();
            if config.endpoint.bind {
                bind(&mut socket, &endpoint).await?;
            }
            let replay: ReplayBuffer = Arc::default();
            if let Some(replay_endpoint) = &config.replay_endpoint {
                let endpoint = replay_endpoint.for_rank(rank)?;
                let mut router = zeromq::RouterSocket::new();
                if replay_endpoint.bind {
                    bind(&mut router, &endpoint).await?;
                    tokio::spawn(serve_replay(router, Arc::clone(&replay), stop.clone()));
                } else {
                    let replay = Arc::clone(&replay);
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            biased;
                            () = stop.cancelled() => {}
                            connected = router.connect(&endpoint) => if connected.is_ok() {
                                serve_replay(router, replay, stop).await;
                            } else {
                                eprintln!("mockserve: warning: cannot connect the KV events replay endpoint {endpoint}");
                            },
                        }
                    });
                }
            }
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            let connect = (!config.endpoint.bind).then_some(endpoint);
            tokio::spawn(publish(PublishTask {
                socket,
                connect,
                topic: Bytes::from(config.topic.clone().into_bytes()),
                rx,
                rank: rank as u32,
                metrics: Arc::clone(&metrics),
            }));
            ranks.push(Rank {
                next_seq: 0,
                tx,
                replay,
            });
        }
        Ok(KvEventPublisher {
            ranks,
            format: config.format,
            metrics,
            _stop: stop.drop_guard(),
        })
    }

    /// Numbers, encodes and queues one batch of `rank`; dropped (and counted) when the rank's
    /// queue is full. Never waits.
    pub fn publish(&mut self, rank: usize, batch: &WireBatch) {
        let Some(r) = self.ranks.get_mut(rank) else {
            return;
        };
        let seq = r.next_seq;
        r.next_seq += 1;
        let payload = Bytes::from(batch.encode(self.format));
        {
            // Short section, no await: push and trim.
            let mut replay = r.replay.lock().unwrap_or_else(|p| p.into_inner());
            replay.push_back((seq, payload.clone()));
            while replay.len() > REPLAY_BUFFER {
                replay.pop_front();
            }
        }
        if r.tx.try_send((seq, payload)).is_err() {
            self.metrics
                .kv_events_dropped
                .get_or_create(&WorkerLabel {
                    worker: rank as u32,
                })
                .inc();
        }
    }
}

/// What a rank's socket task owns.
struct PublishTask {
    socket: zeromq::PubSocket,
    /// The endpoint to connect to first (None: the socket is bound already).
    connect: Option<String>,
    topic: Bytes,
    rx: mpsc::Receiver<(u64, Bytes)>,
    rank: u32,
    metrics: Arc<Metrics>,
}

/// Sends a rank's batches until the driver drops its sender.
async fn publish(mut task: PublishTask) {
    if let Some(endpoint) = &task.connect {
        if let Err(e) = task.socket.connect(endpoint).await {
            eprintln!("mockserve: warning: cannot connect the KV events endpoint {endpoint}: {e}");
            return;
        }
    }
    let label = WorkerLabel { worker: task.rank };
    while let Some((seq, payload)) = task.rx.recv().await {
        let frames = vec![
            task.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        let Ok(message) = ZmqMessage::try_from(frames) else {
            continue;
        };
        match task.socket.send(message).await {
            Ok(()) => task.metrics.kv_events_published.get_or_create(&label).inc(),
            Err(_) => task.metrics.kv_events_dropped.get_or_create(&label).inc(),
        };
    }
}

/// Binds `socket` to `endpoint`; the error names the endpoint.
async fn bind(socket: &mut impl Socket, endpoint: &str) -> Result<(), KvEventsError> {
    socket
        .bind(endpoint)
        .await
        .map(drop)
        .map_err(|source| KvEventsError::Bind {
            endpoint: endpoint.to_string(),
            source,
        })
}

/// Answers replay requests: `[identity, (empty,) start_seq]` gets every buffered batch with
/// `seq >= start_seq` as `[identity, (empty,) seq, payload]`, then the end marker.
async fn serve_replay(
    mut router: zeromq::RouterSocket,
    replay: ReplayBuffer,
    stop: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            request = router.recv() => request,
        };
        let Ok(request) = request else {
            continue;
        };
        let frames = request.into_vec();
        let (identity, delimiter, start) = match frames.as_slice() {
            [id, start] => (id.clone(), false, start),
            [id, empty, start] if empty.is_empty() => (id.clone(), true, start),
            _ => continue,
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            continue;
        };
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Bytes)> = {
            // Short section, no await: copy out the wanted batches.
            let buffer = replay.lock().unwrap_or_else(|p| p.into_inner());
            buffer
                .iter()
                .filter(|(s, _)| *s >= start)
                .cloned()
                .collect()
        };
        let envelope = |seq: Bytes, payload: Bytes| {
            let mut frames = vec![identity.clone()];
            if delimiter {
                frames.push(Bytes::new());
            }
            frames.push(seq);
            frames.push(payload);
            ZmqMessage::try_from(frames)
        };
        for (seq, payload) in batches {
            if let Ok(m) = envelope(Bytes::copy_from_slice(&seq.to_be_bytes()), payload) {
                if router.send(m).await.is_err() {
                    break;
                }
            }
        }
        if let Ok(m) = envelope(Bytes::from_static(&END_OF_REPLAY), Bytes::new()) {
            let _ = router.send(m).await;
        }
    }
}

/// The driver's KV-event export: token bookkeeping plus the publisher.
#[derive(Debug)]
pub struct KvExport {
    /// Tokens behind each cacheable block.
    pub tokens: BlockTokens,
    /// Where batches go.
    pub sink: KvSink,
    /// Tokens per block.
    block_size: usize,
}

/// Where exported batches go: ZeroMQ, or a list (offline replay writes it as JSON lines).
#[derive(Debug)]
pub enum KvSink {
    /// Published on ZeroMQ sockets.
    Zmq(KvEventPublisher),
    /// Kept in memory: `(rank, batch)`.
    Collect(Vec<(u32, WireBatch)>),
    /// Written as JSON lines, one decoded batch a line (`mockserve replay --kv-events-jsonl`).
    Jsonl(JsonlSink),
}

/// A JSON-lines file of batches; the first write error is kept and stops further writes.
#[derive(Debug)]
pub struct JsonlSink {
    /// The file.
    pub out: std::io::BufWriter<std::fs::File>,
    /// The first error, reported when the run ends.
    pub error: Option<std::io::Error>,
}

impl JsonlSink {
    fn write(&mut self, batch: &WireBatch) {
        if self.error.is_some() {
            return;
        }
        use std::io::Write;
        let result = serde_json::to_writer(&mut self.out, batch)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = result {
            self.error = Some(e);
        }
    }

    /// Flushes the file; the first error of the run, if any.
    pub fn finish(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        match self.error.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        }
    }
}

impl KvExport {
    /// An export of the KV events of `cluster` (which starts keeping them) to `sink`.
    pub fn new(cluster: &mut Cluster, sink: KvSink) -> KvExport {
        cluster.export_kv_events();
        let block_size = cluster.block_size();
        KvExport {
            tokens: BlockTokens::new(cluster.workers().len(), block_size),
            sink,
            block_size,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Starts tracking a submitted request: its prompt tokens, the hashes the engine got for
    /// them, and its adapter.
    pub fn track(
        &mut self,
        id: RequestId,
        prompt: &servesim::request::Prompt,
        lora: Option<Arc<LoraTag>>,
    ) {
        let tokens: &[Token] = prompt.tokens.as_deref().unwrap_or_default();
        self.tokens
            .track_hashed(id, tokens, prompt.blocks.clone(), lora);
    }

    /// After an advance of `cluster` to `now` that emitted `outputs`: records the output
    /// tokens, then publishes the events the advance exported, one batch per worker, stamped
    /// `ts_seconds`.
    pub fn after_advance(
        &mut self,
        cluster: &mut Cluster,
        outputs: &[servesim::cluster::Output],
        now: SimTime,
        ts_seconds: f64,
    ) {
        for output in outputs {
            if let servesim::cluster::Output::Token { id, token, .. } = output {
                self.tokens.push_token(*id, *token);
            }
        }
        let events = cluster.drain_kv_events();
        self.publish_events(&events, ts_seconds);
        self.tokens.retire_until(now);
    }

    /// One batch per worker of `events`, in order.
    fn publish_events(&mut self, events: &[KvEvent], ts_seconds: f64) {
        if events.is_empty() {
            return;
        }
        let mut by_worker: BTreeMap<u32, Vec<wire::WireEvent>> = BTreeMap::new();
        for event in events {
            let wire = self.tokens.to_wire(event);
            by_worker.entry(event.worker.0).or_default().push(wire);
        }
        for (rank, events) in by_worker {
            let batch = WireBatch {
                ts: ts_seconds,
                events,
                data_parallel_rank: Some(rank),
            };
            match &mut self.sink {
                KvSink::Zmq(publisher) => publisher.publish(rank as usize, &batch),
                KvSink::Collect(list) => list.push((rank, batch)),
                KvSink::Jsonl(sink) => sink.write(&batch),
            }
        }
    }

    /// Stops tracking a request once the passes in progress on `cluster` have ended.
    pub fn release(&mut self, cluster: &Cluster, id: RequestId, now: SimTime) {
        let not_before = cluster
            .workers()
            .iter()
            .filter_map(|w| w.pass_end())
            .max()
            .unwrap_or(now)
            .max(now);
        self.tokens.release(id, not_before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_binds_and_hosts_connect() {
        let e = ZmqEndpoint::parse("tcp://*:5557").expect("valid");
        assert!(e.bind);
        assert_eq!(e.for_rank(3).expect("in range"), "tcp://0.0.0.0:5560");
        let e = ZmqEndpoint::parse("tcp://127.0.0.1:5557").expect("valid");
        assert!(!e.bind);
        assert_eq!(e.for_rank(0).expect("in range"), "tcp://127.0.0.1:5557");
        let e = ZmqEndpoint::parse("tcp://[::]:9").expect("valid");
        assert!(e.bind);
        assert_eq!(e.for_rank(1).expect("in range"), "tcp://[::]:10");
    }

    #[test]
    fn bad_endpoints_say_why() {
        for (bad, why) in [
            ("5557", "tcp://"),
            ("ipc:///tmp/x", "only TCP"),
            ("tcp://*", "HOST:PORT"),
            ("tcp://*:port", "port must be a number"),
            ("tcp://*:70000", "port must be a number"),
            ("tcp://:5557", "host is empty"),
        ] {
            let e = ZmqEndpoint::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
        let e = ZmqEndpoint::parse("tcp://*:65535").expect("valid");
        let overflow = e.for_rank(1).expect_err("beyond 65535").to_string();
        assert!(overflow.contains("65536"), "{overflow}");
    }
}
