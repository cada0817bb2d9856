//! The elastic fleet's flags ([`ElasticArgs`]) and their validated value ([`ElasticConfig`]);
//! [`ElasticError`] names the bad flag.
//!
//! The lifecycle's durations (`--model-load`, `--model-load-jitter`, `--autoscale-tick`,
//! `--scrape-delay`) are simulated time, as `mockserve replay` takes them: the fleet runs them
//! `--speedup-ratio` times faster on the wall clock, as its engine runs every pass, so one flag
//! speeds the whole fleet up. `--drain-grace` and `--autoscale-timeout` stay wall-clock time
//! (they wait on routers and on a process, not on the simulation).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::fleet::fault;

/// The longest model load or drain grace (365 days, as a fault window).
const MAX_DELAY: Duration = fault::MAX_FAULT_TIME;

/// The scrape delay without `--scrape-delay` (at most half the tick), as `mockserve replay`'s.
const DEFAULT_SCRAPE_DELAY: Duration = Duration::from_secs(15);

/// `mockserve fleet --elastic` flags.
#[derive(Args, Debug, Clone, Default)]
pub struct ElasticArgs {
    /// Workers can be added and removed at run time (`PUT /fleet/scale` on the admin
    /// listener); the fleet starts with --min-workers ready ones.
    #[arg(long, conflicts_with = "workers", requires = "max_workers")]
    pub elastic: bool,

    /// Fewest workers of an elastic fleet (a scale request below is refused).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "elastic")]
    pub min_workers: usize,

    /// Most workers of an elastic fleet: as many listeners (ports) are set aside.
    #[arg(long, value_name = "N", requires = "elastic")]
    pub max_workers: Option<usize>,

    /// Mean time a provisioned worker takes to load its model (`240s`, `200ms`), before it
    /// answers `/health` and takes requests.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "240s",
        allow_hyphen_values = true
    )]
    pub model_load: String,

    /// Each load takes --model-load plus a uniform draw in [-JITTER, +JITTER], seeded by
    /// --seed.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "30s",
        allow_hyphen_values = true
    )]
    pub model_load_jitter: String,

    /// How long a draining worker still takes new requests after it left the manifest and
    /// the discovery file (routers that poll them catch up meanwhile); then it answers 503.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "2s",
        allow_hyphen_values = true
    )]
    pub drain_grace: String,

    /// Scale the fleet from inside: every --autoscale-tick a policy sees the fleet's metrics
    /// and sets the count (load, saturation or external:CMD; CMD runs through `sh -c`, one
    /// JSON observation per line in, `{"workers": N}` per line out). Without it, only
    /// `PUT /fleet/scale` scales.
    #[arg(long, value_name = "POLICY", requires = "elastic")]
    pub autoscale: Option<servesim::autoscale::PolicySpec>,

    /// How old the metrics a decision sees are: the autoscaler scrapes the fleet this long
    /// before each tick, as `mockserve replay --scrape-delay` does (below the tick) [default:
    /// 15s, or half the tick when that is shorter].
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub scrape_delay: Option<String>,

    /// Serve one endpoint in front of the fleet on this port of --host (0 picks one): each
    /// generation request goes to the next ready worker, round-robin, so that a client with one
    /// URL (loadgen) follows the fleet's size.
    #[arg(long, value_name = "PORT", requires = "elastic")]
    pub front_port: Option<u16>,

    /// Write the fleet's lifecycle here, rewritten on every change: GPUs held and ready
    /// workers over time, every scale event, in simulated seconds from the first request
    /// (`loadgen replay --fleet-lifecycle` judges a run from it).
    #[arg(long, value_name = "PATH", requires = "elastic")]
    pub lifecycle_log: Option<PathBuf>,

    /// Time between the autoscaler's decisions.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "30s",
        allow_hyphen_values = true
    )]
    pub autoscale_tick: String,

    /// How long an external policy may take to answer before the fleet holds its count.
    #[arg(
        long,
        value_name = "TIME",
        default_value = "10s",
        allow_hyphen_values = true
    )]
    pub autoscale_timeout: String,

    /// Write the serving workers here in the format of llm-d's file discovery, rewritten on
    /// every change.
    #[arg(long, value_name = "PATH", requires = "elastic")]
    pub discovery_file: Option<PathBuf>,

    /// The objectives `load` and `saturation` size a worker for, as `mockserve replay --slo`
    /// does (ttft=2000ms,tpot=50ms): the utilisation at which requests still meet the TTFT
    /// bound, and the decode batch within the TPOT bound. Without it, a worker counts at full
    /// utilisation within a 50 ms decode step.
    #[arg(long, value_name = "OBJECTIVES", requires = "autoscale")]
    pub slo: Option<servesim::slo::Slo>,

    /// The mean prompt length (tokens) at which `load` and `saturation` size a worker for
    /// --slo [default: the prompts of the first tick that saw requests]. Give the value
    /// `mockserve replay --autoscale` sizes at (the trace's mean) to compare the two.
    #[arg(
        long,
        value_name = "TOKENS",
        requires = "autoscale",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub autoscale_isl: Option<u32>,

    /// The mean output length (tokens) at which `load` and `saturation` size a worker
    /// [default: the outputs of the first tick that saw requests].
    #[arg(
        long,
        value_name = "TOKENS",
        requires = "autoscale",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub autoscale_osl: Option<u32>,
}

