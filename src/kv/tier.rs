//! The host-memory KV tier (KVBM's G2) of one worker, and the processor-sharing links that move
//! blocks between it and the GPU pool.
//!
//! Blocks evicted from the GPU pool are offloaded over the G1→G2 `SharedLink`; they become
//! resident in `G2Tier` when their transfer completes. An admission whose prefix continues in G2
//! onboards those blocks over the G2→G1 link and waits for them. G2 evicts its least recently
//! used resident block when an offload needs room.

use std::collections::BTreeMap;

use crate::time::SimTime;
use crate::tokens::{HashKeyMap, SequenceHash};

/// Settings of the G2 tier (validated by the engine config).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct G2Config {
    /// Host blocks per worker.
    pub num_blocks: usize,
    /// KV bytes of one token (all layers, K and V): sets the size of a transfer.
    pub kv_bytes_per_token: u64,
    /// G1→G2 (offload) link bandwidth in GB/s (1e9 bytes); 0 means instant.
    pub bandwidth_g1_to_g2_gbps: f64,
    /// G2→G1 (onboard) link bandwidth in GB/s; 0 means instant.
    pub bandwidth_g2_to_g1_gbps: f64,
}

/// One transfer in flight on a link.
#[derive(Clone, Debug)]
struct Transfer {
    /// Caller's tag, returned on completion.
    tag: u64,
    /// Bytes still to move.
    remaining: f64,
}

/// A link whose bandwidth is shared equally by the transfers in flight (processor sharing): with
/// N transfers each progresses at B/N. Completion times are computed event by event.
#[derive(Clone, Debug)]
pub(crate) struct SharedLink {
    /// Bytes per microsecond; infinite when the bandwidth is not positive.
    bytes_per_us: f64,
    /// Transfers in flight, in start order.
    transfers: Vec<Transfer>,
    /// Time (µs, fractional) up to which `transfers` progressed.
    clock_us: f64,
    /// Bytes moved so far (completed transfers).
    bytes_moved: f64,
}

/// Leftover bytes below this count as done (floating-point slack).
const EPSILON_BYTES: f64 = 1e-6;

impl SharedLink {
    /// A link of `gbps` GB/s (1e9 bytes per second); `gbps <= 0` is an instant link.
    pub(crate) fn new(gbps: f64) -> SharedLink {
        let bytes_per_us = if gbps > 0.0 {
            gbps * 1e3
        } else {
            f64::INFINITY
        };
        SharedLink {
            bytes_per_us,
            transfers: Vec::new(),
            clock_us: 0.0,
            bytes_moved: 0.0,
        }
    }

    /// Transfers in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.transfers.len()
    }

    /// Starts moving `bytes` at `now` (after completing what finished before `now`). The caller
    /// must have called [`SharedLink::advance`] to `now` and handled its completions.
    pub(crate) fn start(&mut self, now: SimTime, tag: u64, bytes: f64) {
        debug_assert!(
            self.transfers.is_empty() || self.clock_us >= micros(now) - 1e-9,
            "advance the link before starting a transfer"
        );
        if self.transfers.is_empty() {
            self.clock_us = self.clock_us.max(micros(now));
        }
        self.transfers.push(Transfer {
            tag,
            remaining: bytes.max(0.0),
        });
    }

    /// When the next transfer completes, rounded up to a whole nanosecond.
    pub(crate) fn next_completion(&self) -> Option<SimTime> {
        let min = self
            .transfers
            .iter()
            .map(|t| t.remaining)
            .fold(f64::INFINITY, f64::min);
        if !min.is_finite() {
            return None;
        }
        let n = self.transfers.len() as f64;
        let dt = if self.bytes_per_us.is_infinite() {
            0.0
        } else {
            min * n / self.bytes_per_us
        };
        let ns = (self.clock_us + dt) * 1e3;
        Some(SimTime::from_nanos((ns - 1e-3).ceil().max(0.0) as u64))
    }

    /// Progresses every transfer to `now` and returns the tags of those that completed, in order
    /// of completion (ties in start order).
    pub(crate) fn advance(&mut self, now: SimTime) -> Vec<u64> {
        let mut done = Vec::new();
        let now_us = micros(now);
        while !self.transfers.is_empty() {
            let Some(next) = self.next_completion() else {
                break;
            };
            let n = self.transfers.len() as f64;
            if next <= now {
                // Everyone progresses by the smallest remainder; that transfer (and ties) finish.
                let min = self
                    .transfers
                    .iter()
                    .map(|t| t.remaining)
                    .fold(f64::INFINITY, f64::min);
                if self.bytes_per_us.is_finite() {
                    self.clock_us += min * n / self.bytes_per_us;
                }
                let mut kept = Vec::with_capacity(self.transfers.len());
                for mut t in std::mem::take(&mut self.transfers) {
                    t.remaining -= min;
                    self.bytes_moved += min;
                    if t.remaining <= EPSILON_BYTES {
                        done.push(t.tag);
                    } else {
                        kept.push(t);
                    }
                }
                self.transfers = kept;
            } else {
                if now_us > self.clock_us {
                    let each = (now_us - self.clock_us) * self.bytes_per_us / n;
                    for t in &mut self.transfers {
                        t.remaining -= each;
                        self.bytes_moved += each;
                    }
                    self.clock_us = now_us;
                }
                break;
            }
        }
        if self.transfers.is_empty() {
            self.clock_us = self.clock_us.max(now_us);
        }
        done
    }

    /// Checks the link's bookkeeping. Panics on a violation.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        for t in &self.transfers {
            assert!(
                t.remaining > -1.0,
                "transfer {} overshot: {}",
                t.tag,
                t.remaining
            );
        }
    }
}

