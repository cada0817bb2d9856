//! [`Prepared`]: the engine requests of a replay's turns, built ahead of their arrival.
//!
//! Hashing a turn's prompt (its local and sequence hashes, a few microseconds for a long
//! prompt) is up to a tenth of the replay's own work, and it needs nothing of the cluster: a
//! thread with idle time (the metrics collector's own) builds the requests of the turns about
//! to arrive, and the replay takes them when they do. First turns are built a window ahead in
//! order of arrival; a later turn is asked for when its previous turn ends (it arrives after its
//! delay). Nothing ever waits for that thread: a turn that arrives before its request is ready
//! is built on the replay's thread, which claims it, so the thread skips it if it has not started
//! it yet (and the replay drops its copy if it has). A request is the same whichever thread
//! builds it, so the replay's results do not depend on timing.
//!
//! Where the second thread is the KV router's, which has no time to spare, the replay builds
//! the requests ahead itself, one at a time while it waits for a routing decision
//! ([`Prepared::build_in_waits`]), so that building them no longer adds to its own time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};

use crate::indexer::FxHashMap;
use crate::request::EngineRequest;
use crate::trace::{LocalHashCache, Trace, TraceRequest};

use super::engine_request;

/// A job for the thread that builds requests.
pub(super) type Job = Box<dyn FnOnce() + Send>;

/// Posts a job to that thread; false when the thread is gone (the job was dropped unrun).
pub(super) type Post = Box<dyn Fn(Job) -> bool>;

/// First turns asked for ahead of the arrivals taken so far.
const WINDOW: usize = 64;
/// First turns asked for in one job (when the window has this much room).
const BATCH: usize = 16;

/// The engine requests of a trace's turns, built ahead where a thread has time for it.
pub(super) struct Prepared<'a> {
    trace: &'a Trace,
    trace_block_size: usize,
    /// Posts to the building thread; None builds every request here.
    post: Option<Post>,
    /// Per session, the slot of its first turn (a turn's slot: that plus its index).
    offsets: Vec<usize>,
    /// Per slot: started by the thread, or claimed by the replay when it built the request
    /// itself (the thread then skips it).
    claims: Arc<[AtomicBool]>,
    /// Per slot: taken by the replay (a request built for it later is dropped).
    taken: Vec<bool>,
    /// The thread's own memo of block hashes.
    thread_cache: Arc<Mutex<LocalHashCache>>,
    /// Requests the thread built, by slot, as they come back.
    built: mpsc::Receiver<(usize, EngineRequest)>,
    /// The sender each job clones.
    send: mpsc::Sender<(usize, EngineRequest)>,
    /// Built requests not yet taken, by slot.
    ready: FxHashMap<usize, EngineRequest>,
    /// Sessions by first arrival (ties by index, the order they arrive in).
    firsts: Vec<usize>,
    /// First turns asked for, and taken, so far (prefixes of `firsts`).
    firsts_asked: usize,
    firsts_taken: usize,
    /// Turns to ask for in the next job: (slot, the turn's prompt and lengths).
    pending: Vec<(usize, TraceRequest)>,
    /// Where no thread builds requests but the replay waits for the KV router's: the turns
    /// asked for, as (slot, session, turn), to build in those waits ([`Prepared::build_ahead`]).
    upcoming: Option<VecDeque<(usize, usize, usize)>>,
}

