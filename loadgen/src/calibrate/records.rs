//! Per-request records as `loadgen calibrate` compares them: read from the JSONL that
//! `loadgen replay --per-request-jsonl` and `mockserve replay --per-request-jsonl` write (or
//! from the records of a run in this process), keyed by the trace request they were, and
//! matched live against offline.
//!
//! The key of a Mooncake row is its session and turn (`session_id` is the row's `session_id`,
//! or `request_{line}` for a row without one); the key of an agentic node is its trace
//! `request_id` (the record's `agentic.request_id`). Times and counts are read at 1e-6 of
//! their unit.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde_json::Value;

use crate::error::LoadgenError;

/// One request's figures, as both sides report them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rec {
    /// The trace request it was.
    pub key: String,
    /// The agentic play, if any.
    pub play: Option<String>,
    /// When it was due (ms from its run's start).
    pub arrival_ms: f64,
    /// Time to first token.
    pub ttft_ms: Option<f64>,
    /// Mean inter-token gap.
    pub itl_ms: Option<f64>,
    /// Arrival to last token.
    pub e2e_ms: Option<f64>,
    /// Prompt tokens found cached.
    pub cached_tokens: f64,
    /// Output tokens requested: the identity check between the two sides.
    pub max_output_tokens: u64,
    /// The worker that served it, when the record says (`worker`).
    pub worker: Option<u64>,
    /// The server's own TTFT, from its engine's arrival (`engine_ttft_ms`, live records of a
    /// server that reports it).
    pub engine_ttft_ms: Option<f64>,
    /// Completed (not failed, rejected or incomplete).
    pub ok: bool,
    /// Where it came from (`FILE:LINE`, or `record N` of a run).
    pub origin: String,
}

/// A record's fields, from its JSON object (`origin` names it in errors).
pub(crate) fn parse(v: &Value, origin: String) -> Result<Rec, LoadgenError> {
    let bad = |what: &str| LoadgenError::Calibrate(format!("{origin}: {what}"));
    let obj = v.as_object().ok_or_else(|| bad("not a JSON object"))?;
    // Read at 1 ns (1e-6 ms): a value written as JSON text and parsed back may differ from
    // the one in memory in its last bit, and the two sides must compare equal when equal.
    let num = |k: &str| {
        obj.get(k)
            .and_then(Value::as_f64)
            .map(|x| (x * 1e6).round() / 1e6)
    };
    let (key, play) = match obj.get("agentic").filter(|a| !a.is_null()) {
        Some(a) => (
            a.get("request_id")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("agentic.request_id missing or not a string"))?
                .to_string(),
            a.get("play_id").and_then(Value::as_str).map(str::to_string),
        ),
        None => {
            let session = obj
                .get("session_id")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad("session_id missing or not a string: not a per-request record of a replay")
                })?;
            let turn = obj
                .get("turn_index")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad("turn_index missing or not an integer"))?;
            (format!("{session}#{turn}"), None)
        }
    };
    let status = obj
        .get("status")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("status missing"))?;
    let failed = obj.get("error").is_some_and(|e| !e.is_null());
    Ok(Rec {
        key,
        play,
        arrival_ms: num("arrival_ms").ok_or_else(|| bad("arrival_ms missing"))?,
        ttft_ms: num("ttft_ms"),
        itl_ms: num("itl_ms"),
        e2e_ms: num("e2e_latency_ms"),
        cached_tokens: num("reused_input_tokens").unwrap_or(0.0),
        max_output_tokens: obj
            .get("max_output_tokens")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("max_output_tokens missing"))?,
        worker: obj.get("worker").and_then(Value::as_u64),
        engine_ttft_ms: num("engine_ttft_ms"),
        ok: status == "completed" && !failed,
        origin,
    })
}

/// Largest records file read (bytes): far above any trace's records, and a bound on memory.
const MAX_RECORDS_BYTES: u64 = 4 << 30;

