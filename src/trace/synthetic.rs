//! Synthetic open-loop load, as `loadgen bench` describes it: the seeded send offsets
//! ([`arrival_offsets`]: Poisson, constant or gamma gaps, vLLM's `--burstiness`), each request's
//! lengths ([`request_lengths`]: normal draws around the means), and, for the offline replay,
//! the same requests as a [`Trace`] ([`SyntheticLoad::trace`]) whose shared prefixes are shared
//! KV blocks.
//!
//! This is the one generator: `loadgen bench` sends its requests at these offsets with these
//! lengths, and `mockserve replay` / `mockserve plan` replay the same requests on the virtual
//! clock, so that the same flags and seed give the same load both ways.

use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::{describe_ms, ScheduleBound, Session, Trace, TraceRequest, MAX_ROW_TOKENS};
use crate::time::{SimDuration, SimTime};

/// Most requests one synthetic load may hold (loadgen's `MAX_REQUESTS`): the offsets are
/// computed ahead, so their number stays bounded.
pub const MAX_SYNTHETIC_REQUESTS: usize = 10_000_000;

/// Requests when neither a count nor a duration is given (loadgen bench's default).
pub const DEFAULT_NUM_REQUESTS: usize = 100;

/// Most requests per second of a synthetic load (`--request-rate`; `inf` is every request at
/// once), in loadgen and mockserve alike.
pub const MAX_SYNTHETIC_RATE: f64 = 1e6;

/// The range of `--burstiness`, the shape of gamma gaps.
pub const SYNTHETIC_BURSTINESS: (f64, f64) = (1e-3, 1e3);

/// Longest `--duration` of a synthetic load, seconds: seven days.
pub const MAX_SYNTHETIC_DURATION_S: f64 = 7.0 * 86_400.0;

/// Most prompt tokens a synthetic request may have (`--input-tokens` with its shared prefix).
pub const MAX_SYNTHETIC_PROMPT_TOKENS: usize = 1 << 22;

/// Open-loop inter-arrival distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Equal gaps.
    Constant,
    /// Gamma gaps with shape `burstiness`.
    Gamma,
}

impl Arrival {
    /// Its flag value.
    pub fn name(self) -> &'static str {
        match self {
            Arrival::Poisson => "poisson",
            Arrival::Constant => "constant",
            Arrival::Gamma => "gamma",
        }
    }

    /// Every value, for the flags' help.
    pub const ALL: [Arrival; 3] = [Arrival::Poisson, Arrival::Constant, Arrival::Gamma];
}

impl FromStr for Arrival {
    type Err = String;
    fn from_str(s: &str) -> Result<Arrival, String> {
        Arrival::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| format!("unknown arrival {s:?} (poisson, constant, gamma)"))
    }
}

/// A standard normal draw (Box-Muller).
pub fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A gamma draw with `shape` and scale 1 (Marsaglia and Tsang).
fn gamma(rng: &mut ChaCha8Rng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u: f64 = 1.0 - rng.gen::<f64>();
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = (1.0 + c * x).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u: f64 = 1.0 - rng.gen::<f64>();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// Open-loop send offsets (seconds): request 0 at 0, then gaps, at most `count` offsets (at
/// most [`MAX_SYNTHETIC_REQUESTS`] when None) and none past `limit_s`. An infinite rate needs a
/// `count`.
pub fn arrival_offsets(
    rate: f64,
    arrival: Arrival,
    burstiness: f64,
    count: Option<usize>,
    limit_s: f64,
    seed: u64,
) -> Vec<f64> {
    let count = match count {
        Some(n) => n,
        None if rate.is_infinite() || limit_s.is_infinite() => return Vec::new(),
        None => MAX_SYNTHETIC_REQUESTS,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xA11_1FA1);
    let mut out = Vec::new();
    let mut t = 0.0;
    while out.len() < count && t <= limit_s {
        out.push(t);
        if rate.is_infinite() {
            continue;
        }
        let mean = 1.0 / rate;
        t += match arrival {
            Arrival::Constant => mean,
            Arrival::Poisson => -(1.0 - rng.gen::<f64>()).ln() * mean,
            Arrival::Gamma => gamma(&mut rng, burstiness) * mean / burstiness,
        };
    }
    out
}

/// Prompt and output lengths.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lengths {
    /// Mean unique prompt tokens.
    pub input_tokens: usize,
    /// Their standard deviation.
    pub input_tokens_stddev: f64,
    /// Mean output tokens.
    pub output_tokens: usize,
    /// Their standard deviation.
    pub output_tokens_stddev: f64,
    /// Shared prefix tokens before each prompt (0 = none).
    pub shared_prefix_tokens: usize,
    /// Distinct shared prefixes; request k uses prefix k mod this.
    pub num_prefix_groups: usize,
}

