//! Engine, router and cluster flags shared by `mockserve serve`, `mockserve replay` and
//! loadgen's embedded server, and their conversion into a validated [`ClusterConfig`]: the one
//! place flags are checked (finite, in range, consistent with each other) before anything runs.
//! Also the flags both replays share: the report files ([`ReportArgs`]) and the trace
//! ([`TraceArgs`], `mockserve replay` and `loadgen replay`).
//! [`ClusterConfig::warnings`] lists the valid settings that still make part of a run useless;
//! each command prints them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use servesim::cluster::{ClusterConfig, KvTransferConfig, KvTransferTimingMode, ServingMode};
use servesim::kv::G2Config;
use servesim::perf::{Fixed, LatencyModel, Polynomial, Profiled, ScaledLatency};
use servesim::router::{RouterConfig, RouterMode};
use servesim::scheduler::{
    ConfigError, EngineConfig, EngineType, PreemptionMode, SglangConfig, WorkerRole,
};
use servesim::trace::TraceFormat;

/// Numbers in flag errors: huge and tiny ones in scientific notation.
pub(crate) use servesim::scheduler::show_number;

/// `--serving-mode`: one pool of workers, or prefill and decode pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ServingModeFlag {
    /// Workers prefill and decode.
    #[default]
    Aggregated,
    /// Prefill pool and decode pool with a KV hand-off.
    Disagg,
}

impl std::str::FromStr for ServingModeFlag {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "aggregated" | "agg" => Ok(ServingModeFlag::Aggregated),
            "disagg" | "disaggregated" => Ok(ServingModeFlag::Disagg),
            _ => Err(format!(
                "unknown serving mode {s:?} (expected aggregated or disagg)"
            )),
        }
    }
}

/// The trace a replay reads and how: `mockserve replay` (virtual clock) and `loadgen replay`
/// (live) take the same flags. The help below is `mockserve replay`'s; `loadgen replay` states
/// its own ranges for the speed-up and the schedule bound.
#[derive(Args, Clone, Debug)]
pub struct TraceArgs {
    /// Mooncake JSONL trace, or an agentic trace (see --trace-format); a directory is a weka
    /// corpus (every .json and .jsonl file below it, in path order). `mockserve replay` and
    /// `mockserve plan` take synthetic load instead (--request-rate ...).
    #[arg(id = "trace", value_name = "TRACE")]
    pub path: Option<PathBuf>,

    /// How to read the trace: auto (detected from the first row: a dynamo.agentic_mooncake
    /// header, a weka play, a dynamo.request.trace.v1 record, or rows with wait_for),
    /// mooncake, agentic-mooncake (v2 with its header, or legacy v1), weka, dynamo (.jsonl or
    /// .jsonl.gz), applied-compute-agentic (rows with num_turns), mooncake-delta (Mooncake rows
    /// holding only each turn's new tokens; never detected, name it).
    #[arg(
        long = "trace-format",
        id = "trace_format",
        value_name = "TRACE_FORMAT",
        default_value = "auto",
        value_parser = parse_trace_format
    )]
    pub format: TraceFormat,

    /// Divides arrival timestamps and inter-turn delays (finite, above 0); for an agentic
    /// trace, the floors (not_before_ms) and every dependency delay.
    #[arg(long, default_value_t = 4.0)]
    pub arrival_speedup_ratio: f64,

    /// Agentic traces: run the plays in this many lanes (a closed loop of agents: plays in
    /// source_play_ordinal, else play_id, order, the next one starting when a lane's play
    /// settles); by default every play runs by its floors.
    #[arg(long, value_name = "L", value_parser = clap::value_parser!(u32).range(1..))]
    pub agentic_lanes: Option<u32>,

    /// Prompt tokens per trace hash id (1 to 2^20); agentic v2, weka and dynamo traces name
    /// their own.
    #[arg(
        long = "trace-block-size",
        id = "trace_block_size",
        value_name = "TRACE_BLOCK_SIZE",
        default_value_t = 512
    )]
    pub block_size: usize,

    /// Replay a trace whose schedule (sped up) runs longer than seven days of simulated time:
    /// by default such a trace is refused, naming the row past the bound.
    #[arg(long)]
    pub allow_long_schedule: bool,
}

