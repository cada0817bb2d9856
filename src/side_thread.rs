//! [`Offloaded`]: a value that lives on a thread of its own and is worked on through closures,
//! which that thread runs in the order they were sent. Posting a closure does not wait; asking
//! waits for the answer the closure sends back, and so for every closure sent before it.
//!
//! The offline replay moves the KV router's bookkeeping there (see [`crate::router`]): applying
//! the workers' KV events and recording and freeing the blocks of routed requests then overlap
//! with the workers' passes, and the replay waits only for routing decisions. Both sides spin
//! for a short while before they block ([`Wait::Spin`]), since a blocking wake-up costs tens of
//! microseconds on a small machine and a caught-up thread answers within a few. The replay's
//! metrics collector fills that thread's idle time in small batches ([`Beside`]), or, where the
//! router keeps no bookkeeping, goes to a thread of its own, fed in large batches nobody waits
//! for, so that thread simply blocks between them ([`Wait::Block`]).
//!
//! Determinism does not depend on timing: the value sees the same closures in the same order
//! as it would on the caller's thread. A panic on the thread reaches the caller at its next
//! [`Offloaded::post`] or [`Offloaded::ask`], as if it had happened there (dropping the handle
//! only waits for the thread).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a receiver waits for a message before it blocks.
const SPIN: Duration = Duration::from_micros(200);
/// Checks for a message that spin before the receiver starts yielding.
const SPIN_CHECKS: u32 = 256;

/// How the value's thread waits for its next job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Spin, then yield, then block (for a caller that waits on answers).
    Spin,
    /// Block at once (for jobs that come in batches nobody waits for).
    Block,
}

/// A job for the value's thread.
type Job<T> = Box<dyn FnOnce(&mut T) + Send>;

/// Where a closure run by [`Offloaded::ask`] sends its answer. It may go on working on the
/// value after answering: the caller continues as soon as the answer arrives.
pub(crate) struct Reply<R>(SyncSender<R>);

impl<R> Reply<R> {
    /// Sends the answer (at most once: the reply is consumed).
    pub(crate) fn send(self, answer: R) {
        // The asker waits for this answer; it is only gone if it panicked itself.
        let _ = self.0.send(answer);
    }
}

