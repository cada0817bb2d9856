//! A Mooncake trace made ready to send: loaded (its first rows when asked), its sessions' shape
//! (cumulative or incremental rows), each request's [`PromptPlan`], and the prefix reuse the
//! trace predicts.

use std::collections::HashSet;

use servesim::trace::{self, Trace, TraceOptions, TraceRequest};

use crate::error::LoadgenError;
use crate::limits;
use crate::replay::args::{ReplayArgs, SessionMode};
use crate::run::prompt::PromptSynth;

/// What the rows of a trace's multi-turn sessions look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionShape {
    /// Consecutive row pairs whose later row extends the earlier one's hash ids.
    pub cumulative_pairs: usize,
    /// Other consecutive pairs.
    pub incremental_pairs: usize,
}

impl SessionShape {
    /// The mode `auto` resolves to: incremental only when no pair is cumulative.
    pub fn detected(&self) -> SessionMode {
        if self.incremental_pairs > 0 && self.cumulative_pairs == 0 {
            SessionMode::Incremental
        } else {
            SessionMode::Cumulative
        }
    }

    /// One line for the console.
    pub(crate) fn describe(&self) -> String {
        match (self.cumulative_pairs, self.incremental_pairs) {
            (0, 0) => "no multi-turn sessions".into(),
            (c, 0) => format!("sessions are cumulative ({c} of {c} follow-up rows extend the previous row's hash ids): rows sent as they are"),
            (0, i) => format!("sessions are incremental (none of {i} follow-up rows extends the previous row's hash ids): earlier rows are prepended"),
            (c, i) => format!("sessions are mixed ({c} follow-up rows extend the previous row, {i} do not): rows sent as they are (cumulative)"),
        }
    }
}

/// Classifies every consecutive pair of rows within each session. A later, longer row extends
/// the earlier one when it starts with all its hash ids, or with at least one full block's and
/// all but a last one that labels a partial block (of `trace_block_size` tokens), as `loadgen
/// trace convert` writes them.
pub fn session_shape(trace: &Trace, trace_block_size: usize) -> SessionShape {
    let mut shape = SessionShape {
        cumulative_pairs: 0,
        incremental_pairs: 0,
    };
    for s in &trace.sessions {
        for w in s.turns.windows(2) {
            let full = w[0]
                .hash_ids
                .len()
                .min(w[0].input_length / trace_block_size.max(1));
            let extends = w[1].hash_ids.starts_with(&w[0].hash_ids)
                || (full > 0
                    && w[1].input_length > w[0].input_length
                    && w[1].hash_ids.starts_with(&w[0].hash_ids[..full]));
            if w[1].hash_ids.len() >= w[0].hash_ids.len() && extends {
                shape.cumulative_pairs += 1;
            } else {
                shape.incremental_pairs += 1;
            }
        }
    }
    shape
}

/// Prompt of one request: (hash ids, tokens) segments concatenated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptPlan {
    /// Segments, each `input_length` tokens of its hash ids' blocks.
    pub segments: Vec<(Vec<u64>, usize)>,
}

impl PromptPlan {
    /// Total tokens.
    pub(crate) fn len(&self) -> usize {
        self.segments.iter().map(|(_, n)| n).sum()
    }

    /// The text.
    pub(crate) fn text(&self, synth: &PromptSynth) -> String {
        self.segments
            .iter()
            .map(|(ids, n)| synth.prompt(ids, *n))
            .collect()
    }

    /// The token ids of [`PromptPlan::text`], when `synth`'s pieces are exact.
    pub(crate) fn token_ids(&self, synth: &PromptSynth) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(self.len());
        for (ids, n) in &self.segments {
            out.extend(synth.prompt_ids(ids, *n)?);
        }
        Some(out)
    }

    /// Hash ids in prompt order (block-level identity, for the expected reuse).
    fn ids(&self) -> Vec<u64> {
        self.segments
            .iter()
            .flat_map(|(ids, _)| ids.iter().copied())
            .collect()
    }
}

/// Every request's prompt plan, per session and turn, for `mode` (already resolved).
pub fn plans(trace: &Trace, mode: SessionMode) -> Vec<Vec<PromptPlan>> {
    trace
        .sessions
        .iter()
        .map(|s| {
            let mut history: Vec<(Vec<u64>, usize)> = Vec::new();
            s.turns
                .iter()
                .map(|t: &TraceRequest| {
                    let own = (t.hash_ids.clone(), t.input_length);
                    match mode {
                        SessionMode::Incremental => {
                            history.push(own);
                            PromptPlan {
                                segments: history.clone(),
                            }
                        }
                        _ => PromptPlan {
                            segments: vec![own],
                        },
                    }
                })
                .collect()
        })
        .collect()
}

