//! `mockserve fleet`: the flags ([`FleetArgs`]: the fleet's own, then `serve`'s), their check
//! into a `FleetConfig` (`FleetConfig::from_args`), and the command ([`run`]): launch, print the
//! addresses, serve until a stop is asked (`crate::cmd::shutdown`, as `serve`), drain. The fleet
//! itself is [`crate::fleet`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use servesim::cluster::ServingMode;
use servesim::router::{RouterConfig, RouterMode};

use crate::args::ServingModeFlag;
use crate::cmd::serve::{ServeArgs, ServeFlagsError, VllmArgs};
use crate::cmd::shutdown;
use crate::config::ServerConfig;
use crate::fleet::elastic;
use crate::fleet::fault::Schedule;
use crate::fleet::judge::{DEFAULT_DECISION_LOG, MAX_DECISION_LOG};
use crate::fleet::metrics::MetricsDialect;
use crate::fleet::{launch, FleetConfig, FleetError, Listen, MAX_FLEET_WORKERS};

/// `mockserve fleet` flags: the fleet's own, then `serve`'s (each worker is configured as one
/// `serve` worker would be).
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// Simulated workers, each its own vLLM-like endpoint [default: one per --listen address].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Each worker's own listen address, comma-separated (`127.0.0.1:8001,127.0.0.2:8001`),
    /// instead of consecutive ports from --port on --host.
    #[arg(
        long,
        value_name = "ADDR,ADDR,...",
        value_delimiter = ',',
        conflicts_with = "port"
    )]
    pub listen: Vec<SocketAddr>,

    /// Write a JSON manifest here once every socket listens: each worker's index, URL,
    /// metrics URL and KV-event endpoints.
    #[arg(long, value_name = "PATH")]
    pub fleet_manifest: Option<PathBuf>,

    /// Serve the fleet's own routes (the whole fleet's `/metrics` with the routing judge's
    /// series, `/fleet/decisions`, `/fleet/manifest`, the workers' faults) on this port of
    /// --host (0 picks one). With --api-key, every one of them needs the key.
    #[arg(long, value_name = "PORT")]
    pub admin_port: Option<u16>,

    /// The metric names of every worker's `/metrics`: vLLM's (as `serve`) or SGLang's.
    #[arg(long, value_enum, value_name = "DIALECT", default_value_t = MetricsDialect::Vllm)]
    pub metrics_dialect: MetricsDialect,

    /// Routing decisions `GET /fleet/decisions` keeps (the latest ones), 0 to 1,000,000 (48
    /// bytes each, whatever the fleet's size).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DECISION_LOG)]
    pub decision_log_size: usize,

    /// Faults on workers by schedule, times from the fleet's start: comma-separated
    /// `WORKER=STATE@START..[END]`, STATE one of `down`, `stalled`, `503`, `slow:K`
    /// (`2=down@10s..20s,3=slow:4@5s..`); outside its windows a worker is `ok`.
    #[arg(long, value_name = "SPEC")]
    pub worker_faults: Option<String>,

    /// Server flags, applied to every worker (--port is the first worker's).
    #[command(flatten)]
    pub serve: ServeArgs,

    /// vLLM-worker flags, applied to every worker (worker i publishes on the port + i).
    #[command(flatten)]
    pub vllm: VllmArgs,

    /// Elastic-fleet flags (`--elastic`).
    #[command(flatten)]
    pub elastic: elastic::ElasticArgs,
}

