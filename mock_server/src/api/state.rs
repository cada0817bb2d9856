//! [`AppState`]: what every handler of one endpoint shares (settings, the engine handle, the
//! metrics, the LoRA registry), built once per server or per fleet worker.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use servesim::cluster::Cluster;
use servesim::ids::WorkerId;
use tokio_util::sync::CancellationToken;

use super::lora::LoraRegistry;
use crate::config::ServerConfig;
use crate::driver::EngineHandle;
use crate::kv_events::KvEventPublisher;
use crate::metrics::Metrics;

/// Everything a handler needs; cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Validated settings.
    pub config: Arc<ServerConfig>,
    /// The live engine.
    pub engine: EngineHandle,
    /// Everything `/metrics` shows.
    pub metrics: Arc<Metrics>,
    /// Numbers requests (ids, default answer seeds).
    pub counter: Arc<AtomicU64>,
    /// The engine's block size (prompts are hashed with it).
    pub block_size: usize,
    /// Unix seconds at start (model `created`).
    pub started: u64,
    /// Cancelled when the shutdown drain deadline passes: every generation still running then
    /// ends with a `503 shutting down` error (the final event of a stream).
    pub stop_generations: CancellationToken,
    /// The loaded LoRA adapters.
    pub lora: Arc<LoraRegistry>,
    /// When the simulated model load ends (`--startup-delay`): `/health` answers 503 before.
    pub ready_at: tokio::time::Instant,
    /// The worker every generation request runs on, when this endpoint is one worker of a
    /// fleet (`mockserve fleet`): its listener is the routing decision, so `nvext` and header
    /// pinning are overridden.
    pub worker: Option<WorkerId>,
}

impl AppState {
    /// Validates the settings, builds the cluster and spawns its driver on the current tokio
    /// runtime.
    pub fn new(config: ServerConfig) -> Result<AppState, servesim::scheduler::ConfigError> {
        config.validate()?;
        let cluster = Cluster::new(config.live_cluster())?;
        let block_size = cluster.block_size();
        let metrics = Arc::new(Metrics::for_model(&config.model_name, config.max_model_len));
        let engine = EngineHandle::spawn(cluster, config.max_waiting, Arc::clone(&metrics));
        Ok(AppState::assemble(config, engine, metrics, block_size))
    }
}

impl AppState {
    /// [`AppState::new`], and with `config.kv_events` the ZeroMQ publishers bound first (a
    /// port in use is an error here, before anything is served).
    pub async fn start(config: ServerConfig) -> anyhow::Result<AppState> {
        let Some(kv_events) = config.kv_events.clone() else {
            return Ok(AppState::new(config)?);
        };
        config.validate()?;
        let cluster = Cluster::new(config.live_cluster())?;
        let block_size = cluster.block_size();
        let metrics = Arc::new(Metrics::for_model(&config.model_name, config.max_model_len));
        let publisher =
            KvEventPublisher::start(&kv_events, cluster.workers().len(), Arc::clone(&metrics))
                .await?;
        let engine = EngineHandle::spawn_publishing(
            cluster,
            config.max_waiting,
            Arc::clone(&metrics),
            Some(publisher),
        );
        Ok(AppState::assemble(config, engine, metrics, block_size))
    }

    /// The state of one fleet worker's endpoint: `engine` is shared by every worker of the
    /// fleet, and every generation request of this endpoint runs on `worker`. `metrics` holds
    /// this endpoint's own HTTP counters (the engine's series are fed to the metrics the
    /// engine was spawned with).
    pub fn for_worker(
        config: ServerConfig,
        engine: EngineHandle,
        metrics: Arc<Metrics>,
        worker: WorkerId,
    ) -> AppState {
        let block_size = config.cluster.engine.block_size;
        AppState {
            worker: Some(worker),
            ..AppState::assemble(config, engine, metrics, block_size)
        }
    }

    fn assemble(
        config: ServerConfig,
        engine: EngineHandle,
        metrics: Arc<Metrics>,
        block_size: usize,
    ) -> AppState {
        let ready_at = tokio::time::Instant::now() + config.startup_delay;
        // Every endpoint of a fleet sets the same bound on the engine they share.
        engine.inflight().set_limit(config.max_inflight_bytes);
        AppState {
            lora: Arc::new(LoraRegistry::new(&config.lora_modules)),
            config: Arc::new(config),
            engine,
            metrics,
            counter: Arc::default(),
            block_size,
            started: unix_now(),
            stop_generations: CancellationToken::new(),
            ready_at,
            worker: None,
        }
    }

    /// False while the simulated model load (`--startup-delay`) runs.
    pub fn is_ready(&self) -> bool {
        tokio::time::Instant::now() >= self.ready_at
    }
}

/// Unix seconds now (0 before 1970).
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
