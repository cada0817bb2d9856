//! The elastic fleet's lifecycle record: GPUs held and ready workers at each change, every
//! scale event and every tick a policy failed, on the wall clock ([`Recorder`], under the
//! lifecycle's lock), and the same in simulated seconds from the fleet's first request
//! ([`LifecycleLog`], `--lifecycle-log`). [`LifecycleLog::judge`] scores a run from it and a
//! client's per-request records with the judge of `mockserve replay --autoscale`
//! (`servesim::replay::autoscale::judge_run`): the same windows, figures and definitions, in
//! trace time.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use servesim::autoscale::PoolRole;
use servesim::metrics::RequestRecord;
use servesim::replay::autoscale::{judge_run, AutoscaleReport, RunSeries, ScaleEvent};
use servesim::slo::Slo;
use servesim::time::{SimDuration, SimTime};
use tokio::time::Instant;

/// What changed when, on the wall clock (kept under the lifecycle's lock).
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// GPUs held (loading, ready, draining workers) at each change.
    gpus: Vec<(Instant, usize)>,
    /// Ready workers at each change.
    ready: Vec<(Instant, usize)>,
    /// Desired-count changes: when, from, to.
    events: Vec<(Instant, usize, usize)>,
    /// Ticks at which the policy gave no answer.
    warnings: Vec<(Instant, String)>,
}

impl Recorder {
    /// The counts now (kept only when one changed).
    pub(crate) fn counts(&mut self, now: Instant, gpus: usize, ready: usize) {
        for (series, value) in [(&mut self.gpus, gpus), (&mut self.ready, ready)] {
            if series.last().map(|s| s.1) != Some(value) {
                series.push((now, value));
            }
        }
    }

    /// The desired count went from `from` to `to`.
    pub(crate) fn event(&mut self, now: Instant, from: usize, to: usize) {
        self.events.push((now, from, to));
    }

    /// A tick at which the fleet held.
    pub(crate) fn warning(&mut self, now: Instant, text: String) {
        self.warnings.push((now, text));
    }
}

/// The run's settings that the log carries (in simulated time).
#[derive(Clone, Debug)]
pub(crate) struct LogSettings {
    /// `load`, `saturation`, `external` or `manual` (scaled by `PUT /fleet/scale` only).
    pub policy: String,
    /// `--speedup-ratio`.
    pub speedup: f64,
    /// `--autoscale-tick` (the judge's window).
    pub tick: Duration,
    /// `--model-load` (the oscillation window).
    pub model_load: Duration,
    /// `--min-workers`.
    pub min: usize,
    /// `--max-workers`.
    pub max: usize,
}

/// One scale event of the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoggedEvent {
    /// Simulated seconds from the first request.
    pub time_s: f64,
    /// Workers asked for before.
    pub from: usize,
    /// Workers asked for after.
    pub to: usize,
}

/// The lifecycle of an elastic fleet in simulated seconds from its first request (the file
/// `--lifecycle-log` writes).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LifecycleLog {
    /// `load`, `saturation`, `external` or `manual`.
    pub policy: String,
    /// The simulated clock's speed-up over the wall clock (`--speedup-ratio`).
    pub speedup: f64,
    /// `--autoscale-tick`, seconds.
    pub tick_s: f64,
    /// `--model-load`, seconds.
    pub model_load_s: f64,
    /// `--min-workers`.
    pub min_workers: usize,
    /// `--max-workers`.
    pub max_workers: usize,
    /// Whether a request has come (before one, times count from the fleet's launch).
    pub started: bool,
    /// GPUs held at each change: `[time_s, gpus]`.
    pub gpus: Vec<(f64, usize)>,
    /// Ready workers at each change: `[time_s, ready]`.
    pub ready: Vec<(f64, usize)>,
    /// Every change of the desired count.
    pub events: Vec<LoggedEvent>,
    /// Ticks at which the policy gave no answer and the fleet held.
    pub warnings: Vec<String>,
}

