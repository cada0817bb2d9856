//! servesim: a simulated LLM inference engine, pure and deterministic.
//!
//! The engine never reads a clock: every call takes `now` as a [`time::SimTime`] (integer
//! microseconds) and the engine says when it next needs to be woken. The principal types:
//!
//! - [`cluster::Cluster`]: workers behind a router, the one object every driver owns
//!   (`submit`, `cancel`, `next_event_time`, `advance`, `snapshot`).
//! - [`scheduler::Scheduler`]: continuous batching, one pass at a time, vLLM / SGLang / TRT-LLM
//!   style, over a [`kv::KvPool`] (paged KV cache with prefix caching and KV events).
//! - [`perf::LatencyModel`]: how long a pass takes (Dynamo's polynomial, fixed times, or a
//!   profile measured on a real engine).
//! - [`router::RouterConfig`]: round-robin, random or KV-aware routing (over an
//!   [`indexer::KvIndexer`]) in front of the workers.
//! - [`replay::replay`]: the discrete-event driver over a [`trace::Trace`], reporting a
//!   [`metrics::ReplayReport`] with Dynamo's keys. Given a second core, it runs the KV
//!   router's bookkeeping or else its metrics on a second thread, which changes its speed, not
//!   its results.
//! - [`metrics::Collector`]: request-lifecycle hooks in, the report out; its
//!   [`metrics::Distribution`] is the one percentile type of the workspace (Dynamo's rank rules),
//!   and a quantile sketch streams per-token figures.
//! - [`tokenizer`]: the built-in tokenizer and chat templates used by the server and loadgen.
//!
//! Driving a cluster by hand:
//!
//! ```
//! use servesim::cluster::{Cluster, ClusterConfig, Output};
//! use servesim::request::{EngineRequest, Prompt};
//! use servesim::time::SimTime;
//!
//! let mut cluster = Cluster::new(ClusterConfig::default()).expect("valid defaults");
//! let prompt: Vec<u32> = (0..1000).collect();
//! let request = EngineRequest {
//!     prompt: Prompt::from_tokens(&prompt, cluster.block_size()),
//!     max_output_tokens: 3,
//!     output_tokens: Vec::new(),
//! };
//! let id = cluster.submit(request, SimTime::ZERO).expect("the request fits");
//! let mut token_times = Vec::new();
//! let mut now = SimTime::ZERO;
//! loop {
//!     for out in cluster.advance(now) {
//!         if let Output::Token { id: of, time, .. } = out {
//!             assert_eq!(of, id);
//!             token_times.push(time.as_nanos());
//!         }
//!     }
//!     match cluster.next_event_time() {
//!         Some(t) => now = t,
//!         None => break,
//!     }
//! }
//! // The first token ends the 1000-token prefill (32.1059 ms), then one decode step each
//! // (5.7915 ms); the clock has whole nanoseconds.
//! assert_eq!(token_times, vec![32_105_859, 37_897_395, 43_688_982]);
//! ```
pub mod autoscale;
pub mod cluster;
pub mod duration;
pub mod ids;
pub mod indexer;
pub mod kv;
pub mod metrics;
pub mod perf;
pub mod replay;
pub mod request;
pub mod router;
pub mod scheduler;
mod side_thread;
pub mod slo;
pub mod time;
pub mod tokenizer;
pub mod tokens;
pub mod trace;
pub mod worker;
