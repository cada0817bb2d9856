//! `loadgen calibrate TRACE`: the simulator's prediction put beside a measurement, request by
//! request. The live side is a `loadgen replay` of TRACE (against `--url`, or the embedded
//! mockserve without it) or the per-request records of one (`--records FILE`); the offline
//! side is servesim's replay of the same trace with the same engine flags (the embedded
//! server's, which also time the offline replay). Requests are matched by trace request, and
//! per metric (TTFT, ITL, E2E, cached tokens, trajectory E2E of an agentic trace's plays) the
//! report gives MAPE, signed bias, Pearson r, the two-sample KS statistic and p-value and the
//! TOST equivalence verdict at `--margin`, after a warm-up and by load level.
//!
//! Fit, then gate: with `--fit-profile PATH` the offline side is timed by a profile fitted on
//! the live target first, from a live run of another trace (`--fit FIT_TRACE`, or its records
//! with `--fit-records`) or from `loadgen profile`'s probe workload (no `--fit`).
//!
//! The modules: `stats` (the formulas), `records` (records read, keyed and matched), `report`
//! (the figures and the console table), `html` (the scatter and CDF page) and `fit` (the fit
//! run, kept apart from the gate trace).

mod fit;
mod html;
mod records;
mod report;
mod spread;
mod stats;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;

use clap::{Args, Parser as _};
use serde_json::{json, Value};
use servesim::replay::{replay as offline_replay, replay_graph, GraphReplay, ReplayConfig};
use servesim::trace::{self, Trace, TraceFormat};

use crate::error::LoadgenError;
use crate::replay::ReplayArgs;
use records::Rec;
use report::{Calibration, Settings};

/// `loadgen calibrate` flags: `loadgen replay`'s (the trace, the target, the embedded server's
/// engine flags, which also set up the offline replay), plus the comparison's.
#[derive(Args, Clone, Debug)]
pub struct CalibrateArgs {
    /// The live replay's flags. `--report-json` and `--html` are the calibration report's;
    /// `--per-request-jsonl` keeps the live run's records (for a later `--records`).
    #[command(flatten)]
    pub replay: ReplayArgs,

    /// Read the live side from the per-request records of a run of TRACE (`loadgen replay
    /// --per-request-jsonl`, or `mockserve replay`'s) instead of running it.
    #[arg(long, value_name = "PATH")]
    pub records: Option<PathBuf>,

    /// TOST equivalence margin: measured/predicted must lie within 1 ± margin (0 to 1, above
    /// 0).
    #[arg(long, default_value_t = 0.1)]
    pub margin: f64,

    /// Requests arriving (on the trace's schedule, sped up) before this are left out: `30s`,
    /// `500ms` or seconds.
    #[arg(long, default_value = "0s", value_parser = parse_warmup_ms)]
    pub warmup: f64,

    /// Load-level windows after the warm-up (equal spans of the arrival schedule), 0 to 100.
    #[arg(long, default_value_t = 4)]
    pub windows: usize,

    /// Fit, then gate: fit a latency profile of the live target, write it to PATH (mocker
    /// .npz, with its .json and .svg beside it), and time the offline side with it instead of
    /// the engine's latency model (`--perf-profile PATH`, speed-up ratios 1). Fitted from a
    /// live run of `--fit FIT_TRACE`; without `--fit`, from `loadgen profile`'s own probe
    /// workload. No request of TRACE goes into the fit either way.
    #[arg(long, value_name = "PATH")]
    pub fit_profile: Option<PathBuf>,

    /// The trace the profile is fitted on (with `--fit-profile`): run live against the same
    /// target before the gate run, its per-request records give prefill times and decode
    /// steps. It must not be TRACE nor share a request with it.
    #[arg(long, value_name = "FIT_TRACE")]
    pub fit: Option<PathBuf>,

