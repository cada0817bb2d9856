//! The autoscaling flags of `mockserve replay` (issue 46): `--autoscale POLICY` with its
//! lifecycle and tick settings, `--rate-profile SPEC` and the judge's `--slo`, validated into
//! [`AutoscaleSettings`] before anything runs.

use std::time::Duration;

use clap::Args;
use servesim::autoscale::{
    parse_duration, LifecycleConfig, PolicySpec, PoolBounds, PoolRole, RateProfile,
    SaturationPolicyConfig,
};
use servesim::cluster::{ClusterConfig, ServingMode};
use servesim::replay::autoscale::AutoscaleSettings;
use servesim::slo::Slo;
use servesim::time::SimDuration;

/// A per-pool count: `N` for every pool, or `prefill=P,decode=D`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCount {
    /// For the aggregated pool, or both pools when given as one number.
    pub all: Option<usize>,
    /// Prefill pool.
    pub prefill: Option<usize>,
    /// Decode pool.
    pub decode: Option<usize>,
}

impl PoolCount {
    fn of(&self, role: PoolRole) -> Option<usize> {
        match role {
            PoolRole::Aggregated => self.all,
            PoolRole::Prefill => self.prefill.or(self.all),
            PoolRole::Decode => self.decode.or(self.all),
        }
    }
}

fn parse_pool_count(s: &str) -> Result<PoolCount, String> {
    if let Ok(n) = s.trim().parse::<usize>() {
        return Ok(PoolCount {
            all: Some(n),
            prefill: None,
            decode: None,
        });
    }
    let mut count = PoolCount {
        all: None,
        prefill: None,
        decode: None,
    };
    for part in s.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("expected N or prefill=P,decode=D, got {s:?}"))?;
        let n: usize = v
            .trim()
            .parse()
            .map_err(|_| format!("{v:?} is not a non-negative integer"))?;
        match k.trim() {
            "prefill" => count.prefill = Some(n),
            "decode" => count.decode = Some(n),
            other => return Err(format!("unknown pool {other:?} (prefill, decode)")),
        }
    }
    Ok(count)
}

fn parse_span(s: &str) -> Result<SimDuration, String> {
    parse_duration(s)
        .ok_or_else(|| format!("{s:?} is not a duration (a number with us, ms or s, not negative)"))
}

fn parse_wall(s: &str) -> Result<Duration, String> {
    parse_span(s).map(|d| Duration::from_micros(d.as_micros()))
}

/// Autoscaling, rate profile and judge flags of `mockserve replay`.
#[derive(Args, Clone, Debug, Default)]
pub struct AutoscaleArgs {
    /// Scale the fleet on the virtual clock: load, saturation or external:CMD (CMD runs
    /// through `sh -c`, one JSON observation per line in, one answer line out).
    #[arg(long, value_name = "POLICY")]
    pub autoscale: Option<PolicySpec>,

    /// Fewest workers per pool (N, or prefill=P,decode=D when disaggregated); the fleet starts
    /// with them [default: 1].
    #[arg(long, value_name = "N", value_parser = parse_pool_count)]
    pub min_workers: Option<PoolCount>,

    /// Most workers per pool (N, or prefill=P,decode=D) [default: 8].
    #[arg(long, value_name = "N", value_parser = parse_pool_count)]
    pub max_workers: Option<PoolCount>,

    /// Mean model-load delay of a new worker [default: 240s].
    #[arg(long, value_name = "DURATION", value_parser = parse_span, allow_hyphen_values = true)]
    pub model_load: Option<SimDuration>,

    /// Each load delay is drawn uniformly within this of the mean (seeded by --seed)
    /// [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_span, allow_hyphen_values = true)]
    pub model_load_jitter: Option<SimDuration>,

    /// Time between scaling decisions, and the judge's window [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = parse_span, allow_hyphen_values = true)]
    pub autoscale_tick: Option<SimDuration>,

    /// How old the metrics a decision sees are (below the tick) [default: 15s].
    #[arg(long, value_name = "DURATION", value_parser = parse_span, allow_hyphen_values = true)]
    pub scrape_delay: Option<SimDuration>,

    /// Wall-clock time an external policy may take per answer before the fleet holds
    /// [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = parse_wall, allow_hyphen_values = true)]
    pub autoscale_timeout: Option<Duration>,

    /// Scale the trace's arrival rate over time, open loop: diurnal:period=600s,min=0.2,
    /// ramp:from=0.2,to=1,over=300s or steps:0s=1,120s=3,240s=0.5.
    #[arg(long, value_name = "SPEC")]
    pub rate_profile: Option<RateProfile>,

    /// Objectives the judge holds requests to (the report's autoscale section), in loadgen's
    /// grammar: ttft=2000ms,tpot=50ms. For an agentic trace, the report's slo section instead
    /// (attainment and goodput), where trajectory_e2e=120s also bounds each request's play.
    #[arg(long, value_name = "OBJECTIVES")]
    pub slo: Option<Slo>,

    /// Skip the oracle's static replays (the oracle and regret figures are then null).
    #[arg(long)]
    pub no_oracle: bool,

    /// The mean prompt length (tokens) at which `load` and `saturation` size a worker's
    /// capacity for --slo [default: the trace's mean]. `mockserve fleet --elastic` takes the
    /// same flag; give both the same value to compare a live fleet with the replay.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub autoscale_isl: Option<u32>,

