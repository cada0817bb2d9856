//! Faults on whole fleet workers, for routers' failover: a worker is `ok`, `down`, `slow` by a
//! factor, `stalled` or `503`, set by a schedule (`--worker-faults`) or by the admin listener
//! (`POST /fleet/workers/{i}/fault`).
//!
//! - [`WorkerState`] is one worker's state; [`WorkerFaults`] holds every worker's, each in a
//!   `watch` channel so that a stalled request wakes when its worker recovers, and counts what
//!   was applied ([`FaultMetrics`]).
//! - [`Schedule`] is the parsed `--worker-faults` flag ([`ScheduleError`] names it);
//!   [`run_schedule`] applies it on the fleet's clock.
//! - [`gate`] is the middleware in front of each worker's API that makes the state visible on
//!   the wire. `down` itself is the fleet's worker loop (`super::serve_worker`): the listener is
//!   closed, so connections are refused.
//!
//! | state | generation requests | `/health` |
//! |-------|---------------------|-----------|
//! | `down` | connection refused (the listener is closed); a request on a connection still open is cut (the connection drops) and requests running are ended | refused or cut |
//! | `slow:K` | every event of the answer delivered K times as late, from the request's arrival | 200 |
//! | `stalled` | held, no byte sent, until the worker leaves `stalled`, then run | 200 |
//! | `503` | 503 `server_error`, OpenAI-shaped | 503 |
//!
//! `slow` stretches delivery, not the engine: the worker's batch runs at the engine's speed
//! (its KV blocks are freed as early as an `ok` worker's), its clients see every token K times
//! as late (time to first token and inter-token gaps K times longer). A stalled request enters
//! the engine (and is judged) when the worker recovers. A down worker keeps its engine state
//! (KV cache, adapters): it is unreachable, as behind a partition, and comes back with its cache.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::ApiError;

/// The largest `slow` factor.
pub(crate) const MAX_SLOW_FACTOR: f64 = 1000.0;

/// The latest time a `--worker-faults` window may start or end, from the fleet's start: 365
/// days (tokio's timer wheel reaches about two years; a later deadline would overflow the
/// clock).
pub(crate) const MAX_FAULT_TIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// Characters of a client's or a flag's value an error message quotes at most.
pub(crate) const QUOTED_CHARS: usize = 48;

/// `text` quoted (as `{:?}`), cut to its first [`QUOTED_CHARS`] characters, and its length
/// said when cut: an error message never echoes an unbounded value.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
    }
}

/// One worker's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WorkerState {
    /// Serving normally.
    Ok,
    /// Unreachable: the listener is closed.
    Down,
    /// Every answer delivered this many times as late (at least 1).
    Slow(f64),
    /// Requests held without an answer until the state changes.
    Stalled,
    /// Every generation request and `/health` answered 503.
    Unavailable,
}

impl WorkerState {
    /// The state's name in flags, JSON and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            WorkerState::Ok => "ok",
            WorkerState::Down => "down",
            WorkerState::Slow(_) => "slow",
            WorkerState::Stalled => "stalled",
            WorkerState::Unavailable => "503",
        }
    }

    /// The state named `name` (`slow` with `factor`). The error says what is wrong.
    pub fn parse(name: &str, factor: Option<f64>) -> Result<WorkerState, String> {
        let state = match name {
            "ok" => WorkerState::Ok,
            "down" => WorkerState::Down,
            "stalled" => WorkerState::Stalled,
            "503" => WorkerState::Unavailable,
            "slow" => {
                let Some(k) = factor else {
                    return Err("slow needs a factor (slow:K, K >= 1)".into());
                };
                if !(1.0..=MAX_SLOW_FACTOR).contains(&k) {
                    return Err(format!(
                        "the slow factor must be between 1 and {MAX_SLOW_FACTOR}, got {}",
                        servesim::scheduler::show_number(k)
                    ));
                }
                return Ok(WorkerState::Slow(k));
            }
            other => {
                return Err(format!(
                    "unknown worker state {} (expected ok, down, slow, stalled or 503)",
                    quoted(other)
                ))
            }
        };
        match factor {
            Some(_) => Err(format!("only slow takes a factor, not {name}")),
            None => Ok(state),
        }
    }

    /// Whether the oracle should not count the worker as a choice (it cannot answer).
    pub fn is_unavailable(self) -> bool {
        matches!(
            self,
            WorkerState::Down | WorkerState::Stalled | WorkerState::Unavailable
        )
    }

    /// As `GET /fleet/workers` shows it.
    pub fn to_json(self, index: usize, url: &str) -> serde_json::Value {
        match self {
            WorkerState::Slow(k) => {
                json!({"index": index, "url": url, "state": self.name(), "factor": k})
            }
            _ => json!({"index": index, "url": url, "state": self.name()}),
        }
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerState::Slow(k) => write!(f, "slow:{k}"),
            other => f.write_str(other.name()),
        }
    }
}

