//! The responses one server keeps for `previous_response_id` and `GET /v1/responses/{id}`: each
//! stored response holds its own turn (the input messages it was given and its output, as the
//! conversation's history renders it) and a link to the response it continued, so a chain is
//! rebuilt by walking the links back (`Store::conversation`).
//!
//! The store is bounded twice: at most [`MAX_STORED_RESPONSES`] responses and at most
//! [`MAX_STORE_BYTES`] bytes of their text (the turns' messages and the response objects);
//! storing beyond either drops the oldest first. A chain is walked at most [`MAX_CHAIN_DEPTH`]
//! links back. Ids are made by the server and a response can only continue one stored before
//! it, so a chain never has a cycle; the depth cap bounds the walk all the same.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::text::ChatMessage;

/// Responses one store keeps at most; storing one more drops the oldest.
pub const MAX_STORED_RESPONSES: usize = 10_000;

/// Bytes of text one store keeps at most (the turns' messages and the response objects, plus
/// `ENTRY_OVERHEAD_BYTES` each); storing beyond drops the oldest responses. A response
/// larger than this alone is answered but not stored.
pub const MAX_STORE_BYTES: usize = 64 << 20;

/// Links a `previous_response_id` chain is followed back at most (a longer chain is a 400
/// naming `previous_response_id`).
pub const MAX_CHAIN_DEPTH: usize = 1024;

/// What one stored response costs beside its text: its id, its place in the order and its
/// messages' headers, counted against [`MAX_STORE_BYTES`].
const ENTRY_OVERHEAD_BYTES: usize = 256;

/// One stored response.
#[derive(Debug)]
pub(crate) struct Stored {
    /// The response it continued (`previous_response_id`).
    pub previous: Option<String>,
    /// Its turn of the conversation: the input messages it was given, then its output as an
    /// assistant message (reasoning dropped, as chat templates drop it from history).
    pub turn: Vec<ChatMessage>,
    /// The response object, serialized (what `GET /v1/responses/{id}` answers).
    pub response: String,
}

impl Stored {
    /// What it counts against [`MAX_STORE_BYTES`].
    fn bytes(&self, id: &str) -> usize {
        let turn: usize = self.turn.iter().map(|m| m.content.len() + 16).sum();
        ENTRY_OVERHEAD_BYTES
            + id.len()
            + self.previous.as_ref().map_or(0, String::len)
            + turn
            + self.response.len()
    }
}

/// Why a chain could not be rebuilt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChainError {
    /// The id given is not stored (never was, was not stored, deleted or dropped).
    #[error("not found")]
    NotFound,
    /// An earlier response of the chain is no longer stored.
    #[error("an earlier response of its chain ({0}) is no longer stored")]
    Broken(String),
    /// The chain runs more than [`MAX_CHAIN_DEPTH`] links back.
    #[error("its chain runs more than {MAX_CHAIN_DEPTH} responses back")]
    TooDeep,
}

/// The bounds of a store (the constants above, smaller in tests).
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreCaps {
    /// Responses at most.
    pub responses: usize,
    /// Bytes at most.
    pub bytes: usize,
}

impl Default for StoreCaps {
    fn default() -> Self {
        StoreCaps {
            responses: MAX_STORED_RESPONSES,
            bytes: MAX_STORE_BYTES,
        }
    }
}

/// The stored responses of one server (one per [`crate::api::app`]: in a fleet, each worker
/// keeps its own, as each vLLM process does).
#[derive(Debug, Default)]
pub(crate) struct Store {
    caps: StoreCaps,
    /// A std Mutex: every section is a few map operations, never across an `.await`.
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// By id: the response and its number in `order`.
    entries: HashMap<String, (u64, Arc<Stored>)>,
    /// Ids by storing order, oldest first: what is dropped first.
    order: BTreeMap<u64, String>,
    /// Next storing number.
    next: u64,
    /// Bytes held, as [`Stored::bytes`] counts them.
    bytes: usize,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Arc<Stored>> {
        let (number, stored) = self.entries.remove(id)?;
        self.order.remove(&number);
        self.bytes = self.bytes.saturating_sub(stored.bytes(id));
        Some(stored)
    }
}

