//! Agentic traces as one request graph: [`RequestGraph`] (nodes, plays, dependencies), the
//! [`TraceFormat`]s that lower into it, and the checks every graph passes before a replay starts
//! (unknown sources, cycles, edges across plays, relations that need a completion trigger).
//!
//! The model follows AISimulate's agentic replay (`reference/agentic-traces.md`, section 1): a
//! node becomes ready at `max(floor, max over its dependencies of T(source) + delay)`, where `T`
//! is the source's dispatch time or its last-token time.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use super::lines::TraceLines;
use super::parse::show;
use super::{
    ScheduleBound, TraceError, TraceRequest, MAX_ROW_OUTPUT_TOKENS, MAX_ROW_TOKENS,
    MAX_TRACE_TIME_MS,
};
use crate::time::SimDuration;

/// How a trace file is read: named with `--trace-format`, or detected from the file
/// ([`detect_format`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// Detect from the first row (a header's `schema`, or the row's shape).
    Auto,
    /// Plain Mooncake rows: sessions in a closed loop ([`super::Trace`]).
    Mooncake,
    /// Mooncake rows holding only each turn's new tokens (never detected).
    MooncakeDelta,
    /// `dynamo.agentic_mooncake` version 2 (with its header) or legacy v1 rows (`wait_for`).
    AgenticMooncake,
    /// AgentX / AIPerf `weka_trace`: one play per top-level object.
    Weka,
    /// One row per session of turns and tool calls.
    AppliedComputeAgentic,
    /// `dynamo.request.trace.v1` request records.
    Dynamo,
}

impl TraceFormat {
    /// Every format, in the order the help lists them.
    pub(crate) const ALL: [TraceFormat; 7] = [
        TraceFormat::Auto,
        TraceFormat::Mooncake,
        TraceFormat::MooncakeDelta,
        TraceFormat::AgenticMooncake,
        TraceFormat::Weka,
        TraceFormat::AppliedComputeAgentic,
        TraceFormat::Dynamo,
    ];

    /// The name `--trace-format` takes.
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Auto => "auto",
            TraceFormat::Mooncake => "mooncake",
            TraceFormat::MooncakeDelta => "mooncake-delta",
            TraceFormat::AgenticMooncake => "agentic-mooncake",
            TraceFormat::Weka => "weka",
            TraceFormat::AppliedComputeAgentic => "applied-compute-agentic",
            TraceFormat::Dynamo => "dynamo",
        }
    }
}

impl std::fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TraceFormat {
    type Err = String;

    /// A format by its `--trace-format` name (underscores accepted for dashes, as AISimulate
    /// spells them).
    fn from_str(s: &str) -> Result<TraceFormat, String> {
        let wanted = s.replace('_', "-");
        TraceFormat::ALL
            .into_iter()
            .find(|f| f.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = TraceFormat::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown trace format {s:?}; expected one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Which event of a dependency's source releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Trigger {
    /// The source was dispatched (sent to the engine).
    Dispatch,
    /// The source emitted its last token.
    Completion,
}

/// What a dependency stands for; it changes only validation and labels, not timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Relation {
    /// The next request of one conversation.
    Sequence,
    /// A sub-agent (or worker stream) started from the source.
    Spawn,
    /// The source's sub-agent finished and its result joins this request.
    Join,
    /// Replay ordering between streams that never overlapped in the recording.
    ReplayBarrier,
}

impl Relation {
    /// The name in the reference's error messages ("invalid Join dependency with Dispatch
    /// trigger").
    fn title(self) -> &'static str {
        match self {
            Relation::Sequence => "Sequence",
            Relation::Spawn => "Spawn",
            Relation::Join => "Join",
            Relation::ReplayBarrier => "ReplayBarrier",
        }
    }
}

/// One edge into a node: it may not become ready before `T(source) + delay`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dependency {
    /// Index of the source node in [`RequestGraph::nodes`].
    pub source: usize,
    /// Dispatch or last token of the source.
    pub trigger: Trigger,
    /// What the edge stands for.
    pub(crate) relation: Relation,
    /// Wait after the trigger, in trace milliseconds (before the speed-up).
    pub delay_ms: f64,
}

