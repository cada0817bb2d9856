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
//! numbers each batch, keeps the last [`REPLAY_BUFFER`] per rank for replay, and queues it for
//! every subscriber of the rank whose subscription matches the topic.
//!
//! Peers are isolated from each other, as libzmq's per-peer high-water mark isolates them in
//! vLLM: each subscriber has its own queue of at most [`PEER_QUEUE`] batches and its own task
//! writing it. A subscriber that reads too slowly (or not at all) loses its oldest queued
//! batches, counted per worker in `servesim_kv_events_dropped` and logged once per subscriber
//! (and again with its total when it leaves); the others, the engine and the HTTP path never
//! wait for it. It sees the gap in the sequence numbers and can ask the replay socket for it.
//! Each replay client is answered by its own task too, so one that stops reading delays only
//! itself. A socket serves at most `MAX_PEERS` connections at once.
//!
//! `--kv-events-faults` injects seeded faults on delivery (`faults`): batches dropped,
//! duplicated, reordered or delayed (a delayed batch waits on a task of its rank), while
//! numbering and the replay buffer stay exact; and publisher restarts, after which numbering
//! starts over at 0 with an empty replay buffer.
//!
//! With a `view::PublishedView` (`KvEventPublisher::with_view`, as `mockserve fleet` does)
//! every batch is also applied to it when it is sent (or replayed after it was not), so the
//! routing judge knows what the events announced at every arrival.

pub(crate) mod faults;
pub(crate) mod tokens;
pub(crate) mod view;
pub mod wire;
pub(crate) mod zmtp;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use clap::Args;
use servesim::cluster::Cluster;
use servesim::ids::RequestId;
use servesim::kv::KvEvent;
use servesim::time::SimTime;
use servesim::tokens::Token;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::metrics::{KvFaultLabel, Metrics, WorkerLabel};
use faults::{EventFaults, Fault, RankFaults};
use tokens::{BlockTokens, LoraTag};
use view::{PublishedView, ViewDelta};
use wire::{WireBatch, WireFormat};
use zmtp::{Offer, Peer, Role};

/// Batches kept per rank for replay (vLLM's buffer size).
pub const REPLAY_BUFFER: usize = 10_000;

/// Batches a rank's `delay=MS` fault holds at most (past it a batch is dropped for every
/// subscriber and counted in `servesim_kv_events_dropped`): the delay's memory is bounded
/// whatever the event rate.
pub(crate) const LATE_QUEUE: usize = PEER_QUEUE;

/// Batches queued for one subscriber at most (its high-water mark); past it the subscriber's
/// oldest queued batch is dropped (and counted).
pub const PEER_QUEUE: usize = 4096;

/// Connections one socket serves at once at most (subscribers of a PUB socket, clients of a
/// replay socket); a connection beyond is closed at once.
pub(crate) const MAX_PEERS: usize = 256;

/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// First pause before reconnecting a socket that connects out; it doubles up to
/// [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);

/// Longest pause before reconnecting.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

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

    /// Seeded faults on delivery, to test a router's recovery: comma-separated drop=P,
    /// duplicate=P, reorder=P (per batch, 0 to 1), delay=MS (every batch, 0 to 60000) and
    /// seed=N, e.g. `drop=0.05,seed=1`. Numbering and replay stay exact: a dropped batch is a
    /// gap the replay endpoint fills.
    #[arg(long, value_name = "SPEC", requires = "kv_events_endpoint")]
    pub kv_events_faults: Option<EventFaults>,
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
            faults: self.kv_events_faults,
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
    /// Faults injected on delivery.
    pub faults: Option<EventFaults>,
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
    /// The port of the last rank is beyond 65535.
    #[error(
        "{flag} {endpoint}: worker {rank} would use port {port}, beyond 65535 (the port plus \
         the number of workers minus one must be at most 65535)"
    )]
    PortOverflow {
        /// The endpoint's flag.
        flag: &'static str,
        /// As given.
        endpoint: String,
        /// The rank.
        rank: usize,
        /// Base port + rank.
        port: usize,
    },
    /// The replay ports of some ranks are publish ports of others.
    #[error(
        "--kv-events-replay-endpoint {replay}: its ports {replay_first}..={replay_last} (one \
         per worker) overlap the publish ports {first}..={last} of --kv-events-endpoint \
         {endpoint}"
    )]
    PortCollision {
        /// The publish endpoint, as given.
        endpoint: String,
        /// Its first and last port.
        first: usize,
        /// Its last port.
        last: usize,
        /// The replay endpoint, as given.
        replay: String,
        /// Its first port.
        replay_first: usize,
        /// Its last port.
        replay_last: usize,
    },
    /// Binding failed (the port is in use, the address is not local, ...).
    #[error("{flag} {endpoint}: worker {rank} cannot bind {addr}: {error}")]
    Bind {
        /// The endpoint's flag.
        flag: &'static str,
        /// As given.
        endpoint: String,
        /// The rank.
        rank: usize,
        /// The address bound.
        addr: String,
        /// The socket's error (its text is part of this error's, so it is no `source`).
        error: std::io::Error,
    },
}

