//! KV cache: the paged block pool with prefix caching, and the events it emits.
pub mod event;
pub use event::{KvEvent, KvEventData, StoredBlock};
pub mod pool;
pub use pool::{BlockRef, CapacityExhausted, KvPool, PrefixMatch, SequenceBlocks};