/// One LLM request of an agentic trace.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphNode {
    /// The prompt, lengths, line and `request_id` (always set), ready to become an engine
    /// request; its `hash_ids` are already scoped (dense ids, see [`RequestGraph`]).
    pub request: TraceRequest,
    /// Index of the node's play in [`RequestGraph::plays`].
    pub play: usize,
    /// The conversation the node belongs to.
    pub session_id: String,
    /// Earliest start, in trace milliseconds, before the shift by the smallest one.
    pub(crate) not_before_ms: f64,
    /// Edges into the node, in trace order.
    pub dependencies: Vec<Dependency>,
}

impl GraphNode {
    /// The node's `request_id`.
    pub(crate) fn id(&self) -> &str {
        self.request.request_id.as_deref().unwrap_or_default()
    }
}

/// One trajectory: the unit of failure (a failed node skips the rest of its play) and of
/// end-to-end latency.
#[derive(Clone, Debug, PartialEq)]
pub struct Play {
    /// The play's id (from the trace, or derived by the format's lowering).
    pub id: String,
    /// Its nodes, in trace order.
    pub nodes: Vec<usize>,
    /// Its place in the queue for lanes (`source_play_ordinal`), where the trace gives one;
    /// else plays queue by id.
    pub(crate) ordinal: Option<u64>,
}

/// A validated request graph: every dependency names an earlier-checked node of the same play,
/// relations other than `spawn` use the completion trigger, and there is no cycle.
///
/// Hash ids are interned to dense ids in first-seen order within their scope (file-global for
/// `agentic_mooncake`, per play for `weka`), so equal ids at equal positions mean equal KV
/// blocks exactly where the format says they do.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestGraph {
    /// The format the file was read as.
    pub(crate) format: TraceFormat,
    /// Prompt tokens per hash id (the trace's own where it names one).
    pub block_size: usize,
    /// Nodes in trace order.
    pub nodes: Vec<GraphNode>,
    /// Plays in order of first appearance.
    pub plays: Vec<Play>,
    /// The header's `source` (provenance), where the format has one.
    pub(crate) source: Option<serde_json::Value>,
}

impl RequestGraph {
    /// The smallest `not_before_ms` over all nodes (the shift `M` of the floors): one scan of
    /// every node, so callers take it once per graph, never once per node.
    pub(crate) fn min_not_before_ms(&self) -> f64 {
        #[cfg(test)]
        min_scans::count();
        self.nodes
            .iter()
            .map(|n| n.not_before_ms)
            .fold(f64::INFINITY, f64::min)
    }

