//! The multi-turn workload, generated up front from a seed: per user a system prompt and, per
//! turn, the user text and the think time before it. Pure: no clock, no I/O.
//!
//! As Dynamo's `multiturn_bench`: the system prompt names the user; user turns are lorem-ipsum
//! words; the think time before turn `t >= 1` is exponential with mean `mean_delay_ms`
//! (`-mean * ln(u)`, `u = clamp(1 - uniform, MIN_POSITIVE, 1)`), drawn from one generator shared
//! by all users in (user, turn) order; user text comes from a per-user generator seeded with
//! `seed + user_id`. Generators are `ChaCha8Rng` (Dynamo's `StdRng` draws differ, so the texts are
//! not byte-identical to Dynamo's).
//!
//! User turns have exactly `num_user_tokens` tokens when a tokenizer is known; otherwise they
//! have `floor(num_user_tokens * 0.8)` words (Dynamo's heuristic of ~1.3 tokens per word).
//!
//! Tool turns (`--tool-call-share`, `--tool-wait-ms`): each turn but the last is, with the
//! share's probability, one whose answer is asked for as a tool call; the next turn is then the
//! tool's result, sent a tool wait ([`WaitDist`]) after the call arrived instead of a think
//! time. Both draws come from a generator of their own (seeded from the seed), in (user, turn)
//! order, so think times and texts are those of the same seed without tools.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servesim::tokenizer::{text_with_exact_tokens, Tokenizer, LOREM_WORDS};

/// How user text is sized.
#[derive(Clone)]
pub(crate) enum TokenCounter {
    /// Exact counts with this tokenizer.
    Exact(Arc<dyn Tokenizer>),
    /// Dynamo's words-per-token heuristic.
    Heuristic,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenCounter::Exact(_) => f.write_str("Exact"),
            TokenCounter::Heuristic => f.write_str("Heuristic"),
        }
    }
}

/// The workload's shape (pure input of [`Workload::generate`]).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    /// Users (conversations).
    pub num_users: usize,
    /// Turns per user, 1 to 10000 (users x turns at most 10^7).
    pub num_turns: usize,
    /// User tokens per turn.
    pub num_user_tokens: usize,
    /// Mean think time in ms, 0 = none.
    pub mean_delay_ms: u64,
    /// Seed of think times and text.
    pub seed: u64,
    /// Tool turns, when asked for.
    pub tools: Option<ToolTurns>,
    /// `--dataset`: user `u` runs conversation `u` of the seed's order (its turns, at most
    /// `num_turns`, its system prompt), instead of `num_user_tokens` of synthetic text a turn.
    pub dataset: Option<Arc<crate::dataset::Dataset>>,
}

/// One turn of one user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TurnScript {
    /// Think time (or, after a tool call, the tool's wait) before sending this turn (zero for
    /// the first).
    pub delay: Duration,
    /// The user message (after a tool call, the tool's result).
    pub user_text: String,
    /// Its token count when known exactly.
    pub user_tokens: Option<usize>,
    /// This turn's answer is asked for as a tool call (`tool_choice: "required"`); the next
    /// turn answers it.
    pub tool_call: bool,
    /// This turn answers the previous turn's tool call, after a tool wait.
    pub after_tool: bool,
    /// This turn's output length when the dataset gives one (else `--max-completion-tokens`).
    pub max_tokens: Option<u32>,
}

/// How long a tool runs (`--tool-wait-ms`), in ms: `fixed:MS`, `uniform:LO,HI`, `exp:MEAN`
/// (exponential) or `lognormal:MEAN,SIGMA` (log-normal with that mean; `SIGMA` is the standard
/// deviation of the underlying normal). Every value is from 0 to one hour, and so is every
/// draw (a log-normal one is cut there).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WaitDist {
    /// Always this long.
    Fixed(f64),
    /// Uniform between the two.
    Uniform(f64, f64),
    /// Exponential with this mean.
    Exponential(f64),
    /// Log-normal with this mean and shape.
    Lognormal(f64, f64),
}

/// The longest tool wait, ms (one hour, as `--mean-delay-ms`).
const MAX_WAIT_MS: f64 = crate::limits::MAX_DELAY_MS as f64;