/// The label of the worker-fault series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerFaultLabel {
    /// Worker index.
    pub worker: u32,
    /// The state's name (`down`, `slow`, `stalled`, `503`, `ok`).
    pub state: &'static str,
}

/// What the worker faults did, on the admin listener's `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct FaultMetrics {
    /// `servesim_worker_fault_changes`: states applied (by the schedule or the admin route),
    /// per worker and state (`ok` included: recoveries).
    pub changes: Family<WorkerFaultLabel, Counter>,
    /// `servesim_worker_faulted_requests`: requests that met a fault (cut while down, answered
    /// 503, held while stalled, stretched while slow), per worker and state.
    pub requests: Family<WorkerFaultLabel, Counter>,
}

impl FaultMetrics {
    /// Registers both series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "servesim_worker_fault_changes",
            "Worker states applied (--worker-faults, POST /fleet/workers/{i}/fault)",
            self.changes.clone(),
        );
        registry.register(
            "servesim_worker_faulted_requests",
            "Requests that met a worker fault (cut, 503, stalled, slowed)",
            self.requests.clone(),
        );
    }
}

/// Every worker's state, shared by its gate, its worker loop, the judge and the admin routes.
#[derive(Debug)]
pub struct WorkerFaults {
    /// One channel per worker, by index: the current state, and a wake-up when it changes.
    states: Vec<watch::Sender<WorkerState>>,
    /// What was applied and met.
    pub metrics: FaultMetrics,
}

impl WorkerFaults {
    /// `workers` workers, all `ok`.
    pub fn new(workers: usize, metrics: FaultMetrics) -> WorkerFaults {
        WorkerFaults {
            states: (0..workers)
                .map(|_| watch::Sender::new(WorkerState::Ok))
                .collect(),
            metrics,
        }
    }

    /// Workers.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether the fleet has no worker (never: a fleet has at least one).
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Worker `index`'s state (`ok` for an index out of range).
    pub fn state(&self, index: usize) -> WorkerState {
        self.states
            .get(index)
            .map_or(WorkerState::Ok, |s| *s.borrow())
    }

    /// Sets worker `index`'s state; false when there is no such worker.
    pub fn set(&self, index: usize, state: WorkerState) -> bool {
        let Some(sender) = self.states.get(index) else {
            return false;
        };
        sender.send_replace(state);
        self.metrics
            .changes
            .get_or_create(&label(index, state))
            .inc();
        true
    }

    /// Sets worker `index`'s state without counting it as a fault change: an elastic fleet
    /// opens and closes a slot's listener this way (`super::elastic`).
    pub(crate) fn switch(&self, index: usize, state: WorkerState) {
        if let Some(sender) = self.states.get(index) {
            sender.send_replace(state);
        }
    }

    /// A receiver of worker `index`'s state, `None` when there is no such worker.
    pub fn subscribe(&self, index: usize) -> Option<watch::Receiver<WorkerState>> {
        self.states.get(index).map(watch::Sender::subscribe)
    }

    fn met(&self, index: usize, state: WorkerState) {
        self.metrics
            .requests
            .get_or_create(&label(index, state))
            .inc();
    }
}

