//! `loadgen sweep`: `bench` over a list of load points (`--concurrency 1,2,4` closed loop, or
//! `--request-rate 1,2,4` open loop), or a search for the highest load that still meets the SLO
//! (`--find-max-goodput`: a geometric ramp up to the first point that breaks the SLO or
//! saturates, then bisection between the last good and the first bad point).
//!
//! Every point runs the same workload (`bench`'s flags; `--num-requests` / `--duration` are the
//! budget of each point) on one connected target, each with its own seed (the base seed plus
//! the point's index) so that no point finds the previous one's prompts in the prefix cache.
//! A point stops early when the server is clearly over capacity ([`Overload`]: errors, or the
//! TTFT of successive requests growing without bound); its requests still in flight are
//! cancelled. A point is *saturated* ([`Point::saturation`]) when it stopped early, when an open
//! loop achieved less than [`RATE_SHORTFALL`] of its offered rate, when the failure share
//! passes `--max-failure-rate`, or when a closed loop's throughput grew by less than
//! [`MIN_GAIN`] over a smaller point's. The *knee* ([`knee`]) is the point of the highest
//! goodput when there is an SLO, else the last point before the first saturated one.

mod point;
mod saturation;

pub use point::{LoadPoint, Point};
pub use saturation::{
    knee, saturation, ttft_growth, Overload, MIN_GAIN, OVERLOAD_MIN_REQUESTS, OVERLOAD_TTFT_GROWTH,
    RATE_SHORTFALL,
};

use std::sync::{Arc, Mutex};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::bench::{self, BenchArgs, BenchPlan};
use crate::error::LoadgenError;
use crate::harness::{self, Mode, Report, Settings};
use crate::limits;
use crate::observe::Observed;
use crate::run::driver::RunHooks;
use crate::run::driver::{Observer, Sample};
use crate::run::target::Connected;
use crate::run::target::EmbeddedOptions;
use mock_server::args::ReportArgs;

/// Default share of requests that must meet the SLO for a point to be good.
pub const DEFAULT_MIN_ATTAINMENT: f64 = 0.9;

/// `loadgen sweep` flags: the load points or the search, on top of `bench`'s workload flags.
#[derive(Args, Clone, Debug)]
#[command(
    mut_arg("concurrency", |a| a
        .long("max-concurrency")
        .help("Open-loop points: at most this many requests in flight")),
    mut_arg("request_rate", |a| a.long("bench-request-rate").hide(true)),
)]
pub struct SweepArgs {
    /// Closed-loop points: these concurrencies, e.g. 1,2,4,8.
    #[arg(long = "concurrency", value_delimiter = ',', id = "sweep_concurrency")]
    pub concurrencies: Vec<usize>,

    /// Open-loop points: these request rates (req/s), e.g. 1,2,4,8.
    #[arg(
        long = "request-rate",
        value_delimiter = ',',
        id = "sweep_request_rate"
    )]
    pub request_rates: Vec<f64>,

    /// Replay points: this Mooncake trace, replayed once per --arrival-speedup-ratio value (on
    /// a fresh embedded server each time; --num-requests keeps the first rows).
    #[arg(long, value_name = "PATH")]
    pub trace: Option<std::path::PathBuf>,

    /// Replay points: arrival speed-ups of --trace, e.g. 1,2,4,8.
    #[arg(long = "arrival-speedup-ratio", value_delimiter = ',')]
    pub arrival_speedups: Vec<f64>,

    /// Prompt tokens per trace hash id (replay points), 1 to 2^20.
    #[arg(long, default_value_t = 512)]
    pub trace_block_size: usize,

    /// Replay points: replay --trace even when its sped-up schedule exceeds seven days.
    #[arg(long)]
    pub allow_long_schedule: bool,

    /// Search the highest load whose requests meet --slo (at least --min-attainment of them)
    /// without saturating: a geometric ramp from --search-start, then bisection.
    #[arg(long)]
    pub find_max_goodput: bool,

    /// What --find-max-goodput varies.
    #[arg(long, value_enum, default_value_t = SearchAxis::RequestRate)]
    pub search_axis: SearchAxis,

    /// First load of the search (req/s or concurrency).
    #[arg(long, default_value_t = 1.0)]
    pub search_start: f64,

    /// Factor between two loads of the search's ramp.
    #[arg(long, default_value_t = 2.0)]
    pub search_factor: f64,

    /// Bisection steps after the ramp.
    #[arg(long, default_value_t = 3)]
    pub search_steps: usize,

    /// Most points the search runs (ramp and bisection together).
    #[arg(long, default_value_t = 16)]
    pub max_points: usize,

    /// Share of requests that must meet --slo for a point to be good.
    #[arg(long, default_value_t = DEFAULT_MIN_ATTAINMENT)]
    pub min_attainment: f64,

    /// The workload of every point (`bench`'s flags).
    #[command(flatten)]
    pub bench: BenchArgs,
}

