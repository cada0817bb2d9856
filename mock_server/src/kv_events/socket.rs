//! A rank's ZeroMQ sockets: binding or connecting out, accepting connections, and serving each
//! one as a subscriber (PUB) or a replay client (ROUTER).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::config::{KvEventsError, ZmqEndpoint};
use super::replay::{replay_answer, ReplayBuffer};
use super::zmtp::{self, Offer, Peer, Role};
use super::{MAX_PEERS, PEER_QUEUE};
use crate::metrics::{Metrics, WorkerLabel};

/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// First pause before reconnecting a socket that connects out; it doubles up to
/// [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);

/// Longest pause before reconnecting.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The subscribers connected to a rank's PUB socket. A `std` mutex: held to add or remove one
/// or to offer each a message, never across an await.
pub(super) type PeerList = Arc<Mutex<Vec<Arc<Peer>>>>;

/// Queues `message` for every subscriber of `rank` whose subscription matches `topic`; a
/// subscriber with [`PEER_QUEUE`] batches already queued loses its oldest (counted and logged
/// once). Short section, no await: each offer is a push (and maybe a pop).
pub(super) fn offer_all(
    peers: &PeerList,
    topic: &Bytes,
    message: &Bytes,
    rank: usize,
    metrics: &Metrics,
) {
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

/// What a rank's socket does with each connection.
#[derive(Debug)]
pub(super) enum Service {
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
pub(super) fn lock(peers: &PeerList) -> MutexGuard<'_, Vec<Arc<Peer>>> {
    peers.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Binds `endpoint` for `rank` and spawns its accept loop, or spawns a task that connects out;
/// returns the bound address.
pub(super) async fn open(
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
