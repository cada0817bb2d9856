//! Precise wake-ups for the live driver: [`PreciseTimer`] wakes a tokio task within tens of
//! microseconds of a deadline, where tokio's own timer wheel rounds every sleep up to its next
//! millisecond tick.
//!
//! A dedicated OS thread serves one wait at a time. It blocks on a channel with a timeout (a
//! futex wait) until a *margin* before the deadline, then spins the rest of the way and wakes
//! the waiting task through a `oneshot`. A timed wait ends after its timeout, by however long
//! the kernel and the host take to run the thread again: on a small VM whose idle cores are
//! halted, 30 to over 100 µs, more after a longer wait. The margin is what the thread's own
//! waits overran their timeouts by lately (`Margins`), kept apart for waits shorter and
//! longer than `LONG_WAIT`, so the wait ends about when the task is due and the spin covers
//! only the difference; a wait that overruns its margin fires late by the excess, with no spin.
//! On Linux the thread also sets its own timer slack to 1 ns, where the default 50 µs lets the
//! kernel end every timed wait up to that much later still. The thread spins only while a wait
//! is pending, so an idle server burns no CPU, and for at most one part in `SPIN_SHARE` of
//! its time (`SpinBudget`): when deadlines come so close together that the margins would
//! keep it spinning, the server is busy and the CPU goes to the tasks that deliver the tokens
//! (the waits then end a little late, which shifts the tokens but keeps their gaps). It ends
//! when its [`PreciseTimer`] is dropped.
//!
//! [`PreciseTimer::sleep_until`] races that thread against tokio's own timer and only ever
//! returns once tokio's clock has reached the deadline. Under tokio's paused test clock the
//! tokio timer is therefore the one that fires (the thread's wake-up comes too early by that
//! clock and is ignored), so code that sleeps this way stays testable with
//! `#[tokio::test(start_paused = true)]`.

use std::future::Future;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// The largest margin (and so the longest spin of one wait).
pub(crate) const MAX_MARGIN: Duration = Duration::from_micros(200);

/// Waits at least this long keep a margin of their own: a core that was halted longer takes
/// longer to run the thread again.
pub(crate) const LONG_WAIT: Duration = Duration::from_millis(1);

/// How far before a deadline the thread ends its blocking wait, for short and long waits:
/// an average of what the last few waits of each kind overran their timeouts by, at most
/// [`MAX_MARGIN`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Margins {
    /// For waits shorter than [`LONG_WAIT`].
    pub short: Duration,
    /// For waits of [`LONG_WAIT`] or more.
    pub long: Duration,
}

impl Margins {
    /// The margin of a wait of `length`.
    pub(crate) fn of(&self, length: Duration) -> Duration {
        if length < LONG_WAIT {
            self.short
        } else {
            self.long
        }
    }

    /// Learns from a wait of `length` that ended `overrun` after its timeout: that wait kind's
    /// margin moves an eighth of the way there (capped at [`MAX_MARGIN`]).
    pub(crate) fn learn(&mut self, length: Duration, overrun: Duration) {
        let margin = if length < LONG_WAIT {
            &mut self.short
        } else {
            &mut self.long
        };
        *margin = (*margin * 7 + overrun.min(MAX_MARGIN)) / 8;
    }
}

/// The thread spins for at most one part in this of its time.
pub(crate) const SPIN_SHARE: u32 = 10;

/// Spin time the thread may use: a bucket that fills by one part in [`SPIN_SHARE`] of the time
/// that passes, up to [`MAX_MARGIN`], and empties by the time spent spinning.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinBudget {
    available: Duration,
    at: StdInstant,
}

impl SpinBudget {
    /// A full bucket at `now`.
    pub(crate) fn new(now: StdInstant) -> SpinBudget {
        SpinBudget {
            available: MAX_MARGIN,
            at: now,
        }
    }

