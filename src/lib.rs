//! servesim: a simulated LLM inference engine.
pub mod ids;
pub mod kv;
pub mod perf;
pub mod time;
pub mod tokens;
