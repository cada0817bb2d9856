//! `weka` traces (AgentX; AIPerf's `weka_trace`) lowered into a [`RequestGraph`].
//!
//! Each top-level JSON value is one play (or an array of plays): `id`, `block_size` (the same
//! across the corpus), `hash_id_scope` (`"local"`), `requests[]` of `n`/`s` entries (`t` s,
//! `model`, `in`, `out`, `hash_ids`, `api_time` s) and `subagent` markers (`t`, `agent_id`,
//! `subagent_type`, `status`, `duration_ms`, `requests[]`). Lowering, per play:
//!
//! - a request ends at `t + api_time` (a missing `api_time` is 0); its floor is `t` minus the
//!   play's earliest `t`, so every play starts at 0;
//! - in each scope (the root, each sub-agent), a request extends the stream whose last hashed
//!   request shares the most leading `hash_ids` with it (at least one; same model, ended by its
//!   start), else it starts a worker stream; consecutive requests of a stream are a `sequence`
//!   edge (completion, `t - end(previous)`);
//! - a scope's first request that shares no leading hash id with any other request of the scope
//!   (an opener) heads the stream of the scope's next request, by a `sequence` edge, instead
//!   of that stream being a worker stream;
//! - a worker stream is anchored to the play's first request by a dispatch `spawn`; a
//!   sub-agent's first stream is spawned from the last parent request before its marker
//!   (dispatch with `t_child - t_parent` if the child began before the parent ended, else
//!   completion with `t_child - end(parent)`);
//! - a blocking sub-agent (`status: completed`) is joined by the first later request of the
//!   stream it forked from that starts at or after its end (`t + duration_ms`, else its last
//!   inner end): completion `join` edges from each of its streams' last request, with
//!   `t - end(that request)`;
//! - within a scope, a request waits (`replay_barrier`, completion, 0) for the latest request
//!   of every other stream that started before it and ended by its start (1 µs tolerance), so
//!   one source may give a request two edges (a spawn on dispatch and a barrier on completion).
//!
//! Inner times are taken as absolute when no sub-agent request of the corpus starts before
//! its marker's `t`, else as relative to it, as AISimulate resolves one basis per corpus (a
//! play's `source.nested_timestamp_basis` `absolute` or `relative` overrides). Hash ids are
//! play-local: one per full block (`floor(in / block_size)`), missing ones private, extras
//! ignored, and a partial tail block private to its request. Negative gaps count as 0, and an
//! `out` of 0 is replayed as one token (the engine always generates one).
//!
//! Ids are AISimulate's: `weka:<digest>:play:<id>`, `weka:<digest>:request:outer:<i>[:inner:<j>]`
//! and `weka:<digest>:session:…`, where the digest is the first 16 hex digits of the BLAKE3
//! hash of the play's key: the file's name for a `.json` file (one play), else the name, `#` and
//! the play's index in the file in six digits (`trace.jsonl#000012`). Ids order ties between
//! requests due at the same instant, so the same key gives the same placement as AISimulate.

mod corpus;

pub(super) use corpus::{parse, parse_corpus};

use super::graph::{check_lengths, HashScope, RawDependency, RawNode, Relation, Trigger};
use super::parse::{id_string, show};
use super::{TraceRequest, MAX_TRACE_BLOCK_SIZE, MAX_TRACE_TIME_MS};
use crate::time::SimDuration;
use serde::Deserialize;

/// A play as written.
#[derive(Deserialize)]
struct WekaPlay {
    #[serde(default)]
    id: Option<serde_json::Value>,
    #[serde(default)]
    block_size: Option<u64>,
    #[serde(default)]
    hash_id_scope: Option<String>,
    #[serde(default)]
    requests: Option<Vec<WekaEntry>>,
    #[serde(default)]
    source: Option<WekaSource>,
}

/// A play's provenance; only the timestamp basis is read.
#[derive(Deserialize)]
struct WekaSource {
    #[serde(default)]
    nested_timestamp_basis: Option<String>,
}

/// An entry of `requests[]`: a request (`n`, `s`) or a sub-agent marker.
#[derive(Deserialize)]
struct WekaEntry {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    t: Option<f64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, rename = "in")]
    input: Option<u64>,
    #[serde(default)]
    out: Option<u64>,
    #[serde(default)]
    hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    api_time: Option<f64>,
    #[serde(default)]
    agent_id: Option<serde_json::Value>,
    #[serde(default)]
    subagent_type: Option<serde_json::Value>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    duration_ms: Option<f64>,
    #[serde(default)]
    requests: Option<Vec<WekaEntry>>,
}