    /// With `--fit`: read the fit run from these per-request records of a run of FIT_TRACE
    /// (`loadgen replay --per-request-jsonl`, or `mockserve replay`'s) instead of running it.
    #[arg(long, value_name = "PATH")]
    pub fit_records: Option<PathBuf>,

    /// Run the live side K times, the embedded engine's `--seed` (and the offline replay's)
    /// stepped by one each time; the spread of the measured means across them is reported
    /// beside each error (1 to 100).
    #[arg(long, default_value_t = 1)]
    pub seeds: usize,

    /// Exit with status 4 (after the report) unless TOST passes, mean and p90, on every gated
    /// metric: TTFT, ITL, E2E and, for agentic traces, trajectory E2E (cached tokens are
    /// reported, not gated). With `--seeds K`, the first run's verdicts.
    #[arg(long)]
    pub gate: bool,

    /// The prediction's own spread: replay the trace offline K more times, each arrival moved
    /// later by a seeded uniform draw below `--jitter-ms` (a live request's path moves it about
    /// that much), and report each statistic's range across them beside the measured ratio
    /// (Mooncake traces; 0 to 100).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub jitter_draws: usize,

    /// With `--jitter-draws`: the bound of each arrival's move, in ms of the sped-up schedule
    /// (above 0, at most 1000) [default: 1].
    #[arg(long, value_name = "MS")]
    pub jitter_ms: Option<f64>,
}

/// The metrics `--gate` holds to their TOST verdict, by report key.
const GATED: [&str; 4] = ["ttft", "itl", "e2e", "trajectory_e2e"];

/// `--warmup`: `30s`, `500ms`, or a plain number of seconds; in ms.
fn parse_warmup_ms(s: &str) -> Result<f64, String> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (s, 1000.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v * scale),
        _ => Err(format!(
            "expected a duration such as 30s, 500ms or 12.5 (seconds), at least 0; got {s:?}"
        )),
    }
}

impl CalibrateArgs {
    /// Checks the flags before anything runs.
    pub fn check(&self) -> Result<(), LoadgenError> {
        self.replay.check()?;
        if self.replay.slo.is_some() {
            return Err(LoadgenError::Config(
                "--slo counts goodput in loadgen replay; calibrate compares latencies, not SLOs"
                    .into(),
            ));
        }
        if !(self.margin > 0.0 && self.margin < 1.0) {
            return Err(LoadgenError::OutOfRange {
                flag: "--margin".into(),
                got: self.margin.to_string(),
                allowed: "above 0 and below 1".into(),
            });
        }
        if self.windows > 100 {
            return Err(LoadgenError::OutOfRange {
                flag: "--windows".into(),
                got: self.windows.to_string(),
                allowed: "0 to 100".into(),
            });
        }
        if !(1..=100).contains(&self.seeds) {
            return Err(LoadgenError::OutOfRange {
                flag: "--seeds".into(),
                got: self.seeds.to_string(),
                allowed: "1 to 100".into(),
            });
        }
        if self.jitter_draws > 100 {
            return Err(LoadgenError::OutOfRange {
                flag: "--jitter-draws".into(),
                got: self.jitter_draws.to_string(),
                allowed: "0 to 100".into(),
            });
        }
        if let Some(ms) = self.jitter_ms {
            if !(ms > 0.0 && ms <= 1000.0) {
                return Err(LoadgenError::OutOfRange {
                    flag: "--jitter-ms".into(),
                    got: ms.to_string(),
                    allowed: "above 0, at most 1000".into(),
                });
            }
            if self.jitter_draws == 0 {
                return Err(LoadgenError::Config(
                    "--jitter-ms sets the moves of --jitter-draws K: give K too".into(),
                ));
            }
        }
        if self.records.is_some() && self.seeds > 1 {
            return Err(LoadgenError::Config(
                "--seeds runs the live side several times; --records reads one run".into(),
            ));
        }
        fit::check_flags(
            self.fit.as_ref(),
            self.fit_records.as_ref(),
            self.fit_profile.as_ref(),
        )?;
        if self.records.is_some() && self.fit_profile.is_some() && self.fit.is_none() {
            return Err(LoadgenError::Config(
                "--fit-profile measures the live target (with loadgen profile, without --fit); \
                 with --records nothing is measured (fit on another trace's run with --fit \
                 FIT_TRACE --fit-records R, or time the offline side with --perf-profile)"
                    .into(),
            ));
        }
        if self.fit_profile.is_some() && self.replay.run.target.engine.perf_profile.is_some() {
            return Err(LoadgenError::Config(
                "--fit-profile writes the offline side's profile; --perf-profile names one: \
                 give one of them"
                    .into(),
            ));
        }
        if self.replay.run.runs.num_runs > 1 {
            return Err(LoadgenError::Config(
                "--num-runs is not for calibrate: --seeds K repeats the live side".into(),
            ));
        }
        Ok(())
    }
}

