//! `applied_compute_agentic` traces lowered into a [`RequestGraph`]: one JSONL row per session
//! (`num_turns`, `input_prompt_length`, `assistant_response_length[]`,
//! `tool_call_output_length[]`, `tool_call_latency[]` in seconds,
//! `final_assistant_response_length`), each row one play of `num_turns + 1` requests.
//!
//! Turn 0's prompt is `input_prompt_length` tokens; turn `k + 1`'s is turn `k`'s plus its
//! response and its tool output, and extends it: the session's hash ids are one run, of which
//! each turn takes the first `ceil(input / block_size)` (`--trace-block-size` tokens each), so a
//! later turn finds every earlier prompt's blocks. Turn `k` outputs
//! `assistant_response_length[k]` tokens, the extra last turn `final_assistant_response_length`;
//! turn `k + 1` starts `tool_call_latency[k]` seconds after turn `k`'s last token. Every session
//! starts at 0 and is named `applied_compute_agentic_session_<line>`.

use std::io::BufRead;

use serde::Deserialize;

use super::graph::{
    build, check_delay, check_lengths, for_each_line, hold_hash_ids, json_row, HashScope,
    RawDependency, RawNode, Relation, RequestGraph, TraceFormat, Trigger,
};
use super::{TraceError, TraceRequest};
use crate::time::SimDuration;

/// Most turns a session row may have: 2^16.
const MAX_TURNS: usize = 1 << 16;

/// A session row.
#[derive(Deserialize)]
struct Row {
    #[serde(default)]
    num_turns: Option<u64>,
    #[serde(default)]
    input_prompt_length: Option<u64>,
    #[serde(default)]
    assistant_response_length: Option<Vec<u64>>,
    #[serde(default)]
    tool_call_output_length: Option<Vec<u64>>,
    #[serde(default)]
    tool_call_latency: Option<Vec<f64>>,
    #[serde(default)]
    final_assistant_response_length: Option<u64>,
}

fn missing(field: &str) -> String {
    format!("missing field \"{field}\"")
}

/// Reads an applied-compute trace, `block_size` tokens per hash id.
pub(super) fn parse(
    reader: impl BufRead,
    source_name: &str,
    block_size: usize,
) -> Result<RequestGraph, TraceError> {
    let mut nodes = Vec::new();
    let mut hashes = HashScope::default();
    let mut held = 0;
    for_each_line(reader, source_name, |line, text| {
        let row: Row = json_row(text)?;
        let turns = row.num_turns.ok_or_else(|| missing("num_turns"))?;
        let turns = usize::try_from(turns)
            .ok()
            .filter(|&n| n <= MAX_TURNS)
            .ok_or_else(|| format!("\"num_turns\" must be at most {MAX_TURNS}"))?;
        let responses = row
            .assistant_response_length
            .ok_or_else(|| missing("assistant_response_length"))?;
        let tool_outputs = row
            .tool_call_output_length
            .ok_or_else(|| missing("tool_call_output_length"))?;
        let latencies = row
            .tool_call_latency
            .ok_or_else(|| missing("tool_call_latency"))?;
        for (name, len) in [
            ("assistant_response_length", responses.len()),
            ("tool_call_output_length", tool_outputs.len()),
            ("tool_call_latency", latencies.len()),
        ] {
            if len != turns {
                return Err(format!(
                    "\"{name}\" holds {len} entries, \"num_turns\" is {turns}"
                ));
            }
        }
        let last_output = row
            .final_assistant_response_length
            .ok_or_else(|| missing("final_assistant_response_length"))?;
        let session = format!("applied_compute_agentic_session_{line}");
        let mut input = row
            .input_prompt_length
            .ok_or_else(|| missing("input_prompt_length"))?;
        for k in 0..=turns {
            let output = responses.get(k).copied().unwrap_or(last_output);
            check_lengths(input, output).map_err(|m| format!("turn {k}: {m}"))?;
            hold_hash_ids(&mut held, (input as usize).div_ceil(block_size))?;
            let hash_ids = (0..(input as usize).div_ceil(block_size))
                .map(|b| hashes.intern(line, b as u64))
                .collect();
            let dependencies = match k {
                0 => Vec::new(),
                k => vec![RawDependency {
                    source: format!("{session}:turn:{}", k - 1),
                    trigger: Trigger::Completion,
                    relation: Relation::Sequence,
                    delay_ms: check_delay("tool_call_latency", latencies[k - 1] * 1e3)
                        .map_err(|m| format!("turn {k}: {m}"))?,
                }],
            };
            nodes.push(RawNode {
                request: TraceRequest {
                    line,
                    request_id: Some(format!("{session}:turn:{k}")),
                    input_length: input as usize,
                    requested_input_length: None,
                    output_length: output.max(1) as usize,
                    hash_ids,
                    delay: SimDuration::ZERO,
                },
                play_id: session.clone(),
                session_id: session.clone(),
                not_before_ms: 0.0,
                dependencies,
            });
            if k < turns {
                input = input
                    .saturating_add(responses[k])
                    .saturating_add(tool_outputs[k]);
            }
        }
        Ok(())
    })?;
    build(
        nodes,
        source_name,
        TraceFormat::AppliedComputeAgentic,
        block_size,
        None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str = r#"{"num_turns":2,"input_prompt_length":300,"assistant_response_length":[10,20],"tool_call_output_length":[30,40],"tool_call_latency":[0.5,1.25],"final_assistant_response_length":5}"#;

    #[test]
    fn a_session_row_is_a_play_of_growing_prompts() {
        let g = parse(format!("{ROW}\n{ROW}\n").as_bytes(), "a.jsonl", 64).expect("parses");
        assert_eq!((g.nodes.len(), g.plays.len()), (6, 2));
        let inputs: Vec<usize> = g.nodes[..3]
            .iter()
            .map(|n| n.request.input_length)
            .collect();
        assert_eq!(inputs, [300, 340, 400]);
        let outputs: Vec<usize> = g.nodes[..3]
            .iter()
            .map(|n| n.request.output_length)
            .collect();
        assert_eq!(outputs, [10, 20, 5]);
        let delays: Vec<f64> = g.nodes[..3]
            .iter()
            .flat_map(|n| n.dependencies.iter().map(|d| d.delay_ms))
            .collect();
        assert_eq!(delays, [500.0, 1250.0]);
        assert_eq!(g.plays[1].id, "applied_compute_agentic_session_2");
        // Each turn extends the last: a prefix of the session's ids; sessions share none.
        assert_eq!(
            g.nodes[1].request.hash_ids[..5],
            g.nodes[0].request.hash_ids[..]
        );
        assert!(g.nodes[3]
            .request
            .hash_ids
            .iter()
            .all(|h| !g.nodes[0].request.hash_ids.contains(h)));
    }

    #[test]
    fn arrays_must_have_num_turns_entries() {
        let bad = ROW.replace("[0.5,1.25]", "[0.5]");
        match parse(format!("{ROW}\n{bad}\n").as_bytes(), "a.jsonl", 64) {
            Err(TraceError::Line { line, message, .. }) => {
                assert_eq!(line, 2);
                assert_eq!(
                    message,
                    "\"tool_call_latency\" holds 1 entries, \"num_turns\" is 2"
                );
            }
            other => panic!("expected a line error, got {other:?}"),
        }
    }
}
