//! `loadgen bench`: synthetic load, closed loop (`--concurrency N`), open loop (`--request-rate R`
//! with Poisson, constant or gamma arrivals), or both (the rate capped at N in flight), on the
//! same driver as `replay` and `multiturn`; goodput against `--slo`.
//!
//! Open loop precomputes every request's send offset from a seeded generator (vLLM's
//! `--burstiness`: gamma inter-arrival gaps with shape `burstiness` and mean `1 / rate`;
//! burstiness 1 is Poisson). Each request is then a one-request session at its absolute offset.
//! Closed loop runs `N` sessions that each send their next request as soon as the previous one
//! finished. `--seed` (the engine's) also seeds arrivals, lengths and text. Prompts: an optional shared prefix (`--shared-prefix-tokens`, one per prefix group,
//! request `k` in group `k % --num-prefix-groups`) followed by `--input-tokens` (normal with
//! `--input-tokens-stddev`, at least 1) unique tokens, exact for a known tokenizer.

use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::json;

use crate::client::Response;
use crate::driver::{self, DriverConfig, Planned, Script, Start};
use crate::error::LoadgenError;
use crate::prompt::PromptSynth;
use crate::replay_report::{self, LiveRecord, RequestInfo};
use crate::target::{completion_body, Api, EmbeddedOptions, TargetArgs};
use mock_server::args::ReportArgs;

/// `loadgen bench` flags.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Closed loop: this many requests in flight (with --request-rate: the cap).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: requests per second ("inf" = all at once).
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Inter-arrival distribution of the open loop.
    #[arg(long, value_enum, default_value_t = Arrival::Poisson)]
    pub arrival: Arrival,
    /// Gamma shape of the inter-arrival gaps (below 1 burstier, above 1 smoother; 1 = Poisson).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Requests to send [default: 100 unless --duration is given].
    #[arg(long)]
    pub num_requests: Option<usize>,
    /// Stop sending after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Excluded from the statistics: the first N requests ("N") or those due in the first S
    /// seconds ("Ss").
    #[arg(long)]
    pub warmup: Option<Warmup>,
    /// Mean unique prompt tokens per request.
    #[arg(long, default_value_t = 256)]
    pub input_tokens: usize,
    /// Standard deviation of the unique prompt tokens.
    #[arg(long, default_value_t = 0.0)]
    pub input_tokens_stddev: f64,
    /// Mean output tokens (max_tokens with ignore_eos).
    #[arg(long, default_value_t = 128)]
    pub output_tokens: usize,
    /// Standard deviation of the output tokens.
    #[arg(long, default_value_t = 0.0)]
    pub output_tokens_stddev: f64,
    /// Tokens of a shared system prefix before each prompt (0 = none).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix_tokens: usize,
    /// Distinct shared prefixes; request k uses prefix k mod N.
    #[arg(long, default_value_t = 1)]
    pub num_prefix_groups: usize,
    /// Service-level objectives for goodput, e.g. ttft=200ms,itl=50ms,e2e=10s (itl = a request's
    /// mean inter-token latency; units us, ms, s).
    #[arg(long)]
    pub slo: Option<Slo>,
    /// Report files and progress.
    #[command(flatten)]
    pub report: ReportArgs,

    /// Failure threshold.
    #[command(flatten)]
    pub failures: crate::failure::FailureArgs,
    /// Where requests go.
    #[command(flatten)]
    pub target: TargetArgs,
}

/// Open-loop inter-arrival distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Equal gaps.
    Constant,
    /// Gamma gaps with shape --burstiness.
    Gamma,
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
    /// True when the request completed and meets every objective.
    pub fn met(&self, r: &LiveRecord) -> bool {
        let ok = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
            (None, _) => true,
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
        };
        r.error.is_none()
            && r.record.status == servesim::metrics::RequestStatus::Completed
            && ok(self.ttft_ms, r.record.ttft_ms)
            && (self.itl_ms.is_none()
                || r.record
                    .itl_ms
                    .is_none_or(|v| v <= self.itl_ms.unwrap_or(f64::INFINITY)))
            && ok(self.e2e_ms, r.record.e2e_latency_ms)
    }
}

/// Goodput figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Goodput {
    /// Requests meeting every SLO.
    pub good_requests: usize,
    /// Requests counted (errors included).
    pub total_requests: usize,
    /// good / total.
    pub share: f64,
    /// good per second of the measured window.
    pub rate_rps: f64,
}