/// The load a search varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchAxis {
    /// Open loop, requests per second.
    RequestRate,
    /// Closed loop, requests in flight.
    Concurrency,
}

/// What a sweep runs.
#[derive(Clone, Debug, PartialEq)]
pub enum SweepMode {
    /// These points, in order.
    List(Vec<LoadPoint>),
    /// The search for the highest load meeting the SLO.
    Search {
        /// Rate or concurrency.
        axis: SearchAxis,
        /// First load.
        start: f64,
        /// Ramp factor.
        factor: f64,
        /// Bisection steps.
        steps: usize,
        /// Most points.
        max_points: usize,
    },
}

/// A validated sweep.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    /// Points or search.
    pub mode: SweepMode,
    /// The workload of every point (its load replaced per point).
    pub base: BenchPlan,
    /// Share of requests that must meet the SLO.
    pub min_attainment: f64,
    /// Replay points' flags (the trace, the target), the speed-up set per point.
    pub replay: Option<crate::replay::ReplayArgs>,
}

impl SweepArgs {
    /// Validates the flags.
    pub fn plan(&self) -> Result<SweepPlan, LoadgenError> {
        let bad = |m: &str| Err(LoadgenError::Config(m.to_string()));
        if self.bench.request_rate.is_some() {
            return bad("sweep takes its rates as --request-rate R1,R2,...");
        }
        if self.bench.run.observe.max_server_lateness.is_some() {
            return bad("--max-server-lateness judges one bench or replay run, not a sweep");
        }
        if self.bench.run.runs.num_runs != 1 {
            return bad("--num-runs repeats one bench, replay or multiturn run; a sweep runs each point once");
        }
        let sharding = &self.bench.run.sharding;
        if sharding.shard.is_some() || sharding.start_at.is_some() {
            return bad("--shard and --start-at split one bench, replay or multiturn run over several processes; a sweep runs in one process");
        }
        if self.find_max_goodput {
            // Checked first: a bad start would otherwise be reported as the base plan's rate.
            let start_max = match self.search_axis {
                SearchAxis::RequestRate => limits::MAX_REQUEST_RATE,
                SearchAxis::Concurrency => limits::MAX_CONCURRENCY as f64,
            };
            limits::positive("--search-start", self.search_start, start_max)?;
        }
        // The base plan is validated with the first open-loop rate, so that open-loop flags
        // (--arrival, --burstiness) are checked as bench checks them.
        let mut bench = self.bench.clone();
        bench.request_rate = match (self.request_rates.first(), self.search_axis) {
            (Some(&r), _) => Some(r),
            (None, SearchAxis::RequestRate) if self.find_max_goodput => Some(self.search_start),
            _ => None,
        };
        let base = bench.plan()?;
        if !(self.min_attainment > 0.0 && self.min_attainment <= 1.0) {
            return bad("--min-attainment must be in (0, 1]");
        }
        let lists = (!self.concurrencies.is_empty()) as u8
            + (!self.request_rates.is_empty()) as u8
            + (!self.arrival_speedups.is_empty()) as u8
            + self.find_max_goodput as u8;
        if lists != 1 {
            return bad("give exactly one of --concurrency LIST, --request-rate LIST, --trace with --arrival-speedup-ratio LIST, --find-max-goodput");
        }
        if self.trace.is_some() == self.arrival_speedups.is_empty() {
            return bad("--trace and --arrival-speedup-ratio go together");
        }
        let replay = self.trace.as_ref().map(|trace| crate::replay::ReplayArgs {
            trace: mock_server::args::TraceArgs {
                path: Some(trace.clone()),
                format: servesim::trace::TraceFormat::Auto,
                arrival_speedup_ratio: 1.0,
                agentic_lanes: None,
                block_size: self.trace_block_size,
                allow_long_schedule: self.allow_long_schedule,
            },
            max_requests: self.bench.num_requests,
            max_in_flight: self.bench.concurrency,
            session_mode: crate::replay::SessionMode::Auto,
            endpoint: self.bench.endpoint,
            rate_profile: None,
            fleet_lifecycle: None,
            slo: None,
            run: crate::harness::RunArgs {
                report: crate::observe::quiet(),
                observe: crate::observe::ObserveArgs {
                    no_scrape_metrics: true,
                    ..Default::default()
                },
                failures: self.bench.run.failures.clone(),
                target: self.bench.run.target.clone(),
                sharding: Default::default(),
                runs: crate::harness::repeat::RepeatArgs {
                    num_runs: 1,
                    lora_mix: self.bench.run.runs.lora_mix.clone(),
                },
            },
        });
        let mode = if !self.arrival_speedups.is_empty() {
            limits::count(
                "--arrival-speedup-ratio (points)",
                self.arrival_speedups.len(),
                1,
                limits::MAX_SWEEP_POINTS,
            )?;
            for &x in &self.arrival_speedups {
                limits::arrival_speedup(x)?;
            }
            limits::trace_block_size(self.trace_block_size)?;
            SweepMode::List(
                self.arrival_speedups
                    .iter()
                    .map(|&x| LoadPoint::ArrivalSpeedup(x))
                    .collect(),
            )
        } else if self.find_max_goodput {
            if base.slo.is_none() {
                return bad("--find-max-goodput needs --slo (e.g. ttft=500ms,itl=50ms)");
            }
            if !(self.search_factor > 1.0 && self.search_factor <= limits::MAX_SEARCH_FACTOR) {
                return Err(LoadgenError::OutOfRange {
                    flag: "--search-factor".into(),
                    got: limits::show(self.search_factor),
                    allowed: format!("above 1 and at most {}", limits::MAX_SEARCH_FACTOR),
                });
            }
            limits::count(
                "--search-steps",
                self.search_steps,
                0,
                limits::MAX_SEARCH_STEPS,
            )?;
            limits::count("--max-points", self.max_points, 2, limits::MAX_SWEEP_POINTS)?;
            SweepMode::Search {
                axis: self.search_axis,
                start: self.search_start,
                factor: self.search_factor,
                steps: self.search_steps,
                max_points: self.max_points,
            }
        } else if !self.concurrencies.is_empty() {
            limits::count(
                "--concurrency (points)",
                self.concurrencies.len(),
                1,
                limits::MAX_SWEEP_POINTS,
            )?;
            for &n in &self.concurrencies {
                limits::count("--concurrency", n, 1, limits::MAX_CONCURRENCY)?;
                let mut point = self.bench.clone();
                point.concurrency = Some(n);
                point.request_rate = None;
                point.arrival = None;
                point.burstiness = None;
                point.plan()?;
            }
            SweepMode::List(
                self.concurrencies
                    .iter()
                    .map(|&n| LoadPoint::Concurrency(n))
                    .collect(),
            )
        } else {
            limits::count(
                "--request-rate (points)",
                self.request_rates.len(),
                1,
                limits::MAX_SWEEP_POINTS,
            )?;
            for &r in &self.request_rates {
                limits::positive("--request-rate", r, limits::MAX_REQUEST_RATE)?;
                let mut point = bench.clone();
                point.request_rate = Some(r);
                point.plan()?;
            }
            SweepMode::List(
                self.request_rates
                    .iter()
                    .map(|&r| LoadPoint::RequestRate(r))
                    .collect(),
            )
        };
        Ok(SweepPlan {
            mode,
            base,
            min_attainment: self.min_attainment,
            replay,
        })
    }
}

