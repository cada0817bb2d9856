//! The live driver: one tokio task advances the [`Cluster`] on time and maps simulated time to
//! the wall clock through its [`SimClock`]; [`EngineHandle`] is the cloneable way in.
//!
//! The cluster and the driver's bookkeeping sit behind one `std::sync::Mutex`. Handlers submit
//! and cancel under that lock themselves (the submission gets its id and simulated time at
//! once, with no round trip through the task, whose wake-ups cost a client tens of microseconds
//! of TTFT each on a small machine). The task sleeps until the cluster's next event, advances
//! the engine to that event's time and forwards each request's [`Output`](servesim::cluster::Output)s, unchanged, to that
//! request's channel ([`Event::Output`]). A closed channel means the client left: the request
//! is cancelled and its KV blocks freed.
//!
//! Before it is routed, a submission advances the engine through every event before its arrival
//! that a late wake-up of the task has not reached yet, so the router decides on the state the
//! engine had at that instant, as the offline replay's does (events at the arrival itself come
//! after it, as offline). A submission also advances the engine through what its arrival made
//! due (its admission, which starts its prefill at once on an idle worker), under the same lock,
//! and its handler sends its own request's outputs itself. The task is nudged only when the
//! engine's next event is now earlier than the wake-up it planned, or when that advance produced
//! outputs for other requests (which the task sends, in order). In a burst of submissions the
//! task then plans once for the burst instead of running once per submission, and no handler is
//! woken a second time for its own admission.
//!
//! Wake-ups: tokio's timer rounds every sleep up to its next millisecond tick, which made
//! tokens up to a millisecond late and decode steps shorter than a millisecond arrive in
//! bursts. The task therefore sleeps on a [`PreciseTimer`](crate::timer::PreciseTimer): a thread of the driver's own blocks
//! until shortly before the next event (by what its blocking waits overran lately), spins the
//! rest of the way (never while idle) and wakes the task, which forwards the outputs to the
//! handlers' tokio channels at once. Tokio's timer races it, and the task only proceeds once
//! tokio's clock has reached the event, so under tokio's paused test clock the driver keeps
//! following tokio time. An event already due is advanced to without sleeping, and so is every
//! event within [`COALESCE`] of the wall clock when the task wakes (one wake-up for the pass ends
//! of several workers that fall close together). The thread is joined when the task ends.
//!
//! One definition of a token's time: the engine's own stamp (`Output::Token::time`) against the
//! request's submission time ([`Submission::submitted`]). The handler's `nvext.timing` and the
//! latency histograms of [`Metrics`] (fed here, since the driver sees every output) are both
//! computed from those stamps, so they state what the engine modelled whatever the host load;
//! a late timer delays delivery, never the stamps. The driver also bounds speculative prefills
//! ([`MAX_SPECULATIVE_PREFILLS`] in flight; more are skipped and counted).
//!
//! Liveness: a request the engine can never run is refused at submission
//! ([`SubmitError::Rejected`]). A watchdog turns "no progress while work is pending" (requests
//! in flight but no next event, or [`STALL_ROUNDS`] advances in a row that emit nothing and do
//! not move the clock) into [`Event::Stalled`] for every request in flight, whose KV is freed,
//! instead of a spinning task. If the task ever ends unexpectedly (a panic), or the engine
//! panics in a submission's own advance (caught there), the handle's
//! [`EngineHandle::is_alive`] turns false, so `/health` stops reporting a healthy server, the
//! requests in flight end with an error, later submissions are refused, and the task ends.
//!
//! Files by role: this one holds the handle ([`EngineHandle`], [`Submission`]); `contract.rs`
//! what crosses between the driver and its callers; `clock.rs` the [`SimClock`]; `state.rs` the
//! state under the lock and the metrics fed from outputs; `task.rs` the task that wakes on time;
//! `watchdog.rs` the stall detector.

mod clock;
mod contract;
pub(crate) mod inflight;
mod state;
mod task;
mod watchdog;

use std::sync::{Arc, Mutex};

