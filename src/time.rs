//! Simulated time: one integer clock in nanoseconds, [`SimTime`], that orders every event of
//! every replay and of the live engine, so replays are exact and platform independent.
//!
//! Nanoseconds are fine enough for every input: a trace's millisecond timestamps and delays
//! (three decimals at most in every format) divided by an arrival speed-up of 2, 4 or 5 are
//! whole nanoseconds, so they convert exactly ([`SimDuration::from_millis_f64`]), and a latency
//! model's pass time in fractional milliseconds is rounded to the nanosecond once, where the
//! scheduler plans the pass. A `u64` of nanoseconds lasts 584 years of simulated time.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// Nanoseconds in a microsecond.
const NS_PER_US: u64 = 1_000;
/// Nanoseconds in a millisecond.
const NS_PER_MS: u64 = 1_000_000;

/// A point on the simulated clock, in nanoseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(u64);

/// A span of simulated time, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimDuration(u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);

    /// The instant `ns` nanoseconds after the start.
    pub const fn from_nanos(ns: u64) -> SimTime {
        SimTime(ns)
    }

    /// The instant `us` microseconds after the start (saturating).
    pub const fn from_micros(us: u64) -> SimTime {
        SimTime(us.saturating_mul(NS_PER_US))
    }

    /// The instant `ms` (possibly fractional) milliseconds after the start, to the nearest
    /// nanosecond ([`SimDuration::from_millis_f64`]).
    pub fn from_millis_f64(ms: f64) -> SimTime {
        SimTime::ZERO + SimDuration::from_millis_f64(ms)
    }

    /// Nanoseconds since the start.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole microseconds since the start (rounded down).
    pub const fn as_micros(self) -> u64 {
        self.0 / NS_PER_US
    }

    /// Milliseconds since the start, as a float for reports.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / NS_PER_MS as f64
    }

    /// Time elapsed since `earlier`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);

    /// A span of `ns` nanoseconds.
    pub const fn from_nanos(ns: u64) -> SimDuration {
        SimDuration(ns)
    }

    /// A span of `us` whole microseconds (saturating).
    pub const fn from_micros(us: u64) -> SimDuration {
        SimDuration(us.saturating_mul(NS_PER_US))
    }

    /// A span of `ms` whole milliseconds (saturating).
    pub const fn from_millis(ms: u64) -> SimDuration {
        SimDuration(ms.saturating_mul(NS_PER_MS))
    }

    /// A span of `ms` (possibly fractional) milliseconds, rounded to the nearest nanosecond
    /// (halves away from zero): the one place where a float time meets the clock. Negative and
    /// non-finite inputs become zero; spans beyond the clock's range saturate.
    pub fn from_millis_f64(ms: f64) -> SimDuration {
        SimDuration::from_nanos_f64(ms * NS_PER_MS as f64)
    }

    /// A span of `us` (possibly fractional) microseconds, rounded to the nearest nanosecond, as
    /// [`SimDuration::from_millis_f64`].
    pub fn from_micros_f64(us: f64) -> SimDuration {
        SimDuration::from_nanos_f64(us * NS_PER_US as f64)
    }

    /// `ns` rounded to a whole nanosecond; negative and non-finite become zero, and too large
    /// saturates (an `as` cast does both).
    fn from_nanos_f64(ns: f64) -> SimDuration {
        if ns.is_finite() && ns > 0.0 {
            SimDuration(ns.round() as u64)
        } else {
            SimDuration(0)
        }
    }

    /// Nanoseconds.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Whole microseconds (rounded down).
    pub const fn as_micros(self) -> u64 {
        self.0 / NS_PER_US
    }

    /// Milliseconds, as a float for reports.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / NS_PER_MS as f64
    }
}