/// A value of type `T` owned by a thread of its own.
pub(crate) struct Offloaded<T> {
    /// Jobs to the thread; None once dropping.
    jobs: Option<Sender<Job<T>>>,
    /// Set by the last job a dropped handle sends: the thread ends after it even while
    /// [`Beside`] handles keep the queue open.
    stop: Arc<AtomicBool>,
    /// The thread, taken when joined.
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T: Send + 'static> Offloaded<T> {
    /// Moves `value` to a new thread named `name`; the value back if no thread could start.
    pub(crate) fn new(
        name: &str,
        value: T,
        wait: Wait,
    ) -> Result<Offloaded<T>, (std::io::Error, T)> {
        let (jobs, queue) = mpsc::channel::<Job<T>>();
        let (give, take) = mpsc::channel::<T>();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let Ok(mut value) = take.recv() else {
                    return;
                };
                loop {
                    let job = match wait {
                        Wait::Spin => receive(&queue),
                        Wait::Block => queue.recv(),
                    };
                    let Ok(job) = job else {
                        break;
                    };
                    job(&mut value);
                    if stopped.load(Ordering::Relaxed) {
                        break;
                    }
                }
            });
        let thread = match spawned {
            Ok(thread) => thread,
            Err(e) => return Err((e, value)),
        };
        // The thread waits for the value, so it is there to receive it.
        let _ = give.send(value);
        Ok(Offloaded {
            jobs: Some(jobs),
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Runs `job` on the value after every job sent before it, without waiting for it.
    pub(crate) fn post(&self, job: impl FnOnce(&mut T) + Send + 'static) {
        let sent = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(Box::new(job)).is_ok());
        if !sent {
            // The thread is gone: only a panic there ends it while `self` lives.
            self.rethrow();
        }
    }

    /// Runs `job` on the value after every job sent before it and waits for its answer.
    pub(crate) fn ask<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut T, Reply<R>) + Send + 'static,
    ) -> R {
        self.ask_while(job, &mut || false)
    }

    /// [`Offloaded::ask`], doing `work` while the answer is not there: each call does one
    /// short piece of the caller's own work and returns false when none is left (the wait then
    /// goes on as [`Offloaded::ask`]'s). The answer is taken between two pieces.
    pub(crate) fn ask_while<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut T, Reply<R>) + Send + 'static,
        work: &mut dyn FnMut() -> bool,
    ) -> R {
        let (reply, answer) = mpsc::sync_channel(1);
        self.post(move |value| job(value, Reply(reply)));
        match receive_while(&answer, work) {
            Ok(answer) => answer,
            Err(RecvError) => {
                // The job dropped its reply unanswered: it panicked, and so did the thread.
                self.rethrow();
                unreachable!("a job that drops its reply unanswered has panicked")
            }
        }
    }

    /// A handle that posts jobs needing nothing of the value to its thread, where they run in
    /// order with every other job; None once dropping.
    pub(crate) fn beside(&self) -> Option<Beside<T>> {
        self.jobs.clone().map(Beside)
    }

    /// Takes the value back once every job sent before has run (a default value stays).
    pub(crate) fn into_inner(self) -> T
    where
        T: Default,
    {
        self.ask(|value, reply| reply.send(std::mem::take(value)))
    }

    /// Joins the thread and resumes its panic here.
    fn rethrow(&self) {
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(Err(panic)) = thread.map(JoinHandle::join) {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Posts jobs that need nothing of an [`Offloaded`] value to its thread: work that fills the
/// thread's idle time between the value's own jobs.
pub(crate) struct Beside<T>(Sender<Job<T>>);

impl<T: Send + 'static> Beside<T> {
    /// Runs `job` on the thread after every job sent before it; false when the thread is gone
    /// (it panicked: the value's next post or ask says so), and `job` was dropped unrun.
    pub(crate) fn post(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.0.send(Box::new(move |_: &mut T| job())).is_ok()
    }
}

impl<T> std::fmt::Debug for Offloaded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Offloaded<{}>", std::any::type_name::<T>())
    }
}

