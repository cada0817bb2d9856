//! `loadgen multiturn`: start the embedded server if needed, find the model, run every user's
//! conversation concurrently, and build the [`Results`].
//!
//! Runs on the shared [`driver`]: each user is a [`Conversation`] script, closed loop (the think
//! time starts when the previous answer has fully arrived), sending the whole history and
//! appending the streamed answer on success.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::{self, Endpoint, Response};
use crate::config::{MultiturnConfig, Target, TokenizerChoice};
use crate::driver::{self, DriverConfig, Observer, Planned, Sample, Script, Start};
use crate::error::LoadgenError;
use crate::report::{RawResult, Results, RunData};
use crate::workload::{TokenCounter, UserScript, Workload};

/// A running embedded mockserve.
pub(crate) struct Embedded {
    /// Stops it.
    stop: oneshot::Sender<()>,
    /// The server task.
    task: JoinHandle<Result<(), String>>,
}

impl Embedded {
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

/// Starts mockserve on 127.0.0.1 (a free port); returns its base URL.
pub(crate) async fn start_embedded(
    config: &mock_server::server::ServerConfig,
) -> Result<(String, Embedded), LoadgenError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| LoadgenError::Embedded(e.to_string()))?;
    let addr = listener
        .local_addr()
        .map_err(|e| LoadgenError::Embedded(e.to_string()))?;
    let (stop, stopped) = oneshot::channel::<()>();
    let config = config.clone();
    let task = tokio::spawn(async move {
        mock_server::server::serve(listener, config, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| format!("{e:#}"))
    });
    Ok((format!("http://{addr}"), Embedded { stop, task }))
}

/// Resolves the model: `--model`, else the single model of `{url}/v1/models`.
pub async fn detect_model(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> Result<String, LoadgenError> {
    let models_url = format!("{url}/v1/models");
    println!("  Auto-detecting model from {models_url}...");
    let err = |message: String| LoadgenError::ModelDetection {
        url: models_url.clone(),
        message,
    };
    let mut request = client.get(&models_url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| err(e.to_string()))?;
    if !response.status().is_success() {
        return Err(err(format!(
            "Models endpoint returned status: {}",
            response.status()
        )));
    }
    let body: Value = response.json().await.map_err(|e| err(e.to_string()))?;
    let ids: Vec<String> = body
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| err("no \"data\" array in the response".into()))?
        .iter()
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    match ids.as_slice() {
        [] => Err(LoadgenError::NoModels { url: models_url }),
        [one] => {
            println!("  Auto-detected model: {one}");
            Ok(one.clone())
        }
        _ => {
            for id in &ids {
                println!("    - {id}");
            }
            Err(LoadgenError::MultipleModels {
                url: models_url,
                models: ids,
            })
        }
    }
}

/// What every conversation needs to build its bodies.
struct BodyParams {
    model: String,
    max_completion_tokens: u32,
    ignore_eos: bool,
    speculative_prefill: bool,
}

