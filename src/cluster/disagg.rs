//! Disaggregated serving: the decode pool behind its own load-aware router, and the
//! prefill→decode hand-off. A request runs on a prefill worker as its prompt with one hidden
//! output token; when that finishes, [`Cluster`]'s hand-off picks a decode worker at once and
//! the prompt's KV travels there for [`KvTransferConfig::delay`]; then the full request joins
//! that worker's queue with its prompt KV already present.

use std::collections::BTreeMap;

use super::config::{ClusterConfig, KvTransferConfig, KvTransferTimingMode};
use super::output::Output;
use super::Cluster;
use crate::ids::{RequestId, WorkerId};
use crate::request::EngineRequest;
use crate::router::{RouteRequest, Router, RouterConfig};
use crate::time::SimTime;

/// A request between its prefill and its decode.
#[derive(Debug)]
struct PrefillState {
    /// The original request (full output), sent to the decode worker after the hand-off.
    request: EngineRequest,
    /// Prompt reuse at the latest prefill-side admission.
    reused_tokens: usize,
    /// Of those, tokens onboarded from G2.
    g2_reused_tokens: usize,
}

/// A hand-off in flight.
#[derive(Debug)]
struct Handoff {
    id: RequestId,
    /// Global index of the decode worker.
    worker: usize,
    request: EngineRequest,
}

/// The decode pool of a disaggregated cluster.
#[derive(Debug)]
pub(super) struct DecodePool {
    /// Load-aware router over the decode workers (local ids `0..D`).
    pub(super) router: Router,
    /// Global index of the first decode worker.
    first: usize,
    /// The prefill→decode link.
    transfer: KvTransferConfig,
    /// Requests prefilling or prefilled, by id.
    prefilling: BTreeMap<RequestId, PrefillState>,
    /// Hand-offs in flight by (arrival time, sequence number).
    handoffs: BTreeMap<(SimTime, u64), Handoff>,
    /// Where each in-flight hand-off is in `handoffs`.
    handoff_key: BTreeMap<RequestId, (SimTime, u64)>,
    /// Next hand-off sequence number.
    next_handoff: u64,
    /// Prefill-side reuse of requests on decode workers: (reused, g2 reused).
    reuse: BTreeMap<RequestId, (usize, usize)>,
    /// Hand-offs started so far.
    transfers: u64,
    /// Their summed duration.
    transfer_ns: u64,
}

impl DecodePool {
    /// The decode pool of `config` (workers `first..first + num_decode_workers`), behind
    /// Dynamo's decode router: load only (overlap weight 0), no router queue.
    pub(super) fn new(
        config: &ClusterConfig,
        first: usize,
        num_decode_workers: usize,
        transfer: KvTransferConfig,
    ) -> DecodePool {
        let router = Router::new(
            RouterConfig {
                overlap_score_weight: 0.0,
                queue_threshold: None,
                ..config.router.clone()
            },
            num_decode_workers,
            config.engine.block_size,
            config.engine.max_num_batched_tokens,
            config.seed ^ 0xdec0de,
        );
        DecodePool {
            router,
            first,
            transfer,
            prefilling: BTreeMap::new(),
            handoffs: BTreeMap::new(),
            handoff_key: BTreeMap::new(),
            next_handoff: 0,
            reuse: BTreeMap::new(),
            transfers: 0,
            transfer_ns: 0,
        }
    }

    /// The id of global worker `w` at the decode router.
    pub(super) fn local_id(&self, w: usize) -> WorkerId {
        WorkerId((w - self.first) as u32)
    }

    /// Remembers a routed request for its hand-off and returns what its prefill worker runs:
    /// the prompt with one (hidden) output token.
    pub(super) fn start_prefill(&mut self, id: RequestId, request: EngineRequest) -> EngineRequest {
        let prefill = EngineRequest {
            prompt: request.prompt.clone(),
            max_output_tokens: 1,
            output_tokens: Vec::new(),
        };
        self.prefilling.insert(
            id,
            PrefillState {
                request,
                reused_tokens: 0,
                g2_reused_tokens: 0,
            },
        );
        prefill
    }

    /// The prompt reuse of a prefill-side admission, reported at the decode-side admission.
    pub(super) fn note_prefill_reuse(&mut self, id: RequestId, reused: usize, g2_reused: usize) {
        if let Some(state) = self.prefilling.get_mut(&id) {
            state.reused_tokens = reused;
            state.g2_reused_tokens = g2_reused;
        }
    }

