//! servesim: a simulated LLM inference engine.
pub mod ids;
pub mod kv;
pub mod time;
pub mod tokenizer;
pub mod tokens;
