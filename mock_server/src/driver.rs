//! The live driver: one tokio task owns the [`Cluster`] and maps simulated microseconds 1:1 to
//! wall-clock microseconds since its start; [`EngineHandle`] is the cloneable way in.
//!
//! The task sleeps until the cluster's next event (or a command), advances the engine to the
//! wall-clock "now" and forwards each request's [`Output`]s to that request's channel. A closed
//! channel means the client left: the request is cancelled and its KV blocks freed.

use std::collections::BTreeMap;
use std::time::Duration;

use servesim::cluster::{Cluster, ClusterStats, Output};
use servesim::ids::RequestId;
use servesim::request::EngineRequest;
use servesim::scheduler::RejectReason;
use servesim::time::SimTime;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// What happened to one request, as its handler sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Admitted by a worker; `reused_tokens` prompt tokens came from the prefix cache.
    Admitted {
        /// Prompt tokens not recomputed.
        reused_tokens: usize,
    },
    /// One output token (1-based `index`).
    Token {
        /// The token id.
        token: u32,
        /// Position in the output.
        index: usize,
    },
    /// The last token was emitted.
    Finished,
    /// Preempted; it will recompute.
    Preempted,
    /// The engine can never run it.
    Rejected(RejectReason),
}

/// Why a submission was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The waiting queue is full (`--max-waiting`).
    #[error("the server is overloaded: {waiting} requests are already waiting")]
    Overloaded {
        /// Requests waiting when this one arrived.
        waiting: usize,
    },
    /// The driver task has stopped (the server is shutting down).
    #[error("the engine has shut down")]
    Stopped,
}

/// The driver's view of the cluster plus counters only the driver sees.
#[derive(Clone, Debug)]
pub struct LiveStats {
    /// The cluster's own snapshot.
    pub cluster: ClusterStats,
    /// Prompt tokens served from the prefix cache at first admission, summed.
    pub prefix_hit_tokens: u64,
    /// Prompt tokens of every submitted request, summed.
    pub prompt_tokens: u64,
    /// Requests cancelled because their client went away.
    pub cancelled: u64,
}

enum Command {
    Submit {
        request: EngineRequest,
        /// `None` for requests nobody listens to (speculative prefill).
        events: Option<mpsc::UnboundedSender<Event>>,
        /// `None` for fire-and-forget submissions.
        reply: Option<oneshot::Sender<Result<RequestId, SubmitError>>>,
    },
    Cancel(RequestId),
    Snapshot(oneshot::Sender<LiveStats>),
}

/// A cloneable handle to the driver task. The task ends when every handle is dropped.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
}

/// A submitted request: its id and its events. Dropping it cancels the request if unfinished.
#[derive(Debug)]
pub struct Submission {
    /// The engine's id.
    pub id: RequestId,
    /// Events in order; closed after `Finished` or `Rejected`.
    pub events: mpsc::UnboundedReceiver<Event>,
    handle: EngineHandle,
    done: bool,
}

impl Submission {
    /// Marks the request finished so dropping it sends no cancel.
    pub fn mark_done(&mut self) {
        self.done = true;
    }
}

impl Drop for Submission {
    fn drop(&mut self) {
        if !self.done {
            self.handle.cancel(self.id);
        }
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Submit { .. } => f.write_str("Submit"),
            Command::Cancel(id) => write!(f, "Cancel({id})"),
            Command::Snapshot(_) => f.write_str("Snapshot"),
        }
    }
}

impl EngineHandle {
    /// Spawns the driver task on the current tokio runtime. `max_waiting` bounds the requests
    /// waiting for admission (router-parked plus worker queues).
    pub fn spawn(cluster: Cluster, max_waiting: Option<usize>) -> EngineHandle {
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = Driver {
            cluster,
            epoch: Instant::now(),
            listeners: BTreeMap::new(),
            max_waiting,
            prefix_hit_tokens: 0,
            prompt_tokens: 0,
            cancelled: 0,
            admitted: std::collections::BTreeSet::new(),
        };
        tokio::spawn(driver.run(rx));
        EngineHandle { commands: tx }
    }