fn label(index: usize, state: WorkerState) -> WorkerFaultLabel {
    WorkerFaultLabel {
        worker: u32::try_from(index).unwrap_or(u32::MAX),
        state: state.name(),
    }
}

/// One window of `--worker-faults`: worker `worker` is `state` from `start` until `end`
/// (for good when `None`), times from the fleet's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultWindow {
    /// The worker's index.
    pub worker: usize,
    /// Its state in the window (never `ok`).
    pub state: WorkerState,
    /// When the window opens.
    pub start: Duration,
    /// When it closes (the worker is `ok` again), if ever.
    pub end: Option<Duration>,
}

/// The parsed `--worker-faults` flag.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    /// The windows, in the flag's order.
    pub windows: Vec<FaultWindow>,
}

/// Why `--worker-faults` is refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// An item does not parse.
    #[error(
        "--worker-faults: {}: {reason} (each item is WORKER=STATE@START..[END], STATE one \
         of down, stalled, 503, slow:K; times like 500ms or 2.5s from the fleet's start, e.g. \
         \"2=down@10s..20s,3=slow:4@5s..\")",
        quoted(item)
    )]
    Syntax {
        /// The item.
        item: String,
        /// What is wrong.
        reason: String,
    },
    /// An item names a worker the fleet does not have.
    #[error(
        "--worker-faults: {}: worker {worker} does not exist (the fleet has {workers})",
        quoted(item)
    )]
    NoSuchWorker {
        /// The item.
        item: String,
        /// Its worker.
        worker: usize,
        /// Workers in the fleet.
        workers: usize,
    },
    /// Two windows of one worker overlap.
    #[error(
        "--worker-faults: worker {worker}: the windows {} and {} overlap",
        quoted(first),
        quoted(second)
    )]
    Overlap {
        /// The worker.
        worker: usize,
        /// One item.
        first: String,
        /// The other.
        second: String,
    },
}

/// `text` as a number written the one canonical way: decimal digits only (no sign, no space),
/// no leading zero but in `0` itself, and within `u64`. `+1`, `01` or 5,000 zeros are not.
pub(crate) fn canonical_number(text: &str) -> Option<u64> {
    let digits = text.as_bytes();
    let canonical = !digits.is_empty()
        && digits.len() <= 20
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1);
    if canonical {
        text.parse().ok()
    } else {
        None
    }
}

/// A worker index written canonically (see [`canonical_number`]).
pub(crate) fn canonical_index(text: &str) -> Option<usize> {
    canonical_number(text).and_then(|n| usize::try_from(n).ok())
}

/// A time like `500ms`, `2s` or `2.5s` (`crate::duration`'s grammar, a unit required), at most
/// [`MAX_FAULT_TIME`].
pub(crate) fn parse_time(text: &str) -> Result<Duration, String> {
    let shown = quoted(text);
    let seconds = crate::duration::parse_ms(text, None).map_err(|e| format!("time {e}"))? / 1e3;
    if seconds > MAX_FAULT_TIME.as_secs_f64() {
        return Err(format!(
            "time {shown} is later than {}s (365 days), the latest a window may start or end",
            MAX_FAULT_TIME.as_secs()
        ));
    }
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("time {shown}: {e}"))
}

fn parse_window(item: &str) -> Result<FaultWindow, String> {
    let (worker, rest) = item
        .split_once('=')
        .ok_or("expected WORKER=STATE@START..[END]")?;
    let worker = canonical_index(worker.trim()).ok_or_else(|| {
        format!(
            "worker {} is not an index (digits, no sign)",
            quoted(worker)
        )
    })?;
    let (state, times) = rest
        .split_once('@')
        .ok_or("expected @START..[END] after the state")?;
    let (name, factor) = match state.split_once(':') {
        Some((name, k)) => {
            let k: f64 = k
                .parse()
                .map_err(|_| format!("factor {} is not a number", quoted(k)))?;
            (name, Some(k))
        }
        None => (state, None),
    };
    if name == "ok" {
        return Err("a window is a fault; the worker is ok outside its windows".into());
    }
    let state = WorkerState::parse(name, factor)?;
    let (start, end) = times
        .split_once("..")
        .ok_or("expected START..[END] (`..` with an empty END: for good)")?;
    let start = parse_time(start)?;
    let end = match end {
        "" => None,
        end => {
            let end = parse_time(end)?;
            if end <= start {
                return Err("the window must end after it starts".into());
            }
            Some(end)
        }
    };
    Ok(FaultWindow {
        worker,
        state,
        start,
        end,
    })
}

