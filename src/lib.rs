//! servesim: a simulated LLM inference engine.
pub mod cluster;
pub mod ids;
pub mod indexer;
pub mod indexer_bench;
pub mod kv;
pub mod metrics;
pub mod perf;
pub mod replay;
pub mod request;
pub mod router;
pub mod scheduler;
pub mod time;
pub mod tokenizer;
pub mod tokens;
pub mod trace;
pub mod worker;
