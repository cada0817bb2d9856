//! Stopping a replay once its SLO is lost: [`StopRule`] (the bounds and the share of requests
//! that must meet them) and the judge that watches a replay's requests against it.
//!
//! The judge sees what the metrics collector sees, in the same order (each request's ready
//! time, admission, tokens, finish or rejection), and decides a request's miss with the same
//! arithmetic as [`Slo::met`] on the record the collector would write. A request misses:
//! - when it is rejected;
//! - when its first token comes later than the TTFT bound after it was ready;
//! - while it still waits for its first token past that bound (its first token can only come
//!   later, since the clock only moves forward);
//! - when it finishes with a mean inter-token latency or an end-to-end latency over its bound.
//!
//! Once so many have missed that even every other request meeting the SLO would leave the
//! share below the target, the replay stops ([`Stopped`]): its full run could only have had a
//! lower share, so the candidate is infeasible, and nothing measured up to there is a figure
//! of the whole run.

use std::collections::VecDeque;
use std::fmt;

use crate::cluster::Output;
use crate::ids::RequestId;
use crate::slo::Slo;
use crate::time::SimTime;

/// When a replay stops early: once so many requests have missed `slo` that the share meeting
/// it can no longer reach `attainment`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StopRule {
    /// The per-request bounds.
    pub slo: Slo,
    /// The share of the trace's requests that must meet them (0 to 1).
    pub attainment: f64,
}

impl StopRule {
    /// True when `missed` of `requests` missing the SLO still leaves the target reachable:
    /// the share of the others is at least the attainment (the same division as the share of
    /// good requests, so the verdict is exact).
    pub fn reachable(&self, requests: usize, missed: usize) -> bool {
        requests == 0
            || (requests.saturating_sub(missed)) as f64 / requests as f64 >= self.attainment
    }
}

/// Which bound a request missed, with its value and the bound (ms).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Miss {
    /// The engine refused it (at submission or on a worker).
    Rejected,
    /// Its first token came `ms` after it was ready.
    Ttft {
        /// Its TTFT.
        ms: f64,
        /// The bound.
        bound: f64,
    },
    /// It had waited `ms` for its first token, past the bound, when the replay stopped
    /// looking.
    Waiting {
        /// How long it had waited.
        ms: f64,
        /// The bound.
        bound: f64,
    },
    /// Its mean inter-token latency.
    Tpot {
        /// Its TPOT.
        ms: f64,
        /// The bound.
        bound: f64,
    },
    /// Its end-to-end latency.
    E2e {
        /// Its E2E latency.
        ms: f64,
        /// The bound.
        bound: f64,
    },
    /// It finished with no token (no TTFT or E2E to meet a bound with), or without being
    /// admitted.
    NoTokens,
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Miss::Rejected => write!(f, "rejected by the engine"),
            Miss::Ttft { ms, bound } => write!(f, "TTFT {ms:.3} ms > {bound} ms"),
            Miss::Waiting { ms, bound } => {
                write!(f, "no first token after {ms:.3} ms > TTFT bound {bound} ms")
            }
            Miss::Tpot { ms, bound } => write!(f, "TPOT {ms:.3} ms > {bound} ms"),
            Miss::E2e { ms, bound } => write!(f, "E2E {ms:.3} ms > {bound} ms"),
            Miss::NoTokens => write!(f, "finished without a token"),
        }
    }
}

/// Where and why a replay stopped: the request whose miss made the target unreachable.
#[derive(Clone, Debug, PartialEq)]
pub struct Stopped {
    /// The virtual instant of the stop.
    pub time: SimTime,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests known to miss the SLO at the stop.
    pub missed: usize,
    /// Requests ended (finished or rejected) at the stop.
    pub ended: usize,
    /// The miss that made the target unreachable: how many had missed with it, ...
    pub nth: usize,
    /// ... its request's 1-based line in the trace, ...
    pub line: usize,
    /// ... its session and turn, ...
    pub session: String,
    /// (the turn, from 0)
    pub turn: usize,
    /// ... and what it missed.
    pub miss: Miss,
}

impl Stopped {
    /// The highest share of requests the full run could have had meeting the SLO: all but
    /// those that had missed at the stop.
    pub fn attainment_at_most(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.requests.saturating_sub(self.missed) as f64 / self.requests as f64
    }
}

/// What the judge keeps of one request.
#[derive(Clone, Copy, Debug)]
struct Watch {
    ready: SimTime,
    first: Option<SimTime>,
    last: Option<SimTime>,
    tokens: u64,
    admitted: bool,
    /// Its miss is counted (once).
    missed: bool,
}

