//! Driving the cluster through time: when it next needs waking, finishing the passes, G2
//! onboards and hand-offs that are due, starting passes on idle workers, and turning the
//! workers' scheduler events into [`Output`]s.

use super::disagg::DecodePool;
use super::output::Output;
use super::Cluster;
use crate::ids::WorkerId;
use crate::scheduler::{SchedulerEvent, WorkerRole};
use crate::time::SimTime;
use crate::worker::Worker;

impl Cluster {
    /// When the cluster next needs `advance`: the earliest pass end, G2 onboard or hand-off, or
    /// the latest time it was driven to when an idle worker has work. None when idle.
    pub fn next_event_time(&self) -> Option<SimTime> {
        let workers = self
            .active
            .iter()
            .map(|i| &self.workers[i])
            .filter_map(|w| match w.next_timer() {
                None if w.wants_pass() => Some(self.now),
                Some(t) if w.wants_pass() => Some(t.min(self.now)),
                t => t,
            })
            .min();
        min_opt(workers, self.next_handoff())
    }

    /// The earliest end of a pass in progress, G2 onboard or hand-off: the engine's own timers.
    pub(crate) fn next_pass_end(&self) -> Option<SimTime> {
        let active = self.active.iter().map(|i| &self.workers[i]);
        let workers = if self.has_g2 {
            active.filter_map(Worker::next_timer).min()
        } else {
            active.filter_map(Worker::pass_end).min()
        };
        min_opt(workers, self.next_handoff())
    }

    fn next_handoff(&self) -> Option<SimTime> {
        self.decode.as_ref().and_then(DecodePool::next_arrival)
    }

    /// Finishes every pass due by `now`, then starts passes on idle workers with work (again
    /// while passes take no time).
    pub fn advance(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = self.finish_due(now);
        out.extend(self.start_idle(now));
        out
    }

    /// Completes the G2 transfers and hand-offs due by `now`, then finishes the passes that end
    /// by `now`, in order of end time then worker id.
    pub(crate) fn finish_due(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = Vec::new();
        self.finish_due_into(now, &mut out);
        out
    }

    /// [`Cluster::finish_due`], appending to `out` (a driver reusing one buffer allocates
    /// nothing per step).
    pub(crate) fn finish_due_into(&mut self, now: SimTime, out: &mut Vec<Output>) {
        self.finish_into(now, out);
    }

    /// Finishes the passes due by `now` (G2 onboards and hand-offs due by it first).
    fn finish_into(&mut self, now: SimTime, out: &mut Vec<Output>) {
        self.now = self.now.max(now);
        self.advance_timers(now);
        let mut due = std::mem::take(&mut self.due);
        let workers = &self.workers;
        due.extend(self.active.iter().filter_map(|i| {
            let end = workers[i].pass_end()?;
            (end <= now).then_some((end, i))
        }));
        due.sort_unstable();
        for &(end, w) in &due {
            self.workers[w].finish_pass();
            self.collect(w, end, out);
        }
        due.clear();
        self.due = due;
        // Hand-offs that took no time, or ended before `now`, started by those passes.
        self.advance_timers(now);
    }

    /// G2 onboards and hand-offs due by `now`.
    fn advance_timers(&mut self, now: SimTime) {
        if self.has_g2 {
            for i in self.active.iter() {
                let w = &mut self.workers[i];
                if w.next_transfer_end().is_some_and(|t| t <= now) {
                    w.advance_transfers(now);
                }
            }
        }
        let Some(pool) = &mut self.decode else {
            return;
        };
        for (id, worker, request) in pool.arrivals_due(now) {
            self.workers[worker].enqueue(id, request);
            self.active.insert(worker);
        }
    }

    /// Starts a pass on every idle worker with work; passes that take no time finish at once and
    /// the loop repeats.
    pub(crate) fn start_idle(&mut self, now: SimTime) -> Vec<Output> {
        let mut out = Vec::new();
        self.start_idle_into(now, &mut out);
        out
    }