use servesim::cluster::Cluster;
use servesim::ids::{RequestId, WorkerId};
use servesim::request::EngineRequest;
use servesim::time::SimTime;
use tokio::sync::mpsc;

pub(crate) use clock::SimClock;
pub(crate) use contract::{ArrivalObserver, Event, LiveStats, SubmitError, SubmitOptions};
use state::{deliver, Driver};

use crate::kv_events::{KvEventPublisher, KvExport, KvSink};
use crate::metrics::Metrics;

/// A cloneable handle to the driver. The driver task ends when every handle is dropped.
///
/// Handlers submit, cancel and read snapshots themselves, under the lock of the driver's state
/// (a `std::sync::Mutex`, held for the few microseconds of one engine call and never across an
/// `.await`), and nudge the task only when its planned wake-up no longer fits the engine's
/// schedule. A submission thus gets its id and its simulated submission time at once, with no
/// round trip through the task: on a small machine each cross-thread wake-up costs tens of
/// microseconds, which a client would see in its time to first token.
#[derive(Clone)]
pub struct EngineHandle {
    /// The driver's state, shared by the task and every handle.
    driver: Arc<Mutex<Driver>>,
    /// Wakes the task to plan its next wake-up after a change that its planned wake-up misses;
    /// it closes when the task ends for any reason (a panic included), which is how `/health`
    /// learns that the engine is gone.
    wake: mpsc::UnboundedSender<()>,
    /// The driver's clock, shared so handlers convert the engine's stamps as the driver does.
    clock: SimClock,
    /// The bound on the memory of the requests in flight, shared by every endpoint of this
    /// engine (`--max-inflight-bytes`).
    inflight: Arc<inflight::InflightBudget>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("alive", &self.is_alive())
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// A submitted request: its id and its events. Dropping it cancels the request if unfinished.
#[derive(Debug)]
pub struct Submission {
    /// The engine's id.
    pub id: RequestId,
    /// When the engine received it (simulated): the origin of its TTFT and end-to-end latency,
    /// in responses and in `/metrics` alike.
    pub submitted: SimTime,
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

impl EngineHandle {
    /// Spawns the driver task on the current tokio runtime. `max_waiting` bounds the requests
    /// waiting for admission (router-parked plus worker queues); `metrics` receives the token
    /// counters and latencies. Settings that make the server useless (see
    /// [`startup_warnings`]) are printed to stderr as warnings.
    pub fn spawn(
        cluster: Cluster,
        max_waiting: Option<usize>,
        metrics: Arc<Metrics>,
    ) -> EngineHandle {
        EngineHandle::spawn_publishing(cluster, max_waiting, metrics, None)
    }

    /// [`EngineHandle::spawn`], and with `publisher` every worker's KV events are published
    /// after each engine advance (see [`crate::kv_events`]).
    pub fn spawn_publishing(
        mut cluster: Cluster,
        max_waiting: Option<usize>,
        metrics: Arc<Metrics>,
        publisher: Option<KvEventPublisher>,
    ) -> EngineHandle {
        let kv = publisher.map(|p| KvExport::new(&mut cluster, KvSink::Zmq(p)));
        for warning in startup_warnings(&cluster, max_waiting) {
            eprintln!("mockserve: warning: {warning}");
        }
        let (wake, woken) = mpsc::unbounded_channel();
        metrics.init_workers(cluster.workers().len());
        metrics.set_cache_config(cluster.workers().len(), &cluster.config().engine);
        let mut driver = Driver::new(cluster, max_waiting, metrics);
        driver.kv = kv;
        let clock = driver.clock;
        let driver = Arc::new(Mutex::new(driver));
        tokio::spawn(task::run(Arc::clone(&driver), woken));
        EngineHandle {
            driver,
            wake,
            clock,
            inflight: inflight::InflightBudget::new(crate::config::DEFAULT_MAX_INFLIGHT_BYTES),
        }
    }

    /// The bound on the memory of the requests in flight on this engine.
    pub(crate) fn inflight(&self) -> &Arc<inflight::InflightBudget> {
        &self.inflight
    }

    /// The driver's mapping between simulated time and the wall clock.
    pub fn clock(&self) -> SimClock {
        self.clock
    }