/// The loads the search visits: given the points so far (in run order), the next load, or None
/// when the search is over.
pub(crate) fn next_search_load(
    loads: &[(f64, bool)],
    start: f64,
    factor: f64,
    steps: usize,
    integer: bool,
) -> Option<f64> {
    let round = |x: f64| if integer { x.round().max(1.0) } else { x };
    let Some(&(last, last_good)) = loads.last() else {
        return Some(round(start));
    };
    let first_bad = loads.iter().position(|&(_, good)| !good);
    match first_bad {
        // Still ramping.
        None => Some(round(last * factor)).filter(|&next| next > last),
        Some(bad_index) => {
            let bisected = loads.len() - 1 - bad_index;
            if bisected >= steps {
                return None;
            }
            let best_good = loads
                .iter()
                .filter(|(_, g)| *g)
                .map(|(x, _)| *x)
                .fold(0.0, f64::max);
            let lowest_bad = loads
                .iter()
                .filter(|(_, g)| !*g)
                .map(|(x, _)| *x)
                .fold(f64::INFINITY, f64::min);
            let _ = last_good;
            let low = if best_good > 0.0 {
                best_good
            } else {
                lowest_bad / factor
            };
            let mid = round((low + lowest_bad) / 2.0);
            (mid > low && mid < lowest_bad && !loads.iter().any(|(x, _)| *x == mid)).then_some(mid)
        }
    }
}

