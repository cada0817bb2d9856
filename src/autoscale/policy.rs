//! What an autoscaling policy sees ([`Observation`]), what it answers ([`Decision`]) and the
//! [`Policy`] trait the three built-in policies and the external one implement.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A pool of workers that scales on its own: the whole fleet when aggregated, the prefill and
/// the decode pool of a disaggregated fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolRole {
    /// Aggregated workers (prefill and decode on the same worker).
    Aggregated,
    /// The prefill pool of a disaggregated fleet.
    Prefill,
    /// The decode pool of a disaggregated fleet.
    Decode,
}

impl fmt::Display for PoolRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolRole::Aggregated => "workers",
            PoolRole::Prefill => "prefill",
            PoolRole::Decode => "decode",
        })
    }
}

/// Where a worker is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Provisioned, loading the model: costs a GPU, takes no requests.
    Loading,
    /// Serving: the router sends it requests.
    Ready,
    /// Scaled down: takes no new requests, finishes its in-flight ones, then stops (its KV is
    /// lost).
    Draining,
}

/// One worker's metrics, as its `/metrics` would show them at the scrape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerObservation {
    /// Worker index in the fleet.
    pub id: u32,
    /// Its pool.
    pub role: PoolRole,
    /// Its lifecycle state.
    pub state: WorkerState,
    /// KV cache usage, 0..=1 (`vllm:kv_cache_usage_perc`).
    pub kv_usage: f64,
    /// Requests running (`vllm:num_requests_running`).
    pub running: usize,
    /// Requests waiting (`vllm:num_requests_waiting`).
    pub waiting: usize,
}

/// One pool's totals at the scrape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolObservation {
    /// The pool.
    pub role: PoolRole,
    /// The pool's current size: ready plus loading workers (draining ones are on their way
    /// out). A policy that answers this holds the pool as it is.
    pub current: usize,
    /// Workers serving.
    pub ready: usize,
    /// Workers loading the model.
    pub loading: usize,
    /// Workers draining.
    pub draining: usize,
    /// The least workers the pool may have.
    pub min: usize,
    /// The most workers the pool may have.
    pub max: usize,
    /// Mean KV usage over the ready workers (0 when none).
    pub kv_usage: f64,
    /// Requests running on the pool's workers.
    pub running: usize,
    /// Requests waiting at the pool's workers.
    pub waiting: usize,
}

/// What a policy sees at each tick: the fleet as scraped `scrape_delay` before the tick.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Virtual time of the scrape, seconds since the start.
    pub time_s: f64,
    /// Seconds since the previous scrape (the window of the rates below).
    pub interval_s: f64,
    /// Requests that arrived per second over the window.
    pub request_rate: f64,
    /// Mean prompt length of those requests (0 when none arrived).
    pub mean_isl: f64,
    /// Mean requested output length of those requests (0 when none arrived).
    pub mean_osl: f64,
    /// Requests queued: parked at the router plus waiting at every worker.
    pub queue: usize,
    /// Per pool, aggregated first or prefill then decode.
    pub pools: Vec<PoolObservation>,
    /// Per worker, in worker order (workers that are off are not listed).
    pub workers: Vec<WorkerObservation>,
}

impl Observation {
    /// The pool of `role`, if the fleet has one.
    pub fn pool(&self, role: PoolRole) -> Option<&PoolObservation> {
        self.pools.iter().find(|p| p.role == role)
    }

    /// The decision that keeps every pool at its current size.
    pub fn hold(&self) -> Decision {
        match (self.pool(PoolRole::Prefill), self.pool(PoolRole::Decode)) {
            (Some(p), Some(d)) => Decision::Disagg {
                prefill: p.current,
                decode: d.current,
            },
            _ => Decision::Workers(self.pools.first().map_or(0, |p| p.current)),
        }
    }
}