    /// [`Cluster::start_idle`], appending to `out`.
    pub(crate) fn start_idle_into(&mut self, now: SimTime, out: &mut Vec<Output>) {
        self.now = self.now.max(now);
        loop {
            let mut instant = false;
            // In worker order, seeing workers that become active during the sweep (a request
            // unparked by an earlier worker's completion), as a scan of every worker would.
            let mut next = self.active.next_from(0);
            while let Some(w) = next {
                next = self.active.next_from(w + 1);
                if !self.workers[w].wants_pass() {
                    self.drop_if_idle(w);
                    continue;
                }
                instant |= self.workers[w].start_pass(now) == Some(now);
                self.collect(w, now, out);
                self.drop_if_idle(w);
                // Collecting may have activated workers after `w`.
                next = self.active.next_from(w + 1);
            }
            if !instant {
                return;
            }
            self.finish_into(now, out);
        }
    }

    /// Takes `w` out of the active set when it has no pass, no work and no timer.
    fn drop_if_idle(&mut self, w: usize) {
        let worker = &self.workers[w];
        if worker.pass_end().is_none()
            && !worker.scheduler().has_work()
            && worker.next_timer().is_none()
        {
            self.active.remove(w);
        }
    }

    /// Moves a worker's events into outputs and its router's bookkeeping. A prefill worker's
    /// admission and token are hidden (the decode side's are the request's), and its finished
    /// requests are handed off; a decode worker's admission carries the prefill-side reuse.
    fn collect(&mut self, w: usize, time: SimTime, out: &mut Vec<Output>) {
        let role = self.workers[w].role();
        // KV events reach the router when the pass that produced them ends (Dynamo's pass-end
        // visibility): a worker in a pass keeps them until then.
        if self.workers[w].pass_end().is_none() {
            self.forward_kv_events(w);
        }
        let worker = WorkerId(w as u32);
        let mut freed = false;
        let mut events = std::mem::take(&mut self.events);
        self.workers[w].swap_events(&mut events);
        for event in events.drain(..) {
            match event {
                SchedulerEvent::Admitted {
                    id,
                    reused_tokens,
                    g2_reused_tokens,
                } => {
                    let reuse = match (role, &mut self.decode) {
                        (WorkerRole::Prefill, Some(pool)) => {
                            pool.note_prefill_reuse(id, reused_tokens, g2_reused_tokens);
                            continue;
                        }
                        (WorkerRole::Decode, Some(pool)) => pool.prefill_reuse(id),
                        _ => (reused_tokens, g2_reused_tokens),
                    };
                    out.push(Output::Admitted {
                        id,
                        worker,
                        time,
                        reused_tokens: reuse.0,
                        g2_reused_tokens: reuse.1,
                    });
                }
                SchedulerEvent::Preempted { id } => out.push(Output::Preempted { id, time }),
                SchedulerEvent::Token { id, token, index } => {
                    if index == 1 {
                        let (router, local) = self.router_of(w);
                        router.mark_prefill_completed(local, id);
                        freed = true;
                    }
                    if role == WorkerRole::Prefill {
                        // The prefill worker's token is not a client token.
                        continue;
                    }
                    out.push(Output::Token {
                        id,
                        token,
                        index,
                        time,
                    });
                }
                SchedulerEvent::Finished { id } => {
                    let (router, local) = self.router_of(w);
                    router.free(local, id);
                    self.placement.remove(&id);
                    freed = true;
                    if role == WorkerRole::Prefill {
                        self.hand_off(id, worker, time, out);
                    } else {
                        if let Some(pool) = &mut self.decode {
                            pool.forget(id);
                        }
                        out.push(Output::Finished { id, time });
                    }
                }
                SchedulerEvent::Rejected { id, reason } => {
                    let (router, local) = self.router_of(w);
                    router.free(local, id);
                    self.placement.remove(&id);
                    if let Some(pool) = &mut self.decode {
                        pool.forget(id);
                    }
                    freed = true;
                    out.push(Output::Rejected { id, time, reason });
                }
            }
        }
        self.events = events;
        if freed && w < self.num_front {
            self.unpark();
        }
    }
}

fn min_opt(a: Option<SimTime>, b: Option<SimTime>) -> Option<SimTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