/// The highest load a search may reach on `axis`: `limits::MAX_REQUEST_RATE`, or the most
/// concurrent requests whose prompts and answers stay within `limits::MAX_TOKENS_IN_FLIGHT`
/// (at most `limits::MAX_CONCURRENCY`).
pub(crate) fn search_ceiling(axis: SearchAxis, base: &BenchPlan) -> f64 {
    match axis {
        SearchAxis::RequestRate => limits::MAX_REQUEST_RATE,
        SearchAxis::Concurrency => {
            let l = &base.lengths;
            let per_request = (l.shared_prefix_tokens + l.input_tokens + l.output_tokens).max(1);
            (limits::MAX_TOKENS_IN_FLIGHT / per_request).clamp(1, limits::MAX_CONCURRENCY) as f64
        }
    }
}

/// The outcome of a sweep.
#[derive(Debug)]
pub struct SweepRun {
    /// Every point, in run order.
    pub points: Vec<Point>,
    /// Index of the knee.
    pub knee: Option<usize>,
    /// Index of the best point of a search (the highest good load).
    pub best: Option<usize>,
    /// The JSON report.
    pub json: Value,
    /// The sweep searched the highest good load (`--find-max-goodput`).
    pub search: bool,
}

/// Runs one point on the connected target, stopping it early when the server is clearly over
/// capacity.
async fn run_point(
    load: LoadPoint,
    plan: &SweepPlan,
    index: usize,
    target: &crate::run::target::Connected,
    earlier: &[Point],
) -> Result<Point, LoadgenError> {
    let point_plan = load.plan(&plan.base, plan.base.seed.wrapping_add(index as u64));
    let (stop_tx, stop_rx) = watch::channel(false);
    let overload = Overload::new(matches!(load, LoadPoint::RequestRate(_)));
    let watch_state = Arc::new(Mutex::new((overload, None::<String>)));
    let state = watch_state.clone();
    let observer: Observer = Arc::new(move |s: &Sample| {
        // Short section, never across an await.
        if let Ok(mut st) = state.lock() {
            st.0.observe(s);
            if st.1.is_none() {
                if let Some(reason) = st.0.verdict() {
                    st.1 = Some(reason);
                    let _ = stop_tx.send(true);
                }
            }
        }
    });
    let hooks = RunHooks {
        bar: None,
        observer: Some(observer),
        abort: Some(stop_rx),
        sent: None,
    };
    let (mut json, live, attainment) = match (load, &plan.replay) {
        (LoadPoint::ArrivalSpeedup(x), Some(template)) => {
            let mut args = template.clone();
            args.trace.arrival_speedup_ratio = x;
            let run = crate::harness::first(crate::replay::replay_with(&args, false).await?)?;
            let attainment = plan.base.slo.map(|slo| {
                bench::goodput(
                    &slo,
                    &run.live.records,
                    run.live.report.duration_ms / 1000.0,
                )
            });
            let mut json = run.json;
            if let Some(map) = json.as_object_mut() {
                map.insert("slo".into(), json!(plan.base.slo));
                map.insert("goodput".into(), json!(attainment));
            }
            (json, run.live, attainment.map(|g| g.share))
        }
        _ => {
            let run = bench::run_plan(&point_plan, target, &hooks).await?;
            let attainment = run.goodput.map(|g| g.share);
            (run.json, run.live, attainment)
        }
    };
    let stopped = watch_state.lock().ok().and_then(|st| st.1.clone());
    if let Some(map) = json.as_object_mut() {
        map.insert("load".into(), json!(load));
        map.insert("load_label".into(), json!(load.label()));
        map.insert("seed".into(), json!(point_plan.seed));
        map.insert("stopped_early".into(), json!(stopped));
        map.insert("slo_attainment".into(), json!(attainment));
    }
    let saturation = saturation(
        load,
        &json,
        &live.records,
        earlier,
        plan.base.max_failure_rate,
    );
    if let Some(map) = json.as_object_mut() {
        map.insert("saturated".into(), json!(!saturation.is_empty()));
        map.insert("saturation_reasons".into(), json!(saturation));
    }
    Ok(Point {
        load,
        json,
        saturation,
        attainment,
        records: live.records,
    })
}

