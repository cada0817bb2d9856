//! `mockserve fleet`: N simulated workers in one process, each a complete vLLM-like endpoint,
//! for routers that sit in front of N workers (vllm-router, sglang-router, Dynamo's indexer).
//!
//! - [`FleetConfig`] is the validated fleet (`crate::cmd::fleet` has the flags and the
//!   command; [`FleetError`] names the bad flag).
//! - [`launch`] binds every socket, starts ONE engine of N workers on one clock, and serves
//!   each worker's API on its own listener, every request pinned to that worker: the listener
//!   a router picks is the routing decision. All workers share the runtime, the tokenizer and
//!   the clock; each has its own `/metrics` (`metrics::WorkerMetrics`), KV-event publisher
//!   (port + index, as `serve` numbers its workers), LoRA registry, faults and loading delay.
//! - [`judge::Judge`] scores every decision against what every worker held when the request
//!   arrived, and (with KV events) against what the sent events announced, in a log bounded in
//!   bytes; `http` serves its log (a page at a time) and metrics, behind `--api-key`.
//! - `fault::WorkerFaults` holds each worker's fault state (`down`, `slow`, `stalled`, `503`),
//!   set by `--worker-faults` (`fault::Schedule`) or the admin listener.
//! - [`manifest::Manifest`] names every worker's URLs and endpoints (`--fleet-manifest`).
//! - [`elastic::Lifecycle`] (`--elastic`) provisions, loads and drains workers at run time.

pub mod discovery;
pub mod elastic;
pub(crate) mod fault;
pub(crate) mod http;
pub mod judge;
pub mod manifest;
pub(crate) mod metrics;
pub(crate) mod scale;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use servesim::cluster::Cluster;
use servesim::ids::WorkerId;
use servesim::scheduler::ConfigError;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::AppState;
use crate::config::ServerConfig;
use crate::connection::Edge;
use crate::driver::EngineHandle;
use crate::kv_events::view::PublishedView;
use crate::kv_events::{KvEventPublisher, KvEventsError};
use crate::metrics::{EndpointLabel, Metrics};
use fault::{FaultMetrics, Schedule, ScheduleError, WorkerFaults, WorkerState};
use judge::Judge;
use manifest::{dialable, Manifest, ManifestWorker};
use metrics::{FleetMetrics, MetricsDialect, WorkerMetrics};

/// The most workers one fleet runs.
pub(crate) const MAX_FLEET_WORKERS: usize = 4096;

