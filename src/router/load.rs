//! Active load of one worker as the router tracks it: the blocks of its active requests and the
//! prompt tokens it has yet to prefill.

use std::collections::hash_map::Entry;
use std::collections::BTreeMap;

use crate::ids::RequestId;
use crate::tokens::{HashKeyMap, SequenceHash};

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
    /// Distinct blocks across active requests, with how many requests hold each.
    blocks: HashKeyMap<SequenceHash, u32>,
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
        self.blocks.len()
    }

    /// Active requests.
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// How many of `hashes` are not blocks of an active request here.
    pub fn new_blocks(&self, hashes: &[SequenceHash]) -> usize {
        if self.blocks.is_empty() {
            // An idle worker: no lookups (routing over many workers meets many of these).
            return hashes.len();
        }
        hashes
            .iter()
            .filter(|h| !self.blocks.contains_key(h))
            .count()
    }

    /// Records a routed request.
    pub fn add(&mut self, id: RequestId, hashes: &[SequenceHash], prefill_tokens: usize) {
        self.add_reporting(id, hashes, prefill_tokens, |_| {});
    }

    /// [`WorkerLoad::add`], calling `on_new` with each block that was not active here before.
    pub(crate) fn add_reporting(
        &mut self,
        id: RequestId,
        hashes: &[SequenceHash],
        prefill_tokens: usize,
        mut on_new: impl FnMut(SequenceHash),
    ) {
        for h in hashes {
            let count = self.blocks.entry(*h).or_default();
            if *count == 0 {
                on_new(*h);
            }
            *count += 1;
        }
        self.prefill_tokens += prefill_tokens;
        self.requests.insert(
            id,
            Active {
                hashes: hashes.to_vec(),
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

    /// The request left.
    pub fn free(&mut self, id: RequestId) {
        self.free_reporting(id, |_| {});
    }

    /// [`WorkerLoad::free`], calling `on_gone` with each block no longer active here.
    pub(crate) fn free_reporting(&mut self, id: RequestId, mut on_gone: impl FnMut(SequenceHash)) {
        let Some(a) = self.requests.remove(&id) else {
            return;
        };
        self.prefill_tokens -= a.prefill_tokens;
        for h in &a.hashes {
            // One lookup decrements and (at zero) drops the count.
            if let Entry::Occupied(mut e) = self.blocks.entry(*h) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                    on_gone(*h);
                }
            }
        }
    }
}
