//! One trial: a candidate's replay, its goodput under the SLOs, and (when asked) the highest
//! arrival speed-up at which it still meets them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Parser;
use serde::{Deserialize, Serialize};
use servesim::replay::{
    replay_graph, replay_with, Ended, GraphReplay, ReplayConfig, ReplayOptions, StopRule, Stopped,
};
use servesim::slo::Slo;
use servesim::trace::{self, RequestGraph, Trace, TraceFormat, TraceOptions};

use crate::cmd::replay::ReplayArgs;

/// The report keys a trial keeps: every latency statistic of TTFT, TPOT, ITL and E2E.
const STATS: &[&str] = &["mean", "min", "max", "median", "p75", "p90", "p95", "p99"];
const METRICS: &[&str] = &["ttft", "tpot", "itl", "e2e_latency"];

/// A trial's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Output tokens per simulated second of the requests meeting every bound.
    pub goodput_tok_s: f64,
    /// `goodput_tok_s` over the candidate's GPUs.
    pub goodput_per_gpu_tok_s: f64,
    /// Share of the requests meeting every bound.
    pub slo_attainment: f64,
    /// Requests meeting every bound.
    pub good_requests: u64,
    /// Requests in the trace (or its prefix).
    pub num_requests: u64,
    /// Requests completed.
    pub completed_requests: u64,
    /// Requests the engine never ran.
    pub rejected_requests: u64,
    /// Output tokens per simulated second, all requests.
    pub output_throughput_tok_s: f64,
    /// Output tokens per second one user sees: 1000 / mean TPOT.
    pub tok_s_per_user: f64,
    /// Latest completion (simulated ms).
    pub duration_ms: f64,
    /// The highest `--arrival-speedup-ratio` found meeting the SLOs at the attainment (None:
    /// not measured, or not met even at the lowest tried).
    pub max_speedup: Option<f64>,
    /// The replay report's latency statistics (`p90_ttft_ms`, ...).
    pub report: BTreeMap<String, f64>,
}

/// Where and why a trial stopped once its SLO was lost: it has no figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopNote {
    /// The simulated instant of the stop (ms).
    pub at_ms: f64,
    /// Requests in the trace (or its prefix).
    pub num_requests: u64,
    /// Requests ended (finished or rejected) by then.
    pub ended_requests: u64,
    /// Requests known to miss the SLOs by then.
    pub missed_requests: u64,
    /// The 1-based trace line of the request whose miss lost the SLO.
    pub line: usize,
    /// The highest share of requests the whole run could have had meeting the SLOs: all but
    /// those that had missed (below the attainment).
    pub attainment_at_most: f64,
}

/// How a trial ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// It ran to the end.
    Figures(Figures),
    /// It stopped once its SLO was lost (`reason` says where and why).
    Stopped {
        /// The figures of the stop.
        note: StopNote,
        /// The reason, in words.
        reason: String,
    },
}

/// The stop of a replay, in the ledger's words.
fn stop_outcome(s: &Stopped, attainment: f64) -> Outcome {
    let at_most = s.attainment_at_most();
    let reason = format!(
        "SLO lost at {:.3} s (simulated), {} of {} requests ended: the request of trace line {} \
         (session {}, turn {}) was the {} to miss the SLOs ({}); with {} missed by then, at most \
         {:.2}% of requests can meet them, below the attainment {}%. Stopped early \
         (--no-early-stop runs it in full)",
        s.time.as_millis_f64() / 1000.0,
        s.ended,
        s.requests,
        s.line,
        s.session,
        s.turn,
        ordinal(s.nth),
        s.miss,
        s.missed,
        at_most * 100.0,
        attainment * 100.0,
    );
    Outcome::Stopped {
        note: StopNote {
            at_ms: s.time.as_millis_f64(),
            num_requests: s.requests as u64,
            ended_requests: s.ended as u64,
            missed_requests: s.missed as u64,
            line: s.line,
            attainment_at_most: at_most,
        },
        reason,
    }
}

/// 1st, 2nd, 3rd, 4th, 11th, 21st, ...
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// A trace loaded once per (arrival speed-up, prefix) and shared by the trials.
enum Loaded {
    Sessions(Trace),
    Graph(RequestGraph),
}

/// What a loaded trace depends on: its path, arrival speed-up (bits), block size, and format,
/// schedule bound and prefix (as text).
type TraceKey = (PathBuf, u64, usize, String);

/// Traces by their load options; each trial asks for one.
#[derive(Default)]
pub struct TraceCache {
    loaded: Mutex<HashMap<TraceKey, Arc<Loaded>>>,
}