impl WaitDist {
    /// One wait in ms.
    pub fn sample(&self, rng: &mut ChaCha8Rng) -> f64 {
        let ms = match *self {
            WaitDist::Fixed(ms) => ms,
            WaitDist::Uniform(lo, hi) => lo + (hi - lo) * rng.gen::<f64>(),
            WaitDist::Exponential(mean) => exponential_ms(rng, mean),
            WaitDist::Lognormal(mean, sigma) => {
                // Box-Muller: a standard normal from two uniforms in (0, 1].
                let u1 = (1.0 - rng.gen::<f64>()).clamp(f64::MIN_POSITIVE, 1.0);
                let u2 = rng.gen::<f64>();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (mean.ln() - sigma * sigma / 2.0 + sigma * z).exp()
            }
        };
        ms.clamp(0.0, MAX_WAIT_MS)
    }
}

impl fmt::Display for WaitDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitDist::Fixed(ms) => write!(f, "fixed:{ms}"),
            WaitDist::Uniform(lo, hi) => write!(f, "uniform:{lo},{hi}"),
            WaitDist::Exponential(mean) => write!(f, "exp:{mean}"),
            WaitDist::Lognormal(mean, sigma) => write!(f, "lognormal:{mean},{sigma}"),
        }
    }
}

impl FromStr for WaitDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = "expected fixed:MS, uniform:LO,HI, exp:MEAN or lognormal:MEAN,SIGMA";
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: {syntax}"))?;
        let numbers: Vec<f64> = rest
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && (0.0..=MAX_WAIT_MS).contains(x))
                    .ok_or_else(|| {
                        format!("{s:?}: {v:?} is not a number of ms from 0 to {MAX_WAIT_MS}")
                    })
            })
            .collect::<Result<_, _>>()?;
        match (kind, numbers.as_slice()) {
            ("fixed", &[ms]) => Ok(WaitDist::Fixed(ms)),
            ("uniform", &[lo, hi]) if lo <= hi => Ok(WaitDist::Uniform(lo, hi)),
            ("uniform", &[_, _]) => Err(format!("{s:?}: LO must not be above HI")),
            ("exp", &[mean]) => Ok(WaitDist::Exponential(mean)),
            ("lognormal", &[mean, sigma]) if mean > 0.0 && sigma <= 10.0 => {
                Ok(WaitDist::Lognormal(mean, sigma))
            }
            ("lognormal", &[_, _]) => Err(format!(
                "{s:?}: a log-normal needs a MEAN above 0 and a SIGMA of at most 10"
            )),
            _ => Err(format!("{s:?}: {syntax}")),
        }
    }
}

/// Tool turns: the share of turns (all but the last) whose answer is a tool call, and how long
/// the tool runs before its result is sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ToolTurns {
    /// 0 to 1.
    pub share: f64,
    /// The tool's run time.
    pub wait: WaitDist,
}

/// One user's conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UserScript {
    /// 0-based user id.
    pub user_id: usize,
    /// The system message.
    pub system_prompt: String,
    /// The turns in order.
    pub turns: Vec<TurnScript>,
}

/// Every user's script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Workload {
    /// Users in id order.
    pub users: Vec<UserScript>,
}

/// Dynamo's system prompt for `user_id`.
pub(crate) fn system_prompt(user_id: usize) -> String {
    format!(
        "You are a helpful assistant. You are assisting user {user_id}. Answer questions thoroughly and accurately."
    )
}

/// One exponential think time in ms with mean `mean_ms` (Dynamo's `sample_exponential_ms`).
fn exponential_ms(rng: &mut ChaCha8Rng, mean_ms: f64) -> f64 {
    let u = (1.0 - rng.gen::<f64>()).clamp(f64::MIN_POSITIVE, 1.0);
    -mean_ms * u.ln()
}

