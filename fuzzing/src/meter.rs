//! Heap accounting for the cost budget: the process's global allocator (over [`System`]) charges
//! every allocation and free to the [`Meter`] of the thread that makes it.
//!
//! A thread is charged to a meter with [`charge_thread`] (the HTTP targets charge their own
//! runtime's threads and the thread that sends the request), so two targets checked at once on
//! other threads, or the test harness around them, never show in each other's figures. Memory
//! allocated on a charged thread and freed on another one stays counted (the figure errs high),
//! memory freed the other way round is subtracted (it errs low by what such threads hand over,
//! which in the server is little).
//!
//! An armed meter also has a ceiling: an input whose heap grows past it would otherwise take
//! the machine (a value built without bound is not interruptible), so the allocator writes why
//! to stderr and aborts the process instead.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Bytes held by the threads charged to one account, and the most they held.
#[derive(Debug)]
pub struct Meter {
    /// Named in the abort message.
    name: &'static str,
    /// Bytes allocated minus bytes freed by the charged threads since the process started; it
    /// can fall below zero when they free what other threads allocated.
    held: AtomicIsize,
    /// The most `held` reached since the last [`Meter::arm`].
    peak: AtomicIsize,
    /// `held` at the last [`Meter::arm`]: growth is measured from here.
    base: AtomicIsize,
    /// Growth past `base` that aborts the process; `isize::MAX` while disarmed.
    ceiling: AtomicIsize,
    /// The input being measured, shown when the ceiling aborts the process. `std` mutex: the
    /// abort only tries it, and [`Meter::arm`] holds it for a copy.
    input: Mutex<Vec<u8>>,
}

/// Bytes of the input written out when the ceiling aborts the process.
const SHOWN_INPUT_BYTES: usize = 64 << 10;

impl Meter {
    /// A disarmed meter, for a `static`.
    pub const fn new(name: &'static str) -> Meter {
        Meter {
            name,
            held: AtomicIsize::new(0),
            peak: AtomicIsize::new(0),
            base: AtomicIsize::new(0),
            ceiling: AtomicIsize::new(isize::MAX),
            input: Mutex::new(Vec::new()),
        }
    }

    /// Starts measuring what `input` costs: growth counts from the bytes held now, and growth
    /// past `ceiling_bytes` aborts the process, writing (the start of) `input` to stderr.
    pub fn arm(&self, ceiling_bytes: usize, input: &[u8]) {
        let kept = input[..input.len().min(SHOWN_INPUT_BYTES)].to_vec();
        let replaced = std::mem::replace(
            &mut *self.input.lock().unwrap_or_else(PoisonError::into_inner),
            kept,
        );
        drop(replaced);
        let held = self.held.load(Ordering::Relaxed);
        self.base.store(held, Ordering::Relaxed);
        self.peak.store(held, Ordering::Relaxed);
        let ceiling = isize::try_from(ceiling_bytes).unwrap_or(isize::MAX);
        self.ceiling.store(ceiling, Ordering::Relaxed);
    }

    /// Ends a measurement: the most the charged threads held above the start, in bytes.
    pub fn disarm(&self) -> usize {
        self.ceiling.store(isize::MAX, Ordering::Relaxed);
        self.peak_growth()
    }

    /// The most the charged threads held above the start of the measurement so far, in bytes.
    pub fn peak_growth(&self) -> usize {
        let growth = self
            .peak
            .load(Ordering::Relaxed)
            .saturating_sub(self.base.load(Ordering::Relaxed));
        usize::try_from(growth).unwrap_or(0)
    }

    fn charge(&self, bytes: isize) {
        let held = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if bytes > 0 {
            self.peak.fetch_max(held, Ordering::Relaxed);
            let growth = held.saturating_sub(self.base.load(Ordering::Relaxed));
            if growth > self.ceiling.load(Ordering::Relaxed) {
                self.abort(growth);
            }
        }
    }

    /// Says why on stderr without allocating, then aborts.
    fn abort(&self, growth: isize) -> ! {
        let ceiling = self.ceiling.swap(isize::MAX, Ordering::Relaxed);
        let mut stderr = std::io::stderr();
        // Nothing here allocates: the digits go through a stack buffer.
        let _ = stderr.write_all(b"\nservesim_fuzzing: the input checked by `");
        let _ = stderr.write_all(self.name.as_bytes());
        let _ = stderr.write_all(b"` made the heap grow by ");
        let _ = stderr.write_all(digits(growth.unsigned_abs(), &mut [0; 20]));
        let _ = stderr.write_all(b" bytes, past the hard ceiling of ");
        let _ = stderr.write_all(digits(ceiling.unsigned_abs(), &mut [0; 20]));
        let _ = stderr.write_all(
            b" bytes (far over its cost budget); aborting before it takes the machine's memory\n",
        );
        // `try_lock`: the thread that holds the lock may be the one allocating.
        if let Ok(input) = self.input.try_lock() {
            let _ = stderr.write_all(b"the input's first ");
            let _ = stderr.write_all(digits(input.len(), &mut [0; 20]));
            let _ = stderr.write_all(b" bytes follow between the lines of dashes:\n-----\n");
            let _ = stderr.write_all(&input);
            let _ = stderr.write_all(b"\n-----\n");
        }
        std::process::abort()
    }
}

