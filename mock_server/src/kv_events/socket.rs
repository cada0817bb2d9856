//! A rank's ZeroMQ sockets: binding or connecting out, accepting connections, and serving each
//! one as a subscriber (PUB) or a replay client (ROUTER).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::config::{KvEventsError, ZmqEndpoint};
use super::peer::{Offer, Peer, QueueBound};
use super::replay::{replay_answer, ReplayBuffer, Replies};
use super::zmtp::{self, Role};
use super::{END_OF_REPLAY, MAX_PEERS, PEER_QUEUE, PEER_QUEUE_BYTES};
use crate::metrics::{Metrics, WorkerLabel};

/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// First pause before reconnecting a socket that connects out; it doubles up to
/// [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(100);

/// Longest pause before reconnecting.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Longest wait for the slot of an evicted connection (its task gives it back when it next
/// runs, at once on a live runtime).
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// Shortest time between two log lines about connections refused at a socket's cap.
const REFUSED_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The subscribers connected to a rank's PUB socket. A `std` mutex: held to add or remove one
/// or to offer each a message, never across an await.
pub(super) type PeerList = Arc<Mutex<Vec<Arc<Peer>>>>;

/// Queues `message` for every subscriber of `rank` whose subscription matches the socket's
/// topic; a subscriber whose queue is over [`PEER_QUEUE`] batches or [`PEER_QUEUE_BYTES`]
/// bytes loses its oldest (counted, and logged once). Short section, no await: each offer is a
/// push (and maybe pops), and looks at no subscription.
pub(super) fn offer_all(peers: &PeerList, message: &Bytes, rank: usize, metrics: &Metrics) {
    let label = WorkerLabel {
        worker: rank as u32,
    };
    for peer in lock(peers).iter() {
        let Offer::Queued { dropped } = peer.offer(message) else {
            continue;
        };
        if dropped == 0 {
            continue;
        }
        metrics
            .kv_events_dropped
            .get_or_create(&label)
            .inc_by(dropped);
        if peer.dropped() == dropped {
            eprintln!(
                "mockserve: warning: KV events subscriber {} of worker {rank} is not \
                 reading; past {PEER_QUEUE} queued batches or {} MiB its oldest are dropped",
                peer.addr,
                PEER_QUEUE_BYTES >> 20
            );
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
        /// The topic frame of every message, which subscriptions are matched against.
        topic: Bytes,
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

    /// The socket, for log lines.
    fn describe(&self) -> String {
        match self {
            Service::Publish { rank, .. } => format!("KV events socket of worker {rank}"),
            Service::Replay { rank, .. } => format!("KV events replay socket of worker {rank}"),
        }
    }

    /// Serves one connection until the peer leaves or misbehaves; `ready` is called once its
    /// handshake is done.
    async fn run(&self, mut stream: TcpStream, addr: SocketAddr, ready: impl FnOnce()) {
        let _ = stream.set_nodelay(true);
        let Ok(socket_type) = zmtp::handshake(&mut stream, self.role()).await else {
            return;
        };
        ready();
        match self {
            Service::Publish { rank, topic, peers } => {
                let bound = QueueBound {
                    messages: PEER_QUEUE,
                    bytes: PEER_QUEUE_BYTES,
                };
                let peer = Arc::new(Peer::new(addr, topic.clone(), bound));
                lock(peers).push(Arc::clone(&peer));
                zmtp::serve_subscriber(stream, Arc::clone(&peer)).await;
                lock(peers).retain(|p| !Arc::ptr_eq(p, &peer));
                let (dropped, ignored) = (peer.dropped(), peer.ignored());
                if dropped > 0 || ignored > 0 {
                    eprintln!(
                        "mockserve: KV events subscriber {addr} of worker {rank} left; \
                         {dropped} batches were dropped for it and {ignored} of its \
                         subscriptions ignored"
                    );
                }
            }
            Service::Replay {
                rank,
                buffer,
                metrics,
            } => {
                // A REQ socket takes one reply per request: it gets one batch at a time.
                let replies = if socket_type.as_ref() == b"REQ" {
                    Replies::One
                } else {
                    Replies::All
                };
                let answer = |frames: &[Bytes]| {
                    let answer = replay_answer(buffer, *rank, frames, replies);
                    let label = WorkerLabel {
                        worker: *rank as u32,
                    };
                    // Every message but the end marker is a batch: [(empty,) seq, payload].
                    let served = answer
                        .iter()
                        .filter(|m| m.len() >= 2 && m[m.len() - 2].as_ref() != END_OF_REPLAY)
                        .count() as u64;
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

/// The connections of a socket still in their handshake, oldest first, each with the token
/// that closes it. A `std` mutex: held to push, remove or pop, never across an await.
#[derive(Debug, Default)]
struct Handshaking {
    inner: Mutex<(u64, VecDeque<(u64, CancellationToken)>)>,
}

impl Handshaking {
    fn lock(&self) -> MutexGuard<'_, (u64, VecDeque<(u64, CancellationToken)>)> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lists a new connection: its id and the token that closes it.
    fn enter(&self) -> (u64, CancellationToken) {
        let mut inner = self.lock();
        let id = inner.0;
        inner.0 += 1;
        let token = CancellationToken::new();
        inner.1.push_back((id, token.clone()));
        (id, token)
    }

    /// Unlists connection `id` (its handshake is done, or it ended).
    fn leave(&self, id: u64) {
        self.lock().1.retain(|(i, _)| *i != id);
    }

    /// Closes the connection that has been in its handshake longest; false when none is.
    fn evict_oldest(&self) -> bool {
        let oldest = self.lock().1.pop_front();
        oldest.map(|(_, token)| token.cancel()).is_some()
    }
}

/// Connections a socket refused at its cap, logged at most once per [`REFUSED_LOG_INTERVAL`].
#[derive(Debug, Default)]
struct Refusals {
    /// Refused since the last line.
    since_line: u64,
    /// When the last line was written.
    line_at: Option<tokio::time::Instant>,
}

impl Refusals {
    /// Counts one refusal at `now`; returns the number refused since the last line when a
    /// line is due.
    fn refused(&mut self, now: tokio::time::Instant) -> Option<u64> {
        self.since_line += 1;
        if self
            .line_at
            .is_some_and(|at| now.duration_since(at) < REFUSED_LOG_INTERVAL)
        {
            return None;
        }
        self.line_at = Some(now);
        Some(std::mem::take(&mut self.since_line))
    }
}

/// Accepts connections until `stop`, each served by its own task. With [`MAX_PEERS`]
/// connections at once, a new one takes the slot of the one that has been in its handshake
/// longest (a real ZeroMQ peer completes it in one round trip, so that is an idle or slowloris
/// connection); when every connection has completed its handshake the new one is closed,
/// logged at most once per [`REFUSED_LOG_INTERVAL`] with the number refused since the last
/// line.
async fn accept_peers(listener: TcpListener, service: Arc<Service>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_PEERS));
    let handshaking = Arc::new(Handshaking::default());
    let mut refusals = Refusals::default();
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
        let mut slot = Arc::clone(&slots).try_acquire_owned().ok();
        if slot.is_none() && handshaking.evict_oldest() {
            // The evicted connection's task gives its slot back as soon as it runs.
            let freed = Arc::clone(&slots).acquire_owned();
            slot = tokio::time::timeout(EVICTION_WAIT, freed)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let Some(slot) = slot else {
            drop(stream);
            if let Some(refused) = refusals.refused(tokio::time::Instant::now()) {
                eprintln!(
                    "mockserve: warning: the {} serves {MAX_PEERS} connections already; \
                     {refused} refused since the last warning (the latest from {addr})",
                    service.describe(),
                );
            }
            continue;
        };
        let service = Arc::clone(&service);
        let stop = stop.clone();
        let handshaking = Arc::clone(&handshaking);
        let (id, evicted) = handshaking.enter();
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = stop.cancelled() => {}
                () = evicted.cancelled() => {}
                () = service.run(stream, addr, || handshaking.leave(id)) => {}
            }
            handshaking.leave(id);
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
                    () = service.run(stream, peer, || {}) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_logged_at_most_once_per_interval_with_their_count() {
        let start = tokio::time::Instant::now();
        let mut refusals = Refusals::default();
        assert_eq!(refusals.refused(start), Some(1));
        for n in 1..=999u64 {
            let now = start + REFUSED_LOG_INTERVAL * 9 / 10 * u32::from(n == 999);
            assert_eq!(refusals.refused(now), None);
        }
        // The next line, an interval later, counts every refusal since the first.
        assert_eq!(refusals.refused(start + REFUSED_LOG_INTERVAL), Some(1000));
        assert_eq!(refusals.refused(start + REFUSED_LOG_INTERVAL), None);
    }

    #[test]
    fn the_oldest_connection_in_its_handshake_is_evicted_first() {
        let handshaking = Handshaking::default();
        let (a, token_a) = handshaking.enter();
        let (_b, token_b) = handshaking.enter();
        let (c, token_c) = handshaking.enter();
        handshaking.leave(a);
        assert!(handshaking.evict_oldest());
        assert!(!token_a.is_cancelled() && token_b.is_cancelled() && !token_c.is_cancelled());
        handshaking.leave(c);
        assert!(!handshaking.evict_oldest(), "every handshake is done");
        assert!(!token_c.is_cancelled());
    }
}
