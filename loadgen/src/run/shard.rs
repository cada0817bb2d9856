//! Running one load as N loadgen processes: `--shard I/N` ([`Shard`]: which part of the
//! schedule this process sends) and `--start-at` ([`StartAt`]: the wall-clock time every
//! process waits for), the flags `bench`, `replay` and `multiturn` share ([`ShardArgs`]).
//!
//! A shard owns the sessions (open-loop arrivals, closed-loop users, trace sessions,
//! conversations) whose global index `i` has `i % N == I`; the process runs them as its local
//! sessions `0, 1, 2, ...`, so local session `j` is global session `I + j * N`
//! ([`Shard::global`]). Every record carries the global index and `"shard": [I, N]`, and
//! `loadgen merge` puts the N shards back together into the unsharded run's request set.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;

use crate::error::LoadgenError;
use crate::limits;

/// Part `index` of `count` of a run's schedule (`--shard I/N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// `I`: this process's part, below `count`.
    pub index: u64,
    /// `N`: the number of processes the run is split over.
    pub count: u64,
}

impl FromStr for Shard {
    type Err = String;

    /// `I/N` with two decimal integers (the ranges are [`limits::shard`]'s).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected I/N (e.g. 0/4), got {s:?}");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let number = |x: &str| {
            if x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            x.parse::<u64>().map_err(|_| bad())
        };
        Ok(Shard {
            index: number(i)?,
            count: number(n)?,
        })
    }
}

impl Shard {
    /// Whether global session (arrival, user) `i` belongs to this shard.
    pub fn owns(&self, i: usize) -> bool {
        i as u64 % self.count == self.index
    }

    /// The global index of this shard's local session `local`.
    pub fn global(&self, local: usize) -> usize {
        (self.index + local as u64 * self.count) as usize
    }

    /// How many of the global indices `0..total` this shard owns.
    pub fn share(&self, total: usize) -> usize {
        ((total as u64 + self.count - 1 - self.index) / self.count) as usize
    }

    /// `[I, N]`, as records carry it.
    pub fn pair(&self) -> (u32, u32) {
        (self.index as u32, self.count as u32)
    }
}

/// The global index of local session `local` under `shard` (itself when unsharded).
pub(crate) fn global(shard: Option<Shard>, local: usize) -> usize {
    shard.map_or(local, |s| s.global(local))
}

/// Adds `"shard": [I, N]` to a report of a sharded run (an unsharded report is left as is).
pub(crate) fn annotate(json: &mut serde_json::Value, shard: Option<Shard>) {
    if let (Some(s), Some(map)) = (shard, json.as_object_mut()) {
        map.insert("shard".into(), serde_json::json!([s.index, s.count]));
    }
}

/// When the processes of a sharded run start: a wall-clock time (µs since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StartAt {
    /// µs since the Unix epoch.
    pub unix_us: u64,
}

impl FromStr for StartAt {
    type Err = String;

    /// RFC 3339 in UTC (`2026-12-02T19:00:00Z`, fractional seconds allowed, `Z` or `+00:00`)
    /// or Unix seconds (`1796324400`, fractions allowed).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return match s.parse::<f64>() {
                Ok(x) if x.is_finite() && x < 1e11 => Ok(StartAt {
                    unix_us: (x * 1e6).round() as u64,
                }),
                _ => Err(format!("{s:?} is not a Unix time in seconds")),
            };
        }
        parse_rfc3339_utc(s).map(|unix_us| StartAt { unix_us })
    }
}

impl std::fmt::Display for StartAt {
    /// RFC 3339 UTC with milliseconds when they are not zero.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.unix_us / 1_000_000;
        let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
        let rest = secs % 86_400;
        write!(
            f,
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
            rest / 3600,
            rest / 60 % 60,
            rest % 60
        )?;
        let ms = self.unix_us / 1000 % 1000;
        if ms != 0 {
            write!(f, ".{ms:03}")?;
        }
        write!(f, "Z")
    }
}

/// Latest `--start-at` accepted: 24 hours from now.
pub(crate) const MAX_START_AHEAD: Duration = Duration::from_secs(86_400);