/// Why the elastic flags are refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElasticError {
    /// `--max-workers 0`.
    #[error("--max-workers 0: an elastic fleet needs room for at least one worker")]
    NoRoom,
    /// More than the fleet's limit.
    #[error("--max-workers {given}: a fleet runs at most {max} workers")]
    TooMany {
        /// As given.
        given: usize,
        /// The limit.
        max: usize,
    },
    /// `--min-workers` above `--max-workers`.
    #[error("--min-workers {min} is above --max-workers {max}")]
    MinAboveMax {
        /// As given.
        min: usize,
        /// As given.
        max: usize,
    },
    /// A time flag that does not parse or is negative.
    #[error("--{flag}: {reason}")]
    Time {
        /// The flag's name.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `--listen` with other than one address per slot.
    #[error("--max-workers {max} but --listen gives {addresses} addresses: give one per slot")]
    ListenCount {
        /// As given.
        max: usize,
        /// Addresses given.
        addresses: usize,
    },
    /// `--autoscale-isl` or `--autoscale-osl` with an external policy.
    #[error("{}", servesim::autoscale::EXTERNAL_SIZES_ITSELF)]
    SizingExternal,
    /// A jitter larger than the load it varies.
    #[error(
        "--model-load-jitter {jitter} is longer than --model-load {load}: a load would take \
         less than no time"
    )]
    JitterAboveLoad {
        /// As given.
        jitter: String,
        /// As given.
        load: String,
    },
}

/// A validated elastic fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct ElasticConfig {
    /// Fewest workers.
    pub min: usize,
    /// Most workers (slots).
    pub max: usize,
    /// Mean model load, simulated time.
    pub model_load: Duration,
    /// Half-width of the load's uniform spread, simulated time.
    pub model_load_jitter: Duration,
    /// How long a draining worker still takes new requests.
    pub drain_grace: Duration,
    /// Where to write the discovery file.
    pub discovery_file: Option<PathBuf>,
    /// Seeds the load delays.
    pub seed: u64,
    /// The policy that scales the fleet from inside, if any.
    pub autoscale: Option<servesim::autoscale::PolicySpec>,
    /// Time between its decisions (above 0), simulated time.
    pub autoscale_tick: Duration,
    /// How long before a decision its scrape is taken (below the tick), simulated time.
    pub scrape_delay: Duration,
    /// The simulated clock's speed-up over the wall clock (`--speedup-ratio`).
    pub speedup: f64,
    /// The front endpoint's `(host, port)`, if any.
    pub front: Option<(String, u16)>,
    /// Where to write the lifecycle, if anywhere.
    pub lifecycle_log: Option<PathBuf>,
    /// An external policy's answer time.
    pub autoscale_timeout: Duration,
    /// `--slo`: what `load` and `saturation` size a worker for.
    pub slo: servesim::slo::Slo,
    /// `--autoscale-isl`: the mean prompt length a worker is sized at (None: observed).
    pub sizing_isl: Option<usize>,
    /// `--autoscale-osl`: the mean output length a worker is sized at (None: observed).
    pub sizing_osl: Option<usize>,
}