impl TraceArgs {
    /// The trace file; empty when none was given (the commands that read one refuse that
    /// first: `loadgen replay` in its checks, `mockserve replay` with the synthetic flags).
    pub fn file(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new(""))
    }
}

/// A `--trace-format` value.
fn parse_trace_format(s: &str) -> Result<TraceFormat, String> {
    s.parse()
}

/// Where a run's report goes: the files to write and whether to show progress.
#[derive(Args, Clone, Debug, Default)]
pub struct ReportArgs {
    /// Write the report as pretty JSON.
    #[arg(long, value_name = "PATH")]
    pub report_json: Option<std::path::PathBuf>,

    /// Write one JSON line per request.
    #[arg(long, value_name = "PATH")]
    pub per_request_jsonl: Option<std::path::PathBuf>,

    /// No progress bar (it is shown only on a terminal anyway).
    #[arg(long, short)]
    pub quiet: bool,
}

impl ReportArgs {
    /// True when a progress bar should be drawn: not `--quiet` and stderr is a terminal.
    pub fn show_progress(&self) -> bool {
        !self.quiet && std::io::IsTerminal::is_terminal(&std::io::stderr())
    }
}

/// Workers of aggregated serving when `--num-workers` is not given.
pub(crate) const DEFAULT_NUM_WORKERS: usize = 4;

/// Simulated engine and routing flags.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Number of simulated workers in aggregated serving [default: 4].
    #[arg(long)]
    pub num_workers: Option<usize>,

    /// Batching behaviour to simulate: vllm, sglang or trtllm.
    #[arg(long, default_value = "vllm")]
    pub engine_type: EngineType,

    /// How requests are spread over workers: round-robin, random or kv-router.
    #[arg(long, default_value = "kv-router")]
    pub router_mode: RouterMode,

    /// KV block size in tokens (engine and router).
    #[arg(long, default_value_t = 64)]
    pub block_size: usize,

    /// KV blocks per worker.
    #[arg(long, default_value_t = 16384)]
    pub num_gpu_blocks: usize,

    /// Running requests per worker at most.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,

    /// Tokens scheduled per pass at most.
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,

    /// Divides prefill and decode time ("inf" = no delays).
    #[arg(long, default_value_t = 1.0)]
    pub speedup_ratio: f64,

    /// Divides decode time further (speculative decoding).
    #[arg(long, default_value_t = 1.0)]
    pub decode_speedup_ratio: f64,

    /// Which running request to preempt when KV blocks run out (vllm): lifo or fifo.
    #[arg(long, default_value = "lifo")]
    pub preemption_mode: PreemptionMode,

    /// Turn off prefix caching (every block private, no KV events).
    #[arg(long)]
    pub no_prefix_caching: bool,

    /// Turn off chunked prefill (a prompt must fit one pass's token budget).
    #[arg(long)]
    pub no_chunked_prefill: bool,

    /// Weight of prefill blocks in the KV router's cost.
    #[arg(long, default_value_t = 1.0)]
    pub overlap_score_weight: f64,

    /// KV router temperature: 0 picks the cheapest worker, above 0 samples a softmax.
    #[arg(long, default_value_t = 0.0)]
    pub router_temperature: f64,

    /// Park requests at the router while every worker's pending prefill exceeds this multiple of
    /// --max-num-batched-tokens (off by default).
    #[arg(long)]
    pub router_queue_threshold: Option<f64>,

    /// KV router without KV events: it remembers its own routing decisions for 120 s
    /// (Dynamo's approximate mode) instead of indexing the workers' KV events.
    #[arg(long)]
    pub no_kv_events: bool,

    /// Replace the polynomial latency model by constant times: PREFILL_MS,DECODE_MS.
    #[arg(long, value_name = "PREFILL_MS,DECODE_MS", value_parser = parse_fixed)]
    pub fixed_latency: Option<Fixed>,

    /// Replace the polynomial latency model by a profile measured on a real engine: Dynamo
    /// mocker's .npz (prefill TTFT over new tokens, decode ITL over active KV tokens and mean
    /// context length, interpolated linearly) or the same tables as JSON.
    #[arg(long, value_name = "PATH", conflicts_with = "fixed_latency")]
    pub perf_profile: Option<PathBuf>,

    /// Seed of the router's tie-breaks and the generated token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Serving topology: aggregated (--num-workers workers) or disagg (a prefill pool and a
    /// decode pool; --num-workers is ignored).
    #[arg(long, default_value = "aggregated")]
    pub serving_mode: ServingModeFlag,

    /// Disagg: prefill workers (KV-aware router) [default: 1].
    #[arg(long)]
    pub num_prefill_workers: Option<usize>,

    /// Disagg: decode workers (load-aware router) [default: 1].
    #[arg(long)]
    pub num_decode_workers: Option<usize>,

    /// KV bytes per token (all layers, K and V): times the disagg hand-off and G2 transfers.
    #[arg(long, conflicts_with = "model_config")]
    pub kv_bytes_per_token: Option<u64>,

    /// A Hugging Face config.json to derive --kv-bytes-per-token from (num_hidden_layers x 2 x
    /// num_key_value_heads x head_dim x dtype bytes).
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,

    /// Disagg: prefill→decode KV bandwidth in GB/s (1e9 bytes), 0 disables the delay; not
    /// divided by --speedup-ratio [default: 64].
    #[arg(long, value_name = "GBPS")]
    pub kv_transfer_bandwidth: Option<f64>,

    /// Disagg: charge the full prompt, or only the blocks missing at the decode worker:
    /// full-prompt or destination-missing [default: full-prompt].
    #[arg(long)]
    pub kv_transfer_timing_mode: Option<KvTransferTimingMode>,

    /// Host-memory (G2) KV blocks per worker: GPU evictions are offloaded there and prefixes
    /// found there are onboarded before admission. Needs --kv-bytes-per-token and vllm.
    #[arg(long)]
    pub num_g2_blocks: Option<usize>,

    /// G1→G2 (offload) link bandwidth in GB/s, shared by concurrent transfers; 0 = instant
    /// [default: 14].
    #[arg(long, value_name = "GBPS")]
    pub bandwidth_g1_to_g2_gbps: Option<f64>,

    /// G2→G1 (onboard) link bandwidth in GB/s, shared by concurrent transfers; 0 = instant
    /// [default: 14].
    #[arg(long, value_name = "GBPS")]
    pub bandwidth_g2_to_g1_gbps: Option<f64>,
}

