//! `agentic_mooncake` traces lowered into a [`RequestGraph`]: version 2 (a
//! `dynamo.agentic_mooncake` header line, then one node per row with explicit dependencies)
//! and legacy v1 (no header; `wait_for` lists become completion edges).
//!
//! Hash ids are file-global in both: equal ids in two plays are the same KV blocks.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Deserialize;

use super::graph::{
    build, check_delay, check_lengths, for_each_line, json_row, HashScope, RawDependency, RawNode,
    Relation, RequestGraph, TraceFormat, Trigger,
};
use super::parse::{id_string, show};
use super::{TraceError, TraceRequest, MAX_TIMESTAMP_MS, MAX_TRACE_BLOCK_SIZE};
use crate::time::SimDuration;

/// The `schema` of a version 2 header.
pub const AGENTIC_MOONCAKE_SCHEMA: &str = "dynamo.agentic_mooncake";

/// A v2 header line.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    version: Option<serde_json::Value>,
    #[serde(default)]
    block_size: Option<serde_json::Value>,
    #[serde(default)]
    source: Option<serde_json::Value>,
}

/// A v2 row; fields optional so that missing ones get our own messages.
#[derive(Deserialize)]
struct V2Row {
    #[serde(default)]
    request_id: Option<serde_json::Value>,
    #[serde(default)]
    play_id: Option<serde_json::Value>,
    #[serde(default)]
    session_id: Option<serde_json::Value>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, alias = "input_tokens")]
    input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    not_before_ms: Option<f64>,
    #[serde(default)]
    dependencies: Option<Vec<V2Dependency>>,
    #[serde(default)]
    output_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    source_play_ordinal: Option<u64>,
}

/// A v2 dependency.
#[derive(Deserialize)]
struct V2Dependency {
    #[serde(default)]
    request_id: Option<serde_json::Value>,
    #[serde(default)]
    trigger: Option<String>,
    #[serde(default)]
    relation: Option<String>,
    #[serde(default)]
    delay_ms: Option<f64>,
}

/// A legacy v1 row.
#[derive(Deserialize)]
struct V1Row {
    #[serde(default)]
    request_id: Option<serde_json::Value>,
    #[serde(default)]
    session_id: Option<serde_json::Value>,
    #[serde(default, alias = "created_time")]
    timestamp: Option<f64>,
    #[serde(default)]
    wait_for: Option<Vec<serde_json::Value>>,
    #[serde(default, alias = "delay_ms")]
    delay: Option<f64>,
    #[serde(default)]
    tool_wait_ms: Option<f64>,
    #[serde(default, alias = "input_tokens")]
    input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    output_length: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
}

fn missing(field: &str) -> String {
    format!("missing field \"{field}\"")
}

/// Reads an `agentic_mooncake` trace: v2 when the first non-blank row is a
/// `dynamo.agentic_mooncake` header (its `block_size` wins over `trace_block_size`), legacy v1
/// otherwise (with `trace_block_size` tokens per hash id).
pub(super) fn parse(
    reader: impl BufRead,
    source_name: &str,
    trace_block_size: usize,
) -> Result<RequestGraph, TraceError> {
    let mut state = State::Start;
    let mut nodes: Vec<RawNode> = Vec::new();
    let mut hashes = HashScope::default();
    let mut ordinals = Ordinals::default();
    for_each_line(reader, source_name, |line, text| {
        if let State::Start = state {
            let value: serde_json::Value = json_row(text)?;
            let is_header =
                value.get("schema").and_then(|s| s.as_str()) == Some(AGENTIC_MOONCAKE_SCHEMA);
            if is_header {
                state = header(value)?;
                return Ok(());
            }
            state = State::V1;
        }
        match &state {
            State::V2 { block_size, .. } => {
                let (node, ordinal) = v2_row(text, line, *block_size, &mut hashes)?;
                ordinals.note(&node.play_id, ordinal, line)?;
                nodes.push(node);
            }
            State::V1 | State::Start => {
                nodes.push(v1_row(text, line, trace_block_size, &mut hashes)?);
            }
        }
        Ok(())
    })?;
    match state {
        State::V2 { block_size, source } => {
            let mut graph = build(
                nodes,
                source_name,
                TraceFormat::AgenticMooncake,
                block_size,
                source,
            )?;
            ordinals
                .apply(&mut graph)
                .map_err(|(line, message)| TraceError::Line {
                    source_name: source_name.to_string(),
                    line,
                    message,
                })?;
            Ok(graph)
        }
        State::V1 | State::Start => {
            name_legacy_plays(&mut nodes);
            build(
                nodes,
                source_name,
                TraceFormat::AgenticMooncake,
                trace_block_size,
                None,
            )
        }
    }
}

