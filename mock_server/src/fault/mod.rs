//! Fault injection for testing clients: `--fault-rate R` fails a seeded share of generation
//! requests with one of `--fault-types`, and the request header `x-servesim-fault: TYPE` forces
//! one (`none` forces none).
//!
//! `crate::api::fault::inject` is a middleware in front of `/v1/chat/completions`, `/v1/completions` and
//! `/v1/embeddings`. Each request that reaches it takes the next draw number `k` (arrival order),
//! and whether it faults, with which type and after how many tokens, is a function of
//! `(--seed, k)` alone: the same seed and the same request order give the same faults.
//!
//! | type | on the wire |
//! |------|-------------|
//! | `rate-limit` | 429 `rate_limit_error`, `retry-after: 1` |
//! | `server-error` | 500 `server_error` |
//! | `unavailable` | 503 `server_error` |
//! | `context-length` | 400 `context_length_exceeded` (`param: messages`) |
//! | `invalid-request` | 400 `invalid_request_error` |
//! | `stream-cut` | the connection drops after N content chunks (no `[DONE]`) |
//! | `stream-stall` | no bytes for `--fault-stall-ms` after N chunks, then the stream goes on |
//! | `stream-error` | after N chunks a final `data: {"error":…}` event, then `data: [DONE]` |
//!
//! N is drawn in `0..=16`; a stream that ends sooner faults just before its finish chunk. The
//! first five types answer without running the request. A cut or errored stream drops the
//! generation, which cancels the engine request and frees its KV blocks at once (it then also
//! counts as a cancellation). A non-streamed request drawn a stream type is cut (the connection
//! drops without an answer), stalled (answered late) or answered with a 500, after running.
//! Every applied fault counts in `servesim_faults_total{type}`; all but stalls also count as
//! failures (`servesim_http_request_failures_total`).
//!
//! This file holds what a fault is and when one is drawn ([`FaultType`], [`FaultConfig`]);
//! `crate::api::fault` applies them to requests and responses.

use std::str::FromStr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Salt of the per-request fault generator (so faults do not echo answer seeds).
const FAULT_SALT: u64 = 0xFA17_5EED_0000_0001;

/// Largest number of content chunks before a stream fault.
const MAX_TOKENS_BEFORE_FAULT: usize = 16;

/// Default `--fault-stall-ms`.
pub(crate) const DEFAULT_STALL_MS: u64 = 2000;

/// A kind of injected failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum FaultType {
    /// 429 with `retry-after`.
    RateLimit,
    /// 500.
    ServerError,
    /// 503.
    Unavailable,
    /// 400 `context_length_exceeded`.
    ContextLength,
    /// 400 `invalid_request_error`.
    InvalidRequest,
    /// The connection drops mid-stream.
    StreamCut,
    /// No bytes for a while mid-stream, then the stream goes on.
    StreamStall,
    /// A final `data: {"error":…}` event mid-stream.
    StreamError,
}

impl FaultType {
    /// Every type, in flag order.
    pub const ALL: [FaultType; 8] = [
        FaultType::RateLimit,
        FaultType::ServerError,
        FaultType::Unavailable,
        FaultType::ContextLength,
        FaultType::InvalidRequest,
        FaultType::StreamCut,
        FaultType::StreamStall,
        FaultType::StreamError,
    ];

    /// The name in flags, the header and the metric label.
    pub fn name(self) -> &'static str {
        match self {
            FaultType::RateLimit => "rate-limit",
            FaultType::ServerError => "server-error",
            FaultType::Unavailable => "unavailable",
            FaultType::ContextLength => "context-length",
            FaultType::InvalidRequest => "invalid-request",
            FaultType::StreamCut => "stream-cut",
            FaultType::StreamStall => "stream-stall",
            FaultType::StreamError => "stream-error",
        }
    }
}

impl FromStr for FaultType {
    type Err = String;

    fn from_str(s: &str) -> Result<FaultType, String> {
        FaultType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = FaultType::ALL.iter().map(|t| t.name()).collect();
                format!(
                    "unknown fault type '{s}' (expected none or one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// `mockserve serve` flags for fault injection.
#[derive(Args, Clone, Debug, PartialEq)]
#[command(next_help_heading = "Fault injection")]
pub struct FaultArgs {
    /// Share of generation requests (0..=1) that fail with one of --fault-types, drawn from
    /// --seed and the request's arrival number.
    #[arg(long, value_name = "R", default_value_t = 0.0)]
    pub fault_rate: f64,

    /// The failures drawn (comma-separated): rate-limit (429), server-error (500),
    /// unavailable (503), context-length (400), invalid-request (400), stream-cut,
    /// stream-stall, stream-error. Default: all.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "TYPES")]
    pub fault_types: Vec<FaultType>,

    /// How long a stream-stall fault sends nothing, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_STALL_MS)]
    pub fault_stall_ms: u64,
}

impl Default for FaultArgs {
    fn default() -> Self {
        FaultArgs {
            fault_rate: 0.0,
            fault_types: Vec::new(),
            fault_stall_ms: DEFAULT_STALL_MS,
        }
    }
}

/// Fault-injection settings, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Share of requests that fault (0 disables drawing; the header still forces).
    pub rate: f64,
    /// Types drawn from, sorted and distinct (never empty).
    pub types: Vec<FaultType>,
    /// How long a stall lasts.
    pub stall: Duration,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            rate: 0.0,
            types: FaultType::ALL.to_vec(),
            stall: Duration::from_millis(DEFAULT_STALL_MS),
        }
    }
}

