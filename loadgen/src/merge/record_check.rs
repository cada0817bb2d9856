//! What `loadgen merge` accepts in a record: every field a run writes and the merge computes
//! with (the shard, the run's shape, indices, times, token counts) checked against the range of
//! the flag or the run that produces it, so a forged or damaged record is refused with its
//! file, line and field instead of costing memory or time in proportion to a number in it.
//!
//! The ranges: `shard` as `--shard I/N` (`limits::shard`); a multiturn run's users and turns
//! as `--num-users` and `--num-turns` (and their product as `MAX_REQUESTS`); prompt and output
//! lengths as the trace rows and flags that set them; indices below [`MAX_RECORD_INDEX`];
//! times (µs from the run start) at most [`MAX_RECORD_TIME_US`] and run starts at most
//! [`MAX_RUN_START_UNIX_US`]; output tokens at most `MAX_TOKENS_PER_CHUNK` per counted chunk, the
//! client's own rule for believing a server's usage. Figures that only echo the server
//! (`usage`'s counts, the worker id, the finish reason) are kept as they are; the line cap
//! bounds their size.

use crate::limits::{self, MAX_PROMPT_TOKENS, MAX_REQUESTS, MAX_TURNS, MAX_USERS};
use crate::multiturn::report::RawResult;
use crate::report::replay_report::RawSample;
use crate::run::client::MAX_TOKENS_PER_CHUNK;

/// Session, turn and send-order indices of a record are below this (2^32): no run sends more
/// requests than it can keep in memory.
pub(crate) const MAX_RECORD_INDEX: u64 = 1 << 32;

/// Longest time a record may hold, µs from its run start (2^52 µs, about 142 years): every sum
/// the merge forms stays far from `u64::MAX`.
pub(crate) const MAX_RECORD_TIME_US: u64 = 1 << 52;

/// Latest run start a record may name, µs since the Unix epoch (2^53 µs, the year 2255).
pub(crate) const MAX_RUN_START_UNIX_US: u64 = 1 << 53;

/// Most output tokens a trace row may ask for (`servesim::trace::MAX_ROW_OUTPUT_TOKENS`, 2^30):
/// a replay record's `max_output`.
const MAX_RECORD_OUTPUT_ASKED: u64 = servesim::trace::MAX_ROW_OUTPUT_TOKENS as u64;

/// A field outside its range: `field = value, allowed`.
fn bad(field: &str, value: impl std::fmt::Display, allowed: &str) -> String {
    format!("field {field} = {value} is out of range: {allowed}")
}

fn at_most(field: &str, value: u64, max: u64) -> Result<(), String> {
    if value <= max {
        Ok(())
    } else {
        Err(bad(
            field,
            limits::show(value as f64),
            &format!("at most {}", limits::show(max as f64)),
        ))
    }
}

fn below(field: &str, value: u64, max: u64) -> Result<(), String> {
    if value < max {
        Ok(())
    } else {
        Err(bad(
            field,
            limits::show(value as f64),
            &format!("below {}", limits::show(max as f64)),
        ))
    }
}

fn time(field: &str, value: Option<u64>) -> Result<(), String> {
    value.map_or(Ok(()), |v| at_most(field, v, MAX_RECORD_TIME_US))
}

/// `"shard": [I, N]` as `--shard I/N` allows it.
fn shard(value: Option<(u32, u32)>) -> Result<(), String> {
    match value {
        Some((i, n)) => limits::shard(u64::from(i), u64::from(n)).map_err(|_| {
            bad(
                "shard",
                format!("[{i},{n}]"),
                &format!("[I,N] with I < N and 1 <= N <= {}", limits::MAX_SHARDS),
            )
        }),
        None => Ok(()),
    }
}

/// Output tokens believed for `chunks` counted chunks: at most `MAX_TOKENS_PER_CHUNK` each.
fn output_tokens(value: u64, chunks: u64) -> Result<(), String> {
    at_most(
        "output_tokens",
        value,
        MAX_TOKENS_PER_CHUNK.saturating_mul(chunks),
    )
    .map_err(|e| format!("{e} ({MAX_TOKENS_PER_CHUNK} per counted chunk)"))
}

