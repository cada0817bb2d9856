//! Synthetic load instead of a trace: `loadgen bench`'s open-loop flags (`--request-rate`,
//! `--arrival`, `--burstiness`, `--num-requests`, `--duration`, the lengths, the shared
//! prefixes; `--seed` is the engine's, as in loadgen) for `mockserve replay` and `mockserve
//! plan`, validated into the engine's [`SyntheticLoad`] (`servesim::trace::synthetic`, the
//! generator `loadgen bench` sends from).
//!
//! A run takes exactly one input: a TRACE or `--request-rate`. The synthetic requests arrive at
//! `--request-rate` as given: `--arrival-speedup-ratio` (a trace's, 4 by default) divides their
//! offsets only when it is on the command line. A closed loop (`--concurrency`) does not fit a
//! replay whose arrivals are fixed ahead and is refused, naming the flag.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use servesim::trace::synthetic::{
    Arrival, Lengths, SyntheticError, SyntheticLoad, MAX_SYNTHETIC_DURATION_S,
    MAX_SYNTHETIC_OUTPUT_TOKENS, MAX_SYNTHETIC_PROMPT_TOKENS, MAX_SYNTHETIC_RATE,
    SYNTHETIC_BURSTINESS,
};

/// The `--arrival` values, parsed into the engine's [`Arrival`] (for loadgen bench too).
pub fn arrival_parser() -> impl TypedValueParser<Value = Arrival> {
    PossibleValuesParser::new(Arrival::ALL.map(Arrival::name)).try_map(|s| s.parse::<Arrival>())
}

/// Default means of the lengths (loadgen bench's).
const DEFAULT_INPUT_TOKENS: usize = 256;
const DEFAULT_OUTPUT_TOKENS: usize = 128;