/// Runs the sweep's points on a connected target.
pub(crate) async fn run_points(
    plan: &SweepPlan,
    target: &crate::run::target::Connected,
    mut on_point: impl FnMut(&Point),
) -> Result<Vec<Point>, LoadgenError> {
    let mut points: Vec<Point> = Vec::new();
    match &plan.mode {
        SweepMode::List(loads) => {
            for (i, &load) in loads.iter().enumerate() {
                let p = run_point(load, plan, i, target, &points).await?;
                on_point(&p);
                points.push(p);
            }
        }
        &SweepMode::Search {
            axis,
            start,
            factor,
            steps,
            max_points,
        } => {
            let integer = axis == SearchAxis::Concurrency;
            let mut loads: Vec<(f64, bool)> = Vec::new();
            while points.len() < max_points {
                let Some(x) = next_search_load(&loads, start, factor, steps, integer) else {
                    break;
                };
                // The ramp ends at the highest load loadgen offers.
                if x > search_ceiling(axis, &plan.base) {
                    break;
                }
                let load = match axis {
                    SearchAxis::RequestRate => LoadPoint::RequestRate(x),
                    SearchAxis::Concurrency => LoadPoint::Concurrency(x as usize),
                };
                let p = run_point(load, plan, points.len(), target, &points).await?;
                loads.push((x, p.good(plan.min_attainment)));
                on_point(&p);
                points.push(p);
            }
        }
    }
    Ok(points)
}