/// Expected prefix reuse with an unbounded cache: per request (session, turn order) the tokens
/// of its leading blocks whose hash-id prefix an earlier request (in approximate arrival order:
/// session start plus delays) already had, capped at the prompt length.
pub(crate) fn expected_reuse(
    trace: &Trace,
    plans: &[Vec<PromptPlan>],
    block: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    for (si, s) in trace.sessions.iter().enumerate() {
        let mut t = s.first_arrival.as_nanos();
        for (ti, turn) in s.turns.iter().enumerate() {
            t += turn.delay.as_nanos();
            order.push((t, si, ti));
        }
    }
    order.sort();
    let mut seen = SeenPrefixes::default();
    let mut out: Vec<Vec<usize>> = plans.iter().map(|p| vec![0; p.len()]).collect();
    for (_, si, ti) in order {
        let plan = &plans[si][ti];
        out[si][ti] = seen.add(plan.ids(), plan.len(), block);
    }
    out
}

/// Hash-id prefixes of the prompts sent so far (an unbounded prefix cache).
#[derive(Default)]
pub(super) struct SeenPrefixes {
    /// Chained hashes of every prefix seen.
    seen: HashSet<u64>,
}

impl SeenPrefixes {
    /// Adds a prompt (`ids`, `len` tokens, `block` tokens per id); returns its tokens whose
    /// hash-id prefix was seen before, capped at `len`.
    pub(super) fn add(
        &mut self,
        ids: impl IntoIterator<Item = u64>,
        len: usize,
        block: usize,
    ) -> usize {
        let mut chain = 0xcbf2_9ce4_8422_2325u64;
        let mut hit_blocks = 0;
        let mut prefix_intact = true;
        for id in ids {
            chain = xxhash_rust::xxh3::xxh3_64_with_seed(&id.to_le_bytes(), chain);
            if prefix_intact && self.seen.contains(&chain) {
                hit_blocks += 1;
            } else {
                prefix_intact = false;
            }
            self.seen.insert(chain);
        }
        (hit_blocks * block).min(len)
    }
}

/// Every prompt of `plans` (incremental sessions repeat their history) is at most
/// `limits::MAX_PROMPT_TOKENS`; the error names the trace line of the first that is not.
pub(crate) fn check_prompt_lengths(
    trace: &Trace,
    plans: &[Vec<PromptPlan>],
    source_name: &str,
) -> Result<(), LoadgenError> {
    for (session, turns) in trace.sessions.iter().zip(plans) {
        for (turn, plan) in session.turns.iter().zip(turns) {
            if plan.len() > limits::MAX_PROMPT_TOKENS {
                return Err(LoadgenError::Trace(trace::TraceError::Line {
                    source_name: source_name.to_string(),
                    line: turn.line,
                    message: format!(
                        "with the earlier rows of session \"{}\" prepended (incremental), the \
                         prompt is {} tokens, more than the {} loadgen sends",
                        session.id,
                        plan.len(),
                        limits::MAX_PROMPT_TOKENS
                    ),
                }));
            }
        }
    }
    Ok(())
}

/// Loads the trace (the first `max_requests` rows when given), its schedule bounded unless
/// `--allow-long-schedule`.
pub fn load_trace(args: &ReplayArgs) -> Result<Trace, LoadgenError> {
    let options = TraceOptions {
        trace_block_size: args.trace.block_size,
        arrival_speedup_ratio: args.trace.arrival_speedup_ratio,
    };
    let bound = trace::ScheduleBound::of_flag(args.trace.allow_long_schedule);
    let name = args.trace.file().display().to_string();
    let trace = match args.max_requests {
        None => trace::load_with_bound(args.trace.file(), &options, bound)?,
        Some(n) => {
            // The first `n` rows only, read line by line: each line within the engine's
            // `MAX_TRACE_LINE_BYTES`, the rest of the file never read.
            let file =
                std::fs::File::open(args.trace.file()).map_err(|source| LoadgenError::Io {
                    path: args.trace.file().to_path_buf(),
                    source,
                })?;
            let mut lines = trace::TraceLines::new(std::io::BufReader::new(file));
            let mut kept = 0usize;
            let mut text = Vec::new();
            while kept < n {
                let Some((_, bytes)) = lines.next_line().map_err(|e| e.in_trace(&name))? else {
                    break;
                };
                if std::str::from_utf8(bytes).map_or(true, |t| !t.trim().is_empty()) {
                    kept += 1;
                }
                text.extend_from_slice(bytes);
                text.push(b'\n');
            }
            trace::parse_with_bound(&text[..], &name, &options, bound)?
        }
    };
    let mut trace = trace;
    if let Some(profile) = &args.rate_profile {
        // After the speed-up: the profile's times are the replay's.
        profile.apply(&mut trace);
    }
    Ok(trace)
}