/// The JSON lines of a records file with their origins (`path:line`), in file order; blank
/// lines skipped. `flag` prefixes the errors of a line that is not JSON.
pub(crate) fn read_values(path: &Path, flag: &str) -> Result<Vec<(Value, String)>, LoadgenError> {
    let io = |source| LoadgenError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_RECORDS_BYTES {
        return Err(LoadgenError::Calibrate(format!(
            "{flag}{}: {len} bytes, above the {MAX_RECORDS_BYTES}-byte bound on a records file",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let origin = format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line)
            .map_err(|e| LoadgenError::Calibrate(format!("{flag}{origin}: not JSON ({e})")))?;
        out.push((v, origin));
    }
    Ok(out)
}

/// The records of a JSONL file, in file order; blank lines skipped.
pub(crate) fn read(path: &Path) -> Result<Vec<Rec>, LoadgenError> {
    let out = read_values(path, "")?
        .into_iter()
        .map(|(v, origin)| parse(&v, origin))
        .collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        return Err(LoadgenError::Calibrate(format!(
            "{}: no records (an empty file)",
            path.display()
        )));
    }
    Ok(out)
}

/// The records of a run in this process (serialized as they would be written).
pub(crate) fn of_values(
    values: impl IntoIterator<Item = Value>,
    side: &str,
) -> Result<Vec<Rec>, LoadgenError> {
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| parse(&v, format!("{side} record {}", i + 1)))
        .collect()
}

/// The two sides matched: completed pairs, and what was left out and why.
#[derive(Debug, Default)]
pub(crate) struct Matched {
    /// (offline, live) of every request completed on both sides, in offline arrival order.
    pub pairs: Vec<(Rec, Rec)>,
    /// Live records in all.
    pub live: usize,
    /// Offline records in all.
    pub offline: usize,
    /// Live records that failed (counted and excluded).
    pub failed_live: usize,
    /// Offline records the engine rejected or left incomplete (excluded).
    pub failed_offline: usize,
    /// Offline requests without a live record (a partial or sharded run).
    pub missing_live: usize,
    /// Keys of the plays with a failed, rejected or missing request (no trajectory E2E).
    pub broken_plays: std::collections::BTreeSet<String>,
}

