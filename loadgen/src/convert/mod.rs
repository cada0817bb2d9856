//! `loadgen trace convert`: real traffic into a replayable trace. The input is loadgen's own
//! multiturn records (`input::read_records`) or a JSONL log of OpenAI chat requests
//! (`input::read_openai_log`); the output a Mooncake or `agentic_mooncake` trace
//! (`output::write`) that `loadgen replay` and `mockserve replay` read.
//!
//! Hash ids come from the real prompt tokens (the chat template included) in blocks of
//! `--block-size`: two requests share ids exactly as far as their prompts agree in whole blocks
//! (`output` says how ids are given). A multiturn record keeps its prompt as block hashes
//! (`run::blocks::PromptBlocks`, 16 tokens a hash), so records convert at any multiple of 16; a log
//! is tokenized here with `--tokenizer`. Conversations become sessions, their think times the
//! delays after each previous turn's end; timestamps become the trace's timing.
//!
//! Same input and flags, same bytes out.

pub(crate) mod input;
pub(crate) mod output;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};

pub use crate::error::convert::ConvertError;
use crate::error::LoadgenError;
use crate::limits;
use crate::run::blocks::ChatPrompts;
use input::{InputFormat, ReadNotes};
use output::{Converted, OutputFormat, OutputPlan};
use servesim::trace::{read_whole, BoundedReadError, MAX_TRACE_FILE_BYTES};

/// `loadgen trace`: work on trace files.
#[derive(Args, Clone, Debug)]
pub struct TraceArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: TraceCommand,
}

/// `loadgen trace` subcommands.
#[derive(Subcommand, Clone, Debug)]
pub enum TraceCommand {
    /// Turn loadgen multiturn records or a log of OpenAI chat requests into a Mooncake or
    /// agentic_mooncake trace, hash ids from the real tokens.
    Convert(ConvertArgs),
}

/// `loadgen trace convert` flags.
#[derive(Args, Clone, Debug)]
pub struct ConvertArgs {
    /// The input: `loadgen multiturn --per-request-jsonl` records, or a JSONL log of chat
    /// requests, one `{"timestamp": MS, "request": {...}}` a line (optional `session_id` or
    /// `conversation_id`, `request_id`, `latency_ms`, `output_tokens` or `response.usage`).
    pub input: PathBuf,

    /// What the input holds [default: detected from its first line].
    #[arg(long, value_enum)]
    pub from: Option<InputFormat>,

    /// The trace format to write (agentic-mooncake: one play per conversation, each turn
    /// waiting on the previous turn's completion plus the think time).
    #[arg(long, value_enum, default_value_t = OutputFormat::Mooncake)]
    pub to: OutputFormat,

    /// Tokens per hash id: replay with `--trace-block-size` set to it (an agentic trace carries
    /// it). Cache hits replay exactly when it divides the engine's KV block size. Records are
    /// hashed in blocks of 16 tokens, so it must be a multiple of 16 for them.
    #[arg(long)]
    pub block_size: usize,

    /// Tokenizer of an OpenAI log's prompts: a HuggingFace tokenizer.json, or an embedded one
    /// by name (`o200k_base`, `cl100k_base`, `builtin`); the chat template matching its special
    /// tokens renders the messages, as mockserve does. [default: o200k_base, the embedded
    /// server's]. Records carry their own tokenization.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,

    /// Model named on agentic rows [default: each request's `model`, or "unknown"].
    #[arg(long)]
    pub model: Option<String>,

    /// The trace file to write.
    #[arg(short, long, value_name = "PATH")]
    pub output: PathBuf,
}

/// What a conversion wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertSummary {
    /// The input format (given or detected).
    pub from: InputFormat,
    /// The trace.
    pub converted: Converted,
    /// What reading left out.
    pub notes: ReadNotes,
    /// Requests whose recorded `usage.prompt_tokens` differ from loadgen's tokenization (the
    /// trace uses loadgen's).
    pub usage_differs: usize,
}

