//! vLLM's KV-event batch ([`WireBatch`]) and its MessagePack encodings ([`WireFormat`]): the
//! array form (structs as arrays in field order, an event's tag first) that Dynamo's
//! standalone indexer and llm-d-inference-sim read by default, the map form of current vLLM
//! (structs as maps, the tag under `"type"`), and the batch as an array of events as maps,
//! which vllm-router 0.1.17's `kv_aware` policy decodes.

use clap::ValueEnum;
use serde::Serialize;

/// The medium every simulated block lives in.
pub const MEDIUM_GPU: &str = "GPU";

/// How a batch is encoded in MessagePack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum WireFormat {
    /// Structs as arrays in field order, an event's tag string first (vLLM until mid-2026;
    /// what Dynamo 1.6.1's standalone indexer decodes).
    #[default]
    Array,
    /// Structs as maps keyed by field name, an event's tag under `"type"` (current vLLM).
    Map,
    /// The batch as an array (`[ts, events, rank]`), each event a map with its tag under
    /// `"type"`: what vllm-router 0.1.17's `kv_aware` policy decodes (it refuses both other
    /// forms).
    MapEvents,
}

/// One KV event as vLLM publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type")]
pub enum WireEvent {
    /// Blocks now cached, in prefix order.
    BlockStored {
        /// Producer hashes of the stored blocks (the engine's sequence hashes).
        block_hashes: Vec<u64>,
        /// Hash of the block before the first stored one; None at the start of a sequence.
        parent_block_hash: Option<u64>,
        /// The tokens of every stored block, in order: `block_hashes.len() * block_size`.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: usize,
        /// The LoRA adapter's id, None for the base model.
        lora_id: Option<u64>,
        /// Where the blocks live (`"GPU"`).
        medium: Option<&'static str>,
        /// The LoRA adapter's name, None for the base model.
        lora_name: Option<String>,
    },
    /// Blocks evicted.
    BlockRemoved {
        /// Hashes of blocks stored earlier.
        block_hashes: Vec<u64>,
        /// Where they lived.
        medium: Option<&'static str>,
    },
    /// The whole cache was dropped.
    AllBlocksCleared,
}

/// One batch: the events of one engine step of one data-parallel rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WireBatch {
    /// Unix time in seconds when the step ended.
    pub ts: f64,
    /// The events, in the order the engine emitted them.
    pub events: Vec<WireEvent>,
    /// The data-parallel rank (the simulated worker).
    pub data_parallel_rank: Option<u32>,
}

impl WireBatch {
    /// The MessagePack payload of this batch.
    pub fn encode(&self, format: WireFormat) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 8 * self.events.len());
        let mut e = Encoder {
            out: &mut out,
            format,
            keyed: false,
        };
        e.batch(self);
        out
    }
}

/// Writes MessagePack into a `Vec`, which cannot fail: the `rmp` results are infallible here.
struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    format: WireFormat,
    /// The struct being written is a map: its fields are keyed.
    keyed: bool,
}