/// The decimal digits of `n`, written at the end of `buffer`.
fn digits(mut n: usize, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buffer[at..];
        }
    }
}

thread_local! {
    /// The meter this thread's allocations go to. A `const` initialiser and no destructor: the
    /// allocator may read it at any point of the thread's life without allocating.
    static CHARGED: Cell<Option<&'static Meter>> = const { Cell::new(None) };
}

/// Charges this thread's allocations and frees to `meter` from now on (to none with `None`);
/// returns the meter it was charged to before.
pub fn charge_thread(meter: Option<&'static Meter>) -> Option<&'static Meter> {
    CHARGED.with(|charged| charged.replace(meter))
}

fn charge(bytes: isize) {
    if let Ok(Some(meter)) = CHARGED.try_with(Cell::get) {
        meter.charge(bytes);
    }
}

/// [`System`], counting for the [`Meter`] of the allocating thread.
struct CountingAllocator;

// The third exception to the workspace's `unsafe_code = "deny"`: a global allocator is an
// `unsafe` trait by definition. Every method forwards to `System` with the caller's own
// arguments, so the allocator's contract is `System`'s; the accounting around it is safe code.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which is `System`'s.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            charge(layout.size() as isize);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            charge(layout.size() as isize);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        charge(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            charge(new_size as isize - layout.size() as isize);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_meter_sees_its_threads_peak_and_nothing_else() {
        static METER: Meter = Meter::new("test");
        let outside = std::thread::spawn(|| {
            charge_thread(None);
            vec![0u8; 64 << 20]
        });
        let previous = charge_thread(Some(&METER));
        METER.arm(usize::MAX, b"input");
        let big = vec![1u8; 8 << 20];
        drop(big);
        let small = vec![2u8; 1 << 20];
        let charged = std::thread::spawn(|| {
            charge_thread(Some(&METER));
            vec![3u8; 2 << 20].len()
        });
        assert_eq!(charged.join().expect("joined"), 2 << 20);
        let peak = METER.disarm();
        charge_thread(previous);
        drop(small);
        assert_eq!(outside.join().expect("joined").len(), 64 << 20);
        assert!((8 << 20..9 << 20).contains(&peak), "peak {peak}");
    }

    /// Set in the child process of [`growth_past_the_ceiling_aborts_naming_the_input`].
    const CEILING_CHILD: &str = "SERVESIM_METER_CEILING_CHILD";

    #[test]
    fn growth_past_the_ceiling_aborts_naming_the_input() {
        let exe = std::env::current_exe().expect("the test binary");
        let output = std::process::Command::new(exe)
            .args(["--exact", "meter::tests::past_the_ceiling", "--nocapture"])
            .env(CEILING_CHILD, "1")
            .output()
            .expect("the child runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "the child passed:\n{stderr}");
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(output.status.signal(), Some(6), "not SIGABRT:\n{stderr}");
        }
        assert!(
            stderr.contains("checked by `ceiling` made the heap grow by ")
                && stderr.contains("past the hard ceiling of 1048576 bytes")
                && stderr.contains(
                    "first 9 bytes follow between the lines of dashes:\n-----\nan input\n"
                ),
            "{stderr}"
        );
    }

    /// The child of [`growth_past_the_ceiling_aborts_naming_the_input`]; does nothing in a
    /// plain run.
    #[test]
    fn past_the_ceiling() {
        static METER: Meter = Meter::new("ceiling");
        if std::env::var_os(CEILING_CHILD).is_none() {
            return;
        }
        charge_thread(Some(&METER));
        METER.arm(1 << 20, b"an input\n");
        let held = vec![7u8; 4 << 20];
        panic!(
            "{} bytes held past the ceiling without an abort",
            held.len()
        );
    }

    #[test]
    fn digits_are_decimal() {
        assert_eq!(digits(0, &mut [0; 20]), b"0");
        assert_eq!(digits(1_340_000_007, &mut [0; 20]), b"1340000007");
        assert_eq!(digits(usize::MAX, &mut [0; 20]), b"18446744073709551615");
    }
}
