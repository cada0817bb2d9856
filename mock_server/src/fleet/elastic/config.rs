//! The elastic fleet's flags ([`ElasticArgs`]) and their validated value ([`ElasticConfig`]);
//! [`ElasticError`] names the bad flag.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::fleet::fault;

/// The longest model load or drain grace (365 days, as a fault window).
const MAX_DELAY: Duration = fault::MAX_FAULT_TIME;

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
    /// Mean model load.
    pub model_load: Duration,
    /// Half-width of the load's uniform spread.
    pub model_load_jitter: Duration,
    /// How long a draining worker still takes new requests.
    pub drain_grace: Duration,
    /// Where to write the discovery file.
    pub discovery_file: Option<PathBuf>,
    /// Seeds the load delays.
    pub seed: u64,
    /// The policy that scales the fleet from inside, if any.
    pub autoscale: Option<servesim::autoscale::PolicySpec>,
    /// Time between its decisions (above 0).
    pub autoscale_tick: Duration,
    /// An external policy's answer time.
    pub autoscale_timeout: Duration,
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
    /// The elastic fleet the flags describe, or None without `--elastic`.
    pub fn from_args(args: &ElasticArgs, seed: u64) -> Result<Option<ElasticConfig>, ElasticError> {
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
        let autoscale_tick = time_flag("autoscale-tick", &args.autoscale_tick)?;
        if autoscale_tick.is_zero() {
            return Err(ElasticError::Time {
                flag: "autoscale-tick",
                reason: "the tick must be above 0".into(),
            });
        }
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
        }
    }

    #[test]
    fn flags_validate_and_name_the_bad_one() {
        let ok = ElasticConfig::from_args(&args(1, Some(4)), 7)
            .expect("valid")
            .expect("elastic");
        assert_eq!((ok.min, ok.max), (1, 4));
        assert_eq!(ok.model_load, Duration::from_secs(240));
        assert_eq!(ok.model_load_jitter, Duration::from_secs(30));
        assert_eq!(ok.drain_grace, Duration::from_secs(2));
        let not = ElasticArgs {
            elastic: false,
            ..args(1, Some(4))
        };
        assert_eq!(ElasticConfig::from_args(&not, 0), Ok(None));
        let err = |a: &ElasticArgs| {
            ElasticConfig::from_args(a, 0)
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
    }
}
