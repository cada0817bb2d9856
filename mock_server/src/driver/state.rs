//! The driver's state under its lock ([`Driver`]): the engine, every unfinished request's
//! bookkeeping and event channel, the metrics fed from the engine's outputs, and the outbox of
//! events sent once the lock is released. Handles and the task call into it; it never awaits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use servesim::cluster::{Cluster, Output, SubmitToError};
use servesim::ids::{RequestId, WorkerId};
use servesim::request::EngineRequest;
use servesim::time::SimTime;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::clock::SimClock;
use super::contract::{
    ArrivalObserver, Event, LiveStats, SubmitError, SubmitOptions, MAX_BACKDATE_US,
};
use super::watchdog::Watchdog;
use crate::kv_events::tokens::LoraTag;
use crate::kv_events::KvExport;
use crate::metrics::{
    FinishedLabel, Metrics, SkipLabel, WorkerLabel, FINISHED_LENGTH, SKIP_IN_FLIGHT,
    SKIP_QUEUE_FULL,
};

/// Speculative prefills running at once at most (Dynamo's `MAX_BLOCKING_PREFILLS`); one more is
/// skipped, not queued.
pub(crate) const MAX_SPECULATIVE_PREFILLS: usize = 4;

/// How far ahead of the wall clock the driver task advances the engine when it wakes: events
/// due within this window are taken in the same wake-up, their outputs leaving up to this much
/// early (their stamps unchanged), instead of each costing a timer wake-up of its own (with
/// several workers, every worker's pass end is an event of its own). It is the kernel's slack
/// on the timer thread's blocking wait (50 µs), by which a wake-up may be late anyway; tokens
/// then also share body frames more often, which saves CPU per request at high speed-ups.
pub(crate) const COALESCE: Duration = Duration::from_micros(50);

/// Events at most that the driver task advances through per wake-up before it lets the
/// runtime run other tasks (it comes back at once if more are due).
const MAX_STEPS_PER_WAKE: usize = 256;

/// The driver's state: the engine and what only the driver sees, shared by the task and the
/// handles behind one lock.
pub(super) struct Driver {
    /// The engine.
    pub(super) cluster: Cluster,
    /// Simulated time against the wall clock.
    pub(super) clock: SimClock,
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
    /// Every unfinished request, for metrics and the speculative bound.
    tracked: BTreeMap<RequestId, Tracked>,
    /// When the latest request was submitted.
    last_submit: SimTime,
    /// Speculative prefills among `tracked`.
    speculative_in_flight: usize,
    /// Counts advances that made no progress.
    watchdog: Watchdog,
    /// Counters and histograms fed from outputs.
    metrics: Arc<Metrics>,
    /// KV events published to outside routers, if asked for.
    pub(super) kv: Option<KvExport>,
    /// Tokens processed per worker in the advance being dispatched.
    step_tokens: BTreeMap<u32, u64>,
    /// The driver task has ended: nothing is served any more.
    pub(super) stopped: bool,
    /// Events the task sends once it has released the lock, in order.
    pub(super) outbox: Vec<Delivery>,
    /// The engine event the task last planned its wake-up for (`None`: it waits for a nudge
    /// only). A change that brings the next event earlier nudges the task; others leave it
    /// asleep.
    pub(super) planned: Option<SimTime>,
    /// A nudge is on its way to the task, which plans again when it gets it: later changes need
    /// not send another.
    pub(super) nudged: bool,
    /// Told of every pinned submission, if set ([`EngineHandle::observe_arrivals`]).
    pub(super) observer: Option<Arc<dyn ArrivalObserver>>,
}

/// What the driver remembers of an unfinished request.
#[derive(Debug)]
struct Tracked {
    /// When it was submitted.
    submitted: SimTime,
    /// Prompt length.
    prompt_len: usize,
    /// Output limit.
    max_tokens: usize,
    /// When it was first admitted.
    admitted: Option<SimTime>,
    /// When its first token was emitted.
    first_token: Option<SimTime>,
    /// Tokens emitted so far.
    generated: usize,
    /// Its worker, once admitted.
    worker: Option<WorkerId>,
    /// When its latest token was emitted.
    last_token: Option<SimTime>,
    /// A speculative prefill.
    speculative: bool,
    /// Its LoRA adapter, if any.
    lora: Option<Arc<LoraTag>>,
    /// Why it ends (`vllm:request_success`'s `finished_reason`).
    finish_reason: &'static str,
}

