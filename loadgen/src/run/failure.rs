//! Failed requests: why one failed ([`Failure`]), the counts by reason every mode reports
//! ([`FailureSummary`], the `failures` key of every JSON report), and the pass/fail [`verdict`]
//! behind `--max-failure-rate`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::error::LoadgenError;

/// Default of `--max-failure-rate` in every mode: a run with more than 5% failed requests fails.
pub(crate) const DEFAULT_MAX_FAILURE_RATE: f64 = 0.05;

/// Distinct reasons listed in a [`FailureSummary`]; the rest are counted in one "other" entry.
pub(crate) const MAX_REASONS: usize = 20;

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum Failure {
    /// Non-2xx response status, with the server's error message (`error.message` of an
    /// OpenAI-style body, else the start of the body).
    Http {
        /// The status code.
        status: u16,
        /// The server's message.
        #[serde(alias = "body")]
        message: String,
    },
    /// Connect or send error before the response headers.
    Transport(String),
    /// `--request-timeout-s` elapsed (before the headers or while streaming).
    Timeout(String),
    /// The body stream broke, or ended before `data: [DONE]`.
    Stream(String),
    /// The server sent `data: {"error": ...}`.
    Server(String),
    /// The stream ended normally but carried no token (only `[DONE]`, chunks without choices,
    /// lines that are not chunks).
    EmptyStream,
    /// An SSE line (or one event's data) was longer than `--max-line-bytes`.
    LineTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A whole (not streamed) answer, an embeddings one, was longer than `--max-line-bytes`.
    BodyTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// Still in flight when the run stopped early (a sweep point over capacity).
    Cancelled,
}

/// Longest server message kept in a reason (characters).
const MESSAGE_CHARS: usize = 200;

/// The message on one line, cut to [`MESSAGE_CHARS`].
fn one_line(m: &str) -> String {
    let flat: String = m.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > MESSAGE_CHARS {
        let cut: String = flat.chars().take(MESSAGE_CHARS).collect();
        format!("{cut}...")
    } else {
        flat
    }
}

impl Failure {
    /// A stable machine-readable class: `http`, `transport`, `timeout`, `stream`,
    /// `server_error`, `empty_stream`, `line_too_long`, `body_too_long` or `cancelled`.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Http { .. } => "http",
            Failure::Transport(_) => "transport",
            Failure::Timeout(_) => "timeout",
            Failure::Stream(_) => "stream",
            Failure::Server(_) => "server_error",
            Failure::EmptyStream => "empty_stream",
            Failure::LineTooLong { .. } => "line_too_long",
            Failure::BodyTooLong { .. } => "body_too_long",
            Failure::Cancelled => "cancelled",
        }
    }

    /// The HTTP status, for [`Failure::Http`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Failure::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The key grouping similar failures in the reports: the class and the message, e.g.
    /// `HTTP 429: rate limited` or `empty stream`.
    pub fn reason(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Http { status, message } if message.trim().is_empty() => {
                write!(f, "HTTP {status}")
            }
            Failure::Http { status, message } => write!(f, "HTTP {status}: {}", one_line(message)),
            Failure::Transport(m) => write!(f, "transport: {}", one_line(m)),
            Failure::Timeout(m) => write!(f, "timeout: {}", one_line(m)),
            Failure::Stream(m) => write!(f, "stream: {}", one_line(m)),
            Failure::Server(m) => write!(f, "server error: {}", one_line(m)),
            Failure::EmptyStream => write!(f, "empty stream"),
            Failure::LineTooLong { limit } => {
                write!(f, "SSE line longer than --max-line-bytes ({limit})")
            }
            Failure::BodyTooLong { limit } => {
                write!(f, "answer longer than --max-line-bytes ({limit})")
            }
            Failure::Cancelled => write!(f, "cancelled: the run stopped early"),
        }
    }
}

/// Failed requests with one reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasonCount {
    /// [`Failure::reason`] (or `other reasons` for the tail beyond [`MAX_REASONS`]).
    pub reason: String,
    /// [`Failure::kind`] (`other` for the tail).
    pub kind: String,
    /// The HTTP status, for HTTP failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Requests.
    pub count: usize,
}

/// Failed requests by reason: the `failures` key of every mode's JSON report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureSummary {
    /// Failed requests.
    pub total: usize,
    /// Counts by reason, most frequent first (ties by reason).
    pub by_reason: Vec<ReasonCount>,
}

