//! The driver's stall detector: "no progress while work is pending", counted as advances in a
//! row that emit nothing and do not move the engine's next event past the time advanced to.

use servesim::time::SimTime;

/// Advances in a row that emit nothing and leave the next event no later than the time just
/// advanced to, after which the driver declares the engine stalled. A healthy engine never
/// repeats such an advance more than a few times (zero-time transfers and hand-offs).
pub(crate) const STALL_ROUNDS: u32 = 64;

/// The driver's stall detector: counts advances in a row that emitted nothing and left the
/// engine's next event no later than the time advanced to.
#[derive(Debug, Default)]
pub(super) struct Watchdog {
    idle_rounds: u32,
}

impl Watchdog {
    /// Records one advance to `now` that emitted `outputs` outputs, after which the engine next
    /// needs waking at `next`. True when the engine is stalled ([`STALL_ROUNDS`] such advances
    /// in a row); the count then starts again.
    pub(super) fn after_advance(
        &mut self,
        outputs: usize,
        next: Option<SimTime>,
        now: SimTime,
    ) -> bool {
        let moved = next.is_none_or(|t| t > now);
        if outputs > 0 || moved {
            self.idle_rounds = 0;
            return false;
        }
        self.idle_rounds += 1;
        if self.idle_rounds >= STALL_ROUNDS {
            self.idle_rounds = 0;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fires_after_stall_rounds_without_progress() {
        let mut w = Watchdog::default();
        let t = SimTime::from_micros(100);
        for _ in 1..STALL_ROUNDS {
            assert!(!w.after_advance(0, Some(t), t));
        }
        // Progress of any kind resets the count: an output, or a later next event.
        assert!(!w.after_advance(1, Some(t), t));
        for _ in 1..STALL_ROUNDS {
            assert!(!w.after_advance(0, Some(t), t));
        }
        assert!(!w.after_advance(0, Some(SimTime::from_micros(101)), t));
        for _ in 1..STALL_ROUNDS {
            assert!(!w.after_advance(0, Some(SimTime::from_micros(99)), t));
        }
        assert!(
            w.after_advance(0, Some(SimTime::from_micros(99)), t),
            "stalled"
        );
        assert!(!w.after_advance(0, Some(t), t), "counting starts again");
    }
}