/// Why a fleet cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// Neither a positive --workers nor any --listen address.
    #[error("a fleet needs at least one worker: give --workers N (N >= 1) or --listen ADDR,...")]
    NoWorkers,
    /// More workers than `MAX_FLEET_WORKERS`.
    #[error("--workers {workers}: a fleet runs at most {max} workers")]
    TooManyWorkers {
        /// As given.
        workers: usize,
        /// The limit.
        max: usize,
    },
    /// `--workers` and the number of `--listen` addresses differ.
    #[error("--workers {workers} but --listen gives {addresses} addresses: give one per worker")]
    AddressCount {
        /// As given.
        workers: usize,
        /// Addresses given.
        addresses: usize,
    },
    /// The last worker's port is beyond 65535.
    #[error(
        "--port {port} with {workers} workers: worker {last} would listen on port {}, beyond \
         65535 (the port plus the number of workers minus one must be at most 65535)",
        *port as usize + last
    )]
    PortOverflow {
        /// The first worker's port.
        port: u16,
        /// Workers.
        workers: usize,
        /// The last worker's index.
        last: usize,
    },
    /// A `serve` flag that a fleet sets itself.
    #[error("{flag} does not apply to mockserve fleet: {instead}")]
    NotForFleet {
        /// The flag.
        flag: &'static str,
        /// What to do instead.
        instead: &'static str,
    },
    /// `--decision-log-size` above `MAX_DECISION_LOG`.
    #[error(
        "--decision-log-size {given}: the decision log keeps at most {max} decisions (0 to {max})"
    )]
    DecisionLogSize {
        /// As given.
        given: usize,
        /// The limit.
        max: usize,
    },
    /// `--worker-faults` is invalid.
    #[error(transparent)]
    WorkerFaults(#[from] ScheduleError),
    /// An elastic-fleet flag is invalid.
    #[error(transparent)]
    Elastic(#[from] elastic::ElasticError),
    /// The elastic fleet's manifest or discovery file cannot be written.
    #[error(transparent)]
    Publish(#[from] elastic::PublishError),
    /// A worker setting is invalid (the message names the flag).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The KV-event sockets cannot be opened.
    #[error(transparent)]
    KvEvents(#[from] KvEventsError),
    /// A worker's (or the admin) listener cannot bind.
    #[error("{what}: cannot listen on {addr}: {error}")]
    Bind {
        /// `worker N` or `--admin-port`.
        what: String,
        /// The address.
        addr: String,
        /// The socket's error.
        error: std::io::Error,
    },
    /// The manifest cannot be written.
    #[error("--fleet-manifest {}: {error}", path.display())]
    Manifest {
        /// As given.
        path: PathBuf,
        /// The write's error.
        error: std::io::Error,
    },
}

/// Where the workers listen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// On `host`, worker i on `first_port + i` (every worker a free port when 0).
    Consecutive {
        /// `--host`.
        host: String,
        /// `--port`.
        first_port: u16,
    },
    /// Worker i on the i-th address (`--listen`).
    Each(Vec<SocketAddr>),
}

impl Listen {
    /// Every worker's `(host, port)` to bind, `n` of them (as many as validated).
    fn addrs(&self, n: usize) -> Vec<(String, u16)> {
        match self {
            Listen::Consecutive { host, first_port } => (0..n)
                .map(|i| {
                    // Validated: the last port is at most 65535 (0 stays 0, a free port each).
                    let port = match first_port {
                        0 => 0,
                        p => u16::try_from(usize::from(*p) + i).unwrap_or(u16::MAX),
                    };
                    (host.clone(), port)
                })
                .collect(),
            Listen::Each(addrs) => addrs
                .iter()
                .map(|a| (a.ip().to_string(), a.port()))
                .collect(),
        }
    }
}

/// A validated fleet.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Every worker's settings; `cluster.num_workers` is the fleet's size.
    pub server: ServerConfig,
    /// Where the workers listen.
    pub listen: Listen,
    /// The admin listener's `(host, port)`, if any.
    pub admin: Option<(String, u16)>,
    /// Where to write the manifest, if anywhere.
    pub manifest_path: Option<PathBuf>,
    /// Decisions the judge keeps.
    pub decision_log_size: usize,
    /// The metric names of the workers' `/metrics`.
    pub metrics_dialect: MetricsDialect,
    /// Faults on workers by schedule (`--worker-faults`).
    pub worker_faults: Schedule,
    /// Workers added and removed at run time (`--elastic`); `num_workers` is then the most.
    pub elastic: Option<elastic::ElasticConfig>,
}

impl FleetConfig {
    /// Workers in the fleet.
    pub fn num_workers(&self) -> usize {
        self.server.cluster.num_workers
    }
}

/// A fleet that serves: every socket listens. Stop it with [`RunningFleet::shutdown`].
#[derive(Debug)]
pub struct RunningFleet {
    /// Where everything listens.
    pub manifest: Manifest,
    /// The engine every worker shares.
    pub engine: EngineHandle,
    /// The routing judge.
    pub judge: Arc<Judge>,
    /// Every worker's fault state.
    pub faults: Arc<WorkerFaults>,
    /// The elastic fleet's slots (`--elastic`): [`elastic::Lifecycle::scale`] resizes it.
    pub elastic: Option<Arc<elastic::Lifecycle>>,
    /// What the fleet's routes read (for [`RunningFleet::admin_router`]).
    routes: http::FleetRoutes,
    /// Ends every listener's accept loop (then each drains).
    stop: CancellationToken,
    /// The listeners' tasks.
    tasks: JoinSet<()>,
}

impl RunningFleet {
    /// Stops accepting on every listener and drains open requests (up to
    /// `--shutdown-timeout`), then returns.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }

    /// The admin listener's routes as a service, as `--admin-port` serves them (its key, body
    /// limits and answers) without the connection's own limits: for callers in the process,
    /// such as the fuzzers.
    pub fn admin_router(&self) -> axum::Router {
        http::admin_router(self.routes.clone())
    }

    /// Resolves when a listener's task ends before shutdown (it never does unless it panics).
    pub async fn stopped(&mut self) {
        let _ = self.tasks.join_next().await;
    }
}

/// Binds `(host, port)`, naming `what` in the error.
async fn bind(what: String, (host, port): (String, u16)) -> Result<TcpListener, FleetError> {
    TcpListener::bind((host.as_str(), port))
        .await
        .map_err(|error| FleetError::Bind {
            what,
            addr: format!("{host}:{port}"),
            error,
        })
}

/// Starts a fleet on the current tokio runtime: binds every worker's listener, the admin
/// listener and every KV-event socket, starts the shared engine and the judge, serves each
/// worker, then writes the manifest (when asked). An error leaves nothing bound: every one
/// comes before anything is served, but a manifest that cannot be written, which stops the
/// workers first.
pub async fn launch(config: FleetConfig) -> Result<RunningFleet, FleetError> {
    let n = config.num_workers();
    let addrs = config.listen.addrs(n);
    let mut listeners = Vec::with_capacity(n);
    for (i, addr) in addrs.iter().enumerate() {
        listeners.push(bind(format!("worker {i}"), addr.clone()).await?);
    }
    let admin = match &config.admin {
        Some(addr) => Some(bind("--admin-port".into(), addr.clone()).await?),
        None => None,
    };
    let front = match config.elastic.as_ref().and_then(|e| e.front.clone()) {
        Some(addr) => Some(bind("--front-port".into(), addr).await?),
        None => None,
    };
    let front_url = match &front {
        Some(l) => Some(format!(
            "http://{}",
            dialable(l.local_addr().map_err(|error| FleetError::Bind {
                what: "--front-port".into(),
                addr: "front".into(),
                error,
            })?)
        )),
        None => None,
    };
    let server = config.server;
    let cluster = Cluster::new(server.live_cluster())?;
    let mut engine_metrics = Metrics::for_model(&server.model_name, server.max_model_len);
    // What the sent KV events announce, for the judge's stale-information checks.
    let view = server
        .kv_events
        .as_ref()
        .map(|_| Arc::new(PublishedView::new(n)));
    let routing = judge::RoutingMetrics {
        stale_checked: view.is_some(),
        ..judge::RoutingMetrics::default()
    };
    routing.register(engine_metrics.registry_mut());
    let fault_metrics = FaultMetrics::default();
    fault_metrics.register(engine_metrics.registry_mut());
    let faults = Arc::new(WorkerFaults::new(n, fault_metrics));
    let replica_metrics = elastic::ReplicaMetrics::default();
    if config.elastic.is_some() {
        replica_metrics.register(engine_metrics.registry_mut());
    }
    let engine_metrics = Arc::new(engine_metrics);
    let mut kv_restarts = None;
    let (publisher, kv_endpoints) = match &server.kv_events {
        None => (None, vec![(None, None); n]),
        Some(kv) => {
            let publisher = KvEventPublisher::start(kv, n, Arc::clone(&engine_metrics))
                .await?
                .standalone_workers();
            let publisher = match &view {
                Some(view) => publisher.with_view(Arc::clone(view)),
                None => publisher,
            };
            kv_restarts = Some(publisher.restart_switch());
            let mut endpoints = Vec::with_capacity(n);
            for i in 0..n {
                let bound =
                    |addr: Option<SocketAddr>| addr.map(|a| format!("tcp://{}", dialable(a)));
                let publish = match bound(publisher.pub_addr(i)) {
                    Some(e) => Some(e),
                    None => Some(kv.endpoint.for_rank(i)?),
                };
                let replay = match (&kv.replay_endpoint, bound(publisher.replay_addr(i))) {
                    (_, Some(e)) => Some(e),
                    (Some(endpoint), None) => Some(endpoint.for_rank(i)?),
                    (None, None) => None,
                };
                endpoints.push((publish, replay));
            }
            (Some(publisher), endpoints)
        }
    };
    let engine = EngineHandle::spawn_publishing(
        cluster,
        server.max_waiting,
        Arc::clone(&engine_metrics),
        publisher,
    );
    let mut judge = Judge::new(engine.clock(), config.decision_log_size, routing)
        .excluding_unavailable(Arc::clone(&faults));
    if let Some(view) = view {
        judge = judge.checking_staleness(view);
    }
    let judge = Arc::new(judge);
    // Just spawned: the driver is running.
    let _ = engine.observe_arrivals(Arc::clone(&judge) as Arc<dyn crate::driver::ArrivalObserver>);
    let mut workers = Vec::with_capacity(n);
    for (i, (listener, (kv, replay))) in listeners.iter().zip(kv_endpoints).enumerate() {
        let addr = dialable(listener.local_addr().map_err(|error| FleetError::Bind {
            what: format!("worker {i}"),
            addr: format!("{}:{}", addrs[i].0, addrs[i].1),
            error,
        })?);
        workers.push(ManifestWorker {
            index: i,
            url: format!("http://{addr}"),
            metrics_url: format!("http://{addr}/metrics"),
            kv_events_endpoint: kv,
            kv_events_replay_endpoint: replay,
        });
    }
    let admin_url = match &admin {
        Some(l) => Some(format!(
            "http://{}",
            dialable(l.local_addr().map_err(|error| FleetError::Bind {
                what: "--admin-port".into(),
                addr: format!("{:?}", config.admin),
                error,
            })?)
        )),
        None => None,
    };
    let manifest = Manifest {
        model: server.model_name.clone(),
        block_size: server.cluster.engine.block_size,
        admin_url,
        workers,
    };
    let stop = CancellationToken::new();
    // An elastic fleet's absent slots are `down` before anything serves; it writes its files.
    let lifecycle = match config.elastic.clone() {
        None => None,
        Some(elastic) => {
            let parts = elastic::LifecycleParts {
                faults: Arc::clone(&faults),
                engine: engine.clone(),
                all: manifest.clone(),
                manifest_path: config.manifest_path.clone(),
                drain_timeout: server.http.shutdown_timeout,
                stop: stop.clone(),
                metrics: replica_metrics,
                engine_metrics: Arc::clone(&engine_metrics),
                worker: server.cluster.engine.clone(),
                front_url,
            };
            Some(elastic::Lifecycle::new(elastic, parts)?)
        }
    };
    let shared_manifest = match &lifecycle {
        Some(l) => Arc::clone(&l.current_manifest),
        None => Arc::new(std::sync::Mutex::new(Arc::from(manifest.to_json()))),
    };
    let routes = http::FleetRoutes {
        engine: engine.clone(),
        metrics: Arc::clone(&engine_metrics),
        judge: Arc::clone(&judge),
        manifest: shared_manifest,
        elastic: lifecycle.clone(),
        faults: Arc::clone(&faults),
        kv_restarts,
        worker_urls: manifest.workers.iter().map(|w| w.url.clone()).collect(),
        api_key: server.api_key.as_deref().map(Arc::from),
        body_read_timeout: server.http.body_read_timeout,
    };
    let mut tasks = JoinSet::new();
    let fleet_metrics = FleetMetrics {
        engine: Arc::clone(&engine_metrics),
        routing: judge.metrics.clone(),
        config: server.cluster.engine.clone(),
        dialect: config.metrics_dialect,
    };
    // The front endpoint's generations end with it (its own token).
    let front_generations = CancellationToken::new();
    let mut front_workers = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        let worker = WorkerId(u32::try_from(i).unwrap_or(u32::MAX));
        let own = Arc::new(Metrics::for_model(&server.model_name, server.max_model_len));
        for endpoint in ["chat", "completions", "embeddings"] {
            let _ = own.http_requests.get_or_create(&EndpointLabel { endpoint });
        }
        let seat = WorkerSeat {
            index: i,
            state: AppState::for_worker(server.clone(), engine.clone(), Arc::clone(&own), worker),
            view: Arc::new(WorkerMetrics::new(&fleet_metrics, &own, worker)),
            routes: routes.clone(),
            faults: Arc::clone(&faults),
            lifecycle: lifecycle.clone(),
        };
        if let (Some(l), Some(_)) = (&lifecycle, &front) {
            let state = AppState {
                stop_generations: front_generations.clone(),
                ..seat.state.clone()
            };
            let api = http::worker_router(
                state,
                seat.view.clone(),
                seat.routes.clone(),
                (Arc::clone(&seat.faults), i),
            )
            .layer(axum::middleware::from_fn_with_state(
                (Arc::clone(l), i),
                elastic::gate,
            ));
            front_workers.push(api);
        }
        // An absent slot's listener closes now; provisioning binds its address again.
        let addr = listener.local_addr().ok();
        let listener = match &lifecycle {
            Some(l) if l.phase(i) == elastic::Phase::Absent => None,
            _ => Some(listener),
        };
        tasks.spawn(serve_worker(seat, listener, addr, stop.clone()));
    }
    tasks.spawn(fault::run_schedule(
        config.worker_faults,
        Arc::clone(&faults),
        tokio::time::Instant::now(),
        stop.clone(),
    ));
    if let Some(listener) = admin {
        let edge = Edge {
            limits: server.http.clone(),
            stop_generations: CancellationToken::new(),
            router: http::admin_router(routes.clone()),
        };
        tasks.spawn(edge.run(listener, stop.clone().cancelled_owned()));
    }
    if let (Some(listener), Some(l)) = (front, &lifecycle) {
        let edge = Edge {
            limits: server.http.clone(),
            stop_generations: front_generations,
            router: elastic::front::router(elastic::front::Front {
                lifecycle: Arc::clone(l),
                workers: Arc::new(front_workers),
                next: Arc::default(),
            }),
        };
        tasks.spawn(edge.run(listener, stop.clone().cancelled_owned()));
    }
    let fleet = RunningFleet {
        manifest,
        engine,
        judge,
        faults,
        elastic: lifecycle,
        routes,
        stop,
        tasks,
    };
    if let (Some(path), None) = (&config.manifest_path, &fleet.elastic) {
        if let Err(error) = fleet.manifest.write(path) {
            fleet.shutdown().await;
            return Err(FleetError::Manifest {
                path: path.clone(),
                error,
            });
        }
    }
    Ok(fleet)
}