impl<'a> Prepared<'a> {
    /// Requests for `trace`'s turns, built ahead through `post` when given.
    pub(super) fn new(
        trace: &'a Trace,
        trace_block_size: usize,
        block_size: usize,
        post: Option<Post>,
    ) -> Prepared<'a> {
        let mut offsets = Vec::with_capacity(trace.sessions.len());
        let mut slots = 0;
        for session in &trace.sessions {
            offsets.push(slots);
            slots += session.turns.len();
        }
        let mut firsts: Vec<usize> = (0..trace.sessions.len())
            .filter(|&s| !trace.sessions[s].turns.is_empty())
            .collect();
        firsts.sort_by_key(|&s| (trace.sessions[s].first_arrival, s));
        let (send, built) = mpsc::channel();
        let mut prepared = Prepared {
            trace,
            trace_block_size,
            claims: (0..if post.is_some() { slots } else { 0 })
                .map(|_| AtomicBool::new(false))
                .collect(),
            post,
            offsets,
            taken: vec![false; slots],
            thread_cache: Arc::new(Mutex::new(LocalHashCache::new(block_size))),
            built,
            send,
            ready: FxHashMap::default(),
            firsts,
            firsts_asked: 0,
            firsts_taken: 0,
            pending: Vec::new(),
            upcoming: None,
        };
        prepared.refill();
        prepared.flush();
        prepared
    }

    /// Where no thread builds requests: builds them here instead, one at a time while the
    /// replay waits for the KV router's thread ([`Prepared::build_ahead`]).
    pub(super) fn build_in_waits(mut self) -> Prepared<'a> {
        if self.post.is_none() {
            self.upcoming = Some(VecDeque::new());
            self.refill();
        }
        self
    }

    /// Builds the request of the next turn asked for and not yet taken (a piece of work for a
    /// wait: see [`Prepared::build_in_waits`]); false when there is none.
    pub(super) fn build_ahead(&mut self, cache: &mut LocalHashCache) -> bool {
        let Some(upcoming) = self.upcoming.as_mut() else {
            return false;
        };
        while let Some((slot, session, turn)) = upcoming.pop_front() {
            if self.taken[slot] {
                continue;
            }
            let request = &self.trace.sessions[session].turns[turn];
            let built = engine_request(request, self.trace_block_size, cache.block_size(), cache);
            self.ready.insert(slot, built);
            return true;
        }
        false
    }

    /// Asks for `session`'s turn `turn` (it will arrive); sent with the next [`Prepared::flush`],
    /// or queued for the waits ([`Prepared::build_in_waits`]).
    pub(super) fn ask(&mut self, session: usize, turn: usize) {
        let slot = self.offsets[session] + turn;
        if let Some(upcoming) = &mut self.upcoming {
            upcoming.push_back((slot, session, turn));
        } else if self.post.is_some() {
            self.pending
                .push((slot, shape(&self.trace.sessions[session].turns[turn])));
        }
    }

    /// The request of `session`'s turn `turn`, which is arriving: built ahead, or here now
    /// (with `cache`) when it is not ready.
    pub(super) fn take(
        &mut self,
        session: usize,
        turn: usize,
        cache: &mut LocalHashCache,
    ) -> EngineRequest {
        let request = &self.trace.sessions[session].turns[turn];
        if self.post.is_none() && self.upcoming.is_none() {
            return engine_request(request, self.trace_block_size, cache.block_size(), cache);
        }
        if turn == 0 {
            self.firsts_taken += 1;
            self.refill();
        }
        let slot = self.offsets[session] + turn;
        self.taken[slot] = true;
        if let Some(built) = self.ready.remove(&slot) {
            return built;
        }
        if self.post.is_some() {
            while let Ok((k, built)) = self.built.try_recv() {
                if k == slot {
                    return built;
                }
                if !self.taken[k] {
                    self.ready.insert(k, built);
                }
            }
            // Not ready: built here, and the thread skips it if it has not started it.
            self.claims[slot].store(true, Ordering::Relaxed);
        }
        engine_request(request, self.trace_block_size, cache.block_size(), cache)
    }

    /// Asks for first turns up to the window ahead of those taken.
    fn refill(&mut self) {
        if (self.post.is_none() && self.upcoming.is_none())
            || self.firsts_asked >= self.firsts_taken + WINDOW - BATCH
        {
            return;
        }
        let end = (self.firsts_taken + WINDOW).min(self.firsts.len());
        for i in self.firsts_asked..end {
            let session = self.firsts[i];
            self.ask(session, 0);
        }
        self.firsts_asked = end.max(self.firsts_asked);
    }

    /// Sends the turns asked for since the last flush to the thread as one job (the replay
    /// flushes once per instant).
    pub(super) fn flush(&mut self) {
        let Some(post) = &self.post else {
            return;
        };
        if self.pending.is_empty() {
            return;
        }
        let turns = std::mem::take(&mut self.pending);
        let claims = Arc::clone(&self.claims);
        let cache = Arc::clone(&self.thread_cache);
        let send = self.send.clone();
        let trace_block_size = self.trace_block_size;
        let job = Box::new(move || {
            let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
            let block_size = cache.block_size();
            for (slot, turn) in turns {
                if claims[slot].swap(true, Ordering::Relaxed) {
                    continue;
                }
                let built = engine_request(&turn, trace_block_size, block_size, &mut cache);
                if send.send((slot, built)).is_err() {
                    return;
                }
            }
        });
        if !post(job) {
            // The thread is gone: everything is built here from now on.
            self.post = None;
        }
    }
}