    /// The spin time available at `now`.
    pub(crate) fn available(&mut self, now: StdInstant) -> Duration {
        let earned = now.saturating_duration_since(self.at) / SPIN_SHARE;
        self.available = (self.available + earned).min(MAX_MARGIN);
        self.at = self.at.max(now);
        self.available
    }

    /// Takes `spun` out of the bucket.
    pub(crate) fn spend(&mut self, spun: Duration) {
        self.available = self.available.saturating_sub(spun);
    }
}

/// One wait: fire `fire` at `deadline`.
struct Wait {
    deadline: StdInstant,
    fire: oneshot::Sender<()>,
}

/// A timer thread for one owner that waits for one deadline at a time.
#[derive(Debug)]
pub struct PreciseTimer {
    /// Waits for the thread; dropping it ends the thread.
    waits: Option<mpsc::Sender<Wait>>,
    /// The thread, joined on drop so that none is left behind.
    thread: Option<JoinHandle<()>>,
}

impl PreciseTimer {
    /// Starts the timer thread.
    pub fn start() -> std::io::Result<PreciseTimer> {
        let (waits, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("mockserve-timer".into())
            .spawn(move || {
                let _ = tighten_timer_slack();
                serve_waits(&rx);
            })?;
        Ok(PreciseTimer {
            waits: Some(waits),
            thread: Some(thread),
        })
    }

    /// A future that sleeps until `deadline` (tokio's clock), waking within tens of
    /// microseconds of it. The wait is handed to the thread here, when the future is made, so
    /// the future borrows nothing and its owner may keep it across other work. One wait at a
    /// time: a newer one replaces the wait of an earlier future (its owner having moved on).
    pub fn sleep_until(&self, deadline: Instant) -> impl Future<Output = ()> + Send + 'static {
        let fired = if Instant::now() >= deadline {
            // Due already: no round trip through the thread.
            None
        } else {
            let (fire, fired) = oneshot::channel();
            let wait = Wait {
                deadline: deadline.into_std(),
                fire,
            };
            let asked = self.waits.as_ref().is_some_and(|w| w.send(wait).is_ok());
            asked.then_some(fired)
        };
        async move {
            if Instant::now() >= deadline {
                return;
            }
            let tokio_sleep = tokio::time::sleep_until(deadline);
            tokio::pin!(tokio_sleep);
            if let Some(fired) = fired {
                tokio::select! {
                    biased;
                    () = &mut tokio_sleep => return,
                    // Also when the thread has gone (`Err`): the tokio timer then has the last
                    // word.
                    _ = fired => {}
                }
                if Instant::now() >= deadline {
                    return;
                }
            }
            tokio_sleep.await;
        }
    }
}

impl Drop for PreciseTimer {
    fn drop(&mut self) {
        // Closing the channel ends the thread within one spin at most.
        drop(self.waits.take());
        if let Some(thread) = self.thread.take() {
            // A panic of the thread has nothing left to clean up.
            let _ = thread.join();
        }
    }
}

/// Ends this thread's timed waits as close to their timeouts as the kernel can: a timer slack
/// of 1 ns instead of the default 50 µs. Returns the thread's timer slack afterwards, ns (a
/// failure leaves the default, which only makes wake-ups later); None off Linux, where nothing
/// is changed.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn tighten_timer_slack() -> Option<u64> {
    // SAFETY: PR_SET_TIMERSLACK and PR_GET_TIMERSLACK take and return plain integers, read and
    // write no memory of this process, and concern only the calling thread's timer slack.
    let slack = unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0)
    };
    u64::try_from(slack).ok()
}

#[cfg(not(target_os = "linux"))]
fn tighten_timer_slack() -> Option<u64> {
    None
}

