//! `loadgen bench`: synthetic load, closed loop (`--concurrency N`), open loop (`--request-rate R`
//! with Poisson, constant or gamma arrivals), or both (the rate capped at N in flight), on the
//! same driver as `replay` and `multiturn`; goodput against `--slo`.
//!
//! The flags become a validated [`BenchPlan`] ([`Load`], [`Stop`], [`Lengths`], warmup, SLO)
//! before anything connects; every contradictory combination is refused there.
//!
//! Open loop precomputes every request's send offset from a seeded generator (vLLM's
//! `--burstiness`: gamma inter-arrival gaps with shape `burstiness` and mean `1 / rate`;
//! burstiness 1 is Poisson). Each request is then a one-request session at its absolute offset.
//! Closed loop runs `N` sessions that each send their next request as soon as the previous one
//! finished. `--seed` (the engine's) also seeds arrivals, lengths and text. Prompts: an optional shared prefix (`--shared-prefix-tokens`, one per prefix group,
//! request `k` in group `k % --num-prefix-groups`) followed by `--input-tokens` (normal with
//! `--input-tokens-stddev`, at least 1) unique tokens, exact for a known tokenizer.

mod arrival;
mod slo;

use arrival::normal;
pub use arrival::{arrival_offsets, Arrival};
pub use slo::{goodput, Goodput, Slo};

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::ProgressBar;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use crate::error::LoadgenError;
use crate::limits;
use crate::observe::Observed;
use crate::report::replay_report::{self, RequestInfo};
use crate::run::client::Response;
use crate::run::driver::{self, Planned, RunHooks, Script, Start};
use crate::run::prompt::PromptSynth;
use crate::run::target::{request_body, Api, Connected, EmbeddedOptions, TargetSpec};
use crate::run::{self, Mode, Report, RunArgs, Settings};
use mock_server::args::ReportArgs;

/// `loadgen bench` flags.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Closed loop: this many requests in flight (with --request-rate: the cap); 1 to 100000.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: requests per second, above 0 and at most 10^6 ("inf" = all at once).
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Inter-arrival distribution of the open loop [default: poisson].
    #[arg(long, value_enum)]
    pub arrival: Option<Arrival>,
    /// Gamma shape of the inter-arrival gaps with --arrival gamma (below 1 burstier, above 1
    /// smoother; 1 = Poisson), 0.001 to 1000 [default: 1].
    #[arg(long)]
    pub burstiness: Option<f64>,
    /// Requests to send, 1 to 10^7 [default: 100 unless --duration is given].
    #[arg(long)]
    pub num_requests: Option<usize>,
    /// Stop sending after this many seconds (above 0, at most 604800: seven days).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Excluded from the statistics: the first N requests ("N", at most 10^7) or those due in
    /// the first S seconds ("Ss", at most 604800).
    #[arg(long)]
    pub warmup: Option<Warmup>,
    /// Mean unique prompt tokens per request (with --shared-prefix-tokens at most 2^22).
    #[arg(long, default_value_t = 256)]
    pub input_tokens: usize,
    /// Standard deviation of the unique prompt tokens (0 to 2^22; draws stay within 1 and 2^22).
    #[arg(long, default_value_t = 0.0)]
    pub input_tokens_stddev: f64,
    /// Mean output tokens (max_tokens with ignore_eos), 1 to 2^22.
    #[arg(long, default_value_t = 128)]
    pub output_tokens: usize,
    /// Standard deviation of the output tokens (0 to 2^22).
    #[arg(long, default_value_t = 0.0)]
    pub output_tokens_stddev: f64,
    /// Tokens of a shared system prefix before each prompt (0 = none, at most 2^22).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_tokens: usize,
    /// Distinct shared prefixes; request k uses prefix k mod N (1 to 10^7).
    #[arg(long, default_value_t = 1)]
    pub num_prefix_groups: usize,
    /// Service-level objectives for goodput, e.g. ttft=200ms,itl=50ms,e2e=10s (itl = a request's
    /// mean inter-token latency; units us, ms, s).
    #[arg(long)]
    pub slo: Option<Slo>,
    /// The route requests go to: completions (a raw prompt) or chat (the prompt as one user
    /// message, through the server's chat template).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub endpoint: Api,
    /// Report files, observers, failure threshold, target and sharding.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Request rate of the open loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Requests per second (finite, positive).
    PerSecond(f64),
    /// Every request at once (`--request-rate inf`).
    Unlimited,
}

/// How requests are offered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// `users` sessions, each sending its next request as soon as the previous one finished.
    Closed {
        /// Requests in flight.
        users: usize,
    },
    /// Requests at precomputed send offsets, whatever the responses do.
    Open {
        /// The mean rate.
        rate: Rate,
        /// Inter-arrival distribution.
        arrival: Arrival,
        /// Gamma shape (1 unless `arrival` is gamma).
        burstiness: f64,
        /// Requests in flight at most (later ones wait; their latency still counts from their
        /// scheduled time).
        max_in_flight: Option<usize>,
    },
}