/// The console table: load, achieved req/s and tok/s, TTFT/ITL/E2E p50 and p99, goodput,
/// errors; the knee and the best point marked.
pub fn table(points: &[Point], knee: Option<usize>, best: Option<usize>) -> String {
    let mut s = format!(
        "{:<12} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7}  {}\n",
        "load",
        "req/s",
        "tok/s",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "E2E p50",
        "E2E p99",
        "goodput",
        "errors",
        ""
    );
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| points[a].load.value().total_cmp(&points[b].load.value()));
    for i in order {
        let p = &points[i];
        let goodput = p.json["goodput"]["rate_rps"]
            .as_f64()
            .map_or("-".to_string(), |g| format!("{g:.2}"));
        let mut mark = Vec::new();
        if Some(i) == knee {
            mark.push("<- knee".to_string());
        }
        if Some(i) == best {
            mark.push("<- max goodput".to_string());
        }
        if !p.saturation.is_empty() {
            mark.push(format!("saturated ({})", p.saturation.join("; ")));
        }
        // No output tokens (embeddings): no ITL to show.
        let itl = |key: &str| {
            if p.f("total_output_tokens") > 0.0 {
                format!("{:.2}", p.f(key))
            } else {
                "-".to_string()
            }
        };
        s.push_str(&format!(
            "{:<12} {:>9.2} {:>10.1} {:>9.1} {:>9.1} {:>8} {:>8} {:>9.1} {:>9.1} {:>9} {:>7}  {}\n",
            p.load.label(),
            p.rps(),
            p.f("output_throughput_tok_s"),
            p.f("median_ttft_ms"),
            p.f("p99_ttft_ms"),
            itl("median_itl_ms"),
            itl("p99_itl_ms"),
            p.f("median_e2e_latency_ms"),
            p.f("p99_e2e_latency_ms"),
            goodput,
            p.json["failures"]["total"].as_u64().unwrap_or(0),
            mark.join(" ")
        ));
    }
    s
}

/// Runs `loadgen sweep`: every point, the table, the report files.
pub async fn sweep(args: &SweepArgs) -> Result<SweepRun, LoadgenError> {
    let plan = args.plan()?;
    let run = &args.bench.run;
    let spec = run.spec(&EmbeddedOptions::default())?;
    let mut observe = run.observe.clone();
    observe.no_scrape_metrics |= plan.replay.is_some();
    let settings = Settings {
        report: &run.report,
        observe: Some(&observe),
        live_view: false,
        html: run.observe.html.as_deref(),
        sharding: &run.sharding,
        console: true,
        num_runs: 1,
    };
    let mode = Points {
        plan: &plan,
        spec: &spec,
        quiet: run.report.quiet,
    };
    let sweep = harness::execute(mode, &spec, &settings).await?;
    // Overload failures are what a sweep looks for, but a sweep in which every request of every
    // point failed measured nothing: the report is written and the exit status says so.
    let records = sweep.points.iter().flat_map(|p| &p.records);
    let failed = records.clone().filter(|r| r.error.is_some()).count();
    crate::run::failure::verdict(records.count(), failed, 1.0)?;
    Ok(sweep)
}

/// A sweep in the harness: its points one after the other on one target, one report on them.
struct Points<'a> {
    plan: &'a SweepPlan,
    spec: &'a crate::run::target::TargetSpec,
    /// No line per point.
    quiet: bool,
}

