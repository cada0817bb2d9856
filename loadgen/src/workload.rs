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

use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use servesim::tokenizer::{text_with_exact_tokens, Tokenizer, LOREM_WORDS};

use crate::config::WorkloadSpec;

/// How user text is sized.
#[derive(Clone)]
pub enum TokenCounter {
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

/// One turn of one user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnScript {
    /// Think time before sending this turn (zero for the first).
    pub delay: Duration,
    /// The user message.
    pub user_text: String,
    /// Its token count when known exactly.
    pub user_tokens: Option<usize>,
}

/// One user's conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserScript {
    /// 0-based user id.
    pub user_id: usize,
    /// The system message.
    pub system_prompt: String,
    /// The turns in order.
    pub turns: Vec<TurnScript>,
}

/// Every user's script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Users in id order.
    pub users: Vec<UserScript>,
}

/// Dynamo's system prompt for `user_id`.
pub fn system_prompt(user_id: usize) -> String {
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
    pub fn generate(spec: &WorkloadSpec, counter: &TokenCounter) -> Workload {
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
                        }
                    })
                    .collect();
                UserScript {
                    user_id,
                    system_prompt: system_prompt(user_id),
                    turns,
                }
            })
            .collect();
        Workload { users }
    }
}

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
}