/// The synthetic-load flags, as `loadgen bench` spells them.
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "Synthetic load (instead of TRACE, as loadgen bench describes it)")]
pub struct SyntheticFlags {
    /// Synthetic load instead of TRACE: an open loop of this many requests per second (above
    /// 0, at most 10^6; "inf" = all at once, with --num-requests).
    #[arg(long, value_name = "R")]
    pub request_rate: Option<f64>,
    /// Inter-arrival distribution of the synthetic load [default: poisson].
    #[arg(long, value_parser = arrival_parser())]
    pub arrival: Option<Arrival>,
    /// Gamma shape of the gaps with --arrival gamma (below 1 burstier; 1 = Poisson), 0.001 to
    /// 1000 [default: 1].
    #[arg(long)]
    pub burstiness: Option<f64>,
    /// Synthetic requests, 1 to 10^7 [default: 100 unless --duration is given].
    #[arg(long, value_name = "N")]
    pub num_requests: Option<usize>,
    /// No synthetic request due after this many seconds (above 0, at most 604800).
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Mean unique prompt tokens per synthetic request (with --shared-prefix-tokens at most
    /// 2^22) [default: 256].
    #[arg(long, value_name = "N")]
    pub input_tokens: Option<usize>,
    /// Standard deviation of the unique prompt tokens (0 to 2^22; draws stay within 1 and
    /// 2^22) [default: 0].
    #[arg(long, value_name = "SD")]
    pub input_tokens_stddev: Option<f64>,
    /// Mean output tokens per synthetic request, 1 to 2^22 [default: 128].
    #[arg(long, value_name = "N")]
    pub output_tokens: Option<usize>,
    /// Standard deviation of the output tokens (0 to 2^22) [default: 0].
    #[arg(long, value_name = "SD")]
    pub output_tokens_stddev: Option<f64>,
    /// Tokens of a shared prefix before each synthetic prompt; its whole KV blocks are shared
    /// by the requests of a group (at most 2^22) [default: 0].
    #[arg(long, value_name = "N")]
    pub shared_prefix_tokens: Option<usize>,
    /// Distinct shared prefixes; request k uses prefix k mod N (1 to 10^7) [default: 1].
    #[arg(long, value_name = "N")]
    pub num_prefix_groups: Option<usize>,
    /// loadgen bench's closed loop: refused here (a replay's arrivals are fixed ahead; give
    /// --request-rate).
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
}

/// Trace flags that have no meaning for synthetic load (the block size is the engine's).
const TRACE_ONLY: &[(&str, &str)] = &[
    ("trace_format", "--trace-format"),
    ("trace_block_size", "--trace-block-size"),
    ("agentic_lanes", "--agentic-lanes"),
];

/// The synthetic flags with what the command line said about the trace flags beside them.
#[derive(Clone, Debug, Default)]
pub struct SyntheticArgs {
    /// The flags.
    pub flags: SyntheticFlags,
    /// Whether `--arrival-speedup-ratio` was on the command line (synthetic load ignores its
    /// default of 4).
    pub speedup_given: bool,
    /// The trace-only flags on the command line.
    pub trace_flags_given: Vec<&'static str>,
}

/// Every synthetic flag (the load, not the engine): what a live fleet's command leaves out.
pub const FLAGS: &[&str] = &[
    "--request-rate",
    "--arrival",
    "--burstiness",
    "--num-requests",
    "--duration",
    "--input-tokens",
    "--input-tokens-stddev",
    "--output-tokens",
    "--output-tokens-stddev",
    "--shared-prefix-tokens",
    "--num-prefix-groups",
    "--concurrency",
];

impl Args for SyntheticArgs {
    fn augment_args(cmd: Command) -> Command {
        // The heading ends with these flags: the ones after them go back under "Options".
        SyntheticFlags::augment_args(cmd).next_help_heading(None::<&'static str>)
    }
    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for SyntheticArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        // The trace flags are flattened beside these ones, into the same matches.
        let given = |id: &str| {
            m.ids().any(|i| i.as_str() == id)
                && m.value_source(id) == Some(ValueSource::CommandLine)
        };
        Ok(SyntheticArgs {
            flags: SyntheticFlags::from_arg_matches(m)?,
            speedup_given: given("arrival_speedup_ratio"),
            trace_flags_given: TRACE_ONLY
                .iter()
                .filter(|(id, _)| given(id))
                .map(|(_, flag)| *flag)
                .collect(),
        })
    }
    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

/// Why the input flags were refused.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A flag, or a missing or doubled input.
    #[error("{0}")]
    Flag(String),
    /// The load cannot become a trace.
    #[error(transparent)]
    Load(#[from] SyntheticError),
}

impl SyntheticArgs {
    /// The synthetic flags given, in [`FLAGS`] order.
    fn given(&self) -> Vec<&'static str> {
        let f = &self.flags;
        let set = [
            f.request_rate.is_some(),
            f.arrival.is_some(),
            f.burstiness.is_some(),
            f.num_requests.is_some(),
            f.duration.is_some(),
            f.input_tokens.is_some(),
            f.input_tokens_stddev.is_some(),
            f.output_tokens.is_some(),
            f.output_tokens_stddev.is_some(),
            f.shared_prefix_tokens.is_some(),
            f.num_prefix_groups.is_some(),
            f.concurrency.is_some(),
        ];
        FLAGS
            .iter()
            .zip(set)
            .filter(|(_, s)| *s)
            .map(|(f, _)| *f)
            .collect()
    }

    /// True when synthetic load is asked for (any of its flags).
    pub fn is_given(&self) -> bool {
        !self.given().is_empty()
    }

    /// The arrival speed-up a run applies: the flag's value for a trace, and for synthetic
    /// load only when the flag was on the command line (else 1: the rate as given).
    pub fn arrival_speedup(&self, flag: f64) -> f64 {
        if self.is_given() && !self.speedup_given {
            1.0
        } else {
            flag
        }
    }

