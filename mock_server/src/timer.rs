//! Precise wake-ups for the live driver: [`PreciseTimer`] wakes a tokio task within tens of
//! microseconds of a deadline, where tokio's own timer wheel rounds every sleep up to its next
//! millisecond tick.
//!
//! A dedicated OS thread serves one wait at a time. It blocks on a channel with a timeout (a
//! futex wait) until [`SPIN`] before the deadline, then spins the last stretch and wakes the
//! waiting task through a `oneshot`. On Linux the thread sets its own timer slack to 1 ns
//! first: with the default 50 µs the kernel may end every timed wait up to that much late,
//! which on a small VM made the thread's wake-ups about 50 µs later at the median, spin or
//! not (a wait that ends late starts its spin after the deadline). It spins only
//! while a wait is pending, for at most [`SPIN`] once per [`SPIN_EVERY`] (a busy server keeps
//! its CPU for delivering tokens), so an idle server burns no CPU; it ends when its
//! [`PreciseTimer`] is dropped.
//!
//! [`PreciseTimer::sleep_until`] races that thread against tokio's own timer and only ever
//! returns once tokio's clock has reached the deadline. Under tokio's paused test clock the
//! tokio timer is therefore the one that fires (the thread's wake-up comes too early by that
//! clock and is ignored), so code that sleeps this way stays testable with
//! `#[tokio::test(start_paused = true)]`.

use std::future::Future;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant as StdInstant};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long before a deadline the timer thread stops blocking and spins: more than a blocking
/// wait ends late by (the wake-up of a sleeping thread, tens of microseconds on a small VM).
pub const SPIN: Duration = Duration::from_micros(80);

/// The timer spins at most once per this period (at most [`SPIN`] of CPU per period): when
/// deadlines come closer together than this, the server is busy, spinning would take the CPU
/// from the tasks that deliver the tokens, and the blocking wait alone is used (a steady
/// lateness of some tens of microseconds, which shifts the tokens but keeps their gaps).
pub const SPIN_EVERY: Duration = Duration::from_millis(1);

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
    // When the thread last woke a waiter (spinning or not).
    let mut fired_at: Option<StdInstant> = None;
    loop {
        let Some(wait) = pending.take() else {
            match waits.recv() {
                Ok(wait) => pending = Some(wait),
                Err(_) => return,
            }
            continue;
        };
        if wait.fire.is_closed() {
            // The waiter moved on.
            continue;
        }
        let block = wait
            .deadline
            .saturating_duration_since(StdInstant::now())
            .saturating_sub(if fired_at.is_none_or(|t| t.elapsed() >= SPIN_EVERY) {
                SPIN
            } else {
                Duration::ZERO
            });
        if !block.is_zero() {
            match waits.recv_timeout(block) {
                // A newer wait replaces this one.
                Ok(newer) => pending = Some(newer),
                Err(RecvTimeoutError::Timeout) => pending = Some(wait),
                Err(RecvTimeoutError::Disconnected) => return,
            }
            continue;
        }
        while StdInstant::now() < wait.deadline {
            std::hint::spin_loop();
        }
        fired_at = Some(StdInstant::now());
        // The waiter may have moved on meanwhile; nothing to do then.
        let _ = wait.fire.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time: the thread's clock cannot be paused.
    #[tokio::test]
    async fn wakes_at_the_deadline_not_before() {
        let timer = PreciseTimer::start().expect("timer thread");
        // The other tests of this binary run meanwhile and may take the CPU for a while: a few
        // tries, of which one must pass (tokio's timer alone fails every one).
        let mut tries = Vec::new();
        for _ in 0..10 {
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
                return;
            }
            tries.push(late);
        }
        panic!("late in every try: {tries:?}");
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