/// The result of `loadgen calibrate`.
#[derive(Debug)]
pub struct CalibrateRun {
    /// The report as written to `--report-json`.
    pub json: Value,
    /// Live requests that failed (counted and excluded).
    pub failed_live: usize,
    /// Live records in all.
    pub live_records: usize,
}

/// Runs `loadgen calibrate`: the live side (or its records), the offline replay, the report
/// printed and written. A live run whose failures exceed `--max-failure-rate` is an error after
/// the report is written.
pub async fn calibrate(args: &CalibrateArgs) -> Result<CalibrateRun, LoadgenError> {
    args.check()?;
    let path = args.replay.trace.file();
    let format = trace::detect_format(path, args.replay.trace.format)?;
    let agentic = format != TraceFormat::Mooncake;
    if agentic && args.jitter_draws > 0 {
        return Err(LoadgenError::Config(format!(
            "--jitter-draws moves a Mooncake trace's arrivals; {} is an agentic trace ({})",
            path.display(),
            format.name()
        )));
    }
    let jitter_ms = args.jitter_ms.unwrap_or(DEFAULT_JITTER_MS);
    let trace_name = path.display().to_string();
    let base_seed = args.replay.run.target.engine.seed;
    let settings = Settings {
        margin: args.margin,
        warmup_ms: args.warmup,
        windows: args.windows,
        seed: base_seed,
    };
    let fitted = match (&args.fit, &args.fit_profile) {
        (Some(fit_trace), Some(path)) => {
            Some(fit::fit(&args.replay, fit_trace, args.fit_records.as_deref(), path).await?)
        }
        (None, Some(path)) => {
            fit_profile(args, path).await?;
            None
        }
        _ => None,
    };
    let mut runs: Vec<(Calibration, usize)> = Vec::with_capacity(args.seeds);
    let mut draws = Vec::with_capacity(args.jitter_draws);
    for k in 0..args.seeds {
        let mut side = args.replay.clone();
        side.run.target.engine.seed = base_seed.wrapping_add(k as u64);
        let mut offline_side = side.clone();
        if let Some(path) = &args.fit_profile {
            let engine = &mut offline_side.run.target.engine;
            engine.perf_profile = Some(path.clone());
            engine.speedup_ratio = 1.0;
            engine.decode_speedup_ratio = 1.0;
        }
        let offline = offline_records(&offline_side, format, None)?;
        let live = match &args.records {
            Some(file) => records::read(file)?,
            None => live_records(&side, k, args.seeds).await?,
        };
        if k == 0 && args.jitter_draws > 0 {
            // Read once; each draw moves its own copy.
            let unmoved = crate::replay::load_trace(&offline_side)?;
            for d in 0..args.jitter_draws {
                let trace = spread::jittered(&unmoved, jitter_ms, base_seed.wrapping_add(d as u64));
                let moved = offline_records(&offline_side, format, Some(&trace))?;
                let matched = records::match_up(moved, live.clone(), &trace_name)?;
                draws.push(report::predicted(&matched, &settings));
            }
        }
        let matched = records::match_up(offline, live, &trace_name)?;
        let failed = matched.failed_live;
        runs.push((report::calibrate(&matched, &settings, agentic), failed));
    }
    let (first, failed_live) = &runs[0];
    let live_name = match (&args.records, &args.replay.run.target.url) {
        (Some(f), _) => format!("records {}", f.display()),
        (None, Some(url)) => url.clone(),
        (None, None) => "the embedded mockserve".into(),
    };
    let mut json = json!({
        "trace": trace_name,
        "trace_format": format.name(),
        "live": live_name,
        "arrival_speedup_ratio": args.replay.trace.arrival_speedup_ratio,
        "margin": args.margin,
        "fit_profile": args.fit_profile.as_ref().map(|p| p.display().to_string()),
        "gate_trace": trace_name,
        "fit": fitted.as_ref().map(|f| f.json.clone()),
        "warmup_ms": args.warmup,
        "bias_definition": "mean(measured) / mean(predicted) - 1",
        "mape_definition": "mean(|predicted - measured| / measured), measured > 0",
        "tost_definition": "90% percentile bootstrap interval (paired resampling, seeded) of \
                            stat(measured) / stat(predicted) within [1 - margin, 1 + margin], \
                            for stat = mean and p90",
        "bootstrap": {"resamples": stats::BOOTSTRAP_RESAMPLES, "confidence": 0.9, "seed": base_seed},
        "counts": first.counts,
        "live_path": first.live_path,
        "metrics": first.metrics,
        "load_levels": first.windows,
    });
    let offline_name = match (&args.fit_profile, &args.fit) {
        (Some(p), Some(f)) => format!(
            "servesim replay timed by the profile {} fitted on {}",
            p.display(),
            f.display()
        ),
        (Some(p), None) => format!(
            "servesim replay timed by the fitted profile {}",
            p.display()
        ),
        _ => "servesim replay with the engine flags given".into(),
    };
    let mut text = format!(
        "loadgen calibrate: {trace_name} ({}), live: {}, offline: {offline_name}\n",
        format.name(),
        json["live"].as_str().unwrap_or_default()
    );
    text.push_str(&report::console(first, &settings));
    if !draws.is_empty() {
        let section = spread::section(first, &draws, jitter_ms, base_seed);
        text.push_str(&spread::lines(&section, &report::METRICS));
        json["offline_spread"] = section;
    }
    if runs.len() > 1 {
        let seeds = seed_spread(&runs, base_seed);
        text.push_str(&seed_lines(&seeds));
        json["seeds"] = seeds;
    }
    crate::stdout::print(&text);
    if let Some(path) = &args.replay.run.report.report_json {
        write_json(path, &json)?;
        crate::stdout::outln!("Saved calibration report to {}", path.display());
    }
    if let Some(path) = &args.replay.run.observe.html {
        html::write(path, &json, first)?;
        crate::stdout::outln!("Saved HTML report to {}", path.display());
    }
    let live_records = json["counts"]["live_records"].as_u64().unwrap_or(0) as usize;
    crate::run::failure::verdict(
        live_records,
        *failed_live,
        args.replay.run.failures.max_failure_rate,
    )?;
    if args.gate {
        gate(first, agentic, args.margin)?;
    }
    Ok(CalibrateRun {
        json,
        failed_live: *failed_live,
        live_records,
    })
}

