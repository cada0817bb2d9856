//! `loadgen multiturn`: start the embedded server if needed, find the model, run every user's
//! conversation concurrently, and build the [`Results`].
//!
//! Runs on the shared [`driver`]: each user is a `Conversation` script, closed loop (the think
//! time starts when the previous answer has fully arrived), sending the whole history and
//! appending the streamed answer on success.

pub mod compare;
pub mod config;
pub mod report;
pub(crate) mod workload;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::error::LoadgenError;
use crate::harness::{self, Mode, Report, Settings};
use crate::multiturn::config::{MultiturnConfig, ResponsesHistory};
use crate::multiturn::report::{RawResult, Results, RunData, ShardSample};
use crate::multiturn::workload::{TokenCounter, UserScript, Workload};
use crate::observe::Observed;
use crate::run::blocks::{ChatPrompts, PromptBlocks, RECORD_BLOCK_TOKENS};
use crate::run::client::{FirstToken, Response, Wire};
use crate::run::driver::{self, DriverConfig, Observer, Planned, RunHooks, Sample, Script, Start};
use crate::run::target::{Api, Connected};
use mock_server::args::ReportArgs;

/// What every conversation needs to build its bodies.
struct BodyParams {
    model: String,
    max_completion_tokens: u32,
    ignore_eos: bool,
    speculative_prefill: bool,
    /// Every request carries [`tool_definition`] (tool turns were asked for).
    tools: bool,
    /// Renders each request's prompt for its record's [`PromptBlocks`] (None without a
    /// tokenizer).
    prompts: Option<ChatPrompts>,
    /// The route's form of each chat body (`--endpoint`).
    wire: Wire,
    /// Continue with `previous_response_id` (`--responses-history previous-id`).
    previous_id: bool,
}

/// The one tool of a run with tool turns: a lookup whose result is the next turn's text.
fn tool_definition() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up and return what was found.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    })
}

impl BodyParams {
    /// The request of a turn whose history is `messages`; `tool_call` asks for a tool call;
    /// `max_tokens` (the dataset's length of this turn) replaces `--max-completion-tokens`.
    fn body(&self, messages: &[Value], tool_call: bool, max_tokens: Option<u32>) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": max_tokens.unwrap_or(self.max_completion_tokens),
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if self.speculative_prefill {
            body["nvext"] = json!({"agent_hints": {"speculative_prefill": true}});
        }
        if self.tools {
            body["tools"] = json!([tool_definition()]);
            body["tool_choice"] = json!(if tool_call { "required" } else { "none" });
        }
        body
    }
}

/// One user's conversation as a driver [`Script`]: the first turn at the run start, each later
/// turn its think time after the previous answer fully arrived (closed loop), sending the whole
/// history and appending the streamed answer on success.
struct Conversation {
    params: Arc<BodyParams>,
    script: UserScript,
    messages: Vec<Value>,
    next_turn: usize,
    /// Each sent turn's prompt as block hashes, by turn (read back for the records; a std
    /// Mutex: locked briefly here and after the run, never across an await).
    blocks: Arc<Mutex<Vec<Option<PromptBlocks>>>>,
    /// The last answer's `response.id` and how many messages of the history it covers (with
    /// `--responses-history previous-id`, only the messages after them are sent).
    previous: Option<(String, usize)>,
    /// The `model` of this conversation under `--lora-mix` (None: the target's).
    model: Option<Arc<str>>,
}

/// The history entry of a successful answer: its text, and its tool calls when it made some.
fn assistant_message(r: &Response) -> Value {
    if r.tool_calls.is_empty() {
        return json!({"role": "assistant", "content": r.content});
    }
    json!({
        "role": "assistant",
        "content": if r.content.is_empty() { Value::Null } else { json!(r.content) },
        "tool_calls": r.tool_calls.iter().map(crate::run::client::ToolCall::to_json).collect::<Vec<_>>(),
    })
}

