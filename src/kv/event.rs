//! KV events: what a worker's block pool tells the router's indexer about cached blocks.

use crate::ids::WorkerId;
use crate::tokens::{LocalBlockHash, SequenceHash};

/// A block that became visible in a worker's prefix cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredBlock {
    /// Chained hash: the block's identity including its prefix.
    pub seq_hash: SequenceHash,
    /// Hash of the block's own tokens: the edge label in a radix tree.
    pub local_hash: LocalBlockHash,
}

/// The change one event describes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KvEventData {
    /// Blocks now cached, in prefix order; `parent` is the block before the first (None = root).
    Stored {
        /// Sequence hash of the block preceding `blocks[0]`, or None when it starts the sequence.
        parent: Option<SequenceHash>,
        /// The stored blocks, each the child of the one before.
        blocks: Vec<StoredBlock>,
    },
    /// Blocks evicted from the cache.
    Removed {
        /// Sequence hashes of the evicted blocks.
        seq_hashes: Vec<SequenceHash>,
    },
    /// The worker dropped its whole cache.
    Cleared,
}

/// One KV event from one worker. `event_id` increases by one per event and per worker.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KvEvent {
    /// The worker whose cache changed.
    pub worker: WorkerId,
    /// Per-worker sequence number, from 0.
    pub event_id: u64,
    /// What changed.
    pub data: KvEventData,
}