/// KV bytes per token of a Hugging Face `config.json`:
/// `num_hidden_layers * 2 * num_key_value_heads * head_dim * dtype_bytes`, with
/// `num_key_value_heads` falling back to `num_attention_heads`, `head_dim` taken from the file or
/// else `hidden_size / num_attention_heads`, and `torch_dtype` bytes (float32 4; float16 and
/// bfloat16 2; fp8 and int8 1; anything else 2), as Dynamo's mocker derives it.
pub(crate) fn kv_bytes_per_token_of(config: &serde_json::Value) -> Result<u64, String> {
    let config = config.get("text_config").unwrap_or(config);
    let int = |key: &str| config.get(key).and_then(serde_json::Value::as_u64);
    let layers = int("num_hidden_layers").ok_or("model config has no num_hidden_layers")?;
    let heads = int("num_attention_heads").ok_or("model config has no num_attention_heads")?;
    if heads == 0 {
        return Err("model config has num_attention_heads = 0".into());
    }
    let kv_heads = int("num_key_value_heads")
        .or(int("num_kv_heads"))
        .unwrap_or(heads);
    let head_dim = match int("head_dim") {
        Some(d) => d,
        None => int("hidden_size").ok_or("model config has no hidden_size or head_dim")? / heads,
    };
    let dtype = config
        .get("torch_dtype")
        .or(config.get("dtype"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("auto")
        .to_ascii_lowercase();
    let dtype_bytes = match dtype.as_str() {
        "float32" | "fp32" => 4,
        d if d.contains("fp8") || d.contains("float8") || d == "int8" => 1,
        _ => 2,
    };
    Ok(layers * 2 * kv_heads * head_dim * dtype_bytes)
}

fn read_model_config(path: &Path) -> Result<u64, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("--model-config {}: {e}", path.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ConfigError(format!("--model-config {}: {e}", path.display())))?;
    kv_bytes_per_token_of(&json)
        .map_err(|e| ConfigError(format!("--model-config {}: {e}", path.display())))
}

/// The longest pass `--fixed-latency` may set: one hour, in milliseconds.
pub(crate) const MAX_FIXED_LATENCY_MS: f64 = 3_600_000.0;

/// The smallest `--speedup-ratio` and `--decode-speedup-ratio` (and their product): a thousand
/// times slower than the model, so that scaled passes stay within microsecond arithmetic.
pub(crate) const MIN_SPEEDUP_RATIO: f64 = 1e-3;

/// The smallest positive bandwidth flag in GB/s (1 MB/s): slower links would time transfers
/// beyond microsecond arithmetic.
pub(crate) const MIN_BANDWIDTH_GBPS: f64 = 1e-3;

fn parse_fixed(s: &str) -> Result<Fixed, String> {
    let (p, d) = s.split_once(',').ok_or("expected PREFILL_MS,DECODE_MS")?;
    let num = |v: &str| v.trim().parse::<f64>().map_err(|e| format!("{v:?}: {e}"));
    let (prefill_ms, decode_ms) = (num(p)?, num(d)?);
    for ms in [prefill_ms, decode_ms] {
        if !(0.0..=MAX_FIXED_LATENCY_MS).contains(&ms) {
            return Err(format!(
                "times must be finite, >= 0 and at most {MAX_FIXED_LATENCY_MS} ms (one hour), got {}",
                show_number(ms)
            ));
        }
    }
    Ok(Fixed {
        prefill_ms,
        decode_ms,
    })
}

impl EngineArgs {
    /// The number flags the engine's own validation would accept but that overflow its
    /// microsecond arithmetic, and weights too large to print sanely in its messages.
    fn check_numbers(&self) -> Result<(), ConfigError> {
        let ratios = [
            ("--speedup-ratio", self.speedup_ratio),
            ("--decode-speedup-ratio", self.decode_speedup_ratio),
            (
                "--speedup-ratio x --decode-speedup-ratio",
                self.speedup_ratio * self.decode_speedup_ratio,
            ),
        ];
        for (flag, ratio) in ratios {
            if ratio.is_nan() || ratio < MIN_SPEEDUP_RATIO {
                return Err(ConfigError(format!(
                    "{flag} must be at least {MIN_SPEEDUP_RATIO} (inf means no delay), got {}",
                    show_number(ratio)
                )));
            }
        }
        let weight = self.overlap_score_weight;
        if !(0.0..=servesim::cluster::MAX_OVERLAP_SCORE_WEIGHT).contains(&weight) {
            return Err(ConfigError(format!(
                "--overlap-score-weight must be a number between 0 and {}, got {}",
                show_number(servesim::cluster::MAX_OVERLAP_SCORE_WEIGHT),
                show_number(weight)
            )));
        }
        let floats = [
            ("--router-temperature", Some(self.router_temperature)),
            ("--router-queue-threshold", self.router_queue_threshold),
        ];
        for (flag, value) in floats {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(ConfigError(format!(
                    "{flag} must be finite and >= 0, got {}",
                    show_number(v)
                )));
            }
        }
        let bandwidths = [
            ("--kv-transfer-bandwidth", self.kv_transfer_bandwidth),
            ("--bandwidth-g1-to-g2-gbps", self.bandwidth_g1_to_g2_gbps),
            ("--bandwidth-g2-to-g1-gbps", self.bandwidth_g2_to_g1_gbps),
        ];
        for (flag, gbps) in bandwidths {
            if let Some(g) = gbps.filter(|g| !(*g == 0.0 || *g >= MIN_BANDWIDTH_GBPS)) {
                return Err(ConfigError(format!(
                    "{flag} must be 0 (instant) or at least {MIN_BANDWIDTH_GBPS} GB/s, got {}",
                    show_number(g)
                )));
            }
        }
        Ok(())
    }

    /// The validated cluster configuration these flags describe: flag combinations that only
    /// apply to another mode are errors, then [`ClusterConfig::validate`] checks every value
    /// (NaN and infinite weights, zero or huge sizes, overflowing products, ...).
    pub fn cluster_config(&self) -> Result<ClusterConfig, ConfigError> {
        let bad = |m: &str| Err(ConfigError(m.to_string()));
        self.check_numbers()?;
        let kv_bytes_per_token = match (&self.model_config, self.kv_bytes_per_token) {
            (Some(path), _) => Some(read_model_config(path)?),
            (None, Some(0)) => return bad("--kv-bytes-per-token must be positive"),
            (None, b) => b,
        };
        let serving = match self.serving_mode {
            ServingModeFlag::Aggregated => {
                let disagg_flags = [
                    ("--num-prefill-workers", self.num_prefill_workers.is_some()),
                    ("--num-decode-workers", self.num_decode_workers.is_some()),
                    (
                        "--kv-transfer-bandwidth",
                        self.kv_transfer_bandwidth.is_some(),
                    ),
                    (
                        "--kv-transfer-timing-mode",
                        self.kv_transfer_timing_mode.is_some(),
                    ),
                ];
                if let Some((flag, _)) = disagg_flags.iter().find(|(_, given)| *given) {
                    return Err(ConfigError(format!(
                        "{flag} only applies to --serving-mode disagg"
                    )));
                }
                ServingMode::Aggregated
            }
            ServingModeFlag::Disagg if self.num_workers.is_some() => {
                return bad("--num-workers applies to aggregated serving; disagg sizes its pools with --num-prefill-workers and --num-decode-workers");
            }
            ServingModeFlag::Disagg => ServingMode::Disagg {
                num_prefill_workers: self.num_prefill_workers.unwrap_or(1),
                num_decode_workers: self.num_decode_workers.unwrap_or(1),
                kv_transfer: KvTransferConfig {
                    kv_bytes_per_token,
                    bandwidth_gbps: self.kv_transfer_bandwidth.unwrap_or(64.0),
                    timing_mode: self.kv_transfer_timing_mode.unwrap_or_default(),
                },
            },
        };
        let g2 = match self.num_g2_blocks {
            None => {
                if self.bandwidth_g1_to_g2_gbps.is_some() || self.bandwidth_g2_to_g1_gbps.is_some()
                {
                    return bad("--bandwidth-g1-to-g2-gbps and --bandwidth-g2-to-g1-gbps need --num-g2-blocks");
                }
                None
            }
            Some(num_blocks) => {
                let Some(kv_bytes_per_token) = kv_bytes_per_token else {
                    return bad("--num-g2-blocks needs --kv-bytes-per-token (or --model-config) to time its transfers");
                };
                Some(G2Config {
                    num_blocks,
                    kv_bytes_per_token,
                    bandwidth_g1_to_g2_gbps: self.bandwidth_g1_to_g2_gbps.unwrap_or(14.0),
                    bandwidth_g2_to_g1_gbps: self.bandwidth_g2_to_g1_gbps.unwrap_or(14.0),
                })
            }
        };
        let model: Arc<dyn LatencyModel> = match (&self.perf_profile, self.fixed_latency) {
            (Some(path), _) => Arc::new(
                Profiled::load(path).map_err(|e| ConfigError(format!("--perf-profile: {e}")))?,
            ),
            (None, Some(f)) => Arc::new(f),
            (None, None) => Arc::new(Polynomial::default()),
        };
        let config = ClusterConfig {
            engine: EngineConfig {
                engine_type: self.engine_type,
                num_gpu_blocks: self.num_gpu_blocks,
                block_size: self.block_size,
                max_num_seqs: self.max_num_seqs,
                max_num_batched_tokens: self.max_num_batched_tokens,
                enable_prefix_caching: !self.no_prefix_caching,
                enable_chunked_prefill: !self.no_chunked_prefill,
                preemption_mode: self.preemption_mode,
                max_model_len: None,
                latency: ScaledLatency {
                    model,
                    speedup_ratio: self.speedup_ratio,
                    decode_speedup_ratio: self.decode_speedup_ratio,
                },
                sglang: SglangConfig::default(),
                role: WorkerRole::Aggregated,
                g2,
            },
            num_workers: self.num_workers.unwrap_or(DEFAULT_NUM_WORKERS),
            router: RouterConfig {
                mode: self.router_mode,
                overlap_score_weight: self.overlap_score_weight,
                temperature: self.router_temperature,
                queue_threshold: self.router_queue_threshold,
                use_kv_events: !self.no_kv_events,
                ..RouterConfig::default()
            },
            seed: self.seed,
            serving,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::config::ServerConfig;
    use crate::{Cli, Command};

    fn fixture(name: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures")
            .join(name)
            .display()
            .to_string()
    }

    /// Flags every command must refuse before starting, with the flag named in the error.
    const BAD: &[(&[&str], &str)] = &[
        (&["--overlap-score-weight", "nan"], "--overlap-score-weight"),
        (&["--overlap-score-weight", "inf"], "--overlap-score-weight"),
        (
            &["--overlap-score-weight", "1e308"],
            "--overlap-score-weight",
        ),
        (&["--router-temperature", "inf"], "--router-temperature"),
        (
            &["--router-queue-threshold", "nan"],
            "--router-queue-threshold",
        ),
        (&["--speedup-ratio", "0"], "--speedup-ratio"),
        (
            &["--speedup-ratio", "1e-300"],
            "--speedup-ratio must be at least 0.001",
        ),
        (&["--decode-speedup-ratio", "nan"], "--decode-speedup-ratio"),
        (
            &["--speedup-ratio", "0.01", "--decode-speedup-ratio", "0.01"],
            "--speedup-ratio x --decode-speedup-ratio",
        ),
        (&["--fixed-latency", "1e308,1"], "got 1e308"),
        (&["--fixed-latency", "1,3600001"], "at most 3600000 ms"),
        (&["--router-temperature", "1e309"], "--router-temperature"),
        (
            &[
                "--serving-mode",
                "disagg",
                "--kv-transfer-bandwidth",
                "1e-300",
            ],
            "--kv-transfer-bandwidth must be 0 (instant) or at least 0.001 GB/s, got 1e-300",
        ),
        (&["--num-workers", "0"], "--num-workers"),
        (&["--num-workers", "100000"], "--num-workers"),
        (&["--max-num-seqs", "0"], "--max-num-seqs"),
        (
            &["--max-num-batched-tokens", "0"],
            "--max-num-batched-tokens",
        ),
        (&["--block-size", "0"], "--block-size"),
        (
            &[
                "--block-size",
                "4294967296",
                "--num-gpu-blocks",
                "4294967296",
            ],
            "--num-gpu-blocks",
        ),
        (
            &["--serving-mode", "disagg", "--kv-transfer-bandwidth", "nan"],
            "--kv-transfer-bandwidth",
        ),
        (
            &[
                "--num-g2-blocks",
                "4",
                "--kv-bytes-per-token",
                "1000",
                "--bandwidth-g1-to-g2-gbps",
                "nan",
            ],
            "--bandwidth-g1-to-g2-gbps",
        ),
        (
            &[
                "--num-g2-blocks",
                "4",
                "--kv-bytes-per-token",
                "18446744073709551615",
            ],
            "overflows",
        ),
        (&["--fixed-latency", "nan,1"], "finite"),
        (
            &["--perf-profile", "/nonexistent/profile.npz"],
            "/nonexistent/profile.npz",
        ),
    ];

    #[test]
    fn serve_and_replay_refuse_the_same_bad_flags_with_clear_errors() {
        let trace = fixture("trace_small.jsonl");
        for (flags, needle) in BAD {
            let mut serve = vec!["mockserve", "serve"];
            serve.extend_from_slice(flags);
            let mut replay = vec!["mockserve", "replay", trace.as_str(), "-q"];
            replay.extend_from_slice(flags);
            for argv in [serve, replay] {
                let msg = match Cli::try_parse_from(&argv) {
                    // A value clap's own parser refuses (the flag is named by clap).
                    Err(e) => e.to_string(),
                    Ok(cli) => match cli.command {
                        // Validation happens before binding a port or loading the engine.
                        Some(Command::Serve(args)) => ServerConfig::from_args(&args.serve)
                            .expect_err("refused")
                            .to_string(),
                        _ => format!("{:#}", crate::run(cli).expect_err("refused")),
                    },
                };
                assert!(msg.contains(needle), "{argv:?}: {msg}");
                assert!(
                    !msg.contains("0000000000000000"),
                    "{argv:?}: a huge number written out: {msg}"
                );
            }
        }
    }

    #[test]
    fn useless_but_valid_settings_are_warned_about() {
        let cli = Cli::try_parse_from([
            "mockserve",
            "serve",
            "--max-num-batched-tokens",
            "16",
            "--no-chunked-prefill",
            "--num-gpu-blocks",
            "4",
            "--router-mode",
            "round-robin",
            "--overlap-score-weight",
            "2",
        ])
        .expect("parses");
        let Some(Command::Serve(args)) = cli.command else {
            panic!("serve");
        };
        let config = ServerConfig::from_args(&args.serve).expect("valid");
        let warnings = config.live_cluster().warnings().join("\n");
        for needle in [
            "prompts longer than --max-num-batched-tokens (16) are refused",
            "KV pool holds 256 tokens",
            "have no effect with --router-mode round-robin",
        ] {
            assert!(warnings.contains(needle), "{needle}: {warnings}");
        }
        let Some(Command::Serve(defaults)) = Cli::try_parse_from(["mockserve", "serve"])
            .expect("parses")
            .command
        else {
            panic!("serve");
        };
        let config = ServerConfig::from_args(&defaults.serve).expect("valid");
        assert_eq!(config.live_cluster().warnings(), Vec::<String>::new());
    }

    #[test]
    fn perf_profile_replaces_the_polynomial_and_excludes_fixed_latency() {
        let profile = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../profiles/h200_tp1_perf.npz")
            .display()
            .to_string();
        let trace = fixture("trace_small.jsonl");
        let cli = Cli::try_parse_from([
            "mockserve",
            "replay",
            trace.as_str(),
            "--perf-profile",
            profile.as_str(),
            "--speedup-ratio",
            "2",
        ])
        .expect("parses");
        let Some(Command::Replay(args)) = cli.command else {
            panic!("replay");
        };
        let config = args.engine.cluster_config().expect("valid");
        let latency = &config.engine.latency;
        assert!(latency.model.describe().contains("h200_tp1_perf.npz"));
        // The profile's first prefill point (100 tokens, 19.525209 ms) at speed-up 2: 9.7626045
        // ms, to the nanosecond.
        let batch = servesim::perf::PrefillBatch {
            num_requests: 1,
            total_isl: 100,
            total_prefix: 0,
        };
        assert_eq!(
            latency.prefill(&batch),
            servesim::time::SimDuration::from_nanos(9_762_605)
        );
        let both = Cli::try_parse_from([
            "mockserve",
            "serve",
            "--perf-profile",
            profile.as_str(),
            "--fixed-latency",
            "1,1",
        ]);
        assert!(both.is_err());
    }

    #[test]
    fn kv_bytes_per_token_from_a_llama_like_config() {
        // Llama-3-8B: 32 layers, 8 KV heads, head dim 4096/32 = 128, bf16.
        let cfg = serde_json::json!({
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096, "torch_dtype": "bfloat16"
        });
        assert_eq!(kv_bytes_per_token_of(&cfg), Ok(32 * 2 * 8 * 128 * 2));
        // No KV heads: falls back to attention heads; explicit head_dim wins; fp32 is 4 bytes.
        let cfg = serde_json::json!({
            "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64,
            "head_dim": 32, "torch_dtype": "float32"
        });
        assert_eq!(kv_bytes_per_token_of(&cfg), Ok(2 * 2 * 4 * 32 * 4));
        assert!(kv_bytes_per_token_of(&serde_json::json!({})).is_err());
    }
}