impl Driver {
    pub(super) fn new(
        cluster: Cluster,
        max_waiting: Option<usize>,
        metrics: Arc<Metrics>,
    ) -> Driver {
        Driver {
            cluster,
            clock: SimClock::start(),
            listeners: BTreeMap::new(),
            max_waiting,
            prefix_hit_tokens: 0,
            prompt_tokens: 0,
            cancelled: 0,
            tracked: BTreeMap::new(),
            speculative_in_flight: 0,
            last_submit: SimTime::ZERO,
            watchdog: Watchdog::default(),
            metrics,
            kv: None,
            step_tokens: BTreeMap::new(),
            stopped: false,
            outbox: Vec::new(),
            planned: None,
            nudged: false,
            observer: None,
        }
    }

    fn now(&self) -> SimTime {
        self.clock.now()
    }

    /// The engine's next event; fails every request in flight when there is none (the engine
    /// would never wake up for them).
    fn next_wake(&mut self) -> Option<SimTime> {
        let next = self.cluster.next_event_time();
        self.wake_for(next)
    }

    /// `next`, the engine's next event as it just reported it, unless there is none while
    /// requests are in flight: they are failed then (the engine would never wake up for them),
    /// and the next event is asked for again.
    fn wake_for(&mut self, next: Option<SimTime>) -> Option<SimTime> {
        if next.is_none() && !self.tracked.is_empty() {
            self.fail_stalled();
            return self.cluster.next_event_time();
        }
        next
    }

    /// Advances the engine through every event due by `until` (the wall clock), one at a time,
    /// at most [`MAX_STEPS_PER_WAKE`] (the lock is released between batches); returns the
    /// engine's next event after them.
    pub(super) fn advance_due(&mut self, until: Instant) -> Option<SimTime> {
        let mut next = self.next_wake();
        for _ in 0..MAX_STEPS_PER_WAKE {
            let due = next?;
            if self.clock.instant(due).is_none_or(|at| at > until) {
                break;
            }
            next = self.step(due);
        }
        next
    }

