//! KV cache: the paged block pool with prefix caching, the dense block ids it names blocks by, the
//! events it emits, and the host (G2) tier.
pub mod event;
pub mod ids;
pub use event::{KvEvent, KvEventData, StoredBlock};
pub use ids::{BlockId, BlockIds};
pub mod pool;
mod prefetch;
pub(crate) use prefetch::prefetch;
pub mod table;
pub use pool::{BlockRef, CapacityExhausted, KvPool, PrefixMatch, SequenceBlocks};
pub use table::{BlockMap, WARM_CHUNK};
pub mod tier;
pub use tier::{G2Config, G2Tier, SharedLink};
