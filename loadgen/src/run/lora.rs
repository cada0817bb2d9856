//! `--lora-mix name:weight,...`: a seeded mix of LoRA adapters sent as each request's `model`.
//!
//! [`LoraMix`] is the validated flag (names unique and not empty, weights finite and above 0, at
//! most `MAX_LORA_ADAPTERS` entries of at most `MAX_LORA_NAME_BYTES` bytes each). Against the
//! embedded mockserve every named adapter is loaded at start (its `--lora-modules`); with `--url`
//! the server must serve them already (vLLM: `--lora-modules`, or `/v1/load_lora_adapter`).
//! `base`, or the target's own model name, is the base model: no adapter.
//!
//! The choice is a pure function of `(--seed, key)` ([`LoraMix::pick`]), never of send order or
//! timing: the same seed gives the same adapter per request in every run. The key is the unit
//! that keeps one adapter: `bench` each request (its index), `replay` each session (an agentic
//! trace: each play) and `multiturn` each conversation (its global index), so a conversation
//! keeps its adapter and the prefix cache it built (a server's prefix cache is per adapter).

use std::sync::Arc;

use crate::error::LoadgenError;

/// Entries of `--lora-mix` at most.
pub(crate) const MAX_LORA_ADAPTERS: usize = 64;

/// Bytes of one adapter name at most (a name longer is refused, and shown cut).
pub(crate) const MAX_LORA_NAME_BYTES: usize = 128;

/// The entry name that means "the base model, no adapter".
pub(crate) const BASE: &str = "base";

/// `--lora-mix`, validated: each entry's name and weight, in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraMix {
    /// `(name, weight)`; weights are relative (they need not sum to 1).
    entries: Vec<(String, f64)>,
}

/// A value cut for an error message: at most 40 characters, never the whole of a huge input.
fn cut(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect();
    if out.len() < s.len() {
        out.push_str("...");
    }
    out
}

fn bad(message: String) -> LoadgenError {
    LoadgenError::Config(format!("--lora-mix: {message}"))
}

impl std::str::FromStr for LoraMix {
    type Err = LoadgenError;