/// When sending stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many requests.
    Requests(usize),
    /// No request due after this time.
    Duration(Duration),
    /// Whichever comes first.
    RequestsOrDuration {
        /// Most requests.
        requests: usize,
        /// Latest due time.
        duration: Duration,
    },
}

impl Stop {
    /// The request count limit, if any.
    pub(crate) fn max_requests(&self) -> Option<usize> {
        match *self {
            Stop::Requests(n) | Stop::RequestsOrDuration { requests: n, .. } => Some(n),
            Stop::Duration(_) => None,
        }
    }

    /// The time limit, if any.
    pub fn duration(&self) -> Option<Duration> {
        match *self {
            Stop::Duration(d) | Stop::RequestsOrDuration { duration: d, .. } => Some(d),
            Stop::Requests(_) => None,
        }
    }
}

/// Prompt and output lengths.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    /// Mean unique prompt tokens.
    pub input_tokens: usize,
    /// Their standard deviation.
    pub input_tokens_stddev: f64,
    /// Mean output tokens.
    pub output_tokens: usize,
    /// Their standard deviation.
    pub output_tokens_stddev: f64,
    /// Shared prefix tokens before each prompt (0 = none).
    pub shared_prefix_tokens: usize,
    /// Distinct shared prefixes.
    pub num_prefix_groups: usize,
}

/// A validated `loadgen bench` run, built from the flags before anything connects (every
/// combination is checked here; the run itself never sees a contradictory flag).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchPlan {
    /// Closed or open loop.
    pub load: Load,
    /// When sending stops.
    pub stop: Stop,
    /// Requests excluded from the statistics.
    pub warmup: Option<Warmup>,
    /// Lengths of the requests.
    pub lengths: Lengths,
    /// Goodput objectives.
    pub slo: Option<Slo>,
    /// Seeds arrivals, lengths and text (the engine's `--seed`).
    pub seed: u64,
    /// The failure threshold.
    pub max_failure_rate: f64,
    /// The route requests go to.
    pub api: Api,
    /// The part of the run this process sends (`--shard`; None: all of it).
    pub shard: Option<crate::run::shard::Shard>,
}

/// Requests when neither `--num-requests` nor `--duration` is given.
pub(crate) const DEFAULT_NUM_REQUESTS: usize = 100;