impl KvEventsConfig {
    /// Checks the port ranges `num_ranks` workers use: each endpoint's last port within 65535,
    /// and the replay ports apart from the publish ports. Port 0 (any free port) is exempt.
    pub(crate) fn check_ports(&self, num_ranks: usize) -> Result<(), KvEventsError> {
        let last_rank = num_ranks.saturating_sub(1);
        let range = |endpoint: &ZmqEndpoint, flag| {
            let first = usize::from(endpoint.port);
            let last = first + last_rank;
            if first != 0 && last > usize::from(u16::MAX) {
                return Err(KvEventsError::PortOverflow {
                    flag,
                    endpoint: endpoint.text.clone(),
                    rank: last_rank,
                    port: last,
                });
            }
            Ok((first, last))
        };
        let (first, last) = range(&self.endpoint, ENDPOINT_FLAG)?;
        let Some(replay) = &self.replay_endpoint else {
            return Ok(());
        };
        let (replay_first, replay_last) = range(replay, REPLAY_FLAG)?;
        let same_host = self.endpoint.host == replay.host || self.endpoint.bind || replay.bind;
        if first != 0
            && replay_first != 0
            && same_host
            && first <= replay_last
            && replay_first <= last
        {
            return Err(KvEventsError::PortCollision {
                endpoint: self.endpoint.text.clone(),
                first,
                last,
                replay: replay.text.clone(),
                replay_first,
                replay_last,
            });
        }
        Ok(())
    }
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
    pub(crate) fn for_rank(&self, rank: usize) -> Result<String, KvEventsError> {
        Ok(format!("tcp://{}", self.addr_for_rank(rank)?))
    }

    /// The `HOST:PORT` of `rank` (to bind or connect to).
    pub(crate) fn addr_for_rank(&self, rank: usize) -> Result<String, KvEventsError> {
        let port = if self.port == 0 {
            0
        } else {
            usize::from(self.port) + rank
        };
        if port > usize::from(u16::MAX) {
            return Err(KvEventsError::PortOverflow {
                flag: ENDPOINT_FLAG,
                endpoint: self.text.clone(),
                rank,
                port,
            });
        }
        Ok(format!("{}:{port}", self.host))
    }
}

/// The batches a rank published lately, for replay. A `std` mutex: held only to push or copy,
/// never across an await.
type ReplayBuffer = Arc<Mutex<ReplayState>>;

/// A rank's replay buffer and the view its replayed batches are announced to.
#[derive(Debug, Default)]
struct ReplayState {
    /// The latest batches, oldest first: number, payload, and what it announces (with a view).
    batches: VecDeque<(u64, Bytes, Option<Arc<ViewDelta>>)>,
    /// The view a batch served here is applied to if it was never sent live.
    view: Option<Arc<PublishedView>>,
}

/// What a sent batch announces, applied to the view when it leaves.
#[derive(Clone, Debug)]
struct Announce {
    /// Where.
    view: Arc<PublishedView>,
    /// The batch's changes.
    delta: Arc<ViewDelta>,
}

/// A batch on its way to the subscribers: its number, its encoded message and what it
/// announces (with a view).
#[derive(Clone, Debug)]
struct Outgoing {
    /// The batch's sequence number.
    seq: u64,
    /// `[topic, seq, payload]`, encoded.
    message: Bytes,
    /// Applied to the view when sent.
    announce: Option<Announce>,
}