impl Schedule {
    /// Parses the flag's value for a fleet of `workers` workers.
    pub fn parse(spec: &str, workers: usize) -> Result<Schedule, ScheduleError> {
        let mut windows: Vec<(String, FaultWindow)> = Vec::new();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let window = parse_window(item).map_err(|reason| ScheduleError::Syntax {
                item: item.into(),
                reason,
            })?;
            if window.worker >= workers {
                return Err(ScheduleError::NoSuchWorker {
                    item: item.into(),
                    worker: window.worker,
                    workers,
                });
            }
            for (other_item, other) in &windows {
                let ends_before =
                    |a: &FaultWindow, b: &FaultWindow| a.end.is_some_and(|e| e <= b.start);
                if other.worker == window.worker
                    && !ends_before(other, &window)
                    && !ends_before(&window, other)
                {
                    return Err(ScheduleError::Overlap {
                        worker: window.worker,
                        first: other_item.clone(),
                        second: item.into(),
                    });
                }
            }
            windows.push((item.to_string(), window));
        }
        Ok(Schedule {
            windows: windows.into_iter().map(|(_, w)| w).collect(),
        })
    }

    /// Every change the schedule makes, `(time, worker, state)`, in time order (a window's end
    /// before another's start at the same time).
    pub fn changes(&self) -> Vec<(Duration, usize, WorkerState)> {
        let mut changes: Vec<(Duration, u8, usize, WorkerState)> = Vec::new();
        for w in &self.windows {
            if let Some(end) = w.end {
                changes.push((end, 0, w.worker, WorkerState::Ok));
            }
            changes.push((w.start, 1, w.worker, w.state));
        }
        changes.sort_by_key(|a| (a.0, a.1, a.2));
        changes.into_iter().map(|(t, _, w, s)| (t, w, s)).collect()
    }
}

/// Applies `schedule` to `faults`, its times from `start`, then waits for `stop`. An admin
/// change in between stands until the schedule's next change for that worker.
pub(crate) async fn run_schedule(
    schedule: Schedule,
    faults: Arc<WorkerFaults>,
    start: Instant,
    stop: CancellationToken,
) {
    for (at, worker, state) in schedule.changes() {
        // Times are at most `MAX_FAULT_TIME`; a clock that cannot reach one never applies it.
        let Some(due) = start.checked_add(at) else {
            break;
        };
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(due) => {}
        }
        faults.set(worker, state);
    }
    stop.cancelled().await;
}

/// Which of a worker's routes the faults touch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Generation,
    Health,
    Other,
}

pub(crate) fn route(path: &str) -> Route {
    match path {
        "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/responses"
        | "/v1/messages"
        | "/v1/embeddings" => Route::Generation,
        "/health" => Route::Health,
        _ => Route::Other,
    }
}

/// The 503 a worker in state `503` answers.
fn unavailable(worker: usize) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("Worker {worker} is unavailable (injected fault)."),
        kind: "server_error",
        param: None,
        code: Some("service_unavailable"),
    }
}

/// A response whose body fails at once: the connection drops without an answer.
fn cut() -> Response {
    let failed = futures_util::stream::once(async {
        Err::<Bytes, _>(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "worker down (injected fault)",
        ))
    });
    Response::new(Body::from_stream(failed))
}