/// Watches a replay's requests against a [`StopRule`].
pub(super) struct Judge {
    rule: StopRule,
    requests: usize,
    /// By request id (dense from 0 in a Mooncake replay).
    watch: Vec<Option<Watch>>,
    /// Requests still waiting for their first token, in order of release (when a TTFT bound
    /// is set): the front's deadline passes first, or nearly.
    waiting: VecDeque<RequestId>,
    missed: usize,
    /// The miss that made the target unreachable, with how many had missed with it.
    lost: Option<(RequestId, Miss, usize)>,
}

fn span_ms(later: SimTime, earlier: SimTime) -> f64 {
    later.saturating_since(earlier).as_millis_f64()
}

impl Judge {
    /// A judge for a replay of `requests` requests.
    pub(super) fn new(rule: StopRule, requests: usize) -> Judge {
        Judge {
            rule,
            requests,
            watch: Vec::with_capacity(requests),
            waiting: VecDeque::new(),
            missed: 0,
            lost: None,
        }
    }

    fn get(&mut self, id: RequestId) -> Option<&mut Watch> {
        self.watch.get_mut(id.0 as usize).and_then(Option::as_mut)
    }

    /// Counts `id`'s miss (once).
    fn miss(&mut self, id: RequestId, why: Miss) {
        let Some(w) = self.get(id) else {
            return;
        };
        if w.missed {
            return;
        }
        w.missed = true;
        self.missed += 1;
        if self.lost.is_none() && !self.rule.reachable(self.requests, self.missed) {
            self.lost = Some((id, why, self.missed));
        }
    }

    /// Request `id` became ready at `ready`.
    pub(super) fn arrival(&mut self, id: RequestId, ready: SimTime) {
        let i = id.0 as usize;
        if i >= self.watch.len() {
            self.watch.resize(i + 1, None);
        }
        self.watch[i] = Some(Watch {
            ready,
            first: None,
            last: None,
            tokens: 0,
            admitted: false,
            missed: false,
        });
        if self.rule.slo.ttft_ms.is_some() {
            self.waiting.push_back(id);
        }
    }

    /// Request `id` was refused at submission.
    pub(super) fn rejected(&mut self, id: RequestId) {
        self.miss(id, Miss::Rejected);
    }

    /// The cluster's output.
    pub(super) fn output(&mut self, out: &Output) {
        let slo = self.rule.slo;
        match *out {
            Output::Admitted { id, .. } => {
                if let Some(w) = self.get(id) {
                    w.admitted = true;
                }
            }
            Output::Token { id, time, .. } => {
                let Some(w) = self.get(id) else {
                    return;
                };
                let first = w.first.is_none();
                if first {
                    w.first = Some(time);
                }
                w.last = Some(time);
                w.tokens += 1;
                let ms = span_ms(time, w.ready);
                if let Some(bound) = slo.ttft_ms.filter(|b| first && ms > *b) {
                    self.miss(id, Miss::Ttft { ms, bound });
                }
            }
            Output::Finished { id, .. } => {
                let Some(w) = self.get(id).copied() else {
                    return;
                };
                if let Some(why) = finish_miss(&slo, &w) {
                    self.miss(id, why);
                }
            }
            Output::Rejected { id, .. } => self.miss(id, Miss::Rejected),
            Output::KvTransfer { .. } | Output::Preempted { .. } => {}
        }
    }

    /// The step at `now` is over: every request still without a first token past the TTFT
    /// bound misses it.
    pub(super) fn step_done(&mut self, now: SimTime) {
        let Some(bound) = self.rule.slo.ttft_ms else {
            return;
        };
        while let Some(&id) = self.waiting.front() {
            let Some(w) = self.get(id).copied() else {
                self.waiting.pop_front();
                continue;
            };
            if w.missed || w.first.is_some() {
                self.waiting.pop_front();
                continue;
            }
            let ms = span_ms(now, w.ready);
            if ms <= bound {
                break;
            }
            self.waiting.pop_front();
            self.miss(id, Miss::Waiting { ms, bound });
        }
    }

    /// The target is out of reach.
    pub(super) fn lost(&self) -> bool {
        self.lost.is_some()
    }

    /// The request whose miss lost the target, its miss, and how many had missed with it.
    pub(super) fn lost_by(&self) -> Option<(RequestId, Miss, usize)> {
        self.lost
    }

    /// Requests known to miss so far.
    pub(super) fn missed(&self) -> usize {
        self.missed
    }
}

