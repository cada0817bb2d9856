//! [`SimClock`]: the live mapping between simulated time and the wall clock, shared by the
//! driver and every handler so that the engine's stamps and the driver's schedule agree.

use std::time::Duration;

use servesim::time::{SimDuration, SimTime};
use tokio::time::Instant;

/// The live mapping between simulated time and the wall clock: simulated nanoseconds since
/// the driver started are wall-clock nanoseconds since its `epoch`, so an instant is
/// `epoch + sim_time / speedup` with a speed-up of 1 here, because `--speedup-ratio` already
/// divides every duration inside the engine's latency model. Copied into every handler so that
/// stamps and the driver's schedule agree.
#[derive(Clone, Copy, Debug)]
pub struct SimClock {
    /// Wall-clock instant of `SimTime::ZERO` (tokio's clock, so tests can pause it).
    epoch: Instant,
    /// The same instant in Unix microseconds, for the `*_ms` instants of responses.
    epoch_unix_us: u64,
}

impl SimClock {
    /// A clock whose `SimTime::ZERO` is now.
    pub fn start() -> SimClock {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        SimClock {
            epoch: Instant::now(),
            epoch_unix_us: u64::try_from(unix.as_micros()).unwrap_or(u64::MAX),
        }
    }

    /// The simulated time of the wall-clock now.
    pub fn now(&self) -> SimTime {
        SimTime::ZERO + SimDuration::from(self.epoch.elapsed())
    }

    /// The wall-clock instant of simulated time `t`; `None` beyond the clock's range (a time
    /// that is never reached).
    pub fn instant(&self, t: SimTime) -> Option<Instant> {
        self.epoch.checked_add(Duration::from_nanos(t.as_nanos()))
    }

    /// Simulated time `t` as Unix milliseconds.
    pub fn unix_ms(&self, t: SimTime) -> f64 {
        (self.epoch_unix_us as f64 + t.as_nanos() as f64 / 1e3) / 1e3
    }
}