impl From<std::time::Duration> for SimDuration {
    /// A wall-clock span on the simulated clock (saturating).
    fn from(d: std::time::Duration) -> SimDuration {
        SimDuration(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
    }
}

impl From<SimDuration> for std::time::Duration {
    fn from(d: SimDuration) -> std::time::Duration {
        std::time::Duration::from_nanos(d.0)
    }
}

impl Add<SimDuration> for SimTime {
    type Output = SimTime;
    fn add(self, rhs: SimDuration) -> SimTime {
        SimTime(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign<SimDuration> for SimTime {
    fn add_assign(&mut self, rhs: SimDuration) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Add for SimDuration {
    type Output = SimDuration;
    fn add(self, rhs: SimDuration) -> SimDuration {
        SimDuration(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for SimDuration {
    fn add_assign(&mut self, rhs: SimDuration) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}

impl Sub for SimTime {
    type Output = SimDuration;
    fn sub(self, rhs: SimTime) -> SimDuration {
        self.saturating_since(rhs)
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} ms", self.as_millis_f64())
    }
}

impl fmt::Display for SimDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3} ms", self.as_millis_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_to_the_nearest_nanosecond() {
        assert_eq!(
            SimDuration::from_millis_f64(32.100_000_4),
            SimDuration::from_nanos(32_100_000)
        );
        assert_eq!(
            SimDuration::from_millis_f64(32.100_000_6),
            SimDuration::from_nanos(32_100_001)
        );
        assert_eq!(SimDuration::from_millis_f64(-1.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_millis_f64(f64::NAN), SimDuration::ZERO);
        assert_eq!(
            SimDuration::from_millis_f64(f64::INFINITY),
            SimDuration::ZERO
        );
        assert_eq!(
            SimDuration::from_millis_f64(1e300),
            SimDuration::from_nanos(u64::MAX)
        );
        assert_eq!(
            SimDuration::from_micros_f64(2.4996),
            SimDuration::from_nanos(2_500)
        );
    }

    /// A trace's millisecond delays with three decimals, halved, thirded or quartered by an
    /// arrival speed-up, land on whole nanoseconds where the quotient has one: a 305.851 ms
    /// tool wait at speed-up 2 is 152,925,500 ns, not a rounded microsecond.
    #[test]
    fn sped_up_trace_times_are_exact_nanoseconds() {
        assert_eq!(
            SimDuration::from_millis_f64(305.851 / 2.0).as_nanos(),
            152_925_500
        );
        assert_eq!(SimDuration::from_millis_f64(0.001 / 4.0).as_nanos(), 250);
        for ms in [1, 7, 999, 86_400_000u64] {
            for ratio in [2.0, 4.0, 5.0, 8.0] {
                let exact = ms * NS_PER_MS / ratio as u64;
                assert_eq!(
                    SimDuration::from_millis_f64(ms as f64 / ratio).as_nanos(),
                    exact,
                    "{ms} ms / {ratio}"
                );
            }
        }
    }

    #[test]
    fn units_convert() {
        let t = SimTime::from_micros(1_500);
        assert_eq!(t.as_nanos(), 1_500_000);
        assert_eq!(t.as_micros(), 1_500);
        assert_eq!(t.as_millis_f64(), 1.5);
        assert_eq!(SimTime::from_nanos(1_999).as_micros(), 1, "rounded down");
        assert_eq!(SimDuration::from_millis(3), SimDuration::from_micros(3_000));
        assert_eq!(
            SimDuration::from(std::time::Duration::from_nanos(12_345)),
            SimDuration::from_nanos(12_345)
        );
        assert_eq!(format!("{}", SimTime::from_micros(32_100)), "32.100 ms");
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = SimTime::from_nanos(10) + SimDuration::from_nanos(5);
        assert_eq!(t, SimTime::from_nanos(15));
        assert_eq!(
            SimTime::from_nanos(3) - SimTime::from_nanos(10),
            SimDuration::ZERO
        );
        assert_eq!(
            SimTime::from_nanos(u64::MAX) + SimDuration::from_nanos(1),
            SimTime::from_nanos(u64::MAX)
        );
        assert_eq!(
            SimTime::from_micros(u64::MAX),
            SimTime::from_nanos(u64::MAX)
        );
    }
}