/// The bound a finished request misses, by the arithmetic of the collector's record and
/// [`Slo::met`]; None when it meets them all.
fn finish_miss(slo: &Slo, w: &Watch) -> Option<Miss> {
    if w.missed {
        return None;
    }
    if !w.admitted {
        return Some(Miss::NoTokens);
    }
    let ttft = w.first.map(|t| span_ms(t, w.ready));
    let e2e = w.last.map(|t| span_ms(t, w.ready));
    if slo.ttft_ms.is_some() && ttft.is_none() || slo.e2e_ms.is_some() && e2e.is_none() {
        return Some(Miss::NoTokens);
    }
    if let (Some(bound), Some(ms)) = (slo.ttft_ms, ttft) {
        if ms > bound {
            return Some(Miss::Ttft { ms, bound });
        }
    }
    if let (Some(bound), Some(first), Some(last)) = (slo.itl_ms, w.first, w.last) {
        if w.tokens > 1 {
            let ms = span_ms(last, first) / (w.tokens - 1) as f64;
            if ms > bound {
                return Some(Miss::Tpot { ms, bound });
            }
        }
    }
    if let (Some(bound), Some(ms)) = (slo.e2e_ms, e2e) {
        if ms > bound {
            return Some(Miss::E2e { ms, bound });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;

    fn rule(ttft: f64, tpot: f64, q: f64) -> StopRule {
        StopRule {
            slo: Slo {
                ttft_ms: Some(ttft),
                itl_ms: Some(tpot),
                e2e_ms: None,
                trajectory_e2e_ms: None,
            },
            attainment: q,
        }
    }

    fn ms(t: u64) -> SimTime {
        SimTime::from_micros(t * 1000)
    }

    fn run(judge: &mut Judge, id: u64, ready: u64, tokens: &[u64]) {
        let id = RequestId(id);
        judge.arrival(id, ms(ready));
        judge.output(&Output::Admitted {
            id,
            worker: WorkerId(0),
            time: ms(ready),
            reused_tokens: 0,
            g2_reused_tokens: 0,
        });
        for (index, &t) in tokens.iter().enumerate() {
            judge.output(&Output::Token {
                id,
                token: 0,
                index: index + 1,
                time: ms(t),
            });
        }
        if let Some(&t) = tokens.last() {
            judge.output(&Output::Finished { id, time: ms(t) });
        }
    }

    /// The bound is exact: 9 of 10 meeting reaches 0.9, the second miss does not.
    #[test]
    fn the_target_is_lost_at_the_first_miss_beyond_the_allowance() {
        let r = rule(100.0, 20.0, 0.9);
        assert!(r.reachable(10, 1) && !r.reachable(10, 2));
        assert!(r.reachable(0, 0) && rule(1.0, 1.0, 0.0).reachable(5, 5));
        let mut j = Judge::new(r, 10);
        run(&mut j, 0, 0, &[100, 110]);
        assert_eq!(j.missed(), 0, "TTFT 100 ms meets a 100 ms bound");
        run(&mut j, 1, 0, &[101, 110]);
        assert_eq!(j.missed(), 1);
        assert!(!j.lost());
        // TPOT (130 - 10) / 4 = 30 ms.
        run(&mut j, 2, 0, &[10, 40, 70, 100, 130]);
        assert!(j.lost());
        let (id, miss, nth) = j.lost_by().unwrap();
        assert_eq!((id, nth), (RequestId(2), 2));
        assert_eq!(
            miss,
            Miss::Tpot {
                ms: 30.0,
                bound: 20.0
            }
        );
        assert_eq!(miss.to_string(), "TPOT 30.000 ms > 20 ms");
    }

    /// A request still waiting for its first token past the bound misses once, at the end of
    /// the step where the bound has passed, and its late token does not count it again.
    #[test]
    fn a_request_waiting_past_the_ttft_bound_misses() {
        let mut j = Judge::new(rule(100.0, 20.0, 0.6), 4);
        j.arrival(RequestId(0), ms(0));
        j.arrival(RequestId(1), ms(50));
        j.step_done(ms(100));
        assert_eq!(j.missed(), 0);
        j.step_done(ms(101));
        assert_eq!(j.missed(), 1);
        assert!(!j.lost(), "3 of 4 may still meet it");
        j.step_done(ms(151));
        assert!(j.lost());
        assert_eq!(
            j.lost_by().unwrap().1.to_string(),
            "no first token after 101.000 ms > TTFT bound 100 ms"
        );
        j.output(&Output::Token {
            id: RequestId(0),
            token: 0,
            index: 1,
            time: ms(200),
        });
        j.output(&Output::Finished {
            id: RequestId(0),
            time: ms(200),
        });
        assert_eq!(j.missed(), 2);
        j.rejected(RequestId(1));
        assert_eq!(j.missed(), 2, "counted once");
    }
}
