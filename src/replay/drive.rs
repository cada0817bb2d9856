//! The one discrete-event loop of every offline replay, and [`Arrivals`], the trait behind
//! which each kind of trace keeps its requests until they are due.
//!
//! The clock jumps from event to event: the earliest of the next arrival, the cluster's next
//! timer (a pass end, a G2 onboard or a hand-off) and, while those go on, the observer's next
//! wake-up ([`ReplayObserver::wake_at`]: an autoscaler's tick). At each instant the loop first finishes
//! what ends there (so a request that becomes ready when another ends is released at once),
//! then releases the arrivals due, then starts passes on idle workers. Every instant is a
//! [`SimTime`] (whole nanoseconds), so two events are in the same step only when they are
//! simultaneous, and ties go the way the arrivals order them.

use crate::cluster::{Cluster, Output};
use crate::time::SimTime;

use super::{ReplayError, ReplayObserver};

/// The requests of a replay, as the loop sees them: when the next one is due, submitting those
/// that are, and learning from the cluster's outputs (a request that ends may make others due).
/// The Mooncake replay's sessions (timestamp-ordered arrivals, each next turn after its
/// predecessor ends plus its delay) and the agentic graph's readiness (a node when its
/// dependencies have fired) both implement it.
pub(crate) trait Arrivals {
    /// When the next request becomes due, if one is waiting (more may become waiting when
    /// requests end).
    fn next_due(&self) -> Option<SimTime>;

    /// Submits to `cluster` every request due by `now`, in order, telling `observer` of each
    /// one the cluster accepts.
    fn release(&mut self, now: SimTime, cluster: &mut Cluster, observer: &mut dyn ReplayObserver);

    /// Takes the cluster's `outputs` (leaving the buffer empty for reuse).
    fn take(&mut self, outputs: &mut Vec<Output>);

    /// Requests ended so far (finished or rejected), for progress.
    fn ended(&self) -> usize;

    /// The loop finished a step (work for the time between steps goes here).
    fn step_done(&mut self) {}

    /// True when the replay is to stop here, before its end (its SLO is lost).
    fn stopped(&self) -> bool {
        false
    }
}

/// Drives `cluster` and `arrivals` to the end: until nothing is due and no timer is set.
/// `progress` is called with (ended, `total`) requests every 64 ended and at the end. Returns
/// the last instant; a run that stops with requests still in the cluster is a
/// [`ReplayError::DeadEnd`], unless the arrivals asked it to stop ([`Arrivals::stopped`]).
pub(crate) fn drive(
    cluster: &mut Cluster,
    arrivals: &mut impl Arrivals,
    observer: &mut dyn ReplayObserver,
    total: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<SimTime, ReplayError> {
    let mut now = SimTime::ZERO;
    let mut last_progress = 0usize;
    // One output buffer for the whole run.
    let mut outputs = Vec::new();
    loop {
        let next = match (arrivals.next_due(), cluster.next_pass_end()) {
            (Some(a), Some(p)) => a.min(p),
            (Some(a), None) => a,
            (None, Some(p)) => p,
            (None, None) => break,
        };
        // The observer's own events (an autoscaler's ticks, scrapes and model loads) wake the
        // loop too, while the run goes on.
        let next = observer.wake_at().map_or(next, |wake| next.min(wake));
        now = now.max(next);
        cluster.finish_due_into(now, &mut outputs);
        observer.outputs(cluster, &outputs, now);
        arrivals.take(&mut outputs);
        arrivals.release(now, cluster, observer);
        cluster.start_idle_into(now, &mut outputs);
        observer.outputs(cluster, &outputs, now);
        arrivals.take(&mut outputs);
        arrivals.step_done();
        if arrivals.stopped() {
            // Requests are still in flight: the caller knows the run was cut.
            return Ok(now);
        }
        let ended = arrivals.ended();
        if ended >= last_progress + 64 {
            last_progress = ended;
            progress(ended, total);
        }
    }
    progress(arrivals.ended(), total);
    let in_flight = cluster.active_requests();
    if in_flight > 0 {
        return Err(ReplayError::DeadEnd {
            time: now,
            in_flight,
        });
    }
    Ok(now)
}
