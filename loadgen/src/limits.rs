//! What loadgen's flags may be: every numeric cap as a named constant, the checks each mode's
//! validation ([`crate::multiturn::config::MultiturnArgs::config`], [`crate::bench::BenchArgs::plan`],
//! [`crate::replay::ReplayArgs::check`], [`crate::sweep::SweepArgs::plan`],
//! [`crate::profile::ProfileArgs::plan`], [`crate::run::target::TargetArgs::spec`]) runs them with,
//! and the check that an output path can be written before a run spends minutes.
//!
//! The caps keep every run bounded in time and memory: nothing is allocated or waited for in
//! proportion to an unchecked flag. A value out of range is a [`LoadgenError::OutOfRange`]
//! naming the flag, the allowed range and the value (large numbers in scientific notation).

use std::path::Path;

use crate::error::LoadgenError;

/// Requests in flight at most: `--concurrency`, `--max-concurrency`, `--max-in-flight`, the
/// concurrencies of a sweep and `--decode-batch-sizes`.
pub(crate) const MAX_CONCURRENCY: usize = 100_000;

/// Requests of an agentic replay in flight when `--max-in-flight` is not given: a trace whose
/// plays all start at once (40,000 roots at t=0) would otherwise open one socket per root (two
/// with the embedded server) and fail on the process's file limit. Further requests wait for a
/// slot; their latency still counts from their scheduled time and the wait is reported.
pub(crate) const DEFAULT_AGENTIC_MAX_IN_FLIGHT: usize = 256;

/// Conversations of `loadgen multiturn` at most (`--num-users`).
pub(crate) const MAX_USERS: usize = 100_000;

/// Turns per conversation at most (`--num-turns`).
pub(crate) const MAX_TURNS: usize = 10_000;

/// Requests of one run at most: `--num-requests`, `--num-users` x `--num-turns`, the requests an
/// open loop schedules (`--request-rate` x `--duration`), `--warmup N` and
/// `--num-prefix-groups`; and `--num-runs` x one run's requests (every run's records are kept).
pub(crate) const MAX_REQUESTS: usize = 10_000_000;

/// Prompt tokens of one request at most (4,194,304, the embedded server's context length):
/// `--input-tokens` plus `--shared-prefix-tokens`, `--num-user-tokens`, `--prefill-isl`,
/// `--decode-context-lengths`, `--prefill-chunk`, and every trace row.
pub(crate) const MAX_PROMPT_TOKENS: usize = servesim::trace::synthetic::MAX_SYNTHETIC_PROMPT_TOKENS;

/// Output tokens of one request at most: `--output-tokens`, `--max-completion-tokens`,
/// `--decode-tokens`.
pub(crate) const MAX_OUTPUT_TOKENS: usize = servesim::trace::synthetic::MAX_SYNTHETIC_OUTPUT_TOKENS;

/// Tokens of the prompts and answers of the requests that can be in flight at once at most
/// (268,435,456, about a gigabyte of text): `--concurrency` x the longest prompt and answer of
/// `bench`, `--num-users` x a conversation's whole history in `multiturn`, a decode point's
/// batch size x context length in `profile`.
pub(crate) const MAX_TOKENS_IN_FLIGHT: usize = 1 << 28;

/// Seven days in seconds: the longest `--duration`, `--time-budget-s` and `--warmup Ns`.
pub(crate) const MAX_DURATION_S: f64 = servesim::trace::synthetic::MAX_SYNTHETIC_DURATION_S;

/// One day in seconds: the longest `--request-timeout-s`.
pub(crate) const MAX_REQUEST_TIMEOUT_S: f64 = 86_400.0;

/// One hour in ms: the longest mean think time (`--mean-delay-ms`) and `--scrape-interval-ms`.
pub(crate) const MAX_DELAY_MS: u64 = 3_600_000;

/// Requests per second at most (`--request-rate`, `--search-start` of a rate search); `inf`
/// (everything at once) is accepted where the flag's help says so.
pub(crate) const MAX_REQUEST_RATE: f64 = servesim::trace::synthetic::MAX_SYNTHETIC_RATE;