    /// [`Driver::advance_due`] to now for a handle, after its change made events due. A panic
    /// of the engine there stops the driver as one in the task would (the requests in flight
    /// end with an error, later calls are refused): `Err` then, and the caller nudges the task,
    /// which ends.
    pub(super) fn catch_up(&mut self) -> Result<Option<SimTime>, SubmitError> {
        let until = Instant::now() + COALESCE;
        let advanced =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.advance_due(until)));
        advanced.map_err(|_| {
            self.stop();
            SubmitError::Stopped
        })
    }

    /// Advances the engine through its events before `arrival`, which a late wake-up of the
    /// task may not have reached yet: a request is routed on the state the engine had at its
    /// arrival (a pass that ended before it has freed its load and stored its blocks), as the
    /// offline replay routes it. Events at `arrival` itself come after it, as offline. A panic
    /// of the engine there stops the driver, as in [`Driver::catch_up`].
    fn advance_before(&mut self, arrival: SimTime) -> Result<(), SubmitError> {
        let advanced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut next = self.next_wake();
            for _ in 0..MAX_STEPS_PER_WAKE {
                match next {
                    Some(due) if due < arrival => next = self.step(due),
                    _ => break,
                }
            }
        }));
        advanced.map_err(|_| {
            self.stop();
            SubmitError::Stopped
        })
    }

    /// Ends service: every request's event channel closes (its handler answers with an error),
    /// and later calls are refused.
    pub(super) fn stop(&mut self) {
        self.stopped = true;
        self.listeners.clear();
        self.outbox.clear();
    }

    /// Whether a change that left the engine's next event at `next` must nudge the task: the
    /// event comes before the task's planned wake-up, or outputs wait in the outbox (the task
    /// sends them, in order with the rest). At most one nudge is on its way at a time.
    pub(super) fn needs_plan(&mut self, next: Option<SimTime>) -> bool {
        let earlier = next.is_some_and(|t| self.planned.is_none_or(|p| t < p));
        let nudge = !self.nudged && (earlier || !self.outbox.is_empty());
        self.nudged |= nudge;
        nudge
    }

    /// The outbox, if it holds events of request `id` alone (a request just submitted, whose
    /// handler does not wait on its channel yet), for its handler to send; else nothing, and
    /// the task sends the outbox.
    pub(super) fn take_own(&mut self, id: RequestId) -> Vec<Delivery> {
        if self.outbox.iter().all(|d| d.id == id) {
            std::mem::take(&mut self.outbox)
        } else {
            Vec::new()
        }
    }

    /// Advances the engine to its event at `next`, forwards the outputs and returns the
    /// engine's next event after it.
    fn step(&mut self, next: SimTime) -> Option<SimTime> {
        // Advance to the event's own time, not the (later) wake-up: the timer's lateness then
        // delays delivery but never accumulates into the simulated schedule (the next pass
        // starts when this one ended). Work submitted since then starts no earlier than its
        // arrival.
        let now = next.max(self.last_submit);
        let outputs = self.cluster.advance(now);
        let next = self.cluster.next_event_time();
        let stalled = self.watchdog.after_advance(outputs.len(), next, now);
        self.export_kv_events(&outputs, now);
        self.dispatch(outputs);
        if stalled {
            self.fail_stalled();
            return self.next_wake();
        }
        // Dispatching changes the driver's bookkeeping, not the engine's schedule.
        self.wake_for(next)
    }

    /// Submits a handler's request: its id and simulated submission time, or why it was
    /// refused.
    pub(super) fn submit(
        &mut self,
        request: EngineRequest,
        options: SubmitOptions,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<(RequestId, SimTime), SubmitError> {
        let SubmitOptions {
            pinned,
            lora,
            finish_reason,
            max_tokens,
            received,
        } = options;
        self.check_queue()?;
        let now = self.now();
        let earliest = SimTime::from_nanos(
            now.as_nanos()
                .saturating_sub(SimTime::from_micros(MAX_BACKDATE_US).as_nanos()),
        );
        let arrival = received.map_or(now, |r| r.clamp(earliest, now));
        self.advance_before(arrival)?;
        if let (Some(observer), Some(worker)) = (&self.observer, pinned) {
            observer.arrived(&self.cluster, &request, worker, arrival);
        }
        let id = self.start(request, pinned, false, arrival)?;
        if let Some(t) = self.tracked.get_mut(&id) {
            t.finish_reason = finish_reason;
            t.max_tokens = max_tokens;
        }
        self.set_lora(id, lora);
        self.listeners.insert(id, events);
        Ok((id, arrival))
    }

    /// Starts a speculative prefill unless [`MAX_SPECULATIVE_PREFILLS`] run already or the
    /// queue is full (skipped and counted then).
    pub(super) fn speculative(&mut self, request: EngineRequest, pinned: Option<WorkerId>) {
        let skip = if self.speculative_in_flight >= MAX_SPECULATIVE_PREFILLS {
            Some(SKIP_IN_FLIGHT)
        } else if self.check_queue().is_err() {
            Some(SKIP_QUEUE_FULL)
        } else {
            None
        };
        match skip {
            Some(reason) => {
                self.metrics
                    .spec_skipped
                    .get_or_create(&SkipLabel { reason })
                    .inc();
            }
            None => {
                // A prompt the engine refuses is not warmed (nor counted as submitted).
                let now = self.now();
                if self.start(request, pinned, true, now).is_ok() {
                    self.speculative_in_flight += 1;
                    self.metrics.spec_submitted.inc();
                    self.metrics
                        .spec_in_flight
                        .set(self.speculative_in_flight as i64);
                }
            }
        }
    }

    /// The cluster's snapshot and the driver's own counters.
    pub(super) fn snapshot(&self) -> LiveStats {
        LiveStats {
            cluster: self.cluster.snapshot(),
            prefix_hit_tokens: self.prefix_hit_tokens,
            prompt_tokens: self.prompt_tokens,
            cancelled: self.cancelled,
            lora_running: self.lora_names(true),
            lora_waiting: self.lora_names(false),
        }
    }

    /// The watchdog's verdict: the engine cannot make progress. Every request in flight gets
    /// [`Event::Stalled`] and is cancelled, which frees its KV blocks.
    fn fail_stalled(&mut self) {
        let ids: Vec<RequestId> = self.tracked.keys().copied().collect();
        eprintln!(
            "mockserve: error: the engine made no progress with {} requests in flight; \
             failing them",
            self.cluster.active_requests()
        );
        let now = self.now();
        for id in ids {
            if let Some(to) = self.listeners.remove(&id) {
                // The client may be gone already; the request is dropped either way.
                self.outbox.push(Delivery {
                    id,
                    to,
                    event: Event::Stalled,
                    last: true,
                });
            }
            self.untrack(id);
            // Not a client cancellation: the cancel counters stay as they are.
            self.cluster.cancel(id, now);
        }
    }

    /// Refuses when `--max-waiting` requests wait already.
    fn check_queue(&self) -> Result<(), SubmitError> {
        let Some(limit) = self.max_waiting else {
            return Ok(());
        };
        // Checked on every submission: a count, not a snapshot of every worker.
        let waiting = self.cluster.num_waiting();
        if waiting >= limit {
            Err(SubmitError::Overloaded { waiting })
        } else {
            Ok(())
        }
    }

    /// Hands a request that arrived at `now` (no later than the wall clock) to the cluster and
    /// starts tracking it.
    fn start(
        &mut self,
        request: EngineRequest,
        pinned: Option<WorkerId>,
        speculative: bool,
        now: SimTime,
    ) -> Result<RequestId, SubmitError> {
        self.last_submit = self.last_submit.max(now);
        let prompt_len = request.prompt.len;
        let max_tokens = request.max_output_tokens;
        let kv_prompt = self.kv.as_ref().map(|_| request.prompt.clone());
        let id = match pinned {
            None => self
                .cluster
                .submit(request, now)
                .map_err(|r| SubmitError::Rejected(r.reason))?,
            Some(worker) => {
                let id = self
                    .cluster
                    .submit_to(request, worker, now)
                    .map_err(|e| match e {
                        SubmitToError::NoSuchWorker { num_workers, .. } => {
                            SubmitError::NoSuchWorker {
                                worker: u64::from(worker.0),
                                num_workers,
                            }
                        }
                        SubmitToError::Rejected(r) => SubmitError::Rejected(r.reason),
                    })?;
                self.metrics.pinned.inc();
                id
            }
        };
        self.prompt_tokens += prompt_len as u64;
        if let (Some(kv), Some(prompt)) = (&mut self.kv, &kv_prompt) {
            kv.track(id, prompt, None);
        }
        self.tracked.insert(
            id,
            Tracked {
                submitted: now,
                prompt_len,
                max_tokens,
                admitted: None,
                first_token: None,
                generated: 0,
                worker: None,
                last_token: None,
                speculative,
                lora: None,
                finish_reason: FINISHED_LENGTH,
            },
        );
        Ok(id)
    }

    /// Publishes the KV events of the advance to `now` that emitted `outputs` (before the
    /// outputs are dispatched, so that finished requests still know their tokens).
    pub(super) fn export_kv_events(&mut self, outputs: &[Output], now: SimTime) {
        let Some(kv) = &mut self.kv else {
            return;
        };
        let unknown = kv.tokens.unknown_blocks;
        let ts = self.clock.unix_ms(now) / 1e3;
        kv.after_advance(&mut self.cluster, outputs, now, ts);
        let unknown = kv.tokens.unknown_blocks - unknown;
        if unknown > 0 {
            self.metrics.kv_events_unknown_blocks.inc_by(unknown);
        }
    }

    /// Marks a started request as running under `lora` (for the LoRA figures and its KV
    /// events).
    fn set_lora(&mut self, id: RequestId, lora: Option<Arc<LoraTag>>) {
        if lora.is_none() {
            return;
        }
        if let Some(kv) = &mut self.kv {
            kv.tokens.set_lora(id, lora.clone());
        }
        if let Some(t) = self.tracked.get_mut(&id) {
            t.lora = lora;
        }
    }

    /// The adapters of running (admitted) or waiting requests, sorted, each once.
    fn lora_names(&self, running: bool) -> Vec<String> {
        let names: std::collections::BTreeSet<&str> = self
            .tracked
            .values()
            .filter(|t| t.admitted.is_some() == running)
            .filter_map(|t| t.lora.as_deref().map(|l| l.name.as_str()))
            .collect();
        names.into_iter().map(String::from).collect()
    }

    /// Stops tracking a request.
    fn untrack(&mut self, id: RequestId) {
        if let Some(kv) = &mut self.kv {
            let now = self.clock.now();
            kv.release(&self.cluster, id, now);
        }
        if self.tracked.remove(&id).is_some_and(|t| t.speculative) {
            self.speculative_in_flight -= 1;
            self.metrics
                .spec_in_flight
                .set(self.speculative_in_flight as i64);
        }
    }

    pub(super) fn cancel(&mut self, id: RequestId) {
        self.listeners.remove(&id);
        self.untrack(id);
        let now = self.now();
        if self.cluster.cancel(id, now) {
            self.cancelled += 1;
            self.metrics.cancelled.inc();
        }
    }

    /// Feeds the metrics from one output.
    fn observe(&mut self, output: &Output) {
        let m = &self.metrics;
        let secs = |from: SimTime, to: SimTime| to.saturating_since(from).as_nanos() as f64 / 1e9;
        match *output {
            Output::Admitted {
                id,
                worker,
                reused_tokens,
                time,
                ..
            } => {
                let Some(t) = self.tracked.get_mut(&id) else {
                    return;
                };
                let label = m.engine(worker);
                if t.admitted.is_none() {
                    t.admitted = Some(time);
                    m.queue_time
                        .get_or_create(&label)
                        .observe(secs(t.submitted, time));
                }
                m.prefix_queries
                    .get_or_create(&label)
                    .inc_by(t.prompt_len as u64);
                m.prefix_hits
                    .get_or_create(&label)
                    .inc_by(reused_tokens as u64);
                if t.worker.is_none() {
                    self.prefix_hit_tokens += reused_tokens as u64;
                    m.routed.get_or_create(&WorkerLabel::from(worker)).inc();
                }
                t.worker = Some(worker);
            }
            Output::Token {
                id, index, time, ..
            } => {
                let Some(t) = self.tracked.get_mut(&id) else {
                    return;
                };
                let Some(worker) = t.worker else {
                    return;
                };
                let label = m.engine(worker);
                m.generation_tokens.get_or_create(&label).inc();
                t.generated += 1;
                *self.step_tokens.entry(worker.0).or_default() += 1;
                if index == 1 {
                    *self.step_tokens.entry(worker.0).or_default() += t.prompt_len as u64;
                    m.prompt_tokens
                        .get_or_create(&label)
                        .inc_by(t.prompt_len as u64);
                    m.ttft
                        .get_or_create(&label)
                        .observe(secs(t.submitted, time));
                    t.first_token = Some(time);
                    if let Some(admitted) = t.admitted {
                        m.prefill_time
                            .get_or_create(&label)
                            .observe(secs(admitted, time));
                    }
                } else if let Some(last) = t.last_token {
                    m.itl.get_or_create(&label).observe(secs(last, time));
                }
                t.last_token = Some(time);
            }
            Output::Finished { id, time } => {
                if let Some(t) = self.tracked.get(&id) {
                    if let Some(worker) = t.worker {
                        let label = m.engine(worker);
                        m.e2e.get_or_create(&label).observe(secs(t.submitted, time));
                        m.success
                            .get_or_create(&FinishedLabel {
                                model_name: label.model_name.clone(),
                                engine: label.engine,
                                finished_reason: t.finish_reason,
                            })
                            .inc();
                        if let Some(first) = t.first_token {
                            let decode = secs(first, time);
                            m.decode_time.get_or_create(&label).observe(decode);
                            if t.generated > 1 {
                                m.tpot
                                    .get_or_create(&label)
                                    .observe(decode / (t.generated - 1) as f64);
                            }
                        }
                        if let Some(admitted) = t.admitted {
                            m.inference_time
                                .get_or_create(&label)
                                .observe(secs(admitted, time));
                        }
                        m.request_prompt_tokens
                            .get_or_create(&label)
                            .observe(t.prompt_len as f64);
                        m.request_generation_tokens
                            .get_or_create(&label)
                            .observe(t.generated as f64);
                        m.request_max_tokens
                            .get_or_create(&label)
                            .observe(t.max_tokens as f64);
                    }
                }
                self.untrack(id);
            }
            Output::Preempted { id, .. } => {
                if let Some(worker) = self.tracked.get(&id).and_then(|t| t.worker) {
                    m.preemptions.get_or_create(&m.engine(worker)).inc();
                }
            }
            Output::Rejected { id, .. } => self.untrack(id),
            // Transfers are counted by the cluster itself (snapshot gauges).
            Output::KvTransfer { .. } => {}
        }
    }

    fn dispatch(&mut self, outputs: Vec<Output>) {
        self.dispatch_outputs(outputs);
        // One engine step per worker per advance, as `vllm:iteration_tokens_total` counts.
        for (worker, tokens) in std::mem::take(&mut self.step_tokens) {
            self.metrics
                .iteration_tokens
                .get_or_create(&self.metrics.engine(WorkerId(worker)))
                .observe(tokens as f64);
        }
    }

    fn dispatch_outputs(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            self.observe(&output);
            let (id, last) = match &output {
                Output::Admitted { id, .. }
                | Output::KvTransfer { id, .. }
                | Output::Token { id, .. }
                | Output::Preempted { id, .. } => (*id, false),
                Output::Finished { id, .. } | Output::Rejected { id, .. } => (*id, true),
            };
            let to = if last {
                self.listeners.remove(&id)
            } else {
                self.listeners.get(&id).cloned()
            };
            if let Some(to) = to {
                self.outbox.push(Delivery {
                    id,
                    to,
                    event: Event::Output(output),
                    last,
                });
            }
        }
    }
}