impl FaultConfig {
    /// The settings the flags describe; the rate must lie in 0..=1.
    pub fn from_args(args: &FaultArgs) -> Result<FaultConfig, String> {
        if !(0.0..=1.0).contains(&args.fault_rate) {
            return Err(format!(
                "--fault-rate must be between 0 and 1, got {}",
                servesim::scheduler::show_number(args.fault_rate)
            ));
        }
        let mut types = if args.fault_types.is_empty() {
            FaultType::ALL.to_vec()
        } else {
            args.fault_types.clone()
        };
        types.sort_unstable();
        types.dedup();
        Ok(FaultConfig {
            rate: args.fault_rate,
            types,
            stall: Duration::from_millis(args.fault_stall_ms),
        })
    }

    /// The fault of draw number `k` under `seed`: `(type, tokens before a stream fault)`.
    pub fn draw(&self, seed: u64, k: u64) -> Option<(FaultType, usize)> {
        if self.rate <= 0.0 {
            return None;
        }
        let mut rng = self.rng(seed, k);
        if rng.gen::<f64>() >= self.rate {
            return None;
        }
        let kind = self.types[rng.gen_range(0..self.types.len())];
        Some((kind, rng.gen_range(0..=MAX_TOKENS_BEFORE_FAULT)))
    }

    /// Tokens before a stream fault forced by the header on draw `k` (the same number a drawn
    /// fault of draw `k` would have).
    pub fn forced_after(&self, seed: u64, k: u64) -> usize {
        let mut rng = self.rng(seed, k);
        let _ = rng.gen::<f64>();
        let _ = rng.gen_range(0..self.types.len());
        rng.gen_range(0..=MAX_TOKENS_BEFORE_FAULT)
    }

    fn rng(&self, seed: u64, k: u64) -> ChaCha8Rng {
        let mixed = xxhash_rust::xxh3::xxh3_64_with_seed(&k.to_le_bytes(), seed ^ FAULT_SALT);
        ChaCha8Rng::seed_from_u64(mixed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_clear() {
        for t in FaultType::ALL {
            assert_eq!(t.name().parse::<FaultType>(), Ok(t));
            let value = t.to_possible_value().map(|v| v.get_name().to_string());
            assert_eq!(value.as_deref(), Some(t.name()));
        }
        let err = "explode".parse::<FaultType>().err().unwrap_or_default();
        assert!(
            err.contains("unknown fault type 'explode'") && err.contains("stream-cut"),
            "{err}"
        );
    }

    #[test]
    fn draws_are_seeded_and_follow_the_rate() {
        let config = FaultConfig {
            rate: 0.25,
            types: vec![FaultType::RateLimit, FaultType::StreamCut],
            ..FaultConfig::default()
        };
        let a: Vec<_> = (0..2000).map(|k| config.draw(7, k)).collect();
        let b: Vec<_> = (0..2000).map(|k| config.draw(7, k)).collect();
        let c: Vec<_> = (0..2000).map(|k| config.draw(8, k)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let faulted = a.iter().flatten().count();
        assert!((400..600).contains(&faulted), "{faulted}");
        assert!(a.iter().flatten().any(|(t, _)| *t == FaultType::RateLimit));
        assert!(a.iter().flatten().any(|(t, _)| *t == FaultType::StreamCut));
        assert!(a
            .iter()
            .flatten()
            .all(|(_, n)| *n <= MAX_TOKENS_BEFORE_FAULT));
        let off = FaultConfig::default();
        assert!((0..100).all(|k| off.draw(7, k).is_none()));
    }

    #[test]
    fn flags_are_validated() {
        let args = FaultArgs {
            fault_rate: 1.5,
            ..FaultArgs::default()
        };
        assert!(FaultConfig::from_args(&args).is_err());
        let args = FaultArgs {
            fault_rate: 0.5,
            fault_types: vec![
                FaultType::StreamCut,
                FaultType::RateLimit,
                FaultType::StreamCut,
            ],
            fault_stall_ms: 10,
        };
        let config = FaultConfig::from_args(&args).ok();
        assert_eq!(
            config.map(|c| c.types),
            Some(vec![FaultType::RateLimit, FaultType::StreamCut])
        );
        assert_eq!(
            FaultConfig::from_args(&FaultArgs::default()).map(|c| c.types.len()),
            Ok(8)
        );
    }
}