/// The `source_play_ordinal`s of v2 rows: on every row or none, one per play, and (checked
/// once every row is read) running from 0 without gaps.
#[derive(Default)]
struct Ordinals {
    /// Whether the first row had one.
    used: Option<bool>,
    /// Play id -> (its ordinal, the line that set it).
    of_play: HashMap<String, (u64, usize)>,
    /// Ordinal -> play id.
    play_of: HashMap<u64, String>,
}

impl Ordinals {
    /// Row `line` of play `play` has `ordinal`.
    fn note(&mut self, play: &str, ordinal: Option<u64>, line: usize) -> Result<(), String> {
        if *self.used.get_or_insert(ordinal.is_some()) != ordinal.is_some() {
            return Err("\"source_play_ordinal\" must be set on every row or on none".to_string());
        }
        let Some(ordinal) = ordinal else {
            return Ok(());
        };
        match self.of_play.get(play) {
            Some(&(o, at)) if o != ordinal => Err(format!(
                "\"source_play_ordinal\" {ordinal} differs from play \"{play}\"'s {o} (line {at})"
            )),
            Some(_) => Ok(()),
            None => {
                if let Some(other) = self.play_of.get(&ordinal) {
                    return Err(format!(
                        "\"source_play_ordinal\" {ordinal} is play \"{other}\"'s already"
                    ));
                }
                self.of_play.insert(play.to_string(), (ordinal, line));
                self.play_of.insert(ordinal, play.to_string());
                Ok(())
            }
        }
    }

    /// Sets each play's ordinal; an error (line, message) when they do not run from 0 without
    /// gaps.
    fn apply(self, graph: &mut RequestGraph) -> Result<(), (usize, String)> {
        if self.of_play.is_empty() {
            return Ok(());
        }
        let plays = graph.plays.len() as u64;
        if let Some((&(o, line), play)) = self
            .of_play
            .iter()
            .map(|(play, at)| (at, play))
            .filter(|((o, _), _)| *o >= plays)
            .min_by_key(|((_, line), _)| *line)
        {
            return Err((
                line,
                format!(
                    "\"source_play_ordinal\" {o} of play \"{play}\" leaves a gap: {plays} plays \
                     run from 0 to {}",
                    plays - 1
                ),
            ));
        }
        for play in &mut graph.plays {
            play.ordinal = self.of_play.get(&play.id).map(|&(o, _)| o);
        }
        Ok(())
    }
}

/// What the rows are, once the first one is read.
enum State {
    Start,
    V2 {
        block_size: usize,
        source: Option<serde_json::Value>,
    },
    V1,
}

/// The v2 header's block size and provenance.
fn header(value: serde_json::Value) -> Result<State, String> {
    let header: Header =
        serde_json::from_value(value).map_err(|e| format!("invalid v2 header: {e}"))?;
    match header.version.as_ref().and_then(|v| v.as_u64()) {
        Some(2) => {}
        Some(v) => {
            return Err(format!(
                "unsupported agentic Mooncake version {v}; expected 2"
            ))
        }
        None => {
            return Err(format!(
                "the header's \"version\" must be the integer 2, got {}",
                header
                    .version
                    .map_or_else(|| "nothing".to_string(), |v| v.to_string())
            ))
        }
    }
    let block_size = header
        .block_size
        .as_ref()
        .and_then(|b| b.as_u64())
        .and_then(|b| usize::try_from(b).ok())
        .filter(|b| (1..=MAX_TRACE_BLOCK_SIZE).contains(b))
        .ok_or_else(|| {
            format!(
                "the header's \"block_size\" must be an integer from 1 to \
                 {MAX_TRACE_BLOCK_SIZE}, got {}",
                header
                    .block_size
                    .map_or_else(|| "nothing".to_string(), |v| v.to_string())
            )
        })?;
    Ok(State::V2 {
        block_size,
        source: header.source,
    })
}

