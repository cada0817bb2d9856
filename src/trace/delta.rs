//! `mooncake-delta` traces lowered into a [`RequestGraph`]: Mooncake rows (`session_id`,
//! `timestamp` or `delay`, `input_length`, `output_length`, `hash_ids`) whose hash ids describe
//! only each turn's new tokens.
//!
//! Turn `k`'s prompt is `delta(0) + output(0) + ... + delta(k - 1) + output(k - 1) + delta(k)`:
//! every earlier segment and output again, then its own. A delta is its hash ids'
//! tokens (`trace_block_size` copies of each id, file-global, cut to `input_length`; a row
//! asking for more than its ids cover is cut to them, as in a plain trace) and an output is
//! `output_length` tokens of its own, standing for the generated text. Prompts are therefore
//! kept token by token (the graph's block size is 1): a later turn shares every full engine block
//! of the earlier prompts. A session is a play; its turn `k + 1` waits for turn `k`'s last
//! token plus the row's `delay` (else the gap between the two rows' timestamps, else 0), and
//! its first turn starts at its `timestamp`.

use std::collections::HashMap;
use std::io::BufRead;

use super::graph::{
    build, check_delay, check_lengths, for_each_line, hold_hash_ids, json_row, HashScope,
    RawDependency, RawNode, Relation, RequestGraph, TraceFormat, Trigger,
};
use super::parse::{id_string, show};
use super::row::RawRow;
use super::{TraceError, TraceRequest, MAX_ROW_TOKENS, MAX_TIMESTAMP_MS};
use crate::time::SimDuration;

/// A session's state while its rows are read.
struct Session {
    /// Its prompt so far: every delta and output before the next turn's delta.
    tokens: Vec<u64>,
    /// Its last turn's request id and timestamp.
    last: (String, Option<f64>),
    turns: usize,
}

