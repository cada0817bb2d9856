//! `dynamo.request.trace.v1` request records lowered into a [`RequestGraph`].
//!
//! One JSON record per line, bare or wrapped (`{"timestamp": .., "event": {..}}`), with
//! `schema: "dynamo.request.trace.v1"`. `request_end` records are replayed; `tool_end` and
//! `tool_error` records are read for their `tool.claude` links; `tool_start` and
//! `request_payload` are skipped; any other `event_type` is an error. A request starts at
//! `request_received_ms` (else `event_time_unix_ms - total_time_ms`) and ends at its start plus
//! `total_time_ms` (else at `event_time_unix_ms`); its prompt is `replay.input_length` tokens
//! whose blocks are `replay.input_sequence_hashes` (file-global ids), `replay.trace_block_size`
//! tokens each, the same on every row.
//!
//! Without `agent_context` every request is a root of its own play, at its start minus the
//! first start (a plain Mooncake replay of independent requests). With it (on every row):
//! each session is chained in start order (sequence, completion, `start - previous end`); a child
//! session (`parent_session_id`) is spawned on dispatch from the latest parent request started
//! by the child's start (delay: the difference of the starts); the earliest parent request
//! starting at or after the child's last end joins it (completion, from the child's
//! latest-ending request). A `tool_end` whose `tool.claude` names `child_session_id` and
//! `source_request_id` (and `consumer_request_id`) fixes that spawn's source (and the join's
//! consumer; a `background` child without one is not joined). Roots start at their start minus
//! the first start, dependent requests at 0; plays are connected components,
//! `dynamo-play:<first request_id>`.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Deserialize;

use super::graph::{
    build, check_lengths, for_each_line, json_row, HashScope, RawDependency, RawNode, Relation,
    RequestGraph, TraceFormat, Trigger,
};
use super::parse::{id_string, show};
use super::{TraceError, TraceRequest, MAX_TIMESTAMP_MS, MAX_TRACE_BLOCK_SIZE};
use crate::time::SimDuration;

/// The `schema` of every record.
pub(crate) const DYNAMO_REQUEST_TRACE_SCHEMA: &str = "dynamo.request.trace.v1";

/// A record, bare or inside a wrapper's `event`.
#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    event_type: Option<String>,
    #[serde(default)]
    event_time_unix_ms: Option<f64>,
    #[serde(default)]
    agent_context: Option<AgentContext>,
    #[serde(default)]
    request: Option<RequestPart>,
    #[serde(default)]
    tool: Option<ToolPart>,
    #[serde(default)]
    event: Option<Box<Record>>,
}