impl Workload {
    /// The workload `spec` describes, user text sized with `counter`.
    pub(crate) fn generate(spec: &WorkloadSpec, counter: &TokenCounter) -> Workload {
        if let Some(dataset) = &spec.dataset {
            return Workload::from_dataset(spec, dataset, counter);
        }
        let mut delay_rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let users = (0..spec.num_users)
            .map(|user_id| {
                let mut text_rng =
                    ChaCha8Rng::seed_from_u64(spec.seed.wrapping_add(user_id as u64));
                let turns = (0..spec.num_turns)
                    .map(|turn| {
                        let delay = if turn == 0 || spec.mean_delay_ms == 0 {
                            Duration::ZERO
                        } else {
                            let ms = exponential_ms(&mut delay_rng, spec.mean_delay_ms as f64);
                            Duration::from_secs_f64(ms / 1000.0)
                        };
                        let (user_text, user_tokens) = match counter {
                            TokenCounter::Exact(tok) => {
                                let text = text_with_exact_tokens(
                                    tok.as_ref(),
                                    &mut text_rng,
                                    spec.num_user_tokens,
                                );
                                let n = tok.encode(&text).len();
                                (text, Some(n))
                            }
                            TokenCounter::Heuristic => {
                                let words = (spec.num_user_tokens as f64 * 0.8) as usize;
                                let text = (0..words)
                                    .map(|_| LOREM_WORDS[text_rng.gen_range(0..LOREM_WORDS.len())])
                                    .collect::<Vec<_>>()
                                    .join(" ");
                                (text, None)
                            }
                        };
                        TurnScript {
                            delay,
                            user_text,
                            user_tokens,
                            tool_call: false,
                            after_tool: false,
                            max_tokens: None,
                        }
                    })
                    .collect();
                UserScript {
                    user_id,
                    system_prompt: system_prompt(user_id),
                    turns,
                }
            })
            .collect::<Vec<UserScript>>();
        let mut workload = Workload { users };
        if let Some(tools) = spec.tools {
            workload.add_tool_turns(tools, spec.seed);
        }
        workload
    }

    /// The workload of `spec` from `dataset`: user `u` runs conversation `u` of the seed's
    /// order, cut at `num_turns`; think times drawn as for synthetic text; counts exact when
    /// `counter` is (the dataset was counted with the target's tokenizer).
    fn from_dataset(
        spec: &WorkloadSpec,
        dataset: &crate::dataset::Dataset,
        counter: &TokenCounter,
    ) -> Workload {
        let mut delay_rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let order = dataset.order(spec.seed);
        let exact = matches!(counter, TokenCounter::Exact(_));
        let users = (0..spec.num_users)
            .map(|user_id| {
                let conversation = dataset.conversation(order[user_id % order.len()]);
                let turns = conversation
                    .turns
                    .iter()
                    .take(spec.num_turns)
                    .enumerate()
                    .map(|(turn, t)| TurnScript {
                        delay: if turn == 0 || spec.mean_delay_ms == 0 {
                            Duration::ZERO
                        } else {
                            let ms = exponential_ms(&mut delay_rng, spec.mean_delay_ms as f64);
                            Duration::from_secs_f64(ms / 1000.0)
                        },
                        user_text: t.text.clone(),
                        user_tokens: exact.then_some(t.input_tokens),
                        tool_call: false,
                        after_tool: false,
                        max_tokens: dataset
                            .output_tokens
                            .or(t.output_tokens)
                            .map(|n| n.min(u32::MAX as usize) as u32),
                    })
                    .collect();
                UserScript {
                    user_id,
                    system_prompt: conversation
                        .system
                        .clone()
                        .unwrap_or_else(|| system_prompt(user_id)),
                    turns,
                }
            })
            .collect();
        let mut workload = Workload { users };
        if let Some(tools) = spec.tools {
            workload.add_tool_turns(tools, spec.seed);
        }
        workload
    }

    /// Makes a share of the turns tool calls, each answered by the next turn after a tool wait.
    fn add_tool_turns(&mut self, tools: ToolTurns, seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ TOOL_SEED);
        for user in &mut self.users {
            for t in 1..user.turns.len() {
                if rng.gen::<f64>() < tools.share {
                    let wait = tools.wait.sample(&mut rng);
                    user.turns[t - 1].tool_call = true;
                    let next = &mut user.turns[t];
                    next.after_tool = true;
                    next.delay = Duration::from_secs_f64(wait / 1000.0);
                }
            }
        }
    }
}