    /// Checks that exactly one input is given, and validates the synthetic one into a load
    /// seeded by `seed` (None: the run reads its TRACE).
    pub fn load(&self, trace_given: bool, seed: u64) -> Result<Option<SyntheticLoad>, InputError> {
        let bad = |m: String| Err(InputError::Flag(m));
        let given = self.given();
        match (trace_given, given.first()) {
            (true, None) => return Ok(None),
            (false, None) => {
                return bad(
                    "give a TRACE, or synthetic load with --request-rate R (and --num-requests \
                     or --duration; see --help)"
                        .into(),
                )
            }
            (true, Some(flag)) => {
                return bad(format!(
                    "{flag} describes synthetic load, which replaces TRACE: give one or the \
                     other"
                ))
            }
            (false, Some(_)) => {}
        }
        let f = &self.flags;
        if f.concurrency.is_some() {
            return bad(
                "--concurrency (loadgen bench's closed loop) does not fit a replay, whose \
                 arrivals are fixed ahead: give an open loop with --request-rate"
                    .into(),
            );
        }
        if let Some(flag) = self.trace_flags_given.first() {
            return bad(format!(
                "{flag} reads a trace; synthetic load has none (its prompts are in the engine's \
                 --block-size blocks)"
            ));
        }
        let Some(rate) = f.request_rate else {
            return bad(format!(
                "{} describes synthetic load: it needs --request-rate",
                given[0]
            ));
        };
        if !(rate == f64::INFINITY || (rate > 0.0 && rate <= MAX_SYNTHETIC_RATE)) {
            return bad(format!(
                "--request-rate must be above 0 and at most {MAX_SYNTHETIC_RATE}, or inf, got \
                 {rate}"
            ));
        }
        if rate.is_infinite() && (f.arrival.is_some() || f.burstiness.is_some()) {
            return bad(
                "--request-rate inf sends everything at once: --arrival and --burstiness do not \
                 apply"
                    .into(),
            );
        }
        let arrival = f.arrival.unwrap_or(Arrival::Poisson);
        let burstiness = match f.burstiness {
            None => 1.0,
            Some(_) if arrival != Arrival::Gamma => {
                return bad(
                    "--burstiness is the shape of gamma gaps: it needs --arrival gamma".into(),
                )
            }
            Some(b) if !(SYNTHETIC_BURSTINESS.0..=SYNTHETIC_BURSTINESS.1).contains(&b) => {
                let (lo, hi) = SYNTHETIC_BURSTINESS;
                return bad(format!("--burstiness must be from {lo} to {hi}, got {b}"));
            }
            Some(b) => b,
        };
        if let Some(n) = f.num_requests.filter(|n| !(1..=10_000_000).contains(n)) {
            return bad(format!(
                "--num-requests must be from 1 to 10000000, got {n}"
            ));
        }
        if let Some(d) = f
            .duration
            .filter(|d| !(*d > 0.0 && *d <= MAX_SYNTHETIC_DURATION_S))
        {
            return bad(format!(
                "--duration must be above 0 and at most {MAX_SYNTHETIC_DURATION_S} (seconds), got \
                 {d}"
            ));
        }
        if rate.is_infinite() && f.num_requests.is_none() {
            return bad(
                "--request-rate inf needs --num-requests (every request is due at once)".into(),
            );
        }
        let lengths = Lengths {
            input_tokens: f.input_tokens.unwrap_or(DEFAULT_INPUT_TOKENS),
            input_tokens_stddev: f.input_tokens_stddev.unwrap_or(0.0),
            output_tokens: f.output_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS),
            output_tokens_stddev: f.output_tokens_stddev.unwrap_or(0.0),
            shared_prefix_tokens: f.shared_prefix_tokens.unwrap_or(0),
            num_prefix_groups: f.num_prefix_groups.unwrap_or(1),
        };
        let max = MAX_SYNTHETIC_PROMPT_TOKENS as f64;
        let max_output = MAX_SYNTHETIC_OUTPUT_TOKENS as f64;
        for (flag, v, lo, hi) in [
            ("--input-tokens", lengths.input_tokens as f64, 0.0, max),
            (
                "--shared-prefix-tokens",
                lengths.shared_prefix_tokens as f64,
                0.0,
                max,
            ),
            (
                "--input-tokens + --shared-prefix-tokens",
                (lengths.input_tokens + lengths.shared_prefix_tokens) as f64,
                0.0,
                max,
            ),
            (
                "--input-tokens-stddev",
                lengths.input_tokens_stddev,
                0.0,
                max,
            ),
            (
                "--output-tokens",
                lengths.output_tokens as f64,
                1.0,
                max_output,
            ),
            (
                "--output-tokens-stddev",
                lengths.output_tokens_stddev,
                0.0,
                max_output,
            ),
            (
                "--num-prefix-groups",
                lengths.num_prefix_groups as f64,
                1.0,
                1e7,
            ),
        ] {
            if !(lo..=hi).contains(&v) {
                return bad(format!("{flag} must be from {lo} to {hi}, got {v}"));
            }
        }
        if lengths.num_prefix_groups > 1 && lengths.shared_prefix_tokens == 0 {
            return bad("--num-prefix-groups needs --shared-prefix-tokens".into());
        }
        let load = SyntheticLoad {
            rate,
            arrival,
            burstiness,
            num_requests: f.num_requests,
            duration_s: f.duration,
            lengths,
            seed,
        };
        // The count is bounded before anything is drawn.
        load.check()?;
        Ok(Some(load))
    }
}
