//! Simulated time: integer microseconds, so replays are exact and platform independent; and
//! [`ExactTime`], the unrounded instant by which the agentic graph replay orders its events.

use std::cmp::Ordering;
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

/// A point on the simulated clock before rounding to the microsecond, in (fractional)
/// microseconds, finite and not negative.
///
/// The agentic graph replay orders its events by it: a delay or a floor divided by a speed-up
/// falls between whole microseconds, and so does the end of a pass (its latency model gives
/// fractions). Rounding both first would put an arrival and a pass end that fall in the same
/// microsecond in the wrong order, and add up each dependency's rounding along a chain. The
/// times the engine records and reports stay [`SimTime`] ([`ExactTime::round`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct ExactTime(f64);

impl ExactTime {
    /// The start of every run.
    pub const ZERO: ExactTime = ExactTime(0.0);

    /// An instant `us` microseconds after the start; negative inputs and NaN become zero,
    /// infinity the largest finite value.
    pub fn from_micros_f64(us: f64) -> ExactTime {
        if us > 0.0 {
            ExactTime(us.min(f64::MAX))
        } else {
            ExactTime::ZERO
        }
    }

    /// Microseconds since the start, unrounded.
    pub fn as_micros_f64(self) -> f64 {
        self.0
    }

    /// The instant `ms` (possibly fractional) milliseconds later; negative and non-finite
    /// spans count as zero.
    pub fn plus_millis_f64(self, ms: f64) -> ExactTime {
        if ms.is_finite() && ms > 0.0 {
            ExactTime::from_micros_f64(self.0 + ms * 1000.0)
        } else {
            self
        }
    }

    /// The nearest whole microsecond (halves away from zero, as [`SimDuration::from_millis_f64`]
    /// and the end of a pass round).
    pub fn round(self) -> SimTime {
        SimTime(self.0.round() as u64)
    }

    /// The last whole microsecond at or before this instant: every integer timer due by it is
    /// due by that microsecond.
    pub fn floor(self) -> SimTime {
        SimTime(self.0.floor() as u64)
    }
}

impl From<SimTime> for ExactTime {
    fn from(t: SimTime) -> ExactTime {
        ExactTime(t.0 as f64)
    }
}

// Total order: the value is never NaN, so `total_cmp` is the numeric order.
impl PartialEq for ExactTime {
    fn eq(&self, other: &ExactTime) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for ExactTime {}

impl PartialOrd for ExactTime {
    fn partial_cmp(&self, other: &ExactTime) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ExactTime {
    fn cmp(&self, other: &ExactTime) -> Ordering {
        self.0.total_cmp(&other.0)
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
    fn exact_times_order_below_the_microsecond_and_round_to_it() {
        let arrival = ExactTime::from(SimTime(100)).plus_millis_f64(0.0003);
        let pass_end = ExactTime::from_micros_f64(100.4);
        assert!(arrival < pass_end);
        assert_eq!(
            (arrival.round(), pass_end.round()),
            (SimTime(100), SimTime(100))
        );
        assert_eq!(ExactTime::from_micros_f64(100.5).round(), SimTime(101));
        assert_eq!(ExactTime::from_micros_f64(100.9).floor(), SimTime(100));
        assert_eq!(ExactTime::from_micros_f64(-3.0), ExactTime::ZERO);
        assert_eq!(ExactTime::from_micros_f64(f64::NAN), ExactTime::ZERO);
        assert_eq!(arrival.plus_millis_f64(f64::INFINITY), arrival);
        assert_eq!(
            ExactTime::from_micros_f64(f64::MAX)
                .plus_millis_f64(1e300)
                .round(),
            SimTime(u64::MAX)
        );
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = SimTime(10) + SimDuration(5);
        assert_eq!(t, SimTime(15));
        assert_eq!(SimTime(3) - SimTime(10), SimDuration::ZERO);
        assert_eq!(SimTime(u64::MAX) + SimDuration(1), SimTime(u64::MAX));
    }
}