/// Why a run cannot be judged from a log.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum LogError {
    /// The client's speed-up is not the fleet's.
    #[error(
        "the fleet runs at --speedup-ratio {fleet} but the requests were sent at \
         --arrival-speedup-ratio {client}: give both the same speed-up"
    )]
    Speedup {
        /// The fleet's.
        fleet: f64,
        /// The client's.
        client: f64,
    },
    /// No request was sent.
    #[error("no request to judge")]
    NoRequests,
}

impl LifecycleLog {
    /// The log of `recorder`, times from `zero` (the first request; the launch before one).
    pub(crate) fn of(
        recorder: &Recorder,
        settings: &LogSettings,
        zero: Instant,
        started: bool,
    ) -> LifecycleLog {
        let s = settings.speedup;
        let at = |t: Instant| t.saturating_duration_since(zero).as_secs_f64() * s;
        // Changes before the first request collapse onto 0, the last one holding.
        let series = |points: &[(Instant, usize)]| {
            let mut out: Vec<(f64, usize)> = Vec::new();
            for &(t, v) in points {
                let t = at(t);
                match out.last_mut() {
                    Some(last) if last.0 == t => last.1 = v,
                    _ => out.push((t, v)),
                }
            }
            out
        };
        LifecycleLog {
            policy: settings.policy.clone(),
            speedup: s,
            tick_s: settings.tick.as_secs_f64(),
            model_load_s: settings.model_load.as_secs_f64(),
            min_workers: settings.min,
            max_workers: settings.max,
            started,
            gpus: series(&recorder.gpus),
            ready: series(&recorder.ready),
            events: recorder
                .events
                .iter()
                .map(|&(t, from, to)| LoggedEvent {
                    time_s: at(t),
                    from,
                    to,
                })
                .collect(),
            warnings: recorder
                .warnings
                .iter()
                .map(|(t, w)| format!("t={:.0}s: {w}", at(*t)))
                .collect(),
        }
    }

    /// Judges a run of this fleet from a client's per-request records, taken at
    /// `arrival_speedup` (which must be the fleet's speed-up): every record's times are
    /// multiplied by the speed-up into trace time, and the fleet's clock (zero at its first
    /// request) is aligned with the first record's arrival. The oracle's figures are None: it
    /// needs offline static replays of the trace.
    pub fn judge(
        &self,
        records: &[RequestRecord],
        slo: &Slo,
        arrival_speedup: f64,
    ) -> Result<AutoscaleReport, LogError> {
        if (arrival_speedup - self.speedup).abs() > 1e-9 * self.speedup.max(1.0) {
            return Err(LogError::Speedup {
                fleet: self.speedup,
                client: arrival_speedup,
            });
        }
        let s = self.speedup;
        let records: Vec<RequestRecord> = records.iter().map(|r| in_trace_time(r, s)).collect();
        let first_ms = records
            .iter()
            .map(|r| r.arrival_ms)
            .min_by(f64::total_cmp)
            .ok_or(LogError::NoRequests)?;
        let offset_s = first_ms.max(0.0) / 1e3;
        let time = |t_s: f64| SimTime::from_millis_f64((t_s + offset_s) * 1e3);
        let series = |points: &[(f64, usize)]| {
            let mut out: Vec<(SimTime, usize)> =
                points.iter().map(|&(t, v)| (time(t), v)).collect();
            // The state at the first request held from the run's start.
            if let Some(first) = out.first_mut() {
                first.0 = SimTime::ZERO;
            }
            out
        };
        let gpus = series(&self.gpus);
        let ready = series(&self.ready);
        let events = self
            .events
            .iter()
            .map(|e| ScaleEvent {
                time_s: e.time_s + offset_s,
                role: PoolRole::Aggregated,
                from: e.from,
                to: e.to,
            })
            .collect();
        Ok(judge_run(RunSeries {
            policy: self.policy.clone(),
            records: &records,
            slo,
            tick: SimDuration::from_micros((self.tick_s * 1e6).round() as u64),
            model_load: SimDuration::from_micros((self.model_load_s * 1e6).round() as u64),
            min_workers: self.min_workers,
            gpus: &gpus,
            ready: &ready,
            events,
            warnings: self.warnings.clone(),
        }))
    }
}

