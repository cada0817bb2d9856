//! Small valid request bodies that can cost a server work out of proportion to what they ask
//! for, at full size, for checking against the [`crate::cost`] budget on a server with
//! mockserve's default limits ([`crate::http::Limits::Default`]).
//!
//! Each body is built by a generator (a repeat of a short literal), so none of them is stored;
//! versions scaled down to the fuzzed server's limits (64 KiB bodies, a 1,024-token context)
//! are seeds of the body targets, `fuzz/corpus/<target>/cost_*.json`, for libFuzzer to grow.
//! A server must refuse each with a 400 naming the parameter, or answer it within its budget;
//! `fuzzing/tests/fuzz/cost.rs` checks both sets, each input in a process of its own.

use std::path::Path;

use serde_json::{json, Value};

use crate::http::Endpoint;

/// One costly body and what made it costly.
#[derive(Clone, Copy, Debug)]
pub struct CostlyBody {
    /// A short name, for messages and for `servesim-fuzz-check --costly NAME`.
    pub name: &'static str,
    /// Where it is sent.
    pub endpoint: Endpoint,
    /// The work it can cause: what a server must refuse or bound.
    pub cost: &'static str,
    /// Builds the body.
    build: fn() -> Value,
}

impl CostlyBody {
    /// The body's bytes.
    pub fn body(&self) -> Vec<u8> {
        (self.build)().to_string().into_bytes()
    }
}

/// The costly bodies, each under mockserve's default 8 MiB body limit.
pub static COSTLY_BODIES: [CostlyBody; 8] = [
    CostlyBody {
        name: "long_stop",
        endpoint: Endpoint::Chat,
        cost: "a 1,000,000-character stop string scanned again for every one of 3,000 tokens",
        build: || {
            json!({"model": MODEL, "messages": hi(), "max_tokens": 3000, "ignore_eos": true,
                   "stop": ["q".repeat(1_000_000)]})
        },
    },
    CostlyBody {
        name: "many_stops",
        endpoint: Endpoint::Chat,
        cost: "100,000 stop strings, each searched for after every one of 3,000 tokens",
        build: || {
            let stops: Vec<String> = (0..100_000).map(|i| format!("zq{i}")).collect();
            json!({"model": MODEL, "messages": hi(), "max_tokens": 3000, "ignore_eos": true,
                   "stop": stops})
        },
    },
    CostlyBody {
        name: "many_stop_token_ids",
        endpoint: Endpoint::Chat,
        cost: "1,000,000 stop token ids, each compared with every one of 3,000 tokens",
        build: || {
            json!({"model": MODEL, "messages": hi(), "max_tokens": 3000, "ignore_eos": true,
                   "stop_token_ids": vec![199_999; 1_000_000]})
        },
    },
    CostlyBody {
        name: "recursive_schema",
        endpoint: Endpoint::Chat,
        cost: "a recursive json_schema answer (arrays of at least two of itself) built in full \
               before the 16-token limit cuts it",
        build: || {
            let schema = json!({"$defs": {"n": {"type": "array", "minItems": 2,
                                                "items": {"$ref": "#/$defs/n"}}},
                                "$ref": "#/$defs/n"});
            json!({"model": MODEL, "messages": hi(), "max_tokens": 16,
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "n", "schema": schema}}})
        },
    },
    CostlyBody {
        name: "tool_schema_min_items",
        endpoint: Endpoint::Chat,
        cost: "tool arguments with nested minItems (64 to the fifth power strings) built in \
               full before the 16-token limit cuts them",
        build: || {
            let mut schema = json!({"type": "string"});
            for _ in 0..5 {
                schema = json!({"type": "array", "minItems": 64, "items": schema});
            }
            let tool = json!({"type": "function", "function": {"name": "f", "parameters":
                {"type": "object", "properties": {"a": schema}, "required": ["a"]}}});
            json!({"model": MODEL, "messages": hi(), "max_tokens": 16, "tools": [tool],
                   "tool_choice": "required"})
        },
    },
    CostlyBody {
        name: "many_choices_with_logprobs",
        endpoint: Endpoint::Chat,
        cost: "16 choices of 2,000 tokens with 20 top log probabilities each, answered whole \
               (a 48 MB body)",
        build: || {
            json!({"model": MODEL, "messages": hi(), "max_tokens": 2000, "ignore_eos": true,
                   "n": 16, "logprobs": true, "top_logprobs": 20})
        },
    },
    CostlyBody {
        name: "prompt_batch",
        endpoint: Endpoint::Completions,
        cost: "a batch of 40,000 prompts handled in time quadratic in their number",
        build: || json!({"model": MODEL, "prompt": vec!["hi"; 40_000], "max_tokens": 1}),
    },
    CostlyBody {
        name: "one_letter_prompt",
        endpoint: Endpoint::Completions,
        cost: "a prompt of 7,000,000 times one letter, one word to the tokenizer",
        build: || json!({"model": MODEL, "prompt": "a".repeat(7_000_000), "max_tokens": 1}),
    },
];

/// The model both servers serve.
const MODEL: &str = crate::http::MODEL;

/// One short user message.
fn hi() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// Names of the costly seeds in `fuzz/corpus/<target>/` start with this.
pub const COSTLY_SEED_PREFIX: &str = "cost_";

/// Whether the file at `path` is a costly seed: the stable runner leaves those to the cost
/// test, which checks them one process at a time.
pub fn is_costly_seed(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with(COSTLY_SEED_PREFIX))
}

/// The costly body called `name`.
pub fn costly_body(name: &str) -> Option<&'static CostlyBody> {
    COSTLY_BODIES.iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_is_json_under_the_default_body_limit() {
        for costly in &COSTLY_BODIES {
            let body = costly.body();
            assert!(
                body.len() < mock_server::config::DEFAULT_MAX_BODY_BYTES,
                "{}: {} bytes",
                costly.name,
                body.len()
            );
            let value: Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(value["model"], MODEL, "{}", costly.name);
            assert_eq!(costly_body(costly.name).map(|b| b.cost), Some(costly.cost));
        }
        assert!(costly_body("cheap").is_none());
    }
}