/// An event for a handler, sent by the driver task once it has released the lock (sending
/// wakes the handler's task, which takes a system call at times: the lock is not held for it).
pub(super) struct Delivery {
    /// The request.
    id: RequestId,
    /// Its handler's channel.
    to: mpsc::UnboundedSender<Event>,
    /// What to tell it.
    event: Event,
    /// The request's last event: nothing to cancel if its handler has gone.
    last: bool,
}

/// Sends `outbox` in order; returns the unfinished requests whose handler has gone (to be
/// cancelled, which frees their KV).
pub(super) fn deliver(outbox: Vec<Delivery>) -> Vec<RequestId> {
    let mut gone = Vec::new();
    for d in outbox {
        if d.to.send(d.event).is_err() && !d.last {
            gone.push(d.id);
        }
    }
    gone
}

#[cfg(test)]
mod tests {
    use servesim::cluster::ClusterConfig;
    use servesim::request::Prompt;

    use super::*;

    fn request(max_output_tokens: usize) -> EngineRequest {
        EngineRequest {
            prompt: Prompt::from_tokens(&[1, 2, 3, 4, 5, 6], 4),
            max_output_tokens,
            output_tokens: vec![7, 8, 9],
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_earlier_event_or_waiting_outputs_nudge_the_task() {
        let mut driver = Driver::new(
            Cluster::new(ClusterConfig::default()).expect("valid"),
            None,
            Arc::default(),
        );
        driver.planned = Some(SimTime::from_micros(1_000));
        assert!(!driver.needs_plan(Some(SimTime::from_micros(1_000))));
        assert!(!driver.needs_plan(Some(SimTime::from_micros(2_000))));
        assert!(!driver.needs_plan(None));
        assert!(driver.needs_plan(Some(SimTime::from_micros(500))));
        // One nudge on its way at a time: the task plans again when it gets it.
        assert!(!driver.needs_plan(Some(SimTime::from_micros(100))));
        driver.nudged = false;
        driver.planned = None;
        assert!(
            driver.needs_plan(Some(SimTime::from_micros(5_000))),
            "the task waits without a deadline"
        );
        driver.nudged = false;
        driver.planned = Some(SimTime::from_micros(1_000));
        let (to, _rx) = mpsc::unbounded_channel();
        driver.outbox.push(Delivery {
            id: RequestId(7),
            to,
            event: Event::Stalled,
            last: true,
        });
        assert!(
            driver.needs_plan(Some(SimTime::from_micros(2_000))),
            "the task sends what waits in its outbox"
        );
        assert!(driver.take_own(RequestId(8)).is_empty(), "not its own");
        assert_eq!(driver.take_own(RequestId(7)).len(), 1);
        assert!(driver.outbox.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_engine_fails_its_requests_and_frees_their_kv() {
        let mut config = ClusterConfig::default();
        config.engine.block_size = 4;
        let mut driver = Driver::new(Cluster::new(config).expect("valid"), None, Arc::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let id = driver
            .start(request(1000), None, false, SimTime::ZERO)
            .expect("starts");
        driver.listeners.insert(id, tx);
        let outputs = driver.cluster.advance(SimTime::ZERO);
        driver.dispatch(outputs);
        assert!(driver.cluster.snapshot().workers[0].scheduler.active_blocks > 0);
        driver.fail_stalled();
        assert!(deliver(std::mem::take(&mut driver.outbox)).is_empty());
        let mut events = Vec::new();
        while let Ok(event) = rx.try_recv() {
            events.push(event);
        }
        assert_eq!(events.last(), Some(&Event::Stalled), "{events:?}");
        assert_eq!(driver.cluster.active_requests(), 0);
        assert_eq!(
            driver.cluster.snapshot().workers[0].scheduler.active_blocks,
            0
        );
        assert!(driver.tracked.is_empty() && driver.listeners.is_empty());
    }
}
