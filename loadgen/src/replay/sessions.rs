//! A Mooncake trace's sessions in the run harness: one driver [`Script`] per session, its
//! first turn at the session's arrival, each later turn its delay after the previous answer.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use servesim::trace::Trace;

use crate::error::LoadgenError;
use crate::harness::Mode;
use crate::observe::Observed;
use crate::replay::args::{ReplayArgs, SessionMode};
use crate::replay::plan::{prompts_line, PromptPlan};
use crate::replay::report::{ReplayKeys, ReplayRun};
use crate::report::replay_report::{self, RequestInfo};
use crate::run::client::Response;
use crate::run::driver::{self, Planned, RunHooks, Script, Start};
use crate::run::prompt::PromptSynth;
use crate::run::target::{request_body, token_request_body, Api, Connected};

/// One session as a driver script.
struct SessionScript {
    trace: Arc<Trace>,
    plans: Arc<Vec<Vec<PromptPlan>>>,
    synth: Arc<PromptSynth>,
    model: Arc<str>,
    api: Api,
    /// Whether bodies ask for the serving worker.
    ask_worker_id: bool,
    /// Completions prompts go as token ids (the embedded server shares the tokenizer).
    token_prompts: bool,
    session: usize,
    next_turn: usize,
}

impl Script for SessionScript {
    fn first_start(&self) -> Duration {
        Duration::from_nanos(self.trace.sessions[self.session].first_arrival.as_nanos())
    }

    fn next(&mut self, _previous: Option<&Response>) -> Option<Planned> {
        let s = &self.trace.sessions[self.session];
        let turn = s.turns.get(self.next_turn)?;
        let start = if self.next_turn == 0 {
            Start::At(self.first_start())
        } else {
            Start::After(turn.delay.into())
        };
        let plan = &self.plans[self.session][self.next_turn];
        self.next_turn += 1;
        let ids = (self.token_prompts && self.api == Api::Completions)
            .then(|| plan.token_ids(&self.synth))
            .flatten();
        let body = match ids {
            Some(ids) => {
                token_request_body(&self.model, ids, turn.output_length, self.ask_worker_id)
            }
            None => request_body(
                self.api,
                &self.model,
                plan.text(&self.synth),
                turn.output_length,
                self.ask_worker_id,
            ),
        };
        Some(Planned { start, body })
    }
}

/// A Mooncake trace's sessions in the harness: one driver script per session this process
/// owns.
pub(super) struct SessionsMode<'a> {
    pub(super) args: &'a ReplayArgs,
    pub(super) spec: &'a crate::run::target::TargetSpec,
    pub(super) console: bool,
    pub(super) session_mode: SessionMode,
    pub(super) trace: Arc<Trace>,
    pub(super) plans: Arc<Vec<Vec<PromptPlan>>>,
    /// Expected reused tokens, by session then turn.
    pub(super) expected: Vec<Vec<usize>>,
    /// The sessions this process sends, by global index (all of them unsharded).
    pub(super) owned: Vec<usize>,
    /// `--lora-mix` against the target: session s is sent as `lora.model(s)`.
    pub(super) lora: Option<Arc<crate::run::lora::LoraTraffic>>,
}

