//! Writing [`Request`]s as a trace: Mooncake rows (sessions by `session_id`, first turn at its
//! `timestamp`, later turns a `delay` after the previous turn's end) or `agentic_mooncake` v2
//! (one play per conversation, each later turn a completion dependency on the previous one with
//! the think time as its delay).
//!
//! Hash ids: requests are taken in send order (ties in input order); the full block `j` of a
//! prompt is named by the hash of its whole prefix `[0, (j + 1) * B)`, and each distinct prefix
//! gets the next id from 0, so two prompts share ids exactly as far as their tokens agree in
//! whole blocks. A partial last block gets an id of its own (as dynamo-bench's converter does):
//! an engine caches only full blocks.

use std::collections::HashMap;

use clap::ValueEnum;
use serde::Serialize;

use super::input::Request;
use crate::error::convert::ConvertError;
use servesim::trace::{AGENTIC_MOONCAKE_SCHEMA, MAX_ROW_OUTPUT_TOKENS, MAX_ROW_TOKENS};

/// The trace format written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Mooncake JSONL rows (`session_id`, `timestamp` / `delay`, `hash_ids`).
    Mooncake,
    /// `agentic_mooncake` v2: a `dynamo.agentic_mooncake` header, then one node per request.
    #[value(alias = "agentic_mooncake")]
    AgenticMooncake,
}

/// What the trace is written from besides the requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OutputPlan {
    /// The format.
    pub format: OutputFormat,
    /// Tokens per hash id.
    pub block_size: usize,
    /// The model named on agentic rows when a request does not say (or for every row).
    pub model: Option<String>,
    /// The agentic header's `source.format`.
    pub source_format: &'static str,
    /// The agentic header's `source.digest` (of the input bytes).
    pub source_digest: String,
}

/// A written trace and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The JSONL text.
    pub text: String,
    /// Requests written.
    pub requests: usize,
    /// Conversations (requests without one count as their own).
    pub sessions: usize,
    /// Distinct hash ids.
    pub hash_ids: u64,
    /// Later turns sent before the previous turn of their conversation had ended (their delay
    /// is 0).
    pub overlapping_turns: usize,
    /// Requests that generated no token, written with an output length of 1 (a trace row
    /// generates at least one).
    pub empty_outputs: usize,
}

/// A Mooncake row.
#[derive(Serialize)]
struct MooncakeRow<'a> {
    request_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay: Option<f64>,
    input_length: usize,
    output_length: u64,
    hash_ids: &'a [u64],
}

/// The `agentic_mooncake` v2 header.
#[derive(Serialize)]
struct AgenticHeader<'a> {
    schema: &'a str,
    version: u32,
    block_size: usize,
    hash_id_scope: &'a str,
    source: AgenticSource<'a>,
}

/// The header's provenance.
#[derive(Serialize)]
struct AgenticSource<'a> {
    format: &'a str,
    digest: &'a str,
}

/// An `agentic_mooncake` v2 node.
#[derive(Serialize)]
struct AgenticRow<'a> {
    request_id: &'a str,
    play_id: &'a str,
    session_id: &'a str,
    model: &'a str,
    input_length: usize,
    output_length: u64,
    hash_ids: &'a [u64],
    not_before_ms: f64,
    dependencies: Vec<AgenticDependency<'a>>,
}

/// A dependency on the previous turn's completion.
#[derive(Serialize)]
struct AgenticDependency<'a> {
    request_id: &'a str,
    trigger: &'a str,
    relation: &'a str,
    delay_ms: f64,
}

/// µs as ms.
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Names every prefix with a dense id in first-seen order.
#[derive(Default)]
struct HashIds {
    by_prefix: HashMap<u64, u64>,
    next: u64,
}

