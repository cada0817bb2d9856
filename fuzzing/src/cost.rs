//! The cost budget of one request body: the most heap the server may hold for it, growing with
//! the body's size and its answer's, and the longest it may take, growing with the body's.
//! Answers themselves are bounded apart (8 MiB, [`crate::http::MAX_RESPONSE_BYTES`]).
//!
//! A small valid body must not buy work out of proportion to what it asks for (a long stop
//! string rescanned per token, a recursive schema built in full, a batch handled in quadratic
//! time), so besides answering correctly a request must answer within [`BODY_BUDGET`]. Heap is
//! the deterministic measure (counted by [`crate::meter`]); wall time is a generous backstop
//! for CPU-bound work, sized for debug builds on a loaded two-core machine.

use std::fmt;
use std::time::Duration;

/// What one body may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostBudget {
    /// Heap any body may use: the server's per-request state, the answer and its encoding.
    pub heap_base_bytes: usize,
    /// Heap per byte of body: parsing keeps the body and its JSON value, a prompt its tokens.
    pub heap_bytes_per_body_byte: usize,
    /// Heap per byte of answer: the answer is built as a JSON value before it is encoded (a
    /// 3 MB answer with log probabilities holds 74 MiB in a debug build).
    pub heap_bytes_per_answer_byte: usize,
    /// Time any body may take, headers to the last answer byte.
    pub time_base: Duration,
    /// Time per MiB of body: parsing and tokenizing it.
    pub time_per_mib: Duration,
    /// Heap growth past this many times the heap budget aborts the process (see
    /// [`crate::meter`]), so that a value built without bound does not take the machine.
    pub ceiling_factor: usize,
    /// The ceiling is never below this (so a body over budget is reported with its figure).
    pub ceiling_min_bytes: usize,
}

/// The budget of every HTTP body target: a heap growth of 64 MiB + 64 bytes per body byte + 32
/// per answer byte, 5 s + 1 s per MiB of body, and an abort past 4 times the heap budget of the
/// body without its answer (2 GiB at least).
///
/// Real requests fit it with a margin of two or more. Measured in a debug build on the server
/// with mockserve's default limits: a chat answer of 2,000 tokens with 20 log probabilities
/// each (3.0 MB) held 74 MiB of 155 MiB, and took 3.4 s of its 5 s (the closest to a budget:
/// larger answers need a cap in the server); 4,000 tokens streamed 2.2 MiB; 4 choices of 500
/// tokens 0.6 MiB; a 550 KB prompt 1.9 MiB of 98 MiB, answered in 0.2 s; 500 prompts of a
/// batch 2.0 MiB.
pub const BODY_BUDGET: CostBudget = CostBudget {
    heap_base_bytes: 64 << 20,
    heap_bytes_per_body_byte: 64,
    heap_bytes_per_answer_byte: 32,
    time_base: Duration::from_secs(5),
    time_per_mib: Duration::from_secs(1),
    ceiling_factor: 4,
    ceiling_min_bytes: 2 << 30,
};

impl CostBudget {
    /// Heap a body of `body_len` bytes with an answer of `answer_len` bytes may hold at its
    /// peak.
    pub fn heap_bytes(&self, body_len: usize, answer_len: usize) -> usize {
        self.heap_base_bytes
            .saturating_add(self.heap_bytes_per_body_byte.saturating_mul(body_len))
            .saturating_add(self.heap_bytes_per_answer_byte.saturating_mul(answer_len))
    }

    /// Time a body of `body_len` bytes may take.
    pub fn time(&self, body_len: usize) -> Duration {
        let mib = body_len as f64 / (1 << 20) as f64;
        self.time_base + self.time_per_mib.mul_f64(mib)
    }

    /// Heap growth that aborts the process while a body of `body_len` bytes is checked.
    pub fn ceiling_bytes(&self, body_len: usize) -> usize {
        self.heap_bytes(body_len, 0)
            .saturating_mul(self.ceiling_factor)
            .max(self.ceiling_min_bytes)
    }