impl Outgoing {
    /// Queues the batch for every subscriber of `rank` and applies it to the view.
    fn send(&self, peers: &PeerList, topic: &Bytes, rank: usize, metrics: &Metrics) {
        offer_all(peers, topic, &self.message, rank, metrics);
        if let Some(a) = &self.announce {
            a.view.sent(rank, &a.delta);
        }
    }

    /// The batch is lost for every subscriber: the view waits for it from the replay endpoint.
    fn lost(&self, rank: usize) {
        if let Some(a) = &self.announce {
            a.view.missed(rank, self.seq);
        }
    }
}

/// The subscribers connected to a rank's PUB socket. A `std` mutex: held to add or remove one
/// or to offer each a message, never across an await.
type PeerList = Arc<Mutex<Vec<Arc<Peer>>>>;

/// One rank's sending side, held by the driver.
#[derive(Debug)]
struct Rank {
    /// The next batch's sequence number.
    next_seq: u64,
    /// The subscribers batches are queued for.
    peers: PeerList,
    /// Recent batches for the replay socket.
    replay: ReplayBuffer,
    /// The bound PUB address (None when connecting).
    pub_addr: Option<SocketAddr>,
    /// The bound replay address (None without replay or when connecting).
    replay_addr: Option<SocketAddr>,
    /// Faults injected on delivery, when asked for.
    faults: Option<RankFaults<Outgoing>>,
    /// The rank's delay task, when batches are delivered late: (due, batch).
    delayed: Option<tokio::sync::mpsc::Sender<(tokio::time::Instant, Outgoing)>>,
}

/// The ZeroMQ publishers of every rank. Dropping it stops their tasks and closes the sockets.
#[derive(Debug)]
pub struct KvEventPublisher {
    ranks: Vec<Rank>,
    format: WireFormat,
    /// The topic frame of every message.
    topic: Bytes,
    metrics: Arc<Metrics>,
    /// Each rank is a standalone worker with an endpoint of its own (a fleet's): its batches
    /// carry data-parallel rank 0, as a vLLM without data parallelism sends them.
    standalone: bool,
    /// What the sent batches announced, for the routing judge (`mockserve fleet`).
    view: Option<Arc<PublishedView>>,
    /// Restarts asked for on demand.
    restarts: RestartSwitch,
    /// Stops every socket and connection task when the publisher goes.
    _stop: DropGuard,
}

/// The flag of the PUB endpoint, for messages.
const ENDPOINT_FLAG: &str = "--kv-events-endpoint";
/// The flag of the replay endpoint, for messages.
const REPLAY_FLAG: &str = "--kv-events-replay-endpoint";

impl KvEventPublisher {
    /// Binds (or starts connecting) one PUB socket per rank, and the replay sockets, on the
    /// current tokio runtime. Port ranges are checked and every socket is bound before this
    /// returns: a bad range or a port in use is an error here, before anything is served, and
    /// nothing stays bound after an error.
    pub async fn start(
        config: &KvEventsConfig,
        num_ranks: usize,
        metrics: Arc<Metrics>,
    ) -> Result<KvEventPublisher, KvEventsError> {
        config.check_ports(num_ranks)?;
        let stop = CancellationToken::new();
        // Dropped on an early return too: the tasks spawned so far stop and unbind.
        let guard = stop.clone().drop_guard();
        let mut ranks = Vec::with_capacity(num_ranks);
        for rank in 0..num_ranks {
            let peers = PeerList::default();
            let replay = ReplayBuffer::default();
            let publish = Arc::new(Service::Publish {
                rank: rank as u32,
                peers: Arc::clone(&peers),
            });
            let pub_addr = open(&config.endpoint, ENDPOINT_FLAG, rank, publish, &stop).await?;
            let replay_addr = match &config.replay_endpoint {
                Some(endpoint) => {
                    let service = Arc::new(Service::Replay {
                        rank,
                        buffer: Arc::clone(&replay),
                        metrics: Arc::clone(&metrics),
                    });
                    open(endpoint, REPLAY_FLAG, rank, service, &stop).await?
                }
                None => None,
            };
            let faults = config.faults.map(|f| RankFaults::new(f, rank));
            let delayed = faults.as_ref().filter(|f| !f.delay().is_zero()).map(|_| {
                let (send, receive) = tokio::sync::mpsc::channel(LATE_QUEUE);
                let topic = Bytes::from(config.topic.clone().into_bytes());
                tokio::spawn(deliver_late(
                    receive,
                    Arc::clone(&peers),
                    topic,
                    rank,
                    Arc::clone(&metrics),
                    stop.clone(),
                ));
                send
            });
            ranks.push(Rank {
                next_seq: 0,
                peers,
                replay,
                pub_addr,
                replay_addr,
                faults,
                delayed,
            });
        }
        let restarts = RestartSwitch {
            asked: ranks.iter().map(|_| AtomicBool::new(false)).collect(),
            replay: ranks.iter().map(|r| Arc::clone(&r.replay)).collect(),
        };
        Ok(KvEventPublisher {
            ranks,
            format: config.format,
            topic: Bytes::from(config.topic.clone().into_bytes()),
            metrics,
            standalone: false,
            view: None,
            restarts,
            _stop: guard,
        })
    }

