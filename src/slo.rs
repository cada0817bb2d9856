//! Service-level objectives: the `--slo` grammar of `loadgen bench`, `mockserve replay` and
//! `mockserve plan` (`ttft=2000ms,tpot=50ms,e2e=10s`), and whether one request meets them.
//!
//! Keys: `ttft`; `itl` or `tpot` (the same bound: the request's mean inter-token latency, its
//! `itl_ms` record field; a request with one output token has none and meets it); `e2e` or
//! `e2el`; `trajectory_e2e` (alias `trajectory`), the end-to-end latency of the request's
//! trajectory in an agentic trace (its play: from the play's first dispatch to the end of its
//! last request, the report's `*_trajectory_e2e_latency_ms`). Values are in
//! [`crate::duration`]'s grammar, a bare number in ms.
//!
//! A request meets the objectives when it completed, meets each per-request bound that is set,
//! and, with `trajectory_e2e`, its play completed (every request of it) within that bound: a
//! request of a play that failed or ran too long misses, whatever its own latencies. A run
//! without trajectories (a plain Mooncake trace, synthetic load) cannot judge that bound;
//! [`Slo::check_trajectories`] refuses it there rather than ignore it.

use std::collections::HashMap;
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
    /// End-to-end latency of the request's trajectory (its agentic play, completed); left out
    /// of the JSON when not set, so reports without it keep their bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trajectory_e2e_ms: Option<f64>,
}