/// One v2 row: every required field present, exactly `ceil(input_length / block_size)` hash
/// ids, dependencies with known trigger and relation names.
fn v2_row(
    text: &str,
    line: usize,
    block_size: usize,
    hashes: &mut HashScope,
) -> Result<(RawNode, Option<u64>), String> {
    let row: V2Row = json_row(text)?;
    let request_id = id_string(
        "request_id",
        row.request_id.ok_or_else(|| missing("request_id"))?,
    )?;
    let play_id = id_string("play_id", row.play_id.ok_or_else(|| missing("play_id"))?)?;
    if play_id.is_empty() {
        return Err("\"play_id\" must not be empty".to_string());
    }
    let session_id = id_string(
        "session_id",
        row.session_id.ok_or_else(|| missing("session_id"))?,
    )?;
    row.model.ok_or_else(|| missing("model"))?;
    let input_length = row.input_length.ok_or_else(|| missing("input_length"))?;
    let output_length = match (row.output_length, &row.output_token_ids) {
        (Some(n), Some(ids)) if ids.len() as u64 != n => {
            return Err(format!(
                "\"output_token_ids\" holds {} ids, \"output_length\" is {n}",
                ids.len()
            ))
        }
        (Some(n), _) => n,
        (None, Some(ids)) => ids.len() as u64,
        (None, None) => return Err(missing("output_length")),
    };
    check_lengths(input_length, output_length)?;
    // A v2 row names the tokens its request generated: none is no request to replay.
    if output_length == 0 {
        return Err("\"output_length\" must be >= 1, got 0".to_string());
    }
    let not_before_ms = row.not_before_ms.ok_or_else(|| missing("not_before_ms"))?;
    if !(not_before_ms.is_finite() && (0.0..=MAX_TIMESTAMP_MS).contains(&not_before_ms)) {
        return Err(format!(
            "\"not_before_ms\" must be finite, >= 0 and at most {} ms, got {}",
            show(MAX_TIMESTAMP_MS),
            show(not_before_ms)
        ));
    }
    let input_length = input_length as usize;
    let needed = input_length.div_ceil(block_size);
    hashes.hold(needed)?;
    let hash_ids = match row.hash_ids {
        Some(ids) if ids.len() != needed => {
            return Err(format!(
                "\"hash_ids\" holds {} ids; input_length {input_length} at block size \
                 {block_size} needs exactly {needed}",
                ids.len()
            ))
        }
        Some(ids) => ids.into_iter().map(|id| hashes.intern(0, id)).collect(),
        None => (0..needed).map(|_| hashes.private()).collect(),
    };
    let mut dependencies = Vec::new();
    for (k, dep) in row.dependencies.unwrap_or_default().into_iter().enumerate() {
        let at = |m: String| format!("dependency {k}: {m}");
        let source = id_string(
            "request_id",
            dep.request_id.ok_or_else(|| at(missing("request_id")))?,
        )
        .map_err(at)?;
        let trigger = match dep.trigger.as_deref() {
            Some("dispatch") => Trigger::Dispatch,
            Some("completion") => Trigger::Completion,
            Some(other) => {
                return Err(at(format!(
                    "unknown trigger \"{other}\" (expected dispatch or completion)"
                )))
            }
            None => return Err(at(missing("trigger"))),
        };
        let relation = match dep.relation.as_deref() {
            Some("sequence") => Relation::Sequence,
            Some("spawn") => Relation::Spawn,
            Some("join") => Relation::Join,
            Some("replay_barrier") => Relation::ReplayBarrier,
            Some(other) => {
                return Err(at(format!(
                    "unknown relation \"{other}\" (expected sequence, spawn, join or \
                     replay_barrier)"
                )))
            }
            None => return Err(at(missing("relation"))),
        };
        let delay_ms = check_delay("delay_ms", dep.delay_ms.unwrap_or(0.0)).map_err(at)?;
        dependencies.push(RawDependency {
            source,
            trigger,
            relation,
            delay_ms,
        });
    }
    let node = RawNode {
        request: TraceRequest {
            line,
            request_id: Some(request_id),
            input_length,
            requested_input_length: None,
            output_length: output_length.max(1) as usize,
            hash_ids,
            delay: SimDuration::ZERO,
        },
        play_id,
        session_id,
        not_before_ms,
        dependencies,
    };
    Ok((node, row.source_play_ordinal))
}

