//! The server-wide bound on the memory of the work in flight ([`InflightBudget`]): each
//! request reserves what it may cost (its body while it is read and parsed, then its prompts,
//! planned answers and log-probabilities until its answer is sent), and a request that does not
//! fit is refused at once (`503 server_overloaded`, `Retry-After`) rather than queued, so that
//! no mix of requests each within every per-request cap can take the server out of memory.
//!
//! One budget per engine: `serve`'s endpoint and every endpoint of a fleet share it. A
//! reservation is cut to the whole bound, so a request larger than the bound still runs when
//! nothing else is in flight.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The estimated bytes of the requests in flight and their bound (`--max-inflight-bytes`).
#[derive(Debug)]
pub(crate) struct InflightBudget {
    /// The bound; set from the server's configuration when an endpoint is assembled.
    limit: AtomicU64,
    /// Bytes reserved by the [`Reservation`]s alive.
    used: AtomicU64,
}

/// Bytes of a request's work held in an [`InflightBudget`] until dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<InflightBudget>,
    bytes: u64,
}

impl InflightBudget {
    /// An empty budget of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<InflightBudget> {
        Arc::new(InflightBudget {
            limit: AtomicU64::new(limit),
            used: AtomicU64::new(0),
        })
    }

    /// Sets the bound (reservations alive keep their bytes).
    pub(crate) fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// The bound.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes reserved now.
    pub(crate) fn in_use(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Adds `delta` bytes when they fit under the bound.
    fn try_add(&self, delta: u64) -> bool {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(delta).filter(|&total| total <= limit)
            })
            .is_ok()
    }

    /// A reservation of `bytes` (cut to the bound), or `None` when it does not fit beside the
    /// reservations alive.
    pub(crate) fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        let bytes = bytes.min(self.limit());
        self.try_add(bytes).then(|| Reservation {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

impl Reservation {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The bound of its budget.
    pub(crate) fn limit(&self) -> u64 {
        self.budget.limit()
    }

    /// Holds `bytes` in all (cut to the bound): grows when they fit beside the other
    /// reservations (false, holding what it held, when they do not) and shrinks at once.
    pub(crate) fn try_resize(&mut self, bytes: u64) -> bool {
        let bytes = bytes.min(self.budget.limit());
        if bytes <= self.bytes {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            self.bytes = bytes;
            return true;
        }
        if !self.budget.try_add(bytes - self.bytes) {
            return false;
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fit_under_the_bound_and_give_their_bytes_back() {
        let budget = InflightBudget::new(100);
        let a = budget.try_reserve(60).expect("fits");
        assert!(budget.try_reserve(41).is_none());
        let mut b = budget.try_reserve(40).expect("fits");
        assert_eq!(budget.in_use(), 100);
        assert!(!b.try_resize(41));
        assert_eq!(b.bytes(), 40);
        assert!(b.try_resize(10));
        assert_eq!(budget.in_use(), 70);
        drop(a);
        assert!(b.try_resize(1_000), "cut to the bound, alone");
        assert_eq!((b.bytes(), budget.in_use()), (100, 100));
        drop(b);
        assert_eq!(budget.in_use(), 0);
        // Larger than the bound: runs alone.
        let big = budget.try_reserve(u64::MAX).expect("alone");
        assert_eq!(big.bytes(), 100);
        assert!(budget.try_reserve(1).is_none());
        drop(big);
        budget.set_limit(10);
        assert_eq!(budget.try_reserve(50).map(|r| r.bytes()), Some(10));
    }
}