/// Request `k`'s (unique prompt tokens, output tokens) for `seed`: normal draws around the
/// means, each within `[1, max]` (`max_prompt` for the unique part, `max_output`), so a wide
/// deviation never asks for an unbounded prompt.
pub fn request_lengths(
    lengths: &Lengths,
    seed: u64,
    k: usize,
    max_prompt: usize,
    max_output: usize,
) -> (usize, usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9).wrapping_add(k as u64));
    let draw = |rng: &mut ChaCha8Rng, mean: usize, sd: f64, max: usize| {
        ((mean as f64 + sd * normal(rng))
            .round()
            .clamp(1.0, max.max(1) as f64)) as usize
    };
    (
        draw(
            &mut rng,
            lengths.input_tokens,
            lengths.input_tokens_stddev,
            max_prompt,
        ),
        draw(
            &mut rng,
            lengths.output_tokens,
            lengths.output_tokens_stddev,
            max_output,
        ),
    )
}

/// Most output tokens a synthetic request may ask for (loadgen's `MAX_OUTPUT_TOKENS`).
pub const MAX_SYNTHETIC_OUTPUT_TOKENS: usize = 1 << 22;

/// A validated open-loop synthetic load: `loadgen bench --request-rate ...` without the wire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticLoad {
    /// Requests per second (finite and above 0, or infinite: every request at once).
    pub rate: f64,
    /// Inter-arrival distribution.
    pub arrival: Arrival,
    /// Gamma shape (1 unless `arrival` is gamma).
    pub burstiness: f64,
    /// Most requests (None: as many as `duration_s` holds).
    pub num_requests: Option<usize>,
    /// No request due after this many seconds (None: no limit).
    pub duration_s: Option<f64>,
    /// The lengths.
    pub lengths: Lengths,
    /// Seeds the arrivals and the lengths.
    pub seed: u64,
}

/// Why a synthetic load cannot become a trace.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SyntheticError {
    /// Neither a finite count nor a finite rate and duration bound the requests.
    #[error("the synthetic load is unbounded: give --num-requests (or a finite --request-rate with --duration)")]
    Unbounded,
    /// No request at all.
    #[error("the synthetic load holds no request")]
    Empty,
    /// More requests than [`MAX_SYNTHETIC_REQUESTS`].
    #[error("the synthetic load schedules about {0} requests, above the {MAX_SYNTHETIC_REQUESTS} allowed: lower --request-rate or --duration, or give --num-requests")]
    TooMany(u64),
    /// The prompts need more distinct KV blocks than the replay's block ids hold (2^32).
    #[error("the synthetic load's prompts need more than 2^32 distinct KV blocks: fewer or shorter requests")]
    TooManyBlocks,
    /// The last request arrives (sped up) later than the schedule bound allows.
    #[error(
        "the synthetic load's last request arrives {} after its start, beyond the {} a \
         schedule may run: raise --request-rate, lower --num-requests or --duration, or pass \
         --allow-long-schedule",
        describe_ms(*at_ms),
        describe_ms(*bound_ms)
    )]
    LongSchedule {
        /// When, ms after the start.
        at_ms: f64,
        /// The bound, ms.
        bound_ms: f64,
    },
}

impl SyntheticLoad {
    /// Checks that the requests are bounded (a count, or a finite rate and duration) and at
    /// most [`MAX_SYNTHETIC_REQUESTS`], before anything is drawn; returns the count limit.
    pub fn check(&self) -> Result<Option<usize>, SyntheticError> {
        let count = match (self.num_requests, self.duration_s) {
            (None, None) => Some(DEFAULT_NUM_REQUESTS),
            (n, _) => n,
        };
        match count {
            Some(n) if n > MAX_SYNTHETIC_REQUESTS => Err(SyntheticError::TooMany(n as u64)),
            Some(_) => Ok(count),
            None => {
                let limit_s = self.duration_s.unwrap_or(f64::INFINITY);
                if !(self.rate.is_finite() && limit_s.is_finite()) {
                    return Err(SyntheticError::Unbounded);
                }
                let expected = self.rate * limit_s;
                if expected > MAX_SYNTHETIC_REQUESTS as f64 {
                    return Err(SyntheticError::TooMany(expected.round() as u64));
                }
                Ok(None)
            }
        }
    }

