//! KV cache: the paged block pool with prefix caching, the dense block ids it names blocks by, the
//! events it emits, and the host (G2) tier.
pub mod block_ids;
pub mod event;
pub(crate) use block_ids::BlockId;
pub use event::{KvEvent, KvEventData, StoredBlock};
pub mod pool;
mod prefetch;
pub(crate) use prefetch::prefetch;
pub mod block_map;
pub(crate) use block_map::{BlockMap, WARM_CHUNK};
pub(crate) use pool::{BlockRef, SequenceBlocks};
pub use pool::{KvPool, PrefixMatch};
pub mod tier;
pub use tier::G2Config;
pub(crate) use tier::{G2Tier, SharedLink};