/// The timer thread: serves waits until the channel closes.
fn serve_waits(waits: &mpsc::Receiver<Wait>) {
    let mut pending: Option<Wait> = None;
    let mut margins = Margins::default();
    let mut budget = SpinBudget::new(StdInstant::now());
    // The pending wait's blocking wait has ended: only the spin is left.
    let mut blocked = false;
    loop {
        let Some(wait) = pending.take() else {
            match waits.recv() {
                Ok(wait) => pending = Some(wait),
                Err(_) => return,
            }
            blocked = false;
            continue;
        };
        if wait.fire.is_closed() {
            // The waiter moved on.
            blocked = false;
            continue;
        }
        let now = StdInstant::now();
        let remaining = wait.deadline.saturating_duration_since(now);
        // After its blocking wait, a wait only spins (unless that wait ended far too early).
        let block = if blocked && remaining <= MAX_MARGIN {
            Duration::ZERO
        } else {
            remaining.saturating_sub(margins.of(remaining).min(budget.available(now)))
        };
        if !block.is_zero() {
            match waits.recv_timeout(block) {
                // A newer wait replaces this one.
                Ok(newer) => {
                    pending = Some(newer);
                    blocked = false;
                }
                Err(RecvTimeoutError::Timeout) => {
                    margins.learn(
                        remaining,
                        StdInstant::now().saturating_duration_since(now + block),
                    );
                    pending = Some(wait);
                    blocked = true;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
            continue;
        }
        // The spin still takes a newer wait, which may be due sooner.
        let mut newer = None;
        let spin_start = StdInstant::now();
        while newer.is_none() && StdInstant::now() < wait.deadline {
            std::hint::spin_loop();
            match waits.try_recv() {
                Ok(wait) => newer = Some(wait),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return,
            }
        }
        budget.spend(spin_start.elapsed());
        blocked = false;
        if newer.is_some() {
            pending = newer;
            continue;
        }
        // The waiter may have moved on meanwhile; nothing to do then.
        let _ = wait.fire.send(());
    }
}

#[cfg(test)]
pub(crate) mod real_time {
    //! Real-time tests. They are `#[ignore]`d in the test command, where the other tests take
    //! the CPU, and run alone by `.ci/run`'s serial step
    //! (`cargo test -- --ignored --test-threads=1` on exactly these).

    use std::fmt::Debug;
    use std::future::Future;
    use std::time::Duration;

    /// Tries at most.
    const TRIES: usize = 5;

    /// Runs `try_once` until it passes, a quarter second apart, [`TRIES`] times at most; then
    /// panics with every failure. Alone on the machine one try passes; the others absorb a
    /// stray preemption. A wrong mechanism (tokio's 1 ms timer where microseconds are due)
    /// fails every one.
    pub(crate) async fn until_one_passes<E: Debug, F: Future<Output = Result<(), E>>>(
        mut try_once: impl FnMut() -> F,
    ) {
        let mut failures = Vec::new();
        for _ in 0..TRIES {
            match try_once().await {
                Ok(()) => return,
                Err(e) => failures.push(e),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("every one of {TRIES} tries failed: {failures:#?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time: the thread's clock cannot be paused.
    #[tokio::test]
    #[ignore = "real time: .ci/run runs it alone, after the test command"]
    async fn wakes_at_the_deadline_not_before() {
        let timer = PreciseTimer::start().expect("timer thread");
        real_time::until_one_passes(|| async {
            let mut late = Vec::new();
            for _ in 0..20 {
                // Just after one of tokio's millisecond ticks, so that tokio's timer alone
                // would wake ~0.9 ms after the deadline below.
                tokio::time::sleep(Duration::from_millis(1)).await;
                let deadline = Instant::now() + Duration::from_micros(1100);
                tokio::time::timeout(Duration::from_secs(5), timer.sleep_until(deadline))
                    .await
                    .expect("woke up");
                let now = Instant::now();
                assert!(now >= deadline, "woke before the deadline");
                late.push(now - deadline);
            }
            late.sort();
            // Generous: a loaded CI box. On an idle machine the median is a few microseconds.
            if late[late.len() / 2] < Duration::from_micros(500) {
                Ok(())
            } else {
                Err(late)
            }
        })
        .await;
    }

    #[tokio::test]
    async fn a_new_wait_replaces_an_abandoned_one() {
        let timer = PreciseTimer::start().expect("timer thread");
        let far = Instant::now() + Duration::from_secs(3600);
        let abandoned = tokio::time::timeout(Duration::from_millis(5), timer.sleep_until(far));
        assert!(abandoned.await.is_err(), "an hour has not passed");
        let soon = Instant::now() + Duration::from_millis(2);
        tokio::time::timeout(Duration::from_secs(5), timer.sleep_until(soon))
            .await
            .expect("the newer wait fires");
        assert!(Instant::now() >= soon);
    }

    #[tokio::test(start_paused = true)]
    async fn follows_the_paused_clock() {
        let timer = PreciseTimer::start().expect("timer thread");
        let start = Instant::now();
        timer.sleep_until(start + Duration::from_secs(10)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn margins_follow_the_overruns_of_each_kind_of_wait_within_their_bound() {
        let us = Duration::from_micros;
        let (short, long) = (us(300), Duration::from_millis(3));
        let mut m = Margins::default();
        // Steady overruns bring each margin to them, and one kind leaves the other alone.
        for _ in 0..200 {
            m.learn(short, us(40));
        }
        assert!(m.of(short) > us(39) && m.of(short) <= us(40), "{m:?}");
        assert_eq!(m.of(long), Duration::ZERO);
        for _ in 0..200 {
            m.learn(long, us(120));
        }
        assert!(m.of(long) > us(119) && m.of(long) <= us(120), "{m:?}");
        assert!(m.of(short) <= us(40));
        assert_eq!(m.of(LONG_WAIT), m.long);
        // Punctual waits bring a margin down again.
        for _ in 0..200 {
            m.learn(short, Duration::ZERO);
        }
        assert!(m.of(short) < us(1), "{m:?}");
        // One huge overrun moves a margin by an eighth of at most MAX_MARGIN, and no run of
        // them takes it past MAX_MARGIN.
        let mut fresh = Margins::default();
        fresh.learn(short, Duration::from_secs(1));
        assert_eq!(fresh.short, MAX_MARGIN / 8);
        for _ in 0..500 {
            fresh.learn(short, Duration::from_secs(1));
        }
        assert!(fresh.short <= MAX_MARGIN, "{fresh:?}");
    }

    #[test]
    fn the_spin_budget_is_a_tenth_of_the_time_within_its_bound() {
        let us = Duration::from_micros;
        let t0 = StdInstant::now();
        let mut b = SpinBudget::new(t0);
        assert_eq!(b.available(t0), MAX_MARGIN);
        b.spend(MAX_MARGIN);
        assert_eq!(b.available(t0), Duration::ZERO);
        // A tenth of the time that passes, and no more than MAX_MARGIN however long.
        assert_eq!(b.available(t0 + us(500)), us(50));
        b.spend(us(80));
        assert_eq!(b.available(t0 + us(500)), Duration::ZERO);
        assert_eq!(b.available(t0 + us(1500)), us(100));
        assert_eq!(b.available(t0 + Duration::from_secs(60)), MAX_MARGIN);
        // A clock read out of order earns nothing and loses nothing.
        assert_eq!(b.available(t0), MAX_MARGIN);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_timer_thread_waits_with_the_least_timer_slack() {
        let slack = std::thread::spawn(tighten_timer_slack)
            .join()
            .expect("thread");
        assert_eq!(slack, Some(1));
    }

    #[test]
    fn dropping_the_timer_ends_its_thread() {
        let timer = PreciseTimer::start().expect("timer thread");
        let (joined, rx) = mpsc::channel();
        // Drop joins the thread: it returns only once the thread has ended.
        std::thread::spawn(move || {
            drop(timer);
            let _ = joined.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the timer thread ended");
    }
}