/// `t` in (fractional) microseconds: the link's fluid model keeps its own float clock.
fn micros(t: SimTime) -> f64 {
    t.as_nanos() as f64 / 1e3
}

/// Where a G2 block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Residency {
    /// Being offloaded: counted against capacity, not yet readable.
    Arriving,
    /// Resident, with its LRU stamp.
    Resident(u64),
}

/// The host-memory block cache of one worker: capacity, residency and an LRU.
#[derive(Clone, Debug)]
pub(crate) struct G2Tier {
    /// Host blocks.
    capacity: usize,
    /// Every block resident or arriving.
    blocks: HashKeyMap<SequenceHash, Residency>,
    /// Resident blocks by LRU stamp: the first is evicted first.
    lru: BTreeMap<u64, SequenceHash>,
    /// Logical clock for stamps.
    clock: u64,
    /// Blocks arriving (offload in flight).
    arriving: usize,
    /// Blocks offloaded so far (transfers completed).
    pub(crate) offloaded_blocks: u64,
    /// Offloads dropped because every slot was arriving.
    pub(crate) dropped_offloads: u64,
}

impl G2Tier {
    /// An empty tier of `capacity` blocks.
    pub(crate) fn new(capacity: usize) -> G2Tier {
        G2Tier {
            capacity,
            blocks: HashKeyMap::default(),
            lru: BTreeMap::new(),
            clock: 0,
            arriving: 0,
            offloaded_blocks: 0,
            dropped_offloads: 0,
        }
    }

    /// Blocks readable now.
    pub(crate) fn num_resident(&self) -> usize {
        self.lru.len()
    }

    /// Blocks whose offload is in flight.
    #[cfg(test)]
    pub(crate) fn num_arriving(&self) -> usize {
        self.arriving
    }

    /// Reserves a slot for a block about to be offloaded. False when it is already present or
    /// arriving (nothing to move) or no slot can be freed.
    pub(crate) fn reserve(&mut self, hash: SequenceHash) -> bool {
        if let Some(r) = self.blocks.get(&hash).copied() {
            if let Residency::Resident(stamp) = r {
                self.touch(hash, stamp);
            }
            return false;
        }
        if self.blocks.len() >= self.capacity {
            match self.lru.pop_first() {
                Some((_, victim)) => {
                    self.blocks.remove(&victim);
                }
                None => {
                    self.dropped_offloads += 1;
                    return false;
                }
            }
        }
        self.blocks.insert(hash, Residency::Arriving);
        self.arriving += 1;
        true
    }

    /// The offload of a reserved block completed: it becomes resident (most recently used).
    pub(crate) fn arrive(&mut self, hash: SequenceHash) {
        if let Some(r) = self.blocks.get_mut(&hash) {
            if *r == Residency::Arriving {
                self.clock += 1;
                *r = Residency::Resident(self.clock);
                self.lru.insert(self.clock, hash);
                self.arriving -= 1;
                self.offloaded_blocks += 1;
            }
        }
    }

    /// The leading run of `hashes` resident here (arriving blocks are not readable yet).
    pub(crate) fn lookup_prefix(&self, hashes: &[SequenceHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| matches!(self.blocks.get(h), Some(Residency::Resident(_))))
            .count()
    }

    /// Marks resident blocks as just used (they are being onboarded).
    pub(crate) fn touch_all(&mut self, hashes: &[SequenceHash]) {
        for h in hashes {
            if let Some(Residency::Resident(stamp)) = self.blocks.get(h).copied() {
                self.touch(*h, stamp);
            }
        }
    }

