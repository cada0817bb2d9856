//! The label sets of the series (vLLM's `model_name`/`engine`, servesim's `worker`, ...) and
//! the fixed label values the server uses.

use prometheus_client::encoding::EncodeLabelSet;
use servesim::ids::WorkerId;

/// The per-worker label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// Worker index.
    pub worker: u32,
}

impl From<WorkerId> for WorkerLabel {
    fn from(w: WorkerId) -> WorkerLabel {
        WorkerLabel { worker: w.0 }
    }
}

/// vLLM's label set of an engine's series: the served model and the engine (data-parallel
/// rank: the simulated worker).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabel {
    /// The served (base) model.
    pub model_name: String,
    /// The worker's index.
    pub engine: u32,
}

/// `vllm:request_success`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedLabel {
    /// The served (base) model.
    pub model_name: String,
    /// The worker's index.
    pub engine: u32,
    /// `length` (the engine always runs to the output limit).
    pub finished_reason: &'static str,
}

/// `vllm:cache_config_info`'s labels: the KV-cache settings, as strings, as vLLM reports them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheConfigLabel {
    /// The worker's index.
    pub engine: u32,
    /// Tokens per block.
    pub block_size: String,
    /// `auto`.
    pub cache_dtype: &'static str,
    /// `True` or `False`, as Python prints it.
    pub enable_prefix_caching: &'static str,
    /// vLLM's default, 0.9 (nothing is allocated here).
    pub gpu_memory_utilization: &'static str,
    /// Host-memory blocks (the G2 tier's, else 0).
    pub num_cpu_blocks: String,
    /// KV blocks per worker.
    pub num_gpu_blocks: String,
}

/// `vllm:lora_requests_info`'s labels, as vLLM reports them: comma-separated adapter names.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoraInfoLabel {
    /// Adapters of running requests.
    pub running_lora_adapters: String,
    /// Adapters of waiting requests.
    pub waiting_lora_adapters: String,
    /// `--max-loras`.
    pub max_lora: String,
}

/// A LoRA adapter's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterLabel {
    /// The adapter's served name.
    pub adapter: String,
}

/// The HTTP endpoint label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// The generation route: `chat`, `completions` or `embeddings`.
    pub endpoint: &'static str,
}

/// Why a speculative prefill was not submitted.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabel {
    /// `in_flight_limit` or `queue_full`.
    pub reason: &'static str,
}

/// The label of a fault injected on the KV event plane (`--kv-events-faults`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvFaultLabel {
    /// Worker index.
    pub worker: u32,
    /// `drop`, `duplicate`, `reorder` or `delay`.
    pub fault: &'static str,
}

/// The injected-fault label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabel {
    /// The fault type's name (`rate-limit`, `stream-cut`, ...).
    pub r#type: &'static str,
}

/// The serving-pool label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// `aggregated`, `prefill` or `decode`.
    pub pool: String,
}

/// Skip reason: `crate::driver::state::MAX_SPECULATIVE_PREFILLS` already running.
pub(crate) const SKIP_IN_FLIGHT: &str = "in_flight_limit";
/// `finished_reason` of a request that ran to its output limit.
pub(crate) const FINISHED_LENGTH: &str = "length";

/// Skip reason: the `--max-waiting` queue is full.
pub(crate) const SKIP_QUEUE_FULL: &str = "queue_full";
