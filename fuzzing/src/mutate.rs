//! The [`Mutator`]: turns one input into a nearby one, at random but only from the generator it
//! is given, so a seed replays the same sequence.
//!
//! Byte-level mutations (bit flips, inserts, deletes, repeats, splices with another input,
//! dictionary tokens, deep nesting) find framing and encoding bugs; JSON-level mutations (on the
//! whole input, or on one line of a JSON-lines input) replace, remove, add, copy or wrap values,
//! and reach the semantic corners a byte flip rarely does: empty strings and arrays, huge and
//! negative numbers, NaN-like strings, long strings, deep nesting, fields in the wrong place.

use rand::{Rng, SeedableRng};
use serde_json::{Map, Number, Value};

use crate::targets::Target;

/// Mutates inputs of one target.
#[derive(Clone, Copy, Debug)]
pub struct Mutator {
    /// Tokens inserted or written over the input.
    dictionary: &'static [&'static [u8]],
    /// Object keys added to JSON values.
    fields: &'static [&'static str],
    /// Outputs are cut to this length.
    max_len: usize,
}

/// Bytes worth writing over a single byte.
const INTERESTING_BYTES: &[u8] = b"\0\x01\x7f\x80\xff\"\\\n\r\t {}[]:,-.0e9";

/// Strings worth putting where text goes.
const STRINGS: &[&str] = &[
    "",
    " ",
    "\n",
    "\0",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "mock-model",
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "worker_id",
    "timing",
    "text",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "data: [DONE]",
    "é",
    "\u{feff}",
    "\u{10ffff}",
    "𝄞",
];

impl Mutator {
    /// A mutator with the target's dictionary, fields and length limit.
    pub fn new(target: &Target) -> Mutator {
        Mutator {
            dictionary: target.dictionary,
            fields: target.fields,
            max_len: target.max_len.max(1),
        }
    }

    /// A mutant of `base`: one to four stacked mutations; `other` is a splice partner.
    ///
    /// Most mutants of a JSON input get JSON-level mutations only, so they still parse and reach
    /// the code behind the parser; the others get byte-level ones.
    pub fn mutate(&self, rng: &mut impl Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
        let mut out = base.to_vec();
        let structured = rng.gen_bool(0.6);
        for _ in 0..rng.gen_range(1..=4) {
            if structured && self.mutate_json(rng, &mut out) {
                continue;
            }
            self.mutate_bytes(rng, &mut out, other);
        }
        out.truncate(self.max_len);
        out
    }