/// The middleware in front of worker `index`'s API (see the module docs).
pub(crate) async fn gate(
    State((faults, index)): State<(Arc<WorkerFaults>, usize)>,
    request: Request,
    next: Next,
) -> Response {
    let kind = route(request.uri().path());
    let states = match kind {
        Route::Other => None,
        Route::Generation | Route::Health => faults.subscribe(index),
    };
    let Some(mut states) = states else {
        return next.run(request).await;
    };
    let mut held = false;
    loop {
        let state = *states.borrow_and_update();
        match (state, kind) {
            (WorkerState::Ok, _) | (WorkerState::Slow(_) | WorkerState::Stalled, Route::Health) => {
                return next.run(request).await
            }
            (WorkerState::Down, _) => {
                faults.met(index, state);
                return cut();
            }
            (WorkerState::Unavailable, Route::Health) => {
                let body = Json(json!({"status": "unavailable", "reason": "injected fault"}));
                return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            }
            (WorkerState::Unavailable, _) => {
                faults.met(index, state);
                return unavailable(index).into_response();
            }
            (WorkerState::Stalled, _) => {
                if !held {
                    held = true;
                    faults.met(index, state);
                }
                if states.changed().await.is_err() {
                    return ApiError::shutting_down().into_response();
                }
            }
            (WorkerState::Slow(k), _) => {
                faults.met(index, state);
                let arrived = Instant::now();
                let response = next.run(request).await;
                return stretch(response, arrived, k).await;
            }
        }
    }
}

