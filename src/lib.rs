//! servesim: a simulated LLM inference engine.
pub mod ids;
pub mod indexer;
pub mod kv;
pub mod time;
pub mod tokens;
