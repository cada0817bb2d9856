//! The judge of an elastic run: windows, attainment, GPU-seconds, the oracle and the regret
//! (defined in the parent module's doc).

use super::{AutoscaleError, AutoscaleReport, AutoscaleSettings, ScaleEvent, WindowSample};
use crate::metrics::RequestRecord;
use crate::replay::ReplayConfig;
use crate::slo::Slo;
use crate::time::{SimDuration, SimTime};
use crate::trace::Trace;

/// The share of a window's requests that must meet the SLO for it not to be in violation.
pub const ATTAINMENT_TARGET: f64 = 0.95;

/// When the last request ended (or arrived).
pub(super) fn run_end(records: &[RequestRecord]) -> SimTime {
    let ms = records
        .iter()
        .map(|r| r.finish_ms.unwrap_or(r.arrival_ms).max(r.arrival_ms))
        .fold(0.0f64, f64::max);
    SimTime::from_millis_f64(ms)
}

/// The judge's windows: `[k · len, (k + 1) · len)` up to the run's end.
pub(super) struct Windows {
    len: SimDuration,
    end: SimTime,
    count: usize,
}

impl Windows {
    pub(super) fn new(len: SimDuration, end: SimTime) -> Windows {
        let count = (end.as_nanos().div_ceil(len.as_nanos().max(1))).max(1) as usize;
        Windows { len, end, count }
    }

    fn start(&self, k: usize) -> SimTime {
        SimTime::from_nanos(self.len.as_nanos() * k as u64)
    }

    /// Seconds of window `k` within the run.
    fn seconds(&self, k: usize) -> f64 {
        let start = self.start(k).as_nanos();
        let stop = (start + self.len.as_nanos()).min(self.end.as_nanos().max(start));
        (stop - start) as f64 / 1e9
    }

    fn of(&self, arrival_ms: f64) -> usize {
        let ns = SimTime::from_millis_f64(arrival_ms.max(0.0)).as_nanos();
        ((ns / self.len.as_nanos().max(1)) as usize).min(self.count - 1)
    }

    /// Per window: (arrivals, of which met the SLO).
    pub(super) fn attainment(&self, records: &[RequestRecord], slo: &Slo) -> Vec<(usize, usize)> {
        let mut out = vec![(0usize, 0usize); self.count];
        for r in records {
            let k = self.of(r.arrival_ms);
            out[k].0 += 1;
            out[k].1 += usize::from(slo.met(r));
        }
        out
    }
}

fn share((n, met): (usize, usize)) -> f64 {
    if n == 0 {
        1.0
    } else {
        met as f64 / n as f64
    }
}

/// Per window, the fewest workers in `lo..=hi` whose static fleet meets the target there
/// (`hi` where none does), and whether it does.
pub(super) fn oracle_workers(
    trace: &Trace,
    config: &ReplayConfig,
    settings: &AutoscaleSettings,
    windows: &Windows,
    (lo, hi): (usize, usize),
) -> Result<Vec<(usize, bool)>, AutoscaleError> {
    let mut best: Vec<Option<usize>> = vec![None; windows.count];
    for n in lo..=hi {
        let mut cluster = config.cluster.clone();
        cluster.num_workers = n;
        let static_config = ReplayConfig {
            cluster,
            trace_block_size: config.trace_block_size,
        };
        let outcome = crate::replay::replay(trace, &static_config, |_, _| {})?;
        let attained = windows.attainment(&outcome.records, &settings.slo);
        for (k, a) in attained.iter().enumerate() {
            if best[k].is_none() && share(*a) >= ATTAINMENT_TARGET {
                best[k] = Some(n);
            }
        }
        if best.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(best
        .into_iter()
        .map(|b| b.map_or((hi, false), |n| (n, true)))
        .collect())
}

/// A run judged from its records and lifecycle, outside a replay (the live elastic fleet's,
/// read back in trace time): the same windows, figures and definitions as an elastic replay's,
/// without an oracle.
#[derive(Debug)]
pub struct RunSeries<'a> {
    /// The policy's name (`load`, `saturation`, `external`, `static`).
    pub policy: String,
    /// Every request, on the run's clock.
    pub records: &'a [RequestRecord],
    /// The objectives.
    pub slo: &'a Slo,
    /// The window length (the tick).
    pub tick: SimDuration,
    /// The mean model-load delay (the oscillation window).
    pub model_load: SimDuration,
    /// The fewest workers.
    pub min_workers: usize,
    /// GPUs held, at each change.
    pub gpus: &'a [(SimTime, usize)],
    /// Ready workers, at each change.
    pub ready: &'a [(SimTime, usize)],
    /// Every scale event.
    pub events: Vec<ScaleEvent>,
    /// Ticks at which the policy gave no answer.
    pub warnings: Vec<String>,
}

/// Judges a run given as [`RunSeries`]; it ends with its last request (later changes of its
/// series do not count), and the oracle's figures are None.
pub fn judge_run(run: RunSeries<'_>) -> AutoscaleReport {
    let end = run_end(run.records);
    let windows = Windows::new(run.tick, end);
    let attainment = windows.attainment(run.records, run.slo);
    judge(JudgeInput {
        policy: run.policy,
        windows: &windows,
        records: run.records,
        slo: run.slo,
        attainment: &attainment,
        gpus: run.gpus,
        ready: run.ready,
        oracle: None,
        model_load: run.model_load,
        min_workers: run.min_workers,
        events: run.events,
        warnings: run.warnings,
    })
}

