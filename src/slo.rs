//! Service-level objectives: the `--slo` grammar of `loadgen bench` and `mockserve plan`
//! (`ttft=2000ms,tpot=50ms,e2e=10s`), and whether one request meets them.
//!
//! A request is good when it completed and meets every bound set. `itl` and `tpot` name the
//! same bound: the request's mean inter-token latency (its `itl_ms` record field, the TPOT); a
//! request with one output token has none and meets it.

use std::str::FromStr;

use serde::Serialize;

use crate::metrics::{RequestRecord, RequestStatus};

/// Service-level objectives (ms); a request is good when it succeeded and meets every one set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Slo {
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// The request's mean inter-token latency.
    pub itl_ms: Option<f64>,
    /// End-to-end latency.
    pub e2e_ms: Option<f64>,
}

/// A duration in `ms` (the default unit), `us` or `s`, finite and at least 0.
fn parse_ms(v: &str) -> Option<f64> {
    let (num, scale) = if let Some(x) = v.strip_suffix("ms") {
        (x, 1.0)
    } else if let Some(x) = v.strip_suffix("us") {
        (x, 1e-3)
    } else if let Some(x) = v.strip_suffix('s') {
        (x, 1e3)
    } else {
        (v, 1.0)
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .map(|x| x * scale)
}

impl FromStr for Slo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {part:?}"))?;
            let ms = parse_ms(v.trim()).ok_or_else(|| format!("bad duration {v:?}"))?;
            match k.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "itl" | "tpot" => slo.itl_ms = Some(ms),
                "e2e" | "e2el" => slo.e2e_ms = Some(ms),
                other => return Err(format!("unknown SLO {other:?} (ttft, itl, e2e)")),
            }
        }
        Ok(slo)
    }
}

impl Slo {
    /// True when no bound is set.
    pub fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.itl_ms.is_none() && self.e2e_ms.is_none()
    }

    /// True when the request completed and meets every objective.
    pub fn met(&self, r: &RequestRecord) -> bool {
        let ok = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
            (None, _) => true,
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
        };
        r.status == RequestStatus::Completed
            && ok(self.ttft_ms, r.ttft_ms)
            && (self.itl_ms.is_none()
                || r.itl_ms
                    .is_none_or(|v| v <= self.itl_ms.unwrap_or(f64::INFINITY)))
            && ok(self.e2e_ms, r.e2e_latency_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_units_and_errors() {
        let slo: Slo = "ttft=200ms,itl=50ms,e2e=10s".parse().expect("valid");
        assert_eq!(
            slo,
            Slo {
                ttft_ms: Some(200.0),
                itl_ms: Some(50.0),
                e2e_ms: Some(10_000.0)
            }
        );
        let slo: Slo = "tpot=500us, ttft=2".parse().expect("valid");
        assert_eq!((slo.ttft_ms, slo.itl_ms), (Some(2.0), Some(0.5)));
        assert!(!slo.is_empty() && Slo::default().is_empty());
        assert_eq!(
            "ttft=fast".parse::<Slo>(),
            Err("bad duration \"fast\"".into())
        );
        assert!("foo=1ms".parse::<Slo>().unwrap_err().contains("foo"));
        assert!("ttft".parse::<Slo>().unwrap_err().contains("key=value"));
        assert!("ttft=-1ms".parse::<Slo>().is_err());
    }
}
