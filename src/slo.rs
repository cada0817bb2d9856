//! Service-level objectives: the `--slo` grammar of `loadgen bench`, `mockserve replay` and
//! `mockserve plan` (`ttft=2000ms,tpot=50ms,e2e=10s`), and whether one request meets them.
//!
//! Keys: `ttft`; `itl` or `tpot` (the same bound: the request's mean inter-token latency, its
//! `itl_ms` record field; a request with one output token has none and meets it); `e2e` or
//! `e2el`. Values are in [`crate::duration`]'s grammar, a bare number in ms.

use std::str::FromStr;

use serde::Serialize;

use crate::duration::{parse_ms, DurationError, Unit};
use crate::metrics::{RequestRecord, RequestStatus};

/// Service-level objectives (ms); a request meets them when it completed and meets every one
/// that is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// The request's mean inter-token latency (TPOT).
    pub itl_ms: Option<f64>,
    /// End-to-end latency.
    pub e2e_ms: Option<f64>,
}

/// Why an `--slo` value was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SloError {
    /// A part is not `key=value`.
    #[error("--slo: expected key=value, got {0:?}")]
    Part(String),
    /// A value is not a duration.
    #[error("--slo: {key}: {error}")]
    Duration {
        /// The objective's key.
        key: String,
        /// What is wrong with its value.
        error: DurationError,
    },
    /// An unknown key.
    #[error("--slo: unknown objective {0:?} (ttft, itl or tpot, e2e)")]
    Key(String),
    /// Nothing set.
    #[error("--slo: no objective given")]
    Empty,
}

impl FromStr for Slo {
    type Err = SloError;

    fn from_str(s: &str) -> Result<Slo, SloError> {
        let mut slo = Slo::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| SloError::Part(part.to_string()))?;
            let key = k.trim();
            let ms = parse_ms(v, Some(Unit::Millis)).map_err(|error| SloError::Duration {
                key: key.to_string(),
                error,
            })?;
            match key {
                "ttft" => slo.ttft_ms = Some(ms),
                "itl" | "tpot" => slo.itl_ms = Some(ms),
                "e2e" | "e2el" => slo.e2e_ms = Some(ms),
                other => return Err(SloError::Key(other.to_string())),
            }
        }
        if slo.is_empty() {
            return Err(SloError::Empty);
        }
        Ok(slo)
    }
}

impl Slo {
    /// True when no bound is set.
    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.itl_ms.is_none() && self.e2e_ms.is_none()
    }

    /// True when the request completed and meets every objective set.
    pub fn met(&self, r: &RequestRecord) -> bool {
        let within = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
            (None, _) => true,
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
        };
        r.status == RequestStatus::Completed
            && within(self.ttft_ms, r.ttft_ms)
            && (self.itl_ms.is_none() || r.itl_ms.is_none_or(|v| Some(v) <= self.itl_ms))
            && within(self.e2e_ms, r.e2e_latency_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loadgen_grammar_parses() {
        let slo: Slo = "ttft=2000ms,tpot=50ms".parse().unwrap();
        assert_eq!(
            slo,
            Slo {
                ttft_ms: Some(2000.0),
                itl_ms: Some(50.0),
                e2e_ms: None
            }
        );
        let slo: Slo = "ttft=2s, itl=500us, e2el=10".parse().unwrap();
        assert_eq!(slo.ttft_ms, Some(2000.0));
        assert_eq!(slo.itl_ms, Some(0.5));
        assert_eq!(slo.e2e_ms, Some(10.0));
        assert!(!slo.is_empty() && Slo::default().is_empty());
    }

    #[test]
    fn bad_objectives_name_the_part() {
        let err = |s: &str| s.parse::<Slo>().unwrap_err().to_string();
        assert_eq!(err("ttft"), "--slo: expected key=value, got \"ttft\"");
        assert_eq!(
            err("ttft=-1ms"),
            "--slo: ttft: \"-1ms\" must be a finite duration >= 0"
        );
        assert_eq!(
            err("ttft=fast"),
            "--slo: ttft: \"fast\" is not a number of us, ms or s"
        );
        assert!(err("p99=1s").contains("unknown objective \"p99\""));
        assert_eq!(err(""), "--slo: no objective given");
    }
}