/// One request of a play, with its times in milliseconds (each converted from seconds alone,
/// so that differences of recorded times are as exact as the recording).
struct Request {
    id: String,
    /// 0 for the root scope, `k + 1` for the play's `k`th sub-agent.
    scope: usize,
    t: f64,
    end: f64,
    model: String,
    input: u64,
    out: u64,
    hash_ids: Option<Vec<u64>>,
}

/// A sub-agent marker: where its scope sits among the parent's requests.
struct SubAgent {
    outer: usize,
    t: f64,
    agent_id: String,
    blocking: bool,
    duration_ms: Option<f64>,
}

/// Corpus-wide facts every play must agree on.
#[derive(Default)]
struct Corpus {
    block_size: Option<usize>,
    model: Option<String>,
    /// Inner times of sub-agents whose play leaves the basis to the corpus are relative to
    /// their marker: some sub-agent request of such a play starts before its marker.
    relative_inner_times: bool,
}

/// How many hash ids two prompts share from their start.
fn shared_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The first 16 hex digits of the BLAKE3 hash of a play's key.
fn digest(key: &str) -> String {
    super::blake3::hash(key.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A time in seconds: finite, >= 0 and within the trace time bound.
fn seconds(field: &str, s: f64) -> Result<f64, String> {
    if s.is_finite() && s >= 0.0 && s * 1e3 <= MAX_TRACE_TIME_MS {
        Ok(s)
    } else {
        Err(format!(
            "\"{field}\" must be finite, >= 0 and at most {} s, got {}",
            show(MAX_TRACE_TIME_MS / 1e3),
            show(s)
        ))
    }
}

/// Checks one `n`/`s` entry into a request (times still as written).
fn request(
    entry: &WekaEntry,
    at: &str,
    id: String,
    scope: usize,
    corpus: &mut Corpus,
) -> Result<Request, String> {
    let err = |m: String| format!("{at}: {m}");
    let t = seconds(
        "t",
        entry.t.ok_or_else(|| err("missing field \"t\"".into()))?,
    )
    .map_err(err)?;
    let model = entry
        .model
        .clone()
        .ok_or_else(|| err("missing field \"model\"".into()))?;
    match &corpus.model {
        Some(m) if *m != model => {
            return Err(err(format!(
                "model \"{model}\" differs from the corpus's \"{m}\" (one model per corpus)"
            )))
        }
        Some(_) => {}
        None => corpus.model = Some(model.clone()),
    }
    let input = entry
        .input
        .ok_or_else(|| err("missing field \"in\"".into()))?;
    let out = entry
        .out
        .ok_or_else(|| err("missing field \"out\"".into()))?;
    check_lengths(input, out).map_err(|m| {
        err(m
            .replace("input_length", "in")
            .replace("output_length", "out"))
    })?;
    let api_time = seconds("api_time", entry.api_time.unwrap_or(0.0)).map_err(err)?;
    Ok(Request {
        id,
        scope,
        t: t * 1e3,
        end: t * 1e3 + api_time * 1e3,
        model,
        input,
        out,
        hash_ids: entry.hash_ids.clone(),
    })
}

/// A top-level value as a play, or why it is not one.
fn read_play(value: serde_json::Value) -> Result<WekaPlay, String> {
    if !value.is_object() {
        return Err("a weka play must be a JSON object".to_string());
    }
    serde_json::from_value(value).map_err(|e| format!("invalid play: {e}"))
}

/// Lowers one play into nodes (see the module doc); `index` names its hash scope and `key`
/// makes its ids' digest.
fn lower_play(
    play: WekaPlay,
    line: usize,
    index: usize,
    key: &str,
    corpus: &mut Corpus,
    hashes: &mut HashScope,
) -> Result<Vec<RawNode>, String> {
    let id = id_string("id", play.id.ok_or("missing field \"id\"")?)?;
    if id.is_empty() {
        return Err("\"id\" must not be empty".to_string());
    }
    let block_size = play
        .block_size
        .and_then(|b| usize::try_from(b).ok())
        .filter(|b| (1..=MAX_TRACE_BLOCK_SIZE).contains(b))
        .ok_or_else(|| {
            format!("\"block_size\" must be an integer from 1 to {MAX_TRACE_BLOCK_SIZE}")
        })?;
    match corpus.block_size {
        Some(b) if b != block_size => {
            return Err(format!(
                "\"block_size\" {block_size} differs from the corpus's {b}"
            ))
        }
        _ => corpus.block_size = Some(block_size),
    }
    if play.hash_id_scope.as_deref() != Some("local") {
        return Err(format!(
            "\"hash_id_scope\" must be \"local\", got {}",
            play.hash_id_scope
                .map_or_else(|| "nothing".to_string(), |s| format!("\"{s}\""))
        ));
    }
    let basis = play
        .source
        .and_then(|s| s.nested_timestamp_basis)
        .unwrap_or_else(|| "auto".to_string());
    if !["auto", "absolute", "relative"].contains(&basis.as_str()) {
        return Err(format!(
            "unknown nested_timestamp_basis \"{basis}\" (expected auto, absolute or relative)"
        ));
    }
    let prefix = format!("weka:{}", digest(key));
    let entries = play.requests.ok_or("missing field \"requests\"")?;
    let mut requests: Vec<Request> = Vec::new();
    let mut subagents: Vec<SubAgent> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = format!("requests[{i}]");
        match entry.kind.as_deref() {
            Some("n" | "s") => requests.push(request(
                entry,
                &at,
                format!("{prefix}:request:outer:{i}"),
                0,
                corpus,
            )?),
            Some("subagent") => {
                let t = seconds(
                    "t",
                    entry
                        .t
                        .ok_or_else(|| format!("{at}: missing field \"t\""))?,
                )
                .map_err(|m| format!("{at}: {m}"))?;
                let agent_id = id_string(
                    "agent_id",
                    entry
                        .agent_id
                        .clone()
                        .ok_or_else(|| format!("{at}: missing field \"agent_id\""))?,
                )
                .map_err(|m| format!("{at}: {m}"))?;
                if entry.subagent_type.is_none() {
                    return Err(format!("{at}: missing field \"subagent_type\""));
                }
                if let Some(d) = entry.duration_ms {
                    super::graph::check_delay("duration_ms", d)
                        .map_err(|m| format!("{at}: {m}"))?;
                }
                let scope = subagents.len() + 1;
                let inner = entry.requests.as_deref().unwrap_or_default();
                let mut inner_requests = Vec::with_capacity(inner.len());
                for (j, e) in inner.iter().enumerate() {
                    let at = format!("{at}.requests[{j}]");
                    if !matches!(e.kind.as_deref(), Some("n" | "s")) {
                        return Err(format!(
                            "{at}: a sub-agent's requests must be of type n or s"
                        ));
                    }
                    inner_requests.push(request(
                        e,
                        &at,
                        format!("{prefix}:request:outer:{i}:inner:{j}"),
                        scope,
                        corpus,
                    )?);
                }
                let relative = match basis.as_str() {
                    "relative" => true,
                    "absolute" => false,
                    _ => corpus.relative_inner_times,
                };
                if relative {
                    for r in &mut inner_requests {
                        r.t += t * 1e3;
                        r.end += t * 1e3;
                    }
                }
                requests.extend(inner_requests);
                subagents.push(SubAgent {
                    outer: i,
                    t,
                    agent_id,
                    blocking: entry.status.as_deref() == Some("completed"),
                    duration_ms: entry.duration_ms,
                });
            }
            Some(other) => {
                return Err(format!(
                    "{at}: unknown entry type \"{other}\" (expected n, s or subagent)"
                ))
            }
            None => return Err(format!("{at}: missing field \"type\"")),
        }
    }
    if requests.is_empty() {
        return Err(format!("play \"{id}\" has no requests"));
    }
    let outer_of = |r: &Request| -> usize {
        r.id.split(":request:outer:")
            .nth(1)
            .and_then(|s| s.split(':').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let min_t = requests.iter().map(|r| r.t).fold(f64::INFINITY, f64::min);
    // Processing order: by start time, then as written.
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| requests[a].t.total_cmp(&requests[b].t).then(a.cmp(&b)));
    let root = order[0];
    // One microsecond of tolerance, in ms.
    let tolerance = 1e-3;
    let mut deps: Vec<Vec<RawDependency>> = (0..requests.len()).map(|_| Vec::new()).collect();
    let mut sessions: Vec<String> = vec![String::new(); requests.len()];
    let add = |deps: &mut Vec<Vec<RawDependency>>,
               to: usize,
               from: usize,
               trigger: Trigger,
               relation: Relation,
               delay_ms: f64| {
        if deps[to].iter().any(|d| {
            d.source == requests[from].id && d.trigger == trigger && d.relation == relation
        }) {
            return;
        }
        deps[to].push(RawDependency {
            source: requests[from].id.clone(),
            trigger,
            relation,
            delay_ms: delay_ms.max(0.0),
        });
    };
    // Streams per scope, each a list of requests in order.
    let scopes = subagents.len() + 1;
    let mut streams: Vec<Vec<Vec<usize>>> = vec![Vec::new(); scopes];
    for &r in &order {
        let req = &requests[r];
        let scope = &mut streams[req.scope];
        let mut best: Option<(usize, usize)> = None;
        for (k, stream) in scope.iter().enumerate() {
            let Some(&last) = stream.last() else { continue };
            let ended = requests[last].end <= req.t + tolerance;
            let hashed = stream
                .iter()
                .rev()
                .find_map(|&q| requests[q].hash_ids.as_ref());
            let prefix = match (hashed, &req.hash_ids) {
                (Some(prev), Some(ids)) => Some(shared_prefix(prev, ids)).filter(|&n| n > 0),
                (None, _) | (Some(_), None) => Some(0),
            };
            if let (true, true, Some(len)) = (ended, requests[last].model == req.model, prefix) {
                if best.is_none_or(|(_, l)| len > l) {
                    best = Some((k, len));
                }
            }
        }
        match best {
            Some((k, _)) => {
                let prev = *scope[k].last().unwrap_or(&r);
                scope[k].push(r);
                let gap = req.t - requests[prev].end;
                add(
                    &mut deps,
                    r,
                    prev,
                    Trigger::Completion,
                    Relation::Sequence,
                    gap,
                );
            }
            None => scope.push(vec![r]),
        }
    }
    // An opener: a scope's first request that shares no leading hash id with any other
    // request of the scope heads the stream of the scope's next request, which then follows
    // it in sequence instead of being a worker stream.
    for scope in &mut streams {
        let Some(&first) = scope.first().and_then(|s| s.first()) else {
            continue;
        };
        let opener = scope[0].len() == 1
            && requests[first].hash_ids.as_ref().is_some_and(|own| {
                scope.iter().flatten().all(|&q| {
                    q == first
                        || requests[q]
                            .hash_ids
                            .as_ref()
                            .is_none_or(|ids| shared_prefix(ids, own) == 0)
                })
            });
        if !opener {
            continue;
        }
        let next = order
            .iter()
            .copied()
            .find(|&q| q != first && requests[q].scope == requests[first].scope);
        let Some(k) = next.and_then(|q| scope.iter().position(|s| s.contains(&q))) else {
            continue;
        };
        let stream = scope.remove(k);
        let gap = requests[stream[0]].t - requests[first].end;
        add(
            &mut deps,
            stream[0],
            first,
            Trigger::Completion,
            Relation::Sequence,
            gap,
        );
        scope[0].extend(stream);
    }
    // Sessions: a scope's first stream, then its worker streams in the order they started.
    for (s, scope) in streams.iter().enumerate() {
        let base = match s {
            0 => format!("{prefix}:session:root"),
            s => {
                let sub = &subagents[s - 1];
                format!("{prefix}:session:subagent:{}:{}", sub.outer, sub.agent_id)
            }
        };
        for (k, stream) in scope.iter().enumerate() {
            let session = match k {
                0 => base.clone(),
                k => format!("{base}:worker:{}", k - 1),
            };
            for &q in stream {
                sessions[q] = session.clone();
            }
        }
    }
    // Each sub-agent forks from the last parent request before its marker.
    let fork_sources: Vec<Option<usize>> = subagents
        .iter()
        .map(|sub| {
            requests
                .iter()
                .enumerate()
                .filter(|(_, q)| q.scope == 0 && outer_of(q) < sub.outer)
                .map(|(i, _)| i)
                .next_back()
        })
        .collect();
    // Spawns into each stream's first request.
    for (s, scope) in streams.iter().enumerate() {
        for (k, stream) in scope.iter().enumerate() {
            let first = stream[0];
            if first == root {
                continue;
            }
            let source = match (s, k) {
                (0, _) => None,
                (s, 0) => fork_sources[s - 1],
                (_, _) => Some(scope[0][0]),
            };
            let child = &requests[first];
            match source {
                Some(p) if child.t < requests[p].end => {
                    let delay = child.t - requests[p].t;
                    add(
                        &mut deps,
                        first,
                        p,
                        Trigger::Dispatch,
                        Relation::Spawn,
                        delay,
                    );
                }
                Some(p) => {
                    let delay = child.t - requests[p].end;
                    add(
                        &mut deps,
                        first,
                        p,
                        Trigger::Completion,
                        Relation::Spawn,
                        delay,
                    );
                }
                None => {
                    let delay = child.t - requests[root].t;
                    add(
                        &mut deps,
                        first,
                        root,
                        Trigger::Dispatch,
                        Relation::Spawn,
                        delay,
                    );
                }
            }
        }
    }
    // Joins of blocking sub-agents.
    for (s, sub) in subagents.iter().enumerate() {
        let scope = &streams[s + 1];
        if !sub.blocking || scope.is_empty() {
            continue;
        }
        let end = match sub.duration_ms {
            Some(d) => sub.t * 1e3 + d,
            None => scope
                .iter()
                .flatten()
                .map(|&q| requests[q].end)
                .fold(f64::NEG_INFINITY, f64::max),
        };
        // The consumer continues the stream the sub-agent forked from (the root stream when
        // nothing came before its marker).
        let parent_stream = fork_sources[s]
            .and_then(|p| streams[0].iter().find(|st| st.contains(&p)))
            .or(streams[0].first());
        let consumer = parent_stream.and_then(|st| {
            st.iter()
                .copied()
                .find(|&q| outer_of(&requests[q]) > sub.outer && requests[q].t >= end)
        });
        if let Some(c) = consumer {
            for stream in scope {
                let terminal = *stream.last().unwrap_or(&c);
                let gap = requests[c].t - requests[terminal].end;
                add(
                    &mut deps,
                    c,
                    terminal,
                    Trigger::Completion,
                    Relation::Join,
                    gap,
                );
            }
        }
    }
    // Barriers between the streams of one scope.
    for scope in &streams {
        for (k, stream) in scope.iter().enumerate() {
            for &r in stream {
                for (other_k, other) in scope.iter().enumerate() {
                    if other_k == k {
                        continue;
                    }
                    let latest = other.iter().copied().rfind(|&q| {
                        requests[q].t < requests[r].t
                            && requests[q].end <= requests[r].t + tolerance
                    });
                    if let Some(q) = latest {
                        add(
                            &mut deps,
                            r,
                            q,
                            Trigger::Completion,
                            Relation::ReplayBarrier,
                            0.0,
                        );
                    }
                }
            }
        }
    }
    let play_id = format!("{prefix}:play:{id}");
    let mut nodes = Vec::with_capacity(requests.len());
    for ((req, dependencies), session_id) in requests.iter().zip(deps).zip(sessions) {
        let block_size = corpus.block_size.unwrap_or(1);
        let input = req.input as usize;
        let full = input / block_size;
        let given = req.hash_ids.as_deref().unwrap_or_default();
        hashes.hold(input.div_ceil(block_size))?;
        let mut hash_ids: Vec<u64> = (0..full)
            .map(|i| match given.get(i) {
                Some(&h) => hashes.intern(index, h),
                None => hashes.private(),
            })
            .collect();
        if input % block_size != 0 {
            hash_ids.push(hashes.private());
        }
        nodes.push(RawNode {
            request: TraceRequest {
                line,
                request_id: Some(req.id.clone()),
                input_length: input,
                requested_input_length: None,
                output_length: req.out.max(1) as usize,
                hash_ids,
                delay: SimDuration::ZERO,
            },
            play_id: play_id.clone(),
            session_id,
            not_before_ms: req.t - min_t,
            dependencies,
        });
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::super::TraceError;
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/fixtures/agentic/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).expect("fixture")
    }

    fn err_of(text: &str) -> (usize, String) {
        match parse(text.as_bytes(), "w.json") {
            Err(TraceError::Line { line, message, .. }) => (line, message),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn the_references_example_is_one_stream_with_a_one_second_gap() {
        let g = parse(fixture("weka.jsonl").as_bytes(), "w.jsonl").expect("parses");
        assert_eq!((g.block_size, g.nodes.len(), g.plays.len()), (64, 2, 1));
        // AISimulate's digest of the first play of a file named w.jsonl.
        let hex = "d31e103079951f1f";
        assert_eq!(g.plays[0].id, format!("weka:{hex}:play:play-0"));
        assert_eq!(g.nodes[1].id(), format!("weka:{hex}:request:outer:1"));
        assert_eq!(g.nodes[1].session_id, format!("weka:{hex}:session:root"));
        // No api_time: the first request "ended" at its start, so the gap is the full second.
        assert_eq!(
            g.edges_of(1),
            [(Relation::Sequence, Trigger::Completion, 0, 1000.0)]
        );
        assert_eq!(g.nodes[1].not_before_ms, 1000.0);
        assert_eq!(g.nodes[1].request.hash_ids, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn ids_digest_the_file_name_and_the_play_index_as_aisimulate_does() {
        let text = fixture("weka_subagent.json");
        let digests = |name: &str| -> Vec<String> {
            let g = parse(text.as_bytes(), name).expect("parses");
            g.plays
                .iter()
                .map(|p| p.id.split(':').nth(1).unwrap_or("").to_string())
                .collect()
        };
        // A .json file holds one play for AISimulate, keyed by the file's name alone; later
        // plays (servesim reads several) are keyed as in a .jsonl file.
        assert_eq!(digests("w.json"), ["58f0c520b7fdbb54", "d1eca97266b27f0d"]);
        // Only the file's name counts, not its folder.
        assert_eq!(digests("/data/corpus/w.json"), digests("w.json"));
        assert_eq!(digests("w.jsonl")[0], "d31e103079951f1f");
    }

    #[test]
    fn a_worker_stream_started_after_the_root_ended_waits_for_its_completion_too() {
        // The worker stream's spawn from the root is on dispatch; since the root ended (50 ms)
        // before the worker's start (1 s), a barrier also waits for its completion, as in
        // AISimulate: one source may give a request two edges.
        let text = r#"{"id":"p","block_size":2,"hash_id_scope":"local","requests":[
            {"type":"n","t":0.0,"model":"M","in":4,"out":2,"hash_ids":[1,2],"api_time":0.05},
            {"type":"s","t":1.0,"model":"M","in":4,"out":2,"hash_ids":[7,8],"api_time":0.05},
            {"type":"n","t":2.0,"model":"M","in":6,"out":2,"hash_ids":[1,2,3],"api_time":0.05}]}"#;
        let g = parse(text.as_bytes(), "w.json").expect("parses");
        assert_eq!(
            g.edges_of(1),
            [
                (Relation::Spawn, Trigger::Dispatch, 0, 1000.0),
                (Relation::ReplayBarrier, Trigger::Completion, 0, 0.0)
            ]
        );
        assert!(g.nodes[1].session_id.ends_with(":session:root:worker:0"));
    }

    #[test]
    fn a_lone_opener_heads_the_stream_of_the_next_request() {
        // Nothing shares a prefix with the first request, so the next request's stream
        // follows it (sequence, 1 s - 50 ms) instead of forking; the third forks.
        let text = r#"{"id":"p","block_size":2,"hash_id_scope":"local","requests":[
            {"type":"n","t":0.0,"model":"M","in":4,"out":2,"hash_ids":[1,2],"api_time":0.05},
            {"type":"n","t":1.0,"model":"M","in":4,"out":2,"hash_ids":[7,8],"api_time":0.05},
            {"type":"n","t":2.0,"model":"M","in":4,"out":2,"hash_ids":[9,10],"api_time":0.05}]}"#;
        let g = parse(text.as_bytes(), "w.json").expect("parses");
        let sessions: Vec<&str> = g.nodes.iter().map(|n| n.session_id.as_str()).collect();
        assert!(sessions[0].ends_with(":session:root"), "{sessions:?}");
        assert!(sessions[1].ends_with(":session:root"), "{sessions:?}");
        assert!(
            sessions[2].ends_with(":session:root:worker:0"),
            "{sessions:?}"
        );
        assert_eq!(
            g.edges_of(1),
            [(Relation::Sequence, Trigger::Completion, 0, 950.0)]
        );
        // A later request sharing the opener's first block keeps it alone in the root stream.
        let shared = text.replace("[9,10]", "[1,3]");
        let g = parse(shared.as_bytes(), "w.json").expect("parses");
        let sessions: Vec<&str> = g.nodes.iter().map(|n| n.session_id.as_str()).collect();
        assert!(
            sessions[1].ends_with(":session:root:worker:0"),
            "{sessions:?}"
        );
        // It extends the root stream: one shared leading block is enough.
        assert!(sessions[2].ends_with(":session:root"), "{sessions:?}");
        assert_eq!(
            g.edges_of(2)[0],
            (Relation::Sequence, Trigger::Completion, 0, 1950.0)
        );
    }

    #[test]
    fn a_blocking_sub_agent_is_joined_into_the_stream_it_forked_from() {
        // The sub-agent forks from the worker stream (its last parent request before the
        // marker), so the worker's next request joins it, not the root's.
        let text = r#"{"id":"p","block_size":2,"hash_id_scope":"local","requests":[
            {"type":"n","t":0.0,"model":"M","in":8,"out":2,"hash_ids":[1,2,3,4],"api_time":0.05},
            {"type":"n","t":1.0,"model":"M","in":8,"out":2,"hash_ids":[10,11,12,13],"api_time":0.05},
            {"type":"subagent","t":1.5,"agent_id":"a","subagent_type":"X","status":"completed","duration_ms":300,
             "requests":[{"type":"n","t":1.6,"model":"M","in":8,"out":2,"hash_ids":[50,51,52,53],"api_time":0.1}]},
            {"type":"n","t":3.0,"model":"M","in":10,"out":2,"hash_ids":[1,2,3,4,5],"api_time":0.05},
            {"type":"n","t":3.5,"model":"M","in":10,"out":2,"hash_ids":[10,11,12,13,14],"api_time":0.05}]}"#;
        let g = parse(text.as_bytes(), "w.json").expect("parses");
        let join = |node: usize| {
            g.edges_of(node)
                .into_iter()
                .filter(|e| e.0 == Relation::Join)
                .collect::<Vec<_>>()
        };
        assert!(g.nodes[1].session_id.ends_with(":session:root:worker:0"));
        assert_eq!(join(3), []);
        // 3.5 s - the inner request's end at 1.7 s.
        assert_eq!(join(4), [(Relation::Join, Trigger::Completion, 2, 1800.0)]);
    }

    #[test]
    fn one_play_with_relative_inner_times_makes_every_plays_relative() {
        // Play a's inner request (101.2 s) is after its marker (101 s), play b's (0.2 s)
        // before it: as AISimulate resolves one basis per corpus, both are relative, and a's
        // inner request starts 101.2 s after its marker. A play naming its basis keeps it.
        let play = |id: &str, inner_t: f64, source: &str| {
            format!(
                r#"{{"id":"{id}","block_size":2,"hash_id_scope":"local",{source}"requests":[
                {{"type":"n","t":100.0,"model":"M","in":4,"out":2,"hash_ids":[1,2],"api_time":0.1}},
                {{"type":"subagent","t":101.0,"agent_id":"x","subagent_type":"X","status":"completed","duration_ms":500,
                  "requests":[{{"type":"n","t":{inner_t},"model":"M","in":4,"out":2,"hash_ids":[5,6],"api_time":0.1}}]}}]}}"#
            )
        };
        let inner_floors = |text: String| -> Vec<f64> {
            let g = parse(text.as_bytes(), "w.jsonl").expect("parses");
            g.nodes
                .iter()
                .filter(|n| n.id().contains(":inner:"))
                .map(|n| n.not_before_ms)
                .collect()
        };
        let absolute = play("a", 101.2, "");
        assert_eq!(inner_floors(absolute.clone()), [1200.0]);
        let mixed = format!("{absolute}\n{}", play("b", 0.2, ""));
        assert_eq!(inner_floors(mixed), [102_200.0, 1200.0]);
        let named = play(
            "a",
            101.2,
            r#""source":{"nested_timestamp_basis":"absolute"},"#,
        );
        let mixed = format!("{named}\n{}", play("b", 0.2, ""));
        assert_eq!(inner_floors(mixed), [1200.0, 1200.0]);
    }

    #[test]
    fn streams_sub_agents_joins_and_barriers() {
        let g = parse(fixture("weka_subagent.json").as_bytes(), "w.json").expect("parses");
        assert_eq!(g.plays.len(), 2);
        assert_eq!(g.nodes.len(), 6);
        // Every play starts at 0; inner times are relative to the marker (0.5 < 11).
        let floors: Vec<f64> = g.nodes.iter().map(|n| n.not_before_ms).collect();
        assert_eq!(floors, [0.0, 200.0, 1500.0, 2500.0, 3500.0, 0.0]);
        let sessions: Vec<&str> = g
            .nodes
            .iter()
            .map(|n| n.session_id.rsplit(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            sessions,
            ["root", "0", "explorer", "explorer", "root", "root"]
        );
        assert!(g.nodes[1].session_id.ends_with(":session:root:worker:0"));
        assert!(g.nodes[2]
            .session_id
            .ends_with(":session:subagent:2:explorer"));
        // The worker stream (its prefix is not the root's) is anchored to the root on dispatch.
        assert_eq!(
            g.edges_of(1),
            [(Relation::Spawn, Trigger::Dispatch, 0, 200.0)]
        );
        // The sub-agent starts from the last parent request before its marker (ended at
        // 10.3 s, before the child's 11.5 s: completion, 1.2 s).
        let e = g.edges_of(2);
        assert_eq!(
            (e[0].0, e[0].1, e[0].2),
            (Relation::Spawn, Trigger::Completion, 1)
        );
        assert!((e[0].3 - 1200.0).abs() < 1e-6, "{e:?}");
        // Its second request extends its stream (prefix 40, 41, 42): 12.5 - 12.0 s.
        assert_eq!(
            g.edges_of(3),
            [(Relation::Sequence, Trigger::Completion, 2, 500.0)]
        );
        // The parent's next request (13.5 s, after the sub-agent's end at 13.0 s) continues
        // the root stream and waits for the worker stream. It does not join the sub-agent,
        // which forked from the worker stream: a sub-agent is joined into the stream it
        // forked from, and that one has no later request.
        assert_eq!(
            g.edges_of(4),
            [
                (Relation::Sequence, Trigger::Completion, 0, 3000.0),
                (Relation::ReplayBarrier, Trigger::Completion, 1, 0.0)
            ]
        );
        // Hash ids are play-local: play-b's [1, 2, 3, 4] are not play-a's.
        assert_eq!(g.nodes[0].request.hash_ids, [0, 1, 2, 3]);
        assert_eq!(g.nodes[5].request.hash_ids.len(), 4);
        assert!(g.nodes[5].request.hash_ids.iter().all(|h| *h > 3));
        // A partial tail block is private: 200 tokens = 3 full blocks + 8.
        assert_eq!(g.nodes[2].request.hash_ids.len(), 4);
        // out: 0 is replayed as one token.
        assert_eq!(g.nodes[5].request.output_length, 1);
    }

    #[test]
    fn malformed_plays_name_their_line() {
        let ok = r#"{"id":"p","block_size":64,"hash_id_scope":"local","requests":[{"type":"n","t":0,"model":"M","in":64,"out":1}]}"#;
        let cases = [
            (ok.replace("\"local\"", "\"global\""), "\"hash_id_scope\" must be \"local\", got \"global\""),
            (ok.replace("64,\"hash", "32,\"hash"), "\"block_size\" 32 differs from the corpus's 64"),
            (ok.replace("\"M\"", "\"N\""), "requests[0]: model \"N\" differs from the corpus's \"M\""),
            (ok.replace("\"in\":64", "\"in\":0"), "requests[0]: \"in\" must be > 0"),
            (ok.replace("\"t\":0", "\"t\":-1"), "requests[0]: \"t\" must be finite, >= 0"),
            (ok.replace("\"n\"", "\"x\""), "requests[0]: unknown entry type \"x\""),
            (ok.replace("\"id\":\"p\"", "\"id\":\"\""), "\"id\" must not be empty"),
            (
                ok.replace("{\"type\":\"n\"", "{\"type\":\"subagent\",\"t\":0,\"agent_id\":\"a\",\"requests\":[]},{\"type\":\"n\""),
                "requests[0]: missing field \"subagent_type\"",
            ),
        ];
        for (play, want) in cases {
            let text = format!("{ok}\n\n{play}\n");
            let (line, message) = err_of(&text);
            assert_eq!(line, 3, "{message}");
            assert!(message.starts_with(want), "{message:?} lacks {want:?}");
        }
        let (line, message) = err_of(&format!("{ok}\n{{\"id\": 1,\n"));
        assert_eq!(line, 3);
        assert!(message.starts_with("invalid JSON"), "{message}");
    }
}
