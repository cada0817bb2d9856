//! A rank's replay buffer: the batches it published lately (at most [`REPLAY_BUFFER`] of them
//! and [`REPLAY_BUFFER_BYTES`] of payload), kept for the replay socket, and the answer to a
//! replay request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;

use super::view::{PublishedView, ViewDelta};
use super::{END_OF_REPLAY, REPLAY_BUFFER, REPLAY_BUFFER_BYTES};

/// The batches a rank published lately, for replay. A `std` mutex: held only to push or copy,
/// never across an await.
pub(super) type ReplayBuffer = Arc<Mutex<ReplayState>>;

/// A rank's replay buffer and the view its replayed batches are announced to.
#[derive(Debug, Default)]
pub(super) struct ReplayState {
    /// The latest batches, oldest first: number, payload, and what it announces (with a view).
    batches: VecDeque<(u64, Bytes, Option<Arc<ViewDelta>>)>,
    /// Bytes of the payloads in `batches`, and of what they announce.
    bytes: usize,
    /// The view a batch served here is applied to if it was never sent live.
    pub(super) view: Option<Arc<PublishedView>>,
}

impl ReplayState {
    /// Keeps batch `seq`, dropping the oldest while more than [`REPLAY_BUFFER`] batches or
    /// [`REPLAY_BUFFER_BYTES`] (payloads and what they announce to the view) are kept (the
    /// newest stays, whatever its size).
    pub(super) fn push(&mut self, seq: u64, payload: Bytes, delta: Option<Arc<ViewDelta>>) {
        self.bytes += held_bytes(&payload, delta.as_deref());
        self.batches.push_back((seq, payload, delta));
        while self.batches.len() > REPLAY_BUFFER
            || (self.bytes > REPLAY_BUFFER_BYTES && self.batches.len() > 1)
        {
            if let Some((_, payload, delta)) = self.batches.pop_front() {
                self.bytes -= held_bytes(&payload, delta.as_deref());
            }
        }
    }

    /// Batches kept and the bytes they hold.
    pub(super) fn size(&self) -> (usize, usize) {
        (self.batches.len(), self.bytes)
    }
}

/// Bytes a kept batch holds: its payload and what it announces to the view.
fn held_bytes(payload: &Bytes, delta: Option<&ViewDelta>) -> usize {
    payload.len() + delta.map_or(0, ViewDelta::heap_bytes)
}

/// How many replies a request gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Replies {
    /// Every wanted batch, then the end marker (vLLM's answer; for DEALER and ROUTER peers).
    All,
    /// Exactly one: the first wanted batch, or the end marker when there is none (for REQ
    /// peers, which take one reply per request and ask again from the next number).
    One,
}

/// Empties a restarted rank's replay buffer; its view forgets the batches it waited for.
pub(super) fn empty_replay(replay: &ReplayBuffer, rank: usize) {
    // Short section, no await.
    let mut replay = replay.lock().unwrap_or_else(PoisonError::into_inner);
    replay.batches.clear();
    replay.bytes = 0;
    if let Some(view) = &replay.view {
        view.restarted(rank);
    }
}

/// The answer to a replay request `[start_seq]` (DEALER) or `[empty, start_seq]` (REQ, or a
/// DEALER that adds the delimiter as vLLM's ROUTER expects): every buffered batch with
/// `seq >= start_seq` as `[(empty,) seq, payload]`, then the end marker; with
/// [`Replies::One`], only the first of those messages. Anything else gets no answer. A served
/// batch that was never sent live is applied to the view of `rank`.
pub(super) fn replay_answer(
    buffer: &ReplayBuffer,
    rank: usize,
    request: &[Bytes],
    replies: Replies,
) -> Vec<Vec<Bytes>> {
    let (delimiter, start) = match request {
        [start] => (false, start),
        [empty, start] if empty.is_empty() => (true, start),
        _ => return Vec::new(),
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
        return Vec::new();
    };
    let start = u64::from_be_bytes(start);
    let envelope = |seq: Bytes, payload: Bytes| {
        let mut frames = Vec::with_capacity(3);
        if delimiter {
            frames.push(Bytes::new());
        }
        frames.push(seq);
        frames.push(payload);
        frames
    };
    // Short section, no await: copy out the wanted batches (shared bytes, not copies).
    let (wanted, view) = {
        let buffer = buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let wanted = buffer.batches.iter().filter(|(s, _, _)| *s >= start);
        let wanted: Vec<_> = match replies {
            Replies::All => wanted.cloned().collect(),
            Replies::One => wanted.take(1).cloned().collect(),
        };
        (wanted, buffer.view.clone())
    };
    let mut answer = Vec::with_capacity(wanted.len() + 1);
    for (seq, payload, delta) in wanted {
        if let (Some(view), Some(delta)) = (&view, &delta) {
            view.replayed(rank, seq, delta);
        }
        answer.push(envelope(
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ));
    }
    if answer.is_empty() || replies == Replies::All {
        answer.push(envelope(Bytes::from_static(&END_OF_REPLAY), Bytes::new()));
    }
    answer
}