impl BenchArgs {
    /// Validates the flags into a plan.
    pub fn plan(&self) -> Result<BenchPlan, LoadgenError> {
        let bad = |m: &str| Err(LoadgenError::Config(m.to_string()));
        if let Some(n) = self.concurrency {
            limits::count("--concurrency", n, 1, limits::MAX_CONCURRENCY)?;
        }
        let load = match self.request_rate {
            None => {
                if self.arrival.is_some() || self.burstiness.is_some() {
                    return bad(
                        "--arrival and --burstiness shape the open loop: they need --request-rate",
                    );
                }
                Load::Closed {
                    users: self.concurrency.unwrap_or(1),
                }
            }
            Some(r) if !(r == f64::INFINITY || (r > 0.0 && r <= limits::MAX_REQUEST_RATE)) => {
                return Err(LoadgenError::OutOfRange {
                    flag: "--request-rate".into(),
                    got: limits::show(r),
                    allowed: format!(
                        "above 0 and at most {}, or inf",
                        limits::show(limits::MAX_REQUEST_RATE)
                    ),
                })
            }
            Some(r) => {
                let rate = if r.is_infinite() {
                    Rate::Unlimited
                } else {
                    Rate::PerSecond(r)
                };
                let arrival = self.arrival.unwrap_or(Arrival::Poisson);
                if rate == Rate::Unlimited && (self.arrival.is_some() || self.burstiness.is_some())
                {
                    return bad("--request-rate inf sends everything at once: --arrival and --burstiness do not apply");
                }
                let burstiness = match self.burstiness {
                    None => 1.0,
                    Some(_) if arrival != Arrival::Gamma => {
                        return bad(
                            "--burstiness is the shape of gamma gaps: it needs --arrival gamma",
                        )
                    }
                    Some(b) => limits::within(
                        "--burstiness",
                        b,
                        limits::MIN_BURSTINESS,
                        limits::MAX_BURSTINESS,
                    )?,
                };
                Load::Open {
                    rate,
                    arrival,
                    burstiness,
                    max_in_flight: self.concurrency,
                }
            }
        };
        if let Some(n) = self.num_requests {
            limits::count("--num-requests", n, 1, limits::MAX_REQUESTS)?;
        }
        let duration = match self.duration {
            Some(d) => Some(Duration::from_secs_f64(limits::positive(
                "--duration",
                d,
                limits::MAX_DURATION_S,
            )?)),
            None => None,
        };
        let stop = match (self.num_requests, duration) {
            (None, None) => Stop::Requests(DEFAULT_NUM_REQUESTS),
            (Some(n), None) => Stop::Requests(n),
            (None, Some(d)) => Stop::Duration(d),
            (Some(requests), Some(duration)) => Stop::RequestsOrDuration { requests, duration },
        };
        if matches!(
            load,
            Load::Open {
                rate: Rate::Unlimited,
                ..
            }
        ) && stop.max_requests().is_none()
        {
            return bad("--request-rate inf needs --num-requests (every request is due at once)");
        }
        if let (
            Load::Open {
                rate: Rate::PerSecond(r),
                ..
            },
            Stop::Duration(d),
        ) = (load, stop)
        {
            // The open loop precomputes every send offset: their number must stay bounded.
            let expected = r * d.as_secs_f64();
            if expected > limits::MAX_REQUESTS as f64 {
                return Err(LoadgenError::Config(format!(
                    "--request-rate x --duration schedules about {} requests, above the {} \
                     loadgen allows in one run (MAX_REQUESTS): lower either or give \
                     --num-requests",
                    limits::show(expected.round()),
                    limits::MAX_REQUESTS
                )));
            }
        }
        match self.warmup {
            Some(Warmup::Requests(w)) => {
                limits::count("--warmup", w, 0, limits::MAX_REQUESTS)?;
            }
            Some(Warmup::Seconds(w)) => {
                limits::within("--warmup (seconds)", w, 0.0, limits::MAX_DURATION_S)?;
            }
            None => {}
        }
        match (self.warmup, stop.max_requests(), stop.duration()) {
            (Some(Warmup::Requests(w)), Some(n), _) if w >= n => {
                return bad(
                    "--warmup leaves no request to measure (it is not below --num-requests)",
                )
            }
            (Some(Warmup::Seconds(w)), _, Some(d)) if w >= d.as_secs_f64() => {
                return bad("--warmup leaves no request to measure (it is not below --duration)")
            }
            _ => {}
        }
        limits::count(
            "--input-tokens",
            self.input_tokens,
            0,
            limits::MAX_PROMPT_TOKENS,
        )?;
        limits::count(
            "--shared-prefix-tokens",
            self.shared_prefix_tokens,
            0,
            limits::MAX_PROMPT_TOKENS,
        )?;
        limits::count(
            "--input-tokens + --shared-prefix-tokens",
            self.input_tokens + self.shared_prefix_tokens,
            0,
            limits::MAX_PROMPT_TOKENS,
        )?;
        limits::within(
            "--input-tokens-stddev",
            self.input_tokens_stddev,
            0.0,
            limits::MAX_PROMPT_TOKENS as f64,
        )?;
        limits::count(
            "--output-tokens",
            self.output_tokens,
            1,
            limits::MAX_OUTPUT_TOKENS,
        )?;
        limits::within(
            "--output-tokens-stddev",
            self.output_tokens_stddev,
            0.0,
            limits::MAX_OUTPUT_TOKENS as f64,
        )?;
        limits::count(
            "--num-prefix-groups",
            self.num_prefix_groups,
            1,
            limits::MAX_REQUESTS,
        )?;
        let in_flight = match load {
            Load::Closed { users } => Some(users),
            Load::Open { max_in_flight, .. } => max_in_flight,
        };
        if let Some(n) = in_flight {
            limits::product(
                "--concurrency x (--shared-prefix-tokens + --input-tokens + --output-tokens)",
                &[
                    n,
                    self.shared_prefix_tokens + self.input_tokens + self.output_tokens,
                ],
                limits::MAX_TOKENS_IN_FLIGHT,
                "MAX_TOKENS_IN_FLIGHT",
            )?;
        }
        let run = &self.run;
        run.observe.check()?;
        limits::output_paths([
            ("--report-json", run.report.report_json.as_deref()),
            (
                "--per-request-jsonl",
                run.report.per_request_jsonl.as_deref(),
            ),
            ("--html", run.observe.html.as_deref()),
        ])?;
        if self.num_prefix_groups > 1 && self.shared_prefix_tokens == 0 {
            return bad("--num-prefix-groups needs --shared-prefix-tokens");
        }
        run.sharding.check()?;
        let shard = run.sharding.shard;
        if let (Some(sh), Load::Closed { users }, Some(_)) = (shard, load, stop.max_requests()) {
            // Shard I sends the request indices I, I+N, ...: with no user of its own, they
            // would never be sent.
            if (users as u64) < sh.count {
                return Err(LoadgenError::Config(format!(
                    "--shard {}/{} with --concurrency {users} and a request budget: every shard \
                     needs a user to send its share of --num-requests (give at least {} users, \
                     or --duration alone)",
                    sh.index, sh.count, sh.count
                )));
            }
        }
        Ok(BenchPlan {
            load,
            stop,
            warmup: self.warmup,
            lengths: Lengths {
                input_tokens: self.input_tokens,
                input_tokens_stddev: self.input_tokens_stddev,
                output_tokens: self.output_tokens,
                output_tokens_stddev: self.output_tokens_stddev,
                shared_prefix_tokens: self.shared_prefix_tokens,
                num_prefix_groups: self.num_prefix_groups,
            },
            slo: self.slo,
            seed: run.target.engine.seed,
            max_failure_rate: run.failures.max_failure_rate()?,
            api: self.endpoint,
            shard,
        })
    }
}

