//! The one driver loop every mode runs on (`multiturn`, `replay`, `bench`), with a pluggable
//! arrival schedule.
//!
//! A run is a set of sessions, each a [`Script`]: a closed loop that hands out its next request
//! given the previous response. A request's start is either an absolute offset from the run start
//! ([`Start::At`], open loop: trace timestamps, Poisson arrivals) or a delay after the previous
//! request of the same session completed ([`Start::After`], closed loop: think times, trace
//! `delay`s, concurrency). The pacer walks the sessions in order of their first start and wakes
//! each at its absolute deadline (so lateness never accumulates); every later deadline is
//! absolute too. A request's body is encoded before it is due, and the last millisecond before
//! the deadline is spent yielding rather than on tokio's millisecond timer
//! (`sleep_until_precisely`), so a request leaves at its time, not up to a tick later.
//!
//! With [`DriverConfig::ordered_ties`], sessions whose first requests are due at the same
//! instant (a trace's tied timestamps) send them one after another in session order, each once
//! the one before it has its response headers (or [`TIE_WAIT`] has passed), so the server
//! admits them in trace order as an offline replay does. An optional semaphore caps requests in
//! flight.
//!
//! Every [`Sample`] carries its scheduled and actual send times, so latencies are measured from
//! the scheduled time (no coordinated omission) and the schedule lag (actual − scheduled) shows
//! whether the client kept up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::ProgressBar;
use serde_json::Value;
use tokio::sync::{oneshot, watch, Semaphore};
use tokio::time::Instant;

use crate::error::LoadgenError;
use crate::run::client::{self, Encoded, Endpoint, FirstToken, Response};
#[cfg(doc)]
use crate::run::failure::Failure;

/// How long before a session's first deadline the pacer starts its task.
pub(crate) const PACER_LEAD: Duration = Duration::from_millis(20);

/// When a request is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// At this offset from the run start (open loop).
    At(Duration),
    /// This long after the session's previous request completed (closed loop).
    After(Duration),
}

/// One request a script wants sent.
#[derive(Clone, Debug)]
pub struct Planned {
    /// When it is due.
    pub start: Start,
    /// The JSON body.
    pub body: Value,
}

/// A session's requests, produced one at a time (the next may depend on the last answer).
pub trait Script: Send + 'static {
    /// Offset from the run start at which the pacer starts this session (its first request's
    /// [`Start::At`]).
    fn first_start(&self) -> Duration;

    /// The next request given the previous one's response (`None` before the first); `None`
    /// ends the session.
    fn next(&mut self, previous: Option<&Response>) -> Option<Planned>;
}

/// One request as the driver saw it. Times are µs from the run start.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Index of the session (script) in the list given to [`drive`].
    pub session: usize,
    /// Position of the request within its session.
    pub turn: usize,
    /// Global send order (0 = first request sent).
    pub seq: u64,
    /// When it was due.
    pub scheduled_us: u64,
    /// When it was handed to the HTTP client.
    pub sent_us: u64,
    /// Of `sent_us - scheduled_us`, the time spent waiting for the in-flight cap.
    pub cap_wait_us: u64,
    /// Of `sent_us - scheduled_us`, the time a tied request waited for the one before it to
    /// be admitted (at most [`TIE_WAIT`]; 0 without a tie).
    pub tie_wait_us: u64,
    /// What came back (times relative to `sent_us`; `content` is cleared once the script saw it).
    pub response: Response,
}

impl Sample {
    /// Actual minus scheduled send time.
    pub fn lag_us(&self) -> u64 {
        self.sent_us.saturating_sub(self.scheduled_us)
    }

    /// Lag explained neither by the in-flight cap nor by a tie's order: the pacer's own
    /// lateness.
    pub(crate) fn pacer_lag_us(&self) -> u64 {
        self.lag_us()
            .saturating_sub(self.cap_wait_us)
            .saturating_sub(self.tie_wait_us)
    }

    /// Absolute time (µs from the run start) of a response offset.
    pub(crate) fn at(&self, offset_us: u64) -> u64 {
        self.sent_us + offset_us
    }

    /// Time to first token of `kind`, from the *scheduled* send (so a late client cannot hide
    /// server latency); None for a failed request or when no such token came. The one TTFT
    /// computation every mode's report uses.
    pub(crate) fn ttft_us(&self, kind: FirstToken) -> Option<u64> {
        if self.response.failure.is_some() {
            return None;
        }
        let t = self.response.timing.first_token_us(kind)?;
        Some(self.lag_us() + t)
    }