/// `r` with every time and latency multiplied by `speedup`.
fn in_trace_time(r: &RequestRecord, speedup: f64) -> RequestRecord {
    let x = |v: Option<f64>| v.map(|v| v * speedup);
    RequestRecord {
        arrival_ms: r.arrival_ms * speedup,
        first_admit_ms: x(r.first_admit_ms),
        first_token_ms: x(r.first_token_ms),
        last_token_ms: x(r.last_token_ms),
        finish_ms: x(r.finish_ms),
        ttft_ms: x(r.ttft_ms),
        ttst_ms: x(r.ttst_ms),
        e2e_latency_ms: x(r.e2e_latency_ms),
        itl_ms: x(r.itl_ms),
        kv_transfer_ms: x(r.kv_transfer_ms),
        ..r.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::metrics::RequestStatus;

    fn record(arrival_ms: f64, ttft_ms: f64) -> RequestRecord {
        RequestRecord {
            request_id: 0,
            session_id: None,
            turn_index: 0,
            worker: None,
            arrival_ms,
            first_admit_ms: Some(arrival_ms),
            first_token_ms: Some(arrival_ms + ttft_ms),
            last_token_ms: Some(arrival_ms + ttft_ms),
            finish_ms: Some(arrival_ms + ttft_ms),
            ttft_ms: Some(ttft_ms),
            ttst_ms: None,
            e2e_latency_ms: Some(ttft_ms),
            itl_ms: None,
            input_length: 10,
            output_length: 1,
            max_output_tokens: 1,
            reused_input_tokens: 0,
            g2_reused_input_tokens: 0,
            kv_transfer_ms: None,
            status: RequestStatus::Completed,
        }
    }

    #[test]
    fn a_log_is_judged_in_trace_time() {
        let log = LifecycleLog {
            policy: "load".into(),
            speedup: 10.0,
            tick_s: 30.0,
            model_load_s: 240.0,
            min_workers: 1,
            max_workers: 2,
            started: true,
            gpus: vec![(0.0, 1), (30.0, 2)],
            ready: vec![(0.0, 1), (270.0, 2)],
            events: vec![LoggedEvent {
                time_s: 30.0,
                from: 1,
                to: 2,
            }],
            warnings: Vec::new(),
        };
        // Wall: arrivals at 0 and 5 s, TTFTs of 100 ms and 300 ms; in trace time 0 and 50 s,
        // 1 s and 3 s (the second misses a 2 s objective); the run ends at 53 s.
        let records = [record(0.0, 100.0), record(5_000.0, 300.0)];
        let slo: Slo = "ttft=2000ms".parse().expect("an SLO");
        let report = log.judge(&records, &slo, 10.0).expect("judged");
        assert_eq!(report.policy, "load");
        assert!((report.duration_s - 53.0).abs() < 1e-9);
        // 1 GPU for 30 s, then 2 for 23 s.
        assert!((report.gpu_seconds - 76.0).abs() < 1e-9);
        assert_eq!(report.peak_gpus, 2);
        assert_eq!(report.scale_events, 1);
        assert!((report.slo_attainment - 0.5).abs() < 1e-12);
        // The second window [30 s, 53 s) is in violation.
        assert!((report.violation_seconds - 23.0).abs() < 1e-9);
        assert_eq!(report.oracle_gpu_seconds, None);
        assert_eq!(
            log.judge(&records, &slo, 4.0)
                .expect_err("another speed-up"),
            LogError::Speedup {
                fleet: 10.0,
                client: 4.0
            }
        );
        assert_eq!(
            log.judge(&[], &slo, 10.0).expect_err("nothing sent"),
            LogError::NoRequests
        );
    }
}