    /// `Ok` when `spent` is within the budget of a body of `body_len` bytes; otherwise the
    /// budget exceeded, what was spent and what the budget was.
    pub fn check(&self, body_len: usize, spent: &Spent) -> Result<(), String> {
        let answer_len = spent.answer_bytes;
        let budget = self.heap_bytes(body_len, answer_len);
        if spent.peak_heap_bytes > budget {
            return Err(format!(
                "over the heap budget: the server's heap grew by {} ({} bytes) for a \
                 {body_len}-byte body and a {answer_len}-byte answer, whose budget is {} + {} \
                 per body byte + {} per answer byte = {} ({budget} bytes)",
                Bytes(spent.peak_heap_bytes),
                spent.peak_heap_bytes,
                Bytes(self.heap_base_bytes),
                Bytes(self.heap_bytes_per_body_byte),
                Bytes(self.heap_bytes_per_answer_byte),
                Bytes(budget),
            ));
        }
        let time = self.time(body_len);
        if spent.elapsed > time {
            return Err(format!(
                "over the time budget: the answer took {:.1?} for a {body_len}-byte body, whose \
                 budget is {:?} + {:?} per MiB = {time:.1?}",
                spent.elapsed, self.time_base, self.time_per_mib
            ));
        }
        Ok(())
    }
}

/// What checking one body cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spent {
    /// The most the server's heap grew above its level before the request.
    pub peak_heap_bytes: usize,
    /// Wall time from sending the request to its last answer byte.
    pub elapsed: Duration,
    /// Bytes of the answer's body (0 when none came).
    pub answer_bytes: usize,
}

/// A byte count in binary units, for messages.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0 as f64;
        match self.0 {
            0..1024 => write!(f, "{} B", self.0),
            1024..0x10_0000 => write!(f, "{:.1} KiB", n / 1024.0),
            0x10_0000..0x4000_0000 => write!(f, "{:.1} MiB", n / (1 << 20) as f64),
            _ => write!(f, "{:.2} GiB", n / (1 << 30) as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_grows_with_the_body() {
        assert_eq!(BODY_BUDGET.heap_bytes(0, 0), 64 << 20);
        assert_eq!(BODY_BUDGET.heap_bytes(1 << 20, 0), 128 << 20);
        assert_eq!(BODY_BUDGET.heap_bytes(1 << 20, 2 << 20), 192 << 20);
        assert_eq!(BODY_BUDGET.time(0), Duration::from_secs(5));
        assert_eq!(BODY_BUDGET.time(3 << 19), Duration::from_millis(6500));
        assert_eq!(BODY_BUDGET.ceiling_bytes(100), 2 << 30);
        assert_eq!(BODY_BUDGET.ceiling_bytes(8 << 20), 4 * (576 << 20));
    }

    #[test]
    fn spending_past_either_budget_names_it_and_the_figures() {
        let within = Spent {
            peak_heap_bytes: 64 << 20,
            elapsed: Duration::from_secs(5),
            answer_bytes: 0,
        };
        assert_eq!(BODY_BUDGET.check(0, &within), Ok(()));
        let large_answer = Spent {
            peak_heap_bytes: 74 << 20,
            answer_bytes: 3_000_000,
            ..within
        };
        assert_eq!(BODY_BUDGET.check(150, &large_answer), Ok(()));
        let small_answer = Spent {
            answer_bytes: 300_000,
            ..large_answer
        };
        assert!(BODY_BUDGET.check(150, &small_answer).is_err());
        let heap = Spent {
            peak_heap_bytes: 1_340_000_000,
            ..within
        };
        let message = BODY_BUDGET.check(100, &heap).expect_err("over");
        assert!(
            message.starts_with("over the heap budget")
                && message.contains("1.25 GiB (1340000000 bytes)")
                && message.contains("100-byte body and a 0-byte answer")
                && message.contains(
                    "64.0 MiB + 64 B per body byte + 32 B per answer byte = 64.0 MiB \
                     (67115264 bytes)"
                ),
            "{message}"
        );
        let time = Spent {
            elapsed: Duration::from_secs(7),
            ..within
        };
        let message = BODY_BUDGET.check(1 << 20, &time).expect_err("over");
        assert!(
            message.starts_with("over the time budget: the answer took 7.0s")
                && message.contains("= 6.0s"),
            "{message}"
        );
        assert_eq!(BODY_BUDGET.check(1 << 20, &within), Ok(()));
    }
}