/// Matches `live` against `offline` by trace request. A live record naming a request the
/// offline replay of the trace does not have, or asking for another output length, means the
/// records are of another trace: an error naming the first such record and how many there
/// are. So is a duplicate live key, and a run in which nothing matches.
pub(crate) fn match_up(
    offline: Vec<Rec>,
    live: Vec<Rec>,
    trace: &str,
) -> Result<Matched, LoadgenError> {
    let mut by_key: HashMap<String, Rec> = HashMap::with_capacity(offline.len());
    let offline_count = offline.len();
    let mut order: Vec<String> = Vec::with_capacity(offline.len());
    for r in offline {
        order.push(r.key.clone());
        by_key.insert(r.key.clone(), r);
    }
    let mut seen: BTreeMap<String, Rec> = BTreeMap::new();
    let mut foreign: Vec<String> = Vec::new();
    for r in &live {
        match by_key.get(&r.key) {
            None => foreign.push(format!(
                "{} ({} is not a request of the trace)",
                r.origin, r.key
            )),
            Some(o) if o.max_output_tokens != r.max_output_tokens => foreign.push(format!(
                "{} ({} asks for {} output tokens, the trace's row for {})",
                r.origin, r.key, r.max_output_tokens, o.max_output_tokens
            )),
            Some(_) => {
                if let Some(first) = seen.insert(r.key.clone(), r.clone()) {
                    return Err(LoadgenError::Calibrate(format!(
                        "{}: request {} appears twice (first at {}): records of one run each \
                         name a trace request once",
                        r.origin, r.key, first.origin
                    )));
                }
            }
        }
    }
    if seen.is_empty() {
        return Err(LoadgenError::Calibrate(match foreign.first() {
            Some(first) => format!(
                "no live record matches a request of {trace} (records of another trace?): \
                 first {first}"
            ),
            None => format!("no live record matches a request of {trace}"),
        }));
    }
    if !foreign.is_empty() {
        return Err(LoadgenError::Calibrate(format!(
            "{} of {} live records are not of {trace}: first {}",
            foreign.len(),
            live.len(),
            foreign[0]
        )));
    }
    let mut m = Matched {
        live: live.len(),
        offline: offline_count,
        ..Matched::default()
    };
    for key in order {
        let Some(o) = by_key.remove(&key) else {
            continue;
        };
        let l = seen.remove(&key);
        let play = o.play.clone();
        let usable = match &l {
            None => {
                m.missing_live += 1;
                false
            }
            Some(l) if !l.ok => {
                m.failed_live += 1;
                false
            }
            Some(_) if !o.ok => {
                m.failed_offline += 1;
                false
            }
            Some(_) => true,
        };
        match (usable, l) {
            (true, Some(l)) => m.pairs.push((o, l)),
            _ => {
                if let Some(p) = play {
                    m.broken_plays.insert(p);
                }
            }
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(session: &str, turn: u64, max_out: u64, status: &str) -> Value {
        json!({"session_id": session, "turn_index": turn, "arrival_ms": 1.0, "ttft_ms": 2.0,
               "itl_ms": 0.5, "e2e_latency_ms": 9.0, "reused_input_tokens": 64,
               "max_output_tokens": max_out, "status": status})
    }

    fn recs(v: Vec<Value>, side: &str) -> Vec<Rec> {
        of_values(v, side).expect("parses")
    }

    #[test]
    fn records_match_by_session_and_turn_and_failures_are_counted() {
        let offline = recs(
            vec![
                rec("a", 0, 4, "completed"),
                rec("a", 1, 4, "completed"),
                rec("b", 0, 8, "completed"),
                rec("c", 0, 8, "rejected"),
            ],
            "offline",
        );
        let mut failed = rec("a", 1, 4, "rejected");
        failed["error"] = json!("HTTP 500: boom");
        let live = recs(
            vec![
                rec("b", 0, 8, "completed"),
                failed,
                rec("a", 0, 4, "completed"),
                rec("c", 0, 8, "completed"),
            ],
            "live",
        );
        let m = match_up(offline, live, "t.jsonl").expect("matches");
        let keys: Vec<&str> = m.pairs.iter().map(|(o, _)| o.key.as_str()).collect();
        assert_eq!(keys, ["a#0", "b#0"]);
        assert_eq!((m.failed_live, m.failed_offline, m.missing_live), (1, 1, 0));
        assert_eq!(m.pairs[0].1.cached_tokens, 64.0);
    }

    #[test]
    fn records_of_another_trace_are_refused() {
        let offline = || recs(vec![rec("a", 0, 4, "completed")], "offline");
        let e = match_up(
            offline(),
            recs(vec![rec("z", 0, 4, "completed")], "live"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "calibrate: no live record matches a request of t (records of another trace?): \
             first live record 1 (z#0 is not a request of the trace)"
        );
        let mixed = recs(
            vec![rec("a", 0, 4, "completed"), rec("z", 0, 4, "completed")],
            "live",
        );
        let e = match_up(offline(), mixed, "t").unwrap_err().to_string();
        assert_eq!(
            e,
            "calibrate: 1 of 2 live records are not of t: first live record 2 (z#0 is not a \
             request of the trace)"
        );
        let e = match_up(
            offline(),
            recs(vec![rec("a", 0, 5, "completed")], "live"),
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("a#0 asks for 5 output tokens, the trace's row for 4"),
            "{e}"
        );
        let twice = recs(
            vec![rec("a", 0, 4, "completed"), rec("a", 0, 4, "completed")],
            "live",
        );
        let e = match_up(offline(), twice, "t").unwrap_err().to_string();
        assert!(e.contains("request a#0 appears twice"), "{e}");
        let e = match_up(offline(), Vec::new(), "t")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "calibrate: no live record matches a request of t");
    }

    #[test]
    fn a_line_that_is_not_a_record_is_named() {
        let e = parse(&json!({"ttft_ms": 1.0}), "f.jsonl:3".into())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("calibrate: f.jsonl:3: session_id missing"),
            "{e}"
        );
        let v = json!({"agentic": {"request_id": "r1", "play_id": "p0"}, "arrival_ms": 0.0,
                       "max_output_tokens": 2, "status": "completed"});
        let r = parse(&v, "x".into()).expect("agentic record");
        assert_eq!((r.key.as_str(), r.play.as_deref()), ("r1", Some("p0")));
    }
}