/// Reads a `mooncake-delta` trace, `trace_block_size` tokens per hash id.
pub(super) fn parse(
    reader: impl BufRead,
    source_name: &str,
    trace_block_size: usize,
) -> Result<RequestGraph, TraceError> {
    let mut nodes = Vec::new();
    let mut hashes = HashScope::default();
    let mut sessions: HashMap<String, Session> = HashMap::new();
    let mut held = 0;
    for_each_line(reader, source_name, |line, text| {
        let row: RawRow = json_row(text)?;
        let ids = row
            .hash_ids
            .ok_or_else(|| "missing field \"hash_ids\"".to_string())?;
        let output_length = row
            .output_length
            .ok_or_else(|| "missing field \"output_length\"".to_string())?;
        if ids.is_empty() {
            return Err("\"hash_ids\" must not be empty".to_string());
        }
        if ids.len() > MAX_ROW_TOKENS {
            return Err(format!(
                "\"hash_ids\" holds {} ids, more than the {MAX_ROW_TOKENS} a row may hold",
                ids.len()
            ));
        }
        let capacity = (ids.len() as u64).saturating_mul(trace_block_size as u64);
        let delta = row.input_length.unwrap_or(capacity).min(capacity);
        check_lengths(delta, output_length)?;
        let session_id = match row.session_id {
            Some(id) => id_string("session_id", id)?,
            None => format!("request_{line}"),
        };
        for (name, value) in [("timestamp", row.timestamp), ("delay", row.delay)] {
            if let Some(v) = value {
                if !(v.is_finite() && (0.0..=MAX_TIMESTAMP_MS).contains(&v)) {
                    return Err(format!(
                        "\"{name}\" must be finite, >= 0 and at most {} ms, got {}",
                        show(MAX_TIMESTAMP_MS),
                        show(v)
                    ));
                }
            }
        }
        let request_id = match row.request_id {
            Some(id) => id_string("request_id", id)?,
            None => format!("line:{line}"),
        };
        let session = sessions.entry(session_id.clone()).or_insert(Session {
            tokens: Vec::new(),
            last: (String::new(), None),
            turns: 0,
        });
        let (not_before_ms, dependencies) = match session.turns {
            0 => {
                let ts = row.timestamp.ok_or_else(|| {
                    format!("first turn of session \"{session_id}\" has no \"timestamp\"")
                })?;
                (ts, Vec::new())
            }
            _ => {
                let delay = match (row.delay, row.timestamp, session.last.1) {
                    (Some(d), _, _) => d,
                    (None, Some(ts), Some(prev)) => ts - prev,
                    _ => 0.0,
                };
                let dep = RawDependency {
                    source: session.last.0.clone(),
                    trigger: Trigger::Completion,
                    relation: Relation::Sequence,
                    delay_ms: check_delay("delay", delay)?,
                };
                (0.0, vec![dep])
            }
        };
        // The delta: its ids' tokens cut to its length (at most what they cover).
        let start = session.tokens.len();
        if start.saturating_add(delta as usize) > MAX_ROW_TOKENS {
            return Err(format!(
                "the prompt is {} tokens with the session's earlier turns, more than the \
                 {MAX_ROW_TOKENS} a row may ask for",
                start.saturating_add(delta as usize)
            ));
        }
        for &id in &ids {
            let token = hashes.intern(0, id);
            session
                .tokens
                .extend(std::iter::repeat_n(token, trace_block_size));
        }
        session.tokens.truncate(start + delta as usize);
        hold_hash_ids(&mut held, session.tokens.len())?;
        let prompt = session.tokens.clone();
        if prompt.len() > MAX_ROW_TOKENS {
            return Err(format!(
                "the prompt is {} tokens with the session's earlier turns, more than the \
                 {MAX_ROW_TOKENS} a row may ask for",
                prompt.len()
            ));
        }
        // The turn's output joins the next prompt.
        session
            .tokens
            .extend((0..output_length.max(1)).map(|_| hashes.private()));
        session.last = (request_id.clone(), row.timestamp);
        session.turns += 1;
        nodes.push(RawNode {
            request: TraceRequest {
                line,
                request_id: Some(request_id),
                input_length: prompt.len(),
                requested_input_length: None,
                output_length: output_length.max(1) as usize,
                hash_ids: prompt,
                delay: SimDuration::ZERO,
            },
            play_id: session_id.clone(),
            session_id,
            not_before_ms,
            dependencies,
        });
        Ok(())
    })?;
    build(nodes, source_name, TraceFormat::MooncakeDelta, 1, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's example: deltas of 128, 64 and 30 tokens, outputs of 8: prompts of 128,
    /// 200 and 238 tokens, each extending the one before.
    #[test]
    fn each_prompt_is_the_sessions_history_plus_its_delta() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/agentic/mooncake_delta.jsonl"
        );
        let text = std::fs::read_to_string(path).expect("fixture");
        let g = parse(text.as_bytes(), "d.jsonl", 64).expect("parses");
        assert_eq!((g.block_size, g.plays.len()), (1, 1));
        let inputs: Vec<usize> = g.nodes.iter().map(|n| n.request.input_length).collect();
        assert_eq!(inputs, [128, 200, 238]);
        let (t0, t1, t2) = (
            &g.nodes[0].request.hash_ids,
            &g.nodes[1].request.hash_ids,
            &g.nodes[2].request.hash_ids,
        );
        assert_eq!(t1[..128], t0[..]);
        assert_eq!(t2[..200], t1[..]);
        // The delta's tokens follow the turn's output: 8 tokens of its own, then the ids.
        assert!(t1[128..136].iter().all(|t| !t0.contains(t)));
        assert_eq!(
            t1[136..200],
            [t0[0]; 64],
            "hash id 1 again: the same tokens"
        );
        let d = &g.nodes[2].dependencies[0];
        assert_eq!(
            (d.source, d.trigger, d.delay_ms),
            (1, Trigger::Completion, 250.0)
        );
        assert_eq!(
            g.nodes[1].dependencies[0].delay_ms, 100.0,
            "the timestamps' gap"
        );
    }

    #[test]
    fn malformed_rows_name_their_line() {
        let cases = [
            (
                r#"{"session_id":"s","output_length":8,"hash_ids":[1]}"#,
                "first turn of session \"s\" has no \"timestamp\"",
            ),
            (
                r#"{"session_id":"s","timestamp":0,"output_length":8,"hash_ids":[]}"#,
                "\"hash_ids\" must not be empty",
            ),
            (
                r#"{"session_id":"s","timestamp":0,"hash_ids":[1]}"#,
                "missing field \"output_length\"",
            ),
        ];
        for (row, want) in cases {
            match parse(format!("\n{row}\n").as_bytes(), "d.jsonl", 64) {
                Err(TraceError::Line { line, message, .. }) => {
                    assert_eq!((line, message.as_str()), (2, want));
                }
                other => panic!("expected a line error, got {other:?}"),
            }
        }
    }
}