pub(super) struct JudgeInput<'a> {
    pub(super) policy: String,
    pub(super) windows: &'a Windows,
    pub(super) records: &'a [RequestRecord],
    pub(super) slo: &'a Slo,
    pub(super) attainment: &'a [(usize, usize)],
    pub(super) gpus: &'a [(SimTime, usize)],
    pub(super) ready: &'a [(SimTime, usize)],
    pub(super) oracle: Option<&'a [(usize, bool)]>,
    pub(super) model_load: SimDuration,
    pub(super) min_workers: usize,
    pub(super) events: Vec<ScaleEvent>,
    pub(super) warnings: Vec<String>,
}

/// ∫ of a step series over `[a, b)`, in value-seconds.
fn integral(series: &[(SimTime, usize)], a: SimTime, b: SimTime) -> f64 {
    let mut total = 0.0;
    for (i, &(t, v)) in series.iter().enumerate() {
        let next = series
            .get(i + 1)
            .map_or(SimTime::from_nanos(u64::MAX), |s| s.0);
        let (s, e) = (t.max(a), next.min(b));
        if e > s {
            total += v as f64 * (e.as_nanos() - s.as_nanos()) as f64 / 1e9;
        }
    }
    total
}

/// The value of a step series at `t`.
fn value_at(series: &[(SimTime, usize)], t: SimTime) -> usize {
    series
        .iter()
        .take_while(|(at, _)| *at <= t)
        .last()
        .map_or(0, |s| s.1)
}

pub(super) fn judge(input: JudgeInput<'_>) -> AutoscaleReport {
    let w = input.windows;
    let end = w.end;
    let gpu_seconds = integral(input.gpus, SimTime::ZERO, end);
    let duration_s = end.as_nanos() as f64 / 1e9;
    let met = input.records.iter().filter(|r| input.slo.met(r)).count();
    let violated: Vec<bool> = input
        .attainment
        .iter()
        .map(|a| share(*a) < ATTAINMENT_TARGET)
        .collect();
    let violation_seconds = (0..w.count)
        .filter(|&k| violated[k])
        .map(|k| w.seconds(k))
        .fold(0.0, |a, b| a + b);
    // The oracle holds, in each window, the most workers of the windows that start within
    // the next model-load delay (it provisions ahead).
    let oracle_gpus: Option<Vec<usize>> = input.oracle.map(|o| {
        (0..w.count)
            .map(|k| {
                let horizon = w.start(k) + input.model_load;
                (k..w.count)
                    .take_while(|&j| w.start(j) <= horizon)
                    .map(|j| o[j].0)
                    .max()
                    .unwrap_or(0)
                    .max(input.min_workers)
            })
            .collect()
    });
    let (oracle_gpu_seconds, regret_gpu_seconds, regret_slo_seconds) =
        match (&oracle_gpus, input.oracle) {
            (Some(g), Some(o)) => {
                let oracle_total = (0..w.count)
                    .map(|k| g[k] as f64 * w.seconds(k))
                    .fold(0.0, |a, b| a + b);
                let regret_gpu: f64 = (0..w.count)
                    .map(|k| {
                        let run = integral(input.gpus, w.start(k), w.start(k + 1).min(end));
                        (run - g[k] as f64 * w.seconds(k)).max(0.0)
                    })
                    .fold(0.0, |a, b| a + b);
                let regret_slo: f64 = (0..w.count)
                    .filter(|&k| violated[k] && o[k].1)
                    .map(|k| w.seconds(k))
                    .fold(0.0, |a, b| a + b);
                (Some(oracle_total), Some(regret_gpu), Some(regret_slo))
            }
            _ => (None, None, None),
        };
    let reversal_window = input.model_load.as_nanos() as f64 * 2.0 / 1e9;
    let mut oscillations = 0;
    for (i, e) in input.events.iter().enumerate() {
        let prev = input.events[..i].iter().rev().find(|p| p.role == e.role);
        if let Some(p) = prev {
            let up = |x: &ScaleEvent| x.to > x.from;
            if up(p) != up(e) && e.time_s - p.time_s <= reversal_window {
                oscillations += 1;
            }
        }
    }
    let timeline = (0..w.count)
        .map(|k| {
            let (a, b) = (w.start(k), w.start(k + 1).min(end).max(w.start(k)));
            let secs = w.seconds(k);
            WindowSample {
                start_s: a.as_nanos() as f64 / 1e9,
                gpus: if secs > 0.0 {
                    integral(input.gpus, a, b) / secs
                } else {
                    value_at(input.gpus, a) as f64
                },
                ready: value_at(input.ready, b),
                request_rate: if secs > 0.0 {
                    input.attainment[k].0 as f64 / secs
                } else {
                    0.0
                },
                attainment: share(input.attainment[k]),
                oracle_workers: input.oracle.map(|o| o[k].0),
            }
        })
        .collect();
    AutoscaleReport {
        policy: input.policy,
        gpu_seconds,
        mean_gpus: if duration_s > 0.0 {
            gpu_seconds / duration_s
        } else {
            value_at(input.gpus, SimTime::ZERO) as f64
        },
        peak_gpus: input.gpus.iter().map(|g| g.1).max().unwrap_or(0),
        slo_attainment: if input.records.is_empty() {
            1.0
        } else {
            met as f64 / input.records.len() as f64
        },
        violation_seconds,
        scale_events: input.events.len(),
        oscillations,
        oracle_gpu_seconds,
        regret_gpu_seconds,
        regret_slo_seconds,
        duration_s,
        window_s: w.len.as_nanos() as f64 / 1e9,
        attainment_target: ATTAINMENT_TARGET,
        events: input.events,
        warnings: input.warnings,
        timeline,
    }
}