#[derive(Deserialize)]
struct AgentContext {
    #[serde(default)]
    session_id: Option<serde_json::Value>,
    #[serde(default)]
    parent_session_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct RequestPart {
    #[serde(default)]
    request_id: Option<serde_json::Value>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    request_received_ms: Option<f64>,
    #[serde(default)]
    total_time_ms: Option<f64>,
    #[serde(default)]
    replay: Option<ReplayPart>,
}

#[derive(Deserialize)]
struct ReplayPart {
    #[serde(default)]
    trace_block_size: Option<u64>,
    #[serde(default)]
    input_length: Option<u64>,
    #[serde(default)]
    input_sequence_hashes: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct ToolPart {
    #[serde(default)]
    claude: Option<ClaudeLink>,
}

#[derive(Deserialize)]
struct ClaudeLink {
    #[serde(default)]
    source_request_id: Option<serde_json::Value>,
    #[serde(default)]
    consumer_request_id: Option<serde_json::Value>,
    #[serde(default)]
    child_session_id: Option<serde_json::Value>,
    #[serde(default)]
    execution_mode: Option<String>,
}

/// A replayed request as read.
struct Request {
    line: usize,
    id: String,
    session: Option<String>,
    parent_session: Option<String>,
    start_ms: f64,
    end_ms: f64,
    input_length: usize,
    output_length: usize,
    hash_ids: Vec<u64>,
}

/// A `tool.claude` link.
struct Link {
    source: Option<String>,
    consumer: Option<String>,
    background: bool,
}

fn missing(field: &str) -> String {
    format!("missing field \"{field}\"")
}

fn time(field: &str, ms: f64) -> Result<f64, String> {
    if ms.is_finite() && (0.0..=MAX_TIMESTAMP_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!(
            "\"{field}\" must be finite, >= 0 and at most {} ms, got {}",
            show(MAX_TIMESTAMP_MS),
            show(ms)
        ))
    }
}

/// Reads a request trace (see the module doc).
pub(super) fn parse(reader: impl BufRead, source_name: &str) -> Result<RequestGraph, TraceError> {
    let mut requests: Vec<Request> = Vec::new();
    let mut links: HashMap<String, Link> = HashMap::new();
    let mut block_size: Option<usize> = None;
    let mut hashes = HashScope::default();
    let mut with_context: Option<bool> = None;
    for_each_line(reader, source_name, |line, text| {
        let mut record: Record = json_row(text)?;
        if let Some(event) = record.event.take() {
            record = *event;
        }
        if record.schema.as_deref() != Some(DYNAMO_REQUEST_TRACE_SCHEMA) {
            return Err(format!(
                "\"schema\" must be \"{DYNAMO_REQUEST_TRACE_SCHEMA}\", got {}",
                record
                    .schema
                    .map_or_else(|| "nothing".to_string(), |s| format!("\"{s}\""))
            ));
        }
        let kind = record.event_type.as_deref().unwrap_or_default();
        match kind {
            "request_end" => {}
            "tool_end" | "tool_error" => {
                if let Some(link) = record.tool.and_then(|t| t.claude) {
                    if let Some(child) = link.child_session_id {
                        let child = id_string("child_session_id", child)?;
                        let source = link
                            .source_request_id
                            .map(|s| id_string("source_request_id", s))
                            .transpose()?;
                        let consumer = link
                            .consumer_request_id
                            .map(|s| id_string("consumer_request_id", s))
                            .transpose()?;
                        links.insert(
                            child,
                            Link {
                                source,
                                consumer,
                                background: link.execution_mode.as_deref() == Some("background"),
                            },
                        );
                    }
                }
                return Ok(());
            }
            "tool_start" | "request_payload" => return Ok(()),
            other => {
                return Err(format!(
                    "unknown event_type \"{other}\" (expected request_end, tool_end, \
                     tool_error, tool_start or request_payload)"
                ))
            }
        }
        let event_time = time(
            "event_time_unix_ms",
            record
                .event_time_unix_ms
                .ok_or_else(|| missing("event_time_unix_ms"))?,
        )?;
        let has_context = record.agent_context.is_some();
        match with_context {
            Some(w) if w != has_context => {
                return Err(
                    "\"agent_context\" must be on every request_end record or on none".to_string(),
                )
            }
            _ => with_context = Some(has_context),
        }
        let (session, parent_session) = match record.agent_context {
            Some(c) => (
                Some(id_string(
                    "session_id",
                    c.session_id
                        .ok_or_else(|| missing("agent_context.session_id"))?,
                )?),
                c.parent_session_id
                    .map(|p| id_string("parent_session_id", p))
                    .transpose()?,
            ),
            None => (None, None),
        };
        let request = record.request.ok_or_else(|| missing("request"))?;
        let id = id_string(
            "request_id",
            request
                .request_id
                .ok_or_else(|| missing("request.request_id"))?,
        )?;
        let output_length = request
            .output_tokens
            .ok_or_else(|| missing("request.output_tokens"))?;
        let replay = request.replay.ok_or_else(|| missing("request.replay"))?;
        let b = replay
            .trace_block_size
            .and_then(|b| usize::try_from(b).ok())
            .filter(|b| (1..=MAX_TRACE_BLOCK_SIZE).contains(b))
            .ok_or_else(|| {
                format!(
                    "\"replay.trace_block_size\" must be an integer from 1 to \
                     {MAX_TRACE_BLOCK_SIZE}"
                )
            })?;
        match block_size {
            Some(first) if first != b => {
                return Err(format!(
                    "\"replay.trace_block_size\" {b} differs from the trace's {first}"
                ))
            }
            _ => block_size = Some(b),
        }
        let input_length = replay
            .input_length
            .ok_or_else(|| missing("request.replay.input_length"))?;
        check_lengths(input_length, output_length)?;
        let input_length = input_length as usize;
        let given = replay.input_sequence_hashes.unwrap_or_default();
        hashes.hold(input_length.div_ceil(b))?;
        let hash_ids = (0..input_length.div_ceil(b))
            .map(|i| match given.get(i) {
                Some(&h) => hashes.intern(0, h),
                None => hashes.private(),
            })
            .collect();
        let total = request
            .total_time_ms
            .map(|t| time("total_time_ms", t))
            .transpose()?;
        let received = request
            .request_received_ms
            .map(|t| time("request_received_ms", t))
            .transpose()?;
        let start_ms = received.unwrap_or(event_time - total.unwrap_or(0.0));
        let end_ms = match (received, total) {
            (Some(r), Some(t)) => r + t,
            _ => event_time,
        };
        requests.push(Request {
            line,
            id,
            session,
            parent_session,
            start_ms,
            end_ms,
            input_length,
            output_length: output_length.max(1) as usize,
            hash_ids,
        });
        Ok(())
    })?;
    let first_start = requests
        .iter()
        .map(|r| r.start_ms)
        .fold(f64::INFINITY, f64::min);
    let mut deps: Vec<Vec<RawDependency>> = requests.iter().map(|_| Vec::new()).collect();
    if with_context == Some(true) {
        link_sessions(&requests, &links, &mut deps);
    }
    let plays = components(&requests, &deps);
    let nodes = requests
        .into_iter()
        .zip(deps)
        .zip(plays)
        .map(|((r, dependencies), play_id)| RawNode {
            not_before_ms: if dependencies.is_empty() {
                (r.start_ms - first_start).max(0.0)
            } else {
                0.0
            },
            session_id: r.session.unwrap_or_else(|| r.id.clone()),
            request: TraceRequest {
                line: r.line,
                request_id: Some(r.id),
                input_length: r.input_length,
                requested_input_length: None,
                output_length: r.output_length,
                hash_ids: r.hash_ids,
                delay: SimDuration::ZERO,
            },
            play_id,
            dependencies,
        })
        .collect();
    build(
        nodes,
        source_name,
        TraceFormat::Dynamo,
        block_size.unwrap_or(1),
        None,
    )
}

/// Sequence edges within sessions, spawns into child sessions and joins back (module doc).
fn link_sessions(
    requests: &[Request],
    links: &HashMap<String, Link>,
    deps: &mut [Vec<RawDependency>],
) {
    let edge = |source: &Request, trigger, relation, delay_ms: f64| RawDependency {
        source: source.id.clone(),
        trigger,
        relation,
        delay_ms: delay_ms.max(0.0),
    };
    // Each session's requests in start order (ties as written).
    let mut sessions: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, r) in requests.iter().enumerate() {
        let s = r.session.as_deref().unwrap_or_default();
        let k = *index.entry(s).or_insert_with(|| {
            sessions.push((s, Vec::new()));
            sessions.len() - 1
        });
        sessions[k].1.push(i);
    }
    for (_, members) in &mut sessions {
        members.sort_by(|&a, &b| {
            requests[a]
                .start_ms
                .total_cmp(&requests[b].start_ms)
                .then(a.cmp(&b))
        });
        for w in members.windows(2) {
            let (prev, next) = (&requests[w[0]], &requests[w[1]]);
            deps[w[1]].push(edge(
                prev,
                Trigger::Completion,
                Relation::Sequence,
                next.start_ms - prev.end_ms,
            ));
        }
    }
    let by_id: HashMap<&str, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    for (name, members) in &sessions {
        let Some(&first) = members.first() else {
            continue;
        };
        let Some(parent) = requests[first].parent_session.as_deref() else {
            continue;
        };
        let Some(parent_members) = index.get(parent).map(|&k| &sessions[k].1) else {
            continue;
        };
        let link = links.get(*name);
        let child = &requests[first];
        let source = link
            .and_then(|l| l.source.as_deref())
            .and_then(|id| by_id.get(id).copied())
            .or_else(|| {
                parent_members
                    .iter()
                    .copied()
                    .rfind(|&p| requests[p].start_ms <= child.start_ms)
            });
        if let Some(p) = source {
            deps[first].push(edge(
                &requests[p],
                Trigger::Dispatch,
                Relation::Spawn,
                child.start_ms - requests[p].start_ms,
            ));
        }
        let Some(&last) = members.iter().max_by(|&&a, &&b| {
            requests[a]
                .end_ms
                .total_cmp(&requests[b].end_ms)
                .then(b.cmp(&a))
        }) else {
            continue;
        };
        let last_end = requests[last].end_ms;
        let consumer = match link {
            Some(Link {
                consumer: Some(id), ..
            }) => by_id.get(id.as_str()).copied(),
            Some(Link {
                background: true, ..
            }) => None,
            _ => parent_members
                .iter()
                .copied()
                .find(|&p| requests[p].start_ms >= last_end),
        };
        if let Some(c) = consumer {
            if !deps[c].iter().any(|d| d.source == requests[last].id) {
                deps[c].push(edge(
                    &requests[last],
                    Trigger::Completion,
                    Relation::Join,
                    requests[c].start_ms - last_end,
                ));
            }
        }
    }
}

