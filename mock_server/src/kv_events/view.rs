//! What the published KV events announce: per worker, the blocks a consumer that applied every
//! batch as it was sent would believe cached, for the routing judge to compare with the truth.
//!
//! A batch counts as announced when it leaves the publisher: at once, or after its `delay`,
//! duplicates and reordered batches in the order they were sent, a dropped one never (until
//! the replay endpoint serves it). The view applies each announced batch's stores, removals
//! and clears to a per-worker set of block hashes (the engine's sequence hashes, the
//! `block_hashes` of the wire). A batch that was never sent live is remembered by its sequence
//! number (for as long as the replay buffer could serve it); when the replay endpoint serves
//! it to any client, it is applied then, so a subscriber that recovers its gaps brings the
//! view back to the truth. Each worker's set is as large as what its events announced; a
//! removal that overtakes its store (a `reorder` fault) leaves the block in the set until a
//! later removal or clear, as it would in any consumer.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use servesim::tokens::SequenceHash;

use super::wire::{WireBatch, WireEvent};
use super::REPLAY_BUFFER;

/// The changes one batch announces, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ViewDelta {
    /// The batch's events, reduced to what they do to the set of cached blocks.
    changes: Vec<Change>,
}

/// One event's change to the set of cached blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    /// Blocks now cached.
    Stored(Vec<u64>),
    /// Blocks evicted.
    Removed(Vec<u64>),
    /// Every block dropped.
    Cleared,
}

impl ViewDelta {
    /// The changes `batch` announces.
    pub(crate) fn of(batch: &WireBatch) -> ViewDelta {
        let changes = batch
            .events
            .iter()
            .map(|event| match event {
                WireEvent::BlockStored { block_hashes, .. } => Change::Stored(block_hashes.clone()),
                WireEvent::BlockRemoved { block_hashes, .. } => {
                    Change::Removed(block_hashes.clone())
                }
                WireEvent::AllBlocksCleared => Change::Cleared,
            })
            .collect();
        ViewDelta { changes }
    }

    /// Bytes it holds, about (for the replay buffer's byte cap).
    pub(crate) fn heap_bytes(&self) -> usize {
        let hashes: usize = self
            .changes
            .iter()
            .map(|c| match c {
                Change::Stored(h) | Change::Removed(h) => h.len(),
                Change::Cleared => 0,
            })
            .sum();
        hashes * 8 + self.changes.len() * std::mem::size_of::<Change>()
    }
}

/// One worker's announced state.
#[derive(Debug, Default)]
struct WorkerView {
    /// Blocks the announced batches leave cached.
    blocks: HashSet<u64>,
    /// Sequence numbers of batches published but never sent live, each applied when the
    /// replay endpoint serves it; none older than the replay buffer reaches.
    missed: BTreeSet<u64>,
}

impl WorkerView {
    fn apply(&mut self, delta: &ViewDelta) {
        for change in &delta.changes {
            match change {
                Change::Stored(hashes) => self.blocks.extend(hashes.iter().copied()),
                Change::Removed(hashes) => {
                    for h in hashes {
                        self.blocks.remove(h);
                    }
                }
                Change::Cleared => self.blocks.clear(),
            }
        }
    }
}

/// Every worker's announced state (see the module docs), shared by the publisher (which
/// applies batches as it sends them) and the routing judge (which reads it on every arrival).
#[derive(Debug)]
pub(crate) struct PublishedView {
    /// By worker. Each a `std` mutex held to apply one batch or to walk one prefix, never
    /// across an await.
    workers: Vec<Mutex<WorkerView>>,
}

impl PublishedView {
    /// An empty view of `workers` workers (nothing announced yet).
    pub(crate) fn new(workers: usize) -> PublishedView {
        PublishedView {
            workers: (0..workers)
                .map(|_| Mutex::new(WorkerView::default()))
                .collect(),
        }
    }