impl Mode for SessionsMode<'_> {
    type Schedule = Vec<Box<dyn Script>>;
    type Driven = driver::DriverOutput;
    type Run = ReplayRun;

    fn api(&self) -> Api {
        self.args.endpoint
    }

    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Vec<Box<dyn Script>>, Option<usize>), LoadgenError> {
        let args = self.args;
        let synth = Arc::new(target.synth(args.trace.block_size));
        if self.console {
            crate::stdout::outln!("{}", prompts_line(args, &synth, args.trace.block_size));
        }
        let trace = &self.trace;
        let shard = args.run.sharding.shard;
        self.owned = (0..trace.sessions.len())
            .filter(|&s| shard.is_none_or(|sh| sh.owns(s)))
            .collect();
        if let (Some(sh), true) = (shard, self.console) {
            crate::stdout::outln!(
                "Shard {}/{}: {} of the {} sessions",
                sh.index,
                sh.count,
                self.owned.len(),
                trace.sessions.len()
            );
        }
        let total = self
            .owned
            .iter()
            .map(|&s| trace.sessions[s].turns.len())
            .sum::<usize>();
        let model: Arc<str> = Arc::from(target.model.as_str());
        self.lora = target.lora.clone();
        let lora = self.lora.clone();
        let scripts = self
            .owned
            .iter()
            .map(|&session| {
                Box::new(SessionScript {
                    trace: trace.clone(),
                    plans: self.plans.clone(),
                    synth: synth.clone(),
                    model: lora
                        .as_ref()
                        .map_or_else(|| model.clone(), |l| l.model(session).clone()),
                    api: args.endpoint,
                    ask_worker_id: target.ask_worker_id,
                    token_prompts: target.takes_token_prompts(),
                    session,
                    next_turn: 0,
                }) as Box<dyn Script>
            })
            .collect();
        Ok((scripts, Some(total)))
    }

    async fn drive(
        &mut self,
        scripts: Vec<Box<dyn Script>>,
        target: &Connected,
        hooks: RunHooks,
    ) -> Result<driver::DriverOutput, LoadgenError> {
        let config = driver::DriverConfig {
            // Tied timestamps are admitted in trace order, as `mockserve replay` admits them. An
            // answer that is not streamed has its headers only when it is whole: waiting for
            // them would send tied requests one at a time.
            ordered_ties: target.endpoint.wire.streams(),
            ..hooks.driver_config(self.args.max_in_flight, None)
        };
        driver::drive(target.endpoint.clone(), scripts, &config).await
    }

    fn report(
        &mut self,
        mut out: driver::DriverOutput,
        wall: Duration,
        observed: &Observed,
    ) -> Result<ReplayRun, LoadgenError> {
        let args = self.args;
        // Local session j ran global session owned[j]: records carry the global index.
        for s in &mut out.samples {
            s.session = self.owned[s.session];
        }
        let infos: Vec<Vec<RequestInfo>> = self
            .trace
            .sessions
            .iter()
            .enumerate()
            .map(|(si, s)| {
                s.turns
                    .iter()
                    .enumerate()
                    .map(|(ti, t)| RequestInfo {
                        input_length: self.plans[si][ti].len(),
                        max_output: t.output_length,
                        session: Some(s.id.clone()),
                        turn: ti,
                        expected_reused_tokens: Some(self.expected[si][ti]),
                        adapter: self.lora.as_ref().map(|l| l.label(si)),
                    })
                    .collect()
            })
            .collect();
        let items: Vec<_> = out
            .samples
            .iter()
            .map(|s| (s, &infos[s.session][s.turn]))
            .collect();
        let mut live = replay_report::build(&items, wall);
        live.set_started_at(out.started_at);
        let mode = format!("{:?}", self.session_mode).to_lowercase();
        let config = json!({
            "mode": "replay",
            "trace": args.trace.file().display().to_string(),
            "endpoint": args.endpoint.name(),
            "arrival_speedup_ratio": args.trace.arrival_speedup_ratio,
            "trace_block_size": args.trace.block_size,
            "max_requests": args.max_requests,
            "max_in_flight": args.max_in_flight,
            "session_mode": mode,
            "target": self.spec.describe(),
        });
        let keys = ReplayKeys {
            first: ("session_mode", json!(mode)),
            arrival_speedup_ratio: args.trace.arrival_speedup_ratio,
            trace_block_size: args.trace.block_size,
            config,
            slo: args.slo,
        };
        let autoscale = super::fleet::judge(
            args.fleet_lifecycle.as_deref(),
            args.slo.as_ref(),
            args.trace.arrival_speedup_ratio,
            &live,
        )?;
        let mut run = keys.run(
            live,
            &items,
            None,
            self.session_mode,
            args.run.sharding.shard,
            observed,
        );
        run.judged(autoscale);
        Ok(run)
    }
}
