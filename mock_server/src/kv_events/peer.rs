//! One connected subscriber of a PUB socket ([`Peer`]): its subscriptions, bounded in count and
//! bytes and matched against the socket's topic without a scan, and its queue of encoded
//! messages, bounded in messages and bytes.
//!
//! Every message of a socket carries the same topic (`--kv-events-topic`), so whether a
//! subscriber wants it is decided when a subscription arrives, not when a batch is published:
//! the peer counts its subscriptions that are a prefix of the topic (ZeroMQ's rule: a
//! subscription matches a message whose first frame starts with it; the empty one matches
//! all), and [`Peer::offer`] only looks at that count. A subscription past
//! [`MAX_SUBSCRIPTIONS`] or [`MAX_SUBSCRIPTION_BYTES`] is ignored, as if never sent (ZMTP has
//! no way to refuse one), and logged once per subscriber.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::body::Bytes;
use tokio::sync::Notify;

/// Subscriptions one subscriber holds at most (each SUBSCRIBE counts, repeats included, until
/// its CANCEL). A router subscribes to one topic or a few.
pub(crate) const MAX_SUBSCRIPTIONS: usize = 256;

/// Bytes of subscriptions one subscriber holds at most (repeats included).
pub(crate) const MAX_SUBSCRIPTION_BYTES: usize = 16 * 1024;

/// Bytes a subscriber's writer takes from its queue at a time (at least one message): the
/// rest stay queued, where newer batches can still push the oldest out.
const WRITE_CHUNK_BYTES: usize = 256 * 1024;

/// How much a subscriber's queue holds at most; past either bound its oldest messages go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueBound {
    /// Messages (at least one).
    pub(crate) messages: usize,
    /// Bytes; a single message larger than this is still queued, alone.
    pub(crate) bytes: usize,
}

/// One subscriber's state, shared by the publishing side ([`Peer::offer`]) and its connection
/// task. A `std` mutex: every section is a few pushes and pops, never across an await.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The subscriber's address, for log lines.
    pub(crate) addr: SocketAddr,
    /// The topic frame of every message of the socket: what subscriptions are matched against.
    topic: Bytes,
    /// How much is queued at most; past it the oldest messages are dropped.
    bound: QueueBound,
    state: Mutex<PeerState>,
    /// Woken when a message (or a PONG) is queued.
    pub(crate) ready: Notify,
}

#[derive(Debug, Default)]
struct PeerState {
    /// What the subscriber subscribed to.
    subscriptions: Subscriptions,
    /// Encoded messages not yet written.
    queue: VecDeque<Bytes>,
    /// Bytes of `queue`.
    queued_bytes: usize,
    /// A PONG to write before the next message.
    pong: Option<Bytes>,
    /// Messages dropped because the queue was full.
    dropped: u64,
}

/// A subscriber's subscriptions: a multiset, as in ZeroMQ (each CANCEL removes one), with its
/// size in count and bytes and how many of them match the socket's topic.
#[derive(Debug, Default)]
struct Subscriptions {
    /// Each distinct prefix and how many times it is held.
    held: HashMap<Bytes, u32>,
    /// Subscriptions held, repeats included (at most [`MAX_SUBSCRIPTIONS`]).
    count: usize,
    /// Their bytes, repeats included (at most [`MAX_SUBSCRIPTION_BYTES`]).
    bytes: usize,
    /// How many of them are a prefix of the topic: the subscriber gets every message when
    /// above 0, none at 0.
    matching: usize,
    /// Subscriptions ignored past the caps.
    ignored: u64,
}

/// What [`Peer::subscribe`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Subscribed {
    /// Held.
    Held,
    /// Ignored: the subscriber holds [`MAX_SUBSCRIPTIONS`] or [`MAX_SUBSCRIPTION_BYTES`]
    /// already. The count says how many it had ignored so far, this one included.
    Ignored(u64),
}

/// What [`Peer::offer`] did with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// The subscriber has no subscription matching the topic.
    NotSubscribed,
    /// Queued, after dropping this many of the oldest queued messages to make room.
    Queued {
        /// Messages dropped.
        dropped: u64,
    },
}