    fn touch(&mut self, hash: SequenceHash, stamp: u64) {
        self.lru.remove(&stamp);
        self.clock += 1;
        self.lru.insert(self.clock, hash);
        self.blocks.insert(hash, Residency::Resident(self.clock));
    }

    /// Checks capacity and LRU bookkeeping. Panics on a violation.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self) {
        assert!(
            self.blocks.len() <= self.capacity,
            "G2 over capacity: {} > {}",
            self.blocks.len(),
            self.capacity
        );
        assert_eq!(
            self.blocks.len(),
            self.lru.len() + self.arriving,
            "G2 blocks are resident or arriving"
        );
        for (stamp, h) in &self.lru {
            assert_eq!(
                self.blocks.get(h),
                Some(&Residency::Resident(*stamp)),
                "G2 LRU entry matches its block"
            );
            assert!(*stamp <= self.clock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn one_megabyte_at_one_gigabyte_per_second_takes_a_millisecond() {
        let mut link = SharedLink::new(1.0);
        link.start(SimTime::from_micros(0), 7, 1e6);
        assert_eq!(link.next_completion(), Some(SimTime::from_micros(1000)));
        assert!(link.advance(SimTime::from_micros(999)).is_empty());
        assert_eq!(link.advance(SimTime::from_micros(1000)), vec![7]);
        assert_eq!(link.next_completion(), None);
    }

    #[test]
    fn concurrent_transfers_share_the_link() {
        let mut link = SharedLink::new(1.0);
        link.start(SimTime::from_micros(0), 1, 1e6);
        link.start(SimTime::from_micros(0), 2, 1e6);
        assert_eq!(link.next_completion(), Some(SimTime::from_micros(2000)));
        assert_eq!(link.advance(SimTime::from_micros(2000)), vec![1, 2]);
        // A second transfer joining half way: the first has 0.5 MB left at t=500, both move at
        // half speed until the first finishes at 1500, the second then has 0.5 MB alone: 2000.
        link.start(SimTime::from_micros(3000), 3, 1e6);
        assert!(link.advance(SimTime::from_micros(3500)).is_empty());
        link.start(SimTime::from_micros(3500), 4, 1e6);
        assert_eq!(link.next_completion(), Some(SimTime::from_micros(4500)));
        assert_eq!(link.advance(SimTime::from_micros(4500)), vec![3]);
        assert_eq!(link.next_completion(), Some(SimTime::from_micros(5000)));
        assert_eq!(link.advance(SimTime::from_micros(6000)), vec![4]);
    }

    #[test]
    fn instant_link_completes_at_start() {
        let mut link = SharedLink::new(0.0);
        link.start(SimTime::from_micros(5), 1, 1e9);
        assert_eq!(link.next_completion(), Some(SimTime::from_micros(5)));
        assert_eq!(link.advance(SimTime::from_micros(5)), vec![1]);
    }

    #[test]
    fn g2_evicts_least_recently_used_resident_blocks() {
        let mut g2 = G2Tier::new(2);
        let (a, b, c) = (SequenceHash(1), SequenceHash(2), SequenceHash(3));
        assert!(g2.reserve(a));
        assert!(g2.reserve(b));
        assert!(!g2.reserve(c), "both slots arriving: dropped");
        g2.arrive(a);
        g2.arrive(b);
        g2.touch_all(&[a]);
        assert!(g2.reserve(c), "b is the LRU victim");
        g2.arrive(c);
        assert_eq!(g2.lookup_prefix(&[a, c]), 2);
        assert_eq!(g2.lookup_prefix(&[b]), 0);
        g2.assert_invariants();
    }

    #[test]
    fn invariants_hold_over_many_random_operations() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut g2 = G2Tier::new(16);
        let mut link = SharedLink::new(2.0);
        let mut now = 0u64;
        for tag in 0..5000u64 {
            match rng.gen_range(0..3) {
                0 => {
                    let h = SequenceHash(rng.gen_range(0..40));
                    if g2.reserve(h) {
                        link.start(SimTime::from_micros(now), h.0, rng.gen_range(1.0..1e5));
                    }
                }
                1 => now += rng.gen_range(0..50),
                _ => {
                    let hs: Vec<SequenceHash> =
                        (0..4).map(|_| SequenceHash(rng.gen_range(0..40))).collect();
                    let n = g2.lookup_prefix(&hs);
                    g2.touch_all(&hs[..n]);
                }
            }
            for done in link.advance(SimTime::from_micros(now)) {
                g2.arrive(SequenceHash(done));
            }
            assert_eq!(g2.num_arriving(), link.in_flight(), "step {tag}");
            g2.assert_invariants();
            link.assert_invariants();
        }
    }
}