    /// (reused, G2 reused) prompt tokens seen at the prefill worker of a handed-off request.
    pub(super) fn prefill_reuse(&self, id: RequestId) -> (usize, usize) {
        self.reuse.get(&id).copied().unwrap_or_default()
    }

    /// Drops what the pool remembers of a request that ended.
    pub(super) fn forget(&mut self, id: RequestId) {
        self.prefilling.remove(&id);
        self.reuse.remove(&id);
    }

    /// A request on worker `w` was cancelled: forgets it, and when its KV was on the link
    /// (`w` is then its decode worker) drops the hand-off and frees it at the decode router.
    /// True when it was in a hand-off (no worker holds it).
    pub(super) fn cancel_hand_off(&mut self, id: RequestId, w: usize) -> bool {
        self.forget(id);
        let Some(key) = self.handoff_key.remove(&id) else {
            return false;
        };
        self.handoffs.remove(&key);
        let local = self.local_id(w);
        self.router.free(local, id);
        true
    }

    /// When the next hand-off lands.
    pub(super) fn next_arrival(&self) -> Option<SimTime> {
        self.handoffs.keys().next().map(|k| k.0)
    }

    /// The hand-offs landed by `now`, in order: (request, global decode worker, request).
    pub(super) fn arrivals_due(&mut self, now: SimTime) -> Vec<(RequestId, usize, EngineRequest)> {
        let mut due = Vec::new();
        while let Some(entry) = self.handoffs.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let handoff = entry.remove();
            self.handoff_key.remove(&handoff.id);
            due.push((handoff.id, handoff.worker, handoff.request));
        }
        due
    }

    /// (hand-offs started, their summed microseconds, hand-offs in flight).
    pub(super) fn transfer_counts(&self) -> (u64, u64, usize) {
        (self.transfers, self.transfer_ns, self.handoffs.len())
    }

    /// Checks the hand-off bookkeeping against the cluster's placement. Panics on a violation.
    #[cfg(test)]
    pub(super) fn assert_invariants(
        &self,
        placement: &BTreeMap<RequestId, WorkerId>,
        parked: &BTreeMap<RequestId, EngineRequest>,
    ) {
        assert_eq!(self.handoffs.len(), self.handoff_key.len());
        for (key, h) in &self.handoffs {
            assert_eq!(self.handoff_key.get(&h.id), Some(key));
            assert_eq!(placement.get(&h.id), Some(&WorkerId(h.worker as u32)));
            assert!(h.worker >= self.first, "hand-offs go to decode workers");
        }
        for id in self.prefilling.keys() {
            let w = placement.get(id).map(|w| w.0 as usize);
            assert!(
                w.is_some_and(|w| w < self.first) || parked.contains_key(id),
                "a prefilling request is on a prefill worker"
            );
        }
    }
}

impl Cluster {
    /// A prompt finished on prefill worker `from` at `time`: picks the decode worker and starts
    /// the KV transfer to it.
    pub(super) fn hand_off(
        &mut self,
        id: RequestId,
        from: WorkerId,
        time: SimTime,
        out: &mut Vec<Output>,
    ) {
        let Some(pool) = &mut self.decode else {
            return;
        };
        let Some(state) = pool.prefilling.remove(&id) else {
            return;
        };
        let request = state.request;
        let decision = pool.router.route(
            id,
            RouteRequest {
                isl: request.prompt.len,
                local_hashes: &request.prompt.blocks.local,
                seq_hashes: &request.prompt.blocks.sequence,
                now: time,
            },
        );
        let worker = pool.first + decision.worker.0 as usize;
        let tokens = match pool.transfer.timing_mode {
            KvTransferTimingMode::FullPrompt => request.prompt.len,
            KvTransferTimingMode::DestinationMissing => {
                let pool_kv = self.workers[worker].scheduler().pool();
                let cached = pool_kv
                    .lookup_prefix_hashes(&request.prompt.blocks.sequence)
                    .blocks;
                request.prompt.len.saturating_sub(cached * self.block_size)
            }
        };
        let duration = pool.transfer.delay(tokens);
        pool.transfers += 1;
        pool.transfer_ns += duration.as_nanos();
        pool.reuse
            .insert(id, (state.reused_tokens, state.g2_reused_tokens));
        let to = WorkerId(worker as u32);
        self.placement.insert(id, to);
        out.push(Output::KvTransfer {
            id,
            from,
            to,
            time,
            tokens,
            duration,
        });
        let key = (time + duration, pool.next_handoff);
        pool.next_handoff += 1;
        pool.handoff_key.insert(id, key);
        pool.handoffs.insert(
            key,
            Handoff {
                id,
                worker,
                request,
            },
        );
    }
}