impl BodyParams {
    fn body(&self, messages: &[Value]) -> Value {
        let mut body = json!({
            "model": self.model,
            "messages": messages,
            "max_completion_tokens": self.max_completion_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if self.speculative_prefill {
            body["nvext"] = json!({"agent_hints": {"speculative_prefill": true}});
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
}

impl Script for Conversation {
    fn first_start(&self) -> Duration {
        Duration::ZERO
    }

    fn next(&mut self, previous: Option<&Response>) -> Option<Planned> {
        if let Some(r) = previous.filter(|r| r.failure.is_none()) {
            self.messages
                .push(json!({"role": "assistant", "content": r.content}));
        }
        let t = self.script.turns.get(self.next_turn)?;
        self.messages
            .push(json!({"role": "user", "content": t.user_text}));
        let start = if self.next_turn == 0 {
            Start::At(t.delay)
        } else {
            Start::After(t.delay)
        };
        self.next_turn += 1;
        Some(Planned {
            start,
            body: self.params.body(&self.messages),
        })
    }
}

/// The multiturn record of one driver sample. Latencies are measured from the scheduled send.
fn record(sample: &Sample, user_tokens: Option<usize>) -> RawResult {
    let r = &sample.response;
    let tm = &r.timing;
    let lag = sample.lag_us();
    let success = r.failure.is_none();
    let ttft_us = if success {
        lag + tm.first_answer_us.unwrap_or(tm.end_us)
    } else {
        0
    };
    RawResult {
        user_id: sample.session,
        turn: sample.turn,
        ttft_us,
        total_latency_us: lag + tm.end_us,
        success,
        ttft_any_us: if success {
            tm.ttft_any_us().map(|t| t + lag)
        } else {
            None
        },
        headers_us: tm.headers_us.map(|t| t + lag),
        first_reasoning_us: tm.first_reasoning_us.map(|t| t + lag),
        chunks: tm.token_chunks_us.len() as u64,
        output_tokens: r.output_tokens,
        output_tokens_source: Some(r.output_tokens_source),
        usage_output_tokens: r.usage_output_tokens,
        usage_mismatch: r.usage_mismatch,
        user_tokens,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.cached_tokens,
        error: r.failure.clone(),
    }
}

fn print_config(c: &MultiturnConfig, url: &str, model: &str) {
    let w = &c.workload;
    println!("Configuration:");
    println!("  URL: {url}");
    println!("  Model: {model}");
    println!("  Users: {}", w.num_users);
    println!("  Turns: {}", w.num_turns);
    match c.tokenizer {
        TokenizerChoice::Heuristic => println!("  User tokens: ~{}", w.num_user_tokens),
        _ => println!("  User tokens: {} (exact)", w.num_user_tokens),
    }
    println!("  Max completion tokens: {}", c.max_completion_tokens);
    println!("  Ignore EOS: {}", c.ignore_eos);
    println!("  Mean delay: {}ms", w.mean_delay_ms);
    println!("  Speculative prefill: {}", c.speculative_prefill);
    println!("  Seed: {}", w.seed);
    println!();
}

/// Runs a multi-turn benchmark: prints the console report, writes `--output`, returns the
/// results (the failure-rate verdict is [`verdict`]'s).
pub async fn multiturn(config: &MultiturnConfig) -> Result<Results, LoadgenError> {
    println!("Multiturn Chat Benchmark");
    println!("========================\n");
    let (url, embedded, counter) = match &config.target {
        Target::Url(url) => (url.clone(), None, None),
        Target::Embedded(server) => {
            let (url, e) = start_embedded(server).await?;
            let e_cfg = &server.cluster.engine;
            println!(
                "Embedded mockserve on {url}: {} workers, {} engine, speedup {}, reasoning ratio {}",
                server.cluster.num_workers,
                e_cfg.engine_type,
                e_cfg.latency.speedup_ratio,
                server.reasoning_ratio
            );
            println!();
            (
                url,
                Some(e),
                Some(TokenCounter::codec(server.codec.clone())),
            )
        }
    };
    let result = drive(config, &url, counter).await;
    if let Some(e) = embedded {
        e.shutdown().await;
    }
    result
}

async fn drive(
    config: &MultiturnConfig,
    url: &str,
    embedded_counter: Option<TokenCounter>,
) -> Result<Results, LoadgenError> {
    let counter = match (&config.tokenizer, embedded_counter) {
        (TokenizerChoice::File(path), _) => {
            TokenCounter::Exact(Arc::from(servesim::tokenizer::load_tokenizer(path)?))
        }
        (TokenizerChoice::Embedded, Some(c)) => c,
        _ => TokenCounter::Heuristic,
    };
    let http =
        client::client(config.request_timeout).map_err(|e| LoadgenError::Client(e.to_string()))?;
    println!("Model Detection:");
    let model = match &config.model {
        Some(m) => {
            println!("  Using model: {m}");
            m.clone()
        }
        None => detect_model(&http, url, config.api_key.as_deref()).await?,
    };
    println!();
    print_config(config, url, &model);

    let workload = Workload::generate(&config.workload, &counter);
    let total = (config.workload.num_users * config.workload.num_turns) as u64;
    println!(
        "Running {} users x {} turns = {} total requests...",
        config.workload.num_users, config.workload.num_turns, total
    );
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "[{elapsed_precise}] [{wide_bar:.cyan/blue}] {pos}/{len} turns ({eta})",
    ) {
        bar.set_style(style.progress_chars("#>-"));
    }
    let params = Arc::new(BodyParams {
        model: model.clone(),
        max_completion_tokens: config.max_completion_tokens,
        ignore_eos: config.ignore_eos,
        speculative_prefill: config.speculative_prefill,
    });
    let user_tokens: Vec<Vec<Option<usize>>> = workload
        .users
        .iter()
        .map(|u| u.turns.iter().map(|t| t.user_tokens).collect())
        .collect();
    let num_turns = config.workload.num_turns;
    let observer: Option<Observer> = config.verbose.then(|| {
        let bar = bar.clone();
        Arc::new(move |s: &Sample| {
            let tm = &s.response.timing;
            let line = format!(
                "  [user {}][turn {}/{}] ttft={:.1}ms  total={:.1}s  ok={}",
                s.session,
                s.turn + 1,
                num_turns,
                (s.lag_us() + tm.first_answer_us.unwrap_or(tm.end_us)) as f64 / 1000.0,
                (s.lag_us() + tm.end_us) as f64 / 1e6,
                s.response.failure.is_none()
            );
            if bar.is_hidden() {
                println!("{line}");
            } else {
                bar.println(line);
            }
            if let Some(f) = &s.response.failure {
                eprintln!("  [user {}][turn {}] {}", s.session, s.turn, f);
            }
        }) as Observer
    });
    let scripts: Vec<Box<dyn Script>> = workload
        .users
        .into_iter()
        .map(|script| {
            Box::new(Conversation {
                params: params.clone(),
                messages: vec![json!({"role": "system", "content": script.system_prompt})],
                script,
                next_turn: 0,
            }) as Box<dyn Script>
        })
        .collect();
    let endpoint = Endpoint {
        client: http,
        url: format!("{url}/v1/chat/completions"),
        api_key: config.api_key.clone(),
        max_line_bytes: config.max_line_bytes,
    };
    let driver_config = DriverConfig {
        bar: Some(bar.clone()),
        observer,
        ..DriverConfig::default()
    };
    let out = driver::drive(endpoint, scripts, &driver_config).await?;
    let mut data = RunData::default();
    for s in &out.samples {
        if s.response.failure.is_none() {
            let chunks = &s.response.timing.token_chunks_us;
            data.chunk_gaps_us
                .extend(chunks.windows(2).map(|w| w[1] - w[0]));
        }
        let tokens = user_tokens
            .get(s.session)
            .and_then(|u| u.get(s.turn))
            .copied()
            .flatten();
        data.records.push(record(s, tokens));
    }
    data.duration_s = out.duration.as_secs_f64();
    bar.finish_and_clear();
    println!("\nBenchmark completed in {:.1}s", data.duration_s);

    let results = Results::build(
        data,
        config.workload.num_users,
        config.workload.num_turns,
        config.speculative_prefill,
        config.to_json(&model, url),
    );
    print!("{}", results.console());
    if let Some(path) = &config.output {
        let text = serde_json::to_string_pretty(&results).unwrap_or_default();
        std::fs::write(path, text + "\n").map_err(|source| LoadgenError::Io {
            path: path.clone(),
            source,
        })?;
        println!("Results written to: {}", path.display());
    }
    Ok(results)
}

/// The pass/fail verdict: fails when every request failed or the failure share is above
/// `max_failure_rate`.
pub fn verdict(results: &Results, max_failure_rate: f64) -> Result<(), LoadgenError> {
    crate::failure::verdict(
        results.total_requests,
        results.failed_requests,
        max_failure_rate,
    )
}