impl TraceCache {
    fn get(&self, args: &ReplayArgs, prefix: Option<usize>) -> Result<Arc<Loaded>, String> {
        let t = &args.trace;
        let key = (
            t.file().to_path_buf(),
            t.arrival_speedup_ratio.to_bits(),
            t.block_size,
            format!(
                "{:?}{}{prefix:?}{}",
                t.format,
                t.allow_long_schedule,
                super::args::input_key(args)
            ),
        );
        if let Some(hit) = self.loaded.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(hit);
        }
        let bound = trace::ScheduleBound::of_flag(t.allow_long_schedule);
        let options = TraceOptions {
            trace_block_size: t.block_size,
            arrival_speedup_ratio: t.arrival_speedup_ratio,
        };
        let synthetic = super::args::synthetic_trace(args, prefix)?;
        let format = match &synthetic {
            Some(_) => TraceFormat::Mooncake,
            None => trace::detect_format(t.file(), t.format).map_err(|e| e.to_string())?,
        };
        let loaded = match format {
            TraceFormat::Mooncake => {
                let mut trace = match synthetic {
                    Some(trace) => trace,
                    None => trace::load_with_bound(t.file(), &options, bound)
                        .map_err(|e| e.to_string())?,
                };
                if let Some(k) = prefix {
                    trace.sessions.truncate(k);
                }
                Loaded::Sessions(trace)
            }
            format => {
                if prefix.is_some() {
                    return Err("halving needs a Mooncake trace (prefixes of sessions)".into());
                }
                let graph =
                    trace::load_graph(t.file(), format, t.block_size).map_err(|e| e.to_string())?;
                graph
                    .check_schedule(
                        &t.file().display().to_string(),
                        t.arrival_speedup_ratio,
                        bound,
                    )
                    .map_err(|e| e.to_string())?;
                Loaded::Graph(graph)
            }
        };
        let loaded = Arc::new(loaded);
        if let Ok(mut m) = self.loaded.lock() {
            m.insert(key, loaded.clone());
        }
        Ok(loaded)
    }

    /// Sessions of the trace (its requests for an agentic one), at the given flags.
    pub fn sessions(&self, args: &ReplayArgs) -> Result<usize, String> {
        Ok(match &*self.get(args, None)? {
            Loaded::Sessions(t) => t.sessions.len(),
            Loaded::Graph(g) => g.nodes.len(),
        })
    }
}

/// The replay arguments of a command line (`mockserve replay ...` words after `replay`).
pub fn parse_replay(words: &[String]) -> Result<ReplayArgs, String> {
    let argv = ["mockserve", "replay"]
        .into_iter()
        .map(String::from)
        .chain(words.iter().cloned());
    match crate::Cli::try_parse_from(argv) {
        Ok(crate::Cli {
            command: Some(crate::Command::Replay(args)),
            ..
        }) => Ok(*args),
        Ok(_) => Err("not a replay command".into()),
        Err(e) => Err(e.render().to_string().trim().to_string()),
    }
}

/// What one trial measures.
#[derive(Clone, Copy)]
pub struct Settings<'a> {
    /// The bounds.
    pub slo: &'a Slo,
    /// The share that must meet them for the speed-up search.
    pub attainment: f64,
    /// Bisection steps of the speed-up search (0: none).
    pub speedup_steps: u32,
    /// Which replays (of a Mooncake trace) stop once the attainment is out of reach.
    pub early_stop: EarlyStop,
    /// Run each replay on its own thread alone (the trials already use every core given).
    pub one_thread: bool,
}

/// Which replays stop once the attainment is out of reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EarlyStop {
    /// None: every replay runs to the end.
    Off,
    /// The steps of the speed-up search (they only need a yes or no); trials run in full.
    Steps,
    /// Trials too: a trial below the attainment is recorded as stopped, without figures.
    Trials,
}

