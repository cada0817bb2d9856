//! A rank's replay buffer: the batches it published lately, kept for the replay socket, and
//! the answer to a replay request.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Bytes;

use super::view::{PublishedView, ViewDelta};
use super::END_OF_REPLAY;

/// The batches a rank published lately, for replay. A `std` mutex: held only to push or copy,
/// never across an await.
pub(super) type ReplayBuffer = Arc<Mutex<ReplayState>>;

/// A rank's replay buffer and the view its replayed batches are announced to.
#[derive(Debug, Default)]
pub(super) struct ReplayState {
    /// The latest batches, oldest first: number, payload, and what it announces (with a view).
    pub(super) batches: VecDeque<(u64, Bytes, Option<Arc<ViewDelta>>)>,
    /// The view a batch served here is applied to if it was never sent live.
    pub(super) view: Option<Arc<PublishedView>>,
}

/// Empties a restarted rank's replay buffer; its view forgets the batches it waited for.
pub(super) fn empty_replay(replay: &ReplayBuffer, rank: usize) {
    // Short section, no await.
    let mut replay = replay.lock().unwrap_or_else(PoisonError::into_inner);
    replay.batches.clear();
    if let Some(view) = &replay.view {
        view.restarted(rank);
    }
}

/// The answer to a replay request `[start_seq]` (DEALER) or `[empty, start_seq]` (REQ):
/// every buffered batch with `seq >= start_seq` as `[(empty,) seq, payload]`, then the end
/// marker. Anything else gets no answer. A served batch that was never sent live is applied
/// to the view of `rank`.
pub(super) fn replay_answer(
    buffer: &ReplayBuffer,
    rank: usize,
    request: &[Bytes],
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
        let wanted: Vec<_> = buffer
            .batches
            .iter()
            .filter(|(s, _, _)| *s >= start)
            .cloned()
            .collect();
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
    answer.push(envelope(Bytes::from_static(&END_OF_REPLAY), Bytes::new()));
    answer
}