    /// False once the driver task has ended (the server is shutting down, or the engine task
    /// died) or the engine failed in a handler's call: no request will be served any more.
    pub fn is_alive(&self) -> bool {
        if self.wake.is_closed() {
            return false;
        }
        // Never waits: a lock held elsewhere (this handle's `Debug` under the lock, say) says
        // nothing about the engine's health.
        match self.driver.try_lock() {
            Ok(driver) => !driver.stopped,
            Err(std::sync::TryLockError::Poisoned(_)) => false,
            Err(std::sync::TryLockError::WouldBlock) => true,
        }
    }

    /// Runs `f` on the driver's state under its lock; `Stopped` once the task has ended (or
    /// died holding the lock).
    fn with_driver<T>(&self, f: impl FnOnce(&mut Driver) -> T) -> Result<T, SubmitError> {
        if self.wake.is_closed() {
            return Err(SubmitError::Stopped);
        }
        // Poisoned: the engine panicked (the task is ending).
        let mut driver = self.driver.lock().map_err(|_| SubmitError::Stopped)?;
        if driver.stopped {
            return Err(SubmitError::Stopped);
        }
        Ok(f(&mut driver))
    }

    /// Asks the task to plan its next wake-up again (the engine's schedule changed so that its
    /// planned wake-up is too late, or outputs wait in its outbox).
    fn nudge(&self) {
        // A send error means the task is gone; callers learn it at their next call.
        let _ = self.wake.send(());
    }

    /// Submits a request (routed, or run on `pinned`) and returns its event stream.
    pub async fn submit(
        &self,
        request: EngineRequest,
        pinned: Option<WorkerId>,
    ) -> Result<Submission, SubmitError> {
        let options = SubmitOptions {
            pinned,
            ..SubmitOptions::new(request.max_output_tokens)
        };
        self.submit_as(request, options).await
    }

    /// [`EngineHandle::submit`] with every option (see [`SubmitOptions`]).
    ///
    /// The submission happens before this returns (it never waits on the driver task).
    pub async fn submit_as(
        &self,
        request: EngineRequest,
        options: SubmitOptions,
    ) -> Result<Submission, SubmitError> {
        let (events_tx, events) = mpsc::unbounded_channel();
        let ((id, submitted), nudge) = self.with_driver(|d| {
            let submitted = d.submit(request, options, events_tx)?;
            // What the arrival made due (its admission) is advanced to here, not in a task
            // run of its own.
            let Ok(next) = d.catch_up() else {
                // The engine failed: this request's events end at once; the task ends.
                return Ok((submitted, true));
            };
            // Sent under the lock, so that they come before any the task sends later; nobody
            // waits on this new channel yet, so sending wakes no one.
            deliver(d.take_own(submitted.0));
            Ok((submitted, d.needs_plan(next)))
        })??;
        if nudge {
            self.nudge();
        }
        Ok(Submission {
            id,
            submitted,
            events,
            handle: self.clone(),
            done: false,
        })
    }

    /// Has `observer` told of every pinned submission from now on (see [`ArrivalObserver`]);
    /// false when the driver has stopped.
    pub fn observe_arrivals(&self, observer: Arc<dyn ArrivalObserver>) -> bool {
        self.with_driver(|d| d.observer = Some(observer)).is_ok()
    }

    /// Submits a speculative prefill: nobody reads its outputs and it runs to completion. It is
    /// skipped (and counted) when [`MAX_SPECULATIVE_PREFILLS`] run already or the queue bound
    /// is reached; false when the driver has stopped.
    pub fn submit_speculative(&self, request: EngineRequest) -> bool {
        self.submit_speculative_on(request, None)
    }

    /// [`EngineHandle::submit_speculative`], run on `pinned` instead of routed when given.
    pub fn submit_speculative_on(&self, request: EngineRequest, pinned: Option<WorkerId>) -> bool {
        let nudge = self.with_driver(|d| {
            d.speculative(request, pinned);
            // The task ends if the engine failed.
            d.catch_up().map_or(true, |next| d.needs_plan(next))
        });
        if nudge == Ok(true) {
            self.nudge();
        }
        nudge.is_ok()
    }