    /// Checks that every floor and every dependency delay, divided by `speedup`, is within
    /// `bound` (as [`super::parse_with_bound`] bounds a Mooncake trace's schedule); the error
    /// names the node's line.
    pub fn check_schedule(
        &self,
        source_name: &str,
        speedup: f64,
        bound: ScheduleBound,
    ) -> Result<(), TraceError> {
        let bound_ms = bound.millis();
        let m = self.min_not_before_ms();
        for node in &self.nodes {
            let long = |what: String, at_ms: f64| TraceError::LongSchedule {
                source_name: source_name.to_string(),
                line: node.request.line,
                what,
                at_ms,
                bound_ms,
            };
            let at_ms = (node.not_before_ms - m) / speedup;
            if at_ms.is_nan() || at_ms > bound_ms {
                return Err(long(
                    format!("request \"{}\" is due (its floor)", node.id()),
                    at_ms,
                ));
            }
            for dep in &node.dependencies {
                let at_ms = dep.delay_ms / speedup;
                if at_ms.is_nan() || at_ms > bound_ms {
                    return Err(long(
                        format!(
                            "request \"{}\" is due (a dependency's delay alone) at least",
                            node.id()
                        ),
                        at_ms,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every node's floor once shifted and sped up, `(not_before_ms - M) / speedup`, rounded
    /// to the nanosecond, in node order; `M` is found once for the whole graph.
    pub fn floors(&self, speedup: f64) -> Vec<SimDuration> {
        self.floors_ms(speedup)
            .into_iter()
            .map(SimDuration::from_millis_f64)
            .collect()
    }

    /// Every node's floor once shifted and sped up, unrounded, in milliseconds:
    /// `(not_before_ms - M) / speedup`, with `M` ([`RequestGraph::min_not_before_ms`]) found
    /// once for the whole graph.
    pub(crate) fn floors_ms(&self, speedup: f64) -> Vec<f64> {
        let m = self.min_not_before_ms();
        self.nodes
            .iter()
            .map(|n| (n.not_before_ms - m) / speedup)
            .collect()
    }
}

/// How many times [`RequestGraph::min_not_before_ms`] scanned the nodes on this thread: the
/// start-up tests assert it is once per graph, not once per node.
#[cfg(test)]
pub(crate) mod min_scans {
    use std::cell::Cell;

    thread_local! {
        static SCANS: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts one scan.
    pub(super) fn count() {
        SCANS.with(|s| s.set(s.get() + 1));
    }

    /// The scans so far on this thread.
    pub(crate) fn so_far() -> usize {
        SCANS.with(Cell::get)
    }
}

/// A dependency as written: the source by id, checked when the graph is built.
#[derive(Clone, Debug)]
pub(super) struct RawDependency {
    pub(super) source: String,
    pub(super) trigger: Trigger,
    pub(super) relation: Relation,
    pub(super) delay_ms: f64,
}

/// A node as read, before ids are resolved: plays and sources by name.
#[derive(Clone, Debug)]
pub(super) struct RawNode {
    pub(super) request: TraceRequest,
    pub(super) play_id: String,
    pub(super) session_id: String,
    pub(super) not_before_ms: f64,
    pub(super) dependencies: Vec<RawDependency>,
}

impl RawNode {
    pub(super) fn id(&self) -> &str {
        self.request.request_id.as_deref().unwrap_or_default()
    }
}

/// Interns hash ids to dense ids in first-seen order, within a scope key.
#[derive(Default)]
pub(super) struct HashScope {
    ids: HashMap<(usize, u64), u64>,
    next: u64,
    /// Hash ids the graph's prompts hold so far ([`HashScope::hold`]).
    held: usize,
}

impl HashScope {
    /// Counts a prompt of `more` hash ids, before they are made: at most
    /// [`MAX_GRAPH_HASH_IDS`] in all, since a short row without `hash_ids` (private blocks)
    /// can ask for up to [`MAX_ROW_TOKENS`] of them.
    pub(super) fn hold(&mut self, more: usize) -> Result<(), String> {
        hold_hash_ids(&mut self.held, more)
    }

    /// The dense id of `id` in scope `scope`.
    pub(super) fn intern(&mut self, scope: usize, id: u64) -> u64 {
        let next = &mut self.next;
        *self.ids.entry((scope, id)).or_insert_with(|| {
            *next += 1;
            *next - 1
        })
    }

    /// A dense id nobody else holds (a private block).
    pub(super) fn private(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }
}

/// Most hash ids a graph's prompts may hold in all, whatever the format (rows without their
/// ids, and rows that expand into many prompts, make more ids than the file holds): 2^27
/// (1 GiB of ids).
pub const MAX_GRAPH_HASH_IDS: usize = 1 << 27;

/// Adds `more` to the hash ids held so far, within [`MAX_GRAPH_HASH_IDS`].
pub(super) fn hold_hash_ids(held: &mut usize, more: usize) -> Result<(), String> {
    *held = held.saturating_add(more);
    if *held > MAX_GRAPH_HASH_IDS {
        return Err(format!(
            "the trace's prompts hold more than the {MAX_GRAPH_HASH_IDS} hash ids a graph may \
             hold in all"
        ));
    }
    Ok(())
}

/// Checks a dependency's numbers: a delay finite, >= 0 and at most [`MAX_TRACE_TIME_MS`].
pub(super) fn check_delay(field: &str, ms: f64) -> Result<f64, String> {
    if ms.is_finite() && (0.0..=MAX_TRACE_TIME_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!(
            "\"{field}\" must be finite, >= 0 and at most {} ms, got {}",
            show(MAX_TRACE_TIME_MS),
            show(ms)
        ))
    }
}

/// Checks a row's lengths against the caps every trace row has.
pub(super) fn check_lengths(input_length: u64, output_length: u64) -> Result<(), String> {
    if input_length == 0 {
        return Err("\"input_length\" must be > 0".to_string());
    }
    if input_length > MAX_ROW_TOKENS as u64 {
        return Err(format!(
            "\"input_length\" must be at most {MAX_ROW_TOKENS}, got {input_length}"
        ));
    }
    if output_length > MAX_ROW_OUTPUT_TOKENS as u64 {
        return Err(format!(
            "\"output_length\" must be at most {MAX_ROW_OUTPUT_TOKENS}, got {output_length}"
        ));
    }
    Ok(())
}

/// Resolves and checks `nodes` into a graph: duplicate ids, unknown sources, relations that
/// need a completion trigger, edges across plays, then cycles; each error names the line of the
/// row at fault.
pub(super) fn build(
    nodes: Vec<RawNode>,
    source_name: &str,
    format: TraceFormat,
    block_size: usize,
    source: Option<serde_json::Value>,
) -> Result<RequestGraph, TraceError> {
    let line_err = |line: usize, message: String| TraceError::Line {
        source_name: source_name.to_string(),
        line,
        message,
    };
    if nodes.is_empty() {
        return Err(TraceError::Empty {
            source_name: source_name.to_string(),
        });
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        if let Some(&first) = index.get(node.id()) {
            return Err(line_err(
                node.request.line,
                format!(
                    "\"{}\" duplicates request_id of line {}",
                    node.id(),
                    nodes[first].request.line
                ),
            ));
        }
        index.insert(node.id(), i);
    }
    let mut play_index: HashMap<&str, usize> = HashMap::new();
    let mut plays: Vec<Play> = Vec::new();
    let mut play_of: Vec<usize> = Vec::with_capacity(nodes.len());
    for (i, node) in nodes.iter().enumerate() {
        let p = *play_index.entry(&node.play_id).or_insert_with(|| {
            plays.push(Play {
                id: node.play_id.clone(),
                nodes: Vec::new(),
                ordinal: None,
            });
            plays.len() - 1
        });
        plays[p].nodes.push(i);
        play_of.push(p);
    }
    let mut resolved: Vec<Vec<Dependency>> = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let line = node.request.line;
        let mut deps = Vec::with_capacity(node.dependencies.len());
        for dep in &node.dependencies {
            let Some(&source) = index.get(dep.source.as_str()) else {
                return Err(line_err(
                    line,
                    format!("dependency on unknown request_id \"{}\"", dep.source),
                ));
            };
            if dep.trigger == Trigger::Dispatch && dep.relation != Relation::Spawn {
                return Err(line_err(
                    line,
                    format!(
                        "invalid {} dependency with Dispatch trigger (on \"{}\"; only spawn \
                         may use dispatch)",
                        dep.relation.title(),
                        dep.source
                    ),
                ));
            }
            let from = &nodes[source].play_id;
            if *from != node.play_id {
                return Err(line_err(
                    line,
                    format!(
                        "dependency on \"{}\" crosses plays: it is in play \"{from}\", this \
                         row in play \"{}\"",
                        dep.source, node.play_id
                    ),
                ));
            }
            deps.push(Dependency {
                source,
                trigger: dep.trigger,
                relation: dep.relation,
                delay_ms: dep.delay_ms,
            });
        }
        resolved.push(deps);
    }
    if let Some(cycle) = find_cycle(&resolved) {
        let line = cycle
            .iter()
            .map(|&i| nodes[i].request.line)
            .min()
            .unwrap_or_default();
        let names: Vec<String> = cycle
            .iter()
            .chain(cycle.first())
            .map(|&i| format!("\"{}\"", nodes[i].id()))
            .collect();
        return Err(line_err(
            line,
            format!("dependency cycle: {}", names.join(" -> ")),
        ));
    }
    let nodes = nodes
        .into_iter()
        .zip(resolved)
        .zip(play_of)
        .map(|((node, dependencies), play)| GraphNode {
            play,
            request: node.request,
            session_id: node.session_id,
            not_before_ms: node.not_before_ms,
            dependencies,
        })
        .collect();
    Ok(RequestGraph {
        format,
        block_size,
        nodes,
        plays,
        source,
    })
}

/// A cycle of the graph, if there is one, as node indices source first (each node is a
/// dependency of the next, the last of the first): Kahn's algorithm, then a walk among the
/// nodes it could not order.
fn find_cycle(deps: &[Vec<Dependency>]) -> Option<Vec<usize>> {
    let n = deps.len();
    let mut waiting: Vec<usize> = deps.iter().map(Vec::len).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (child, ds) in deps.iter().enumerate() {
        for d in ds {
            children[d.source].push(child);
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut seen = 0;
    while let Some(i) = ready.pop() {
        seen += 1;
        for &c in &children[i] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push(c);
            }
        }
    }
    if seen == n {
        return None;
    }
    // Every node left waits on another node left: walk sources until one repeats.
    let start = (0..n).find(|&i| waiting[i] > 0)?;
    let mut order: Vec<usize> = Vec::new();
    let mut at: HashMap<usize, usize> = HashMap::new();
    let mut i = start;
    loop {
        if let Some(&k) = at.get(&i) {
            let mut cycle = order.split_off(k);
            // Written source-first: a -> b means b depends on a.
            cycle.reverse();
            return Some(cycle);
        }
        at.insert(i, order.len());
        order.push(i);
        i = deps[i].iter().map(|d| d.source).find(|&s| waiting[s] > 0)?;
    }
}

/// Calls `row` with each non-blank line's 1-based number and text, read as the Mooncake parser
/// reads lines (bytes split on newlines, UTF-8 checked per line, `\r` and a leading byte order
/// mark dropped).
pub(super) fn for_each_line(
    reader: impl BufRead,
    source_name: &str,
    mut row: impl FnMut(usize, &str) -> Result<(), String>,
) -> Result<(), TraceError> {
    let line_err = |line: usize, message: String| TraceError::Line {
        source_name: source_name.to_string(),
        line,
        message,
    };
    let mut lines = TraceLines::new(reader);
    loop {
        let Some((line, bytes)) = lines.next_line().map_err(|e| e.in_trace(source_name))? else {
            return Ok(());
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            line_err(
                line,
                format!(
                    "not UTF-8 text (invalid byte at column {})",
                    e.valid_up_to() + 1
                ),
            )
        })?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        let text = match line {
            1 => text.strip_prefix('\u{feff}').unwrap_or(text),
            _ => text,
        };
        if text.trim().is_empty() {
            continue;
        }
        row(line, text).map_err(|m| line_err(line, m))?;
    }
}

/// A row parsed by serde_json; the error names the column, as the Mooncake parser's do.
pub(super) fn json_row<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    if !text.trim_start().starts_with('{') {
        return Err("invalid JSON row: expected a JSON object".to_string());
    }
    serde_json::from_str(text).map_err(|e| {
        let full = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let msg = full.strip_suffix(&suffix).unwrap_or(&full);
        format!("invalid JSON row: {msg} (column {})", e.column())
    })
}

/// The format of the trace at `path` when `requested` is [`TraceFormat::Auto`] (else
/// `requested`): the first non-blank row decides (a `dynamo.agentic_mooncake` header, a
/// `dynamo.request.trace.v1` record, a weka play with `requests`, an applied-compute session
/// with `num_turns`); otherwise rows with `wait_for` anywhere in the file make it legacy
/// agentic Mooncake, and anything else is plain Mooncake. A directory is a weka corpus.
pub fn detect_format(path: &Path, requested: TraceFormat) -> Result<TraceFormat, TraceError> {
    if requested != TraceFormat::Auto {
        return Ok(requested);
    }
    if path.is_dir() {
        return Ok(TraceFormat::Weka);
    }
    detect_in(open(path)?, &path.display().to_string())
}

/// The text of the trace at `path`, decompressed when its name ends in `.gz` (request traces
/// are often written as `.jsonl.gz` shards).
pub(super) fn open(path: &Path) -> Result<Box<dyn BufRead>, TraceError> {
    let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(std::io::BufReader::new(flate2::read::GzDecoder::new(file)))
    } else {
        Box::new(std::io::BufReader::new(file))
    })
}

/// [`detect_format`] over a reader (`source_name` labels errors); lines are bounded as the
/// parsers bound them.
pub(super) fn detect_in(
    reader: impl BufRead,
    source_name: &str,
) -> Result<TraceFormat, TraceError> {
    let mut lines = TraceLines::new(reader);
    let mut first = true;
    loop {
        let Some((_, bytes)) = lines.next_line().map_err(|e| e.in_trace(source_name))? else {
            return Ok(TraceFormat::Mooncake);
        };
        if first {
            let text = String::from_utf8_lossy(bytes);
            let text = text.trim_start_matches('\u{feff}').trim();
            if text.is_empty() {
                continue;
            }
            first = false;
            if let Some(format) = first_row_format(text) {
                return Ok(format);
            }
        }
        if contains(bytes, b"\"wait_for\"") {
            return Ok(TraceFormat::AgenticMooncake);
        }
    }
}

/// The format the first row alone shows, if it shows one.
fn first_row_format(text: &str) -> Option<TraceFormat> {
    // JSON spread over lines (a pretty-printed array or object) is only ever a weka corpus.
    if text == "[" || text == "{" || (text.starts_with('[') && text.ends_with(',')) {
        return Some(TraceFormat::Weka);
    }
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let object = match &value {
        serde_json::Value::Array(plays) => plays.first()?.as_object()?,
        other => other.as_object()?,
    };
    let event = object.get("event").and_then(|e| e.as_object());
    let schema = object
        .get("schema")
        .or_else(|| event.and_then(|e| e.get("schema")))
        .and_then(|s| s.as_str());
    match schema {
        Some("dynamo.agentic_mooncake") => return Some(TraceFormat::AgenticMooncake),
        Some("dynamo.request.trace.v1") => return Some(TraceFormat::Dynamo),
        _ => {}
    }
    if object.get("requests").is_some_and(|r| r.is_array()) {
        return Some(TraceFormat::Weka);
    }
    if object.contains_key("num_turns") {
        return Some(TraceFormat::AppliedComputeAgentic);
    }
    None
}

/// Whether `needle` (not empty) occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some((&head, rest)) = needle.split_first() else {
        return true;
    };
    haystack
        .iter()
        .enumerate()
        .filter(|&(_, &b)| b == head)
        .any(|(i, _)| haystack[i + 1..].starts_with(rest))
}