/// One replay's figures (no speed-up search), or its stop when `stop`.
fn once(
    args: &ReplayArgs,
    gpus: u64,
    prefix: Option<usize>,
    (settings, stop): (&Settings, bool),
    cache: &TraceCache,
) -> Result<Outcome, String> {
    let slo = settings.slo;
    let cluster = args.engine.cluster_config().map_err(|e| e.to_string())?;
    let loaded = cache.get(args, prefix)?;
    let outcome = match &*loaded {
        Loaded::Sessions(trace) => {
            let config = ReplayConfig {
                cluster,
                trace_block_size: super::args::trace_block_size(args),
            };
            let options = ReplayOptions {
                stop: stop.then_some(StopRule {
                    slo: *slo,
                    attainment: settings.attainment,
                }),
                one_thread: settings.one_thread,
            };
            match replay_with(trace, &config, &options) {
                Ok(Ended::Complete(outcome)) => Ok(*outcome),
                Ok(Ended::Stopped(s)) => return Ok(stop_outcome(&s, settings.attainment)),
                Err(e) => Err(e),
            }
        }
        Loaded::Graph(graph) => {
            let config = ReplayConfig {
                cluster,
                trace_block_size: graph.block_size,
            };
            let how = GraphReplay {
                speedup: args.trace.arrival_speedup_ratio,
                lanes: args.trace.agentic_lanes.map(|l| l as usize),
            };
            replay_graph(graph, &config, &how, |_, _| {}, &mut ())
        }
    };
    let outcome = outcome.map_err(|e| e.to_string())?;
    let report = &outcome.report;
    if report.completed_requests == 0 && report.num_requests > 0 {
        return Err(format!(
            "no request completed: {} of {} were rejected by the engine",
            report.rejected_requests, report.num_requests
        ));
    }
    // An agentic trace's requests meet a trajectory bound through their plays.
    let trajectories = outcome
        .agentic
        .as_ref()
        .map(|a| a.trajectory_e2e_by_request());
    let good: Vec<_> = outcome
        .records
        .iter()
        .filter(|r| slo.met_in(r, trajectories.as_ref()))
        .collect();
    let good_tokens: u64 = good.iter().map(|r| r.output_length).sum();
    let duration_s = report.duration_ms / 1000.0;
    let goodput = if duration_s > 0.0 {
        good_tokens as f64 / duration_s
    } else {
        0.0
    };
    let json = serde_json::to_value(report).map_err(|e| e.to_string())?;
    let mut stats = BTreeMap::new();
    for stat in STATS {
        for metric in METRICS {
            let key = format!("{stat}_{metric}_ms");
            if let Some(v) = json.get(&key).and_then(serde_json::Value::as_f64) {
                stats.insert(key, v);
            }
        }
    }
    let num = |k: &str| {
        json.get(k)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    let mean_tpot = num("mean_tpot_ms");
    Ok(Outcome::Figures(Figures {
        goodput_tok_s: goodput,
        goodput_per_gpu_tok_s: goodput / gpus.max(1) as f64,
        slo_attainment: if report.num_requests > 0 {
            good.len() as f64 / report.num_requests as f64
        } else {
            0.0
        },
        good_requests: good.len() as u64,
        num_requests: report.num_requests,
        completed_requests: report.completed_requests,
        rejected_requests: report.rejected_requests,
        output_throughput_tok_s: num("output_throughput_tok_s"),
        tok_s_per_user: if mean_tpot > 0.0 {
            1000.0 / mean_tpot
        } else {
            0.0
        },
        duration_ms: report.duration_ms,
        max_speedup: None,
        report: stats,
    }))
}

/// Runs a candidate in full (its speed-up steps may stop early): [`evaluate`]'s figures.
pub fn run(
    words: &[String],
    gpus: u64,
    prefix: Option<usize>,
    settings: &Settings,
    cache: &TraceCache,
) -> Result<Figures, String> {
    let full = Settings {
        early_stop: settings.early_stop.min(EarlyStop::Steps),
        ..*settings
    };
    match evaluate(words, gpus, prefix, &full, cache)? {
        Outcome::Figures(f) => Ok(f),
        Outcome::Stopped { reason, .. } => Err(reason),
    }
}

/// Evaluates a candidate: its figures at the trace's rate (on a prefix of `prefix` sessions
/// when given), then, on the whole trace, the speed-up search; or, with early stop, where its
/// SLO was lost.
pub fn evaluate(
    words: &[String],
    gpus: u64,
    prefix: Option<usize>,
    settings: &Settings,
    cache: &TraceCache,
) -> Result<Outcome, String> {
    let mut args = parse_replay(words)?;
    let stop_trial = settings.early_stop == EarlyStop::Trials;
    let stop_step = settings.early_stop != EarlyStop::Off;
    let mut figures = match once(&args, gpus, prefix, (settings, stop_trial), cache)? {
        Outcome::Figures(f) => f,
        // A stopped candidate's highest speed-up is not searched: it misses at its own rate.
        stopped @ Outcome::Stopped { .. } => return Ok(stopped),
    };
    if prefix.is_some() || settings.speedup_steps == 0 {
        return Ok(Outcome::Figures(figures));
    }
    let base = args.trace.arrival_speedup_ratio;
    let meets = |args: &mut ReplayArgs, ratio: f64| -> Result<bool, String> {
        args.trace.arrival_speedup_ratio = ratio;
        Ok(
            match once(args, gpus, None, (settings, stop_step), cache)? {
                Outcome::Figures(f) => f.slo_attainment >= settings.attainment,
                Outcome::Stopped { .. } => false,
            },
        )
    };
    // Doubling (or halving) from the trace's rate until the verdict flips, then geometric
    // bisection with the steps left.
    let mut steps = settings.speedup_steps;
    let (mut lo, mut hi) = if figures.slo_attainment >= settings.attainment {
        let mut lo = base;
        let mut hi = None;
        while steps > 0 && hi.is_none() {
            steps -= 1;
            let next = lo * 2.0;
            if meets(&mut args, next)? {
                lo = next;
            } else {
                hi = Some(next);
            }
        }
        (Some(lo), hi)
    } else {
        let mut hi = base;
        let mut lo = None;
        while steps > 0 && lo.is_none() {
            steps -= 1;
            let next = hi / 2.0;
            if meets(&mut args, next)? {
                lo = Some(next);
            } else {
                hi = next;
            }
        }
        (lo, Some(hi))
    };
    while steps > 0 {
        let (Some(l), Some(h)) = (lo, hi) else {
            break;
        };
        steps -= 1;
        let mid = (l * h).sqrt();
        if meets(&mut args, mid)? {
            lo = Some(mid);
        } else {
            hi = Some(mid);
        }
    }
    figures.max_speedup = lo;
    Ok(Outcome::Figures(figures))
}
