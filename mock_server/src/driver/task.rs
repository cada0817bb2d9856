//! The driver task: sleeps until the engine's next event (on the precise timer thread, raced
//! by tokio's timer) or a handle's nudge, advances the engine through what is due, and sends
//! the outbox once the lock is released. It ends when every handle is gone, and however it
//! ends, the requests in flight end with it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::state::{deliver, Driver, COALESCE};
use crate::timer::PreciseTimer;

/// The driver task: advances the engine through every event that is due, sleeps until the
/// next one or until a handle nudges it, and ends when every handle is gone.
pub(super) async fn run(driver: Arc<Mutex<Driver>>, mut woken: mpsc::UnboundedReceiver<()>) {
    // Ends every request in flight however the task ends (a panic of the engine included).
    let _stop = StopOnExit(Arc::clone(&driver));
    // Wakes the task on time (tokio's timer alone is up to a millisecond late); `None` if its
    // thread could not be started, and tokio's timer is used alone. Joined when the task ends.
    let timer = PreciseTimer::start()
        .inspect_err(|e| {
            eprintln!(
                "mockserve: warning: no precise timer thread ({e}): token times follow \
                 tokio's 1 ms timer"
            );
        })
        .ok();
    // The wake-up for the engine's next event, kept across nudges while that event stays the
    // same (most submissions do not move it), so the timer thread is asked once per event.
    let mut wake: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(std::future::pending());
    let mut wake_at: Option<Instant> = None;
    loop {
        let (deadline, outbox) = {
            let Ok(mut d) = driver.lock() else {
                // The engine panicked under the lock.
                return;
            };
            if d.stopped {
                // The engine panicked in a handler's advance.
                return;
            }
            let next = d.advance_due(Instant::now() + COALESCE);
            // Changes from now on nudge the task if they need an earlier wake-up than this.
            d.planned = next;
            d.nudged = false;
            // A time beyond the clock's range (a pass of astronomic length) is never reached.
            let deadline = next.and_then(|t| d.clock.instant(t));
            (deadline, std::mem::take(&mut d.outbox))
        };
        let gone = deliver(outbox);
        if !gone.is_empty() {
            let Ok(mut d) = driver.lock() else {
                return;
            };
            for id in gone {
                d.cancel(id);
            }
            // Their KV is free: the schedule may have changed.
            continue;
        }
        if deadline != wake_at {
            wake = sleep_until(timer.as_ref(), deadline);
            wake_at = deadline;
        }
        tokio::select! {
            biased;
            () = &mut wake, if wake_at.is_some() => wake_at = None,
            nudge = woken.recv() => match nudge {
                // Every nudge sent so far is answered by this one planning.
                Some(()) => while woken.try_recv().is_ok() {},
                None => return,
            },
        }
    }
}

/// Ends every request in flight when the driver task ends, whichever way: their event channels
/// close (their handlers answer with an error) and later calls are refused.
struct StopOnExit(Arc<Mutex<Driver>>);

impl Drop for StopOnExit {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .stop();
    }
}

/// A sleep until `deadline` (forever if `None`), precise with `timer`.
fn sleep_until(
    timer: Option<&PreciseTimer>,
    deadline: Option<Instant>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match (timer, deadline) {
        (Some(timer), Some(d)) => Box::pin(timer.sleep_until(d)),
        (None, Some(d)) => Box::pin(tokio::time::sleep_until(d)),
        (_, None) => Box::pin(std::future::pending()),
    }
}
