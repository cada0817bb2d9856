//! [`KvEventPublisher`]: numbers, encodes and keeps each rank's batches for replay, and
//! delivers them to the rank's subscribers, with the faults asked for.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};

use axum::body::Bytes;
use tokio::sync::mpsc::error::TrySendError;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::config::{KvEventsConfig, KvEventsError, ENDPOINT_FLAG, REPLAY_FLAG};
use super::faults::{Fault, RankFaults};
use super::replay::{empty_replay, ReplayBuffer};
use super::socket::{lock, offer_all, open, PeerList, Service};
use super::view::{PublishedView, ViewDelta};
use super::wire::{WireBatch, WireFormat};
use super::zmtp;
use super::LATE_QUEUE;
use crate::metrics::{KvFaultLabel, Metrics, WorkerLabel};

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
    fn send(&self, peers: &PeerList, rank: usize, metrics: &Metrics) {
        offer_all(peers, &self.message, rank, metrics);
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
    pub(super) standalone: bool,
    /// What the sent batches announced, for the routing judge (`mockserve fleet`).
    view: Option<Arc<PublishedView>>,
    /// Restarts asked for on demand.
    restarts: RestartSwitch,
    /// Stops every socket and connection task when the publisher goes.
    _stop: DropGuard,
}

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
                topic: Bytes::from(config.topic.clone().into_bytes()),
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
                tokio::spawn(deliver_late(
                    receive,
                    Arc::clone(&peers),
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
    /// subscriber of its topic: a subscriber with [`PEER_QUEUE`](super::PEER_QUEUE) batches or
    /// [`PEER_QUEUE_BYTES`](super::PEER_QUEUE_BYTES) already queued loses its oldest (counted
    /// in `servesim_kv_events_dropped`). Faults,
    /// when asked for, act on delivery; a `restart` fault first starts the numbering over at 0
    /// with an empty replay buffer. Never waits.
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
                    offer_all(&r.peers, &message, rank, &self.metrics);
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
                            b.send(&r.peers, rank, &self.metrics);
                        }
                    }
                }
            }
        }
        // Kept for replay once its fate is settled: a replay that serves a batch never sent
        // finds it already waited for by the view.
        let mut replay = r.replay.lock().unwrap_or_else(PoisonError::into_inner);
        replay.push(seq, payload, delta);
    }

    /// The batches `rank` keeps for replay and the bytes they hold: payloads, and what they
    /// announce to the view with one (None: no such rank).
    pub fn replay_size(&self, rank: usize) -> Option<(usize, usize)> {
        let r = self.ranks.get(rank)?;
        // Short section, no await.
        let replay = r.replay.lock().unwrap_or_else(PoisonError::into_inner);
        Some(replay.size())
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

/// A rank's late deliveries (`delay=MS`): each batch is sent at its due time, in order, until
/// the publisher stops.
async fn deliver_late(
    mut late: tokio::sync::mpsc::Receiver<(tokio::time::Instant, Outgoing)>,
    peers: PeerList,
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
        batch.send(&peers, rank, &metrics);
    }
}