    /// Submits a request and returns its event stream.
    pub async fn submit(&self, request: EngineRequest) -> Result<Submission, SubmitError> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Submit {
                request,
                events: Some(events_tx),
                reply: Some(reply),
            })
            .map_err(|_| SubmitError::Stopped)?;
        let id = rx.await.map_err(|_| SubmitError::Stopped)??;
        Ok(Submission {
            id,
            events,
            handle: self.clone(),
            done: false,
        })
    }

    /// Submits a request whose outputs nobody reads (it still runs to completion); false when
    /// the driver has stopped. The queue bound applies: an overloaded engine drops it silently.
    pub fn submit_detached(&self, request: EngineRequest) -> bool {
        self.commands
            .send(Command::Submit {
                request,
                events: None,
                reply: None,
            })
            .is_ok()
    }

    /// Cancels a request (no-op if it already finished or the driver stopped).
    pub fn cancel(&self, id: RequestId) {
        // A send error means the driver is gone, and the request with it.
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// The cluster's current state.
    pub async fn snapshot(&self) -> Result<LiveStats, SubmitError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Snapshot(reply))
            .map_err(|_| SubmitError::Stopped)?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }
}

/// The state the driver task owns.
struct Driver {
    /// The engine.
    cluster: Cluster,
    /// Wall-clock instant of `SimTime::ZERO`.
    epoch: Instant,
    /// Event channel of every unfinished request someone listens to.
    listeners: BTreeMap<RequestId, mpsc::UnboundedSender<Event>>,
    /// Queue bound, if any.
    max_waiting: Option<usize>,
    /// Sum of reused tokens at first admission.
    prefix_hit_tokens: u64,
    /// Sum of submitted prompt lengths.
    prompt_tokens: u64,
    /// Requests cancelled for a departed client.
    cancelled: u64,
    /// Requests admitted at least once and not done (only the first admission counts hits).
    admitted: std::collections::BTreeSet<RequestId>,
}