impl Script for Conversation {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }

    fn next(&mut self, previous: Option<&Response>) -> Option<Planned> {
        let answered = previous.filter(|r| r.failure.is_none());
        if let Some(r) = answered {
            self.messages.push(assistant_message(r));
            if let Some(id) = &r.response_id {
                self.previous = Some((id.clone(), self.messages.len()));
            }
        }
        let t = self.script.turns.get(self.next_turn)?;
        // The tool's result answers the call (the first, when the model made several; the
        // others get an empty result); a turn after an answer without a call is a user turn.
        match answered.map(|r| r.tool_calls.as_slice()) {
            Some([first, rest @ ..]) if t.after_tool => {
                self.messages.push(
                    json!({"role": "tool", "tool_call_id": first.id, "content": t.user_text}),
                );
                for call in rest {
                    self.messages
                        .push(json!({"role": "tool", "tool_call_id": call.id, "content": ""}));
                }
            }
            _ => self
                .messages
                .push(json!({"role": "user", "content": t.user_text})),
        }
        let start = if self.next_turn == 0 {
            Start::At(t.delay)
        } else {
            Start::After(t.delay)
        };
        self.next_turn += 1;
        let model = self.model.clone();
        let with_model = move |mut body: Value| {
            if let Some(model) = &model {
                body["model"] = json!(&**model);
            }
            body
        };
        let chat = with_model(self.params.body(&self.messages, t.tool_call, t.max_tokens));
        if let Some(prompts) = &self.params.prompts {
            let blocks = prompts
                .tokens(&chat)
                .ok()
                .map(|tokens| PromptBlocks::of(&tokens, RECORD_BLOCK_TOKENS));
            if let Ok(mut all) = self.blocks.lock() {
                all.push(blocks);
            }
        }
        let body = match &self.previous {
            // The server holds the history up to the last answer: send what came after it.
            Some((id, covered)) if self.params.previous_id => {
                let rest = self.messages.get(*covered..).unwrap_or_default();
                let chat = with_model(self.params.body(rest, t.tool_call, t.max_tokens));
                let mut body = self.params.wire.body(chat);
                body["previous_response_id"] = json!(id);
                body
            }
            _ => self.params.wire.body(chat),
        };
        Some(Planned { start, body })
    }
}

/// The multiturn record of one driver sample. Latencies are measured from the scheduled send.
fn record(sample: &Sample, user_tokens: Option<usize>) -> RawResult {
    let r = &sample.response;
    let tm = &r.timing;
    let lag = sample.lag_us();
    let first_answer_us = sample.ttft_us(FirstToken::Answer);
    RawResult {
        user_id: sample.session,
        turn: sample.turn,
        ttft_us: first_answer_us.unwrap_or(0),
        total_latency_us: lag + tm.end_us,
        success: r.failure.is_none(),
        first_answer_us,
        ttft_any_us: sample.ttft_us(FirstToken::Any),
        headers_us: tm.headers_us.map(|t| t + lag),
        first_reasoning_us: tm.first_reasoning_us.map(|t| t + lag),
        chunks: r.chunks,
        output_tokens: r.output_tokens,
        output_tokens_source: Some(r.output_tokens_source),
        usage_output_tokens: r.usage_output_tokens,
        usage_mismatch: r.usage_mismatch,
        user_tokens,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.cached_tokens,
        error: r.failure.clone(),
        adapter: None,
        start_us: Some(sample.scheduled_us),
        prompt_blocks: None,
        tool_call: false,
        after_tool: false,
        shard: None,
        merge: None,
    }
}

fn print_config(c: &MultiturnConfig, url: &str, model: &str) {
    let w = &c.workload;
    crate::stdout::outln!("Configuration:");
    crate::stdout::outln!("  URL: {url}");
    crate::stdout::outln!("  Model: {model}");
    crate::stdout::outln!("  Users: {}", w.num_users);
    if let Some(d) = &w.dataset {
        crate::stdout::outln!(
            "  Dataset: {} ({} of {} conversations kept)",
            d.spec,
            d.len(),
            d.read
        );
    }
    crate::stdout::outln!("  Turns: {}", w.num_turns);
    if w.dataset.is_some() {
        crate::stdout::outln!("  User tokens: the dataset's");
    } else if c.target.is_embedded() || c.target.tokenizer.is_some() {
        crate::stdout::outln!("  User tokens: {} (exact)", w.num_user_tokens);
    } else {
        crate::stdout::outln!("  User tokens: ~{}", w.num_user_tokens);
    }
    crate::stdout::outln!("  Max completion tokens: {}", c.max_completion_tokens);
    crate::stdout::outln!("  Ignore EOS: {}", c.ignore_eos);
    crate::stdout::outln!("  Mean delay: {}ms", w.mean_delay_ms);
    crate::stdout::outln!("  Speculative prefill: {}", c.speculative_prefill);
    if let Some(t) = &w.tools {
        crate::stdout::outln!(
            "  Tool calls: {}% of turns, tool wait {} ms",
            t.share * 100.0,
            t.wait
        );
    }
    crate::stdout::outln!("  Seed: {}", w.seed);
    crate::stdout::outln!();
}