impl ConvertArgs {
    /// Checks the flags before anything is read.
    pub fn check(&self) -> Result<(), LoadgenError> {
        limits::count(
            "--block-size",
            self.block_size,
            1,
            servesim::trace::MAX_TRACE_BLOCK_SIZE,
        )?;
        limits::output_path("--output", &self.output)
    }

    /// The output plan for an input of `from` whose bytes hash to `digest`.
    fn plan(&self, from: InputFormat, digest: u64) -> OutputPlan {
        OutputPlan {
            format: self.to,
            block_size: self.block_size,
            model: self.model.clone(),
            source_format: match from {
                InputFormat::Records => "loadgen-records",
                InputFormat::OpenaiLog => "openai-log",
            },
            source_digest: format!("xxh3:{digest:016x}"),
        }
    }
}

/// Converts the bytes of an input named `source_name` (no file is touched): the trace text and
/// what it holds.
pub(crate) fn convert_bytes(
    bytes: &[u8],
    source_name: &str,
    args: &ConvertArgs,
) -> Result<ConvertSummary, LoadgenError> {
    let from = match args.from {
        Some(f) => f,
        None => input::detect(bytes, source_name)?.ok_or_else(|| ConvertError::Empty {
            source_name: source_name.to_string(),
            why: "the file is empty or blank".to_string(),
        })?,
    };
    let (requests, notes) = match from {
        InputFormat::Records => input::read_records(bytes, source_name)?,
        InputFormat::OpenaiLog => {
            let tokenizer: Arc<dyn servesim::tokenizer::Tokenizer> = match &args.tokenizer {
                Some(path) => Arc::from(servesim::tokenizer::load_tokenizer(path)?),
                None => Arc::new(servesim::tokenizer::default_tokenizer()?),
            };
            let prompts = ChatPrompts::new(tokenizer);
            let requests = input::read_openai_log(bytes, source_name, &prompts, args.block_size)?;
            (requests, ReadNotes::default())
        }
    };
    if requests.is_empty() {
        let why = match notes.failed {
            0 => "the file is empty or blank".to_string(),
            n => format!("all {n} recorded requests failed"),
        };
        return Err(ConvertError::Empty {
            source_name: source_name.to_string(),
            why,
        }
        .into());
    }
    let usage_differs = requests.iter().filter(|r| r.usage_differs).count();
    let digest = xxhash_rust::xxh3::xxh3_64(bytes);
    let converted = output::write(requests, &args.plan(from, digest), source_name)?;
    Ok(ConvertSummary {
        from,
        converted,
        notes,
        usage_differs,
    })
}