/// A policy's answer: the desired size of each pool (the driver clamps it to min..=max).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `{"workers": N}`: an aggregated fleet of N workers.
    Workers(usize),
    /// `{"prefill": P, "decode": D}`: a disaggregated fleet.
    Disagg {
        /// Prefill workers.
        prefill: usize,
        /// Decode workers.
        decode: usize,
    },
}

impl Decision {
    /// The desired count for `role` (None when the decision is for the other fleet shape).
    pub fn count(&self, role: PoolRole) -> Option<usize> {
        match (self, role) {
            (Decision::Workers(n), PoolRole::Aggregated) => Some(*n),
            (Decision::Disagg { prefill, .. }, PoolRole::Prefill) => Some(*prefill),
            (Decision::Disagg { decode, .. }, PoolRole::Decode) => Some(*decode),
            _ => None,
        }
    }

    /// The JSON line of the decision.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Decision::Workers(n) => serde_json::json!({ "workers": n }),
            Decision::Disagg { prefill, decode } => {
                serde_json::json!({ "prefill": prefill, "decode": decode })
            }
        }
    }

    /// Parses one answer line: `{"workers": N}` or `{"prefill": P, "decode": D}`, counts
    /// non-negative integers, no other keys.
    pub fn parse_line(line: &str) -> Result<Decision, String> {
        let value: serde_json::Value =
            serde_json::from_str(line.trim()).map_err(|e| format!("not JSON ({e})"))?;
        let obj = value
            .as_object()
            .ok_or_else(|| "not a JSON object".to_string())?;
        let count = |key: &str| -> Result<usize, String> {
            let v = obj.get(key).ok_or_else(|| format!("missing {key:?}"))?;
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| format!("{key:?} must be a non-negative integer, got {v}"))
        };
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        match keys.as_slice() {
            ["workers"] => Ok(Decision::Workers(count("workers")?)),
            ["decode", "prefill"] | ["prefill", "decode"] => Ok(Decision::Disagg {
                prefill: count("prefill")?,
                decode: count("decode")?,
            }),
            _ => Err(format!(
                "expected {{\"workers\": N}} or {{\"prefill\": P, \"decode\": D}}, got keys {keys:?}"
            )),
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

/// Why a policy gave no usable answer this tick; the driver then holds every pool at its
/// current size and reports the warning.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The external process did not answer within its timeout (it is stopped; every later tick
    /// holds).
    #[error("external policy did not answer within {timeout_ms} ms; holding the current count")]
    Timeout {
        /// The timeout.
        timeout_ms: u64,
    },
    /// The external process exited or closed its output.
    #[error("external policy exited ({status}); holding the current count")]
    Exited {
        /// Its exit status, or what is known of it.
        status: String,
    },
    /// An answer line could not be read as a decision.
    #[error("external policy answered {line:?}: {reason}; holding the current count")]
    Garbage {
        /// The line (cut to 200 characters).
        line: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The decision is for another fleet shape (`workers` for a disaggregated fleet, or the
    /// other way round).
    #[error("policy answered {decision} for {shape} fleet; holding the current count")]
    Shape {
        /// The answer.
        decision: Decision,
        /// `an aggregated` or `a disaggregated`.
        shape: &'static str,
    },
    /// The process could not be started or written to.
    #[error("external policy: {0}")]
    Io(String),
}

/// An autoscaling policy: one decision per tick, deterministic given its observations (the
/// external one as deterministic as its program).
pub trait Policy: Send {
    /// The policy's name for reports (`load`, `saturation`, `external`).
    fn name(&self) -> &'static str;
    /// The desired pool sizes given the fleet as observed.
    fn decide(&mut self, observation: &Observation) -> Result<Decision, PolicyError>;
}

/// Which policy `--autoscale` names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySpec {
    /// [`crate::autoscale::LoadPolicy`].
    Load,
    /// [`crate::autoscale::SaturationPolicy`].
    Saturation,
    /// [`crate::autoscale::ExternalPolicy`] running this shell command.
    External(String),
}

impl FromStr for PolicySpec {
    type Err = String;

    fn from_str(s: &str) -> Result<PolicySpec, String> {
        match s.trim() {
            "load" => Ok(PolicySpec::Load),
            "saturation" => Ok(PolicySpec::Saturation),
            other => match other.strip_prefix("external:") {
                Some(cmd) if !cmd.trim().is_empty() => Ok(PolicySpec::External(cmd.to_string())),
                Some(_) => Err("external:CMD needs a command after the colon".into()),
                None => Err(format!(
                    "unknown autoscale policy {other:?} (load, saturation or external:CMD)"
                )),
            },
        }
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicySpec::Load => f.write_str("load"),
            PolicySpec::Saturation => f.write_str("saturation"),
            PolicySpec::External(cmd) => write!(f, "external:{cmd}"),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An aggregated observation with `ready` workers at `kv` usage and `waiting` each.
    pub(crate) fn observation(ready: usize, kv: f64, waiting: usize, rate: f64) -> Observation {
        Observation {
            time_s: 60.0,
            interval_s: 30.0,
            request_rate: rate,
            mean_isl: 1000.0,
            mean_osl: 100.0,
            queue: waiting * ready,
            pools: vec![PoolObservation {
                role: PoolRole::Aggregated,
                current: ready,
                ready,
                loading: 0,
                draining: 0,
                min: 1,
                max: 16,
                kv_usage: kv,
                running: ready,
                waiting: waiting * ready,
            }],
            workers: (0..ready as u32)
                .map(|id| WorkerObservation {
                    id,
                    role: PoolRole::Aggregated,
                    state: WorkerState::Ready,
                    kv_usage: kv,
                    running: 1,
                    waiting,
                })
                .collect(),
        }
    }

    #[test]
    fn decisions_parse_from_answer_lines() {
        assert_eq!(
            Decision::parse_line(r#"{"workers": 3}"#),
            Ok(Decision::Workers(3))
        );
        assert_eq!(
            Decision::parse_line(r#" {"decode": 4, "prefill": 2} "#),
            Ok(Decision::Disagg {
                prefill: 2,
                decode: 4
            })
        );
        assert!(Decision::parse_line("3")
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(Decision::parse_line("hello")
            .unwrap_err()
            .contains("not JSON"));
        assert!(Decision::parse_line(r#"{"workers": -1}"#)
            .unwrap_err()
            .contains("non-negative integer"));
        assert!(Decision::parse_line(r#"{"workers": 1.5}"#).is_err());
        assert!(Decision::parse_line(r#"{"prefill": 1}"#)
            .unwrap_err()
            .contains("expected"));
        assert!(Decision::parse_line(r#"{"workers": 1, "extra": 2}"#).is_err());
        assert_eq!(
            Decision::Disagg {
                prefill: 1,
                decode: 2
            }
            .to_string(),
            r#"{"decode":2,"prefill":1}"#
        );
    }

    #[test]
    fn observations_round_trip_as_json_and_hold_their_counts() {
        let obs = observation(3, 0.5, 2, 4.0);
        let line = serde_json::to_string(&obs).unwrap();
        assert!(line.contains(r#""role":"aggregated""#));
        assert!(line.contains(r#""state":"ready""#));
        let back: Observation = serde_json::from_str(&line).unwrap();
        assert_eq!(back, obs);
        assert_eq!(obs.hold(), Decision::Workers(3));
    }

    #[test]
    fn policy_specs_parse() {
        assert_eq!("load".parse(), Ok(PolicySpec::Load));
        assert_eq!("saturation".parse(), Ok(PolicySpec::Saturation));
        assert_eq!(
            "external:python3 x.py --a".parse(),
            Ok(PolicySpec::External("python3 x.py --a".into()))
        );
        assert!("external:"
            .parse::<PolicySpec>()
            .unwrap_err()
            .contains("needs a command"));
        assert!("hpa".parse::<PolicySpec>().unwrap_err().contains("unknown"));
    }
}