impl BenchPlan {
    /// One line for the console and the report's `mode` key.
    pub(crate) fn describe(&self) -> String {
        match self.load {
            Load::Closed { users } => format!("closed loop: concurrency {users}"),
            Load::Open {
                rate,
                arrival,
                burstiness,
                max_in_flight,
            } => {
                let rate = match rate {
                    Rate::PerSecond(r) => format!("{r} req/s"),
                    Rate::Unlimited => "inf req/s".into(),
                };
                let cap = match max_in_flight {
                    Some(n) => format!("at most {n} in flight"),
                    None => "no in-flight cap".into(),
                };
                format!("open loop: {rate} ({arrival:?}, burstiness {burstiness}), {cap}")
            }
        }
    }

    /// Open-loop send offsets (seconds) for this plan; empty for a closed loop.
    pub(crate) fn arrival_offsets(&self) -> Vec<f64> {
        let Load::Open {
            rate,
            arrival,
            burstiness,
            ..
        } = self.load
        else {
            return Vec::new();
        };
        let rate = match rate {
            Rate::PerSecond(r) => r,
            Rate::Unlimited => f64::INFINITY,
        };
        let limit_s = self
            .stop
            .duration()
            .map_or(f64::INFINITY, |d| d.as_secs_f64());
        arrival_offsets(
            rate,
            arrival,
            burstiness,
            self.stop.max_requests(),
            limit_s,
            self.seed,
        )
    }
}

/// What `--warmup` excludes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Warmup {
    /// The first N requests sent.
    Requests(usize),
    /// Requests due in the first seconds.
    Seconds(f64),
}

impl FromStr for Warmup {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("expected N (requests) or Ns (seconds), got {s:?}");
        match s.strip_suffix('s') {
            Some(secs) => secs
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Warmup::Seconds)
                .ok_or_else(bad),
            None => s.parse().map(Warmup::Requests).map_err(|_| bad()),
        }
    }
}

/// Request `k`'s lengths: (unique input tokens, output tokens).
fn lengths(plan: &BenchPlan, k: usize) -> (usize, usize) {
    let mut rng =
        ChaCha8Rng::seed_from_u64(plan.seed.wrapping_mul(0x9E37_79B9).wrapping_add(k as u64));
    // A draw lies in [1, max]: a wide deviation never asks for an unbounded prompt.
    let draw = |rng: &mut ChaCha8Rng, mean: usize, sd: f64, max: usize| {
        ((mean as f64 + sd * normal(rng))
            .round()
            .clamp(1.0, max.max(1) as f64)) as usize
    };
    let l = &plan.lengths;
    (
        draw(
            &mut rng,
            l.input_tokens,
            l.input_tokens_stddev,
            limits::MAX_PROMPT_TOKENS.saturating_sub(l.shared_prefix_tokens),
        ),
        draw(
            &mut rng,
            l.output_tokens,
            l.output_tokens_stddev,
            limits::MAX_OUTPUT_TOKENS,
        ),
    )
}

/// Builds request bodies.
struct Requests {
    plan: BenchPlan,
    synth: PromptSynth,
    model: String,
    /// Whether bodies ask for the serving worker.
    ask_worker_id: bool,
}

/// Hash-id space of the shared prefixes (unique parts use the request index).
const PREFIX_ID_BASE: u64 = 1 << 62;

/// What the report knows of request `k` of `plan`.
fn info(plan: &BenchPlan, k: usize) -> RequestInfo {
    let (input, output) = lengths(plan, k);
    RequestInfo {
        input_length: plan.lengths.shared_prefix_tokens + input,
        max_output: output,
        session: None,
        turn: 0,
        expected_reused_tokens: None,
    }
}

impl Requests {
    fn body(&self, k: usize) -> serde_json::Value {
        let (input, output) = lengths(&self.plan, k);
        let l = &self.plan.lengths;
        let mut pieces = Vec::new();
        if l.shared_prefix_tokens > 0 {
            let g = PREFIX_ID_BASE + k as u64 % l.num_prefix_groups as u64;
            pieces.extend(self.synth.filler(g, l.shared_prefix_tokens));
        }
        let unique = self.plan.seed.rotate_left(32) ^ k as u64;
        pieces.extend(self.synth.filler(unique, input));
        request_body(
            self.plan.api,
            &self.model,
            self.synth.text(&pieces),
            output,
            self.ask_worker_id,
        )
    }
}

/// One open-loop request.
struct OneShot {
    requests: Arc<Requests>,
    k: usize,
    at: Duration,
    sent: bool,
}