/// `--gate`: an error naming every gated metric whose TOST verdict failed, or that has no
/// figures at all (trajectory E2E is gated on agentic traces only).
fn gate(run: &Calibration, agentic: bool, margin: f64) -> Result<(), LoadgenError> {
    let gated = GATED
        .iter()
        .filter(|key| agentic || **key != "trajectory_e2e");
    let failed: Vec<String> = gated
        .clone()
        .filter(|key| !run.metrics.get(**key).is_some_and(|m| m.tost_pass))
        .map(|key| key.to_string())
        .collect();
    if !failed.is_empty() {
        return Err(LoadgenError::GateFailed { failed, margin });
    }
    let names: Vec<&str> = gated.copied().collect();
    crate::stdout::outln!("Gate: TOST at ±{margin} passes on {}", names.join(", "));
    Ok(())
}

/// The `seeds` section: per metric the bias and MAPE of each seed's run, the spread of the
/// measured means across the runs (`(max - min) / mean` of the per-run measured means), and
/// whether the first run's |bias| is below that spread (an error the runs cannot tell apart
/// from run-to-run noise).
fn seed_spread(runs: &[(Calibration, usize)], base_seed: u64) -> Value {
    let mut metrics = BTreeMap::new();
    for (key, _, _) in report::METRICS {
        let Some(first) = runs[0].0.metrics.get(key) else {
            continue;
        };
        let per: Vec<&report::Figures> = runs.iter().filter_map(|r| r.0.metrics.get(key)).collect();
        let means: Vec<f64> = per.iter().map(|f| f.measured.mean).collect();
        let avg = means.iter().sum::<f64>() / means.len() as f64;
        let (lo, hi) = means
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &m| {
                (a.min(m), b.max(m))
            });
        let spread = (avg > 0.0).then(|| (hi - lo) / avg);
        metrics.insert(
            key,
            json!({
                "bias": per.iter().map(|f| f.bias).collect::<Vec<_>>(),
                "mape": per.iter().map(|f| f.mape).collect::<Vec<_>>(),
                "measured_mean": means,
                "spread": spread,
                "error_below_spread": match (first.bias, spread) {
                    (Some(b), Some(s)) => Some(b.abs() < s),
                    _ => None,
                },
            }),
        );
    }
    json!({
        "k": runs.len(),
        "engine_seeds": (0..runs.len() as u64).map(|k| base_seed.wrapping_add(k)).collect::<Vec<_>>(),
        "metrics": metrics,
    })
}