    fn mutate_bytes(&self, rng: &mut impl Rng, out: &mut Vec<u8>, other: &[u8]) {
        let len = out.len();
        match rng.gen_range(0..11) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                out[i] = pick(rng, INTERESTING_BYTES).unwrap_or(0);
            }
            2 => {
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                out.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let start = rng.gen_range(0..len);
                let end = rng.gen_range(start..=len.min(start + 64));
                out.drain(start..end);
            }
            4 if len > 0 => {
                // Repeat a range: long strings, long arrays, many lines.
                let start = rng.gen_range(0..len);
                let end = rng.gen_range(start + 1..=len.min(start + 256));
                let piece = out[start..end].to_vec();
                let times = rng.gen_range(1..=64);
                let repeated: Vec<u8> = piece
                    .iter()
                    .copied()
                    .cycle()
                    .take(piece.len() * times)
                    .collect();
                out.splice(end..end, repeated);
            }
            5 => {
                let token = pick(rng, self.dictionary).unwrap_or(b"");
                let at = rng.gen_range(0..=len);
                out.splice(at..at, token.iter().copied());
            }
            6 if len > 0 => {
                let token = pick(rng, self.dictionary).unwrap_or(b"");
                let at = rng.gen_range(0..len);
                let end = (at + token.len()).min(len);
                out.splice(at..end, token.iter().copied());
            }
            7 if !other.is_empty() => {
                // Splice: our head, the other input's tail.
                let cut = rng.gen_range(0..=len);
                let from = rng.gen_range(0..other.len());
                out.truncate(cut);
                out.extend_from_slice(&other[from..]);
            }
            8 => {
                let depth = rng.gen_range(1..=1000);
                let open: &[u8] = if rng.gen_bool(0.5) { b"[" } else { b"{\"a\":" };
                let at = rng.gen_range(0..=len);
                let nesting: Vec<u8> = open
                    .iter()
                    .copied()
                    .cycle()
                    .take(open.len() * depth)
                    .collect();
                out.splice(at..at, nesting);
            }
            9 if len > 0 => {
                out.truncate(rng.gen_range(0..len));
            }
            _ => {
                let at = rng.gen_range(0..=len);
                out.splice(at..at, pick(rng, STRINGS).unwrap_or("").bytes());
            }
        }
    }

    /// Mutates the input as JSON (the whole, or one line of JSON lines); false when no part of
    /// it is JSON.
    fn mutate_json(&self, rng: &mut impl Rng, out: &mut Vec<u8>) -> bool {
        if out.len() > self.max_len {
            return false;
        }
        if let Ok(mut value) = serde_json::from_slice::<Value>(out) {
            self.mutate_value(rng, &mut value);
            *out = serde_json::to_vec(&value).unwrap_or_default();
            return true;
        }
        let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').collect();
        let mut json_lines: Vec<(usize, Value)> = lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| serde_json::from_slice::<Value>(l).ok().map(|v| (i, v)))
            .collect();
        if json_lines.is_empty() {
            return false;
        }
        let (index, mut value) = json_lines.swap_remove(rng.gen_range(0..json_lines.len()));
        self.mutate_value(rng, &mut value);
        let line = serde_json::to_vec(&value).unwrap_or_default();
        let mut mutated = Vec::with_capacity(out.len() + line.len());
        for (i, l) in lines.iter().enumerate() {
            if i > 0 {
                mutated.push(b'\n');
            }
            mutated.extend_from_slice(if i == index { &line } else { l });
        }
        *out = mutated;
        true
    }

    fn mutate_value(&self, rng: &mut impl Rng, root: &mut Value) {
        let n = rng.gen_range(0..count(root));
        let copy = nth(root, rng.gen_range(0..count(root))).cloned();
        let Some(node) = nth_mut(root, n) else {
            return;
        };
        match rng.gen_range(0..7) {
            0 => *node = self.special(rng),
            1 => match node {
                Value::Object(map) if !map.is_empty() => {
                    let key = map.keys().nth(rng.gen_range(0..map.len())).cloned();
                    if let Some(key) = key {
                        map.remove(&key);
                    }
                }
                Value::Array(items) if !items.is_empty() => {
                    items.remove(rng.gen_range(0..items.len()));
                }
                _ => *node = self.special(rng),
            },
            2 => match node {
                Value::Object(map) => {
                    let key = pick(rng, self.fields).unwrap_or("x").to_string();
                    let value = self.special(rng);
                    map.insert(key, value);
                }
                Value::Array(items) => {
                    let value = self.special(rng);
                    let at = rng.gen_range(0..=items.len());
                    items.insert(at, value);
                }
                _ => *node = self.special(rng),
            },
            3 => {
                if let Some(copy) = copy {
                    *node = copy;
                }
            }
            4 => {
                // Repeat an array's items or a string, staying within the length limit.
                let size = serde_json::to_vec(node).map_or(1, |v| v.len()).max(1);
                let times = rng.gen_range(2..=200).min(self.max_len / size).max(1);
                match node {
                    Value::Array(items) if !items.is_empty() => {
                        let grown: Vec<Value> = items
                            .iter()
                            .cycle()
                            .take(items.len() * times)
                            .cloned()
                            .collect();
                        *items = grown;
                    }
                    Value::String(s) => *s = s.repeat(times),
                    _ => *node = self.special(rng),
                }
            }
            5 => {
                let inner = std::mem::take(node);
                *node = if rng.gen_bool(0.5) {
                    Value::Array(vec![inner])
                } else {
                    let key = pick(rng, self.fields).unwrap_or("x").to_string();
                    Value::Object(Map::from_iter([(key, inner)]))
                };
            }
            _ => match node {
                Value::Number(n) => *node = nudge(rng, n),
                _ => *node = self.special(rng),
            },
        }
    }

    /// An awkward value: empty, huge, negative, NaN-like, long, deep or misplaced.
    fn special(&self, rng: &mut impl Rng) -> Value {
        match rng.gen_range(0..16) {
            0 => Value::String(String::new()),
            1 => Value::Array(Vec::new()),
            2 => Value::Array(vec![rng_pick_empty(rng)]),
            3 => Value::Object(Map::new()),
            4 => Value::Null,
            5 => Value::Bool(rng.gen()),
            6 => Value::from(
                pick(
                    rng,
                    &[0i64, 1, -1, 2, 1023, 1024, 1025, 65536, i64::MAX, i64::MIN],
                )
                .unwrap_or(0),
            ),
            7 => Value::from(pick(rng, &[u64::MAX, 1 << 32, u64::from(u32::MAX)]).unwrap_or(0)),
            8 => Number::from_f64(
                pick(rng, &[1e308, -1e308, 0.5, -0.0, 1e-300, 2.5, 3.0]).unwrap_or(0.0),
            )
            .map_or(Value::Null, Value::Number),
            9 => Value::String(pick(rng, STRINGS).unwrap_or("").to_string()),
            10 => {
                let piece = pick(rng, STRINGS).unwrap_or("a");
                let piece = if piece.is_empty() { "a " } else { piece };
                Value::String(piece.repeat(rng.gen_range(1..=4000)))
            }
            11 => {
                let n = rng.gen_range(0..=1500);
                let ids: Vec<Value> = (0..n)
                    .map(|_| Value::from(rng.gen_range(0..200_000u32)))
                    .collect();
                Value::Array(ids)
            }
            12 => {
                let mut v = Value::Null;
                for _ in 0..rng.gen_range(1..=140) {
                    v = Value::Array(vec![v]);
                }
                v
            }
            13 => {
                let role =
                    pick(rng, &["user", "assistant", "system", "tool", "robot"]).unwrap_or("user");
                serde_json::json!({"role": role, "content": self.special_text(rng)})
            }
            14 => Value::String(pick(rng, self.fields).unwrap_or("").to_string()),
            _ => Value::String(self.special_text(rng)),
        }
    }

    /// A short random text, sometimes a field name.
    fn special_text(&self, rng: &mut impl Rng) -> String {
        let n = rng.gen_range(0..=24);
        (0..n)
            .map(|_| match rng.gen_range(0..4) {
                0 => char::from(rng.gen_range(b' '..=b'~')),
                1 => pick(rng, &['é', '\u{0}', '\n', '𝄞', '\u{feff}', '<', '|']).unwrap_or('a'),
                _ => char::from(rng.gen_range(b'a'..=b'z')),
            })
            .collect()
    }
}