impl Script for OneShot {
    fn first_start(&self) -> Duration {
        self.at
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Planned {
            start: Start::At(self.at),
            body: self.requests.body(self.k),
        })
    }
}

/// Request indices taken by each closed-loop user, by local user then turn: a sample's
/// request is `taken[session][turn]`. Locked only to push or read, never across an await.
type Taken = Arc<std::sync::Mutex<Vec<Vec<usize>>>>;

/// One closed-loop user: the next request index as soon as the previous finished.
struct User {
    requests: Arc<Requests>,
    /// The counter the users of this process share (the shard's own when sharded: its `c`-th
    /// request is the global index `I + c * N`).
    next: Arc<AtomicUsize>,
    shard: Option<crate::run::shard::Shard>,
    /// Requests to send in all (None: until the duration ends).
    limit: Option<usize>,
    /// This user's local index in `taken`.
    index: usize,
    taken: Taken,
    turn: usize,
}

impl Script for User {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let c = self.next.fetch_add(1, Ordering::Relaxed);
        let k = crate::run::shard::global(self.shard, c);
        if self.limit.is_some_and(|n| k >= n) {
            return None;
        }
        let start = if self.turn == 0 {
            Start::At(Duration::ZERO)
        } else {
            Start::After(Duration::ZERO)
        };
        self.turn += 1;
        if let Ok(mut taken) = self.taken.lock() {
            if let Some(ks) = taken.get_mut(self.index) {
                ks.push(k);
            }
        }
        Some(Planned {
            start,
            body: self.requests.body(k),
        })
    }
}

/// The outcome of a bench run.
#[derive(Debug)]
pub struct BenchRun {
    /// The report (warmup excluded).
    pub live: replay_report::LiveReport,
    /// Goodput, when `--slo` was given.
    pub goodput: Option<Goodput>,
    /// Requests excluded as warmup.
    pub warmup_requests: usize,
    /// The report JSON.
    pub json: serde_json::Value,
    /// The run was stopped early (its in-flight requests count as cancelled).
    pub aborted: bool,
    /// How late the server handed its tokens to clients, when it said.
    pub server_lateness: Option<crate::observe::scrape::Lateness>,
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

/// Runs `loadgen bench`: prints the report and writes the requested files. The failure-rate
/// verdict (over the measured requests, warmup excluded) is the caller's
/// ([`replay_report::LiveReport::verdict`]; [`crate::run_async`] applies it).
pub async fn bench(args: &BenchArgs) -> Result<BenchRun, LoadgenError> {
    let plan = args.plan()?;
    let spec = args.run.target.spec(&EmbeddedOptions::default())?;
    let mode = BenchMode {
        plan,
        spec: &spec,
        taken: Taken::default(),
    };
    run::execute(mode, &spec, &Settings::of(&args.run)).await
}

/// `loadgen bench` in the harness: the plan's schedule, its report with the observers' series
/// and the plan as `config`.
struct BenchMode<'a> {
    plan: BenchPlan,
    spec: &'a TargetSpec,
    /// The closed loop's request indices, by user then turn (the schedule's).
    taken: Taken,
}