/// One legacy row: `wait_for` ids become completion edges of `delay + tool_wait_ms`; rows
/// without them start at `timestamp` (default 0), rows with them at 0. Hash ids beyond the
/// prompt are dropped and missing ones are private blocks. Plays are named afterwards
/// ([`name_legacy_plays`]).
fn v1_row(
    text: &str,
    line: usize,
    block_size: usize,
    hashes: &mut HashScope,
) -> Result<RawNode, String> {
    let row: V1Row = json_row(text)?;
    let request_id = id_string(
        "request_id",
        row.request_id.ok_or_else(|| missing("request_id"))?,
    )?;
    let session_id = match row.session_id {
        Some(id) => id_string("session_id", id)?,
        None => "agentic-session".to_string(),
    };
    let ids = row.hash_ids.unwrap_or_default();
    let input_length = match row.input_length {
        Some(n) => n,
        None => (ids.len() as u64).saturating_mul(block_size as u64),
    };
    let output_length = row.output_length.ok_or_else(|| missing("output_length"))?;
    check_lengths(input_length, output_length)?;
    let input_length = input_length as usize;
    let needed = input_length.div_ceil(block_size);
    hashes.hold(needed)?;
    let hash_ids = (0..needed)
        .map(|i| match ids.get(i) {
            Some(&id) => hashes.intern(0, id),
            None => hashes.private(),
        })
        .collect();
    let timestamp = row.timestamp.unwrap_or(0.0);
    if !(timestamp.is_finite() && (0.0..=MAX_TIMESTAMP_MS).contains(&timestamp)) {
        return Err(format!(
            "\"timestamp\" must be finite, >= 0 and at most {} ms, got {}",
            show(MAX_TIMESTAMP_MS),
            show(timestamp)
        ));
    }
    let delay = check_delay("delay", row.delay.unwrap_or(0.0))?;
    let tool_wait = check_delay("tool_wait_ms", row.tool_wait_ms.unwrap_or(0.0))?;
    let wait_for = row.wait_for.unwrap_or_default();
    let mut dependencies = Vec::with_capacity(wait_for.len());
    for id in wait_for {
        dependencies.push(RawDependency {
            source: id_string("wait_for", id)?,
            trigger: Trigger::Completion,
            relation: Relation::Sequence,
            delay_ms: check_delay("delay + tool_wait_ms", delay + tool_wait)?,
        });
    }
    Ok(RawNode {
        request: TraceRequest {
            line,
            request_id: Some(request_id),
            input_length,
            requested_input_length: None,
            output_length: output_length.max(1) as usize,
            hash_ids,
            delay: SimDuration::ZERO,
        },
        play_id: String::new(),
        session_id,
        not_before_ms: if dependencies.is_empty() {
            timestamp
        } else {
            0.0
        },
        dependencies,
    })
}