impl Driver {
    fn now(&self) -> SimTime {
        SimTime(self.epoch.elapsed().as_micros() as u64)
    }

    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let deadline = self
                .cluster
                .next_event_time()
                .map(|t| self.epoch + Duration::from_micros(t.as_micros()));
            tokio::select! {
                biased;
                // Due engine work first: requests arriving during a pass wait for the next one,
                // as on a real engine, and a flood of commands cannot starve the passes.
                () = sleep_until(deadline), if deadline.is_some() => {
                    let now = self.now();
                    let outputs = self.cluster.advance(now);
                    self.dispatch(outputs);
                }
                command = commands.recv() => match command {
                    Some(command) => self.handle(command),
                    None => return,
                },
            }
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit {
                request,
                events,
                reply,
            } => {
                if let Some(limit) = self.max_waiting {
                    let stats = self.cluster.snapshot();
                    let waiting = stats.parked
                        + stats
                            .workers
                            .iter()
                            .map(|w| w.scheduler.waiting)
                            .sum::<usize>();
                    if waiting >= limit {
                        if let Some(reply) = reply {
                            // The handler may have gone; nothing to undo either way.
                            let _ = reply.send(Err(SubmitError::Overloaded { waiting }));
                        }
                        return;
                    }
                }
                self.prompt_tokens += request.prompt.len as u64;
                let now = self.now();
                let id = self.cluster.submit(request, now);
                if let Some(events) = events {
                    self.listeners.insert(id, events);
                }
                if let Some(reply) = reply {
                    if reply.send(Ok(id)).is_err() {
                        // The handler went away before it learnt the id.
                        self.cancel(id);
                    }
                }
            }
            Command::Cancel(id) => self.cancel(id),
            Command::Snapshot(reply) => {
                let _ = reply.send(LiveStats {
                    cluster: self.cluster.snapshot(),
                    prefix_hit_tokens: self.prefix_hit_tokens,
                    prompt_tokens: self.prompt_tokens,
                    cancelled: self.cancelled,
                });
            }
        }
    }

    fn cancel(&mut self, id: RequestId) {
        self.listeners.remove(&id);
        self.admitted.remove(&id);
        let now = self.now();
        if self.cluster.cancel(id, now) {
            self.cancelled += 1;
        }
    }

    fn dispatch(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            let (id, event, last) = match output {
                // The hand-off is visible in the cluster's counters (snapshot), not to the client.
                Output::KvTransfer { .. } => continue,
                Output::Admitted {
                    id, reused_tokens, ..
                } => {
                    if self.admitted.insert(id) {
                        self.prefix_hit_tokens += reused_tokens as u64;
                    }
                    (id, Event::Admitted { reused_tokens }, false)
                }
                Output::Token {
                    id, token, index, ..
                } => (id, Event::Token { token, index }, false),
                Output::Finished { id, .. } => (id, Event::Finished, true),
                Output::Preempted { id, .. } => (id, Event::Preempted, false),
                Output::Rejected { id, reason, .. } => (id, Event::Rejected(reason), true),
            };
            if last {
                self.admitted.remove(&id);
            }
            let Some(listener) = self.listeners.get(&id) else {
                continue;
            };
            if listener.send(event).is_err() {
                // The client went away.
                if !last {
                    self.cancel(id);
                }
                self.listeners.remove(&id);
            } else if last {
                self.listeners.remove(&id);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    if let Some(d) = deadline {
        tokio::time::sleep_until(d).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use servesim::cluster::ClusterConfig;
    use servesim::perf::Fixed;
    use servesim::request::Prompt;

    use super::*;

    fn handle() -> EngineHandle {
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        config.engine.latency.model = Arc::new(Fixed {
            prefill_ms: 20.0,
            decode_ms: 5.0,
        });
        let cluster = Cluster::new(config).expect("valid config");
        EngineHandle::spawn(cluster, None)
    }

    fn request(max_output_tokens: usize) -> EngineRequest {
        EngineRequest {
            prompt: Prompt::from_tokens(&[1, 2, 3, 4, 5, 6], 4),
            max_output_tokens,
            output_tokens: vec![7, 8, 9],
        }
    }

    // Paused time (no sockets here): simulated microseconds map 1:1 to tokio time.
    #[tokio::test(start_paused = true)]
    async fn tokens_arrive_at_simulated_times() {
        let engine = handle();
        let start = Instant::now();
        let mut sub = engine.submit(request(3)).await.expect("submitted");
        let mut seen = Vec::new();
        while let Some(event) = sub.events.recv().await {
            let done = event == Event::Finished;
            if let Event::Token { token, index } = event {
                seen.push((token, index, start.elapsed().as_millis()));
            }
            if done {
                sub.mark_done();
                break;
            }
        }
        assert_eq!(seen, vec![(7, 1, 20), (8, 2, 25), (9, 3, 30)]);
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, 0);
        assert_eq!(live.prompt_tokens, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn disagg_hand_off_is_a_timed_event_of_the_driver() {
        use servesim::cluster::{KvTransferConfig, ServingMode};
        let mut config = ClusterConfig {
            serving: ServingMode::Disagg {
                num_prefill_workers: 1,
                num_decode_workers: 1,
                kv_transfer: KvTransferConfig {
                    kv_bytes_per_token: Some(1_000_000),
                    bandwidth_gbps: 1.0,
                    ..KvTransferConfig::default()
                },
            },
            ..ClusterConfig::default()
        };
        config.engine.block_size = 4;
        config.engine.latency.model = Arc::new(Fixed {
            prefill_ms: 20.0,
            decode_ms: 5.0,
        });
        let engine = EngineHandle::spawn(Cluster::new(config).expect("valid"), None);
        let start = Instant::now();
        let mut sub = engine.submit(request(3)).await.expect("submitted");
        let mut seen = Vec::new();
        while let Some(event) = sub.events.recv().await {
            if let Event::Token { index, .. } = event {
                seen.push((index, start.elapsed().as_millis()));
            }
            if event == Event::Finished {
                sub.mark_done();
                break;
            }
        }
        // Prefill 20 ms, 6 prompt tokens at 1 ms each over the link, then 5 ms decode steps.
        assert_eq!(seen, vec![(1, 31), (2, 36), (3, 41)]);
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.kv_transfer_us, 6_000);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_submission_cancels_it() {
        let engine = handle();
        let mut sub = engine.submit(request(1000)).await.expect("submitted");
        while let Some(event) = sub.events.recv().await {
            if matches!(event, Event::Token { index: 3, .. }) {
                break;
            }
        }
        drop(sub);
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, 0);
        assert_eq!(live.cancelled, 1);
        assert_eq!(live.cluster.workers[0].scheduler.active_blocks, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_submissions() {
        let mut config = ClusterConfig::default();
        config.engine.max_num_seqs = 1;
        let engine = EngineHandle::spawn(Cluster::new(config).expect("valid"), Some(1));
        let _running = engine.submit(request(10)).await.expect("runs");
        let _waiting = engine.submit(request(10)).await.expect("waits");
        let third = engine.submit(request(10)).await;
        assert!(
            matches!(third, Err(SubmitError::Overloaded { waiting: 1 })),
            "{third:?}"
        );
    }
}
