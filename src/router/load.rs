//! Active load as the router tracks it: per worker, its active requests and the prompt tokens it
//! has yet to prefill ([`WorkerLoad`]); across workers, one map from each block of an active
//! request to the workers whose active requests hold it ([`ActiveBlocks`]).

use std::collections::BTreeMap;

use crate::ids::RequestId;
use crate::kv::BlockMap;
use crate::tokens::SequenceHash;

#[derive(Clone, Debug)]
struct Active {
    hashes: Vec<SequenceHash>,
    /// Prompt tokens not cached at routing time; 0 once prefill completed.
    prefill_tokens: usize,
}

/// Requests routed to a worker and not yet finished.
#[derive(Clone, Debug, Default)]
pub struct WorkerLoad {
    /// Active requests by id.
    requests: BTreeMap<RequestId, Active>,
    /// Distinct blocks across active requests (kept by [`ActiveBlocks`], which counts them).
    num_blocks: usize,
    /// Sum of `prefill_tokens` over active requests.
    prefill_tokens: usize,
}

impl WorkerLoad {
    /// Prompt tokens routed here and not yet prefilled.
    pub fn active_prefill_tokens(&self) -> usize {
        self.prefill_tokens
    }

    /// Distinct blocks of active requests.
    pub fn active_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Active requests.
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// Records a routed request (its blocks are counted by [`ActiveBlocks::add`]).
    fn insert(&mut self, id: RequestId, hashes: Vec<SequenceHash>, prefill_tokens: usize) {
        self.prefill_tokens += prefill_tokens;
        self.requests.insert(
            id,
            Active {
                hashes,
                prefill_tokens,
            },
        );
    }

    /// The request's prefill is done.
    pub fn mark_prefill_completed(&mut self, id: RequestId) {
        if let Some(a) = self.requests.get_mut(&id) {
            self.prefill_tokens -= a.prefill_tokens;
            a.prefill_tokens = 0;
        }
    }

    /// Forgets a request; its block hashes, for [`ActiveBlocks::free`]. None when unknown.
    fn take(&mut self, id: RequestId) -> Option<Vec<SequenceHash>> {
        let a = self.requests.remove(&id)?;
        self.prefill_tokens -= a.prefill_tokens;
        Some(a.hashes)
    }
}

/// The workers whose active requests hold one block, with how many requests on each. Nearly
/// every block is held on one worker only, so that case is inline (no allocation).
#[derive(Clone, Debug)]
enum Holders {
    /// One worker: (worker, requests holding the block there).
    One(u32, u32),
    /// Several workers: (worker, requests) pairs in no particular order, never empty.
    #[expect(
        clippy::box_collection,
        reason = "a thin pointer keeps the entry at 16 bytes (a Vec alone is 24)"
    )]
    Many(Box<Vec<(u32, u32)>>),
}

impl Default for Holders {
    /// The placeholder of an empty map slot, and what a new entry starts as before its first
    /// [`Holders::add`] (no worker holds the block).
    fn default() -> Self {
        Holders::One(0, 0)
    }
}

impl Holders {
    /// One more request on `worker` holds the block; true when `worker` did not hold it.
    fn add(&mut self, worker: u32) -> bool {
        match self {
            Holders::One(w, n) if *w == worker => {
                *n += 1;
                false
            }
            Holders::One(w, n) => {
                *self = Holders::Many(Box::new(vec![(*w, *n), (worker, 1)]));
                true
            }
            Holders::Many(list) => match list.iter_mut().find(|(w, _)| *w == worker) {
                Some((_, n)) => {
                    *n += 1;
                    false
                }
                None => {
                    list.push((worker, 1));
                    true
                }
            },
        }
    }

    /// One request on `worker` let the block go. Returns (`worker` no longer holds it, nobody
    /// holds it).
    fn remove(&mut self, worker: u32) -> (bool, bool) {
        match self {
            Holders::One(w, n) if *w == worker => {
                *n -= 1;
                (*n == 0, *n == 0)
            }
            Holders::One(..) => (false, false),
            Holders::Many(list) => {
                let Some(i) = list.iter().position(|(w, _)| *w == worker) else {
                    return (false, false);
                };
                list[i].1 -= 1;
                if list[i].1 > 0 {
                    return (false, false);
                }
                list.swap_remove(i);
                if let [(w, n)] = list.as_slice() {
                    *self = Holders::One(*w, *n);
                }
                (true, false)
            }
        }
    }