/// `--burstiness` (a gamma shape) lies in `[MIN_BURSTINESS, MAX_BURSTINESS]`.
pub(crate) const MIN_BURSTINESS: f64 = servesim::trace::synthetic::SYNTHETIC_BURSTINESS.0;

/// See [`MIN_BURSTINESS`].
pub(crate) const MAX_BURSTINESS: f64 = servesim::trace::synthetic::SYNTHETIC_BURSTINESS.1;

/// `--arrival-speedup-ratio` lies in `[MIN_ARRIVAL_SPEEDUP, MAX_ARRIVAL_SPEEDUP]` (the trace's
/// schedule bound then applies to the sped-up schedule).
pub(crate) const MIN_ARRIVAL_SPEEDUP: f64 = 1e-6;

/// See [`MIN_ARRIVAL_SPEEDUP`].
pub(crate) const MAX_ARRIVAL_SPEEDUP: f64 = 1e6;

/// Longest SSE line `--max-line-bytes` may allow (1 GiB).
pub(crate) const MAX_LINE_BYTES: usize = 1 << 30;

/// Points of a sweep at most (the list's length, `--max-points`).
pub(crate) const MAX_SWEEP_POINTS: usize = 1_000;

/// Bisection steps of a search at most (`--search-steps`).
pub(crate) const MAX_SEARCH_STEPS: usize = 64;

/// Largest ramp factor of a search (`--search-factor`).
pub(crate) const MAX_SEARCH_FACTOR: f64 = 1_000.0;

/// Samples per prompt length of `profile` at most (`--prefill-samples`).
pub(crate) const MAX_PROFILE_SAMPLES: usize = 1_000;

/// Values of one `profile` grid list at most (`--prefill-isl`, `--decode-batch-sizes`,
/// `--decode-context-lengths`).
pub(crate) const MAX_GRID_VALUES: usize = 64;

/// Processes one run may be split over at most (`--shard I/N`).
pub(crate) const MAX_SHARDS: u64 = 65_536;

/// `--shard I/N` (`index`/`count`): `I < N` and `1 <= N <=` [`MAX_SHARDS`].
pub(crate) fn shard(index: u64, count: u64) -> Result<(), LoadgenError> {
    if (1..=MAX_SHARDS).contains(&count) && index < count {
        Ok(())
    } else {
        Err(out_of_range(
            "--shard",
            format!("{index}/{count}"),
            format!("I/N with I < N and 1 <= N <= {MAX_SHARDS}"),
        ))
    }
}

/// `x` for a message: plain for ordinary magnitudes, scientific for very large or very small
/// ones (never a 309-digit number).
pub(crate) fn show(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// The error for `flag` = `got` outside `allowed`.
fn out_of_range(flag: &str, got: String, allowed: String) -> LoadgenError {
    LoadgenError::OutOfRange {
        flag: flag.to_string(),
        got,
        allowed,
    }
}

/// A count in `[min, max]`.
pub(crate) fn count(
    flag: &str,
    value: usize,
    min: usize,
    max: usize,
) -> Result<usize, LoadgenError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(out_of_range(
            flag,
            value.to_string(),
            format!("from {min} to {max}"),
        ))
    }
}

/// A finite number above 0 and at most `max`.
pub(crate) fn positive(flag: &str, value: f64, max: f64) -> Result<f64, LoadgenError> {
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(value)
    } else {
        Err(out_of_range(
            flag,
            show(value),
            format!("above 0 and at most {}", show(max)),
        ))
    }
}

/// A finite number in `[min, max]`.
pub(crate) fn within(flag: &str, value: f64, min: f64, max: f64) -> Result<f64, LoadgenError> {
    if value.is_finite() && (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(out_of_range(
            flag,
            show(value),
            format!("from {} to {}", show(min), show(max)),
        ))
    }
}

/// `--arrival-speedup-ratio` within [`MIN_ARRIVAL_SPEEDUP`]..=[`MAX_ARRIVAL_SPEEDUP`] (`replay`
/// and each point of a trace `sweep`).
pub(crate) fn arrival_speedup(value: f64) -> Result<f64, LoadgenError> {
    within(
        "--arrival-speedup-ratio",
        value,
        MIN_ARRIVAL_SPEEDUP,
        MAX_ARRIVAL_SPEEDUP,
    )
}