/// Runs `loadgen trace convert`: reads the input, writes the trace, prints what it holds.
pub fn convert(args: &ConvertArgs) -> Result<ConvertSummary, LoadgenError> {
    args.check()?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadgenError::Io { path, source }
    };
    let source_name = args.input.display().to_string();
    // Read whole (its digest names the source), within the engine's `MAX_TRACE_FILE_BYTES`.
    let file = std::fs::File::open(&args.input).map_err(io(&args.input))?;
    let bytes = match read_whole(file, MAX_TRACE_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(BoundedReadError::LargeFile { cap }) => {
            return Err(ConvertError::TooLarge { source_name, cap }.into())
        }
        Err(BoundedReadError::Io(e)) => return Err(io(&args.input)(e)),
        // A whole read has no lines to refuse.
        Err(e @ BoundedReadError::LongLine { .. }) => {
            return Err(io(&args.input)(std::io::Error::other(e)))
        }
    };
    let summary = convert_bytes(&bytes, &source_name, args)?;
    crate::write::bytes(&args.output, &summary.converted.text)?;
    let c = &summary.converted;
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    crate::stdout::outln!(
        "{}: {} in {}, {} of {} tokens, written to {} ({})",
        source_name,
        plural(c.requests, "request", "requests"),
        plural(c.sessions, "session", "sessions"),
        plural(c.hash_ids as usize, "hash id", "hash ids"),
        args.block_size,
        args.output.display(),
        match args.to {
            OutputFormat::Mooncake => "mooncake",
            OutputFormat::AgenticMooncake => "agentic_mooncake",
        }
    );
    if summary.notes.failed > 0 {
        crate::stdout::outln!(
            "Left out {} failed requests (their time stays in the next turn's delay)",
            summary.notes.failed
        );
    }
    if summary.usage_differs > 0 {
        crate::stdout::outln!(
            "{} requests: the server counted other prompt tokens than loadgen's tokenizer and \
             chat template (the trace holds loadgen's)",
            summary.usage_differs
        );
    }
    if c.overlapping_turns > 0 {
        crate::stdout::outln!(
            "{} turns were sent before the previous turn of their conversation ended: they wait \
             for it with no delay",
            c.overlapping_turns
        );
    }
    if c.empty_outputs > 0 {
        crate::stdout::outln!(
            "{} requests generated no token: written with an output length of 1 (a trace row \
             generates at least one)",
            c.empty_outputs
        );
    }
    if args.to == OutputFormat::Mooncake {
        crate::stdout::outln!(
            "Replay with: loadgen replay {} --trace-block-size {} --session-mode cumulative",
            args.output.display(),
            args.block_size
        );
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> ConvertArgs {
        let mut argv = vec!["loadgen", "trace", "convert", "in.jsonl", "-o", "out.jsonl"];
        argv.extend_from_slice(flags);
        match crate::Cli::try_parse_from(argv)
            .expect("valid flags")
            .command
        {
            crate::Command::Trace(TraceArgs {
                command: TraceCommand::Convert(a),
            }) => a,
            _ => unreachable!(),
        }
    }

    fn convert_text(text: &str, flags: &[&str]) -> Result<ConvertSummary, String> {
        convert_bytes(text.as_bytes(), "in.jsonl", &args(flags)).map_err(|e| e.to_string())
    }

    /// Three records of two users (one failed record more): user 1's first prompt shares the
    /// first 32 tokens of user 0's; user 0's second turn extends its first.
    const RECORDS: &str = concat!(
        r#"{"user_id":0,"turn":0,"ttft_us":1,"total_latency_us":1000,"success":true,"output_tokens":5,"prompt_tokens":40,"start_us":0,"prompt_blocks":{"tokens":40,"block_size":16,"hashes":[11,12]}}"#,
        "\n",
        r#"{"user_id":1,"turn":0,"ttft_us":1,"total_latency_us":2000,"success":true,"output_tokens":6,"prompt_tokens":33,"start_us":500,"prompt_blocks":{"tokens":33,"block_size":16,"hashes":[11,12]}}"#,
        "\n\n",
        r#"{"user_id":0,"turn":1,"ttft_us":1,"total_latency_us":3000,"success":true,"output_tokens":7,"prompt_tokens":70,"start_us":251000,"prompt_blocks":{"tokens":70,"block_size":16,"hashes":[11,12,13,14]}}"#,
        "\n",
        r#"{"user_id":1,"turn":1,"ttft_us":0,"total_latency_us":9,"success":false,"start_us":2600,"error":{"kind":"timeout"}}"#,
        "\n",
    );

    /// An input line of exactly the engine's `MAX_TRACE_LINE_BYTES` is read; one byte more is
    /// refused with the file, the line and the cap, detected or named (issue 43: a 1 GiB line
    /// aborted the conversion on a failed allocation).
    #[test]
    fn a_line_one_byte_over_the_cap_is_refused_with_its_line() {
        use servesim::trace::MAX_TRACE_LINE_BYTES;
        let mut records = RECORDS.lines();
        let first = records.next().expect("a record");
        let second = records.next().expect("a record");
        let padded = |len: usize| format!("{second}{}", " ".repeat(len - second.len()));
        let at_cap = format!("{first}\n{}\n", padded(MAX_TRACE_LINE_BYTES));
        let s = convert_text(&at_cap, &["--block-size", "16"]).expect("at the cap");
        assert_eq!(s.converted.requests, 2);
        let over = format!("{first}\n{}\n", padded(MAX_TRACE_LINE_BYTES + 1));
        for flags in [
            &["--block-size", "16"][..],
            &["--block-size", "16", "--from", "records"],
        ] {
            assert_eq!(
                convert_text(&over, flags).expect_err("over the cap"),
                "in.jsonl:2: the line is longer than 16777216 bytes, the most a line may hold"
            );
        }
    }

    #[test]
    fn records_to_mooncake() {
        let s = convert_text(RECORDS, &["--block-size", "32"]).expect("converts");
        assert_eq!(s.from, InputFormat::Records);
        assert_eq!(s.notes.failed, 1);
        assert_eq!(s.usage_differs, 0);
        assert_eq!(
            s.converted.text,
            concat!(
                r#"{"request_id":"user-0-turn-0","session_id":"user-0","timestamp":0.0,"input_length":40,"output_length":5,"hash_ids":[0,1]}"#,
                "\n",
                r#"{"request_id":"user-1-turn-0","session_id":"user-1","timestamp":0.5,"input_length":33,"output_length":6,"hash_ids":[0,2]}"#,
                "\n",
                r#"{"request_id":"user-0-turn-1","session_id":"user-0","delay":250.0,"input_length":70,"output_length":7,"hash_ids":[0,3,4]}"#,
                "\n",
            )
        );
        assert_eq!(
            (
                s.converted.requests,
                s.converted.sessions,
                s.converted.hash_ids
            ),
            (3, 2, 5)
        );
        // At 16 tokens a hash id: the records' own blocks.
        let s = convert_text(RECORDS, &["--block-size", "16"]).expect("converts");
        let ids: Vec<Vec<u64>> = s
            .converted
            .text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                serde_json::from_value(v["hash_ids"].clone()).expect("ids")
            })
            .collect();
        assert_eq!(ids, [vec![0, 1, 2], vec![0, 1, 3], vec![0, 1, 4, 5, 6]]);
        // The trace reads back as Mooncake with the same sessions and delays.
        let trace = servesim::trace::parse(
            s.converted.text.as_bytes(),
            "t",
            &servesim::trace::TraceOptions {
                trace_block_size: 16,
                arrival_speedup_ratio: 1.0,
            },
        )
        .expect("a valid trace");
        assert_eq!(trace.sessions.len(), 2);
        assert_eq!(trace.sessions[0].turns[1].delay.as_micros(), 250_000);
    }

    /// `loadgen replay` reads a converted conversation as cumulative (each row holds the
    /// history) although each row's last id labels a partial block of its own; rows that share
    /// no full block stay incremental.
    #[test]
    fn replay_detects_converted_sessions_as_cumulative() {
        let s = convert_text(RECORDS, &["--block-size", "32"]).expect("converts");
        let opts = servesim::trace::TraceOptions {
            trace_block_size: 32,
            arrival_speedup_ratio: 1.0,
        };
        let trace =
            servesim::trace::parse(s.converted.text.as_bytes(), "t", &opts).expect("a valid trace");
        let shape = crate::replay::session_shape(&trace, 32);
        assert_eq!((shape.cumulative_pairs, shape.incremental_pairs), (1, 0));
        let incremental = concat!(
            r#"{"session_id":"a","timestamp":0,"input_length":40,"output_length":1,"hash_ids":[7,8]}"#,
            "\n",
            r#"{"session_id":"a","delay":1,"input_length":70,"output_length":1,"hash_ids":[9,10,11]}"#,
            "\n",
            r#"{"session_id":"b","timestamp":0,"input_length":20,"output_length":1,"hash_ids":[1]}"#,
            "\n",
            r#"{"session_id":"b","delay":1,"input_length":40,"output_length":1,"hash_ids":[2,3]}"#,
            "\n",
        );
        let trace = servesim::trace::parse(incremental.as_bytes(), "t", &opts).expect("valid");
        let shape = crate::replay::session_shape(&trace, 32);
        assert_eq!((shape.cumulative_pairs, shape.incremental_pairs), (0, 2));
    }

    #[test]
    fn records_to_agentic_mooncake() {
        let s = convert_text(RECORDS, &["--block-size", "32", "--to", "agentic_mooncake"])
            .expect("converts");
        let digest = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(RECORDS.as_bytes()));
        let expected = [
            format!(
                r#"{{"schema":"dynamo.agentic_mooncake","version":2,"block_size":32,"hash_id_scope":"global","source":{{"format":"loadgen-records","digest":"xxh3:{digest}"}}}}"#
            ),
            r#"{"request_id":"user-0-turn-0","play_id":"user-0","session_id":"user-0","model":"unknown","input_length":40,"output_length":5,"hash_ids":[0,1],"not_before_ms":0.0,"dependencies":[]}"#.to_string(),
            r#"{"request_id":"user-1-turn-0","play_id":"user-1","session_id":"user-1","model":"unknown","input_length":33,"output_length":6,"hash_ids":[0,2],"not_before_ms":0.5,"dependencies":[]}"#.to_string(),
            r#"{"request_id":"user-0-turn-1","play_id":"user-0","session_id":"user-0","model":"unknown","input_length":70,"output_length":7,"hash_ids":[0,3,4],"not_before_ms":0.0,"dependencies":[{"request_id":"user-0-turn-0","trigger":"completion","relation":"sequence","delay_ms":250.0}]}"#.to_string(),
        ];
        assert_eq!(s.converted.text, expected.join("\n") + "\n");
        let s = convert_text(
            RECORDS,
            &[
                "--block-size",
                "32",
                "--to",
                "agentic-mooncake",
                "--model",
                "M",
            ],
        )
        .expect("converts");
        assert_eq!(s.converted.text.matches(r#""model":"M""#).count(), 3);
    }

    /// A log of four requests (one blank line): a conversation of two turns (the second after a
    /// 200 ms think time past the first's end), a request on its own sharing the conversation's
    /// first block, and a conversation named by `conversation_id`. The builtin tokenizer: one
    /// token per word and marker.
    const LOG: &str = concat!(
        r#"{"timestamp":1000,"session_id":"s1","request":{"model":"m1","messages":[{"role":"user","content":"a b c d e f"}],"max_completion_tokens":8},"latency_ms":100}"#,
        "\n",
        r#"{"timestamp":1050,"request":{"model":"m2","messages":[{"role":"user","content":"a b c d x y"}]},"output_tokens":3}"#,
        "\n\n",
        r#"{"timestamp":1300,"session_id":"s1","request_id":"r3","request":{"model":"m1","messages":[{"role":"user","content":"a b c d e f"},{"role":"assistant","content":"g h"},{"role":"user","content":"i"}]},"response":{"usage":{"completion_tokens":2}}}"#,
        "\n",
        r#"{"timestamp":1400.25,"conversation_id":7,"request":{"model":"m1","messages":[{"role":"user","content":"z"}],"max_tokens":4}}"#,
        "\n",
    );

    #[test]
    fn an_openai_log_to_mooncake() {
        let s =
            convert_text(LOG, &["--block-size", "4", "--tokenizer", "builtin"]).expect("converts");
        assert_eq!(s.from, InputFormat::OpenaiLog);
        // 10 tokens: BOS, <|user|>, six words, <|end|>, <|assistant|>; the second prompt shares
        // the first block (BOS, <|user|>, "a", " b"); the second turn (17 tokens) holds the
        // first turn's 10 and goes on.
        assert_eq!(
            s.converted.text,
            concat!(
                r#"{"request_id":"line-1","session_id":"s1","timestamp":0.0,"input_length":10,"output_length":8,"hash_ids":[0,1,2]}"#,
                "\n",
                r#"{"request_id":"line-2","timestamp":50.0,"input_length":10,"output_length":3,"hash_ids":[0,3,4]}"#,
                "\n",
                r#"{"request_id":"r3","session_id":"s1","delay":200.0,"input_length":17,"output_length":2,"hash_ids":[0,1,5,6,7]}"#,
                "\n",
                r#"{"request_id":"line-5","session_id":"7","timestamp":400.25,"input_length":5,"output_length":4,"hash_ids":[8,9]}"#,
                "\n",
            )
        );
        assert_eq!(
            (
                s.converted.requests,
                s.converted.sessions,
                s.converted.hash_ids
            ),
            (4, 3, 10)
        );
    }

    #[test]
    fn an_openai_log_to_agentic_mooncake() {
        let s = convert_text(
            LOG,
            &[
                "--block-size",
                "4",
                "--tokenizer",
                "builtin",
                "--to",
                "agentic-mooncake",
                "--from",
                "openai-log",
            ],
        )
        .expect("converts");
        let digest = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(LOG.as_bytes()));
        let expected = [
            format!(
                r#"{{"schema":"dynamo.agentic_mooncake","version":2,"block_size":4,"hash_id_scope":"global","source":{{"format":"openai-log","digest":"xxh3:{digest}"}}}}"#
            ),
            r#"{"request_id":"line-1","play_id":"s1","session_id":"s1","model":"m1","input_length":10,"output_length":8,"hash_ids":[0,1,2],"not_before_ms":0.0,"dependencies":[]}"#.to_string(),
            r#"{"request_id":"line-2","play_id":"line-2","session_id":"line-2","model":"m2","input_length":10,"output_length":3,"hash_ids":[0,3,4],"not_before_ms":50.0,"dependencies":[]}"#.to_string(),
            r#"{"request_id":"r3","play_id":"s1","session_id":"s1","model":"m1","input_length":17,"output_length":2,"hash_ids":[0,1,5,6,7],"not_before_ms":0.0,"dependencies":[{"request_id":"line-1","trigger":"completion","relation":"sequence","delay_ms":200.0}]}"#.to_string(),
            r#"{"request_id":"line-5","play_id":"7","session_id":"7","model":"m1","input_length":5,"output_length":4,"hash_ids":[8,9],"not_before_ms":400.25,"dependencies":[]}"#.to_string(),
        ];
        assert_eq!(s.converted.text, expected.join("\n") + "\n");
        // servesim reads it as the graph it describes: r3 waits 200 ms after line-1's end.
        let graph = servesim::trace::parse_graph(
            s.converted.text.as_bytes(),
            "t",
            servesim::trace::TraceFormat::AgenticMooncake,
            512,
        )
        .expect("a valid agentic trace");
        assert_eq!((graph.nodes.len(), graph.block_size), (4, 4));
    }

    /// Every malformed line is an error naming its line; nothing panics.
    #[test]
    fn malformed_lines_are_errors_with_their_line_number() {
        let ok_log = r#"{"timestamp":0,"request":{"model":"m","messages":[{"role":"user","content":"hi"}]},"output_tokens":1}"#;
        let log_cases: &[(&str, &str)] = &[
            ("{", "invalid JSON: EOF while parsing an object (column 1)"),
            ("[1]", "expected a JSON object"),
            (
                r#"{"request":{}}"#,
                "missing field \"timestamp\" (milliseconds)",
            ),
            (
                r#"{"timestamp":-1,"request":{}}"#,
                "\"timestamp\" must be finite, >= 0 and at most 9e15 ms, got -1",
            ),
            (
                r#"{"timestamp":1}"#,
                "missing field \"request\" (the chat request body)",
            ),
            (
                r#"{"timestamp":1,"request":"hi"}"#,
                "\"request\" must be a chat completions body (an object), got a string",
            ),
            (
                r#"{"timestamp":1,"request":{"model":"m","messages":[]}}"#,
                "\"request\" is not a valid chat request: Invalid 'messages': empty array. \
                 Expected an array with minimum length 1.",
            ),
            (
                r#"{"timestamp":1,"request":{"model":"m","messages":[{"role":"user","content":"x"}]}}"#,
                "no output length: give \"output_tokens\", \"response.usage.completion_tokens\" \
                 or the request's \"max_completion_tokens\"",
            ),
            (
                r#"{"timestamp":1,"output_tokens":-2,"request":{"model":"m","messages":[{"role":"user","content":"x"}]}}"#,
                "\"output_tokens\" must be a whole number >= 0, got -2",
            ),
            (
                r#"{"timestamp":1,"latency_ms":"1s","output_tokens":1,"request":{"model":"m","messages":[{"role":"user","content":"x"}]}}"#,
                "\"latency_ms\" must be a number of milliseconds, got \"1s\"",
            ),
            (
                r#"{"timestamp":1,"session_id":[1],"output_tokens":1,"request":{"model":"m","messages":[{"role":"user","content":"x"}]}}"#,
                "\"session_id\" must be a string or an integer, got an array",
            ),
        ];
        for (line, message) in log_cases {
            let text = format!("{ok_log}\n\n{line}\n{ok_log}\n");
            let flags = ["--block-size", "4", "--from", "openai-log"];
            assert_eq!(
                convert_text(&text, &flags).map(|_| ()),
                Err(format!("in.jsonl:3: {message}")),
                "{line}"
            );
        }
        let bytes = [ok_log.as_bytes(), b"\n{\"timestamp\xff\n"].concat();
        let err = convert_bytes(&bytes, "in.jsonl", &args(&["--block-size", "4"]))
            .expect_err("invalid UTF-8");
        assert_eq!(
            err.to_string(),
            "in.jsonl:2: not UTF-8 text (invalid byte at column 12)"
        );

        let record = |fields: &str| {
            format!(
                r#"{{"user_id":0,"turn":0,"ttft_us":1,"total_latency_us":5,"success":true{fields}}}"#
            )
        };
        let blocks = r#","start_us":0,"prompt_blocks":{"tokens":20,"block_size":16,"hashes":[1]}"#;
        let first = record(blocks).replace(r#""user_id":0"#, r#""user_id":9"#);
        let record_cases: &[(String, &str)] = &[
            (
                r#"{"user_id":0}"#.to_string(),
                "not a loadgen multiturn record: missing field `turn` (column 13)",
            ),
            (
                record(r#","start_us":0"#),
                "the record has no \"prompt_blocks\": the run had no tokenizer (with --url, give \
                 multiturn --tokenizer)",
            ),
            (
                record(r#","prompt_blocks":{"tokens":20,"block_size":16,"hashes":[1]}"#),
                "the record has no \"start_us\" (written by a loadgen before `trace convert`)",
            ),
            (
                record(
                    r#","start_us":0,"prompt_blocks":{"tokens":40,"block_size":16,"hashes":[1]}"#,
                ),
                "\"prompt_blocks\" is inconsistent: 1 hashes for 40 tokens in blocks of 16",
            ),
            (
                first.clone(),
                "user 9 turn 0 again (first on line 1): records of one run only",
            ),
        ];
        for (line, message) in record_cases {
            let text = format!("{first}\n\n{line}\n");
            assert_eq!(
                convert_text(&text, &["--block-size", "16", "--from", "records"]).map(|_| ()),
                Err(format!("in.jsonl:3: {message}")),
                "{line}"
            );
        }
        // No output token: written as 1, and counted.
        let text = ok_log.replace(r#""output_tokens":1"#, r#""output_tokens":0"#);
        let s = convert_text(&text, &["--block-size", "4"]).expect("converts");
        assert_eq!(s.converted.empty_outputs, 1);
        assert!(s.converted.text.contains(r#""output_length":1,"#));
        let text = ok_log.replace(r#""output_tokens":1"#, r#""output_tokens":1073741825"#);
        assert_eq!(
            convert_text(&text, &["--block-size", "4"]).map(|_| ()),
            Err(
                "in.jsonl:1: 1073741825 output tokens, more than the 1073741824 a trace row may \
                 hold"
                    .into()
            )
        );
        // A block size the records' 16-token hashes cannot name.
        assert_eq!(
            convert_text(RECORDS, &["--block-size", "24"]).map(|_| ()),
            Err(
                "in.jsonl:1: the prompt is hashed in blocks of 16 tokens: --block-size 24 is \
                 not a multiple of it"
                    .to_string()
            )
        );
        assert_eq!(
            convert_text(r#"{"hello":1}"#, &["--block-size", "16"]).map(|_| ()),
            Err(
                "in.jsonl:1: cannot tell the input format: neither an OpenAI log line (a \
                 \"request\" object) nor a loadgen multiturn record (\"user_id\" and \
                 \"turn\"); name it with --from"
                    .to_string()
            )
        );
    }

    /// A `--shard` run's records count from their shard's run start (`merge.run_start_unix_us`),
    /// so shards started apart keep their real offsets; sharded and unsharded records do not
    /// mix.
    #[test]
    fn sharded_records_are_aligned_by_their_run_start() {
        let rec = |user: u32, start_us: u64, run_start: Option<u64>| {
            let merge = run_start.map_or(String::new(), |t| {
                format!(r#","merge":{{"run_start_unix_us":{t}}}"#)
            });
            format!(
                r#"{{"user_id":{user},"turn":0,"ttft_us":1,"total_latency_us":5,"success":true,"output_tokens":2,"start_us":{start_us},"prompt_blocks":{{"tokens":16,"block_size":16,"hashes":[{user}]}}{merge}}}"#
            )
        };
        let text = format!(
            "{}\n{}\n",
            rec(0, 1_000, Some(5_000_000)),
            rec(1, 0, Some(2_000_000))
        );
        let s = convert_text(&text, &["--block-size", "16"]).expect("converts");
        assert_eq!(
            s.converted.text,
            concat!(
                r#"{"request_id":"user-1-turn-0","session_id":"user-1","timestamp":0.0,"input_length":16,"output_length":2,"hash_ids":[0]}"#,
                "\n",
                r#"{"request_id":"user-0-turn-0","session_id":"user-0","timestamp":3001.0,"input_length":16,"output_length":2,"hash_ids":[1]}"#,
                "\n",
            )
        );
        let mixed = format!("{}\n{}\n", rec(0, 0, Some(1)), rec(1, 0, None));
        assert_eq!(
            convert_text(&mixed, &["--block-size", "16"]).map(|_| ()),
            Err(
                "in.jsonl:2: sharded and unsharded records mixed: convert one run's records".into()
            )
        );
    }

    /// Nothing to convert is an error: no lines, blank lines, only failed records.
    #[test]
    fn empty_inputs_are_errors() {
        for text in ["", "\n  \n"] {
            for from in [&[][..], &["--from", "records"], &["--from", "openai-log"]] {
                let mut flags = vec!["--block-size", "16"];
                flags.extend_from_slice(from);
                assert_eq!(
                    convert_text(text, &flags).map(|_| ()),
                    Err("in.jsonl: no requests to convert (the file is empty or blank)".into()),
                    "{text:?} {from:?}"
                );
            }
        }
        let failed = r#"{"user_id":1,"turn":1,"ttft_us":0,"total_latency_us":9,"success":false}"#;
        assert_eq!(
            convert_text(failed, &["--block-size", "16"]).map(|_| ()),
            Err("in.jsonl: no requests to convert (all 1 recorded requests failed)".into())
        );
        assert!(args(&["--block-size", "0"]).check().is_err());
    }
}