/// Goodput of `records` over `duration_s` (errors count as misses).
pub fn goodput(slo: &Slo, records: &[LiveRecord], duration_s: f64) -> Goodput {
    let good = records.iter().filter(|r| slo.met(r)).count();
    Goodput {
        good_requests: good,
        total_requests: records.len(),
        share: if records.is_empty() {
            0.0
        } else {
            good as f64 / records.len() as f64
        },
        rate_rps: if duration_s > 0.0 {
            good as f64 / duration_s
        } else {
            0.0
        },
    }
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A gamma draw with `shape` and scale 1 (Marsaglia and Tsang).
fn gamma(rng: &mut ChaCha8Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = 1.0 - rng.gen::<f64>();
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = 1.0 - rng.gen::<f64>();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// Open-loop send offsets (seconds): request 0 at 0, then `count - 1` gaps, none past `limit_s`.
pub fn arrival_offsets(
    rate: f64,
    arrival: Arrival,
    burstiness: f64,
    count: usize,
    limit_s: f64,
    seed: u64,
) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xA11_1FA1);
    let mut out = Vec::new();
    let mut t = 0.0;
    while out.len() < count && t <= limit_s {
        out.push(t);
        if rate.is_infinite() {
            continue;
        }
        let mean = 1.0 / rate;
        t += match arrival {
            Arrival::Constant => mean,
            Arrival::Poisson => -(1.0 - rng.gen::<f64>()).ln() * mean,
            Arrival::Gamma => gamma(&mut rng, burstiness) * mean / burstiness,
        };
    }
    out
}

/// Request `k`'s lengths: (unique input tokens, output tokens).
fn lengths(args: &BenchArgs, k: usize) -> (usize, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(
        args.target
            .engine
            .seed
            .wrapping_mul(0x9E37_79B9)
            .wrapping_add(k as u64),
    );
    let draw = |rng: &mut ChaCha8Rng, mean: usize, sd: f64| {
        ((mean as f64 + sd * normal(rng)).round().max(1.0)) as usize
    };
    (
        draw(&mut rng, args.input_tokens, args.input_tokens_stddev),
        draw(&mut rng, args.output_tokens, args.output_tokens_stddev),
    )
}

/// Builds request bodies.
struct Requests {
    args: BenchArgs,
    synth: PromptSynth,
    model: String,
}

/// Hash-id space of the shared prefixes (unique parts use the request index).
const PREFIX_ID_BASE: u64 = 1 << 62;

impl Requests {
    fn info(&self, k: usize) -> RequestInfo {
        let (input, output) = lengths(&self.args, k);
        RequestInfo {
            input_length: self.args.shared_prefix_tokens + input,
            max_output: output,
            session: None,
            turn: 0,
            expected_reused_tokens: None,
        }
    }