    /// Cancels a request (no-op if it already finished or the driver stopped).
    pub fn cancel(&self, id: RequestId) {
        // An error means the driver is gone, and the request with it. Freed KV may let a
        // waiting request in at once: the task admits it.
        let nudge = self.with_driver(|d| {
            d.cancel(id);
            let next = d.cluster.next_event_time();
            d.needs_plan(next)
        });
        if nudge == Ok(true) {
            self.nudge();
        }
    }

    /// The cluster's current state.
    pub async fn snapshot(&self) -> Result<LiveStats, SubmitError> {
        self.with_driver(|d| d.snapshot())
    }

    /// Empties the prefix cache of `only` that worker, or of every worker, where idle (vLLM's
    /// `POST /reset_prefix_cache`); each publishes `AllBlocksCleared` (with
    /// `--kv-events-endpoint`) and its router forgets its blocks. Per worker asked, whether it
    /// was reset (false: it was running requests).
    pub async fn reset_prefix_cache(
        &self,
        only: Option<WorkerId>,
    ) -> Result<Vec<(WorkerId, bool)>, SubmitError> {
        self.with_driver(|d| {
            let workers: Vec<usize> = match only {
                Some(w) => vec![w.0 as usize],
                None => (0..d.cluster.workers().len()).collect(),
            };
            let reset = workers
                .into_iter()
                .map(|w| (WorkerId(w as u32), d.cluster.reset_prefix_cache(w)))
                .collect();
            let now = d.clock.now();
            d.export_kv_events(&[], now);
            reset
        })
    }
}

/// Settings under which the live server refuses some or all requests, as sentences for a
/// warning: the cluster's ([`servesim::cluster::ClusterConfig::warnings`]) and a queue bound of
/// 0, which refuses every request with 429.
pub(crate) fn startup_warnings(cluster: &Cluster, max_waiting: Option<usize>) -> Vec<String> {
    let mut out = cluster.config().warnings();
    if max_waiting == Some(0) {
        out.push("--max-waiting 0 refuses every request (429): nothing may wait".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use servesim::cluster::{ClusterConfig, Output};
    use servesim::perf::Fixed;
    use servesim::request::Prompt;
    use servesim::scheduler::RejectReason;
    use tokio::time::Instant;

    use super::contract::MAX_BACKDATE_US;
    use super::state::MAX_SPECULATIVE_PREFILLS;
    use super::*;
    use crate::metrics::{FinishedLabel, SkipLabel, FINISHED_LENGTH, SKIP_IN_FLIGHT};

    fn handle() -> EngineHandle {
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        config.engine.latency.model = Arc::new(Fixed {
            prefill_ms: 20.0,
            decode_ms: 5.0,
        });
        let cluster = Cluster::new(config).expect("valid config");
        EngineHandle::spawn(cluster, None, Arc::default())
    }

    fn request(max_output_tokens: usize) -> EngineRequest {
        EngineRequest {
            prompt: Prompt::from_tokens(&[1, 2, 3, 4, 5, 6], 4),
            max_output_tokens,
            output_tokens: vec![7, 8, 9],
        }
    }

    fn is_finished(event: &Event) -> bool {
        matches!(event, Event::Output(Output::Finished { .. }))
    }

    // Paused time (no sockets here): simulated microseconds map 1:1 to tokio time.
    #[tokio::test(start_paused = true)]
    async fn tokens_arrive_at_simulated_times() {
        let engine = handle();
        let start = Instant::now();
        let mut sub = engine.submit(request(3), None).await.expect("submitted");
        let mut seen = Vec::new();
        while let Some(event) = sub.events.recv().await {
            let done = is_finished(&event);
            if let Event::Output(Output::Token {
                token, index, time, ..
            }) = event
            {
                // Delivered at its simulated time, and stamped with it.
                let stamp = time.saturating_since(sub.submitted).as_micros() / 1000;
                assert_eq!(u128::from(stamp), start.elapsed().as_millis());
                seen.push((token, index, stamp));
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

    // Real time (the timer thread's clock cannot pause), on a multi-threaded runtime as in
    // the server, receiving in a task of its own as a handler does. Decode steps of half of
    // tokio's 1 ms timer tick: woken by tokio's timer alone, tokens come in pairs, one per
    // tick (every other gap near zero).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "real time: .ci/run runs it alone, after the test command"]
    async fn short_decode_steps_arrive_on_time_without_bursts() {
        // A few tries (tokio's timer alone fails every one).
        crate::timer::real_time::until_one_passes(short_decode_steps_once).await;
    }

    /// One try of [`short_decode_steps_arrive_on_time_without_bursts`]: 200 tokens 0.5 ms
    /// apart.
    async fn short_decode_steps_once() -> Result<(), String> {
        const TOKENS: usize = 200;
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        config.engine.latency.model = Arc::new(Fixed {
            prefill_ms: 2.0,
            decode_ms: 0.5,
        });
        let engine =
            EngineHandle::spawn(Cluster::new(config).expect("valid"), None, Arc::default());
        let clock = engine.clock();
        let mut sub = engine
            .submit(request(TOKENS), None)
            .await
            .expect("submitted");
        let handler = tokio::spawn(async move {
            // (arrival, stamp) of each token.
            let mut seen = Vec::new();
            while let Some(event) = sub.events.recv().await {
                let now = Instant::now();
                if let Event::Output(Output::Token { time, .. }) = &event {
                    seen.push((now, *time));
                }
                if is_finished(&event) {
                    sub.mark_done();
                }
            }
            seen
        });
        let seen = tokio::time::timeout(Duration::from_secs(30), handler)
            .await
            .expect("finished in time")
            .expect("handler ran");
        assert_eq!(seen.len(), TOKENS);
        let mut gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].0 - w[0].0).collect();
        let mut late: Vec<Duration> = seen
            .iter()
            .map(|(at, stamp)| {
                at.saturating_duration_since(clock.instant(*stamp).expect("in range"))
            })
            .collect();
        gaps.sort();
        late.sort();
        // Generous bounds for a loaded CI box, where a stalled process delivers what fell due
        // meanwhile at once (tokio's timer alone: over half the gaps near zero, the median
        // ~0, tokens ~0.8 ms late); the benchmark has the tight figures.
        let bursts = gaps
            .iter()
            .filter(|g| **g < Duration::from_micros(100))
            .count();
        let median = gaps[gaps.len() / 2];
        let median_late = late[late.len() / 2];
        let on_time = bursts < gaps.len() / 3
            && median > Duration::from_micros(300)
            && median < Duration::from_micros(700)
            && median_late < Duration::from_micros(600);
        if on_time {
            Ok(())
        } else {
            Err(format!(
                "{bursts} of {} gaps under 0.1 ms, median gap {median:?}, median lateness \
                 {median_late:?}",
                gaps.len()
            ))
        }
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
        let engine =
            EngineHandle::spawn(Cluster::new(config).expect("valid"), None, Arc::default());
        let start = Instant::now();
        let mut sub = engine.submit(request(3), None).await.expect("submitted");
        let mut seen = Vec::new();
        while let Some(event) = sub.events.recv().await {
            if let Event::Output(Output::Token { index, .. }) = event {
                seen.push((index, start.elapsed().as_millis()));
            }
            if is_finished(&event) {
                sub.mark_done();
                break;
            }
        }
        // Prefill 20 ms, 6 prompt tokens at 1 ms each over the link, then 5 ms decode steps.
        assert_eq!(seen, vec![(1, 31), (2, 36), (3, 41)]);
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.kv_transfer_ns, 6_000_000);
    }

    #[tokio::test(start_paused = true)]
    async fn the_receipt_is_the_arrival_within_max_backdate() {
        let engine = handle();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = engine.clock().now().as_micros();
        let received = |t: u64| SubmitOptions {
            received: Some(SimTime::from_micros(t)),
            ..SubmitOptions::new(3)
        };
        let mut sub = engine
            .submit_as(request(3), received(now - 300))
            .await
            .expect("submitted");
        assert_eq!(sub.submitted, SimTime::from_micros(now - 300));
        // The engine's clock starts at the receipt: the first token 20 ms after it.
        let first = loop {
            match sub.events.recv().await {
                Some(Event::Output(Output::Token { time, .. })) => break time,
                Some(_) => {}
                None => panic!("no token"),
            }
        };
        assert_eq!(first, SimTime::from_micros(now - 300 + 20_000));
        // Too long ago: at most MAX_BACKDATE_US before the submission. Later than now: now.
        let now = engine.clock().now().as_micros();
        let old = engine
            .submit_as(request(3), received(0))
            .await
            .expect("submitted");
        assert_eq!(old.submitted, SimTime::from_micros(now - MAX_BACKDATE_US));
        let ahead = engine
            .submit_as(request(3), received(now + 5_000))
            .await
            .expect("submitted");
        assert_eq!(ahead.submitted, SimTime::from_micros(now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_submission_is_admitted_before_it_returns() {
        let mut config = ClusterConfig {
            num_workers: 4,
            ..ClusterConfig::default()
        };
        config.engine.block_size = 4;
        let engine =
            EngineHandle::spawn(Cluster::new(config).expect("valid"), None, Arc::default());
        let mut subs = Vec::new();
        for _ in 0..4 {
            let mut sub = engine.submit(request(2), None).await.expect("submitted");
            // No task run in between: the submission's own advance admitted it.
            let admitted = sub.events.try_recv();
            assert!(
                matches!(admitted, Ok(Event::Output(Output::Admitted { .. }))),
                "{admitted:?}"
            );
            subs.push(sub);
        }
        // The task still delivers the rest on time.
        for mut sub in subs {
            let mut last = None;
            while let Some(event) = sub.events.recv().await {
                last = Some(event);
            }
            sub.mark_done();
            assert!(last.as_ref().is_some_and(is_finished), "{last:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_submission_cancels_it() {
        let engine = handle();
        let mut sub = engine.submit(request(1000), None).await.expect("submitted");
        while let Some(event) = sub.events.recv().await {
            if matches!(event, Event::Output(Output::Token { index: 3, .. })) {
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
    async fn speculative_prefills_are_bounded_and_counted() {
        let metrics = Arc::new(Metrics::new());
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        let cluster = Cluster::new(config).expect("valid config");
        let engine = EngineHandle::spawn(cluster, None, Arc::clone(&metrics));
        for _ in 0..MAX_SPECULATIVE_PREFILLS + 2 {
            assert!(engine.submit_speculative(request(1)));
        }
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, MAX_SPECULATIVE_PREFILLS);
        assert_eq!(
            metrics.spec_submitted.get(),
            MAX_SPECULATIVE_PREFILLS as u64
        );
        let skipped = metrics.spec_skipped.get_or_create(&SkipLabel {
            reason: SKIP_IN_FLIGHT,
        });
        assert_eq!(skipped.get(), 2);
        // Once they finish, the slots are free again.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(metrics.spec_in_flight.get(), 0);
        assert!(engine.submit_speculative(request(1)));
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, 1);
        assert_eq!(
            metrics.spec_submitted.get(),
            MAX_SPECULATIVE_PREFILLS as u64 + 1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn pinned_requests_run_on_their_worker() {
        let mut config = ClusterConfig {
            num_workers: 3,
            ..ClusterConfig::default()
        };
        config.engine.block_size = 4;
        let cluster = Cluster::new(config).expect("valid config");
        let metrics = Arc::new(Metrics::new());
        let engine = EngineHandle::spawn(cluster, None, Arc::clone(&metrics));
        for w in [2, 0, 2, 1] {
            let mut sub = engine
                .submit(request(2), Some(WorkerId(w)))
                .await
                .expect("submitted");
            let admitted = sub.events.recv().await;
            assert!(
                matches!(
                    admitted,
                    Some(Event::Output(Output::Admitted { worker, .. })) if worker == WorkerId(w)
                ),
                "{admitted:?}"
            );
            while let Some(event) = sub.events.recv().await {
                if is_finished(&event) {
                    sub.mark_done();
                }
            }
        }
        assert_eq!(metrics.pinned.get(), 4);
        let bad = engine.submit(request(2), Some(WorkerId(3))).await;
        assert!(
            matches!(
                bad,
                Err(SubmitError::NoSuchWorker {
                    worker: 3,
                    num_workers: 3
                })
            ),
            "{bad:?}"
        );
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, 0);
        let served: Vec<u64> = (0..3)
            .map(|w| {
                metrics
                    .success
                    .get_or_create(&FinishedLabel {
                        model_name: "mock-model".into(),
                        engine: w,
                        finished_reason: FINISHED_LENGTH,
                    })
                    .get()
            })
            .collect();
        assert_eq!(served, vec![1, 1, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_submissions() {
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        config.engine.max_num_seqs = 1;
        let engine = EngineHandle::spawn(
            Cluster::new(config).expect("valid"),
            Some(1),
            Arc::default(),
        );
        let mut running = engine.submit(request(10), None).await.expect("runs");
        // Admitted at the driver's next step, after which it no longer waits.
        let admitted = running.events.recv().await;
        assert!(
            matches!(admitted, Some(Event::Output(Output::Admitted { .. }))),
            "{admitted:?}"
        );
        let _waiting = engine.submit(request(10), None).await.expect("waits");
        let third = engine.submit(request(10), None).await;
        assert!(
            matches!(third, Err(SubmitError::Overloaded { waiting: 1 })),
            "{third:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_the_engine_can_never_run_are_refused_at_submission() {
        let engine = handle();
        let empty = EngineRequest {
            prompt: Prompt::from_tokens(&[], 4),
            max_output_tokens: 3,
            output_tokens: Vec::new(),
        };
        let refused = engine.submit(empty, None).await;
        assert!(
            matches!(
                refused,
                Err(SubmitError::Rejected(RejectReason::EmptyPrompt))
            ),
            "{refused:?}"
        );
        // The engine is not wedged: the next request runs and the driver still answers.
        let mut sub = engine.submit(request(2), None).await.expect("submitted");
        let mut last = None;
        while let Some(event) = sub.events.recv().await {
            last = Some(event);
        }
        sub.mark_done();
        assert!(last.as_ref().is_some_and(is_finished), "{last:?}");
        let live = engine.snapshot().await.expect("snapshot");
        assert_eq!(live.cluster.active_requests, 0);
        assert_eq!(live.prompt_tokens, 6, "a refused prompt is not counted");
    }

    /// A latency model that fails: the engine task panics at its first pass.
    #[derive(Debug)]
    struct Explodes;

    impl servesim::perf::LatencyModel for Explodes {
        fn prefill_ms(&self, _: &servesim::perf::PrefillBatch) -> f64 {
            panic!("injected latency-model failure")
        }
        fn decode_ms(&self, _: &servesim::perf::DecodeBatch) -> f64 {
            1.0
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_engine_task_reports_itself_dead() {
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        config.engine.latency.model = Arc::new(Explodes);
        let engine =
            EngineHandle::spawn(Cluster::new(config).expect("valid"), None, Arc::default());
        assert!(engine.is_alive());
        let mut sub = engine.submit(request(2), None).await.expect("submitted");
        // The task dies at the first pass: the request's events end without Finished.
        while let Some(event) = sub.events.recv().await {
            assert!(!is_finished(&event), "{event:?}");
        }
        sub.mark_done();
        tokio::task::yield_now().await;
        assert!(!engine.is_alive());
        let later = engine.submit(request(2), None).await;
        assert!(matches!(later, Err(SubmitError::Stopped)), "{later:?}");
    }

    #[test]
    fn a_queue_bound_of_zero_is_warned_about() {
        let cluster = Cluster::new(ClusterConfig::default()).expect("valid");
        assert!(startup_warnings(&cluster, Some(1)).is_empty());
        let warnings = startup_warnings(&cluster, Some(0));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("--max-waiting 0 refuses every request")),
            "{warnings:?}"
        );
    }
}
