//! servesim: a simulated LLM inference engine.
pub mod ids;
pub mod kv;
pub mod metrics;
pub mod time;
pub mod tokens;
pub mod trace;