impl FleetConfig {
    /// The fleet the flags describe, checked before anything binds.
    pub fn from_args(args: &FleetArgs) -> Result<FleetConfig, FleetError> {
        let elastic = elastic::ElasticConfig::from_args(
            &args.elastic,
            args.serve.engine.seed,
            args.serve.engine.speedup_ratio,
            &args.serve.host,
        )?;
        // An elastic fleet sets aside a listener for each of its most workers.
        let given = match &elastic {
            Some(e) if !args.listen.is_empty() && args.listen.len() != e.max => {
                return Err(elastic::ElasticError::ListenCount {
                    max: e.max,
                    addresses: args.listen.len(),
                }
                .into())
            }
            Some(e) => Some(e.max),
            None => args.workers,
        };
        let workers = match (given, args.listen.len()) {
            (None | Some(0), 0) => return Err(FleetError::NoWorkers),
            (None, n) => n,
            (Some(w), 0) => w,
            (Some(w), n) if w == n => w,
            (Some(workers), addresses) => {
                return Err(FleetError::AddressCount { workers, addresses })
            }
        };
        if workers > MAX_FLEET_WORKERS {
            return Err(FleetError::TooManyWorkers {
                workers,
                max: MAX_FLEET_WORKERS,
            });
        }
        let serve = &args.serve;
        if serve.engine.num_workers.is_some() {
            return Err(FleetError::NotForFleet {
                flag: "--num-workers",
                instead: "give --workers N (one endpoint per worker)",
            });
        }
        if serve.engine.serving_mode != ServingModeFlag::Aggregated {
            return Err(FleetError::NotForFleet {
                flag: "--serving-mode disagg",
                instead: "every fleet worker prefills and decodes its own requests",
            });
        }
        if serve.engine.router_queue_threshold.is_some() {
            return Err(FleetError::NotForFleet {
                flag: "--router-queue-threshold",
                instead: "no request waits at a router: each runs on its listener's worker",
            });
        }
        let listen = if args.listen.is_empty() {
            let last = workers - 1;
            if serve.port != 0 && usize::from(serve.port) + last > usize::from(u16::MAX) {
                return Err(FleetError::PortOverflow {
                    port: serve.port,
                    workers,
                    last,
                });
            }
            Listen::Consecutive {
                host: serve.host.clone(),
                first_port: serve.port,
            }
        } else {
            Listen::Each(args.listen.clone())
        };
        if args.decision_log_size > MAX_DECISION_LOG {
            return Err(FleetError::DecisionLogSize {
                given: args.decision_log_size,
                max: MAX_DECISION_LOG,
            });
        }
        let worker_faults = match &args.worker_faults {
            Some(spec) => Schedule::parse(spec, workers)?,
            None => Schedule::default(),
        };
        let mut serve = serve.clone();
        serve.engine.num_workers = Some(workers);
        let mut server = ServerConfig::from_serve_args(&serve, &args.vllm)?;
        // Every request is pinned to its listener's worker: the cluster's own router never
        // chooses (its flags have no effect), and round-robin keeps no index of the caches.
        server.cluster.router = RouterConfig {
            mode: RouterMode::RoundRobin,
            ..RouterConfig::default()
        };
        debug_assert!(matches!(server.cluster.serving, ServingMode::Aggregated));
        Ok(FleetConfig {
            server,
            listen,
            admin: args.admin_port.map(|port| (args.serve.host.clone(), port)),
            manifest_path: args.fleet_manifest.clone(),
            decision_log_size: args.decision_log_size,
            metrics_dialect: args.metrics_dialect,
            worker_faults,
            elastic,
        })
    }
}

impl From<ServeFlagsError> for FleetError {
    fn from(e: ServeFlagsError) -> Self {
        match e {
            ServeFlagsError::Config(e) => e.into(),
            ServeFlagsError::KvEvents(e) => e.into(),
        }
    }
}

/// `mockserve fleet`: validates the flags, launches the fleet, prints every worker's address
/// (and the admin's), serves until SIGINT/SIGTERM (or stdin's end
/// with `--exit-on-stdin-eof`), then drains for up to
/// `--shutdown-timeout`; a second signal exits at once (an error).
pub fn run(args: &FleetArgs) -> anyhow::Result<()> {
    let config = FleetConfig::from_args(args)?;
    let drain = config.server.http.shutdown_timeout;
    shutdown::run(
        args.serve.http.exit_on_stdin_eof,
        |mut shutdown| async move {
            let mut fleet = launch(config).await?;
            let mut lines = String::new();
            for w in &fleet.manifest.workers {
                lines.push_str(&format!(
                    "mockserve fleet worker {} listening on {}\n",
                    w.index, w.url
                ));
            }
            if let Some(url) = fleet.elastic.as_ref().and_then(|l| l.front_url.as_ref()) {
                lines.push_str(&format!("mockserve fleet front listening on {url}\n"));
            }
            if let Some(url) = &fleet.manifest.admin_url {
                lines.push_str(&format!("mockserve fleet admin listening on {url}\n"));
            }
            shutdown::print_addresses(&lines);
            tokio::select! {
                biased;
                () = fleet.stopped() => anyhow::bail!("a worker's listener stopped unexpectedly"),
                () = shutdown.requested(drain) => {}
            }
            shutdown
                .drain(async {
                    fleet.shutdown().await;
                    Ok(())
                })
                .await
        },
    )
}