/// Earliest `--start-at` accepted: 60 seconds ago (a process started a little late still runs,
/// at once).
pub(crate) const MAX_START_LATE: Duration = Duration::from_secs(60);

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// µs since the Unix epoch of an RFC 3339 time in UTC: `YYYY-MM-DDTHH:MM:SS[.frac](Z|+00:00)`
/// (`t`, `z` and a space for `T` accepted), years 1970 to 9999.
pub(crate) fn parse_rfc3339_utc(s: &str) -> Result<u64, String> {
    let bad = |why: &str| {
        Err(format!(
            "{s:?} is not an RFC 3339 UTC time like 2026-12-02T19:00:00Z ({why})"
        ))
    };
    let b = s.as_bytes();
    if b.len() < 20 || !s.is_ascii() {
        return bad("too short");
    }
    let digits = |from: usize, len: usize| -> Option<u32> {
        let part = &s[from..from + len];
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let sep_ok = b[4] == b'-'
        && b[7] == b'-'
        && matches!(b[10], b'T' | b't' | b' ')
        && b[13] == b':'
        && b[16] == b':';
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second), true) = (
        digits(0, 4),
        digits(5, 2),
        digits(8, 2),
        digits(11, 2),
        digits(14, 2),
        digits(17, 2),
        sep_ok,
    ) else {
        return bad("expected YYYY-MM-DDTHH:MM:SS");
    };
    let mut rest = &s[19..];
    let mut micros = 0u64;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return bad("no digits after the decimal point");
        }
        for (i, c) in frac.bytes().take(n).enumerate() {
            if i < 6 {
                micros += u64::from(c - b'0') * 10u64.pow(5 - i as u32);
            }
        }
        rest = &frac[n..];
    }
    if !matches!(rest, "Z" | "z" | "+00:00" | "-00:00") {
        return bad("only UTC: end with Z or +00:00");
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return bad("month out of range"),
    };
    if year < 1970 || day == 0 || day > month_days {
        return bad("date out of range");
    }
    // 60 is a leap second: it reads as the next day's first second.
    if hour > 23 || minute > 59 || second > 60 {
        return bad("time of day out of range");
    }
    let days = days_from_civil(i64::from(year), month, day) as u64;
    let secs = days * 86_400 + u64::from(hour) * 3600 + u64::from(minute) * 60 + u64::from(second);
    Ok(secs * 1_000_000 + micros)
}

/// Now, in µs since the Unix epoch.
fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// `--shard` and `--start-at`, shared by `bench`, `replay` and `multiturn`.
#[derive(Args, Clone, Debug, Default)]
pub struct ShardArgs {
    /// Send only part I of N of the run (I < N, 1 <= N <= 65536), one load spread over N
    /// loadgen processes: open-loop arrival k, closed-loop user u, trace session s and
    /// multiturn user u go to the shard their index mod N names, at their unsharded times with
    /// their unsharded requests. Closed-loop shard I sends the request indices I, I+N, I+2N,
    /// ... of --num-requests (every shard then needs a user: --concurrency >= N; with
    /// --duration alone the request set is not fixed). Records carry the global session or
    /// user index and "shard": [I, N]; `loadgen merge` of the N per-request files rebuilds the
    /// unsharded run's requests and report (bench, replay and multiturn).
    #[arg(long, value_name = "I/N")]
    pub shard: Option<Shard>,

    /// Wait until this wall-clock time before sending, so that N processes start together:
    /// RFC 3339 UTC (2026-12-02T19:00:00Z) or Unix seconds; at most 24 h ahead and at most 60 s
    /// past (a late process starts at once).
    #[arg(long, value_name = "TIME")]
    pub start_at: Option<StartAt>,
}

impl ShardArgs {
    /// Checks both flags' ranges ([`limits::shard`], and `--start-at` against the clock now).
    pub fn check(&self) -> Result<(), LoadgenError> {
        if let Some(shard) = self.shard {
            limits::shard(shard.index, shard.count)?;
        }
        if let Some(at) = self.start_at {
            check_start_at(at, now_unix_us())?;
        }
        Ok(())
    }

    /// Waits for `--start-at` (at once without it), after printing one line saying until when.
    pub async fn wait_for_start(&self) {
        let Some(at) = self.start_at else { return };
        let now = now_unix_us();
        let wait = Duration::from_micros(at.unix_us.saturating_sub(now));
        crate::stdout::outln!(
            "loadgen: waiting until {at} (in {:.1} s) to start",
            wait.as_secs_f64()
        );
        tokio::time::sleep(wait.min(MAX_START_AHEAD)).await;
    }
}

