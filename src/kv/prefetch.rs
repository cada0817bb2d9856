//! [`prefetch`]: asks the CPU to bring a value's cache line in without waiting for it.
//!
//! The tables keyed by block hash are probed at random places, and on large tables nearly
//! every probe misses the caches. A loop over a request's blocks first names the slots it is
//! about to probe, so that their misses overlap instead of following one another. A prefetch
//! retires at once, where a plain load that misses holds up every instruction behind it once
//! the core's reorder window fills, so the loop's own work goes on while the lines arrive.

/// Starts loading the cache line that holds `value`, for a read soon after.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
pub(crate) fn prefetch<T: Copy>(value: &T) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: a prefetch is a hint that never faults and changes nothing the program can
    // observe; `value` is a live reference in any case. SSE is part of the x86_64 baseline.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast::<i8>()) }
}

/// Starts loading the cache line that holds `value`, for a read soon after (a plain load
/// where no prefetch instruction is at hand: independent loads still overlap their misses).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn prefetch<T: Copy>(value: &T) {
    std::hint::black_box(*value);
}