/// Per engine request id, the end-to-end latency (ms) of its trajectory when that trajectory
/// completed; requests of failed trajectories are absent.
pub type TrajectoryE2e = HashMap<u64, f64>;

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
    #[error("--slo: unknown objective {0:?} (ttft, itl or tpot, e2e, trajectory_e2e)")]
    Key(String),
    /// Nothing set.
    #[error("--slo: no objective given")]
    Empty,
    /// `trajectory_e2e` where the run has no trajectories.
    #[error(
        "--slo: trajectory_e2e bounds the plays (trajectories) of an agentic trace, and {0} has \
         none; drop it or replay an agentic trace"
    )]
    NoTrajectories(String),
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
                "trajectory_e2e" | "trajectory" => slo.trajectory_e2e_ms = Some(ms),
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
        self.ttft_ms.is_none()
            && self.itl_ms.is_none()
            && self.e2e_ms.is_none()
            && self.trajectory_e2e_ms.is_none()
    }

    /// Refuses a `trajectory_e2e` bound for a run without trajectories (`what` names it: `the
    /// trace x.jsonl`, `loadgen bench`), instead of ignoring it.
    pub fn check_trajectories(&self, has_trajectories: bool, what: &str) -> Result<(), SloError> {
        if self.trajectory_e2e_ms.is_some() && !has_trajectories {
            return Err(SloError::NoTrajectories(what.to_string()));
        }
        Ok(())
    }

    /// True when the request meets every objective set, `trajectories` giving its trajectory's
    /// end-to-end latency (None: the run has none, so a `trajectory_e2e` bound is missed).
    pub fn met_in(&self, r: &RequestRecord, trajectories: Option<&TrajectoryE2e>) -> bool {
        self.met_request(r)
            && self.trajectory_e2e_ms.is_none_or(|limit| {
                trajectories
                    .and_then(|t| t.get(&r.request_id))
                    .is_some_and(|&ms| ms <= limit)
            })
    }

    /// True when the request meets every objective set, with no trajectory known: a
    /// `trajectory_e2e` bound is missed (callers without trajectories refuse it first with
    /// [`Slo::check_trajectories`]).
    pub fn met(&self, r: &RequestRecord) -> bool {
        self.met_in(r, None)
    }

    /// The share and goodput of `records` under the objectives, over `duration_ms` of the run.
    pub fn figures(
        &self,
        records: &[RequestRecord],
        trajectories: Option<&TrajectoryE2e>,
        duration_ms: f64,
    ) -> SloFigures {
        let mut good_requests = 0;
        let mut good_tokens = 0u64;
        for r in records.iter().filter(|r| self.met_in(r, trajectories)) {
            good_requests += 1;
            good_tokens += r.output_length;
        }
        SloFigures {
            slo: *self,
            good_requests,
            num_requests: records.len(),
            slo_attainment: if records.is_empty() {
                0.0
            } else {
                good_requests as f64 / records.len() as f64
            },
            goodput_tok_s: if duration_ms > 0.0 {
                good_tokens as f64 / (duration_ms / 1000.0)
            } else {
                0.0
            },
        }
    }

    /// The per-request bounds (every one but the trajectory's).
    fn met_request(&self, r: &RequestRecord) -> bool {
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

/// How a run's requests fared under the objectives (the `slo` section of a replay report).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SloFigures {
    /// The objectives.
    pub slo: Slo,
    /// Requests meeting every objective.
    pub good_requests: usize,
    /// Requests in the run.
    pub num_requests: usize,
    /// `good_requests / num_requests` (0 without requests).
    pub slo_attainment: f64,
    /// Output tokens of the good requests per second of the run.
    pub goodput_tok_s: f64,
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
                e2e_ms: None,
                trajectory_e2e_ms: None,
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
        assert_eq!(
            err("p99=1s"),
            "--slo: unknown objective \"p99\" (ttft, itl or tpot, e2e, trajectory_e2e)"
        );
        assert_eq!(
            err("trajectory_e2e=soon"),
            "--slo: trajectory_e2e: \"soon\" is not a number of us, ms or s"
        );
        assert_eq!(err(""), "--slo: no objective given");
    }

    #[test]
    fn the_trajectory_bound_parses_and_serializes_only_when_set() {
        let slo: Slo = "ttft=2s,trajectory_e2e=120s".parse().unwrap();
        assert_eq!(slo.trajectory_e2e_ms, Some(120_000.0));
        assert_eq!(slo.ttft_ms, Some(2000.0));
        let alias: Slo = "trajectory=1500".parse().unwrap();
        assert_eq!(alias.trajectory_e2e_ms, Some(1500.0));
        assert!(!alias.is_empty());
        let json = serde_json::to_value(slo).unwrap();
        assert_eq!(json["trajectory_e2e_ms"], 120_000.0);
        let plain = serde_json::to_string(&"ttft=1s".parse::<Slo>().unwrap()).unwrap();
        assert_eq!(plain, r#"{"ttft_ms":1000.0,"itl_ms":null,"e2e_ms":null}"#);
    }

    fn record(id: u64, ttft_ms: f64, output_length: u64) -> RequestRecord {
        RequestRecord {
            request_id: id,
            session_id: None,
            turn_index: 0,
            worker: Some(0),
            arrival_ms: 0.0,
            first_admit_ms: Some(0.0),
            first_token_ms: Some(ttft_ms),
            last_token_ms: Some(ttft_ms + 10.0),
            finish_ms: Some(ttft_ms + 10.0),
            ttft_ms: Some(ttft_ms),
            ttst_ms: None,
            e2e_latency_ms: Some(ttft_ms + 10.0),
            itl_ms: None,
            input_length: 16,
            output_length,
            max_output_tokens: output_length as usize,
            reused_input_tokens: 0,
            g2_reused_input_tokens: 0,
            kv_transfer_ms: None,
            status: RequestStatus::Completed,
        }
    }

    #[test]
    fn a_request_meets_the_trajectory_bound_only_through_its_completed_play() {
        let slo: Slo = "ttft=100ms,trajectory_e2e=1s".parse().unwrap();
        // Request 0: its play took 900 ms; 1: its play took 1.2 s; 2: its play failed (absent);
        // 3: within its play's bound but late on its own TTFT.
        let plays: TrajectoryE2e = [(0, 900.0), (1, 1200.0), (3, 500.0)].into();
        let records = [
            record(0, 50.0, 10),
            record(1, 50.0, 20),
            record(2, 50.0, 40),
            record(3, 150.0, 80),
        ];
        let met: Vec<bool> = records
            .iter()
            .map(|r| slo.met_in(r, Some(&plays)))
            .collect();
        assert_eq!(met, [true, false, false, false]);
        // No trajectories known: the bound is missed, never ignored.
        assert!(!slo.met(&records[0]));
        let f = slo.figures(&records, Some(&plays), 2000.0);
        assert_eq!((f.good_requests, f.num_requests), (1, 4));
        assert_eq!(f.slo_attainment, 0.25);
        assert_eq!(f.goodput_tok_s, 5.0);
        // Without the bound, trajectories change nothing.
        let per_request: Slo = "ttft=100ms".parse().unwrap();
        assert!(per_request.met(&records[2]));
        assert!(per_request.met_in(&records[2], Some(&plays)));
    }

    #[test]
    fn a_run_without_trajectories_refuses_the_bound() {
        let slo: Slo = "e2e=1s,trajectory_e2e=60s".parse().unwrap();
        assert_eq!(
            slo.check_trajectories(false, "the trace t.jsonl")
                .unwrap_err()
                .to_string(),
            "--slo: trajectory_e2e bounds the plays (trajectories) of an agentic trace, and the \
             trace t.jsonl has none; drop it or replay an agentic trace"
        );
        assert!(slo.check_trajectories(true, "x").is_ok());
        let e2e: Slo = "e2e=1s".parse().unwrap();
        assert!(e2e.check_trajectories(false, "x").is_ok());
    }
}