/// `--trace-block-size` within 1..=[`servesim::trace::MAX_TRACE_BLOCK_SIZE`].
pub(crate) fn trace_block_size(value: usize) -> Result<usize, LoadgenError> {
    count(
        "--trace-block-size",
        value,
        1,
        servesim::trace::MAX_TRACE_BLOCK_SIZE,
    )
}

/// An error for a combination of flags whose product passes `max` (`what` says which product).
pub(crate) fn product(
    what: &str,
    factors: &[usize],
    max: usize,
    constant: &str,
) -> Result<(), LoadgenError> {
    let total = factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&t| t <= max);
    match total {
        Some(_) => Ok(()),
        None => Err(LoadgenError::Config(format!(
            "{what} is {}, above the {max} loadgen allows ({constant})",
            show(factors.iter().map(|&f| f as f64).product())
        ))),
    }
}

/// Checks before a run that `path` (the value of `flag`) can be written: not a directory, its
/// folder exists, and the file (when it exists) opens for writing or the folder takes a new
/// file. Nothing is truncated or left behind.
pub(crate) fn output_path(flag: &str, path: &Path) -> Result<(), LoadgenError> {
    let bad = |why: String| {
        Err(LoadgenError::Config(format!(
            "{flag} {}: {why}",
            path.display()
        )))
    };
    if path.as_os_str().is_empty() {
        return bad("empty path".into());
    }
    if path.is_dir() {
        return bad("is a directory".into());
    }
    if path.exists() {
        return match std::fs::OpenOptions::new().append(true).open(path) {
            Ok(_) => Ok(()),
            Err(e) => bad(format!("cannot be written: {e}")),
        };
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return bad(format!("folder {} does not exist", dir.display()));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let probe = dir.join(format!(".{name}.{}.loadgen-probe", std::process::id()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
    {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => bad(format!(
            "folder {} does not take new files: {e}",
            dir.display()
        )),
    }
}

/// [`output_path`] for each `(flag, path)` given.
pub(crate) fn output_paths<'a>(
    paths: impl IntoIterator<Item = (&'a str, Option<&'a Path>)>,
) -> Result<(), LoadgenError> {
    for (flag, path) in paths {
        if let Some(path) = path {
            output_path(flag, path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use mock_server::test_kit::TempDir;

    use super::*;

    #[test]
    fn numbers_in_messages_stay_short() {
        assert_eq!(show(1e308), "1e308");
        assert_eq!(show(604800.0), "604800");
        assert_eq!(show(0.5), "0.5");
        assert_eq!(show(f64::INFINITY), "inf");
        assert_eq!(show(-1e-300), "-1e-300");
        let e = positive("--duration", 1e308, MAX_DURATION_S).expect_err("too long");
        assert_eq!(
            e.to_string(),
            "invalid configuration: --duration must be above 0 and at most 604800, got 1e308"
        );
        let e = count("--concurrency", 1 << 32, 1, MAX_CONCURRENCY).expect_err("too many");
        assert_eq!(
            e.to_string(),
            "invalid configuration: --concurrency must be from 1 to 100000, got 4294967296"
        );
        assert!(product("x", &[usize::MAX, 2], 10, "C").is_err());
        assert!(product("x", &[5, 2], 10, "C").is_ok());
    }

    #[test]
    fn output_paths_are_checked_without_leaving_anything() {
        let tmp = TempDir::new("loadgen-limits").expect("a temporary folder");
        let dir = tmp.path();
        let fresh = dir.join("fresh.json");
        output_path("--report-json", &fresh).expect("a new file in a folder");
        assert!(!fresh.exists());
        assert_eq!(std::fs::read_dir(dir).expect("list").count(), 0);
        let e = output_path("--html", dir).expect_err("a folder");
        assert!(e.to_string().contains("--html") && e.to_string().contains("is a directory"));
        let e = output_path("--report-json", &dir.join("missing/r.json")).expect_err("no folder");
        assert!(e.to_string().contains("does not exist"), "{e}");
        std::fs::write(&fresh, "keep").expect("write");
        output_path("--report-json", &fresh).expect("an existing file");
        assert_eq!(std::fs::read_to_string(&fresh).expect("read"), "keep");
    }
}