/// Names each connected component of a legacy trace `legacy-play:<its first request_id>`.
/// Unknown `wait_for` ids are left for the graph's own check.
fn name_legacy_plays(nodes: &mut [RawNode]) {
    let index: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.id().to_string(), i))
        .collect();
    let mut parent: Vec<usize> = (0..nodes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for (i, node) in nodes.iter().enumerate() {
        for dep in &node.dependencies {
            if let Some(&s) = index.get(&dep.source) {
                let (a, b) = (root(&mut parent, i), root(&mut parent, s));
                // The smaller index (earlier row) names the component.
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    for i in 0..nodes.len() {
        let r = root(&mut parent, i);
        nodes[i].play_id = format!("legacy-play:{}", nodes[r].id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::graph::TraceFormat;

    const HEADER: &str = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64,"hash_id_scope":"local","source":{"format":"hand","digest":"x"}}"#;

    fn row(id: &str, play: &str, hash_ids: &str, deps: &str) -> String {
        format!(
            r#"{{"request_id":"{id}","play_id":"{play}","session_id":"main","model":"M","input_length":256,"output_length":8,"hash_ids":{hash_ids},"not_before_ms":0,"dependencies":[{deps}]}}"#
        )
    }

    fn dep(source: &str, trigger: &str, relation: &str) -> String {
        format!(
            r#"{{"request_id":"{source}","trigger":"{trigger}","relation":"{relation}","delay_ms":5}}"#
        )
    }

    fn graph(rows: &[String]) -> Result<RequestGraph, TraceError> {
        let text = rows.join("\n");
        parse(text.as_bytes(), "t.jsonl", 512)
    }

    fn err_of(rows: &[String]) -> (usize, String) {
        match graph(rows) {
            Err(TraceError::Line { line, message, .. }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    const IDS: &str = "[1,2,3,4]";

    #[test]
    fn a_v2_trace_reads_into_a_graph_with_file_global_hash_ids() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/agentic/worked_example.jsonl"
        );
        let text = std::fs::read_to_string(path).expect("fixture");
        let g = parse(text.as_bytes(), "w.jsonl", 512).expect("parses");
        assert_eq!(g.format, TraceFormat::AgenticMooncake);
        assert_eq!(g.block_size, 64, "the header's block size wins");
        assert_eq!(g.nodes.len(), 5);
        let plays: Vec<(&str, usize)> = g
            .plays
            .iter()
            .map(|p| (p.id.as_str(), p.nodes.len()))
            .collect();
        assert_eq!(plays, [("p0", 4), ("p1", 1)]);
        let r3 = &g.nodes[3];
        assert_eq!(r3.request.line, 5);
        assert_eq!(r3.dependencies.len(), 2);
        assert_eq!(r3.dependencies[1].source, 1);
        assert_eq!(r3.dependencies[1].relation, Relation::Join);
        assert_eq!(r3.dependencies[1].delay_ms, 50.0);
        assert_eq!(g.nodes[1].dependencies[0].trigger, Trigger::Dispatch);
        // q0's ids are p0's: the same dense ids, in first-seen order.
        assert_eq!(g.nodes[0].request.hash_ids, [0, 1, 2, 3]);
        assert_eq!(g.nodes[4].request.hash_ids, [0, 1, 2, 3]);
        assert_eq!(g.nodes[1].request.hash_ids, [0, 1, 2, 3, 4]);
        assert_eq!(g.nodes[4].not_before_ms, 300.0);
        assert_eq!(
            g.source,
            Some(serde_json::json!({"format":"hand","digest":"x"}))
        );
    }

    #[test]
    fn legacy_rows_become_completion_edges_and_connected_plays() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/agentic/legacy_v1.jsonl"
        );
        let text = std::fs::read_to_string(path).expect("fixture");
        let g = parse(text.as_bytes(), "v1.jsonl", 64).expect("parses");
        assert_eq!(g.block_size, 64, "the configured block size");
        let plays: Vec<&str> = g.plays.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(plays, ["legacy-play:a0", "legacy-play:b0"]);
        let a1 = &g.nodes[1];
        assert_eq!(a1.play, 0);
        assert_eq!(a1.not_before_ms, 0.0);
        let d = &a1.dependencies[0];
        assert_eq!(
            (d.source, d.trigger, d.relation),
            (0, Trigger::Completion, Relation::Sequence)
        );
        assert_eq!(d.delay_ms, 500.0, "delay + tool_wait_ms");
        assert_eq!(g.nodes[2].not_before_ms, 300.0);
        assert_eq!(g.nodes[2].session_id, "other");
        // Two roots joined by one row are one play.
        let joined = "{\"request_id\":\"x\",\"output_length\":1,\"hash_ids\":[1]}\n\
                      {\"request_id\":\"y\",\"output_length\":1,\"hash_ids\":[2]}\n\
                      {\"request_id\":\"z\",\"wait_for\":[\"y\",\"x\"],\"output_length\":1,\"hash_ids\":[3]}\n";
        let g = parse(joined.as_bytes(), "j.jsonl", 4).expect("parses");
        assert_eq!(g.plays.len(), 1);
        assert_eq!(g.plays[0].id, "legacy-play:x");
        assert_eq!(g.nodes[0].session_id, "agentic-session");
    }

    #[test]
    fn source_play_ordinals_are_on_every_row_one_per_play_and_without_gaps() {
        let h = HEADER.to_string();
        let with = |id: &str, play: &str, o: u64| {
            row(id, play, IDS, "").replace(
                "\"dependencies\"",
                &format!("\"source_play_ordinal\":{o},\"dependencies\""),
            )
        };
        let g = graph(&[
            h.clone(),
            with("a", "zz", 0),
            with("b", "aa", 1),
            with("c", "zz", 0),
        ])
        .expect("parses");
        let ordinals: Vec<(&str, Option<u64>)> =
            g.plays.iter().map(|p| (p.id.as_str(), p.ordinal)).collect();
        assert_eq!(ordinals, [("zz", Some(0)), ("aa", Some(1))]);
        let (line, m) = err_of(&[h.clone(), with("a", "p", 0), row("b", "q", IDS, "")]);
        assert_eq!(
            (line, m.as_str()),
            (
                3,
                "\"source_play_ordinal\" must be set on every row or on none"
            )
        );
        let (line, m) = err_of(&[h.clone(), with("a", "p", 0), with("b", "p", 1)]);
        assert_eq!(
            (line, m.as_str()),
            (
                3,
                "\"source_play_ordinal\" 1 differs from play \"p\"'s 0 (line 2)"
            )
        );
        let (line, m) = err_of(&[h.clone(), with("a", "p", 0), with("b", "q", 0)]);
        assert_eq!(
            (line, m.as_str()),
            (3, "\"source_play_ordinal\" 0 is play \"p\"'s already")
        );
        let (line, m) = err_of(&[h.clone(), with("a", "p", 0), with("b", "q", 2)]);
        assert_eq!(line, 3);
        assert_eq!(
            m,
            "\"source_play_ordinal\" 2 of play \"q\" leaves a gap: 2 plays run from 0 to 1"
        );
    }

    #[test]
    fn graph_errors_name_the_row_and_use_the_references_words() {
        let h = HEADER.to_string();
        // Dangling dependency.
        let (line, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, ""),
            row("b", "p", IDS, &dep("zz", "completion", "sequence")),
        ]);
        assert_eq!(
            (line, m.as_str()),
            (3, "dependency on unknown request_id \"zz\"")
        );
        // A cycle: a -> b -> a, reported on the first row of it.
        let (line, m) = err_of(&[
            h.clone(),
            row("root", "p", IDS, ""),
            row("a", "p", IDS, &dep("b", "completion", "sequence")),
            row("b", "p", IDS, &dep("a", "completion", "sequence")),
        ]);
        assert_eq!(
            (line, m.as_str()),
            (3, "dependency cycle: \"b\" -> \"a\" -> \"b\"")
        );
        let (line, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, &dep("a", "completion", "sequence")),
        ]);
        assert_eq!((line, m.as_str()), (2, "dependency cycle: \"a\" -> \"a\""));
        // Across plays.
        let (line, m) = err_of(&[
            h.clone(),
            row("a", "p0", IDS, ""),
            row("b", "p1", IDS, &dep("a", "completion", "spawn")),
        ]);
        assert_eq!(line, 3);
        assert_eq!(
            m,
            "dependency on \"a\" crosses plays: it is in play \"p0\", this row in play \"p1\""
        );
        // Join (sequence, replay_barrier) with a dispatch trigger; spawn may use it.
        for relation in ["join", "sequence", "replay_barrier"] {
            let (line, m) = err_of(&[
                h.clone(),
                row("a", "p", IDS, ""),
                row("b", "p", IDS, &dep("a", "dispatch", relation)),
            ]);
            assert_eq!(line, 3);
            assert!(
                m.starts_with("invalid ") && m.contains(" dependency with Dispatch trigger"),
                "{m}"
            );
        }
        let (_, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, ""),
            row("b", "p", IDS, &dep("a", "dispatch", "join")),
        ]);
        assert!(
            m.starts_with("invalid Join dependency with Dispatch trigger"),
            "{m}"
        );
        graph(&[
            h.clone(),
            row("a", "p", IDS, ""),
            row("b", "p", IDS, &dep("a", "dispatch", "spawn")),
        ])
        .expect("spawn may use dispatch");
        // Hash ids: exactly ceil(256 / 64) = 4.
        let (line, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, ""),
            row("b", "p", "[1,2,3]", ""),
        ]);
        assert_eq!(line, 3);
        assert_eq!(
            m,
            "\"hash_ids\" holds 3 ids; input_length 256 at block size 64 needs exactly 4"
        );
        let (line, _) = err_of(&[h.clone(), row("a", "p", "[1,2,3,4,5]", "")]);
        assert_eq!(line, 2);
        // Duplicates, versions, missing fields, unknown names.
        let (line, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, ""),
            String::new(),
            row("a", "p", IDS, ""),
        ]);
        assert_eq!(
            (line, m.as_str()),
            (4, "\"a\" duplicates request_id of line 2")
        );
        let (line, m) = err_of(&[h.replace("\"version\":2", "\"version\":3")]);
        assert_eq!(
            (line, m.as_str()),
            (1, "unsupported agentic Mooncake version 3; expected 2")
        );
        let (_, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, "").replace("\"model\":\"M\",", ""),
        ]);
        assert_eq!(m, "missing field \"model\"");
        let (_, m) = err_of(&[
            h.clone(),
            row("a", "p", IDS, ""),
            row("b", "p", IDS, &dep("a", "later", "sequence")),
        ]);
        assert_eq!(
            m,
            "dependency 0: unknown trigger \"later\" (expected dispatch or completion)"
        );
        let (_, m) = err_of(&[h.clone(), row("a", "", IDS, "")]);
        assert_eq!(m, "\"play_id\" must not be empty");
        let (line, m) = err_of(&[h.clone(), "{not json".to_string()]);
        assert_eq!(line, 2);
        assert!(m.starts_with("invalid JSON row"), "{m}");
        assert!(matches!(graph(&[h]), Err(TraceError::Empty { .. })));
    }

    /// A v2 row generates at least one token (issue 43): `output_length: 0`, or an empty
    /// `output_token_ids` without it, is an error of its line.
    #[test]
    fn a_v2_row_of_no_output_tokens_is_refused() {
        let h = HEADER.to_string();
        let zero = row("a", "p", IDS, "").replace("\"output_length\":8", "\"output_length\":0");
        let (line, m) = err_of(&[h.clone(), row("b", "p", IDS, ""), zero]);
        assert_eq!(
            (line, m.as_str()),
            (3, "\"output_length\" must be >= 1, got 0")
        );
        let no_ids =
            row("a", "p", IDS, "").replace("\"output_length\":8", "\"output_token_ids\":[]");
        assert_eq!(err_of(&[h.clone(), no_ids]).0, 2);
        let one = row("a", "p", IDS, "").replace("\"output_length\":8", "\"output_length\":1");
        let g = graph(&[h, one]).expect("one token is a request");
        assert_eq!(g.nodes[0].request.output_length, 1);
    }

    /// A row of exactly `MAX_TRACE_LINE_BYTES` is read; one byte more is refused with the
    /// file, the line and the cap, before it is parsed (issue 43).
    #[test]
    fn a_row_one_byte_over_the_line_cap_is_refused_with_its_line() {
        use crate::trace::MAX_TRACE_LINE_BYTES;
        let padded = |len: usize| {
            let r = row("a", "p", IDS, "");
            format!("{r}{}", " ".repeat(len - r.len()))
        };
        let g = graph(&[HEADER.to_string(), padded(MAX_TRACE_LINE_BYTES)]).expect("at the cap");
        assert_eq!(g.nodes.len(), 1);
        let e = graph(&[HEADER.to_string(), padded(MAX_TRACE_LINE_BYTES + 1)]).expect_err("over");
        assert_eq!(
            e.to_string(),
            "t.jsonl:2: the line is longer than 16777216 bytes, the most a trace line may hold"
        );
    }
}
