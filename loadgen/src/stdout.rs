//! Standard output for every command: [`print()`] (and the [`out!`] / [`outln!`] macros over
//! it) is the one way `loadgen` writes to its console.
//!
//! `print!` panics when stdout is a pipe whose reader went away (`loadgen bench … | head -1`),
//! which would end the run before its `--report-json` and other files are written. Here a closed
//! pipe (`EPIPE`) is not an error: the first one closes the console for the rest of the
//! process, later output is dropped without a write, and the run carries on to write every file
//! and exit with its own status. Any other write error closes the console the same way, after
//! one line on stderr saying why. Mirrors `mock_server/src/stdout.rs`.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write failed: the console is gone for the rest of the process.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to stdout and flushes, unless the console is closed. Returns whether it was
/// written.
pub(crate) fn print(text: &str) -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return false;
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) => {
            if !CLOSED.swap(true, Ordering::Relaxed) && e.kind() != std::io::ErrorKind::BrokenPipe {
                // stderr may be gone too: never panic on it.
                let _ = writeln!(
                    std::io::stderr(),
                    "loadgen: warning: stdout: {e}; console output stops here"
                );
            }
            false
        }
    }
}

/// `print!` through [`print()`]: never panics on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::print(&format!($($arg)*))
    };
}

/// `println!` through [`print()`]: never panics on a closed pipe.
macro_rules! outln {
    () => {
        $crate::stdout::print("\n")
    };
    ($($arg:tt)*) => {
        $crate::stdout::print(&format!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {out, outln};

/// `eprintln!` that never panics: a closed stderr drops the line.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub(crate) use errln;
