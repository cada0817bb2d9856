//! What one run runs on, whatever the mode, below the harness (`crate::harness`): the
//! modules:
//!
//! - [`target`]: where requests go ([`target::TargetArgs`] → [`target::TargetSpec`] →
//!   [`target::Connected`]): `--url` or the embedded mockserve, model detection, the tokenizer.
//! - [`driver`]: the one driver loop; each session is a [`driver::Script`] whose requests are
//!   due at absolute offsets (open loop) or after the previous answer (closed loop).
//! - [`client`]: one streamed request on the wire and its timing; [`sse`]: the bounded SSE
//!   parser it reads with.
//! - `prompt`: prompt text from hash ids, exact for a known tokenizer; `blocks`: a prompt kept
//!   as chained block hashes (multiturn records, `trace convert`).
//! - `failure`: why a request failed, counts by reason and the verdict.
//! - `shard`: `--shard I/N` and `--start-at`, one load split over N processes.
//! - [`lora`]: the seeded mix of LoRA adapters sent as the model.

pub(crate) mod blocks;
pub mod client;
pub mod driver;
pub(crate) mod failure;
pub mod lora;
pub(crate) mod prompt;
pub(crate) mod shard;
pub mod sse;
pub mod target;