impl Peer {
    /// A subscriber at `addr` of a socket whose messages carry `topic`, queueing at most
    /// `bound`.
    pub(crate) fn new(addr: SocketAddr, topic: Bytes, bound: QueueBound) -> Peer {
        Peer {
            addr,
            topic,
            bound: QueueBound {
                messages: bound.messages.max(1),
                bytes: bound.bytes,
            },
            state: Mutex::default(),
            ready: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, PeerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `message` if a subscription matches the topic, dropping the oldest queued
    /// messages while the queue is over its bound. Never waits, never scans subscriptions.
    pub(crate) fn offer(&self, message: &Bytes) -> Offer {
        let mut state = self.state();
        if state.subscriptions.matching == 0 {
            return Offer::NotSubscribed;
        }
        state.queue.push_back(message.clone());
        state.queued_bytes += message.len();
        let mut dropped = 0;
        while state.queue.len() > self.bound.messages
            || (state.queued_bytes > self.bound.bytes && state.queue.len() > 1)
        {
            if let Some(oldest) = state.queue.pop_front() {
                state.queued_bytes -= oldest.len();
                dropped += 1;
            }
        }
        state.dropped += dropped;
        drop(state);
        self.ready.notify_one();
        Offer::Queued { dropped }
    }

    /// Messages dropped for this subscriber so far.
    pub(crate) fn dropped(&self) -> u64 {
        self.state().dropped
    }

    /// Subscriptions ignored past the caps so far.
    pub(crate) fn ignored(&self) -> u64 {
        self.state().subscriptions.ignored
    }

    /// Adds a subscription to `prefix`, unless the subscriber holds as many or as many bytes
    /// as it may.
    pub(crate) fn subscribe(&self, prefix: Bytes) -> Subscribed {
        let mut state = self.state();
        let subs = &mut state.subscriptions;
        if subs.count >= MAX_SUBSCRIPTIONS || subs.bytes + prefix.len() > MAX_SUBSCRIPTION_BYTES {
            subs.ignored += 1;
            return Subscribed::Ignored(subs.ignored);
        }
        subs.count += 1;
        subs.bytes += prefix.len();
        if self.topic.starts_with(&prefix) {
            subs.matching += 1;
        }
        *subs.held.entry(prefix).or_default() += 1;
        Subscribed::Held
    }

    /// Removes one subscription to `prefix`, if one is held.
    pub(crate) fn cancel(&self, prefix: &[u8]) {
        let mut state = self.state();
        let subs = &mut state.subscriptions;
        let Some(times) = subs.held.get_mut(prefix) else {
            return;
        };
        *times -= 1;
        if *times == 0 {
            subs.held.remove(prefix);
        }
        subs.count -= 1;
        subs.bytes -= prefix.len();
        if self.topic.starts_with(prefix) {
            subs.matching -= 1;
        }
    }

    /// Queues `pong` (the answer to a PING) before the next message; a newer one replaces it.
    pub(crate) fn pong(&self, pong: Bytes) {
        self.state().pong = Some(pong);
        self.ready.notify_one();
    }

    /// The next things to write: a PONG first, then queued messages from the oldest, up to
    /// [`WRITE_CHUNK_BYTES`] (at least one).
    pub(crate) fn next_chunk(&self, out: &mut Vec<Bytes>) {
        let mut state = self.state();
        out.extend(state.pong.take());
        let mut taken = 0;
        while taken < WRITE_CHUNK_BYTES {
            let Some(message) = state.queue.pop_front() else {
                break;
            };
            state.queued_bytes -= message.len();
            taken += message.len();
            out.push(message);
        }
    }

    /// Checks the counts against the subscriptions and the queue (tests).
    #[cfg(test)]
    fn assert_invariants(&self) {
        let state = self.state();
        let subs = &state.subscriptions;
        let count: u32 = subs.held.values().sum();
        assert_eq!(count as usize, subs.count);
        let bytes: usize = subs.held.iter().map(|(p, n)| p.len() * *n as usize).sum();
        assert_eq!(bytes, subs.bytes);
        let matching: u32 = subs
            .held
            .iter()
            .filter(|(p, _)| self.topic.starts_with(p))
            .map(|(_, n)| n)
            .sum();
        assert_eq!(matching as usize, subs.matching);
        assert!(subs.count <= MAX_SUBSCRIPTIONS && subs.bytes <= MAX_SUBSCRIPTION_BYTES);
        let queued: usize = state.queue.iter().map(Bytes::len).sum();
        assert_eq!(queued, state.queued_bytes);
        assert!(state.queue.len() <= self.bound.messages);
        assert!(state.queue.len() <= 1 || queued <= self.bound.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn peer(topic: &'static [u8], messages: usize, bytes: usize) -> Peer {
        Peer::new(
            SocketAddr::from(([127, 0, 0, 1], 1)),
            Bytes::from_static(topic),
            QueueBound { messages, bytes },
        )
    }

    fn m(n: u8, len: usize) -> Bytes {
        Bytes::from(vec![n; len])
    }

    #[test]
    fn a_full_queue_drops_its_oldest_message_and_counts_it() {
        let peer = peer(b"kv", 2, 1 << 20);
        assert_eq!(peer.offer(&m(0, 1)), Offer::NotSubscribed);
        assert_eq!(peer.subscribe(Bytes::from_static(b"k")), Subscribed::Held);
        assert_eq!(peer.offer(&m(1, 1)), Offer::Queued { dropped: 0 });
        assert_eq!(peer.offer(&m(2, 1)), Offer::Queued { dropped: 0 });
        assert_eq!(peer.offer(&m(3, 1)), Offer::Queued { dropped: 1 });
        assert_eq!(peer.dropped(), 1);
        let mut chunk = Vec::new();
        peer.next_chunk(&mut chunk);
        assert_eq!(chunk, vec![m(2, 1), m(3, 1)]);
        peer.cancel(b"k");
        assert_eq!(peer.offer(&m(5, 1)), Offer::NotSubscribed);
        peer.assert_invariants();
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_keeping_the_newest() {
        let peer = peer(b"", 4096, 1000);
        peer.subscribe(Bytes::new());
        for n in 0..5 {
            peer.offer(&m(n, 300));
        }
        // 5 x 300 bytes: the two oldest go to stay within 1000.
        assert_eq!(peer.dropped(), 2);
        assert_eq!(peer.offer(&m(9, 5000)), Offer::Queued { dropped: 3 });
        peer.assert_invariants();
        let mut chunk = Vec::new();
        peer.next_chunk(&mut chunk);
        assert_eq!(
            chunk,
            vec![m(9, 5000)],
            "a message over the bound still goes, alone"
        );
    }

    #[test]
    fn subscriptions_match_by_prefix_and_cancel_one_at_a_time() {
        let peer = peer(b"kv@pod", 8, 1 << 20);
        peer.subscribe(Bytes::from_static(b"other"));
        assert_eq!(peer.offer(&m(0, 1)), Offer::NotSubscribed);
        peer.subscribe(Bytes::from_static(b"kv@"));
        peer.subscribe(Bytes::from_static(b"kv@"));
        peer.cancel(b"kv@");
        assert_eq!(peer.offer(&m(1, 1)), Offer::Queued { dropped: 0 });
        peer.cancel(b"kv@");
        peer.cancel(b"kv@");
        assert_eq!(peer.offer(&m(2, 1)), Offer::NotSubscribed);
        // Longer than the topic: never a prefix of it.
        peer.subscribe(Bytes::from_static(b"kv@pod2"));
        assert_eq!(peer.offer(&m(3, 1)), Offer::NotSubscribed);
        peer.subscribe(Bytes::new());
        assert_eq!(peer.offer(&m(4, 1)), Offer::Queued { dropped: 0 });
        peer.assert_invariants();
    }

    #[test]
    fn subscriptions_past_the_caps_are_ignored() {
        let peer = peer(b"", 8, 1 << 20);
        for n in 0..MAX_SUBSCRIPTIONS {
            let prefix = Bytes::from(format!("topic-{n}"));
            assert_eq!(peer.subscribe(prefix), Subscribed::Held);
        }
        // The empty subscription would match, but the count is reached.
        assert_eq!(peer.subscribe(Bytes::new()), Subscribed::Ignored(1));
        assert_eq!(peer.offer(&m(0, 1)), Offer::NotSubscribed);
        peer.cancel(b"topic-0");
        assert_eq!(peer.subscribe(Bytes::new()), Subscribed::Held);
        assert_eq!(peer.offer(&m(1, 1)), Offer::Queued { dropped: 0 });
        peer.assert_invariants();

        let peer = self::peer(b"", 8, 1 << 20);
        let big = Bytes::from(vec![b'x'; MAX_SUBSCRIPTION_BYTES]);
        assert_eq!(peer.subscribe(big.clone()), Subscribed::Held);
        assert_eq!(
            peer.subscribe(Bytes::from_static(b"y")),
            Subscribed::Ignored(1)
        );
        assert_eq!(peer.subscribe(big), Subscribed::Ignored(2));
        assert_eq!(peer.ignored(), 2);
        peer.assert_invariants();
    }

    #[test]
    fn invariants_hold_on_many_operations() {
        let mut rng = ChaCha8Rng::seed_from_u64(43);
        let peer = peer(b"kv@a", 16, 2000);
        let prefixes: [&[u8]; 6] = [b"", b"k", b"kv@", b"kv@a", b"kv@ab", b"z"];
        for _ in 0..20_000 {
            match rng.gen_range(0..4) {
                0 => {
                    let p = prefixes[rng.gen_range(0..prefixes.len())];
                    let long = rng.gen_bool(0.1);
                    let prefix = if long {
                        Bytes::from(vec![b'q'; 3000])
                    } else {
                        Bytes::from_static(p)
                    };
                    peer.subscribe(prefix);
                }
                1 => peer.cancel(prefixes[rng.gen_range(0..prefixes.len())]),
                2 => {
                    peer.offer(&m(0, rng.gen_range(0..600)));
                }
                _ => peer.next_chunk(&mut Vec::new()),
            }
            peer.assert_invariants();
        }
    }
}
