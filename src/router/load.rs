//! Active load as the router tracks it: per worker, its active requests and the prompt tokens it
//! has yet to prefill ([`WorkerLoad`]); across workers, the blocks of active requests and the
//! workers whose active requests hold each ([`ActiveBlocks`]).

use std::collections::BTreeMap;

use crate::ids::RequestId;
use crate::indexer::FxHashMap;
use crate::tokens::SequenceHash;

#[derive(Clone, Debug)]
struct Active {
    hashes: Vec<SequenceHash>,
    /// Prompt tokens not cached at routing time; 0 once prefill completed.
    prefill_tokens: usize,
}

/// Requests routed to a worker and not yet finished.
#[derive(Clone, Debug, Default)]
pub(crate) struct WorkerLoad {
    /// Active requests by id.
    requests: BTreeMap<RequestId, Active>,
    /// Distinct blocks across active requests (kept by [`ActiveBlocks`], which counts them).
    num_blocks: usize,
    /// Sum of `prefill_tokens` over active requests.
    prefill_tokens: usize,
}

impl WorkerLoad {
    /// Prompt tokens routed here and not yet prefilled.
    pub(crate) fn active_prefill_tokens(&self) -> usize {
        self.prefill_tokens
    }

    /// Distinct blocks of active requests.
    pub(crate) fn active_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Active requests.
    #[cfg(test)]
    pub(crate) fn active_requests(&self) -> usize {
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
    pub(crate) fn mark_prefill_completed(&mut self, id: RequestId) {
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
    /// What a free slot of [`ActiveBlocks`] holds (no worker holds anything there).
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
    #[cfg(test)]
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

/// The blocks of active requests, with the workers whose active requests hold each: a tree of
/// runs. A request's blocks are a path from the root (a block is named by its whole prefix, as
/// its sequence hash is), and a run is a stretch of a path that every request entering it holds
/// whole, so one holder list covers the run. Recording, freeing or counting a prompt's blocks
/// compares its hashes against each run in turn (sequential reads) and looks up one map entry
/// per run on its path, where a map keyed by block would take one lookup per block. Keeps each
/// [`WorkerLoad`]'s distinct block count.
#[derive(Clone, Debug, Default)]
pub(crate) struct ActiveBlocks {
    /// Each live run by (its parent run, or [`ROOT`]; its first block's hash).
    children: FxHashMap<(u32, SequenceHash), u32>,
    /// Runs by id; a free slot has no hashes.
    runs: Vec<Run>,
    /// Free slots of `runs`.
    free: Vec<u32>,
}

/// The parent of the runs that start a prompt (no run has this id).
const ROOT: u32 = u32::MAX;

/// A stretch of blocks held by the same active requests.
#[derive(Clone, Debug, Default)]
struct Run {
    /// The run's blocks in prompt order; never empty while the run is live.
    hashes: Vec<SequenceHash>,
    /// The workers whose active requests pass through the run, with how many on each.
    holders: Holders,
}

/// How many leading elements `a` and `b` share.
fn common_len(a: &[SequenceHash], b: &[SequenceHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ActiveBlocks {
    /// Stores `run` in a free slot (or a new one); its id.
    fn alloc(&mut self, run: Run) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.runs[id as usize] = run;
                id
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        }
    }

    /// Records a routed request on `worker` (whose load is `load`).
    pub(crate) fn add(
        &mut self,
        load: &mut WorkerLoad,
        worker: u32,
        id: RequestId,
        hashes: Vec<SequenceHash>,
        prefill_tokens: usize,
    ) {
        let (mut parent, mut pos) = (ROOT, 0);
        while let Some(&first) = hashes.get(pos) {
            let rest = &hashes[pos..];
            let Some(&r) = self.children.get(&(parent, first)) else {
                // Nobody holds the rest: one new run.
                let run = self.alloc(Run {
                    hashes: rest.to_vec(),
                    holders: Holders::One(worker, 1),
                });
                self.children.insert((parent, first), run);
                load.num_blocks += rest.len();
                break;
            };
            let m = common_len(&self.runs[r as usize].hashes, rest);
            let entered = if m < self.runs[r as usize].hashes.len() {
                // The prompt leaves the run after `m` blocks: a new run takes the shared head
                // (in the run's place under its parent), the old one keeps the tail below it,
                // so the runs below the tail keep their keys.
                let old = &mut self.runs[r as usize];
                let tail = old.hashes.split_off(m);
                let head = std::mem::replace(&mut old.hashes, tail);
                let holders = old.holders.clone();
                let tail_first = old.hashes[0];
                let h = self.alloc(Run {
                    hashes: head,
                    holders,
                });
                self.children.insert((parent, first), h);
                self.children.insert((h, tail_first), r);
                h
            } else {
                r
            };
            if self.runs[entered as usize].holders.add(worker) {
                load.num_blocks += m;
            }
            parent = entered;
            pos += m;
        }
        load.insert(id, hashes, prefill_tokens);
    }

    /// The request `id` on `worker` (whose load is `load`) left.
    pub(crate) fn free(&mut self, load: &mut WorkerLoad, worker: u32, id: RequestId) {
        let Some(hashes) = load.take(id) else {
            return;
        };
        // The request's path: whole runs (recording it split any run it ended inside).
        let (mut parent, mut pos) = (ROOT, 0);
        while let Some(&first) = hashes.get(pos) {
            let Some(&r) = self.children.get(&(parent, first)) else {
                break;
            };
            let run = &mut self.runs[r as usize];
            let len = run.hashes.len();
            let (left, gone) = run.holders.remove(worker);
            if left {
                load.num_blocks = load.num_blocks.saturating_sub(len);
            }
            if gone {
                // Nobody holds it, so nobody holds the runs below it either: they go with it
                // (those on this path in the steps that follow, others went before).
                self.children.remove(&(parent, first));
                run.hashes = Vec::new();
                self.free.push(r);
            }
            parent = r;
            pos += len;
        }
    }

    /// Walks `hashes` (a chain, see [`ActiveBlocks::count_new`]) down the runs: `visit` gets
    /// each run the prompt enters and how many of its leading blocks are the prompt's next.
    fn walk(&self, hashes: &[SequenceHash], mut visit: impl FnMut(&Run, usize) -> bool) {
        let (mut parent, mut pos) = (ROOT, 0);
        while let Some(&first) = hashes.get(pos) {
            let Some(&r) = self.children.get(&(parent, first)) else {
                return;
            };
            let run = &self.runs[r as usize];
            let m = common_len(&run.hashes, &hashes[pos..]);
            if !visit(run, m) || m < run.hashes.len() {
                return;
            }
            parent = r;
            pos += m;
        }
    }

    /// Subtracts 1 from `new_blocks[w]` for every prompt block (of `hashes`) that worker `w`
    /// already holds: `new_blocks` starts at `hashes.len()` for every worker.
    ///
    /// `hashes` is a chain of sequence hashes, as is every request's list: a block names its
    /// whole prefix, so the blocks a worker holds are a leading run of the prompt.
    pub(crate) fn count_new(&self, hashes: &[SequenceHash], new_blocks: &mut [usize]) {
        self.walk(hashes, |run, m| {
            run.holders.for_each_worker(|w| {
                if let Some(n) = new_blocks.get_mut(w as usize) {
                    *n -= m;
                }
            });
            true
        });
    }

    /// How many of `hashes` (a chain, see [`ActiveBlocks::count_new`]) are not blocks of an
    /// active request on `worker`: all but the leading run it holds.
    #[cfg(test)]
    pub(crate) fn new_blocks(&self, worker: u32, hashes: &[SequenceHash]) -> usize {
        let mut held = 0;
        self.walk(hashes, |run, m| {
            let holds = run.holders.count(worker) > 0;
            if holds {
                held += m;
            }
            holds
        });
        hashes.len() - held
    }

    /// Checks the runs against the loads (tests): each worker's distinct block count, every
    /// live run reachable under its key with a holder, and no run held by a worker its parent
    /// is not held by as often.
    #[cfg(test)]
    pub(crate) fn assert_invariants(&self, loads: &[WorkerLoad]) {
        let mut counts = vec![0usize; loads.len()];
        let live = self.runs.len() - self.free.len();
        assert_eq!(self.children.len(), live, "every live run has one key");
        for (&(parent, first), &r) in &self.children {
            let run = &self.runs[r as usize];
            assert_eq!(run.hashes.first(), Some(&first), "run {r}'s key");
            let mut any = false;
            run.holders.for_each_worker(|w| {
                any = true;
                let n = run.holders.count(w);
                assert!(n > 0, "a listed holder holds the run");
                if parent != ROOT {
                    assert!(
                        self.runs[parent as usize].holders.count(w) >= n,
                        "run {r} is held more often than its parent"
                    );
                }
                counts[w as usize] += run.hashes.len();
            });
            assert!(any, "a run nobody holds is gone");
        }
        for (w, load) in loads.iter().enumerate() {
            assert_eq!(counts[w], load.num_blocks, "worker {w}'s distinct blocks");
        }
    }
}