impl HashIds {
    fn fresh(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// The ids of one prompt; `None` when its hash blocks do not divide `block_size`.
    fn of(&mut self, r: &Request, block_size: usize) -> Option<Vec<u64>> {
        let mut ids: Vec<u64> = r
            .prompt
            .coarse(block_size)?
            .into_iter()
            .map(|prefix| match self.by_prefix.get(&prefix) {
                Some(&id) => id,
                None => {
                    let id = self.fresh();
                    self.by_prefix.insert(prefix, id);
                    id
                }
            })
            .collect();
        if r.prompt.tokens % block_size != 0 {
            ids.push(self.fresh());
        }
        Some(ids)
    }
}

/// Writes `requests` (any order) as the trace `plan` asks for.
pub(crate) fn write(
    mut requests: Vec<Request>,
    plan: &OutputPlan,
    source_name: &str,
) -> Result<Converted, ConvertError> {
    if requests.is_empty() {
        return Err(ConvertError::Empty {
            source_name: source_name.to_string(),
            why: "nothing to write".to_string(),
        });
    }
    requests.sort_by_key(|r| (r.start_us, r.line));
    let t0 = requests.iter().map(|r| r.start_us).min().unwrap_or(0);
    let mut ids = HashIds::default();
    // By session: the previous turn's index in `requests`.
    let mut last_of: HashMap<&str, usize> = HashMap::new();
    let mut text = String::new();
    let mut overlapping_turns = 0;
    let mut empty_outputs = 0;
    let mut sessions = 0;
    if plan.format == OutputFormat::AgenticMooncake {
        push_json(
            &mut text,
            &AgenticHeader {
                schema: AGENTIC_MOONCAKE_SCHEMA,
                version: 2,
                block_size: plan.block_size,
                hash_id_scope: "global",
                source: AgenticSource {
                    format: plan.source_format,
                    digest: &plan.source_digest,
                },
            },
        );
    }
    for (i, r) in requests.iter().enumerate() {
        if r.prompt.tokens == 0 {
            return Err(line_error(
                source_name,
                r,
                "the prompt has no tokens".into(),
            ));
        }
        if r.prompt.tokens > MAX_ROW_TOKENS {
            return Err(line_error(
                source_name,
                r,
                format!(
                    "the prompt has {} tokens, more than the {MAX_ROW_TOKENS} a trace row may hold",
                    r.prompt.tokens
                ),
            ));
        }
        if r.output_length > MAX_ROW_OUTPUT_TOKENS as u64 {
            return Err(line_error(
                source_name,
                r,
                format!(
                    "{} output tokens, more than the {MAX_ROW_OUTPUT_TOKENS} a trace row may hold",
                    r.output_length
                ),
            ));
        }
        let output_length = r.output_length.max(1);
        empty_outputs += usize::from(r.output_length == 0);
        let hash_ids = ids.of(r, plan.block_size).ok_or_else(|| {
            line_error(
                source_name,
                r,
                format!(
                    "the prompt is hashed in blocks of {} tokens: --block-size {} is not a \
                     multiple of it",
                    r.prompt.block_size, plan.block_size
                ),
            )
        })?;
        // The previous turn of the conversation, and the think time after its end.
        let previous = r.session.as_deref().and_then(|s| last_of.insert(s, i));
        let think_us = previous.map(|p| {
            let prev = &requests[p];
            let prev_end = prev.end_us.unwrap_or(prev.start_us);
            if r.start_us < prev_end {
                overlapping_turns += 1;
            }
            r.start_us.saturating_sub(prev_end)
        });
        if previous.is_none() {
            sessions += 1;
        }
        let session = r.session.as_deref();
        match plan.format {
            OutputFormat::Mooncake => push_json(
                &mut text,
                &MooncakeRow {
                    request_id: &r.request_id,
                    session_id: session,
                    timestamp: think_us.is_none().then(|| ms(r.start_us - t0)),
                    delay: think_us.map(ms),
                    input_length: r.prompt.tokens,
                    output_length,
                    hash_ids: &hash_ids,
                },
            ),
            OutputFormat::AgenticMooncake => {
                let play = session.unwrap_or(&r.request_id);
                let dependencies = match (previous, think_us) {
                    (Some(p), Some(think)) => vec![AgenticDependency {
                        request_id: &requests[p].request_id,
                        trigger: "completion",
                        relation: "sequence",
                        delay_ms: ms(think),
                    }],
                    _ => Vec::new(),
                };
                push_json(
                    &mut text,
                    &AgenticRow {
                        request_id: &r.request_id,
                        play_id: play,
                        session_id: play,
                        model: plan
                            .model
                            .as_deref()
                            .or(r.model.as_deref())
                            .unwrap_or("unknown"),
                        input_length: r.prompt.tokens,
                        output_length,
                        hash_ids: &hash_ids,
                        not_before_ms: if previous.is_some() {
                            0.0
                        } else {
                            ms(r.start_us - t0)
                        },
                        dependencies,
                    },
                );
            }
        }
    }
    Ok(Converted {
        text,
        requests: requests.len(),
        sessions,
        hash_ids: ids.next,
        overlapping_turns,
        empty_outputs,
    })
}

fn line_error(source_name: &str, r: &Request, message: String) -> ConvertError {
    ConvertError::Line {
        source_name: source_name.to_string(),
        line: r.line,
        message,
    }
}

/// Appends one JSON line (these rows always serialize).
fn push_json(text: &mut String, row: &impl Serialize) {
    if let Ok(line) = serde_json::to_string(row) {
        text.push_str(&line);
        text.push('\n');
    }
}