    /// End of the request, µs from the run start.
    pub(crate) fn end_us(&self) -> u64 {
        self.at(self.response.timing.end_us)
    }
}

/// Called with every sample as it completes (verbose lines).
pub type Observer = Arc<dyn Fn(&Sample) + Send + Sync>;

/// How one run goes on a connected target beyond its schedule: what watches it and what may
/// stop it (the parts of a [`DriverConfig`] that observers supply).
#[derive(Clone, Default)]
pub(crate) struct RunHooks {
    /// Progress bar, incremented per completed request.
    pub bar: Option<ProgressBar>,
    /// Called per completed request (live view, over-capacity watch).
    pub observer: Option<Observer>,
    /// Stops the run early when it turns true.
    pub abort: Option<watch::Receiver<bool>>,
    /// Counts requests as they are sent.
    pub sent: Option<Arc<AtomicU64>>,
}

impl RunHooks {
    /// The driver's configuration: these hooks, an in-flight cap and a send deadline.
    pub(crate) fn driver_config(
        self,
        max_in_flight: Option<usize>,
        stop_after: Option<Duration>,
    ) -> DriverConfig {
        DriverConfig {
            max_in_flight,
            stop_after,
            bar: self.bar,
            observer: self.observer,
            abort: self.abort,
            sent: self.sent,
            ordered_ties: false,
        }
    }
}

/// How the driver runs.
#[derive(Clone, Default)]
pub struct DriverConfig {
    /// Requests in flight at most (None = unbounded).
    pub max_in_flight: Option<usize>,
    /// Requests due after this offset from the start are not sent (their session ends).
    pub stop_after: Option<Duration>,
    /// Progress bar, incremented per completed request.
    pub bar: Option<ProgressBar>,
    /// Called per completed request.
    pub observer: Option<Observer>,
    /// Stops the run early when it turns true: nothing more is sent, and requests in flight are
    /// dropped (the server sees the client leave) and recorded as [`Failure::Cancelled`].
    pub abort: Option<watch::Receiver<bool>>,
    /// Incremented as each request is sent (with the completions, the requests in flight).
    pub sent: Option<Arc<AtomicU64>>,
    /// Sessions whose first requests are due at the same instant send them in session order,
    /// each once the one before it has its response headers (trace replay: tied timestamps are
    /// admitted in trace order). Off, they go at once (closed-loop sessions all due at 0).
    pub ordered_ties: bool,
}

/// What [`drive`] returns.
#[derive(Debug)]
pub struct DriverOutput {
    /// Every request, by session then turn.
    pub samples: Vec<Sample>,
    /// From the run start to the last completion.
    pub duration: Duration,
    /// The wall-clock time of the run start (offset 0 of every sample): aligns the records of
    /// several loadgen processes when they are merged.
    pub started_at: std::time::SystemTime,
    /// The run was stopped early through [`DriverConfig::abort`].
    pub aborted: bool,
}

impl Default for DriverOutput {
    fn default() -> Self {
        DriverOutput {
            samples: Vec::new(),
            duration: Duration::ZERO,
            started_at: std::time::UNIX_EPOCH,
            aborted: false,
        }
    }
}

/// State shared by the session tasks.
struct Shared {
    endpoint: Endpoint,
    /// `endpoint.url` parsed once for every request (None: sent as text, reqwest reports it).
    url: Option<reqwest::Url>,
    start: Instant,
    cap: Option<Arc<Semaphore>>,
    stop_at: Option<Instant>,
    seq: AtomicU64,
    bar: Option<ProgressBar>,
    observer: Option<Observer>,
    abort: Option<watch::Receiver<bool>>,
    sent: Option<Arc<AtomicU64>>,
}

