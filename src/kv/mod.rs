//! KV cache: the paged block pool with prefix caching, the dense block ids it names blocks by, the
//! events it emits, and the host (G2) tier.
pub mod block_ids;
pub mod event;
pub use block_ids::{BlockId, BlockIds};
pub use event::{KvEvent, KvEventData, StoredBlock};
pub mod pool;
mod prefetch;
pub(crate) use prefetch::prefetch;
pub mod block_map;
pub use block_map::{BlockMap, WARM_CHUNK};
pub use pool::{BlockRef, CapacityExhausted, KvPool, PrefixMatch, SequenceBlocks};
pub mod tier;
pub use tier::{G2Config, G2Tier, SharedLink};