/// What one worker's endpoint serves, kept across its listener's restarts.
struct WorkerSeat {
    /// The worker's index.
    index: usize,
    /// Its API's state (each listener gets a clone with its own `stop_generations`).
    state: AppState,
    /// Its `/metrics`.
    view: Arc<WorkerMetrics>,
    /// The fleet's routes.
    routes: http::FleetRoutes,
    /// Every worker's fault state.
    faults: Arc<WorkerFaults>,
    /// The elastic fleet's slots: the lifecycle gate stands in front of the worker's API.
    lifecycle: Option<Arc<elastic::Lifecycle>>,
}

/// Serves one worker on `listener` (bound at `addr`; None: bind `addr` once it is not `down`)
/// until `stop`. While the worker is `down` its listener is
/// closed (connections are refused) and its running generations are ended; when it leaves
/// `down` the same address is bound again.
async fn serve_worker(
    seat: WorkerSeat,
    mut listener: Option<TcpListener>,
    addr: Option<SocketAddr>,
    stop: CancellationToken,
) {
    let Some(mut states) = seat.faults.subscribe(seat.index) else {
        return;
    };
    // Each listener's accept loop; an old one drains while a new one serves.
    let mut listeners = JoinSet::new();
    'serving: loop {
        while matches!(*states.borrow_and_update(), WorkerState::Down) {
            tokio::select! {
                biased;
                () = stop.cancelled() => break 'serving,
                changed = states.changed() => if changed.is_err() { break 'serving },
            }
        }
        let listener = match (listener.take(), addr) {
            (Some(listener), _) => listener,
            (None, Some(addr)) => match rebind(addr, seat.index, &stop).await {
                Some(listener) => listener,
                None => break,
            },
            (None, None) => break,
        };
        let state = AppState {
            stop_generations: CancellationToken::new(),
            ..seat.state.clone()
        };
        let generations = state.stop_generations.clone();
        let mut router = http::worker_router(
            state.clone(),
            seat.view.clone(),
            seat.routes.clone(),
            (Arc::clone(&seat.faults), seat.index),
        );
        if let Some(lifecycle) = &seat.lifecycle {
            router = router.layer(axum::middleware::from_fn_with_state(
                (Arc::clone(lifecycle), seat.index),
                elastic::gate,
            ));
        }
        let edge = Edge {
            limits: state.config.http.clone(),
            stop_generations: generations.clone(),
            router,
        };
        let down = stop.child_token();
        listeners.spawn(edge.run(listener, down.clone().cancelled_owned()));
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => break 'serving,
                changed = states.changed() => {
                    if changed.is_err() {
                        break 'serving;
                    }
                    if matches!(*states.borrow_and_update(), WorkerState::Down) {
                        // Refuse new connections, end the running generations.
                        down.cancel();
                        generations.cancel();
                        continue 'serving;
                    }
                }
            }
        }
    }
    while listeners.join_next().await.is_some() {}
}

/// Binds `addr` again after a `down` spell, retrying while another socket holds it; `None`
/// when the fleet stops first.
async fn rebind(addr: SocketAddr, index: usize, stop: &CancellationToken) -> Option<TcpListener> {
    let mut warned = false;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Some(listener),
            Err(e) if !warned => {
                warned = true;
                eprintln!(
                    "mockserve fleet: worker {index} cannot listen on {addr} again: {e}; retrying"
                );
            }
            Err(_) => {}
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
        }
    }
}