/// Each request's play: `dynamo-play:<first request_id>` of its connected component.
fn components(requests: &[Request], deps: &[Vec<RawDependency>]) -> Vec<String> {
    let by_id: HashMap<&str, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id.as_str(), i))
        .collect();
    let mut parent: Vec<usize> = (0..requests.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (i, ds) in deps.iter().enumerate() {
        for d in ds {
            if let Some(&s) = by_id.get(d.source.as_str()) {
                let (a, b) = (root(&mut parent, i), root(&mut parent, s));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    (0..requests.len())
        .map(|i| {
            let r = root(&mut parent, i);
            format!("dynamo-play:{}", requests[r].id)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/agentic/dynamo_request_trace.jsonl"
        );
        std::fs::read_to_string(path).expect("fixture")
    }

    fn err_of(text: &str) -> (usize, String) {
        match parse(text.as_bytes(), "d.jsonl") {
            Err(TraceError::Line { line, message, .. }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn sessions_chain_and_a_child_session_is_spawned_and_joined() {
        let g = parse(fixture().as_bytes(), "d.jsonl").expect("parses");
        assert_eq!(
            (g.format, g.block_size, g.nodes.len()),
            (TraceFormat::Dynamo, 64, 3)
        );
        let ids: Vec<&str> = g.nodes.iter().map(|n| n.id()).collect();
        assert_eq!(ids, ["ps", "c0", "p1"]);
        let lines: Vec<usize> = g.nodes.iter().map(|n| n.request.line).collect();
        assert_eq!(lines, [1, 3, 5]);
        assert_eq!(g.plays.len(), 1);
        assert_eq!(g.plays[0].id, "dynamo-play:ps");
        assert_eq!(
            g.edges_of(1),
            [(Relation::Spawn, Trigger::Dispatch, 0, 50.0)]
        );
        assert_eq!(
            g.edges_of(2),
            [
                (Relation::Sequence, Trigger::Completion, 0, 300.0),
                (Relation::Join, Trigger::Completion, 1, 100.0)
            ]
        );
        let floors: Vec<f64> = g.nodes.iter().map(|n| n.not_before_ms).collect();
        assert_eq!(floors, [0.0, 0.0, 0.0]);
        // Rolling sequence hashes are the block ids, file-global.
        assert_eq!(g.nodes[2].request.hash_ids, [0, 1, 2, 3, 5]);
    }

    #[test]
    fn without_agent_context_every_request_is_a_root_at_its_start() {
        let text: String = fixture()
            .lines()
            .filter(|l| l.contains("request_end"))
            .map(|l| {
                l.replace(r#""agent_context":{"session_id":"parent"},"#, "")
                    .replace(
                        r#""agent_context":{"session_id":"child","parent_session_id":"parent"},"#,
                        "",
                    )
                    + "\n"
            })
            .collect();
        let g = parse(text.as_bytes(), "d.jsonl").expect("parses");
        assert_eq!(g.plays.len(), 3);
        let floors: Vec<f64> = g.nodes.iter().map(|n| n.not_before_ms).collect();
        assert_eq!(floors, [0.0, 50.0, 400.0]);
        assert!(g.nodes.iter().all(|n| n.dependencies.is_empty()));
    }

    #[test]
    fn malformed_records_name_their_line() {
        let text = fixture();
        let lines: Vec<&str> = text.lines().collect();
        let with = |k: usize, line: String| {
            let mut rows: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
            rows[k] = line;
            rows.join("\n")
        };
        let (line, m) = err_of(&with(2, lines[2].replace("trace.v1", "trace.v2")));
        assert_eq!(line, 3);
        assert_eq!(
            m,
            "\"schema\" must be \"dynamo.request.trace.v1\", got \"dynamo.request.trace.v2\""
        );
        let (line, m) = err_of(&with(3, lines[3].replace("tool_end", "tool_party")));
        assert_eq!(line, 4);
        assert!(m.starts_with("unknown event_type \"tool_party\""), "{m}");
        let (line, m) = err_of(&with(
            4,
            lines[4].replace(r#""agent_context":{"session_id":"parent"},"#, ""),
        ));
        assert_eq!(line, 5);
        assert_eq!(
            m,
            "\"agent_context\" must be on every request_end record or on none"
        );
        let (line, m) = err_of(&with(
            4,
            lines[4].replace("\"trace_block_size\":64", "\"trace_block_size\":32"),
        ));
        assert_eq!(
            (line, m.as_str()),
            (
                5,
                "\"replay.trace_block_size\" 32 differs from the trace's 64"
            )
        );
        let (line, m) = err_of(&with(
            4,
            lines[4].replace("\"request_id\":\"p1\"", "\"request_id\":\"ps\""),
        ));
        assert_eq!(
            (line, m.as_str()),
            (5, "\"ps\" duplicates request_id of line 1")
        );
    }
}