/// Delivers `response` as if every moment of it, counted from `arrived`, were `factor` times
/// as far: a whole answer that took t is sent after `factor` t; each frame of a stream that
/// came at t is sent at `factor` t.
async fn stretch(response: Response, arrived: Instant, factor: f64) -> Response {
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let due = move |at: Instant| arrived + (at - arrived).mul_f64(factor);
    if !is_sse {
        tokio::time::sleep_until(due(Instant::now())).await;
        return response;
    }
    let (parts, body) = response.into_parts();
    // A pump stamps each frame when the engine hands it over; the body below releases it at
    // its stretched time. A client that leaves drops the receiver, which ends the pump.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut frames = body.into_data_stream();
    tokio::spawn(async move {
        while let Some(frame) = frames.next().await {
            if tx.send((Instant::now(), frame)).is_err() {
                break;
            }
        }
    });
    let stretched = futures_util::stream::unfold(rx, move |mut rx| async move {
        let (at, frame) = rx.recv().await?;
        tokio::time::sleep_until(due(at)).await;
        Some((frame, rx))
    });
    Response::from_parts(parts, Body::from_stream(stretched))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<Schedule, String> {
        Schedule::parse(spec, 4).map_err(|e| e.to_string())
    }

    #[test]
    fn the_schedule_flag_parses() {
        let s = parse("2=down@10s..20s, 3=slow:4@500ms..,1=503@0s..3s,0=stalled@1.5s..2s");
        let s = s.unwrap_or_default();
        assert_eq!(s.windows.len(), 4);
        assert_eq!(
            s.windows[0],
            FaultWindow {
                worker: 2,
                state: WorkerState::Down,
                start: Duration::from_secs(10),
                end: Some(Duration::from_secs(20)),
            }
        );
        assert_eq!(s.windows[1].state, WorkerState::Slow(4.0));
        assert_eq!(s.windows[1].start, Duration::from_millis(500));
        assert_eq!(s.windows[1].end, None);
        let changes = s.changes();
        let at: Vec<Duration> = changes.iter().map(|c| c.0).collect();
        let mut sorted = at.clone();
        sorted.sort();
        assert_eq!(at, sorted);
        assert_eq!(changes.len(), 7);
        // Windows touching end to end are fine; the end goes first.
        let s = parse("1=down@0s..1s,1=503@1s..2s").unwrap_or_default();
        let changes = s.changes();
        assert_eq!(changes[1], (Duration::from_secs(1), 1, WorkerState::Ok));
        assert_eq!(
            changes[2],
            (Duration::from_secs(1), 1, WorkerState::Unavailable)
        );
    }

    #[test]
    fn bad_schedules_are_refused_naming_the_flag() {
        for (spec, wanted) in [
            ("2=down", "@START"),
            ("x=down@1s..", "not an index"),
            ("9=down@1s..", "worker 9 does not exist"),
            ("1=explode@1s..", "unknown worker state"),
            ("1=slow@1s..", "needs a factor"),
            ("1=slow:0.5@1s..", "between 1 and"),
            ("1=down:2@1s..", "only slow"),
            ("1=ok@1s..", "outside its windows"),
            ("1=down@1..2s", "needs a unit"),
            ("1=down@2s..1s", "end after"),
            ("1=down@1s", "START..[END]"),
            ("1=down@0s..5s,1=503@4s..", "overlap"),
            ("1=down@3s..,1=503@4s..5s", "overlap"),
            // Issue 43: a window beyond the clock once panicked the fleet after start-up.
            ("0=down@0s..1e19s", "later than 31536000s (365 days)"),
            ("0=down@1e19s..", "later than 31536000s"),
            ("0=down@0s..31536000001ms", "later than 31536000s"),
            ("+1=down@1s..", "not an index"),
            ("01=down@1s..", "not an index"),
        ] {
            let error = parse(spec).err().unwrap_or_default();
            assert!(error.starts_with("--worker-faults"), "{spec}: {error}");
            assert!(error.contains(wanted), "{spec}: {error}");
        }
    }

    #[test]
    fn the_latest_fault_time_is_accepted_and_applied_without_overflow() {
        let s = parse("0=down@0s..31536000s").unwrap_or_default();
        assert_eq!(s.windows[0].end, Some(MAX_FAULT_TIME));
        // The clock reaches it (tokio clamps a deadline beyond its wheel).
        let start = Instant::now();
        assert!(start.checked_add(MAX_FAULT_TIME).is_some());
    }

    #[test]
    fn only_canonical_numbers_are_indexes() {
        assert_eq!(canonical_number("0"), Some(0));
        assert_eq!(canonical_number("42"), Some(42));
        assert_eq!(canonical_number("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "+1",
            "-1",
            "01",
            "00",
            " 1",
            "1 ",
            "1e3",
            "0x1",
            "18446744073709551616",
            "١",
        ] {
            assert_eq!(canonical_number(bad), None, "{bad:?}");
        }
        let zeros = format!("{}1", "0".repeat(5000));
        assert_eq!(canonical_index(&zeros), None);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let long = "x".repeat(2_000_000);
        let error = WorkerState::parse(&long, None).err().unwrap_or_default();
        assert!(error.len() < 200, "{} bytes", error.len());
        assert!(error.contains("... (2000000 bytes)"), "{error}");
        let spec = format!("0=down@{long}s..");
        let error = parse(&spec).err().unwrap_or_default();
        assert!(error.len() < 600, "{} bytes", error.len());
        assert_eq!(quoted("short"), "\"short\"");
    }

    #[test]
    fn states_parse_as_the_admin_route_names_them() {
        assert_eq!(
            WorkerState::parse("503", None),
            Ok(WorkerState::Unavailable)
        );
        assert_eq!(
            WorkerState::parse("slow", Some(3.0)),
            Ok(WorkerState::Slow(3.0))
        );
        assert!(WorkerState::parse("slow", Some(f64::NAN)).is_err());
        // A huge factor is written compactly, not in 309 digits (issue 43).
        let huge = WorkerState::parse("slow", Some(1e308))
            .err()
            .unwrap_or_default();
        assert!(huge.ends_with("got 1e308"), "{huge}");
        assert!(WorkerState::parse("down", Some(2.0)).is_err());
        assert_eq!(WorkerState::Slow(2.5).to_string(), "slow:2.5");
        let faults = WorkerFaults::new(2, FaultMetrics::default());
        assert!(faults.set(1, WorkerState::Down));
        assert!(!faults.set(2, WorkerState::Down));
        assert_eq!(faults.state(1), WorkerState::Down);
        assert_eq!(faults.state(0), WorkerState::Ok);
    }
}
