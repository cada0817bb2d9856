//! The live driver's KV-event export ([`KvExport`]): the tokens behind each block, and where
//! the batches go ([`KvSink`]: the ZeroMQ publisher, or a JSON-lines file).

use std::collections::BTreeMap;
use std::sync::Arc;

use servesim::cluster::Cluster;
use servesim::ids::RequestId;
use servesim::kv::KvEvent;
use servesim::time::SimTime;
use servesim::tokens::Token;

use super::publisher::KvEventPublisher;
use super::tokens::{BlockTokens, LoraTag};
use super::wire::{self, WireBatch};

/// The driver's KV-event export: token bookkeeping plus the publisher.
#[derive(Debug)]
pub(crate) struct KvExport {
    /// Tokens behind each cacheable block.
    pub tokens: BlockTokens,
    /// Where batches go.
    pub sink: KvSink,
}

/// Where exported batches go: ZeroMQ, or a JSON-lines file (offline replay).
#[derive(Debug)]
pub(crate) enum KvSink {
    /// Published on ZeroMQ sockets.
    Zmq(KvEventPublisher),
    /// Written as JSON lines, one decoded batch a line (`mockserve replay --kv-events-jsonl`).
    Jsonl(JsonlSink),
}

/// A JSON-lines file of batches; the first write error is kept and stops further writes.
#[derive(Debug)]
pub(crate) struct JsonlSink {
    /// The file.
    pub out: std::io::BufWriter<std::fs::File>,
    /// The first error, reported when the run ends.
    pub error: Option<std::io::Error>,
}

impl JsonlSink {
    fn write(&mut self, batch: &WireBatch) {
        if self.error.is_some() {
            return;
        }
        use std::io::Write;
        let result = serde_json::to_writer(&mut self.out, batch)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = result {
            self.error = Some(e);
        }
    }

    /// Flushes the file; the first error of the run, if any.
    pub(crate) fn finish(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        match self.error.take() {
            Some(e) => Err(e),
            None => self.out.flush(),
        }
    }
}

impl KvExport {
    /// An export of the KV events of `cluster` (which starts keeping them) to `sink`.
    pub(crate) fn new(cluster: &mut Cluster, sink: KvSink) -> KvExport {
        cluster.export_kv_events();
        let block_size = cluster.block_size();
        KvExport {
            tokens: BlockTokens::new(cluster.workers().len(), block_size),
            sink,
        }
    }

    /// Starts tracking a submitted request: its prompt tokens, the hashes the engine got for
    /// them, and its adapter.
    pub(crate) fn track(
        &mut self,
        id: RequestId,
        prompt: &servesim::request::Prompt,
        lora: Option<Arc<LoraTag>>,
    ) {
        let tokens: &[Token] = prompt.tokens.as_deref().unwrap_or_default();
        self.tokens
            .track_hashed(id, tokens, prompt.blocks.clone(), lora);
    }

    /// After an advance of `cluster` to `now` that emitted `outputs`: records the output
    /// tokens, then publishes the events the advance exported, one batch per worker, stamped
    /// `ts_seconds`.
    pub(crate) fn after_advance(
        &mut self,
        cluster: &mut Cluster,
        outputs: &[servesim::cluster::Output],
        now: SimTime,
        ts_seconds: f64,
    ) {
        for output in outputs {
            if let servesim::cluster::Output::Token { id, token, .. } = output {
                self.tokens.push_token(*id, *token);
            }
        }
        let events = cluster.drain_kv_events();
        self.publish_events(&events, ts_seconds);
        self.tokens.retire_until(now);
    }

    /// One batch per worker of `events`, in order.
    fn publish_events(&mut self, events: &[KvEvent], ts_seconds: f64) {
        if events.is_empty() {
            return;
        }
        let mut by_worker: BTreeMap<u32, Vec<wire::WireEvent>> = BTreeMap::new();
        for event in events {
            let wire = self.tokens.wire_event(event);
            by_worker.entry(event.worker.0).or_default().push(wire);
        }
        for (rank, events) in by_worker {
            let data_parallel_rank = match &self.sink {
                KvSink::Zmq(publisher) if publisher.standalone => 0,
                _ => rank,
            };
            let batch = WireBatch {
                ts: ts_seconds,
                events,
                data_parallel_rank: Some(data_parallel_rank),
            };
            match &mut self.sink {
                KvSink::Zmq(publisher) => publisher.publish(rank as usize, &batch),
                KvSink::Jsonl(sink) => sink.write(&batch),
            }
        }
    }

    /// Stops tracking a request once the passes in progress on `cluster` have ended.
    pub(crate) fn release(&mut self, cluster: &Cluster, id: RequestId, now: SimTime) {
        let not_before = cluster
            .workers()
            .iter()
            .filter_map(|w| w.pass_end())
            .max()
            .unwrap_or(now)
            .max(now);
        self.tokens.release(id, not_before);
    }
}