/// What building a turn's request reads of it: its prompt and lengths.
fn shape(turn: &TraceRequest) -> TraceRequest {
    TraceRequest {
        line: turn.line,
        request_id: None,
        input_length: turn.input_length,
        requested_input_length: None,
        output_length: turn.output_length,
        hash_ids: turn.hash_ids.clone(),
        delay: turn.delay,
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::side_thread::{Offloaded, Wait};
    use crate::trace::{parse, TraceOptions};

    /// A trace of `sessions` sessions of 1 to 4 turns, prompts of 1 to 12 trace blocks whose
    /// last block is often partial, and shared leading hash ids.
    fn trace(seed: u64, sessions: usize, trace_block_size: usize) -> Trace {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut text = String::new();
        for s in 0..sessions {
            for t in 0..rng.gen_range(1..=4) {
                let blocks = rng.gen_range(1..=12usize);
                let shared = rng.gen_range(0..=blocks);
                let ids: Vec<String> = (0..blocks)
                    .map(|b| if b < shared { b } else { 1000 * s + 10 * t + b })
                    .map(|id| id.to_string())
                    .collect();
                let input = blocks * trace_block_size - rng.gen_range(0..trace_block_size);
                text.push_str(&format!(
                    "{{\"session_id\": {s}, \"timestamp\": {}, \"input_length\": {input}, \
                     \"output_length\": 2, \"hash_ids\": [{}]}}\n",
                    rng.gen_range(0..50) + 100 * t,
                    ids.join(", ")
                ));
            }
        }
        let opts = TraceOptions {
            trace_block_size,
            arrival_speedup_ratio: 1.0,
        };
        parse(text.as_bytes(), "test.jsonl", &opts).expect("the generated trace parses")
    }

    /// Waits until the thread has run every job posted before.
    fn barrier(thread: &Offloaded<()>) {
        let (done, wait) = mpsc::channel();
        thread.post(move |()| {
            let _ = done.send(());
        });
        wait.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the thread runs its jobs");
    }

    /// The order a replay takes turns in: first turns in order of arrival, and a session's next
    /// turn, asked for when its turn is taken, at a seeded random point after that.
    struct TakeOrder {
        firsts: std::vec::IntoIter<usize>,
        later: Vec<(usize, usize)>,
    }

    impl TakeOrder {
        fn new(prepared: &Prepared<'_>) -> TakeOrder {
            TakeOrder {
                firsts: prepared.firsts.clone().into_iter(),
                later: Vec::new(),
            }
        }

        /// The next (session, turn) to take; None once every turn is taken.
        fn next(&mut self, rng: &mut ChaCha8Rng) -> Option<(usize, usize)> {
            if !self.later.is_empty() && rng.gen_bool(0.5) {
                return Some(self.later.remove(rng.gen_range(0..self.later.len())));
            }
            self.firsts
                .next()
                .map(|s| (s, 0))
                .or_else(|| self.later.pop())
        }

        /// `session`'s turn `turn` was taken: its next turn is asked for and will come.
        fn taken(&mut self, prepared: &mut Prepared<'_>, session: usize, turn: usize) {
            if turn + 1 < prepared.trace.sessions[session].turns.len() {
                prepared.ask(session, turn + 1);
                self.later.push((session, turn + 1));
            }
        }
    }

    /// Takes `session`'s turn `turn` as the replay does and checks that the request equals the
    /// one built directly (with `direct`); true when it had been built ahead.
    fn take_and_check(
        prepared: &mut Prepared<'_>,
        cache: &mut LocalHashCache,
        direct: &mut LocalHashCache,
        (session, turn): (usize, usize),
        seed: u64,
    ) -> bool {
        let ahead = prepared
            .ready
            .contains_key(&(prepared.offsets[session] + turn));
        let taken = prepared.take(session, turn, cache);
        let request = &prepared.trace.sessions[session].turns[turn];
        let expected = engine_request(
            request,
            prepared.trace_block_size,
            direct.block_size(),
            direct,
        );
        assert_eq!(
            format!("{taken:?}"),
            format!("{expected:?}"),
            "seed {seed}: session {session} turn {turn}"
        );
        ahead
    }

    /// Takes every turn as a replay would (first turns in order of arrival, a session's next
    /// turn asked for when its turn is taken), in a seeded order, with the thread now behind
    /// and now caught up; every request equals the one built directly.
    #[test]
    fn requests_are_the_same_whichever_thread_builds_them() {
        // An engine block size that divides the trace's (hashes memoised per hash id) and one
        // that does not (prompts synthesized).
        for (seed, block_size) in [(1, 16), (2, 16), (3, 24), (4, 64)] {
            let trace_block_size = 64;
            let trace = trace(seed, 300, trace_block_size);
            let thread = Offloaded::new("test-prepare", (), Wait::Block)
                .unwrap_or_else(|(e, _)| panic!("thread: {e}"));
            let beside = thread.beside().expect("a live thread");
            let post: Post = Box::new(move |job| beside.post(job));
            let mut prepared = Prepared::new(&trace, trace_block_size, block_size, Some(post));
            let mut cache = LocalHashCache::new(block_size);
            let mut direct = LocalHashCache::new(block_size);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut order = TakeOrder::new(&prepared);
            let (mut ahead, mut here) = (0, 0);
            while let Some((session, turn)) = order.next(&mut rng) {
                if rng.gen_bool(0.3) {
                    prepared.flush();
                    barrier(&thread);
                }
                while let Ok((k, built)) = prepared.built.try_recv() {
                    if !prepared.taken[k] {
                        prepared.ready.insert(k, built);
                    }
                }
                if take_and_check(
                    &mut prepared,
                    &mut cache,
                    &mut direct,
                    (session, turn),
                    seed,
                ) {
                    ahead += 1;
                } else {
                    here += 1;
                }
                order.taken(&mut prepared, session, turn);
            }
            assert!(prepared.taken.iter().all(|&t| t), "every turn was taken");
            assert!(
                ahead > 100 && here > 10,
                "both ways were used: {ahead} / {here}"
            );
            // Whatever the thread still builds is for turns taken already.
            prepared.flush();
            barrier(&thread);
            assert!(prepared.ready.is_empty());
            assert!(prepared.built.try_iter().all(|(k, _)| prepared.taken[k]));
        }
    }

    /// Built in the replay's waits: a random number of pieces before each arrival, turns taken
    /// as a replay takes them; every request equals the one built directly, both ways are used,
    /// and nothing is left once every turn is taken.
    #[test]
    fn requests_built_in_waits_are_the_ones_built_on_arrival() {
        for (seed, block_size) in [(6, 16), (7, 24)] {
            let trace = trace(seed, 300, 64);
            let mut prepared = Prepared::new(&trace, 64, block_size, None).build_in_waits();
            let mut cache = LocalHashCache::new(block_size);
            let mut direct = LocalHashCache::new(block_size);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut order = TakeOrder::new(&prepared);
            let (mut ahead, mut here) = (0, 0);
            while let Some((session, turn)) = order.next(&mut rng) {
                for _ in 0..rng.gen_range(0..3) {
                    prepared.build_ahead(&mut cache);
                }
                if take_and_check(
                    &mut prepared,
                    &mut cache,
                    &mut direct,
                    (session, turn),
                    seed,
                ) {
                    ahead += 1;
                } else {
                    here += 1;
                }
                order.taken(&mut prepared, session, turn);
                prepared.flush();
            }
            assert!(prepared.taken.iter().all(|&t| t), "every turn was taken");
            assert!(
                ahead > 100 && here > 10,
                "both ways were used: {ahead} / {here}"
            );
            assert!(
                !prepared.build_ahead(&mut cache),
                "nothing is left to build"
            );
            assert!(prepared.ready.is_empty());
        }
    }

    #[test]
    fn without_a_thread_every_request_is_built_here() {
        let trace = trace(5, 40, 64);
        let gone: Post = Box::new(|_job| false);
        for post in [None, Some(gone)] {
            let mut prepared = Prepared::new(&trace, 64, 16, post);
            assert!(prepared.post.is_none(), "a thread that is gone is not used");
            let mut cache = LocalHashCache::new(16);
            let mut direct = LocalHashCache::new(16);
            for (s, session) in trace.sessions.iter().enumerate() {
                for (t, request) in session.turns.iter().enumerate() {
                    prepared.ask(s, t);
                    prepared.flush();
                    let taken = prepared.take(s, t, &mut cache);
                    let expected = engine_request(request, 64, 16, &mut direct);
                    assert_eq!(format!("{taken:?}"), format!("{expected:?}"));
                }
            }
        }
    }
}
