//! Simulated time: integer microseconds, so replays are exact and platform independent.

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point on the simulated clock, in microseconds since the start of the run.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct SimTime(pub u64);

/// A span of simulated time, in microseconds.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct SimDuration(pub u64);

impl SimTime {
    /// The start of every run.
    pub const ZERO: SimTime = SimTime(0);

    /// Microseconds since the start.
    pub fn as_micros(self) -> u64 {
        self.0
    }

    /// Milliseconds since the start, as a float for reports.
    pub(crate) fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Time elapsed since `earlier`, zero when `earlier` is later.
    pub fn saturating_since(self, earlier: SimTime) -> SimDuration {
        SimDuration(self.0.saturating_sub(earlier.0))
    }
}

impl SimDuration {
    /// No time at all.
    pub const ZERO: SimDuration = SimDuration(0);

    /// A duration from (possibly fractional) milliseconds, rounded to the nearest microsecond.
    /// Negative and non-finite inputs become zero.
    pub fn from_millis_f64(ms: f64) -> SimDuration {
        if ms.is_finite() && ms > 0.0 {
            SimDuration((ms * 1000.0).round() as u64)
        } else {
            SimDuration(0)
        }
    }

    /// A duration of whole milliseconds.
    #[cfg(test)]
    pub(crate) fn from_millis(ms: u64) -> SimDuration {
        SimDuration(ms * 1000)
    }

    /// Microseconds.
    pub fn as_micros(self) -> u64 {
        self.0
    }

    /// Milliseconds, as a float for reports.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1000.0
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
    fn millis_round_to_the_nearest_microsecond() {
        assert_eq!(SimDuration::from_millis_f64(32.1004), SimDuration(32_100));
        assert_eq!(SimDuration::from_millis_f64(32.1006), SimDuration(32_101));
        assert_eq!(SimDuration::from_millis_f64(-1.0), SimDuration::ZERO);
        assert_eq!(SimDuration::from_millis_f64(f64::NAN), SimDuration::ZERO);
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = SimTime(10) + SimDuration(5);
        assert_eq!(t, SimTime(15));
        assert_eq!(SimTime(3) - SimTime(10), SimDuration::ZERO);
        assert_eq!(SimTime(u64::MAX) + SimDuration(1), SimTime(u64::MAX));
    }
}