/// One mutation step for libFuzzer's custom-mutator hook: mutates `data[..size]` with the
/// target's [`Mutator`] seeded by `seed`, writes at most `max_size` bytes back and returns the
/// new length. Structure-aware steps reach inputs (an empty string in a valid body, say) that
/// byte-level mutation rarely does.
pub fn mutate_in_place(
    target: &Target,
    data: &mut [u8],
    size: usize,
    max_size: usize,
    seed: u64,
) -> usize {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let input = &data[..size.min(data.len())];
    let mutant = Mutator::new(target).mutate(&mut rng, input, input);
    let len = mutant.len().min(max_size).min(data.len());
    data[..len].copy_from_slice(&mutant[..len]);
    len
}

/// An empty-ish element for a one-element array: `""`, `[]`, `{}` or `null`.
fn rng_pick_empty(rng: &mut impl Rng) -> Value {
    match rng.gen_range(0..4) {
        0 => Value::String(String::new()),
        1 => Value::Array(Vec::new()),
        2 => Value::Object(Map::new()),
        _ => Value::Null,
    }
}

/// A number near `n`, or a boundary value.
fn nudge(rng: &mut impl Rng, n: &Number) -> Value {
    let x = n.as_i64().unwrap_or(0);
    match rng.gen_range(0..5) {
        0 => Value::from(x.wrapping_add(1)),
        1 => Value::from(x.wrapping_sub(1)),
        2 => Value::from(x.wrapping_neg()),
        3 => Value::from(x.wrapping_mul(1 << rng.gen_range(1..=40))),
        _ => Number::from_f64(n.as_f64().unwrap_or(0.0) + 0.5).map_or(Value::Null, Value::Number),
    }
}

fn pick<T: Copy>(rng: &mut impl Rng, items: &[T]) -> Option<T> {
    (!items.is_empty()).then(|| items[rng.gen_range(0..items.len())])
}

