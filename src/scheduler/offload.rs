//! The host-memory KV tier (KVBM's G2) of a scheduler: GPU evictions are offloaded over the
//! G1→G2 link, and a waiting request whose prefix continues in G2 is parked while those blocks
//! are onboarded over the G2→G1 link, then admitted with them cached. Transfers share their
//! link's bandwidth and complete on the caller's clock.

use std::collections::BTreeMap;

use super::Scheduler;
use crate::ids::RequestId;
use crate::kv::{G2Config, G2Tier, SharedLink, StoredBlock};
use crate::time::SimTime;
use crate::tokens::SequenceHash;

/// The host tier of a scheduler, its two links and the transfers in flight.
#[derive(Debug)]
pub(super) struct Offload {
    /// Bytes of one block (`block_size * kv_bytes_per_token`).
    block_bytes: f64,
    /// Host blocks.
    tier: G2Tier,
    /// G1→G2 link.
    offload_link: SharedLink,
    /// G2→G1 link.
    onboard_link: SharedLink,
    /// Offload batches in flight by tag: the blocks each carries.
    offloading: BTreeMap<u64, Vec<SequenceHash>>,
    /// Onboards in flight by tag.
    onboarding: BTreeMap<u64, Onboard>,
    /// Next transfer tag.
    next_tag: u64,
    /// Blocks onboarded so far.
    pub(super) onboarded_blocks: u64,
}

/// An onboard in flight: the request waiting for it and the blocks it brings.
#[derive(Debug)]
struct Onboard {
    id: RequestId,
    /// Block before `blocks[0]` (None at the start of the sequence).
    parent: Option<SequenceHash>,
    /// Index of `blocks[0]` in the request's sequence.
    start: usize,
    blocks: Vec<StoredBlock>,
}

impl Offload {
    /// An empty tier and idle links for engine blocks of `block_size` tokens.
    pub(super) fn new(g2: &G2Config, block_size: usize) -> Offload {
        Offload {
            block_bytes: (block_size as u64 * g2.kv_bytes_per_token) as f64,
            tier: G2Tier::new(g2.num_blocks),
            offload_link: SharedLink::new(g2.bandwidth_g1_to_g2_gbps),
            onboard_link: SharedLink::new(g2.bandwidth_g2_to_g1_gbps),
            offloading: BTreeMap::new(),
            onboarding: BTreeMap::new(),
            next_tag: 0,
            onboarded_blocks: 0,
        }
    }

    /// Blocks resident in the tier.
    pub(super) fn resident_blocks(&self) -> usize {
        self.tier.num_resident()
    }

    /// Blocks offloaded so far (transfers completed).
    pub(super) fn offloaded_blocks(&self) -> u64 {
        self.tier.offloaded_blocks
    }

    /// Checks the tier, its links and the transfers in flight; `parked` are the requests
    /// waiting for an onboard. Panics on a violation.
    #[cfg(test)]
    pub(super) fn assert_invariants(&self, parked: &[RequestId]) {
        self.tier.assert_invariants();
        self.offload_link.assert_invariants();
        self.onboard_link.assert_invariants();
        let arriving: usize = self.offloading.values().map(Vec::len).sum();
        assert_eq!(
            arriving,
            self.tier.num_arriving(),
            "arriving G2 blocks are in flight"
        );
        assert_eq!(self.offloading.len(), self.offload_link.in_flight());
        assert_eq!(self.onboarding.len(), self.onboard_link.in_flight());
        for id in parked {
            assert!(
                self.onboarding.values().any(|o| o.id == *id),
                "a parked request has an onboard in flight"
            );
        }
    }
}