    /// This publisher with every rank a standalone worker (`mockserve fleet`): batches carry
    /// data-parallel rank 0 instead of the worker's index.
    pub(crate) fn standalone_workers(self) -> KvEventPublisher {
        KvEventPublisher {
            standalone: true,
            ..self
        }
    }

    /// This publisher applying every batch it sends (or replays after it was not sent) to
    /// `view`, which must have a worker per rank.
    pub(crate) fn with_view(self, view: Arc<PublishedView>) -> KvEventPublisher {
        for r in &self.ranks {
            r.replay.lock().unwrap_or_else(PoisonError::into_inner).view = Some(Arc::clone(&view));
        }
        KvEventPublisher {
            view: Some(view),
            ..self
        }
    }

    /// The switch that restarts a rank's publisher on demand (`mockserve fleet`'s
    /// `POST /fleet/workers/{i}/kv-events/restart`).
    pub(crate) fn restart_switch(&self) -> RestartSwitch {
        self.restarts.clone()
    }

    /// The address `rank`'s PUB socket is bound to (None when it connects out).
    pub fn pub_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.ranks.get(rank).and_then(|r| r.pub_addr)
    }

    /// The address `rank`'s replay socket is bound to (None without replay or when it
    /// connects out).
    pub fn replay_addr(&self, rank: usize) -> Option<SocketAddr> {
        self.ranks.get(rank).and_then(|r| r.replay_addr)
    }

    /// Numbers, encodes and keeps one batch of `rank` for replay, and queues it for each
    /// subscriber of its topic: a subscriber with [`PEER_QUEUE`] batches already queued loses
    /// its oldest one (counted in `servesim_kv_events_dropped`). Faults, when asked for, act
    /// on delivery; a `restart` fault first starts the numbering over at 0 with an empty
    /// replay buffer. Never waits.
    pub fn publish(&mut self, rank: usize, batch: &WireBatch) {
        let Some(r) = self.ranks.get_mut(rank) else {
            return;
        };
        let label = WorkerLabel {
            worker: rank as u32,
        };
        let drawn = r.faults.as_mut().is_some_and(RankFaults::restarts);
        let asked = self
            .restarts
            .asked
            .get(rank)
            .is_some_and(|a| a.swap(false, Ordering::Relaxed));
        if drawn || asked {
            r.next_seq = 0;
            empty_replay(&r.replay, rank);
            let fault = KvFaultLabel {
                worker: rank as u32,
                fault: Fault::Restarted.label(),
            };
            self.metrics.kv_events_faults.get_or_create(&fault).inc();
        }
        let seq = r.next_seq;
        r.next_seq += 1;
        let payload = Bytes::from(batch.encode(self.format));
        self.metrics.kv_events_published.get_or_create(&label).inc();
        let announce = self.view.as_ref().map(|view| Announce {
            view: Arc::clone(view),
            delta: Arc::new(ViewDelta::of(batch)),
        });
        let delta = announce.as_ref().map(|a| Arc::clone(&a.delta));
        let outgoing = Outgoing {
            seq,
            message: Bytes::new(),
            announce,
        };
        match &mut r.faults {
            None => {
                if !lock(&r.peers).is_empty() {
                    let message =
                        zmtp::encode_message(&[&self.topic, &seq.to_be_bytes(), &payload]);
                    offer_all(&r.peers, &self.topic, &message, rank, &self.metrics);
                }
                if let Some(a) = &outgoing.announce {
                    a.view.sent(rank, &a.delta);
                }
            }
            Some(faults) => {
                let outgoing = Outgoing {
                    message: zmtp::encode_message(&[&self.topic, &seq.to_be_bytes(), &payload]),
                    ..outgoing
                };
                let (batches, drawn) = faults.deliver(outgoing.clone());
                for fault in drawn {
                    let label = KvFaultLabel {
                        worker: rank as u32,
                        fault: fault.label(),
                    };
                    self.metrics.kv_events_faults.get_or_create(&label).inc();
                    if fault == Fault::Dropped {
                        outgoing.lost(rank);
                    }
                }
                match &r.delayed {
                    Some(late) => {
                        let due = tokio::time::Instant::now() + faults.delay();
                        for b in batches {
                            // Full: the delay holds LATE_QUEUE batches already; this one is
                            // lost for every subscriber (replay still serves it), as a slow
                            // subscriber's are. Closed: the publisher is stopping.
                            if let Err(TrySendError::Full((_, b))) = late.try_send((due, b)) {
                                b.lost(rank);
                                self.metrics.kv_events_dropped.get_or_create(&label).inc();
                            }
                        }
                    }
                    None => {
                        for b in &batches {
                            b.send(&r.peers, &self.topic, rank, &self.metrics);
                        }
                    }
                }
            }
        }
        // Kept for replay once its fate is settled: a replay that serves a batch never sent
        // finds it already waited for by the view.
        let mut replay = r.replay.lock().unwrap_or_else(PoisonError::into_inner);
        replay.batches.push_back((seq, payload, delta));
        while replay.batches.len() > REPLAY_BUFFER {
            replay.batches.pop_front();
        }
    }
}