/// Resolves when `abort` turns true; never without one (or once its sender is gone).
pub(crate) async fn aborted(abort: Option<watch::Receiver<bool>>) {
    match abort {
        Some(mut rx) => {
            if rx.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

pub(crate) fn is_aborted(abort: &Option<watch::Receiver<bool>>) -> bool {
    abort.as_ref().is_some_and(|rx| *rx.borrow())
}

fn since(start: Instant, t: Instant) -> u64 {
    t.saturating_duration_since(start).as_micros() as u64
}

/// One request to the shared endpoint, its body encoded before it was due; `on_headers` is
/// dropped once its response headers came.
async fn send(
    shared: &Shared,
    body: Result<Encoded, serde_json::Error>,
    raw: &Value,
    on_headers: Option<oneshot::Sender<()>>,
) -> Response {
    match (&shared.url, body) {
        (Some(url), Ok(body)) => {
            client::send_encoded(&shared.endpoint, url, body, on_headers).await
        }
        // reqwest reports a bad URL, and the encoding error is reported, as `send` does.
        _ => client::send(&shared.endpoint, raw).await,
    }
}

/// How long before a send is due the pacer leaves tokio's timer, which rounds every sleep up to
/// its next millisecond tick (a send 0.5 ms late on average, up to 1 ms), and yields to the
/// runtime's other tasks until the clock reaches the deadline.
pub(crate) const YIELD_BEFORE: Duration = Duration::from_millis(1);

/// Resolves once tokio's clock has reached `due`: on tokio's timer until [`YIELD_BEFORE`] before
/// it, then by yielding. The yielding lasts at most about twice [`YIELD_BEFORE`] of real time;
/// after that (a paused test clock, which yielding never advances) tokio's timer finishes the
/// wait.
pub(crate) async fn sleep_until_precisely(due: Instant) {
    if let Some(early) = due.checked_sub(YIELD_BEFORE) {
        tokio::time::sleep_until(early).await;
    }
    let bound = std::time::Instant::now() + 2 * YIELD_BEFORE;
    while Instant::now() < due {
        if std::time::Instant::now() > bound {
            tokio::time::sleep_until(due).await;
            break;
        }
        tokio::task::yield_now().await;
    }
}

/// The longest a tied request waits for the response headers of the one before it, when the
/// driver keeps tied timestamps in order: a server that answers headers only with its first
/// token (or its whole answer) would otherwise have tied requests sent one at a time, each a
/// TTFT after the last. mockserve answers headers once its engine has the request, within
/// milliseconds.
pub const TIE_WAIT: Duration = Duration::from_millis(20);

/// How a session's first request keeps its place among the sessions due at the same instant
/// (a trace's tied timestamps): it is sent once the one before it in the pacer's order has its
/// response headers (a server that admits a request before answering its headers, as mockserve
/// does, has admitted it then), and it lets the one after it go when its own headers came.
/// Without this, tied requests reach the server in whatever order their tasks and connections
/// happen to run, and routing tie-breaks fall differently than offline.
/// The agentic graph driver orders the nodes due at the same instant the same way.
pub(crate) struct TieOrder {
    /// Resolves (or is dropped) when the previous tied request was admitted.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped when this request has its headers (or never went).
    pub(crate) admitted: Option<oneshot::Sender<()>>,
}

impl TieOrder {
    /// The gate of the next request of a series in send order, due at `at`: it waits for the
    /// one before it when `ordered` and that one is due at the same instant. `previous` holds
    /// the due time and admission of the one before, and takes this one's.
    pub(crate) fn next<T: PartialEq + Copy>(
        previous: &mut Option<(T, oneshot::Receiver<()>)>,
        at: T,
        ordered: bool,
    ) -> TieOrder {
        let (admitted, next) = oneshot::channel();
        let after = previous
            .replace((at, next))
            .and_then(|(t, rx)| (ordered && t == at).then_some(rx));
        TieOrder {
            after,
            admitted: Some(admitted),
        }
    }

    /// Waits until the previous tied request was admitted, [`TIE_WAIT`] at most (at once if
    /// there is none): the time waited, or None if the run was stopped meanwhile.
    pub(crate) async fn wait_turn(
        &mut self,
        abort: &Option<watch::Receiver<bool>>,
    ) -> Option<Duration> {
        let Some(after) = self.after.take() else {
            return Some(Duration::ZERO);
        };
        let start = Instant::now();
        // An error is the previous request gone without sending: nothing to wait for.
        tokio::select! {
            biased;
            _ = aborted(abort.clone()) => return None,
            _ = after => {}
            () = tokio::time::sleep(TIE_WAIT) => {}
        }
        Some(start.elapsed())
    }
}

async fn run_session(
    shared: Arc<Shared>,
    session: usize,
    mut script: Box<dyn Script>,
    mut tie: TieOrder,
) -> Vec<Sample> {
    let mut samples: Vec<Sample> = Vec::new();
    let mut previous_end = shared.start;
    loop {
        let planned = script.next(samples.last().map(|s| &s.response));
        if let Some(last) = samples.last_mut() {
            // The script has seen the answer; drop the text to keep memory per request small.
            last.response.content = String::new();
        }
        let Some(planned) = planned else { break };
        let due = match planned.start {
            Start::At(offset) => shared.start + offset,
            Start::After(delay) => previous_end + delay,
        };
        if shared.stop_at.is_some_and(|stop| due > stop) || is_aborted(&shared.abort) {
            break;
        }
        // Encoded before it is due, so the send itself does no JSON work.
        let body = Encoded::new(&planned.body);
        tokio::select! {
            biased;
            _ = aborted(shared.abort.clone()) => break,
            _ = sleep_until_precisely(due) => {}
        }
        let Some(tie_wait) = tie.wait_turn(&shared.abort).await else {
            break;
        };
        let tie_wait_us = tie_wait.as_micros() as u64;
        let before_cap = Instant::now();
        let permit = match &shared.cap {
            Some(s) => tokio::select! {
                biased;
                _ = aborted(shared.abort.clone()) => break,
                p = s.clone().acquire_owned() => p.ok(),
            },
            None => None,
        };
        let sent = Instant::now();
        let seq = shared.seq.fetch_add(1, Ordering::Relaxed);
        if let Some(sent) = &shared.sent {
            sent.fetch_add(1, Ordering::Relaxed);
        }
        let response = tokio::select! {
            biased;
            _ = aborted(shared.abort.clone()) => client::cancelled(sent),
            r = send(&shared, body, &planned.body, tie.admitted.take()) => r,
        };
        drop(permit);
        previous_end = sent + Duration::from_micros(response.timing.end_us);
        let sample = Sample {
            session,
            turn: samples.len(),
            seq,
            scheduled_us: since(shared.start, due),
            sent_us: since(shared.start, sent),
            cap_wait_us: sent.saturating_duration_since(before_cap).as_micros() as u64,
            tie_wait_us,
            response,
        };
        if let Some(bar) = &shared.bar {
            bar.inc(1);
        }
        if let Some(observe) = &shared.observer {
            observe(&sample);
        }
        samples.push(sample);
    }
    samples
}

/// Runs every script to the end against `endpoint`.
pub async fn drive(
    endpoint: Endpoint,
    scripts: Vec<Box<dyn Script>>,
    config: &DriverConfig,
) -> Result<DriverOutput, LoadgenError> {
    if config.max_in_flight == Some(0) {
        return Err(LoadgenError::Config(
            "the in-flight cap must be positive".into(),
        ));
    }
    let start = Instant::now();
    let started_at = std::time::SystemTime::now();
    let shared = Arc::new(Shared {
        url: reqwest::Url::parse(&endpoint.url).ok(),
        endpoint,
        start,
        cap: config.max_in_flight.map(|n| Arc::new(Semaphore::new(n))),
        stop_at: config.stop_after.map(|d| start + d),
        seq: AtomicU64::new(0),
        bar: config.bar.clone(),
        observer: config.observer.clone(),
        abort: config.abort.clone(),
        sent: config.sent.clone(),
    });
    // The pacer: sessions in order of their first start (ties by index), each woken at its
    // absolute deadline.
    let mut order: Vec<(Duration, usize, Box<dyn Script>)> = scripts
        .into_iter()
        .enumerate()
        .map(|(i, s)| (s.first_start(), i, s))
        .collect();
    order.sort_by_key(|(t, i, _)| (*t, *i));
    let mut tasks = Vec::with_capacity(order.len());
    // The admission gate of the previous session when it is due at the same instant.
    let mut previous: Option<(Duration, oneshot::Receiver<()>)> = None;
    for (first, index, script) in order {
        let tie = TieOrder::next(&mut previous, first, config.ordered_ties);
        if shared.stop_at.is_some_and(|stop| start + first > stop) || is_aborted(&shared.abort) {
            continue;
        }
        // Wake the session a little early: it builds its first body, then sleeps until the
        // exact deadline, so body construction does not show up as lag.
        let wake = (start + first).checked_sub(PACER_LEAD).unwrap_or(start);
        tokio::select! {
            biased;
            _ = aborted(shared.abort.clone()) => continue,
            _ = tokio::time::sleep_until(wake) => {}
        }
        tasks.push(tokio::spawn(run_session(
            shared.clone(),
            index,
            script,
            tie,
        )));
    }
    let mut samples = Vec::new();
    for task in tasks {
        let s = task
            .await
            .map_err(|e| LoadgenError::Embedded(format!("session task failed: {e}")))?;
        samples.extend(s);
    }
    samples.sort_by_key(|s| (s.session, s.turn));
    let end = samples.iter().map(Sample::end_us).max().unwrap_or(0);
    Ok(DriverOutput {
        samples,
        duration: Duration::from_micros(end),
        started_at,
        aborted: is_aborted(&shared.abort),
    })
}