/// Mixed into the seed of the tool draws' generator.
const TOOL_SEED: u64 = 0x7001_ca11_5eed_0001;

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::tokenizer::BuiltinTokenizer;

    fn spec(seed: u64) -> WorkloadSpec {
        WorkloadSpec {
            num_users: 3,
            num_turns: 4,
            num_user_tokens: 37,
            mean_delay_ms: 100,
            seed,
            tools: None,
            dataset: None,
        }
    }

    #[test]
    fn same_seed_same_workload_and_exact_counts() {
        let counter = TokenCounter::Exact(Arc::new(BuiltinTokenizer::new()));
        let a = Workload::generate(&spec(7), &counter);
        assert_eq!(a, Workload::generate(&spec(7), &counter));
        assert_ne!(a, Workload::generate(&spec(8), &counter));
        for u in &a.users {
            assert_eq!(u.turns[0].delay, Duration::ZERO);
            assert!(u.turns[1..].iter().all(|t| t.delay > Duration::ZERO));
            assert!(u.turns.iter().all(|t| t.user_tokens == Some(37)));
            assert!(u.system_prompt.contains(&format!("user {}", u.user_id)));
        }
        assert_ne!(a.users[0].turns[0].user_text, a.users[1].turns[0].user_text);
    }

    #[test]
    fn builtin_tokenizer_counts_are_exact() {
        let counter = TokenCounter::Exact(Arc::new(BuiltinTokenizer::new()));
        let w = Workload::generate(&spec(1), &counter);
        let tok = BuiltinTokenizer::new();
        for t in w.users.iter().flat_map(|u| &u.turns) {
            assert_eq!(tok.encode(&t.user_text).len(), 37);
        }
    }

    #[test]
    fn heuristic_uses_dynamo_word_count_and_no_delay_at_zero_mean() {
        let mut s = spec(3);
        s.mean_delay_ms = 0;
        s.num_user_tokens = 50;
        let w = Workload::generate(&s, &TokenCounter::Heuristic);
        for t in w.users.iter().flat_map(|u| &u.turns) {
            assert_eq!(t.user_text.split(' ').count(), 40);
            assert_eq!(t.delay, Duration::ZERO);
            assert_eq!(t.user_tokens, None);
        }
    }

    #[test]
    fn think_times_have_the_requested_mean() {
        let mut s = spec(5);
        s.num_users = 200;
        s.num_turns = 11;
        s.num_user_tokens = 1;
        let w = Workload::generate(&s, &TokenCounter::Heuristic);
        let delays: Vec<f64> = w
            .users
            .iter()
            .flat_map(|u| u.turns[1..].iter().map(|t| t.delay.as_secs_f64() * 1000.0))
            .collect();
        let mean = delays.iter().sum::<f64>() / delays.len() as f64;
        assert!((mean - 100.0).abs() < 10.0, "mean {mean}");
    }

    /// Tool turns change only the turns they pick: the same texts and think times elsewhere,
    /// the waits after calls, never a call on a last turn; the share is kept; wait
    /// distributions parse, print back and are refused out of range.
    #[test]
    fn tool_turns_are_drawn_apart_from_the_rest() {
        let mut s = spec(11);
        s.num_users = 50;
        let plain = Workload::generate(&s, &TokenCounter::Heuristic);
        s.tools = Some(ToolTurns {
            share: 0.5,
            wait: "fixed:250".parse().expect("valid"),
        });
        let tools = Workload::generate(&s, &TokenCounter::Heuristic);
        let mut calls = 0;
        for (p, t) in plain.users.iter().zip(&tools.users) {
            assert!(!t.turns.last().expect("turns").tool_call);
            for (i, (a, b)) in p.turns.iter().zip(&t.turns).enumerate() {
                assert_eq!(a.user_text, b.user_text);
                let after_call = i > 0 && t.turns[i - 1].tool_call;
                assert_eq!(b.after_tool, after_call);
                if after_call {
                    assert_eq!(b.delay, Duration::from_millis(250));
                } else {
                    assert_eq!(a.delay, b.delay);
                }
                calls += usize::from(b.tool_call);
            }
        }
        // 150 candidate turns at one half.
        assert!((50..=100).contains(&calls), "{calls} tool calls");
        for (text, dist) in [
            ("fixed:0", WaitDist::Fixed(0.0)),
            ("uniform:10,20.5", WaitDist::Uniform(10.0, 20.5)),
            ("exp:300", WaitDist::Exponential(300.0)),
            ("lognormal:800,0.5", WaitDist::Lognormal(800.0, 0.5)),
        ] {
            let parsed: WaitDist = text.parse().expect("valid");
            assert_eq!(parsed, dist);
            assert_eq!(parsed.to_string(), text);
        }
        for bad in [
            "fixed",
            "fixed:-1",
            "fixed:3600001",
            "fixed:NaN",
            "uniform:5,1",
            "exp:1,2",
            "lognormal:0,1",
            "lognormal:10,11",
            "gamma:1",
        ] {
            assert!(bad.parse::<WaitDist>().is_err(), "{bad}");
        }
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let draws: Vec<f64> = (0..20_000)
            .map(|_| WaitDist::Lognormal(800.0, 0.5).sample(&mut rng))
            .collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 800.0).abs() < 20.0, "mean {mean}");
        let u: Vec<f64> = (0..1000)
            .map(|_| WaitDist::Uniform(10.0, 20.0).sample(&mut rng))
            .collect();
        assert!(u.iter().all(|v| (10.0..20.0).contains(v)));
    }
}
