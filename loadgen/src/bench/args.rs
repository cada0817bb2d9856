//! The `loadgen bench` flags ([`BenchArgs`]) and their validation into a [`BenchPlan`]: every
//! range and every contradictory combination is refused here, before anything connects.

use std::time::Duration;

use clap::Args;

use crate::bench::plan::{BenchPlan, Lengths, Load, Rate, Stop, Warmup, DEFAULT_NUM_REQUESTS};
use crate::bench::slo::Slo;
use crate::error::LoadgenError;
use crate::harness::RunArgs;
use crate::limits;
use crate::run::target::Api;
use servesim::trace::synthetic::Arrival;

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
    #[arg(long, value_parser = mock_server::synthetic::arrival_parser())]
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
    /// The route requests go to: completions (a raw prompt), chat, responses (OpenAI
    /// Responses) or messages (Anthropic Messages): the prompt as one user message, through the
    /// server's chat template; or embeddings (the prompt embedded: no output tokens, TTFT is
    /// the whole latency).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub endpoint: Api,
    /// Real prompts instead of synthetic ones (`--dataset`).
    #[command(flatten, next_help_heading = "Dataset")]
    pub prompts: crate::dataset::DatasetArgs,
    /// Report files, observers, failure threshold, target and sharding.
    #[command(flatten)]
    pub run: RunArgs,
}

impl BenchArgs {
    /// Validates the flags into a plan.
    pub fn plan(&self) -> Result<BenchPlan, LoadgenError> {
        let bad = |m: &str| Err(LoadgenError::Config(m.to_string()));
        if let Some(n) = self.concurrency {
            limits::count("--concurrency", n, 1, limits::MAX_CONCURRENCY)?;
        }
        if let Some(slo) = &self.slo {
            slo.check_trajectories(false, "loadgen bench's synthetic load")
                .map_err(|e| LoadgenError::Config(e.to_string()))?;
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
        if let Some(n) = stop.max_requests() {
            crate::harness::repeat::check_records(self.run.runs.num_runs, n, "--num-requests")?;
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
        let dataset = self.prompts.load(&run.target)?;
        if let Some(d) = &dataset {
            if self.shared_prefix_tokens > 0 {
                return bad("--dataset sets the prompts: --shared-prefix-tokens does not apply");
            }
            if let Some(n) = in_flight {
                limits::product(
                    "--concurrency x (the dataset's longest prompt + --output-tokens)",
                    &[n, d.longest_prompt_tokens() + self.output_tokens],
                    limits::MAX_TOKENS_IN_FLIGHT,
                    "MAX_TOKENS_IN_FLIGHT",
                )?;
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
            dataset,
        })
    }
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
            (
                &["--request-rate", "2", "--slo", "ttft=1s,trajectory_e2e=60s"],
                "--slo: trajectory_e2e bounds the plays (trajectories) of an agentic trace, and \
                 loadgen bench's synthetic load has none",
            ),
        ] {
            match plan(flags) {
                Err(e @ (LoadgenError::Config(_) | LoadgenError::OutOfRange { .. })) => {
                    assert!(e.to_string().contains(says), "{flags:?}: {e}")
                }
                other => panic!("{flags:?}: {other:?}"),
            }
        }
    }

    /// The engine's generator gives `mockserve replay` and `mockserve plan` the requests bench
    /// sends for the same flags: the same send offsets and the same lengths.
    #[test]
    fn bench_sends_the_requests_the_engine_generator_replays() {
        use servesim::trace::synthetic::{Lengths, SyntheticLoad};
        let p = ok(&[
            "--request-rate",
            "40",
            "--num-requests",
            "30",
            "--input-tokens",
            "300",
            "--input-tokens-stddev",
            "60",
            "--output-tokens",
            "12",
            "--output-tokens-stddev",
            "3",
            "--shared-prefix-tokens",
            "128",
            "--num-prefix-groups",
            "2",
            "--seed",
            "5",
        ]);
        let load = SyntheticLoad {
            rate: 40.0,
            arrival: Arrival::Poisson,
            burstiness: 1.0,
            num_requests: Some(30),
            duration_s: None,
            lengths: Lengths {
                input_tokens: 300,
                input_tokens_stddev: 60.0,
                output_tokens: 12,
                output_tokens_stddev: 3.0,
                shared_prefix_tokens: 128,
                num_prefix_groups: 2,
            },
            seed: 5,
        };
        assert_eq!(p.arrival_offsets(), load.offsets().expect("offsets"));
        let mut distinct = std::collections::BTreeSet::new();
        for k in 0..30 {
            let info = crate::bench::schedule::info(&p, None, k);
            let (unique, output) = load.lengths(k);
            assert_eq!((info.input_length, info.max_output), (128 + unique, output));
            distinct.insert(unique);
        }
        assert!(distinct.len() > 5, "the lengths vary: {distinct:?}");
    }
}