/// The seed section on the console.
fn seed_lines(seeds: &Value) -> String {
    let mut out = format!(
        "Across {} live runs (engine seeds {}): spread of the measured mean beside the first \
         run's bias\n",
        seeds["k"], seeds["engine_seeds"]
    );
    for (key, name, _) in report::METRICS {
        let m = &seeds["metrics"][key];
        if m.is_null() {
            continue;
        }
        let spread = m["spread"]
            .as_f64()
            .map_or("-".into(), |s| format!("{:.1}%", 100.0 * s));
        let bias = m["bias"][0]
            .as_f64()
            .map_or("-".into(), |b| format!("{:+.1}%", 100.0 * b));
        let flag = if m["error_below_spread"] == true {
            "  (error below the run-to-run spread: not resolved)"
        } else {
            ""
        };
        out.push_str(&format!(
            "  {name:<15} bias {bias:>7}  spread {spread:>6}{flag}\n"
        ));
    }
    out
}

fn write_json(path: &std::path::Path, json: &Value) -> Result<(), LoadgenError> {
    let io = |source| LoadgenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = serde_json::to_vec_pretty(json)
        .map_err(|e| LoadgenError::Calibrate(format!("report JSON: {e}")))?;
    bytes.push(b'\n');
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&bytes).map_err(io)
}

/// `--fit-profile PATH`: `loadgen profile` of the live target (the `--url`, or the embedded
/// server with the engine flags), its profile written to PATH.
async fn fit_profile(args: &CalibrateArgs, path: &std::path::Path) -> Result<(), LoadgenError> {
    let output = path.display().to_string();
    let cli = crate::Cli::try_parse_from(["loadgen", "profile", "--output", &output, "--quiet"])
        .map_err(|e| LoadgenError::Config(format!("--fit-profile {output}: {e}")))?;
    let crate::Command::Profile(mut profile) = cli.command else {
        return Err(LoadgenError::Config(
            "--fit-profile: not a profile command".into(),
        ));
    };
    profile.target = args.replay.run.target.clone();
    crate::stdout::outln!("Fitting a profile of the live target to {output} (loadgen profile)");
    crate::profile::profile(&profile).await.map(|_| ())
}