impl FailureSummary {
    /// Counts `failures` by reason.
    pub fn of<'a>(failures: impl IntoIterator<Item = &'a Failure>) -> FailureSummary {
        let mut counts: BTreeMap<String, ReasonCount> = BTreeMap::new();
        let mut total = 0;
        for f in failures {
            total += 1;
            counts
                .entry(f.reason())
                .or_insert_with(|| ReasonCount {
                    reason: f.reason(),
                    kind: f.kind().to_string(),
                    status: f.status(),
                    count: 0,
                })
                .count += 1;
        }
        let mut by_reason: Vec<ReasonCount> = counts.into_values().collect();
        by_reason.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
        if by_reason.len() > MAX_REASONS {
            let rest: usize = by_reason[MAX_REASONS - 1..].iter().map(|r| r.count).sum();
            let others = by_reason.len() - (MAX_REASONS - 1);
            by_reason.truncate(MAX_REASONS - 1);
            by_reason.push(ReasonCount {
                reason: format!("{others} other reasons"),
                kind: "other".into(),
                status: None,
                count: rest,
            });
        }
        FailureSummary { total, by_reason }
    }

    /// Failed requests with this reason (0 when none).
    pub fn count(&self, reason: &str) -> usize {
        self.by_reason
            .iter()
            .find(|r| r.reason == reason)
            .map_or(0, |r| r.count)
    }

    /// The console lines: `Failed requests: F of N (x%)`, then one line per reason.
    pub fn lines(&self, requests: usize) -> String {
        let mut o = String::new();
        let share = if requests > 0 {
            100.0 * self.total as f64 / requests as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "Failed requests: {} of {requests} ({share:.1}%), excluded from every latency figure",
            self.total
        );
        for r in &self.by_reason {
            let _ = writeln!(o, "  {:>7}  {}", r.count, r.reason);
        }
        o
    }
}

/// The pass/fail verdict of a run of `total` requests, `failed` of them failed: an error when
/// every request failed or when more than `max_failure_rate` of them did.
pub(crate) fn verdict(
    total: usize,
    failed: usize,
    max_failure_rate: f64,
) -> Result<(), LoadgenError> {
    if total > 0 && failed == total {
        return Err(LoadgenError::AllFailed { total });
    }
    if total > 0 && failed as f64 / total as f64 > max_failure_rate {
        return Err(LoadgenError::TooManyFailures {
            failed,
            total,
            max_rate: max_failure_rate,
        });
    }
    Ok(())
}

/// `--max-failure-rate`, shared by every run command.
#[derive(clap::Args, Clone, Debug)]
pub struct FailureArgs {
    /// Fail (exit non-zero) when more than this share of requests fails; a run where every
    /// request failed always fails.
    #[arg(long, default_value_t = DEFAULT_MAX_FAILURE_RATE)]
    pub max_failure_rate: f64,
}

impl FailureArgs {
    /// The validated share.
    pub fn max_failure_rate(&self) -> Result<f64, LoadgenError> {
        check_rate(self.max_failure_rate)
    }
}

/// `--max-failure-rate` must be a share in [0, 1].
pub(crate) fn check_rate(rate: f64) -> Result<f64, LoadgenError> {
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(LoadgenError::Config(
            "--max-failure-rate must be between 0 and 1".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_counted_most_frequent_first() {
        let f = [
            Failure::Http {
                status: 429,
                message: "rate limited".into(),
            },
            Failure::EmptyStream,
            Failure::Http {
                status: 429,
                message: "rate\n  limited".into(),
            },
            Failure::Http {
                status: 500,
                message: String::new(),
            },
        ];
        let s = FailureSummary::of(&f);
        assert_eq!(s.total, 4);
        let got: Vec<(&str, &str, Option<u16>, usize)> = s
            .by_reason
            .iter()
            .map(|r| (r.reason.as_str(), r.kind.as_str(), r.status, r.count))
            .collect();
        assert_eq!(
            got,
            [
                ("HTTP 429: rate limited", "http", Some(429), 2),
                ("HTTP 500", "http", Some(500), 1),
                ("empty stream", "empty_stream", None, 1),
            ]
        );
        let text = s.lines(10);
        assert!(
            text.starts_with("Failed requests: 4 of 10 (40.0%)"),
            "{text}"
        );
        assert!(text.contains("      2  HTTP 429: rate limited"), "{text}");
    }

    #[test]
    fn the_tail_of_many_reasons_is_one_entry() {
        let f: Vec<Failure> = (0..30)
            .map(|i| Failure::Server(format!("error {i}")))
            .collect();
        let s = FailureSummary::of(&f);
        assert_eq!(s.by_reason.len(), MAX_REASONS);
        let last = s.by_reason.last().expect("entries");
        assert_eq!((last.kind.as_str(), last.count), ("other", 11));
        assert_eq!(s.by_reason.iter().map(|r| r.count).sum::<usize>(), 30);
    }

    #[test]
    fn verdict_thresholds() {
        assert!(verdict(0, 0, 0.05).is_ok());
        assert!(verdict(100, 5, 0.05).is_ok());
        assert!(matches!(
            verdict(100, 6, 0.05),
            Err(LoadgenError::TooManyFailures {
                failed: 6,
                total: 100,
                ..
            })
        ));
        assert!(matches!(
            verdict(3, 3, 1.0),
            Err(LoadgenError::AllFailed { total: 3 })
        ));
        assert!(check_rate(1.5).is_err() && check_rate(-0.1).is_err());
    }

    #[test]
    fn old_http_failures_still_read() {
        let f: Failure =
            serde_json::from_str(r#"{"kind":"http","detail":{"status":500,"body":"x"}}"#)
                .expect("old shape");
        assert_eq!(
            f,
            Failure::Http {
                status: 500,
                message: "x".into()
            }
        );
    }
}