#[cfg(test)]
impl RequestGraph {
    /// (relation, trigger, source index, delay ms) of each of a node's edges, for the formats'
    /// tests.
    pub(crate) fn edges_of(&self, node: usize) -> Vec<(Relation, Trigger, usize, f64)> {
        self.nodes[node]
            .dependencies
            .iter()
            .map(|d| (d.relation, d.trigger, d.source, d.delay_ms))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Floors and delays, sped up, are bounded like a Mooncake trace's schedule.
    #[test]
    fn the_schedule_is_bounded() {
        let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":4}"#;
        let row = |id: &str, nb: f64, deps: &str| {
            format!(
                r#"{{"request_id":"{id}","play_id":"p","session_id":"s","model":"M","input_length":4,"output_length":1,"hash_ids":[1],"not_before_ms":{nb},"dependencies":[{deps}]}}"#
            )
        };
        let week_ms = 7.0 * 86_400_000.0;
        let far = format!(
            "{header}\n{}\n{}\n",
            row("a", 0.0, ""),
            row("b", week_ms + 1.0, "")
        );
        let g =
            super::super::parse_graph(far.as_bytes(), "t", TraceFormat::Auto, 4).expect("parses");
        let e = g
            .check_schedule("t", 1.0, ScheduleBound::Default)
            .expect_err("too far");
        assert!(
            e.to_string()
                .starts_with("t:3: request \"b\" is due (its floor) 7.0 days"),
            "{e}"
        );
        g.check_schedule("t", 2.0, ScheduleBound::Default)
            .expect("fits at 2x");
        let dep =
            r#"{"request_id":"a","trigger":"completion","relation":"sequence","delay_ms":1e12}"#;
        let long = format!("{header}\n{}\n{}\n", row("a", 0.0, ""), row("b", 0.0, dep));
        let g =
            super::super::parse_graph(long.as_bytes(), "t", TraceFormat::Auto, 4).expect("parses");
        let e = g
            .check_schedule("t", 1.0, ScheduleBound::Default)
            .expect_err("too long a delay");
        assert!(e.to_string().contains("a dependency's delay alone"), "{e}");
        g.check_schedule("t", 1.0, ScheduleBound::Unbounded)
            .expect("allowed");
    }

    /// Prompts of every format hold at most `MAX_GRAPH_HASH_IDS` ids in all, counted before
    /// they are made (issue 43: 33 short v2 rows without `hash_ids`, at block size 1, asked for
    /// 2^22 private ids each).
    #[test]
    fn a_graphs_hash_ids_are_bounded_in_all() {
        let mut hashes = HashScope::default();
        for _ in 0..MAX_GRAPH_HASH_IDS / MAX_ROW_TOKENS {
            hashes.hold(MAX_ROW_TOKENS).expect("within the bound");
        }
        assert_eq!(
            hashes.hold(1).expect_err("one more"),
            "the trace's prompts hold more than the 134217728 hash ids a graph may hold in all"
        );
        assert_eq!(hashes.next, 0, "no id was made");
    }

    #[test]
    fn formats_parse_by_name_and_show_the_list_otherwise() {
        for f in TraceFormat::ALL {
            assert_eq!(f.name().parse::<TraceFormat>(), Ok(f));
        }
        assert_eq!(
            "agentic_mooncake".parse::<TraceFormat>(),
            Ok(TraceFormat::AgenticMooncake)
        );
        let e = "csv".parse::<TraceFormat>().expect_err("unknown");
        assert!(e.contains("auto, mooncake, mooncake-delta"), "{e}");
    }

    #[test]
    fn the_first_row_or_a_wait_for_decides_the_format() {
        let cases = [
            (
                "{\"schema\":\"dynamo.agentic_mooncake\",\"version\":2}\n",
                TraceFormat::AgenticMooncake,
            ),
            (
                "\n{\"timestamp\":0,\"hash_ids\":[1]}\n{\"request_id\":\"b\",\"wait_for\":[\"a\"]}\n",
                TraceFormat::AgenticMooncake,
            ),
            (
                "{\"id\":\"p\",\"requests\":[]}\n",
                TraceFormat::Weka,
            ),
            (
                "{\"timestamp\":1000,\"event\":{\"schema\":\"dynamo.request.trace.v1\"}}\n",
                TraceFormat::Dynamo,
            ),
            ("{\"num_turns\":2}\n", TraceFormat::AppliedComputeAgentic),
            ("[\n  {\"id\": \"p\",\n", TraceFormat::Weka),
            (
                "{\"timestamp\":0,\"output_length\":1,\"hash_ids\":[1]}\n",
                TraceFormat::Mooncake,
            ),
            ("", TraceFormat::Mooncake),
        ];
        for (text, want) in cases {
            assert_eq!(
                detect_in(text.as_bytes(), "t").expect("reads"),
                want,
                "{text}"
            );
        }
    }
}