/// `--jitter-ms` when not given.
const DEFAULT_JITTER_MS: f64 = 1.0;

/// The offline replay of the trace with the engine flags of `args`: its per-request records.
/// `moved`: a Mooncake trace already loaded (with its arrivals moved, [`spread::jittered`]) to
/// replay instead of reading the file.
fn offline_records(
    args: &ReplayArgs,
    format: TraceFormat,
    moved: Option<&Trace>,
) -> Result<Vec<Rec>, LoadgenError> {
    let cluster = args.run.target.engine.cluster_config()?;
    let offline_err = |e: servesim::replay::ReplayError| {
        LoadgenError::Calibrate(format!("the offline replay failed: {e}"))
    };
    let outcome = if format == TraceFormat::Mooncake {
        let loaded;
        let trace = match moved {
            Some(trace) => trace,
            None => {
                loaded = crate::replay::load_trace(args)?;
                &loaded
            }
        };
        let config = ReplayConfig {
            cluster,
            trace_block_size: args.trace.block_size,
        };
        offline_replay(trace, &config, |_, _| {}).map_err(offline_err)?
    } else {
        let graph = crate::replay::load_graph(args, format)?;
        let config = ReplayConfig {
            cluster,
            trace_block_size: graph.block_size,
        };
        let how = GraphReplay {
            speedup: args.trace.arrival_speedup_ratio,
            lanes: args.trace.agentic_lanes.map(|l| l as usize),
        };
        replay_graph(&graph, &config, &how, |_, _| {}, &mut ()).map_err(offline_err)?
    };
    let labels = outcome
        .agentic
        .as_ref()
        .map(servesim::replay::AgenticReport::request_labels)
        .unwrap_or_default();
    let values = outcome.records.iter().map(|r| {
        let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
        if let Some(label) = labels.get(&r.request_id) {
            v["agentic"] = label.clone();
        }
        v
    });
    records::of_values(values, "offline")
}

/// The live side: `loadgen replay` of the trace, quietly; its records.
async fn live_records(args: &ReplayArgs, k: usize, of: usize) -> Result<Vec<Rec>, LoadgenError> {
    let mut live = args.clone();
    live.run.report.report_json = None;
    live.run.report.quiet = true;
    live.run.observe.html = None;
    if of > 1 {
        crate::stdout::outln!(
            "Live run {} of {} (engine seed {})",
            k + 1,
            of,
            live.run.target.engine.seed
        );
        if let (Some(p), true) = (&args.run.report.per_request_jsonl, k > 0) {
            // Each seed's records in a file of its own: RECORDS.seedK.
            let mut name = p.as_os_str().to_owned();
            name.push(format!(".seed{k}"));
            live.run.report.per_request_jsonl = Some(PathBuf::from(name));
        }
    }
    let runs = crate::replay::replay_with(&live, false).await?;
    let run = crate::harness::first(runs)?;
    let values = run
        .live
        .records
        .iter()
        .map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
    records::of_values(values, "live")
}

#[cfg(test)]
mod tests {
    use super::parse_warmup_ms;

    #[test]
    fn warmup_takes_seconds_and_milliseconds() {
        assert_eq!(parse_warmup_ms("30s"), Ok(30_000.0));
        assert_eq!(parse_warmup_ms("500ms"), Ok(500.0));
        assert_eq!(parse_warmup_ms("1.5"), Ok(1_500.0));
        assert!(parse_warmup_ms("-1s").unwrap_err().contains("got \"-1s\""));
        assert!(parse_warmup_ms("soon").is_err());
    }
}