    /// Calls `f` with every worker holding the block.
    fn for_each_worker(&self, mut f: impl FnMut(u32)) {
        match self {
            Holders::One(w, _) => f(*w),
            Holders::Many(list) => list.iter().for_each(|&(w, _)| f(w)),
        }
    }

    /// Requests on `worker` holding the block.
    fn count(&self, worker: u32) -> u32 {
        match self {
            Holders::One(w, n) => u32::from(*w == worker) * *n,
            Holders::Many(list) => list
                .iter()
                .find(|(w, _)| *w == worker)
                .map_or(0, |&(_, n)| n),
        }
    }
}

/// Every block of an active request, with the workers whose active requests hold it: one
/// lookup per block records, frees, or counts every worker's new blocks for a prompt (where a
/// map per worker would take one per block and worker). Keeps each [`WorkerLoad`]'s distinct
/// block count.
#[derive(Clone, Debug, Default)]
pub(crate) struct ActiveBlocks {
    /// The holders of each active block; a block nobody holds has no entry.
    blocks: BlockMap<Holders>,
}

impl ActiveBlocks {
    /// Records a routed request on `worker` (whose load is `load`).
    pub(crate) fn add(
        &mut self,
        load: &mut WorkerLoad,
        worker: u32,
        id: RequestId,
        hashes: Vec<SequenceHash>,
        prefill_tokens: usize,
    ) {
        for (i, &h) in hashes.iter().enumerate() {
            self.blocks.warm_ahead(&hashes, i);
            let (holders, inserted) = self.blocks.get_or_insert_default(h);
            let new = if inserted {
                *holders = Holders::One(worker, 1);
                true
            } else {
                holders.add(worker)
            };
            load.num_blocks += usize::from(new);
        }
        load.insert(id, hashes, prefill_tokens);
    }

    /// The request `id` on `worker` (whose load is `load`) left.
    pub(crate) fn free(&mut self, load: &mut WorkerLoad, worker: u32, id: RequestId) {
        let Some(hashes) = load.take(id) else {
            return;
        };
        for (i, h) in hashes.iter().enumerate() {
            self.blocks.warm_ahead(&hashes, i);
            // One lookup decrements and (when nobody holds it) drops the block.
            let gone = self.blocks.update(h, |holders| holders.remove(worker));
            load.num_blocks -= usize::from(gone == Some(true));
        }
    }

    /// Subtracts 1 from `new_blocks[w]` for every prompt block (of `hashes`) that worker `w`
    /// already holds: `new_blocks` starts at `hashes.len()` for every worker.
    ///
    /// `hashes` is a chain of sequence hashes, as is every request's list: a worker holding a
    /// block holds its whole prefix (the request that holds it does), so the blocks a worker
    /// holds are a leading run and the walk ends at the first block nobody holds. (Without the
    /// chain property this counts the leading run only, as [`ActiveBlocks::new_blocks`] does.)
    pub(crate) fn count_new(&self, hashes: &[SequenceHash], new_blocks: &mut [usize]) {
        if self.blocks.is_empty() {
            return;
        }
        for (i, h) in hashes.iter().enumerate() {
            self.blocks.warm_ahead(hashes, i);
            let Some(holders) = self.blocks.get(h) else {
                break;
            };
            holders.for_each_worker(|w| {
                if let Some(n) = new_blocks.get_mut(w as usize) {
                    *n -= 1;
                }
            });
        }
    }

    /// How many of `hashes` (a chain, see [`ActiveBlocks::count_new`]) are not blocks of an
    /// active request on `worker`: all but the leading run it holds.
    pub(crate) fn new_blocks(&self, worker: u32, hashes: &[SequenceHash]) -> usize {
        let held = hashes
            .iter()
            .take_while(|h| self.blocks.get(h).is_some_and(|b| b.count(worker) > 0))
            .count();
        hashes.len() - held
    }

    /// Checks the map against the loads (tests): each worker's distinct block count, and that
    /// every entry has a holder.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self, loads: &[WorkerLoad]) {
        let mut counts = vec![0usize; loads.len()];
        for holders in self.blocks.values() {
            let mut any = false;
            holders.for_each_worker(|w| {
                any = true;
                assert!(holders.count(w) > 0, "a listed holder holds the block");
                counts[w as usize] += 1;
            });
            assert!(any, "a block nobody holds has no entry");
        }
        for (w, load) in loads.iter().enumerate() {
            assert_eq!(counts[w], load.num_blocks, "worker {w}'s distinct blocks");
        }
    }
}