impl Mode for Points<'_> {
    type Schedule = ();
    type Driven = Vec<Point>;
    type Run = SweepRun;

    fn api(&self) -> crate::run::target::Api {
        self.plan.base.api
    }

    fn prepare(&mut self, _target: &Connected) -> Result<((), Option<usize>), LoadgenError> {
        Ok(((), None))
    }

    fn announce(&self, _target: &Connected) {
        crate::stdout::outln!(
            "loadgen sweep: {}; each point: {:?}",
            match &self.plan.mode {
                SweepMode::List(l) => format!("{} points", l.len()),
                SweepMode::Search { axis, .. } =>
                    format!("searching the highest {axis:?} meeting the SLO"),
            },
            self.plan.base.stop
        );
    }

    async fn drive(
        &mut self,
        _schedule: (),
        target: &Connected,
        _hooks: RunHooks,
    ) -> Result<Vec<Point>, LoadgenError> {
        let quiet = self.quiet;
        run_points(self.plan, target, |p| {
            if !quiet {
                crate::stdout::errln!(
                    "  {}: {:.2} req/s, TTFT p50 {:.1} ms{}",
                    p.load.label(),
                    p.rps(),
                    p.f("median_ttft_ms"),
                    if p.saturation.is_empty() {
                        ""
                    } else {
                        ", saturated"
                    }
                );
            }
        })
        .await
    }

    fn report(
        &mut self,
        points: Vec<Point>,
        _wall: std::time::Duration,
        observed: &Observed,
    ) -> Result<SweepRun, LoadgenError> {
        let plan = self.plan;
        let knee = knee(&points);
        let best = match plan.mode {
            SweepMode::Search { .. } => points
                .iter()
                .enumerate()
                .filter(|(_, p)| p.good(plan.min_attainment))
                .max_by(|a, b| a.1.load.value().total_cmp(&b.1.load.value()))
                .map(|(i, _)| i),
            SweepMode::List(_) => None,
        };
        let mut config = bench::config_json(&plan.base, self.spec);
        config["mode"] = json!(format!(
            "sweep over {}",
            points
                .iter()
                .map(|p| p.load.label())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let mut json = json!({
            "sweep": {
                "mode": match plan.mode { SweepMode::List(_) => "list", SweepMode::Search { .. } => "find_max_goodput" },
                "slo": plan.base.slo,
                "min_attainment": plan.min_attainment,
                "knee_index": knee,
                "knee": knee.map(|k| points[k].load),
                "max_goodput_index": best,
                "max_goodput": best.map(|b| points[b].load),
            },
            "config": config,
            "points": points.iter().map(|p| p.json.clone()).collect::<Vec<_>>(),
        });
        if let (Some(map), Some(server)) = (json.as_object_mut(), &observed.server) {
            map.insert("server_metrics".into(), json!(server));
        }
        Ok(SweepRun {
            points,
            knee,
            best,
            json,
            search: matches!(plan.mode, SweepMode::Search { .. }),
        })
    }
}

impl Report for SweepRun {
    fn console_text(&self) -> String {
        let mut s = table(&self.points, self.knee, self.best);
        match self.best {
            Some(b) if self.search => s.push_str(&format!(
                "Max goodput: {} ({:.2} good req/s)\n",
                self.points[b].load.label(),
                self.points[b].json["goodput"]["rate_rps"]
                    .as_f64()
                    .unwrap_or(0.0)
            )),
            _ if self.search => s.push_str("Max goodput: no point met the SLO\n"),
            _ => {}
        }
        s
    }

    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError> {
        crate::report::replay_report::write_files(
            &self.json,
            &[],
            report.report_json.as_deref(),
            None,
        )?;
        if let Some(path) = &report.per_request_jsonl {
            write_point_records(path, &self.points)?;
        }
        Ok(())
    }

    fn html_json(&self) -> (&'static str, std::borrow::Cow<'_, Value>) {
        ("run", std::borrow::Cow::Borrowed(&self.json))
    }
}

/// Writes every point's per-request records, each with its point's index (`point`).
fn write_point_records(path: &std::path::Path, points: &[Point]) -> Result<(), LoadgenError> {
    let rows = points.iter().enumerate().flat_map(|(point, p)| {
        p.records
            .iter()
            .map(move |record| PointRecord { record, point })
    });
    crate::write::jsonl(path, rows)
}

/// A per-request record with its point's index added (`point`).
struct PointRecord<'a, R> {
    record: &'a R,
    point: usize,
}