impl<T> Drop for Offloaded<T> {
    /// Ends the thread once it has run every job sent (jobs a [`Beside`] handle sends later
    /// are dropped unrun), and waits for it (a panic there is not resumed while this thread
    /// may itself be unwinding).
    fn drop(&mut self) {
        if let Some(jobs) = self.jobs.take() {
            let stop = Arc::clone(&self.stop);
            let _ = jobs.send(Box::new(move |_: &mut T| {
                stop.store(true, Ordering::Relaxed)
            }));
        }
        let thread = self
            .thread
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// The next message, doing `work` while there is some and none has come, then as [`receive`].
fn receive_while<M>(queue: &Receiver<M>, work: &mut dyn FnMut() -> bool) -> Result<M, RecvError> {
    loop {
        match queue.try_recv() {
            Ok(message) => return Ok(message),
            Err(TryRecvError::Disconnected) => return Err(RecvError),
            Err(TryRecvError::Empty) => {}
        }
        if !work() {
            return receive(queue);
        }
    }
}

/// The next message, waiting for [`SPIN`] before blocking; an error once every sender is gone.
/// The first [`SPIN_CHECKS`] checks spin on the CPU (the answer of a caught-up thread on another
/// core comes within microseconds); later ones yield, which hands the core to the other side
/// when the two share one (a loaded machine) and returns at once otherwise.
fn receive<M>(queue: &Receiver<M>) -> Result<M, RecvError> {
    let start = Instant::now();
    let mut checks = 0u32;
    loop {
        match queue.try_recv() {
            Ok(message) => return Ok(message),
            Err(TryRecvError::Disconnected) => return Err(RecvError),
            Err(TryRecvError::Empty) => {}
        }
        checks += 1;
        if checks < SPIN_CHECKS {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        if checks % 16 == 0 && start.elapsed() > SPIN {
            return queue.recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ask does the caller's work while the answer is not there (here the job cannot
    /// answer before three pieces of it are done), takes the answer between two pieces, and
    /// waits as a plain ask once the work runs out.
    #[test]
    fn an_ask_does_the_callers_work_while_it_waits() {
        let thread = Offloaded::new("test", 0u32, Wait::Spin)
            .map_err(|(e, _)| e)
            .expect("spawn");
        for (pieces_left, released_after) in [(10u32, 3u32), (3, 3), (0, 0)] {
            let (release, released) = mpsc::channel::<()>();
            let mut release = Some(release);
            let mut open = || {
                if let Some(r) = release.take() {
                    let _ = r.send(());
                }
            };
            if released_after == 0 {
                open();
            }
            let mut done = 0u32;
            let answer = thread.ask_while(
                move |v, reply| {
                    // (Bounded: if the work were never done, the test fails instead of hanging.)
                    let _ = released.recv_timeout(Duration::from_secs(10));
                    *v += 1;
                    reply.send(*v);
                },
                &mut || {
                    if done == pieces_left {
                        return false;
                    }
                    done += 1;
                    if done == released_after {
                        open();
                    }
                    true
                },
            );
            assert!(answer >= 1);
            assert!(
                done >= released_after && done <= pieces_left,
                "{done} pieces done, {pieces_left} there, the answer after {released_after}"
            );
        }
        assert_eq!(thread.ask(|v, reply| reply.send(*v)), 3);
    }

    /// Jobs run in the order they were posted, asks see every job before them, and the value
    /// is dropped with the handle after the last job ran.
    #[test]
    fn jobs_run_in_order_and_asks_wait_for_them() {
        let log = Offloaded::new("test", Vec::new(), Wait::Spin)
            .map_err(|(e, _)| e)
            .expect("spawn");
        for i in 0..1000u32 {
            log.post(move |v: &mut Vec<u32>| v.push(i));
            if i % 100 == 99 {
                let seen = log.ask(|v, reply| reply.send(v.clone()));
                assert_eq!(seen, (0..=i).collect::<Vec<_>>());
            }
        }
        // Work after the answer still happens before the next job.
        let n = log.ask(|v, reply| {
            reply.send(v.len());
            v.push(7);
        });
        assert_eq!(n, 1000);
        assert_eq!(log.ask(|v, reply| reply.send(v.last().copied())), Some(7));
        assert_eq!(log.into_inner().len(), 1001);
    }

    /// Dropping the handle ends the thread after the jobs sent so far, [`Beside`] jobs
    /// included, even while a [`Beside`] handle lives on; its later jobs are refused.
    #[test]
    fn a_dropped_handle_ends_the_thread_while_a_beside_handle_lives() {
        let value = Offloaded::new("test", 0u32, Wait::Spin)
            .map_err(|(e, _)| e)
            .expect("spawn");
        let beside = value.beside().expect("a handle");
        let (ran, seen) = mpsc::channel();
        assert!(beside.post(move || ran.send(()).expect("receiver lives")));
        let (dropped, done) = mpsc::channel();
        std::thread::spawn(move || {
            drop(value);
            let _ = dropped.send(());
        });
        done.recv_timeout(Duration::from_secs(10))
            .expect("the drop returns although a beside handle lives");
        assert_eq!(seen.try_recv(), Ok(()), "the job sent before the drop ran");
        let (ran, seen) = mpsc::channel();
        let _ = beside.post(move || ran.send(()).expect("receiver lives"));
        assert!(seen.recv().is_err(), "a job after the drop never runs");
    }

    /// A job that panics makes the next ask panic with the same message.
    #[test]
    fn a_panic_on_the_thread_reaches_the_asker() {
        let value = Offloaded::new("test", 0u32, Wait::Block)
            .map_err(|(e, _)| e)
            .expect("spawn");
        value.post(|_| panic!("engine defect"));
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            value.ask(|v, reply| reply.send(*v))
        }));
        let panic = caught.expect_err("the panic is resumed");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"engine defect"));
    }
}
