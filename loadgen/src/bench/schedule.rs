//! A plan as driver scripts: each request's lengths and body from the seed, one script per
//! open-loop arrival or per closed-loop user, and the request indices the users took.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::bench::plan::{BenchPlan, Load};
use crate::dataset::Picks;
use crate::limits;
use crate::report::replay_report::RequestInfo;
use crate::run::client::Response;
use crate::run::driver::{Planned, Script, Start};
use crate::run::prompt::PromptSynth;
use crate::run::target::{request_body, Connected};

/// Request `k`'s lengths: (unique input tokens, output tokens); with a dataset, its
/// conversation's first turn (the synthetic output length when the data has none).
fn lengths(plan: &BenchPlan, picks: Option<&Picks>, k: usize) -> (usize, usize) {
    let l = &plan.lengths;
    let lengths = servesim::trace::synthetic::request_lengths(
        l,
        plan.seed,
        k,
        limits::MAX_PROMPT_TOKENS.saturating_sub(l.shared_prefix_tokens),
        limits::MAX_OUTPUT_TOKENS,
    );
    match picks.and_then(|p| Some((p, p.get(k).turns.first()?))) {
        Some((p, turn)) => (
            turn.input_tokens,
            p.dataset().output_tokens(turn, lengths.1),
        ),
        None => lengths,
    }
}

/// The dataset's conversations in `plan`'s order, when it has a dataset.
pub(super) fn picks(plan: &BenchPlan) -> Option<Picks> {
    plan.dataset.as_ref().map(|d| Picks::new(d, plan.seed))
}

/// Builds request bodies.
struct Requests {
    plan: BenchPlan,
    /// The dataset's conversations in the plan's order (None: synthetic prompts).
    picks: Option<Picks>,
    synth: PromptSynth,
    model: String,
    /// Whether bodies ask for the serving worker.
    ask_worker_id: bool,
    /// `--lora-mix`: request k's model is `lora.model(k)`.
    lora: Option<Arc<crate::run::lora::LoraTraffic>>,
}

/// Hash-id space of the shared prefixes (unique parts use the request index).
const PREFIX_ID_BASE: u64 = 1 << 62;

/// What the report knows of request `k` of `plan`.
pub(super) fn info(plan: &BenchPlan, picks: Option<&Picks>, k: usize) -> RequestInfo {
    let (input, output) = lengths(plan, picks, k);
    RequestInfo {
        input_length: plan.lengths.shared_prefix_tokens + input,
        max_output: output,
        session: None,
        turn: 0,
        expected_reused_tokens: None,
        adapter: None,
    }
}

impl Requests {
    fn body(&self, k: usize) -> serde_json::Value {
        let (input, output) = lengths(&self.plan, self.picks.as_ref(), k);
        if let Some(turn) = self.picks.as_ref().and_then(|p| p.get(k).turns.first()) {
            return request_body(
                self.plan.api,
                &self.model,
                turn.text.clone(),
                output,
                self.ask_worker_id,
            );
        }
        let l = &self.plan.lengths;
        let mut pieces = Vec::new();
        if l.shared_prefix_tokens > 0 {
            let g = PREFIX_ID_BASE + k as u64 % l.num_prefix_groups as u64;
            pieces.extend(self.synth.filler(g, l.shared_prefix_tokens));
        }
        let unique = self.plan.seed.rotate_left(32) ^ k as u64;
        pieces.extend(self.synth.filler(unique, input));
        let model = match &self.lora {
            Some(lora) => lora.model(k),
            None => self.model.as_str(),
        };
        request_body(
            self.plan.api,
            model,
            self.synth.text(&pieces),
            output,
            self.ask_worker_id,
        )
    }
}

/// One open-loop request.
struct OneShot {
    requests: Arc<Requests>,
    k: usize,
    at: Duration,
    sent: bool,
}

impl Script for OneShot {
    fn first_start(&self) -> Duration {
        self.at
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        if std::mem::replace(&mut self.sent, true) {
            return None;
        }
        Some(Planned {
            start: Start::At(self.at),
            body: self.requests.body(self.k),
        })
    }
}

/// Request indices taken by each closed-loop user, by local user then turn: a sample's
/// request is `taken[session][turn]`. Locked only to push or read, never across an await.
pub(super) type Taken = Arc<std::sync::Mutex<Vec<Vec<usize>>>>;

/// One closed-loop user: the next request index as soon as the previous finished.
struct User {
    requests: Arc<Requests>,
    /// The counter the users of this process share (the shard's own when sharded: its `c`-th
    /// request is the global index `I + c * N`).
    next: Arc<AtomicUsize>,
    shard: Option<crate::run::shard::Shard>,
    /// Requests to send in all (None: until the duration ends).
    limit: Option<usize>,
    /// This user's local index in `taken`.
    index: usize,
    taken: Taken,
    turn: usize,
}

impl Script for User {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }
    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let c = self.next.fetch_add(1, Ordering::Relaxed);
        let k = crate::run::shard::global(self.shard, c);
        if self.limit.is_some_and(|n| k >= n) {
            return None;
        }
        let start = if self.turn == 0 {
            Start::At(Duration::ZERO)
        } else {
            Start::After(Duration::ZERO)
        };
        self.turn += 1;
        if let Ok(mut taken) = self.taken.lock() {
            if let Some(ks) = taken.get_mut(self.index) {
                ks.push(k);
            }
        }
        Some(Planned {
            start,
            body: self.requests.body(k),
        })
    }
}

/// A plan's scripts for one connected target, and what maps their samples back to request
/// indices.
pub(super) struct Schedule {
    /// The closed loop's request indices, by user then turn.
    pub(super) taken: Taken,
    /// One per session.
    pub(super) scripts: Vec<Box<dyn Script>>,
}

impl Schedule {
    /// The sessions of `plan` this process sends: one per open-loop arrival, or one per
    /// closed-loop user.
    pub(super) fn new(plan: &BenchPlan, target: &Connected) -> Schedule {
        let requests = Arc::new(Requests {
            plan: plan.clone(),
            picks: picks(plan),
            synth: target.synth(1),
            model: target.model.clone(),
            ask_worker_id: target.ask_worker_id,
            lora: target.lora.clone(),
        });
        let shard = plan.shard;
        let owns = |i: usize| shard.is_none_or(|sh| sh.owns(i));
        let taken: Taken = Arc::default();
        let scripts: Vec<Box<dyn Script>> = match plan.load {
            Load::Open { .. } => plan
                .arrival_offsets()
                .into_iter()
                .enumerate()
                .filter(|&(k, _)| owns(k))
                .map(|(k, t)| {
                    Box::new(OneShot {
                        requests: requests.clone(),
                        k,
                        at: Duration::from_secs_f64(t),
                        sent: false,
                    }) as Box<dyn Script>
                })
                .collect(),
            Load::Closed { users } => {
                let next = Arc::new(AtomicUsize::new(0));
                let local_users = (0..users).filter(|&u| owns(u)).count();
                if let Ok(mut t) = taken.lock() {
                    *t = vec![Vec::new(); local_users];
                }
                (0..local_users)
                    .map(|index| {
                        Box::new(User {
                            requests: requests.clone(),
                            next: next.clone(),
                            shard,
                            limit: plan.stop.max_requests(),
                            index,
                            taken: taken.clone(),
                            turn: 0,
                        }) as Box<dyn Script>
                    })
                    .collect()
            }
        };
        Schedule { taken, scripts }
    }
}