impl Scheduler {
    /// Moves the clock to `now`: completes the G2 transfers due by then (offloaded blocks become
    /// resident; onboarded blocks become inactive cached blocks and their request goes back to
    /// the front of the waiting queue). The worker calls it before every pass and at
    /// [`Scheduler::next_transfer_end`].
    pub(crate) fn advance_transfers(&mut self, now: SimTime) {
        self.now = self.now.max(now);
        let Some(off) = &mut self.offload else {
            return;
        };
        for tag in off.offload_link.advance(now) {
            for h in off.offloading.remove(&tag).unwrap_or_default() {
                off.tier.arrive(h);
            }
        }
        let done = off.onboard_link.advance(now);
        for tag in done {
            let Some(onboard) = self
                .offload
                .as_mut()
                .and_then(|off| off.onboarding.remove(&tag))
            else {
                continue;
            };
            // Keep the request's G1 prefix: the onboarded blocks must not evict it.
            if let Some(slot) = self.slot_of(onboard.id) {
                let s = self.seqs[slot].as_ref().expect("slot is live");
                let prefix = &s.hashes.sequence[..onboard.start.min(s.hashes.len())];
                self.pool.touch(prefix);
            }
            self.pool.insert_inactive(onboard.parent, &onboard.blocks);
            if let Some(off) = &mut self.offload {
                off.onboarded_blocks += onboard.blocks.len() as u64;
            }
            if let Some(slot) = self.slot_of(onboard.id) {
                self.awaiting.retain(|&s| s != slot);
                let end = onboard.start + onboard.blocks.len();
                self.seq_mut(slot).onboarded = Some((onboard.start, end));
                self.waiting.push_front(slot);
            }
        }
        self.offload_evicted();
    }

    /// When the next onboard completes (offloads need no wake-up: residency is brought up to
    /// date whenever the clock moves).
    pub(crate) fn next_transfer_end(&self) -> Option<SimTime> {
        self.offload
            .as_ref()
            .and_then(|off| off.onboard_link.next_completion())
    }

    /// Starts one offload transfer for the blocks the pool evicted since the last call.
    pub(super) fn offload_evicted(&mut self) {
        let Some(off) = &mut self.offload else {
            return;
        };
        let evicted = self.pool.take_evicted();
        let batch: Vec<SequenceHash> = evicted
            .into_iter()
            .filter(|&h| off.tier.reserve(h))
            .collect();
        if batch.is_empty() {
            return;
        }
        let tag = off.next_tag;
        off.next_tag += 1;
        off.offload_link
            .start(self.now, tag, batch.len() as f64 * off.block_bytes);
        off.offloading.insert(tag, batch);
    }

    /// vLLM with G2: when the blocks after the G1 prefix match continue in G2, parks the request
    /// and starts onboarding them. Returns true when parked.
    pub(super) fn try_onboard(&mut self, slot: usize) -> bool {
        if self.offload.is_none() {
            return false;
        }
        self.intern_blocks(slot);
        let Some(off) = &mut self.offload else {
            return false;
        };
        let s = self.seqs[slot].as_ref().expect("slot is live");
        if s.onboarded.is_some() {
            return false;
        }
        let bs = self.config.block_size;
        let g1 = self.pool.lookup_prefix(&s.ids).blocks;
        // Only blocks that can count as cached (the last token is always computed).
        let usable = (s.len().saturating_sub(1) / bs).min(s.hashes.len());
        if g1 >= usable {
            return false;
        }
        let k = off.tier.lookup_prefix(&s.hashes.sequence[g1..usable]);
        if k == 0 {
            return false;
        }
        let hashes = &s.hashes.sequence[g1..g1 + k];
        off.tier.touch_all(hashes);
        let blocks: Vec<StoredBlock> = (g1..g1 + k)
            .map(|i| StoredBlock {
                seq_hash: s.hashes.sequence[i],
                local_hash: s.hashes.local[i],
            })
            .collect();
        let tag = off.next_tag;
        off.next_tag += 1;
        off.onboard_link
            .start(self.now, tag, k as f64 * off.block_bytes);
        off.onboarding.insert(
            tag,
            Onboard {
                id: s.id,
                parent: g1.checked_sub(1).map(|p| s.hashes.sequence[p]),
                start: g1,
                blocks,
            },
        );
        true
    }
}