impl Store {
    /// An empty store with these bounds.
    #[cfg(test)]
    pub(crate) fn with_caps(caps: StoreCaps) -> Store {
        Store {
            caps,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `stored` under `id`, dropping the oldest responses until both bounds hold; false
    /// when it is too large to be stored at all.
    pub(crate) fn insert(&self, id: String, stored: Stored) -> bool {
        let bytes = stored.bytes(&id);
        if bytes > self.caps.bytes || self.caps.responses == 0 {
            return false;
        }
        let mut inner = self.lock();
        inner.remove(&id);
        while inner.entries.len() >= self.caps.responses
            || inner.bytes.saturating_add(bytes) > self.caps.bytes
        {
            let Some(oldest) = inner.order.values().next().cloned() else {
                break;
            };
            inner.remove(&oldest);
        }
        let number = inner.next;
        inner.next += 1;
        inner.order.insert(number, id.clone());
        inner.entries.insert(id, (number, Arc::new(stored)));
        inner.bytes += bytes;
        true
    }

    /// The stored response `id`.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Stored>> {
        self.lock().entries.get(id).map(|(_, s)| Arc::clone(s))
    }

    /// Deletes `id`; false when it was not stored.
    pub(crate) fn remove(&self, id: &str) -> bool {
        self.lock().remove(id).is_some()
    }

    /// The conversation that `id` ends: every turn of its chain, oldest first.
    pub(crate) fn conversation(&self, id: &str) -> Result<Vec<ChatMessage>, ChainError> {
        let chain = {
            let inner = self.lock();
            let mut chain = Vec::new();
            let mut next = Some(id.to_string());
            while let Some(at) = next {
                if chain.len() == MAX_CHAIN_DEPTH {
                    return Err(ChainError::TooDeep);
                }
                let Some((_, stored)) = inner.entries.get(&at) else {
                    return Err(if chain.is_empty() {
                        ChainError::NotFound
                    } else {
                        ChainError::Broken(at)
                    });
                };
                next = stored.previous.clone();
                chain.push(Arc::clone(stored));
            }
            chain
        };
        Ok(chain
            .iter()
            .rev()
            .flat_map(|s| s.turn.iter().cloned())
            .collect())
    }

    /// Responses and bytes held.
    #[cfg(test)]
    fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    /// Checks the bookkeeping: the order and the map hold the same ids, the bytes add up and
    /// both bounds hold.
    #[cfg(test)]
    fn assert_invariants(&self) {
        let inner = self.lock();
        assert_eq!(inner.order.len(), inner.entries.len());
        for (number, id) in &inner.order {
            assert_eq!(inner.entries.get(id).map(|(n, _)| *n), Some(*number));
        }
        let bytes: usize = inner.entries.iter().map(|(id, (_, s))| s.bytes(id)).sum();
        assert_eq!(bytes, inner.bytes);
        assert!(inner.entries.len() <= self.caps.responses);
        assert!(inner.bytes <= self.caps.bytes);
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::text::Role;

    fn stored(previous: Option<&str>, text: &str) -> Stored {
        Stored {
            previous: previous.map(str::to_string),
            turn: vec![
                ChatMessage::new(Role::User, text),
                ChatMessage::new(Role::Assistant, format!("re {text}")),
            ],
            response: "{}".into(),
        }
    }

    #[test]
    fn chains_rebuild_oldest_first_and_report_what_is_missing() {
        let store = Store::default();
        assert!(store.insert("a".into(), stored(None, "one")));
        assert!(store.insert("b".into(), stored(Some("a"), "two")));
        let texts: Vec<String> = store
            .conversation("b")
            .expect("stored")
            .into_iter()
            .map(|m| m.content)
            .collect();
        assert_eq!(texts, ["one", "re one", "two", "re two"]);
        assert_eq!(store.conversation("c"), Err(ChainError::NotFound));
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!(store.conversation("b"), Err(ChainError::Broken("a".into())));
        store.assert_invariants();
    }

    #[test]
    fn the_oldest_are_dropped_past_either_cap() {
        let store = Store::with_caps(StoreCaps {
            responses: 3,
            bytes: usize::MAX,
        });
        for id in ["a", "b", "c", "d"] {
            assert!(store.insert(id.into(), stored(None, id)));
            store.assert_invariants();
        }
        assert!(store.get("a").is_none());
        assert!(store.get("b").is_some() && store.get("d").is_some());
        let one = stored(None, "x").bytes("x");
        let store = Store::with_caps(StoreCaps {
            responses: 100,
            bytes: 2 * one,
        });
        for id in ["w", "x", "y"] {
            assert!(store.insert(id.into(), stored(None, "x")));
            store.assert_invariants();
        }
        assert_eq!(store.usage(), (2, 2 * one));
        assert!(store.get("w").is_none() && store.get("x").is_some());
        // Too large to be stored at all: nothing is dropped for it.
        assert!(!store.insert("z".into(), stored(None, &"x".repeat(3 * one))));
        assert_eq!(store.usage(), (2, 2 * one));
    }

    #[test]
    fn deep_chains_stop_at_the_cap() {
        let store = Store::default();
        assert!(store.insert("0".into(), stored(None, "t")));
        for i in 1..=MAX_CHAIN_DEPTH {
            let previous = (i - 1).to_string();
            assert!(store.insert(i.to_string(), stored(Some(&previous), "t")));
        }
        let last = MAX_CHAIN_DEPTH - 1;
        assert_eq!(
            store.conversation(&last.to_string()).map(|c| c.len()),
            Ok(2 * MAX_CHAIN_DEPTH)
        );
        assert_eq!(
            store.conversation(&MAX_CHAIN_DEPTH.to_string()),
            Err(ChainError::TooDeep)
        );
    }

    #[test]
    fn invariants_hold_on_many_operations() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let store = Store::with_caps(StoreCaps {
            responses: 20,
            bytes: 40 * 300,
        });
        for _ in 0..2000 {
            let id = rng.gen_range(0..60).to_string();
            match rng.gen_range(0..3) {
                0 => {
                    store.remove(&id);
                }
                _ => {
                    let text = "w".repeat(rng.gen_range(0..200));
                    assert!(store.insert(id, stored(None, &text)));
                }
            }
            store.assert_invariants();
        }
    }
}