/// Runs a multi-turn benchmark: prints the console report, writes the results files, returns
/// the results (the failure-rate verdict is [`verdict`]'s); with `--num-runs K` the first run's
/// ([`multiturn_runs`] returns them all).
pub async fn multiturn(config: &MultiturnConfig) -> Result<Results, LoadgenError> {
    harness::first(multiturn_runs(config).await?)
}

/// Runs a multi-turn benchmark `--num-runs` times (the same conversations each time): every
/// run's results, in order (at least one), after printing each and the aggregate and writing
/// the files.
pub async fn multiturn_runs(config: &MultiturnConfig) -> Result<Vec<Results>, LoadgenError> {
    crate::stdout::outln!("Multiturn Chat Benchmark");
    crate::stdout::outln!("========================\n");
    let settings = Settings {
        report: &config.report,
        observe: config.observe.as_ref(),
        live_view: false,
        html: config.html.as_deref(),
        sharding: &config.sharding,
        console: true,
        num_runs: config.num_runs,
    };
    let mode = Conversations {
        config,
        model: String::new(),
        url: String::new(),
        num_users: 0,
        turn_facts: Vec::new(),
        blocks: Vec::new(),
        bar: ProgressBar::hidden(),
        lora: None,
    };
    let runs = harness::execute_runs(mode, &config.target, &settings).await?;
    Ok(runs.into_iter().map(|r| r.results).collect())
}

/// `multiturn` in the harness: one conversation per user, with the progress bar and the verbose
/// lines instead of the live view, and the `/metrics` scraper only when asked.
struct Conversations<'a> {
    config: &'a MultiturnConfig,
    /// The target's model and URL, for the results' configuration.
    model: String,
    url: String,
    /// Users this process runs.
    num_users: usize,
    /// By local user then turn: (user tokens, asks for a tool call, answers one).
    turn_facts: Vec<Vec<(Option<usize>, bool, bool)>>,
    /// By local user, each sent turn's prompt as block hashes (for the records).
    blocks: Vec<Arc<Mutex<Vec<Option<PromptBlocks>>>>>,
    bar: ProgressBar,
    /// `--lora-mix` against the target: user u's conversation is sent as `lora.model(u)`.
    lora: Option<Arc<crate::run::lora::LoraTraffic>>,
}

/// The results of a multiturn run and how long it took.
struct MultiturnRun {
    results: Results,
    duration_s: f64,
}