/// Restarts of ranks' publishers asked for on demand, shared with whoever asks; cheap to clone.
/// A restart empties the rank's replay buffer at once and numbers its next batch 0, as the
/// publisher of a restarted vLLM engine starts.
#[derive(Clone, Debug)]
pub(crate) struct RestartSwitch {
    /// Per rank: a restart waits for the rank's next batch.
    asked: Arc<[AtomicBool]>,
    /// Per rank: its replay buffer.
    replay: Arc<[ReplayBuffer]>,
}

impl RestartSwitch {
    /// Restarts the publisher of `rank`; false when there is no such rank.
    pub(crate) fn restart(&self, rank: usize) -> bool {
        let (Some(asked), Some(replay)) = (self.asked.get(rank), self.replay.get(rank)) else {
            return false;
        };
        empty_replay(replay, rank);
        asked.store(true, Ordering::Relaxed);
        true
    }
}

/// Empties a restarted rank's replay buffer; its view forgets the batches it waited for.
fn empty_replay(replay: &ReplayBuffer, rank: usize) {
    // Short section, no await.
    let mut replay = replay.lock().unwrap_or_else(PoisonError::into_inner);
    replay.batches.clear();
    if let Some(view) = &replay.view {
        view.restarted(rank);
    }
}

/// Queues `message` for every subscriber of `rank` whose subscription matches `topic`; a
/// subscriber with [`PEER_QUEUE`] batches already queued loses its oldest (counted and logged
/// once). Short section, no await: each offer is a push (and maybe a pop).
fn offer_all(peers: &PeerList, topic: &Bytes, message: &Bytes, rank: usize, metrics: &Metrics) {
    let label = WorkerLabel {
        worker: rank as u32,
    };
    for peer in lock(peers).iter() {
        if peer.offer(topic, message) == Offer::QueuedDroppingOldest {
            metrics.kv_events_dropped.get_or_create(&label).inc();
            if peer.dropped() == 1 {
                eprintln!(
                    "mockserve: warning: KV events subscriber {} of worker {rank} is not \
                     reading; past {PEER_QUEUE} queued batches its oldest are dropped",
                    peer.addr
                );
            }
        }
    }
}

/// A rank's late deliveries (`delay=MS`): each batch is sent at its due time, in order, until
/// the publisher stops.
async fn deliver_late(
    mut late: tokio::sync::mpsc::Receiver<(tokio::time::Instant, Outgoing)>,
    peers: PeerList,
    topic: Bytes,
    rank: usize,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => return,
            next = late.recv() => next,
        };
        let Some((due, batch)) = next else {
            return;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        batch.send(&peers, &topic, rank, &metrics);
    }
}