/// Nodes in the tree (the root counts).
fn count(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count).sum(),
        Value::Object(map) => map.values().map(count).sum(),
        _ => 0,
    }
}

/// The `n`th node in pre-order.
fn nth(value: &Value, mut n: usize) -> Option<&Value> {
    fn go<'v>(value: &'v Value, n: &mut usize) -> Option<&'v Value> {
        if *n == 0 {
            return Some(value);
        }
        *n -= 1;
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => return None,
        };
        for child in children {
            if let Some(found) = go(child, n) {
                return Some(found);
            }
        }
        None
    }
    go(value, &mut n)
}

/// The `n`th node in pre-order, mutably.
fn nth_mut(value: &mut Value, mut n: usize) -> Option<&mut Value> {
    fn go<'v>(value: &'v mut Value, n: &mut usize) -> Option<&'v mut Value> {
        if *n == 0 {
            return Some(value);
        }
        *n -= 1;
        let children: Box<dyn Iterator<Item = &mut Value>> = match value {
            Value::Array(items) => Box::new(items.iter_mut()),
            Value::Object(map) => Box::new(map.values_mut()),
            _ => return None,
        };
        for child in children {
            if let Some(found) = go(child, n) {
                return Some(found);
            }
        }
        None
    }
    go(value, &mut n)
}

#[cfg(test)]
mod tests {
    use rand_chacha::ChaCha8Rng;

    use super::*;

    fn mutants(seed: u64, base: &[u8], n: usize) -> Vec<Vec<u8>> {
        let mutator = Mutator::new(&crate::TARGETS[1]);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| mutator.mutate(&mut rng, base, b"{\"x\": 1}"))
            .collect()
    }

    #[test]
    fn a_seed_replays_the_same_mutants() {
        let base = br#"{"model":"mock-model","prompt":"hello","max_tokens":3}"#;
        assert_eq!(mutants(7, base, 200), mutants(7, base, 200));
        assert_ne!(mutants(7, base, 200), mutants(8, base, 200));
    }

    #[test]
    fn json_mutations_reach_empty_prompts_and_stay_bounded() {
        let base = br#"{"model":"mock-model","prompt":"hello","max_tokens":3}"#;
        let all = mutants(1, base, 20_000);
        let empty = all.iter().any(|m| {
            serde_json::from_slice::<Value>(m)
                .is_ok_and(|v| v["prompt"] == "" && v["model"] == "mock-model")
        });
        assert!(empty, "no mutant with an empty prompt");
        assert!(all.iter().all(|m| m.len() <= crate::TARGETS[1].max_len));
    }

    #[test]
    fn chained_mutants_stay_within_the_length_limit() {
        // Each mutant is the next base: growth compounds unless every step is bounded.
        let mutator = Mutator::new(&crate::TARGETS[1]);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut input = br#"{"model":"mock-model","prompt":[1,2,3],"max_tokens":3}"#.to_vec();
        for _ in 0..2000 {
            let next = mutator.mutate(&mut rng, &input, b"[]");
            assert!(next.len() <= crate::TARGETS[1].max_len);
            input = next;
        }
    }

    #[test]
    fn in_place_mutation_respects_the_buffer() {
        let target = &crate::TARGETS[0];
        let mut data = vec![0u8; 64];
        let body = br#"{"model":"mock-model","messages":[]}"#;
        data[..body.len()].copy_from_slice(body);
        let mut changed = false;
        for seed in 0..200 {
            let mut buffer = data.clone();
            let len = mutate_in_place(target, &mut buffer, body.len(), 48, seed);
            assert!(len <= 48);
            changed |= buffer[..len] != body[..];
        }
        assert!(changed);
    }

    #[test]
    fn nodes_are_numbered_in_pre_order() {
        let mut v = serde_json::json!({"a": [1, {"b": 2}], "c": 3});
        assert_eq!(count(&v), 6);
        assert_eq!(nth(&v, 2), Some(&Value::from(1)));
        assert_eq!(nth(&v, 5), Some(&Value::from(3)));
        assert_eq!(nth(&v, 6), None);
        if let Some(node) = nth_mut(&mut v, 4) {
            *node = Value::Null;
        }
        assert_eq!(v, serde_json::json!({"a": [1, {"b": null}], "c": 3}));
    }
}
