//! The agentic trace targets: fuzzed bytes as an `agentic_mooncake` JSONL trace
//! ([`agentic_line`]) or a weka file ([`weka_play`]), read by [`servesim::trace::parse_graph`]
//! into a request graph, whose replay is then started and driven to the end.
//!
//! Properties, for every input:
//!
//! - reading returns: a [`TraceError::Line`] naming a line of the input, [`TraceError::Empty`]
//!   for an input without a row, or a graph: at least one node, each on a line of the input
//!   (an agentic row on its own non-blank line), each dependency on an earlier-checked node of
//!   its node's play, every play's nodes in it and only there, every prompt within what its
//!   hash ids cover and at least one output token, at most [`MAX_GRAPH_HASH_IDS`] ids in all;
//! - the graph's replay starts ([`Readiness::new`]) and, every node sent and completed as it
//!   comes due, hands out every node exactly once: no cycle holds one back.

use servesim::replay::Readiness;
use servesim::trace::{parse_graph, RequestGraph, TraceError, TraceFormat, MAX_GRAPH_HASH_IDS};

use crate::trace::{line_count, TRACE_BLOCK_SIZE};

/// Checks an `agentic_mooncake` trace (see the module docs for the properties).
pub fn agentic_line(data: &[u8]) {
    check(data, TraceFormat::AgenticMooncake);
}

/// Checks a weka file (see the module docs for the properties).
pub fn weka_play(data: &[u8]) {
    check(data, TraceFormat::Weka);
}

fn check(data: &[u8], format: TraceFormat) {
    // A weka value spreads over lines; a JSON error at the very end is on the line after the
    // last newline.
    let lines = match format {
        TraceFormat::Weka => 1 + data.iter().filter(|&&b| b == b'\n').count(),
        _ => line_count(data),
    };
    match parse_graph(data, "fuzz.jsonl", format, TRACE_BLOCK_SIZE) {
        Ok(graph) => {
            if let Err(e) = check_graph(&graph, data, format, lines) {
                panic!("the graph is inconsistent: {e}\n{graph:#?}");
            }
            check_start_up(&graph);
        }
        Err(e @ (TraceError::Line { line, .. } | TraceError::LongSchedule { line, .. })) => {
            assert!(
                (1..=lines).contains(&line),
                "the error names line {line} of a {lines}-line input: {e}"
            );
        }
        Err(TraceError::Empty { .. }) => {}
        Err(e) => panic!(
            "the error names no line: {e} ({})",
            std::error::Error::source(&e).map_or(String::new(), |s| s.to_string())
        ),
    }
}

fn check_graph(
    graph: &RequestGraph,
    data: &[u8],
    format: TraceFormat,
    lines: usize,
) -> Result<(), String> {
    if graph.nodes.is_empty() {
        return Err("a graph without nodes".into());
    }
    if format == TraceFormat::AgenticMooncake {
        let rows = data
            .split(|&b| b == b'\n')
            .filter(|l| !String::from_utf8_lossy(l).trim().is_empty())
            .count();
        if graph.nodes.len() > rows {
            return Err(format!("{} nodes from {rows} rows", graph.nodes.len()));
        }
    }
    let mut in_play = vec![None; graph.nodes.len()];
    for (p, play) in graph.plays.iter().enumerate() {
        for &n in &play.nodes {
            match in_play.get_mut(n) {
                Some(slot @ None) => *slot = Some(p),
                _ => return Err(format!("node {n} listed twice or unknown (play {p})")),
            }
        }
    }
    let mut ids = 0usize;
    for (n, node) in graph.nodes.iter().enumerate() {
        let r = &node.request;
        if in_play[n] != Some(node.play) {
            return Err(format!("node {n} is not in its play's list"));
        }
        if !(1..=lines).contains(&r.line) {
            return Err(format!("node {n} on line {} of {lines}", r.line));
        }
        if r.input_length == 0 || r.input_length > r.hash_ids.len() * graph.block_size {
            return Err(format!(
                "node {n}: {} prompt tokens for {} ids",
                r.input_length,
                r.hash_ids.len()
            ));
        }
        if r.output_length == 0 {
            return Err(format!("node {n} generates no token"));
        }
        ids += r.hash_ids.len();
        for d in &node.dependencies {
            match graph.nodes.get(d.source) {
                Some(s) if s.play == node.play && d.source != n => {}
                _ => return Err(format!("node {n} depends on {} of another play", d.source)),
            }
        }
    }
    if ids > MAX_GRAPH_HASH_IDS {
        return Err(format!("{ids} hash ids"));
    }
    Ok(())
}

/// Starts the replay and sends and completes each node as it comes due: every node comes out
/// once.
fn check_start_up(graph: &RequestGraph) {
    let plays: Vec<usize> = (0..graph.plays.len()).collect();
    let mut ready = Readiness::new(graph, 1.0, None, &plays);
    let mut sent = vec![false; graph.nodes.len()];
    while let Some(at) = ready.next_due() {
        while let Some((node, at)) = ready.pop_due(at) {
            assert!(!sent[node], "node {node} handed out twice");
            sent[node] = true;
            ready.dispatched(node, at);
            ready.completed(node, at);
        }
    }
    let held: Vec<usize> = (0..sent.len()).filter(|&n| !sent[n]).collect();
    assert!(held.is_empty(), "nodes {held:?} never came due");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixtures and seed corpora pass.
    #[test]
    fn fixtures_pass() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/agentic");
        agentic_line(&std::fs::read(format!("{dir}/worked_example.jsonl")).expect("fixture"));
        agentic_line(&std::fs::read(format!("{dir}/legacy_v1.jsonl")).expect("fixture"));
        weka_play(&std::fs::read(format!("{dir}/weka_subagent.json")).expect("fixture"));
        agentic_line(b"");
        weka_play(b"{\n");
        weka_play(b"[1]\n\xff");
    }
}