impl Mode for BenchMode<'_> {
    type Schedule = Vec<Box<dyn Script>>;
    type Driven = driver::DriverOutput;
    type Run = BenchRun;

    fn api(&self) -> Api {
        self.plan.api
    }

    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Vec<Box<dyn Script>>, Option<usize>), LoadgenError> {
        let schedule = Schedule::new(&self.plan, target);
        self.taken = schedule.taken;
        let expected = self
            .plan
            .stop
            .max_requests()
            .map(|n| self.plan.shard.map_or(n, |s| s.share(n)));
        Ok((schedule.scripts, expected))
    }

    fn announce(&self, target: &Connected) {
        println!(
            "loadgen bench: {}; prompts {} ({})",
            self.plan.describe(),
            if target.synth(1).is_exact() {
                "exact"
            } else {
                "approximate"
            },
            target.url
        );
    }

    async fn drive(
        &mut self,
        scripts: Vec<Box<dyn Script>>,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<driver::DriverOutput, LoadgenError> {
        send(&self.plan, target, scripts, hooks).await
    }

    fn report(
        &mut self,
        driven: driver::DriverOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<BenchRun, LoadgenError> {
        let mut run = measure(&self.plan, &self.taken, driven, wall);
        run.server_lateness = observed.lateness();
        observed.annotate(
            &mut run.json,
            &run.live,
            Some(config_json(&self.plan, self.spec)),
        );
        Ok(run)
    }
}

impl Report for BenchRun {
    fn console_text(&self) -> String {
        format!(
            "Bench report ({} warmup requests excluded)\n{}",
            self.warmup_requests,
            self.console()
        )
    }

    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError> {
        replay_report::write_files(
            &self.json,
            &self.live.records,
            report.report_json.as_deref(),
            report.per_request_jsonl.as_deref(),
        )
    }

    fn html_json(&self) -> (&'static str, std::borrow::Cow<'_, serde_json::Value>) {
        ("run", std::borrow::Cow::Borrowed(&self.json))
    }
}

/// The `config` block of a bench report: the plan and the target.
pub(crate) fn config_json(
    plan: &BenchPlan,
    spec: &crate::run::target::TargetSpec,
) -> serde_json::Value {
    json!({
        "mode": plan.describe(),
        "endpoint": plan.api.name(),
        "stop": format!("{:?}", plan.stop),
        "warmup": plan.warmup.map(|w| format!("{w:?}")),
        "input_tokens": plan.lengths.input_tokens,
        "input_tokens_stddev": plan.lengths.input_tokens_stddev,
        "output_tokens": plan.lengths.output_tokens,
        "output_tokens_stddev": plan.lengths.output_tokens_stddev,
        "shared_prefix_tokens": plan.lengths.shared_prefix_tokens,
        "num_prefix_groups": plan.lengths.num_prefix_groups,
        "slo": plan.slo,
        "seed": plan.seed,
        "target": spec.describe(),
    })
}

impl BenchRun {
    /// The console report: latencies, token lengths, goodput, failures, schedule lag.
    pub fn console(&self) -> String {
        let mut s = self.live.report_lines();
        let j = &self.json;
        let f = |k: &str| j[k].as_f64().unwrap_or(0.0);
        s.push_str(&format!(
            "Tokens per request: input {:.1} ± {:.1}, output {:.1} ± {:.1}\n",
            f("input_tokens_mean"),
            f("input_tokens_std"),
            f("output_tokens_mean"),
            f("output_tokens_std")
        ));
        if let Some(g) = &self.goodput {
            s.push_str(&format!(
                "Goodput: {}/{} requests met every SLO ({:.1}%), {:.2} req/s\n",
                g.good_requests,
                g.total_requests,
                100.0 * g.share,
                g.rate_rps
            ));
        }
        s.push_str(&self.live.failure_lines());
        s.push_str(&self.live.lag_lines());
        s
    }
}

/// Runs `plan` on a connected target and builds its report (nothing printed or written).
pub(crate) async fn run_plan(
    plan: &BenchPlan,
    target: &Connected,
    hooks: &RunHooks,
) -> Result<BenchRun, LoadgenError> {
    let schedule = Schedule::new(plan, target);
    let started = std::time::Instant::now();
    let out = send(plan, target, schedule.scripts, hooks.clone()).await?;
    Ok(measure(plan, &schedule.taken, out, started.elapsed()))
}

/// Sends a plan's scripts: the open loop's in-flight cap, the stop time, `hooks` watching.
async fn send(
    plan: &BenchPlan,
    target: &Connected,
    scripts: Vec<Box<dyn Script>>,
    mut hooks: RunHooks,
) -> Result<driver::DriverOutput, LoadgenError> {
    let max_in_flight = match plan.load {
        Load::Open { max_in_flight, .. } => max_in_flight,
        Load::Closed { .. } => None,
    };
    let bar = hooks.bar.take().unwrap_or_else(ProgressBar::hidden);
    hooks.bar = Some(bar.clone());
    let config = hooks.driver_config(max_in_flight, plan.stop.duration());
    let result = driver::drive(target.endpoint.clone(), scripts, &config).await;
    bar.finish_and_clear();
    result
}

/// A plan's scripts for one connected target, and what maps their samples back to request
/// indices.
struct Schedule {
    /// The closed loop's request indices, by user then turn.
    taken: Taken,
    /// One per session.
    scripts: Vec<Box<dyn Script>>,
}

impl Schedule {
    /// The sessions of `plan` this process sends: one per open-loop arrival, or one per
    /// closed-loop user.
    fn new(plan: &BenchPlan, target: &Connected) -> Schedule {
        let requests = Arc::new(Requests {
            plan: *plan,
            synth: target.synth(1),
            model: target.model.clone(),
            ask_worker_id: target.ask_worker_id,
        });
        let shard = plan.shard;
        let owns = |i: usize| shard.is_none_or(|sh| sh.owns(i));
        let taken: Taken = Arc::default();
        let scripts: Vec<Box<dyn Script>> = match plan.load {
            Load::Open { .. } => plan
                .arrival_offsets()
                .into_iter()
                .enumerate()
                .filter(|&(k, _)| owns(k))
                .map(|(k, t)| {
                    Box::new(OneShot {
                        requests: requests.clone(),
                        k,
                        at: Duration::from_secs_f64(t),
                        sent: false,
                    }) as Box<dyn Script>
                })
                .collect(),
            Load::Closed { users } => {
                let next = Arc::new(AtomicUsize::new(0));
                let local_users = (0..users).filter(|&u| owns(u)).count();
                if let Ok(mut t) = taken.lock() {
                    *t = vec![Vec::new(); local_users];
                }
                (0..local_users)
                    .map(|index| {
                        Box::new(User {
                            requests: requests.clone(),
                            next: next.clone(),
                            shard,
                            limit: plan.stop.max_requests(),
                            index,
                            taken: taken.clone(),
                            turn: 0,
                        }) as Box<dyn Script>
                    })
                    .collect()
            }
        };
        Schedule { taken, scripts }
    }
}

/// The report of a run of `plan` (warmup excluded); `taken` maps closed-loop samples to their
/// request indices.
fn measure(
    plan: &BenchPlan,
    taken: &Taken,
    mut out: driver::DriverOutput,
    wall: Duration,
) -> BenchRun {
    let shard = plan.shard;
    // Request index of each sample: open loop one per session (the local session j is the
    // global arrival I + j * N); closed loop the index the user took for that turn.
    let open_loop = matches!(plan.load, Load::Open { .. });
    let taken = taken.lock().map(|t| t.clone()).unwrap_or_default();
    let ks: Vec<usize> = out
        .samples
        .iter()
        .map(|s| {
            if open_loop {
                crate::run::shard::global(shard, s.session)
            } else {
                taken
                    .get(s.session)
                    .and_then(|t| t.get(s.turn))
                    .copied()
                    .unwrap_or(s.seq as usize)
            }
        })
        .collect();
    // Records carry the global arrival or user index.
    for s in &mut out.samples {
        s.session = crate::run::shard::global(shard, s.session);
    }
    let infos: Vec<RequestInfo> = ks.iter().map(|&k| info(plan, k)).collect();
    let measured: Vec<_> = out
        .samples
        .iter()
        .zip(ks.iter().zip(&infos))
        .filter(|(s, (&k, _))| match plan.warmup {
            None => true,
            // Sharded, the first N requests of the whole run (by request index).
            Some(Warmup::Requests(n)) if shard.is_some() => k >= n,
            Some(Warmup::Requests(n)) => s.seq >= n as u64,
            Some(Warmup::Seconds(x)) => (s.scheduled_us as f64) >= x * 1e6,
        })
        .map(|(s, (_, info))| (s, info))
        .collect();
    let warmup_requests = out.samples.len() - measured.len();
    let mut live = replay_report::build(&measured, wall);
    live.set_started_at(out.started_at);
    live.set_shard(shard);
    let mut json = bench_json(&live, &plan.describe(), warmup_requests, plan.slo);
    crate::run::shard::annotate(&mut json, shard);
    let goodput = plan
        .slo
        .map(|slo| goodput(&slo, &live.records, live.report.duration_ms / 1000.0));
    BenchRun {
        live,
        goodput,
        warmup_requests,
        json,
        aborted: out.aborted,
        server_lateness: None,
    }
}

/// The bench report JSON of `live`: its keys, then the mode, warmup, token lengths and goodput.
pub(crate) fn bench_json(
    live: &replay_report::LiveReport,
    mode: &str,
    warmup_requests: usize,
    slo: Option<Slo>,
) -> serde_json::Value {
    let duration_s = live.report.duration_ms / 1000.0;
    let goodput = slo.map(|slo| goodput(&slo, &live.records, duration_s));
    let inputs: Vec<f64> = live
        .records
        .iter()
        .filter_map(|r| r.prompt_tokens)
        .map(|n| n as f64)
        .collect();
    let outputs: Vec<f64> = live
        .records
        .iter()
        .map(|r| r.record.output_length as f64)
        .collect();
    let (in_mean, in_std) = mean_std(&inputs);
    let (out_mean, out_std) = mean_std(&outputs);
    live.to_json(&[
        ("mode", json!(mode)),
        ("warmup_requests", json!(warmup_requests)),
        ("input_tokens_mean", json!(in_mean)),
        ("input_tokens_std", json!(in_std)),
        ("output_tokens_mean", json!(out_mean)),
        ("output_tokens_std", json!(out_std)),
        ("slo", json!(slo)),
        ("goodput", json!(goodput)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(flags: &[&str]) -> Result<BenchPlan, LoadgenError> {
        use clap::Parser;
        let mut argv = vec!["loadgen", "bench"];
        argv.extend_from_slice(flags);
        match crate::Cli::try_parse_from(argv)
            .expect("valid flags")
            .command
        {
            crate::Command::Bench(a) => a.plan(),
            _ => unreachable!(),
        }
    }

    fn ok(flags: &[&str]) -> BenchPlan {
        plan(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    #[test]
    fn plans_for_each_flag_combination() {
        assert_eq!("5".parse::<Warmup>(), Ok(Warmup::Requests(5)));
        assert_eq!("1.5s".parse::<Warmup>(), Ok(Warmup::Seconds(1.5)));
        let p = ok(&[]);
        assert_eq!(p.load, Load::Closed { users: 1 });
        assert_eq!(p.stop, Stop::Requests(DEFAULT_NUM_REQUESTS));
        assert_eq!((p.warmup, p.slo, p.max_failure_rate), (None, None, 0.05));
        assert!(p.arrival_offsets().is_empty());
        assert_eq!(ok(&["--concurrency", "8"]).load, Load::Closed { users: 8 });
        let open = |rate, arrival, burstiness, max_in_flight| Load::Open {
            rate,
            arrival,
            burstiness,
            max_in_flight,
        };
        assert_eq!(
            ok(&["--request-rate", "5"]).load,
            open(Rate::PerSecond(5.0), Arrival::Poisson, 1.0, None)
        );
        assert_eq!(
            ok(&["--request-rate", "5", "--concurrency", "3"]).load,
            open(Rate::PerSecond(5.0), Arrival::Poisson, 1.0, Some(3))
        );
        assert_eq!(
            ok(&["--request-rate", "2", "--arrival", "constant"]).load,
            open(Rate::PerSecond(2.0), Arrival::Constant, 1.0, None)
        );
        assert_eq!(
            ok(&[
                "--request-rate",
                "2",
                "--arrival",
                "gamma",
                "--burstiness",
                "0.5"
            ])
            .load,
            open(Rate::PerSecond(2.0), Arrival::Gamma, 0.5, None)
        );
        let p = ok(&["--request-rate", "inf", "--num-requests", "10"]);
        assert_eq!(p.load, open(Rate::Unlimited, Arrival::Poisson, 1.0, None));
        assert_eq!(p.arrival_offsets(), vec![0.0; 10]);
        let p = ok(&["--request-rate", "10", "--duration", "2"]);
        assert_eq!(p.stop, Stop::Duration(Duration::from_secs(2)));
        let offsets = p.arrival_offsets();
        assert!(!offsets.is_empty() && offsets.iter().all(|&t| t <= 2.0));
        assert_eq!(
            ok(&["--num-requests", "10", "--duration", "5"]).stop,
            Stop::RequestsOrDuration {
                requests: 10,
                duration: Duration::from_secs(5)
            }
        );
        let p = ok(&["--warmup", "5", "--num-requests", "10"]);
        assert_eq!(p.warmup, Some(Warmup::Requests(5)));
        let p = ok(&["--warmup", "2s", "--duration", "5", "--slo", "ttft=1s"]);
        assert_eq!(p.warmup, Some(Warmup::Seconds(2.0)));
        assert_eq!(p.slo.and_then(|s| s.ttft_ms), Some(1000.0));
        let p = ok(&[
            "--shared-prefix-tokens",
            "64",
            "--num-prefix-groups",
            "4",
            "--seed",
            "9",
        ]);
        assert_eq!((p.lengths.num_prefix_groups, p.seed), (4, 9));
        assert_eq!(
            ok(&["--concurrency", "4"]).describe(),
            "closed loop: concurrency 4"
        );
        assert_eq!(
            ok(&["--request-rate", "5", "--concurrency", "3"]).describe(),
            "open loop: 5 req/s (Poisson, burstiness 1), at most 3 in flight"
        );
    }

    #[test]
    fn invalid_plans_are_refused_before_connecting() {
        for (flags, says) in [
            (&["--concurrency", "0"][..], "--concurrency"),
            (&["--request-rate", "0"], "--request-rate"),
            (&["--request-rate=-1"], "--request-rate"),
            (&["--arrival", "gamma"], "--request-rate"),
            (&["--burstiness", "2"], "--request-rate"),
            (
                &["--request-rate", "2", "--burstiness", "2"],
                "--arrival gamma",
            ),
            (
                &[
                    "--request-rate",
                    "2",
                    "--arrival",
                    "poisson",
                    "--burstiness",
                    "2",
                ],
                "--arrival gamma",
            ),
            (
                &[
                    "--request-rate",
                    "2",
                    "--arrival",
                    "gamma",
                    "--burstiness",
                    "0",
                ],
                "--burstiness",
            ),
            (
                &[
                    "--request-rate",
                    "inf",
                    "--arrival",
                    "constant",
                    "--num-requests",
                    "3",
                ],
                "inf",
            ),
            (
                &["--request-rate", "inf", "--duration", "5"],
                "--num-requests",
            ),
            (&["--num-requests", "0"], "--num-requests"),
            (&["--duration", "0"], "--duration"),
            (&["--duration", "inf"], "--duration"),
            (&["--warmup", "10", "--num-requests", "10"], "--warmup"),
            (&["--warmup", "5s", "--duration", "5"], "--warmup"),
            (&["--input-tokens-stddev=-1"], "--input-tokens-stddev"),
            (&["--output-tokens", "0"], "--output-tokens"),
            (&["--num-prefix-groups", "0"], "--num-prefix-groups"),
            (&["--num-prefix-groups", "2"], "--shared-prefix-tokens"),
            (&["--max-failure-rate", "2"], "--max-failure-rate"),
        ] {
            match plan(flags) {
                Err(e @ (LoadgenError::Config(_) | LoadgenError::OutOfRange { .. })) => {
                    assert!(e.to_string().contains(says), "{flags:?}: {e}")
                }
                other => panic!("{flags:?}: {other:?}"),
            }
        }
    }
}