/// The "Prompts:" line of a live replay.
pub(super) fn prompts_line(args: &ReplayArgs, synth: &PromptSynth, block_size: usize) -> String {
    format!(
        "Prompts: {} tokens per hash id, {} ({})",
        block_size,
        if synth.is_exact() {
            "exact"
        } else {
            "approximate: ~1 lorem word per token"
        },
        if args.run.target.url.is_some() {
            "target"
        } else {
            "embedded server's tokenizer"
        }
    )
}

#[cfg(test)]
mod tests {
    use mock_server::test_kit::TempDir;

    use super::*;
    use clap::Parser;

    fn args(path: &std::path::Path, max_requests: &str) -> ReplayArgs {
        let path = path.display().to_string();
        let argv = ["loadgen", "replay", &path, "--max-requests", max_requests];
        match crate::Cli::try_parse_from(argv)
            .expect("valid flags")
            .command
        {
            crate::Command::Replay(a) => a,
            _ => unreachable!(),
        }
    }

    /// `--max-requests N` reads the first N rows line by line: the rows after them are never
    /// read, and a line over the engine's `MAX_TRACE_LINE_BYTES` among them is refused with
    /// its file and line (issue 43: the whole file was read into memory first).
    #[test]
    fn max_requests_reads_only_its_rows_each_within_the_line_cap() {
        let row = |t: u32| {
            format!(r#"{{"timestamp":{t},"input_length":4,"output_length":1,"hash_ids":[{t}]}}"#)
        };
        let tmp = TempDir::new("loadgen-max-requests").expect("a temporary folder");
        let path = tmp.join("trace.jsonl");
        let long = "x".repeat(trace::MAX_TRACE_LINE_BYTES + 1);
        let text = format!("{}\n\n{}\n{long}\n{}\n", row(0), row(1), row(2));
        std::fs::write(&path, text).expect("temp trace");
        let t = load_trace(&args(&path, "2")).expect("the first two rows");
        assert_eq!(t.num_requests(), 2);
        let e = load_trace(&args(&path, "3")).expect_err("the long line");
        assert_eq!(
            e.to_string(),
            format!(
                "{}:4: the line is longer than 16777216 bytes, the most a trace line may hold",
                path.display()
            )
        );
    }

    /// `--rate-profile` moves each session's first arrival after the speed-up, as `mockserve
    /// replay` does: rows at 0, 10 s, 20 s, 30 s sped up 2x (0, 5, 10, 15 s) under a 2x step
    /// from 5 s arrive at 0, 5, 7.5 and 10 s.
    #[test]
    fn a_rate_profile_maps_arrivals_after_the_speed_up() {
        let row = |t: u32| {
            format!(
                r#"{{"timestamp":{},"input_length":4,"output_length":1,"hash_ids":[{t}]}}"#,
                t * 10_000
            )
        };
        let tmp = TempDir::new("loadgen-rate-profile").expect("a temporary folder");
        let path = tmp.join("trace.jsonl");
        let text: String = (0..4).map(|t| row(t) + "\n").collect();
        std::fs::write(&path, text).expect("temp trace");
        let p = path.display().to_string();
        let argv = [
            "loadgen",
            "replay",
            &p,
            "--arrival-speedup-ratio",
            "2",
            "--rate-profile",
            "steps:0s=1,5s=2",
        ];
        let crate::Command::Replay(a) = crate::Cli::try_parse_from(argv).expect("flags").command
        else {
            unreachable!()
        };
        let t = load_trace(&a).expect("trace");
        let firsts: Vec<u64> = t
            .sessions
            .iter()
            .map(|s| s.first_arrival.as_micros())
            .collect();
        assert_eq!(firsts, vec![0, 5_000_000, 7_500_000, 10_000_000]);
        let bad = crate::Cli::try_parse_from(["loadgen", "replay", &p, "--rate-profile", "sine:1"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            bad.contains("expected diurnal:..., ramp:... or steps:..."),
            "{bad}"
        );
    }
}