/// What a rank's socket does with each connection.
#[derive(Debug)]
enum Service {
    /// PUB: the connection is a subscriber with its own queue.
    Publish {
        /// The rank, for log lines.
        rank: u32,
        /// Where the subscriber is listed while connected.
        peers: PeerList,
    },
    /// ROUTER: the connection is a replay client answered from the buffer.
    Replay {
        /// The rank, for the view and the metrics.
        rank: usize,
        /// Its recent batches.
        buffer: ReplayBuffer,
        /// Where served batches are counted.
        metrics: Arc<Metrics>,
    },
}

impl Service {
    fn role(&self) -> Role {
        match self {
            Service::Publish { .. } => Role::Pub,
            Service::Replay { .. } => Role::Router,
        }
    }

    /// Serves one connection until the peer leaves or misbehaves.
    async fn run(&self, mut stream: TcpStream, addr: SocketAddr) {
        let _ = stream.set_nodelay(true);
        if zmtp::handshake(&mut stream, self.role()).await.is_err() {
            return;
        }
        match self {
            Service::Publish { rank, peers } => {
                let peer = Arc::new(Peer::new(addr, PEER_QUEUE));
                lock(peers).push(Arc::clone(&peer));
                zmtp::serve_subscriber(stream, Arc::clone(&peer)).await;
                lock(peers).retain(|p| !Arc::ptr_eq(p, &peer));
                let dropped = peer.dropped();
                if dropped > 0 {
                    eprintln!(
                        "mockserve: KV events subscriber {addr} of worker {rank} left; \
                         {dropped} batches were dropped for it"
                    );
                }
            }
            Service::Replay {
                rank,
                buffer,
                metrics,
            } => {
                let answer = |frames: &[Bytes]| {
                    let answer = replay_answer(buffer, *rank, frames);
                    let label = WorkerLabel {
                        worker: *rank as u32,
                    };
                    // Every message but the end marker is a batch.
                    let served = answer.len().saturating_sub(1) as u64;
                    metrics
                        .kv_events_replayed
                        .get_or_create(&label)
                        .inc_by(served);
                    answer
                };
                let _ = zmtp::serve_replay_client(stream, answer).await;
            }
        }
    }
}

/// Locks a peer list (a poisoned lock still holds a valid list).
fn lock(peers: &PeerList) -> MutexGuard<'_, Vec<Arc<Peer>>> {
    peers.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Binds `endpoint` for `rank` and spawns its accept loop, or spawns a task that connects out;
/// returns the bound address.
async fn open(
    endpoint: &ZmqEndpoint,
    flag: &'static str,
    rank: usize,
    service: Arc<Service>,
    stop: &CancellationToken,
) -> Result<Option<SocketAddr>, KvEventsError> {
    let addr = endpoint.addr_for_rank(rank)?;
    if !endpoint.bind {
        tokio::spawn(connect_out(addr, service, stop.clone()));
        return Ok(None);
    }
    let listener = TcpListener::bind(addr.as_str())
        .await
        .map_err(|error| KvEventsError::Bind {
            flag,
            endpoint: endpoint.text.clone(),
            rank,
            addr: addr.clone(),
            error,
        })?;
    let local = listener.local_addr().ok();
    tokio::spawn(accept_peers(listener, service, stop.clone()));
    Ok(local)
}

/// Accepts connections until `stop`, each served by its own task; past [`MAX_PEERS`] at once
/// a new connection is closed.
async fn accept_peers(listener: TcpListener, service: Arc<Service>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_PEERS));
    loop {
        let accepted = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, addr)) = accepted else {
            // Out of descriptors, say: try again shortly rather than spin.
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let service = Arc::clone(&service);
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = service.run(stream, addr) => {}
            }
            drop(slot);
        });
    }
}