/// `--start-at` is at most [`MAX_START_AHEAD`] after `now_us` and at most [`MAX_START_LATE`]
/// before it.
pub(crate) fn check_start_at(at: StartAt, now_us: u64) -> Result<(), LoadgenError> {
    let ahead = MAX_START_AHEAD.as_micros() as u64;
    let late = MAX_START_LATE.as_micros() as u64;
    if at.unix_us > now_us.saturating_add(ahead) || at.unix_us.saturating_add(late) < now_us {
        return Err(LoadgenError::OutOfRange {
            flag: "--start-at".into(),
            got: at.to_string(),
            allowed: format!(
                "from 60 s ago to 24 h ahead (now {})",
                StartAt { unix_us: now_us }
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_parse_and_partition() {
        let s: Shard = "1/3".parse().expect("valid");
        assert_eq!(s, Shard { index: 1, count: 3 });
        assert_eq!(
            (0..10).filter(|&i| s.owns(i)).collect::<Vec<_>>(),
            [1, 4, 7]
        );
        assert_eq!((0..3).map(|j| s.global(j)).collect::<Vec<_>>(), [1, 4, 7]);
        for total in 0..20 {
            for n in 1..6 {
                let owned: usize = (0..n)
                    .map(|i| Shard { index: i, count: n }.share(total))
                    .sum();
                assert_eq!(owned, total);
                let s = Shard {
                    index: n - 1,
                    count: n,
                };
                assert_eq!(s.share(total), (0..total).filter(|&k| s.owns(k)).count());
            }
        }
        for bad in ["", "1", "1/", "/3", "a/3", "1/3/4", "-1/3", "1 /3", "+1/3"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad:?}");
        }
        let check = |s: Shard| limits::shard(s.index, s.count);
        assert!(check("0/1".parse().expect("syntax")).is_ok());
        assert!(check("65535/65536".parse().expect("syntax")).is_ok());
        for bad in ["3/3", "0/0", "0/65537", "99999999999999999/3"] {
            let e = match bad.parse::<Shard>() {
                Ok(s) => check(s).expect_err(bad).to_string(),
                Err(e) => e,
            };
            assert!(e.contains("--shard") || e.contains("expected I/N"), "{e}");
        }
        let e = check(Shard { index: 3, count: 3 }).expect_err("I = N");
        assert_eq!(
            e.to_string(),
            "invalid configuration: --shard must be I/N with I < N and 1 <= N <= 65536, got 3/3"
        );
    }

    #[test]
    fn rfc3339_utc_times_parse() {
        let t = |s: &str| parse_rfc3339_utc(s);
        assert_eq!(t("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(t("2026-12-02T19:00:00Z"), Ok(1_796_238_000_000_000));
        assert_eq!(t("2000-02-29T12:34:56.5Z"), Ok(951_827_696_500_000));
        assert_eq!(t("2000-02-29t12:34:56.123456789z"), Ok(951_827_696_123_456));
        assert_eq!(t("2026-12-02 19:00:00+00:00"), t("2026-12-02T19:00:00Z"));
        for bad in [
            "2026-12-02T19:00:00",
            "2026-12-02T19:00:00+01:00",
            "2026-02-29T00:00:00Z",
            "1900-02-28T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-02T24:00:00Z",
            "2026-12-02T19:00:00.Z",
            "2026-12-0xT19:00:00Z",
            "2026-12-02",
            "ゆ026-12-02T19:00:00Z",
        ] {
            assert!(t(bad).is_err(), "{bad:?}");
        }
        // Every day of four centuries round-trips through the date functions.
        for day in 0..146_097 * 2 {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
        let at: StartAt = "2026-12-02T19:00:00Z".parse().expect("rfc 3339");
        assert_eq!(at.to_string(), "2026-12-02T19:00:00Z");
        assert_eq!("1796238000".parse::<StartAt>(), Ok(at));
        assert_eq!(
            "1796238000.25"
                .parse::<StartAt>()
                .expect("unix")
                .to_string(),
            "2026-12-02T19:00:00.250Z"
        );
        assert!("1e300".parse::<StartAt>().is_err());
        assert!("99999999999999999999".parse::<StartAt>().is_err());
    }

    #[test]
    fn start_at_must_be_near_now() {
        let now = 1_796_238_000_000_000;
        let at = |us: u64| StartAt { unix_us: us };
        assert!(check_start_at(at(now), now).is_ok());
        assert!(check_start_at(at(now + 86_400_000_000), now).is_ok());
        assert!(check_start_at(at(now - 60_000_000), now).is_ok());
        let e = check_start_at(at(now + 86_400_000_001), now).expect_err("too far");
        assert!(e.to_string().contains("--start-at"), "{e}");
        let e = check_start_at(at(now - 60_000_001), now).expect_err("too late");
        assert_eq!(
            e.to_string(),
            "invalid configuration: --start-at must be from 60 s ago to 24 h ahead (now \
             2026-12-02T19:00:00Z), got 2026-12-02T18:58:59.999Z"
        );
    }
}