impl Encoder<'_> {
    /// Whether the format writes a batch (`event` false) or an event as a map.
    fn as_map(&self, event: bool) -> bool {
        match self.format {
            WireFormat::Array => false,
            WireFormat::Map => true,
            WireFormat::MapEvents => event,
        }
    }

    /// A struct header (an event's when it has a tag): an array of `fields.len()` (+1 for a
    /// tag) or a map of as many entries.
    fn start(&mut self, tag: Option<&str>, len: usize) {
        let with_tag = len + usize::from(tag.is_some());
        self.keyed = self.as_map(tag.is_some());
        match self.keyed {
            false => {
                let _ = rmp::encode::write_array_len(self.out, with_tag as u32);
                if let Some(tag) = tag {
                    self.str(tag);
                }
            }
            true => {
                let _ = rmp::encode::write_map_len(self.out, with_tag as u32);
                if let Some(tag) = tag {
                    self.str("type");
                    self.str(tag);
                }
            }
        }
    }

    /// A field's key (in a map only).
    fn key(&mut self, name: &str) {
        if self.keyed {
            self.str(name);
        }
    }

    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(self.out, s);
    }

    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(self.out, v);
    }

    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(self.out);
    }

    fn opt_uint(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }

    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(v) => self.str(v),
            None => self.nil(),
        }
    }

    fn uints(&mut self, vs: impl ExactSizeIterator<Item = u64>) {
        let _ = rmp::encode::write_array_len(self.out, vs.len() as u32);
        for v in vs {
            self.uint(v);
        }
    }

    fn batch(&mut self, b: &WireBatch) {
        self.start(None, 3);
        self.key("ts");
        let _ = rmp::encode::write_f64(self.out, b.ts);
        self.key("events");
        let _ = rmp::encode::write_array_len(self.out, b.events.len() as u32);
        for event in &b.events {
            self.event(event);
        }
        // Back in the batch after its events.
        self.keyed = self.as_map(false);
        self.key("data_parallel_rank");
        self.opt_uint(b.data_parallel_rank.map(u64::from));
    }

    fn event(&mut self, event: &WireEvent) {
        match event {
            WireEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
            } => {
                self.start(Some("BlockStored"), 7);
                self.key("block_hashes");
                self.uints(block_hashes.iter().copied());
                self.key("parent_block_hash");
                self.opt_uint(*parent_block_hash);
                self.key("token_ids");
                self.uints(token_ids.iter().map(|&t| u64::from(t)));
                self.key("block_size");
                self.uint(*block_size as u64);
                self.key("lora_id");
                self.opt_uint(*lora_id);
                self.key("medium");
                self.opt_str(*medium);
                self.key("lora_name");
                self.opt_str(lora_name.as_deref());
            }
            WireEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                self.start(Some("BlockRemoved"), 2);
                self.key("block_hashes");
                self.uints(block_hashes.iter().copied());
                self.key("medium");
                self.opt_str(*medium);
            }
            WireEvent::AllBlocksCleared => self.start(Some("AllBlocksCleared"), 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> WireBatch {
        WireBatch {
            ts: 1.5,
            events: vec![
                WireEvent::BlockStored {
                    block_hashes: vec![1, 300],
                    parent_block_hash: None,
                    token_ids: vec![5, 6, 7, 8],
                    block_size: 2,
                    lora_id: None,
                    medium: Some(MEDIUM_GPU),
                    lora_name: None,
                },
                WireEvent::BlockRemoved {
                    block_hashes: vec![u64::MAX],
                    medium: Some(MEDIUM_GPU),
                },
                WireEvent::AllBlocksCleared,
            ],
            data_parallel_rank: Some(3),
        }
    }

    #[test]
    fn array_form_bytes_are_vllms() {
        let bytes = batch().encode(WireFormat::Array);
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&1.5f64.to_be_bytes());
        want.push(0x93); // three events
        want.extend_from_slice(&[0x98, 0xab]);
        want.extend_from_slice(b"BlockStored");
        want.extend_from_slice(&[0x92, 0x01, 0xcd, 0x01, 0x2c]); // [1, 300]
        want.push(0xc0); // parent: nil
        want.extend_from_slice(&[0x94, 5, 6, 7, 8, 0x02, 0xc0, 0xa3]);
        want.extend_from_slice(b"GPU");
        want.push(0xc0);
        want.extend_from_slice(&[0x93, 0xac]);
        want.extend_from_slice(b"BlockRemoved");
        want.extend_from_slice(&[0x91, 0xcf]);
        want.extend_from_slice(&u64::MAX.to_be_bytes());
        want.push(0xa3);
        want.extend_from_slice(b"GPU");
        want.extend_from_slice(&[0x91, 0xb0]);
        want.extend_from_slice(b"AllBlocksCleared");
        want.push(0x03);
        assert_eq!(bytes, want);
    }

    #[test]
    fn map_form_names_every_field() {
        let bytes = batch().encode(WireFormat::Map);
        assert_eq!(bytes[0], 0x83, "a map of ts, events, data_parallel_rank");
        let text = String::from_utf8_lossy(&bytes);
        for key in [
            "ts",
            "events",
            "data_parallel_rank",
            "type",
            "block_hashes",
            "parent_block_hash",
            "token_ids",
            "block_size",
            "lora_id",
            "medium",
            "lora_name",
        ] {
            assert!(text.contains(key), "{key} missing");
        }
    }

    #[test]
    fn map_events_form_is_an_array_batch_of_tagged_maps() {
        let bytes = batch().encode(WireFormat::MapEvents);
        let value = rmpv::decode::read_value(&mut &bytes[..]).expect("MessagePack");
        let batch = value.as_array().expect("the batch is an array");
        assert_eq!(batch.len(), 3);
        assert_eq!(batch[0].as_f64(), Some(1.5));
        assert_eq!(batch[2].as_u64(), Some(3));
        let events = batch[1].as_array().expect("events");
        let field = |event: &rmpv::Value, key: &str| {
            event
                .as_map()
                .expect("an event is a map")
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            field(&events[0], "type").and_then(|t| t.as_str().map(String::from)),
            Some("BlockStored".into())
        );
        let tokens = field(&events[0], "token_ids").expect("token_ids");
        assert_eq!(tokens.as_array().map(Vec::len), Some(4));
        assert_eq!(
            field(&events[2], "type").and_then(|t| t.as_str().map(String::from)),
            Some("AllBlocksCleared".into())
        );
        // The other forms are unchanged by it.
        assert_eq!(batch_bytes_head(WireFormat::Array), 0x93);
        assert_eq!(batch_bytes_head(WireFormat::Map), 0x83);
    }

    fn batch_bytes_head(format: WireFormat) -> u8 {
        batch().encode(format)[0]
    }

    #[test]
    fn json_carries_the_tag_under_type() {
        let json = serde_json::to_value(batch()).expect("serializes");
        assert_eq!(json["events"][0]["type"], "BlockStored");
        assert_eq!(
            json["events"][0]["token_ids"],
            serde_json::json!([5, 6, 7, 8])
        );
        assert_eq!(
            json["events"][2],
            serde_json::json!({"type": "AllBlocksCleared"})
        );
        assert_eq!(json["data_parallel_rank"], 3);
    }
}