impl Mode for Conversations<'_> {
    type Schedule = (Vec<Box<dyn Script>>, DriverConfig);
    type Driven = driver::DriverOutput;
    type Run = MultiturnRun;

    fn api(&self) -> Api {
        self.config.api
    }

    fn prepare(
        &mut self,
        target: &Connected,
    ) -> Result<(Self::Schedule, Option<usize>), LoadgenError> {
        let config = self.config;
        let counter = match &target.tokenizer {
            Some(t) => TokenCounter::Exact(t.clone()),
            None => TokenCounter::Heuristic,
        };
        self.url = target.url.clone();
        self.model = target.model.clone();
        print_config(config, &self.url, &self.model);

        // Every user's conversation from the seed, then this shard's users: each is the
        // unsharded run's conversation.
        let mut workload = Workload::generate(&config.workload, &counter);
        let shard = config.sharding.shard;
        if let Some(sh) = shard {
            workload.users.retain(|u| sh.owns(u.user_id));
            crate::stdout::outln!(
                "Shard {}/{}: {} of the {} users",
                sh.index,
                sh.count,
                workload.users.len(),
                config.workload.num_users
            );
        }
        self.num_users = workload.users.len();
        let total = workload
            .users
            .iter()
            .map(|u| u.turns.len() as u64)
            .sum::<u64>();
        crate::stdout::outln!(
            "Running {} users x {} turns{} = {} total requests...",
            self.num_users,
            config.workload.num_turns,
            if config.workload.dataset.is_some() {
                " at most (the dataset's conversations)"
            } else {
                ""
            },
            total
        );
        let bar = if config.report.show_progress() {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "[{elapsed_precise}] [{wide_bar:.cyan/blue}] {pos}/{len} turns ({eta})",
        ) {
            bar.set_style(style.progress_chars("#>-"));
        }
        self.bar = bar.clone();
        let params = Arc::new(BodyParams {
            model: self.model.clone(),
            max_completion_tokens: config.max_completion_tokens,
            ignore_eos: config.ignore_eos,
            speculative_prefill: config.speculative_prefill,
            tools: config.workload.tools.is_some(),
            prompts: target.tokenizer.clone().map(ChatPrompts::new),
            wire: target.endpoint.wire,
            previous_id: config.responses_history == ResponsesHistory::PreviousId,
        });
        self.turn_facts = workload
            .users
            .iter()
            .map(|u| {
                u.turns
                    .iter()
                    .map(|t| (t.user_tokens, t.tool_call, t.after_tool))
                    .collect()
            })
            .collect();
        let num_turns = config.workload.num_turns;
        let observer: Option<Observer> = config.verbose.then(|| {
            let bar = bar.clone();
            Arc::new(move |s: &Sample| {
                let tm = &s.response.timing;
                let ttft = match s.ttft_us(FirstToken::Answer) {
                    Some(t) => format!("{:.1}ms", t as f64 / 1000.0),
                    None => "-".into(),
                };
                let line = format!(
                    "  [user {}][turn {}/{}] ttft={ttft}  total={:.1}s  ok={}",
                    crate::run::shard::global(shard, s.session),
                    s.turn + 1,
                    num_turns,
                    (s.lag_us() + tm.end_us) as f64 / 1e6,
                    s.response.failure.is_none()
                );
                if bar.is_hidden() {
                    crate::stdout::outln!("{line}");
                } else {
                    bar.println(line);
                }
                if let Some(f) = &s.response.failure {
                    crate::stdout::errln!(
                        "  [user {}][turn {}] {}",
                        crate::run::shard::global(shard, s.session),
                        s.turn,
                        f
                    );
                }
            }) as Observer
        });
        self.blocks = (0..workload.users.len()).map(|_| Arc::default()).collect();
        self.lora = target.lora.clone();
        let lora = self.lora.clone();
        let scripts: Vec<Box<dyn Script>> = workload
            .users
            .into_iter()
            .zip(&self.blocks)
            .map(|(script, blocks)| {
                Box::new(Conversation {
                    model: lora.as_ref().map(|l| l.model(script.user_id).clone()),
                    params: params.clone(),
                    messages: vec![json!({"role": "system", "content": script.system_prompt})],
                    script,
                    next_turn: 0,
                    blocks: blocks.clone(),
                    previous: None,
                }) as Box<dyn Script>
            })
            .collect();
        let driver_config = DriverConfig {
            bar: Some(bar),
            observer,
            ..DriverConfig::default()
        };
        Ok(((scripts, driver_config), None))
    }

    async fn drive(
        &mut self,
        (scripts, config): Self::Schedule,
        target: &Connected,
        _hooks: RunHooks,
    ) -> Result<driver::DriverOutput, LoadgenError> {
        driver::drive(target.endpoint.clone(), scripts, &config).await
    }

    fn report(
        &mut self,
        out: driver::DriverOutput,
        _wall: Duration,
        observed: &Observed,
    ) -> Result<MultiturnRun, LoadgenError> {
        let config = self.config;
        let shard = config.sharding.shard;
        let num_turns = config.workload.num_turns;
        let mut data = RunData::default();
        let run_start_unix_us = out
            .started_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        for s in &out.samples {
            let (mut gaps, mut per_s) = (Vec::new(), None);
            if s.response.failure.is_none() {
                let timing = &s.response.timing;
                gaps = timing
                    .token_chunks_us
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .collect();
                per_s = timing.output_tokens_per_s(s.response.output_tokens);
                data.chunk_gaps_us.extend(&gaps);
                data.output_tokens_per_s_per_user.extend(per_s);
            }
            let (tokens, tool_call, after_tool) = self
                .turn_facts
                .get(s.session)
                .and_then(|u| u.get(s.turn))
                .copied()
                .unwrap_or_default();
            let mut rec = record(s, tokens);
            rec.prompt_blocks = self
                .blocks
                .get(s.session)
                .and_then(|b| b.lock().ok()?.get(s.turn).cloned().flatten());
            rec.tool_call = tool_call;
            rec.after_tool = after_tool;
            rec.user_id = crate::run::shard::global(shard, s.session);
            rec.adapter = self.lora.as_ref().map(|l| l.label(rec.user_id).to_string());
            if let Some(sh) = shard {
                rec.shard = Some(sh.pair());
                rec.merge = Some(ShardSample {
                    num_users: config.workload.num_users,
                    num_turns,
                    speculative_prefill: config.speculative_prefill,
                    run_start_unix_us,
                    end_us: s.end_us(),
                    chunk_gaps_us: gaps,
                    output_tokens_per_s: per_s,
                });
            }
            data.records.push(rec);
        }
        data.duration_s = out.duration.as_secs_f64();
        self.bar.finish_and_clear();
        let duration_s = data.duration_s;
        let mut results = Results::build(
            data,
            self.num_users,
            num_turns,
            config.speculative_prefill,
            config.to_json(&self.model, &self.url),
        );
        crate::run::shard::annotate(&mut results.config, shard);
        results.server_metrics = observed.server.as_ref().map(|m| json!(m));
        results.server_lateness = observed.lateness();
        results.lora = by_adapter(&results.raw_results).map(|by| crate::report::lora::to_json(&by));
        Ok(MultiturnRun {
            results,
            duration_s,
        })
    }
}