fn time_flag(flag: &'static str, text: &str) -> Result<Duration, ElasticError> {
    let d = fault::parse_time(text).map_err(|reason| ElasticError::Time { flag, reason })?;
    if d > MAX_DELAY {
        return Err(ElasticError::Time {
            flag,
            reason: format!("{} is longer than 365 days", fault::quoted(text)),
        });
    }
    Ok(d)
}

impl ElasticConfig {
    /// The wall-clock time of simulated duration `d`.
    pub fn wall(&self, d: Duration) -> Duration {
        Duration::from_secs_f64(d.as_secs_f64() / self.speedup)
    }

    /// The elastic fleet the flags describe, or None without `--elastic`; `speedup` is the
    /// engine's `--speedup-ratio` (validated above 0 with it), `host` the fleet's `--host`.
    pub fn from_args(
        args: &ElasticArgs,
        seed: u64,
        speedup: f64,
        host: &str,
    ) -> Result<Option<ElasticConfig>, ElasticError> {
        if !args.elastic {
            return Ok(None);
        }
        let max = args.max_workers.unwrap_or(0);
        if max == 0 {
            return Err(ElasticError::NoRoom);
        }
        if max > crate::fleet::MAX_FLEET_WORKERS {
            return Err(ElasticError::TooMany {
                given: max,
                max: crate::fleet::MAX_FLEET_WORKERS,
            });
        }
        if args.min_workers > max {
            return Err(ElasticError::MinAboveMax {
                min: args.min_workers,
                max,
            });
        }
        let model_load = time_flag("model-load", &args.model_load)?;
        let model_load_jitter = time_flag("model-load-jitter", &args.model_load_jitter)?;
        if model_load_jitter > model_load {
            return Err(ElasticError::JitterAboveLoad {
                jitter: args.model_load_jitter.clone(),
                load: args.model_load.clone(),
            });
        }
        let sized = args.autoscale_isl.is_some() || args.autoscale_osl.is_some();
        if sized
            && matches!(
                args.autoscale,
                Some(servesim::autoscale::PolicySpec::External(_))
            )
        {
            return Err(ElasticError::SizingExternal);
        }
        let autoscale_tick = time_flag("autoscale-tick", &args.autoscale_tick)?;
        if autoscale_tick.is_zero() {
            return Err(ElasticError::Time {
                flag: "autoscale-tick",
                reason: "the tick must be above 0".into(),
            });
        }
        let scrape_delay = match &args.scrape_delay {
            None => DEFAULT_SCRAPE_DELAY.min(autoscale_tick / 2),
            Some(text) => {
                let delay = time_flag("scrape-delay", text)?;
                if args.autoscale.is_some() && delay >= autoscale_tick {
                    return Err(ElasticError::Time {
                        flag: "scrape-delay",
                        reason: format!(
                            "{} is not below --autoscale-tick {}",
                            fault::quoted(text),
                            fault::quoted(&args.autoscale_tick)
                        ),
                    });
                }
                delay
            }
        };
        // `--speedup-ratio` is checked with the engine's flags; "inf" runs the engine without
        // delays, and the lifecycle at its own times.
        let speedup = if speedup.is_finite() && speedup > 0.0 {
            speedup
        } else {
            1.0
        };
        Ok(Some(ElasticConfig {
            min: args.min_workers,
            max,
            model_load,
            model_load_jitter,
            drain_grace: time_flag("drain-grace", &args.drain_grace)?,
            discovery_file: args.discovery_file.clone(),
            seed,
            autoscale: args.autoscale.clone(),
            autoscale_tick,
            autoscale_timeout: time_flag("autoscale-timeout", &args.autoscale_timeout)?,
            scrape_delay,
            speedup,
            front: args.front_port.map(|port| (host.to_string(), port)),
            lifecycle_log: args.lifecycle_log.clone(),
            slo: args.slo.unwrap_or_default(),
            sizing_isl: args.autoscale_isl.map(|v| v as usize),
            sizing_osl: args.autoscale_osl.map(|v| v as usize),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(min: usize, max: Option<usize>) -> ElasticArgs {
        ElasticArgs {
            elastic: true,
            min_workers: min,
            max_workers: max,
            model_load: "240s".into(),
            model_load_jitter: "30s".into(),
            drain_grace: "2s".into(),
            discovery_file: None,
            autoscale: None,
            autoscale_tick: "30s".into(),
            autoscale_timeout: "10s".into(),
            scrape_delay: None,
            front_port: None,
            lifecycle_log: None,
            slo: None,
            autoscale_isl: None,
            autoscale_osl: None,
        }
    }

    #[test]
    fn flags_validate_and_name_the_bad_one() {
        let ok = ElasticConfig::from_args(&args(1, Some(4)), 7, 10.0, "127.0.0.1")
            .expect("valid")
            .expect("elastic");
        assert_eq!((ok.min, ok.max), (1, 4));
        assert_eq!(ok.model_load, Duration::from_secs(240));
        assert_eq!(ok.model_load_jitter, Duration::from_secs(30));
        assert_eq!(ok.drain_grace, Duration::from_secs(2));
        // Simulated durations run ten times faster on the wall clock.
        assert_eq!(ok.wall(ok.model_load), Duration::from_secs(24));
        assert_eq!(ok.wall(ok.scrape_delay), Duration::from_millis(1500));
        let not = ElasticArgs {
            elastic: false,
            ..args(1, Some(4))
        };
        assert_eq!(
            ElasticConfig::from_args(&not, 0, 1.0, "127.0.0.1"),
            Ok(None)
        );
        let err = |a: &ElasticArgs| {
            ElasticConfig::from_args(a, 0, 1.0, "127.0.0.1")
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            err(&args(5, Some(2))),
            "--min-workers 5 is above --max-workers 2"
        );
        assert_eq!(
            err(&args(0, Some(0))),
            "--max-workers 0: an elastic fleet needs room for at least one worker"
        );
        assert_eq!(
            err(&args(0, Some(5000))),
            "--max-workers 5000: a fleet runs at most 4096 workers"
        );
        let negative = ElasticArgs {
            model_load: "-5s".into(),
            ..args(1, Some(2))
        };
        assert_eq!(
            err(&negative),
            "--model-load: time \"-5s\" must be a finite duration >= 0"
        );
        let unitless = ElasticArgs {
            drain_grace: "3".into(),
            ..args(1, Some(2))
        };
        assert_eq!(
            err(&unitless),
            "--drain-grace: time \"3\" needs a unit: us, ms or s"
        );
        let late = ElasticArgs {
            autoscale: Some(servesim::autoscale::PolicySpec::Load),
            scrape_delay: Some("30s".into()),
            ..args(1, Some(2))
        };
        assert_eq!(
            err(&late),
            "--scrape-delay: \"30s\" is not below --autoscale-tick \"30s\""
        );
        let wide = ElasticArgs {
            model_load: "10s".into(),
            model_load_jitter: "20s".into(),
            ..args(1, Some(2))
        };
        assert_eq!(
            err(&wide),
            "--model-load-jitter 20s is longer than --model-load 10s: a load would take less \
             than no time"
        );
        let external_sized = ElasticArgs {
            autoscale: Some(servesim::autoscale::PolicySpec::External("cat".into())),
            autoscale_isl: Some(1000),
            ..args(1, Some(2))
        };
        assert_eq!(
            err(&external_sized),
            "--autoscale-isl and --autoscale-osl size the load and saturation policies; an \
             external policy sizes its workers itself"
        );
        let sized = ElasticArgs {
            autoscale: Some(servesim::autoscale::PolicySpec::Load),
            autoscale_isl: Some(15_325),
            autoscale_osl: Some(382),
            ..args(1, Some(2))
        };
        let sized = ElasticConfig::from_args(&sized, 0, 1.0, "127.0.0.1")
            .expect("valid")
            .expect("elastic");
        assert_eq!(
            (sized.sizing_isl, sized.sizing_osl),
            (Some(15_325), Some(382))
        );
    }
}