    /// Parses `name:weight,...`.
    fn from_str(s: &str) -> Result<LoraMix, LoadgenError> {
        let mut entries: Vec<(String, f64)> = Vec::new();
        for (i, part) in s.split(',').enumerate() {
            if i >= MAX_LORA_ADAPTERS {
                return Err(bad(format!(
                    "more than {MAX_LORA_ADAPTERS} adapters (MAX_LORA_ADAPTERS)"
                )));
            }
            let (name, weight) = part
                .rsplit_once(':')
                .ok_or_else(|| bad(format!("'{}' is not name:weight", cut(part))))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(bad(format!("'{}' has an empty adapter name", cut(part))));
            }
            if name.len() > MAX_LORA_NAME_BYTES {
                return Err(bad(format!(
                    "adapter name '{}' is longer than {MAX_LORA_NAME_BYTES} bytes",
                    cut(name)
                )));
            }
            let weight: f64 = weight
                .trim()
                .parse()
                .map_err(|_| bad(format!("weight '{}' is not a number", cut(weight))))?;
            if !(weight.is_finite() && weight > 0.0) {
                return Err(bad(format!(
                    "weight of '{}' must be finite and above 0, got {}",
                    cut(name),
                    crate::limits::show(weight)
                )));
            }
            if entries.iter().any(|(n, _)| n == name) {
                return Err(bad(format!("adapter '{}' is named twice", cut(name))));
            }
            entries.push((name.to_string(), weight));
        }
        Ok(LoraMix { entries })
    }
}

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `x`.
fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl LoraMix {
    /// The entries' names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// The adapters to load on a server whose model is `model`: every name but `base` and
    /// `model`.
    pub(crate) fn adapters<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a str> {
        self.names().filter(move |n| *n != BASE && *n != model)
    }

    /// The entry that request (or session) `key` gets under `seed`: a hash of both mapped to
    /// `[0, 1)`, then the first entry whose cumulative weight share is above it.
    pub fn pick(&self, seed: u64, key: u64) -> usize {
        let total: f64 = self.entries.iter().map(|(_, w)| w).sum();
        let u = (mix64(mix64(seed ^ 0x4C6F_5241) ^ key) >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (i, (_, w)) in self.entries.iter().enumerate() {
            acc += w / total;
            if u < acc {
                return i;
            }
        }
        self.entries.len() - 1
    }

    /// Each entry's share of the total weight.
    pub fn shares(&self) -> Vec<(&str, f64)> {
        let total: f64 = self.entries.iter().map(|(_, w)| w).sum();
        self.entries
            .iter()
            .map(|(n, w)| (n.as_str(), w / total))
            .collect()
    }
}

/// The mix against a connected target: the `model` each entry sends and the seed of the
/// choice. Modes read it from [`crate::run::target::Connected::lora`].
#[derive(Debug)]
pub struct LoraTraffic {
    mix: LoraMix,
    seed: u64,
    /// By entry: the `model` field sent (the target's model for `base`).
    models: Vec<Arc<str>>,
    /// By entry: the name reported (the entry's own).
    labels: Vec<Arc<str>>,
}

impl LoraTraffic {
    /// `mix` on a target serving `model`, picks seeded with `seed`.
    pub(crate) fn new(mix: &LoraMix, seed: u64, model: &str) -> LoraTraffic {
        LoraTraffic {
            mix: mix.clone(),
            seed,
            models: mix
                .names()
                .map(|n| Arc::from(if n == BASE { model } else { n }))
                .collect(),
            labels: mix.names().map(Arc::from).collect(),
        }
    }

    /// The `model` field of request (or session) `key`.
    pub fn model(&self, key: usize) -> &Arc<str> {
        &self.models[self.mix.pick(self.seed, key as u64)]
    }

    /// The adapter name reported for `key` (the `--lora-mix` entry).
    pub fn label(&self, key: usize) -> Arc<str> {
        self.labels[self.mix.pick(self.seed, key as u64)].clone()
    }
}

/// `--lora-mix` for a report's `config`: each entry's share of the weight.
pub(crate) fn describe(mix: &LoraMix) -> serde_json::Value {
    serde_json::Value::Object(
        mix.shares()
            .into_iter()
            .map(|(n, s)| (n.to_string(), serde_json::json!(s)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix(s: &str) -> Result<LoraMix, LoadgenError> {
        s.parse()
    }

    #[test]
    fn parses_and_refuses_naming_the_flag() {
        let m = mix("base:0.5, sql-lora:0.3,chat-lora:0.2").expect("valid");
        assert_eq!(
            m.names().collect::<Vec<_>>(),
            ["base", "sql-lora", "chat-lora"]
        );
        assert_eq!(
            m.adapters("mock-model").collect::<Vec<_>>(),
            ["sql-lora", "chat-lora"]
        );
        // The model's own name is the base model too.
        let m = mix("mock-model:1,a:1").expect("valid");
        assert_eq!(m.adapters("mock-model").collect::<Vec<_>>(), ["a"]);
        for (bad, says) in [
            ("", "not name:weight"),
            ("a", "not name:weight"),
            (":1", "empty adapter name"),
            ("a:0", "above 0"),
            ("a:-1", "above 0"),
            ("a:nan", "finite"),
            ("a:inf", "finite"),
            ("a:1e400", "finite"),
            ("a:x", "not a number"),
            ("a:1,a:2", "named twice"),
        ] {
            let e = mix(bad).expect_err(bad).to_string();
            assert!(e.contains("--lora-mix") && e.contains(says), "{bad}: {e}");
        }
        let long = format!("{}:1", "n".repeat(10_000));
        let e = mix(&long).expect_err("too long").to_string();
        assert!(e.contains("longer than 128 bytes") && e.len() < 200, "{e}");
        let many: Vec<String> = (0..65).map(|i| format!("a{i}:1")).collect();
        let e = mix(&many.join(",")).expect_err("too many").to_string();
        assert!(e.contains("more than 64"), "{e}");
    }

    /// Same seed, same picks; over 20,000 keys each share is within 1.5 points of its weight.
    #[test]
    fn picks_are_seeded_and_follow_the_weights() {
        let m = mix("base:0.5,sql-lora:0.3,chat-lora:0.2").expect("valid");
        let counts = |seed| {
            let mut c = [0usize; 3];
            for k in 0..20_000 {
                c[m.pick(seed, k)] += 1;
            }
            c
        };
        let a = counts(42);
        assert_eq!(a, counts(42));
        assert_ne!(a, counts(43));
        for (n, (_, share)) in a.iter().zip(m.shares()) {
            let got = *n as f64 / 20_000.0;
            assert!((got - share).abs() < 0.015, "{a:?}");
        }
        let t = LoraTraffic::new(&m, 42, "mock-model");
        let models: Vec<&str> = (0..200).map(|k| &**t.model(k)).collect();
        assert!(models.contains(&"mock-model") && models.contains(&"sql-lora"));
        assert!(!models.contains(&"base"));
        assert_eq!(
            &*t.label(0),
            ["base", "sql-lora", "chat-lora"][m.pick(42, 0)]
        );
    }
}