    /// The send offsets (seconds), as `loadgen bench` computes them.
    pub fn offsets(&self) -> Result<Vec<f64>, SyntheticError> {
        let count = self.check()?;
        let offsets = arrival_offsets(
            self.rate,
            self.arrival,
            self.burstiness,
            count,
            self.duration_s.unwrap_or(f64::INFINITY),
            self.seed,
        );
        if offsets.is_empty() {
            return Err(SyntheticError::Empty);
        }
        Ok(offsets)
    }

    /// Request `k`'s (unique prompt tokens, output tokens), as `loadgen bench` draws them.
    pub fn lengths(&self, k: usize) -> (usize, usize) {
        request_lengths(
            &self.lengths,
            self.seed,
            k,
            MAX_ROW_TOKENS.saturating_sub(self.lengths.shared_prefix_tokens),
            MAX_SYNTHETIC_OUTPUT_TOKENS,
        )
    }

    /// The load as a trace of one-request sessions (`synthetic-K`), arrivals divided by
    /// `arrival_speedup_ratio`, with `block_size` prompt tokens per hash id (the engine's block
    /// size, so that shared prefixes are shared KV blocks exactly).
    ///
    /// Request k's prompt is its group's shared prefix (group k mod `num_prefix_groups`), then
    /// its unique tokens. The prefix's whole blocks are the group's hash ids, the same in every
    /// request of the group; the rest of the prompt (the prefix's partial last block and the
    /// unique tokens) gets ids of its own, so no two requests share anything else.
    /// The schedule (the last arrival) is held to `bound`, as a trace file's is.
    pub fn trace(
        &self,
        block_size: usize,
        arrival_speedup_ratio: f64,
        bound: ScheduleBound,
    ) -> Result<Trace, SyntheticError> {
        let offsets = self.offsets()?;
        let last_ms = offsets.last().copied().unwrap_or(0.0) * 1000.0 / arrival_speedup_ratio;
        if last_ms.is_nan() || last_ms > bound.millis() {
            return Err(SyntheticError::LongSchedule {
                at_ms: last_ms,
                bound_ms: bound.millis(),
            });
        }
        let block_size = block_size.max(1);
        let l = &self.lengths;
        let groups = l.num_prefix_groups.max(1) as u64;
        let prefix_blocks = (l.shared_prefix_tokens / block_size) as u64;
        // Prefix ids first (group g: g * prefix_blocks ..), then unique ids counting up: small
        // dense ids, below 2^32 (the replay's block tokens are 32-bit).
        let mut next_id = groups
            .checked_mul(prefix_blocks)
            .ok_or(SyntheticError::TooManyBlocks)?;
        let mut sessions = Vec::with_capacity(offsets.len());
        for (k, offset_s) in offsets.iter().enumerate() {
            let (unique, output) = self.lengths(k);
            let input_length = l.shared_prefix_tokens + unique;
            let group = k as u64 % groups;
            let mut hash_ids: Vec<u64> = (0..prefix_blocks)
                .map(|j| group * prefix_blocks + j)
                .collect();
            let own = input_length.div_ceil(block_size) as u64 - prefix_blocks;
            let end = next_id
                .checked_add(own)
                .filter(|&e| e <= u64::from(u32::MAX) + 1)
                .ok_or(SyntheticError::TooManyBlocks)?;
            hash_ids.extend(next_id..end);
            next_id = end;
            sessions.push(Session {
                id: format!("synthetic-{k}"),
                first_arrival: SimTime::from_millis_f64(offset_s * 1000.0 / arrival_speedup_ratio),
                turns: vec![TraceRequest {
                    line: k + 1,
                    request_id: None,
                    input_length,
                    requested_input_length: None,
                    output_length: output,
                    hash_ids,
                    delay: SimDuration::ZERO,
                }],
            });
        }
        Ok(Trace { sessions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_have_the_requested_rate() {
        for arrival in [Arrival::Poisson, Arrival::Constant, Arrival::Gamma] {
            let t = arrival_offsets(100.0, arrival, 0.5, Some(4001), f64::INFINITY, 1);
            assert_eq!(t.len(), 4001);
            let rate = 4000.0 / t[4000];
            assert!((rate - 100.0).abs() < 8.0, "{arrival:?} {rate}");
        }
        assert!(
            arrival_offsets(f64::INFINITY, Arrival::Poisson, 1.0, Some(5), 1.0, 1)
                .iter()
                .all(|&t| t == 0.0)
        );
        assert_eq!(
            arrival_offsets(10.0, Arrival::Constant, 1.0, Some(100), 0.35, 1).len(),
            4
        );
    }

    fn load() -> SyntheticLoad {
        SyntheticLoad {
            rate: 20.0,
            arrival: Arrival::Poisson,
            burstiness: 1.0,
            num_requests: Some(50),
            duration_s: None,
            lengths: Lengths {
                input_tokens: 100,
                input_tokens_stddev: 30.0,
                output_tokens: 20,
                output_tokens_stddev: 5.0,
                shared_prefix_tokens: 40,
                num_prefix_groups: 3,
            },
            seed: 7,
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
        let a = load().trace(16, 1.0, ScheduleBound::Default).unwrap();
        assert_eq!(a, load().trace(16, 1.0, ScheduleBound::Default).unwrap());
        let b = SyntheticLoad { seed: 8, ..load() }
            .trace(16, 1.0, ScheduleBound::Default)
            .unwrap();
        assert_ne!(a, b);
        assert_eq!(a.num_requests(), 50);
    }

    #[test]
    fn requests_follow_the_offsets_and_lengths_and_share_only_their_prefix() {
        let l = load();
        let trace = l.trace(16, 2.0, ScheduleBound::Default).unwrap();
        let offsets = l.offsets().unwrap();
        for (k, s) in trace.sessions.iter().enumerate() {
            let (unique, output) = l.lengths(k);
            let t = &s.turns[0];
            assert_eq!(
                s.first_arrival,
                SimTime::from_millis_f64(offsets[k] * 500.0)
            );
            assert_eq!((t.input_length, t.output_length), (40 + unique, output));
            assert_eq!(t.hash_ids.len(), (40 + unique).div_ceil(16));
            // 40 prefix tokens: 2 whole blocks shared by the group (k mod 3).
            let g = k as u64 % 3;
            assert_eq!(t.hash_ids[..2], [2 * g, 2 * g + 1]);
        }
        let own: Vec<u64> = trace
            .sessions
            .iter()
            .flat_map(|s| s.turns[0].hash_ids[2..].to_vec())
            .collect();
        let mut distinct = own.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), own.len(), "unique blocks are never shared");
        assert!(own.iter().all(|&id| id >= 6));
    }

    #[test]
    fn lengths_stay_in_range_and_counts_are_bounded() {
        let wide = SyntheticLoad {
            lengths: Lengths {
                input_tokens_stddev: 1e6,
                output_tokens_stddev: 1e6,
                ..load().lengths
            },
            ..load()
        };
        for k in 0..50 {
            let (i, o) = wide.lengths(k);
            assert!((1..=MAX_ROW_TOKENS - 40).contains(&i) && o >= 1, "{i} {o}");
        }
        let by_time = SyntheticLoad {
            rate: 16.0,
            num_requests: None,
            duration_s: Some(2.0),
            arrival: Arrival::Constant,
            ..load()
        };
        // Gaps of 1/16 s from 0 to 2 s inclusive.
        assert_eq!(by_time.offsets().unwrap().len(), 33);
        let unbounded = SyntheticLoad {
            rate: f64::INFINITY,
            ..by_time
        };
        assert_eq!(unbounded.offsets(), Err(SyntheticError::Unbounded));
        let huge = SyntheticLoad {
            rate: 1e6,
            duration_s: Some(100.0),
            ..by_time
        };
        assert_eq!(huge.offsets(), Err(SyntheticError::TooMany(100_000_000)));
        let slow = SyntheticLoad {
            rate: 1e-6,
            arrival: Arrival::Constant,
            num_requests: Some(2),
            ..load()
        };
        let err = slow.trace(16, 1.0, ScheduleBound::Default).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the synthetic load's last request arrives 11.6 days"),
            "{err}"
        );
        assert!(slow.trace(16, 1.0, ScheduleBound::Unbounded).is_ok());
        assert_eq!(
            SyntheticLoad {
                num_requests: None,
                duration_s: None,
                ..load()
            }
            .offsets()
            .unwrap()
            .len(),
            DEFAULT_NUM_REQUESTS
        );
        assert_eq!("gamma".parse(), Ok(Arrival::Gamma));
        assert!("bursty".parse::<Arrival>().unwrap_err().contains("poisson"));
    }
}