    fn body(&self, k: usize) -> serde_json::Value {
        let (input, output) = lengths(&self.args, k);
        let groups = self.args.num_prefix_groups.max(1) as u64;
        let mut pieces = Vec::new();
        if self.args.shared_prefix_tokens > 0 {
            let g = PREFIX_ID_BASE + k as u64 % groups;
            pieces.extend(self.synth.filler(g, self.args.shared_prefix_tokens));
        }
        let unique = self.args.target.engine.seed.rotate_left(32) ^ k as u64;
        pieces.extend(self.synth.filler(unique, input));
        completion_body(&self.model, self.synth.text(&pieces), output)
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

/// One closed-loop user: the next request index as soon as the previous finished.
struct User {
    requests: Arc<Requests>,
    next: Arc<AtomicUsize>,
    limit: usize,
    ks: Vec<usize>,
}

impl Script for User {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let k = self.next.fetch_add(1, Ordering::Relaxed);
        if k >= self.limit {
            return None;
        }
        let start = if self.ks.is_empty() {
            Start::At(Duration::ZERO)
        } else {
            Start::After(Duration::ZERO)
        };
        self.ks.push(k);
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
    let bad = |m: &str| Err(LoadgenError::Config(m.to_string()));
    if args.concurrency == Some(0) {
        return bad("--concurrency must be positive");
    }
    args.failures.max_failure_rate()?;
    if let Some(r) = args.request_rate {
        if r.is_nan() || r <= 0.0 {
            return bad("--request-rate must be positive (or inf)");
        }
    }
    if !(args.burstiness.is_finite() && args.burstiness > 0.0) {
        return bad("--burstiness must be positive");
    }
    if args.duration.is_some_and(|d| !(d.is_finite() && d > 0.0)) {
        return bad("--duration must be positive seconds");
    }
    let limit = args.num_requests.unwrap_or(if args.duration.is_some() {
        usize::MAX
    } else {
        100
    });
    if limit == 0 {
        return bad("--num-requests must be positive");
    }
    let spec = args.target.spec(&EmbeddedOptions::default())?;
    let target = spec.connect(Api::Completions).await?;
    let requests = Arc::new(Requests {
        args: args.clone(),
        synth: target.synth(1),
        model: target.model.clone(),
    });
    let limit_s = args.duration.unwrap_or(f64::INFINITY);
    let open_loop = args.request_rate.is_some();
    let (scripts, max_in_flight, mode): (Vec<Box<dyn Script>>, Option<usize>, String) =
        match (args.request_rate, args.concurrency) {
            (Some(rate), cap) => {
                let offsets = arrival_offsets(
                    rate,
                    args.arrival,
                    args.burstiness,
                    limit,
                    limit_s,
                    args.target.engine.seed,
                );
                let s = offsets
                    .into_iter()
                    .enumerate()
                    .map(|(k, t)| {
                        Box::new(OneShot {
                            requests: requests.clone(),
                            k,
                            at: Duration::from_secs_f64(t),
                            sent: false,
                        }) as Box<dyn Script>
                    })
                    .collect();
                (
                    s,
                    cap,
                    format!(
                        "open loop: {rate} req/s ({:?}, burstiness {}), cap {cap:?}",
                        args.arrival, args.burstiness
                    ),
                )
            }
            (None, c) => {
                let n = c.unwrap_or(1);
                let next = Arc::new(AtomicUsize::new(0));
                let s = (0..n)
                    .map(|_| {
                        Box::new(User {
                            requests: requests.clone(),
                            next: next.clone(),
                            limit,
                            ks: Vec::new(),
                        }) as Box<dyn Script>
                    })
                    .collect();
                (s, None, format!("closed loop: concurrency {n}"))
            }
        };
    println!(
        "loadgen bench: {mode}; prompts {} ({})",
        if requests.synth.is_exact() {
            "exact"
        } else {
            "approximate"
        },
        target.url
    );
    let bar = if args.report.show_progress() {
        ProgressBar::with_draw_target(
            (limit != usize::MAX).then_some(limit as u64),
            ProgressDrawTarget::stderr(),
        )
    } else {
        ProgressBar::hidden()
    };
    let config = DriverConfig {
        max_in_flight,
        stop_after: args.duration.map(Duration::from_secs_f64),
        bar: Some(bar.clone()),
        observer: None,
    };
    let started = std::time::Instant::now();
    let result = driver::drive(target.endpoint.clone(), scripts, &config).await;
    let wall = started.elapsed();
    bar.finish_and_clear();
    target.shutdown().await;
    let out = result?;
    // Request index of each sample: open loop one per session; closed loop by send order (the
    // prompt length itself comes from the server's usage).
    let infos: Vec<RequestInfo> = (0..out.samples.len()).map(|i| requests.info(i)).collect();
    let measured: Vec<_> = out
        .samples
        .iter()
        .filter(|s| match args.warmup {
            None => true,
            Some(Warmup::Requests(n)) => s.seq >= n as u64,
            Some(Warmup::Seconds(x)) => (s.scheduled_us as f64) >= x * 1e6,
        })
        .map(|s| {
            let k = if open_loop { s.session } else { s.seq as usize };
            (s, &infos[k.min(infos.len() - 1)])
        })
        .collect();
    let warmup_requests = out.samples.len() - measured.len();
    let live = replay_report::build(&measured, wall);
    let duration_s = live.report.duration_ms / 1000.0;
    let goodput = args.slo.map(|slo| goodput(&slo, &live.records, duration_s));
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
    let json = live.to_json(&[
        ("mode", json!(mode)),
        ("warmup_requests", json!(warmup_requests)),
        ("input_tokens_mean", json!(in_mean)),
        ("input_tokens_std", json!(in_std)),
        ("output_tokens_mean", json!(out_mean)),
        ("output_tokens_std", json!(out_std)),
        ("slo", json!(args.slo)),
        ("goodput", json!(goodput)),
    ]);
    println!("Bench report ({warmup_requests} warmup requests excluded)");
    print!("{}", live.report);
    println!(
        "Tokens per request: input {in_mean:.1} ± {in_std:.1}, output {out_mean:.1} ± {out_std:.1}"
    );
    if let Some(g) = &goodput {
        println!(
            "Goodput: {}/{} requests met every SLO ({:.1}%), {:.2} req/s",
            g.good_requests,
            g.total_requests,
            100.0 * g.share,
            g.rate_rps
        );
    }
    print!("{}", live.failure_lines());
    print!("{}", live.lag_lines());
    replay_report::write_files(
        &json,
        &live.records,
        args.report.report_json.as_deref(),
        args.report.per_request_jsonl.as_deref(),
    )?;
    Ok(BenchRun {
        live,
        goodput,
        warmup_requests,
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::metrics::{RequestRecord, RequestStatus};

    fn rec(ttft: f64, itl: Option<f64>, e2e: f64, ok: bool) -> LiveRecord {
        LiveRecord {
            record: RequestRecord {
                request_id: 0,
                session_id: None,
                turn_index: 0,
                worker: None,
                arrival_ms: 0.0,
                first_admit_ms: None,
                first_token_ms: None,
                last_token_ms: None,
                finish_ms: None,
                ttft_ms: ok.then_some(ttft),
                ttst_ms: None,
                e2e_latency_ms: ok.then_some(e2e),
                itl_ms: itl,
                input_length: 1,
                output_length: 1,
                max_output_tokens: 1,
                reused_input_tokens: 0,
                g2_reused_input_tokens: 0,
                kv_transfer_ms: None,
                status: if ok {
                    RequestStatus::Completed
                } else {
                    RequestStatus::Rejected
                },
            },
            scheduled_ms: 0.0,
            sent_ms: 0.0,
            schedule_lag_ms: 0.0,
            prompt_tokens: None,
            expected_reused_tokens: None,
            chunks: 1,
            usage_output_tokens: Some(1),
            usage_mismatch: false,
            error: (!ok).then(|| "HTTP 500".to_string()),
            error_kind: (!ok).then_some("http"),
            error_status: (!ok).then_some(500),
        }
    }

    #[test]
    fn slo_parsing_and_goodput_arithmetic() {
        let slo: Slo = "ttft=200ms,itl=50ms,e2e=10s".parse().expect("valid");
        assert_eq!(
            slo,
            Slo {
                ttft_ms: Some(200.0),
                itl_ms: Some(50.0),
                e2e_ms: Some(10_000.0)
            }
        );
        assert!("ttft=fast".parse::<Slo>().is_err());
        assert!("foo=1ms".parse::<Slo>().is_err());
        let records = vec![
            rec(100.0, Some(20.0), 5_000.0, true), // good
            rec(250.0, Some(20.0), 5_000.0, true), // TTFT miss
            rec(100.0, Some(60.0), 5_000.0, true), // ITL miss
            rec(100.0, None, 11_000.0, true),      // E2E miss
            rec(100.0, None, 1_000.0, true),       // good (one token: no ITL)
            rec(0.0, None, 0.0, false),            // error: a miss
        ];
        let g = goodput(&slo, &records, 2.0);
        assert_eq!((g.good_requests, g.total_requests), (2, 6));
        assert!((g.share - 2.0 / 6.0).abs() < 1e-12);
        assert!((g.rate_rps - 1.0).abs() < 1e-12);
        assert_eq!("5".parse::<Warmup>(), Ok(Warmup::Requests(5)));
        assert_eq!("1.5s".parse::<Warmup>(), Ok(Warmup::Seconds(1.5)));
    }

    #[test]
    fn arrivals_have_the_requested_rate() {
        for arrival in [Arrival::Poisson, Arrival::Constant, Arrival::Gamma] {
            let t = arrival_offsets(100.0, arrival, 0.5, 4001, f64::INFINITY, 1);
            assert_eq!(t.len(), 4001);
            let rate = 4000.0 / t[4000];
            assert!((rate - 100.0).abs() < 8.0, "{arrival:?} {rate}");
        }
        assert!(
            arrival_offsets(f64::INFINITY, Arrival::Poisson, 1.0, 5, 1.0, 1)
                .iter()
                .all(|&t| t == 0.0)
        );
        assert_eq!(
            arrival_offsets(10.0, Arrival::Constant, 1.0, 100, 0.35, 1).len(),
            4
        );
    }
}