/// Connects to `addr` (`HOST:PORT`) and serves the connection, reconnecting with a growing
/// pause (as ZeroMQ does) after a failure or a disconnect, until `stop`.
async fn connect_out(addr: String, service: Arc<Service>, stop: CancellationToken) {
    let mut pause = RECONNECT_MIN;
    let mut warned = false;
    loop {
        let connected = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            connected = TcpStream::connect(addr.as_str()) => connected,
        };
        match connected.and_then(|s| s.peer_addr().map(|peer| (s, peer))) {
            Ok((stream, peer)) => {
                pause = RECONNECT_MIN;
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    () = service.run(stream, peer) => {}
                }
            }
            Err(e) if !warned => {
                warned = true;
                eprintln!(
                    "mockserve: warning: cannot connect the KV events socket to {addr}: {e}; \
                     retrying"
                );
            }
            Err(_) => {}
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// The answer to a replay request `[start_seq]` (DEALER) or `[empty, start_seq]` (REQ):
/// every buffered batch with `seq >= start_seq` as `[(empty,) seq, payload]`, then the end
/// marker. Anything else gets no answer. A served batch that was never sent live is applied
/// to the view of `rank`.
fn replay_answer(buffer: &ReplayBuffer, rank: usize, request: &[Bytes]) -> Vec<Vec<Bytes>> {
    let (delimiter, start) = match request {
        [start] => (false, start),
        [empty, start] if empty.is_empty() => (true, start),
        _ => return Vec::new(),
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        return Vec::new();
    };
    let start = u64::from_be_bytes(start);
    let envelope = |seq: Bytes, payload: Bytes| {
        let mut frames = Vec::with_capacity(3);
        if delimiter {
            frames.push(Bytes::new());
        }
        frames.push(seq);
        frames.push(payload);
        frames
    };
    // Short section, no await: copy out the wanted batches (shared bytes, not copies).
    let (wanted, view) = {
        let buffer = buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let wanted: Vec<_> = buffer
            .batches
            .iter()
            .filter(|(s, _, _)| *s >= start)
            .cloned()
            .collect();
        (wanted, buffer.view.clone())
    };
    let mut answer = Vec::with_capacity(wanted.len() + 1);
    for (seq, payload, delta) in wanted {
        if let (Some(view), Some(delta)) = (&view, &delta) {
            view.replayed(rank, seq, delta);
        }
        answer.push(envelope(
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ));
    }
    answer.push(envelope(Bytes::from_static(&END_OF_REPLAY), Bytes::new()));
    answer
}

/// The driver's KV-event export: token bookkeeping plus the publisher.
#[derive(Debug)]
pub(crate) struct KvExport {
    /// Tokens behind each cacheable block.
    pub tokens: BlockTokens,
    /// Where batches go.
    pub sink: KvSink,
}

/// Where exported batches go: ZeroMQ, or a JSON-lines file (offline replay).
#[derive(Debug)]
pub(crate) enum KvSink {
    /// Published on ZeroMQ sockets.
    Zmq(KvEventPublisher),
    /// Written as JSON lines, one decoded batch a line (`mockserve replay --kv-events-jsonl`).
    Jsonl(JsonlSink),
}

/// A JSON-lines file of batches; the first write error is kept and stops further writes.
#[derive(Debug)]
pub(crate) struct JsonlSink {
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
    pub(crate) fn finish(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        match self.error.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        }
    }
}

impl KvExport {
    /// An export of the KV events of `cluster` (which starts keeping them) to `sink`.
    pub(crate) fn new(cluster: &mut Cluster, sink: KvSink) -> KvExport {
        cluster.export_kv_events();
        let block_size = cluster.block_size();
        KvExport {
            tokens: BlockTokens::new(cluster.workers().len(), block_size),
            sink,
        }
    }

    /// Starts tracking a submitted request: its prompt tokens, the hashes the engine got for
    /// them, and its adapter.
    pub(crate) fn track(
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
    pub(crate) fn after_advance(
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
            let wire = self.tokens.wire_event(event);
            by_worker.entry(event.worker.0).or_default().push(wire);
        }
        for (rank, events) in by_worker {
            let data_parallel_rank = match &self.sink {
                KvSink::Zmq(publisher) if publisher.standalone => 0,
                _ => rank,
            };
            let batch = WireBatch {
                ts: ts_seconds,
                events,
                data_parallel_rank: Some(data_parallel_rank),
            };
            match &mut self.sink {
                KvSink::Zmq(publisher) => publisher.publish(rank as usize, &batch),
                KvSink::Jsonl(sink) => sink.write(&batch),
            }
        }
    }

    /// Stops tracking a request once the passes in progress on `cluster` have ended.
    pub(crate) fn release(&mut self, cluster: &Cluster, id: RequestId, now: SimTime) {
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