impl<R: serde::Serialize> serde::Serialize for PointRecord<'_, R> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let mut v = serde_json::to_value(self.record).map_err(S::Error::custom)?;
        if let Some(map) = v.as_object_mut() {
            map.insert("point".into(), json!(self.point));
        }
        v.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::{Load, Rate};
    use clap::Parser;

    fn plan(flags: &[&str]) -> Result<SweepPlan, LoadgenError> {
        let mut argv = vec!["loadgen", "sweep"];
        argv.extend_from_slice(flags);
        match crate::Cli::try_parse_from(argv)
            .expect("valid flags")
            .command
        {
            crate::Command::Sweep(a) => a.plan(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn flags_become_points_or_a_search() {
        let p = plan(&["--concurrency", "1,2,4"]).expect("valid");
        assert_eq!(
            p.mode,
            SweepMode::List(vec![
                LoadPoint::Concurrency(1),
                LoadPoint::Concurrency(2),
                LoadPoint::Concurrency(4)
            ])
        );
        let p = plan(&[
            "--request-rate",
            "0.5,2",
            "--arrival",
            "constant",
            "--max-concurrency",
            "8",
        ])
        .expect("valid");
        assert_eq!(
            p.mode,
            SweepMode::List(vec![
                LoadPoint::RequestRate(0.5),
                LoadPoint::RequestRate(2.0)
            ])
        );
        let open = LoadPoint::RequestRate(3.0).plan(&p.base, 7);
        assert_eq!(open.seed, 7);
        assert!(matches!(
            open.load,
            Load::Open {
                rate: Rate::PerSecond(r),
                arrival: bench::Arrival::Constant,
                max_in_flight: Some(8),
                ..
            } if r == 3.0
        ));
        let p = plan(&["--find-max-goodput", "--slo", "ttft=1s"]).expect("valid");
        assert!(matches!(
            p.mode,
            SweepMode::Search {
                axis: SearchAxis::RequestRate,
                ..
            }
        ));
        let p = plan(&["--trace", "t.jsonl", "--arrival-speedup-ratio", "1,2"]).expect("valid");
        assert_eq!(p.replay.as_ref().map(|r| r.trace.block_size), Some(512));
        for (bad, says) in [
            (&[][..], "exactly one"),
            (
                &["--concurrency", "1", "--request-rate", "2"],
                "exactly one",
            ),
            (
                &["--concurrency", "0"],
                "--concurrency must be from 1 to 100000, got 0",
            ),
            (&["--request-rate", "0"], "--request-rate must be above 0"),
            (&["--find-max-goodput"], "--slo"),
            (
                &[
                    "--find-max-goodput",
                    "--slo",
                    "ttft=1s",
                    "--search-factor",
                    "1",
                ],
                "factor",
            ),
            (&["--arrival-speedup-ratio", "2"], "go together"),
            (
                &["--concurrency", "1", "--min-attainment", "0"],
                "attainment",
            ),
        ] {
            match plan(bad) {
                Err(e @ (LoadgenError::Config(_) | LoadgenError::OutOfRange { .. })) => {
                    assert!(e.to_string().contains(says), "{bad:?}: {e}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_search_ramps_then_bisects() {
        // Ramp 1, 2, 4, 8 while good.
        let mut loads = vec![];
        for expect in [1.0, 2.0, 4.0, 8.0] {
            assert_eq!(next_search_load(&loads, 1.0, 2.0, 3, false), Some(expect));
            loads.push((expect, expect < 8.0));
        }
        // 8 was bad: bisect between 4 and 8, then within.
        assert_eq!(next_search_load(&loads, 1.0, 2.0, 3, false), Some(6.0));
        loads.push((6.0, true));
        assert_eq!(next_search_load(&loads, 1.0, 2.0, 3, false), Some(7.0));
        loads.push((7.0, false));
        assert_eq!(next_search_load(&loads, 1.0, 2.0, 3, false), Some(6.5));
        loads.push((6.5, true));
        assert_eq!(next_search_load(&loads, 1.0, 2.0, 3, false), None);
        // Integer loads stop when no integer lies between.
        let ints = [(1.0, true), (2.0, false)];
        assert_eq!(next_search_load(&ints, 1.0, 2.0, 3, true), None);
        // The first point bad: bisect below it.
        assert_eq!(
            next_search_load(&[(4.0, false)], 4.0, 2.0, 2, false),
            Some(3.0)
        );
    }
}