/// Checks a `bench` or `replay` record's `raw` object.
pub(crate) fn raw(r: &RawSample) -> Result<(), String> {
    shard(r.shard)?;
    at_most(
        "run_start_unix_us",
        r.run_start_unix_us,
        MAX_RUN_START_UNIX_US,
    )?;
    below("session", r.session as u64, MAX_RECORD_INDEX)?;
    below("turn", r.turn as u64, MAX_RECORD_INDEX)?;
    below("seq", r.seq, MAX_RECORD_INDEX)?;
    for (field, value) in [
        ("scheduled_us", Some(r.scheduled_us)),
        ("sent_us", Some(r.sent_us)),
        ("cap_wait_us", Some(r.cap_wait_us)),
        ("tie_wait_us", Some(r.tie_wait_us)),
        ("headers_us", r.headers_us),
        ("first_chunk_us", r.first_chunk_us),
        ("first_reasoning_us", r.first_reasoning_us),
        ("first_answer_us", r.first_answer_us),
        ("end_us", Some(r.end_us)),
    ] {
        time(field, value)?;
    }
    if let Some(&t) = r.token_chunks_us.iter().find(|&&t| t > MAX_RECORD_TIME_US) {
        time("token_chunks_us", Some(t))?;
    }
    let counted = r.token_chunks_us.len() as u64;
    if r.chunks != counted {
        return Err(bad(
            "chunks",
            r.chunks,
            &format!("the {counted} times in token_chunks_us"),
        ));
    }
    output_tokens(r.output_tokens, r.chunks)?;
    at_most(
        "input_length",
        r.input_length as u64,
        MAX_PROMPT_TOKENS as u64,
    )?;
    at_most("max_output", r.max_output as u64, MAX_RECORD_OUTPUT_ASKED)?;
    if let Some(n) = r.expected_reused_tokens {
        at_most("expected_reused_tokens", n as u64, MAX_PROMPT_TOKENS as u64)?;
    }
    Ok(())
}

/// Checks a multiturn `--shard` record and its `merge` object.
pub(crate) fn multiturn(r: &RawResult) -> Result<(), String> {
    shard(r.shard)?;
    if let Some(m) = &r.merge {
        if !(1..=MAX_USERS).contains(&m.num_users) {
            return Err(bad(
                "merge.num_users",
                limits::show(m.num_users as f64),
                &format!("from 1 to {MAX_USERS} (--num-users)"),
            ));
        }
        if !(1..=MAX_TURNS).contains(&m.num_turns) {
            return Err(bad(
                "merge.num_turns",
                limits::show(m.num_turns as f64),
                &format!("from 1 to {MAX_TURNS} (--num-turns)"),
            ));
        }
        if m.num_users.saturating_mul(m.num_turns) > MAX_REQUESTS {
            return Err(bad(
                "merge.num_users x merge.num_turns",
                limits::show(m.num_users as f64 * m.num_turns as f64),
                &format!("at most {MAX_REQUESTS} (MAX_REQUESTS)"),
            ));
        }
        at_most(
            "merge.run_start_unix_us",
            m.run_start_unix_us,
            MAX_RUN_START_UNIX_US,
        )?;
        time("merge.end_us", Some(m.end_us))?;
        if let Some(&t) = m.chunk_gaps_us.iter().find(|&&t| t > MAX_RECORD_TIME_US) {
            time("merge.chunk_gaps_us", Some(t))?;
        }
        if let Some(rate) = m.output_tokens_per_s {
            if !(rate.is_finite() && rate >= 0.0) {
                return Err(bad(
                    "merge.output_tokens_per_s",
                    limits::show(rate),
                    "finite and at least 0",
                ));
            }
        }
    }
    for (field, value) in [
        ("ttft_us", Some(r.ttft_us)),
        ("total_latency_us", Some(r.total_latency_us)),
        ("first_answer_us", r.first_answer_us),
        ("ttft_any_us", r.ttft_any_us),
        ("headers_us", r.headers_us),
        ("first_reasoning_us", r.first_reasoning_us),
        ("start_us", r.start_us),
    ] {
        time(field, value)?;
    }
    output_tokens(r.output_tokens, r.chunks)?;
    if let Some(n) = r.user_tokens {
        at_most("user_tokens", n as u64, MAX_PROMPT_TOKENS as u64)?;
    }
    Ok(())
}