    /// The mean output length (tokens) at which `load` and `saturation` size a worker's
    /// capacity [default: the trace's mean].
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u32).range(1..))]
    pub autoscale_osl: Option<u32>,
}

impl AutoscaleArgs {
    /// The validated settings, or None when neither --autoscale nor --slo is given.
    /// `num_workers_given`: whether --num-workers was on the command line.
    pub fn settings(
        &self,
        cluster: &ClusterConfig,
        num_workers_given: bool,
        seed: u64,
    ) -> anyhow::Result<Option<AutoscaleSettings>> {
        let lifecycle_flags = [
            ("--min-workers", self.min_workers.is_some()),
            ("--max-workers", self.max_workers.is_some()),
            ("--model-load", self.model_load.is_some()),
            ("--model-load-jitter", self.model_load_jitter.is_some()),
            ("--scrape-delay", self.scrape_delay.is_some()),
            ("--autoscale-timeout", self.autoscale_timeout.is_some()),
            ("--autoscale-isl", self.autoscale_isl.is_some()),
            ("--autoscale-osl", self.autoscale_osl.is_some()),
        ];
        if self.autoscale.is_none() {
            if let Some((flag, _)) = lifecycle_flags.iter().find(|(_, given)| *given) {
                anyhow::bail!("{flag} needs --autoscale");
            }
        }
        let sized = self.autoscale_isl.is_some() || self.autoscale_osl.is_some();
        if sized && matches!(self.autoscale, Some(PolicySpec::External(_))) {
            anyhow::bail!(servesim::autoscale::EXTERNAL_SIZES_ITSELF);
        }
        let Some(slo) = self.slo else {
            if self.autoscale.is_some() {
                anyhow::bail!("--autoscale needs --slo (the objectives its judge holds requests to), e.g. --slo ttft=2000ms,tpot=50ms");
            }
            if self.autoscale_tick.is_some() {
                anyhow::bail!("--autoscale-tick needs --autoscale or --slo");
            }
            return Ok(None);
        };
        if self.autoscale.is_some() && num_workers_given {
            anyhow::bail!("--num-workers sizes a static fleet; with --autoscale use --min-workers and --max-workers");
        }
        let roles: Vec<(PoolRole, usize)> = match &cluster.serving {
            ServingMode::Aggregated => vec![(PoolRole::Aggregated, cluster.num_workers)],
            ServingMode::Disagg {
                num_prefill_workers,
                num_decode_workers,
                ..
            } => vec![
                (PoolRole::Prefill, *num_prefill_workers),
                (PoolRole::Decode, *num_decode_workers),
            ],
        };
        let pools = roles
            .into_iter()
            .map(|(role, size)| {
                if self.autoscale.is_some() {
                    let min = self.min_workers.and_then(|c| c.of(role)).unwrap_or(1);
                    let max = self.max_workers.and_then(|c| c.of(role)).unwrap_or(8);
                    PoolBounds {
                        role,
                        min,
                        max,
                        initial: min,
                    }
                } else {
                    // A static fleet: the judge's oracle searches 1..=size.
                    PoolBounds {
                        role,
                        min: 1.min(size),
                        max: size,
                        initial: size,
                    }
                }
            })
            .collect();
        let tick = self
            .autoscale_tick
            .unwrap_or(SimDuration::from_micros(30_000_000));
        Ok(Some(AutoscaleSettings {
            policy: self.autoscale.clone(),
            lifecycle: LifecycleConfig {
                model_load: self
                    .model_load
                    .unwrap_or(servesim::autoscale::DEFAULT_MODEL_LOAD),
                model_load_jitter: self
                    .model_load_jitter
                    .unwrap_or(servesim::autoscale::DEFAULT_MODEL_LOAD_JITTER),
                seed,
                pools,
            },
            tick,
            scrape_delay: self
                .scrape_delay
                .unwrap_or(SimDuration::from_micros(15_000_000)),
            slo,
            external_timeout: self.autoscale_timeout.unwrap_or(Duration::from_secs(10)),
            // HPA's and WVA's defaults; the running-requests target from the SLO.
            saturation: SaturationPolicyConfig::default(),
            load_utilisation: None,
            sizing_isl: self.autoscale_isl.map(|v| v as usize),
            sizing_osl: self.autoscale_osl.map(|v| v as usize),
            oracle: !self.no_oracle,
        }))
    }
}

/// The console summary of the judge.
pub fn summary(report: &servesim::replay::autoscale::AutoscaleReport) -> String {
    let opt = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.0}"));
    let mut out = format!(
        "Autoscale ({}): {:.0} GPU-seconds, mean {:.2} GPUs, peak {}, SLO attainment {:.4}, \
         {:.0} s in violation, {} scale events, {} oscillations\n\
         Oracle: {} GPU-seconds; regret {} GPU-seconds, {} SLO-seconds\n",
        report.policy,
        report.gpu_seconds,
        report.mean_gpus,
        report.peak_gpus,
        report.slo_attainment,
        report.violation_seconds,
        report.scale_events,
        report.oscillations,
        opt(report.oracle_gpu_seconds),
        opt(report.regret_gpu_seconds),
        opt(report.regret_slo_seconds),
    );
    for w in &report.warnings {
        out.push_str(&format!("warning: {w}\n"));
    }
    out
}