    fn worker(&self, rank: usize) -> Option<MutexGuard<'_, WorkerView>> {
        self.workers
            .get(rank)
            .map(|w| w.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Applies a batch of `rank` that was just sent.
    pub(crate) fn sent(&self, rank: usize, delta: &ViewDelta) {
        if let Some(mut w) = self.worker(rank) {
            w.apply(delta);
        }
    }

    /// Remembers that batch `seq` of `rank` was published but not sent.
    pub(crate) fn missed(&self, rank: usize, seq: u64) {
        if let Some(mut w) = self.worker(rank) {
            w.missed.insert(seq);
            let oldest = seq.saturating_sub(REPLAY_BUFFER as u64);
            while w.missed.first().is_some_and(|&s| s < oldest) {
                w.missed.pop_first();
            }
        }
    }

    /// Applies batch `seq` of `rank`, served by the replay endpoint, if it was never sent.
    pub(crate) fn replayed(&self, rank: usize, seq: u64, delta: &ViewDelta) {
        if let Some(mut w) = self.worker(rank) {
            if w.missed.remove(&seq) {
                w.apply(delta);
            }
        }
    }

    /// The publisher of `rank` started over: the batches it had not sent can no longer be
    /// replayed.
    pub(crate) fn restarted(&self, rank: usize) {
        if let Some(mut w) = self.worker(rank) {
            w.missed.clear();
        }
    }

    /// The leading blocks of `hashes` the announced batches leave cached on `rank`.
    pub(crate) fn prefix_blocks(&self, rank: usize, hashes: &[SequenceHash]) -> usize {
        self.worker(rank).map_or(0, |w| {
            hashes
                .iter()
                .take_while(|h| w.blocks.contains(&h.0))
                .count()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(events: Vec<WireEvent>) -> ViewDelta {
        ViewDelta::of(&WireBatch {
            ts: 0.0,
            events,
            data_parallel_rank: Some(0),
        })
    }

    fn stored(hashes: &[u64]) -> WireEvent {
        WireEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: Vec::new(),
            block_size: 4,
            lora_id: None,
            medium: Some("GPU"),
            lora_name: None,
        }
    }

    fn removed(hashes: &[u64]) -> WireEvent {
        WireEvent::BlockRemoved {
            block_hashes: hashes.to_vec(),
            medium: Some("GPU"),
        }
    }

    fn prefix(view: &PublishedView, rank: usize, hashes: &[u64]) -> usize {
        let hashes: Vec<SequenceHash> = hashes.iter().map(|&h| SequenceHash(h)).collect();
        view.prefix_blocks(rank, &hashes)
    }

    #[test]
    fn sent_batches_store_remove_and_clear_in_order() {
        let view = PublishedView::new(2);
        view.sent(0, &batch(vec![stored(&[1, 2, 3]), removed(&[2])]));
        assert_eq!(prefix(&view, 0, &[1, 2, 3]), 1);
        assert_eq!(prefix(&view, 0, &[1, 3]), 2);
        assert_eq!(prefix(&view, 1, &[1]), 0, "another worker's blocks");
        assert_eq!(prefix(&view, 7, &[1]), 0, "no such worker");
        view.sent(0, &batch(vec![stored(&[2])]));
        assert_eq!(prefix(&view, 0, &[1, 2, 3]), 3);
        view.sent(0, &batch(vec![WireEvent::AllBlocksCleared, stored(&[9])]));
        assert_eq!(prefix(&view, 0, &[1, 2, 3]), 0);
        assert_eq!(prefix(&view, 0, &[9]), 1);
    }

    #[test]
    fn a_missed_batch_counts_once_the_replay_endpoint_serves_it() {
        let view = PublishedView::new(1);
        let first = batch(vec![stored(&[1, 2])]);
        view.missed(0, 0);
        assert_eq!(prefix(&view, 0, &[1, 2]), 0);
        view.sent(0, &batch(vec![stored(&[3])]));
        view.replayed(0, 1, &batch(vec![stored(&[3])]));
        view.replayed(0, 0, &first);
        assert_eq!(prefix(&view, 0, &[1, 2, 3]), 3);
        // Served again (another client's replay): applied once only.
        view.sent(0, &batch(vec![removed(&[2])]));
        view.replayed(0, 0, &first);
        assert_eq!(prefix(&view, 0, &[1, 2, 3]), 1);
        // Missed before a restart: the new publisher cannot serve it.
        view.missed(0, 5);
        view.restarted(0);
        view.replayed(0, 5, &batch(vec![stored(&[2])]));
        assert_eq!(prefix(&view, 0, &[1, 2]), 1);
    }

    #[test]
    fn missed_batches_beyond_the_replay_buffer_are_forgotten() {
        let view = PublishedView::new(1);
        view.missed(0, 0);
        view.missed(0, REPLAY_BUFFER as u64 + 1);
        view.replayed(0, 0, &batch(vec![stored(&[1])]));
        assert_eq!(prefix(&view, 0, &[1]), 0);
        let w = view.worker(0).expect("worker 0");
        assert_eq!(w.missed.len(), 1);
    }
}
