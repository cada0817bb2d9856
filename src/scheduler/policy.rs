//! What tells the engine flavours apart, as one [`BatchingPolicy`]: each field is a behaviour a
//! flavour has or lacks, decided once from the [`EngineType`], so the scheduler asks what to do
//! instead of which engine it is.

/// Which engine's batching behaviour to simulate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineType {
    /// vLLM v1: running first, FIFO admission, chunked prefill, LIFO preemption.
    #[default]
    Vllm,
    /// SGLang: new-token-ratio reservation, extend passes, retraction.
    Sglang,
    /// TRT-LLM guaranteed-no-evict: reserve to completion, never preempt.
    Trtllm,
}

impl std::str::FromStr for EngineType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vllm" => Ok(EngineType::Vllm),
            "sglang" => Ok(EngineType::Sglang),
            "trtllm" => Ok(EngineType::Trtllm),
            _ => Err(format!(
                "unknown engine type {s:?} (expected vllm, sglang or trtllm)"
            )),
        }
    }
}

impl std::fmt::Display for EngineType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EngineType::Vllm => "vllm",
            EngineType::Sglang => "sglang",
            EngineType::Trtllm => "trtllm",
        })
    }
}

/// Which running request vLLM preempts when KV blocks run out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptionMode {
    /// The newest running request (vLLM v1).
    #[default]
    Lifo,
    /// The oldest running request.
    Fifo,
}

impl std::str::FromStr for PreemptionMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lifo" => Ok(PreemptionMode::Lifo),
            "fifo" => Ok(PreemptionMode::Fifo),
            _ => Err(format!(
                "unknown preemption mode {s:?} (expected lifo or fifo)"
            )),
        }
    }
}

/// How a pass is planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Planner {
    /// vLLM v1 and TRT-LLM: running requests first under the token budget, then FIFO
    /// admission from the head of the waiting queue.
    RunningThenFifo,
    /// SGLang: continue chunked prefills, admit under the new-token-ratio reservation, and
    /// decode only in passes that prefill nothing.
    SglangExtend,
}

/// Which running request gives its KV back when the pool runs out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VictimOrder {
    /// The newest running request (vLLM's default, LIFO).
    Newest,
    /// The oldest running request (vLLM, FIFO).
    Oldest,
    /// The one that generated fewest tokens, newest first among ties (SGLang's retraction).
    FewestGenerated,
}

/// The batching behaviour of one engine flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchingPolicy {
    /// How a pass is planned.
    pub(crate) planner: Planner,
    /// Whether running requests are preempted when KV runs out (TRT-LLM's
    /// guaranteed-no-evict never does: it reserves instead).
    pub(crate) preempts: bool,
    /// Which request is preempted.
    pub(crate) victim: VictimOrder,
    /// Admission reserves KV for the prompt plus the full output (TRT-LLM), so a request is
    /// admitted only when it can run to the end.
    pub(crate) reserves_full_output: bool,
    /// SGLang's new-token ratio: decays every pass, resets on every retraction.
    pub(crate) adaptive_new_token_ratio: bool,
    /// Whether a preempted request's re-admission is reported again (SGLang reports a
    /// retracted request's first admission only).
    pub(crate) announces_readmission: bool,
    /// Whether decode time sees the KV in use capped at the pool's size (SGLang's model).
    pub(crate) caps_decode_kv_at_pool: bool,
    /// Whether `enable_chunked_prefill` applies (SGLang always chunks by its own size).
    pub honours_chunked_prefill_flag: bool,
}

impl BatchingPolicy {
    /// The policy of `engine_type`, with vLLM's preemption order from `preemption_mode`.
    pub(crate) fn of(engine_type: EngineType, preemption_mode: PreemptionMode) -> BatchingPolicy {
        let vllm_victim = match preemption_mode {
            PreemptionMode::Lifo => VictimOrder::Newest,
            PreemptionMode::Fifo => VictimOrder::Oldest,
        };
        match engine_type {
            EngineType::Vllm => BatchingPolicy {
                planner: Planner::RunningThenFifo,
                preempts: true,
                victim: vllm_victim,
                reserves_full_output: false,
                adaptive_new_token_ratio: false,
                announces_readmission: true,
                caps_decode_kv_at_pool: false,
                honours_chunked_prefill_flag: true,
            },
            EngineType::Trtllm => BatchingPolicy {
                planner: Planner::RunningThenFifo,
                preempts: false,
                victim: vllm_victim,
                reserves_full_output: true,
                adaptive_new_token_ratio: false,
                announces_readmission: true,
                caps_decode_kv_at_pool: false,
                honours_chunked_prefill_flag: true,
            },
            EngineType::Sglang => BatchingPolicy {
                planner: Planner::SglangExtend,
                preempts: true,
                victim: VictimOrder::FewestGenerated,
                reserves_full_output: false,
                adaptive_new_token_ratio: true,
                announces_readmission: false,
                caps_decode_kv_at_pool: true,
                honours_chunked_prefill_flag: false,
            },
        }
    }
}