/// `--lora-mix`'s figures by adapter (None without it); a turn's ITL is
/// `(latency - TTFT) / (output tokens - 1)`.
fn by_adapter(
    results: &[RawResult],
) -> Option<std::collections::BTreeMap<String, crate::report::lora::AdapterFigures>> {
    let ms = |us: u64| us as f64 / 1000.0;
    crate::report::lora::figures(results.iter().filter_map(|r| {
        let itl_ms = match (r.ttft_any_us, r.output_tokens) {
            (Some(ttft), n) if n > 1 => {
                Some(ms(r.total_latency_us.saturating_sub(ttft)) / (n - 1) as f64)
            }
            _ => None,
        };
        Some(crate::report::lora::AdapterSample {
            adapter: r.adapter.as_deref()?,
            failed: !r.success,
            input_tokens: r.prompt_tokens.unwrap_or(0),
            output_tokens: r.output_tokens,
            ttft_ms: r.ttft_any_us.map(ms),
            itl_ms,
            e2e_ms: Some(ms(r.total_latency_us)),
        })
    }))
}

impl Report for MultiturnRun {
    fn console_text(&self) -> String {
        let lora = by_adapter(&self.results.raw_results)
            .map_or_else(String::new, |by| crate::report::lora::lines(&by));
        format!(
            "\nBenchmark completed in {:.1}s\n{}{lora}",
            self.duration_s,
            self.results.console()
        )
    }

    fn figures(&self) -> &'static [crate::report::repeat::Figure] {
        crate::report::repeat::MULTITURN_FIGURES
    }

    fn write_files(&self, report: &ReportArgs) -> Result<(), LoadgenError> {
        write_results(
            &self.results,
            report.report_json.as_deref(),
            report.per_request_jsonl.as_deref(),
        )
    }

    fn html_json(&self) -> (&'static str, Cow<'_, Value>) {
        (
            "multiturn",
            Cow::Owned(serde_json::to_value(&self.results).unwrap_or_default()),
        )
    }
}

/// Writes the results (pretty JSON) to `report_json` and one `raw_results` entry a line to
/// `per_request_jsonl`.
pub(crate) fn write_results(
    results: &Results,
    report_json: Option<&std::path::Path>,
    per_request_jsonl: Option<&std::path::Path>,
) -> Result<(), LoadgenError> {
    if let Some(path) = report_json {
        crate::write::json(path, results)?;
        crate::stdout::outln!("Results written to: {}", path.display());
    }
    if let Some(path) = per_request_jsonl {
        crate::write::jsonl(path, &results.raw_results)?;
    }
    Ok(())
}

/// The run's pass/fail verdict: fails when every request failed or the failure share is above
/// `--max-failure-rate`, or when the server fell behind by more than `--max-server-lateness`.
pub fn verdict(results: &Results, config: &MultiturnConfig) -> Result<(), LoadgenError> {
    crate::run::failure::verdict(
        results.total_requests,
        results.failed_requests,
        config.max_failure_rate,
    )?;
    match &config.observe {
        Some(observe) => crate::observe::lateness_verdict(results.server_lateness, observe),
        None => Ok(()),
    }
}
