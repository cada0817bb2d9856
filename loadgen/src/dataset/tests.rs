use super::*;
use mock_server::test_kit::TempDir;
use servesim::tokenizer::BuiltinTokenizer;

/// The repository's fixtures folder.
fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/datasets")
        .join(name)
}

/// A temporary folder of the test's own, removed when the test ends (failed or not).
fn temp() -> TempDir {
    TempDir::new("loadgen-dataset").expect("a temporary folder")
}

/// Writes `text` to the file `name` in `dir`.
fn file(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

fn spec(format: DatasetFormat, path: &Path) -> DatasetSpec {
    DatasetSpec {
        format,
        path: path.to_path_buf(),
    }
}

fn load(format: DatasetFormat, path: &Path, bounds: (usize, usize)) -> Result<Dataset, String> {
    read(&spec(format, path), &BuiltinTokenizer::new(), bounds, None).map_err(|e| e.to_string())
}

fn all() -> (usize, usize) {
    (0, limits::MAX_PROMPT_TOKENS)
}

fn turn_texts(c: &Conversation) -> Vec<(&str, Option<&str>, Option<usize>)> {
    c.turns
        .iter()
        .map(|t| (t.user.as_str(), t.reply.as_deref(), t.output_tokens))
        .collect()
}

#[test]
fn specs_parse_and_print_back() {
    let s: DatasetSpec = "sharegpt:a/b.json".parse().expect("valid");
    assert_eq!(
        (s.format, s.path.as_path()),
        (DatasetFormat::ShareGpt, Path::new("a/b.json"))
    );
    assert_eq!(s.to_string(), "sharegpt:a/b.json");
    let s: DatasetSpec = "jsonl:C:/x.jsonl".parse().expect("a colon in the path");
    assert_eq!(s.path, Path::new("C:/x.jsonl"));
    for (bad, says) in [
        ("a.json", "expected sharegpt:PATH or jsonl:PATH"),
        ("csv:a.csv", "unknown dataset format \"csv\""),
        ("jsonl:", "needs a file path"),
    ] {
        let e = bad.parse::<DatasetSpec>().expect_err(bad);
        assert!(e.contains(says), "{bad}: {e}");
    }
}

/// Every conversation shape of the ShareGPT fixture: system messages, both role spellings, a
/// leading reply skipped, an unanswered last turn.
#[test]
fn sharegpt_fixture_conversations_become_turns() {
    let cs = sharegpt::read(&fixture("sharegpt_small.json"), MAX_DATASET_FILE_BYTES)
        .expect("the fixture reads");
    assert_eq!(cs.len(), 6);
    assert_eq!(cs[0].origin, Origin::Conversation(0));
    assert_eq!(cs[0].turns.len(), 1);
    assert!(cs[0].turns[0].reply.is_some());
    assert_eq!(
        cs[1].system.as_deref(),
        Some("You are a terse assistant for operators of model servers.")
    );
    assert_eq!(
        turn_texts(&cs[1])[2],
        (
            "Give me one metric to watch.",
            Some("The number of waiting requests."),
            None
        )
    );
    assert_eq!(cs[1].turns.len(), 3);
    assert_eq!(cs[2].turns.len(), 2, "user/assistant roles");
    assert_eq!(
        turn_texts(&cs[4]),
        [
            (
                "List three causes of preemption in a paged KV pool.",
                cs[4].turns[0].reply.as_deref(),
                None
            ),
            ("Thanks.", None, None)
        ]
    );
    assert!(cs[4].turns[0].reply.is_some());
    // Counted: the reply's tokens are the output length; an unanswered turn has none.
    let d = load(
        DatasetFormat::ShareGpt,
        &fixture("sharegpt_small.json"),
        all(),
    )
    .expect("loads");
    let tok = BuiltinTokenizer::new();
    assert_eq!((d.len(), d.read), (6, 6));
    let first = &d.conversation(1).turns[2];
    assert_eq!(
        first.input_tokens,
        tok.encode("Give me one metric to watch.").len()
    );
    assert_eq!(
        first.output_tokens,
        Some(tok.encode("The number of waiting requests.").len())
    );
    assert_eq!(d.conversation(4).turns[1].output_tokens, None);
}

/// Every JSONL shape of the fixture, and the output lengths its lines give.
#[test]
fn jsonl_fixture_lines_become_conversations() {
    let tmp = temp();
    let cs = jsonl::read(
        &fixture("prompts.jsonl"),
        MAX_DATASET_LINE_BYTES,
        MAX_DATASET_FILE_BYTES,
    )
    .expect("the fixture reads");
    assert_eq!(cs.len(), 6, "the blank line is skipped");
    let origins: Vec<Origin> = cs.iter().map(|c| c.origin).collect();
    assert_eq!(
        origins,
        [1, 2, 3, 4, 5, 7].map(Origin::Line),
        "line numbers count the blank line"
    );
    assert_eq!(
        turn_texts(&cs[0]),
        [("Explain speculative decoding in one paragraph.", None, None)]
    );
    assert_eq!(cs[1].turns[0].output_tokens, Some(40));
    assert_eq!(cs[2].turns[0].output_tokens, Some(24), "max_tokens");
    assert_eq!(cs[3].turns[0].output_tokens, Some(30));
    assert_eq!(cs[3].system.as_deref(), Some("You answer in one sentence."));
    assert_eq!(cs[4].turns.len(), 2);
    assert_eq!(cs[4].turns[1].user, "And pipeline parallelism?");
    assert_eq!(
        cs[5].turns[0].reply.as_deref(),
        Some("Their prefill takes longer.")
    );
    // A byte order mark before the first line is skipped.
    let path = file(&tmp, "bom.jsonl", "\u{feff}\"hi there\"\n");
    let cs = jsonl::read(&path, 100, 100).expect("reads");
    assert_eq!(cs[0].turns[0].user, "hi there");
}

/// Each malformed line names its file and line, and repeats at most a cut of its text.
#[test]
fn jsonl_errors_name_the_line() {
    let tmp = temp();
    let long = "x".repeat(5000);
    for (line, says) in [
        ("{not json", "key must be a string"),
        ("42", "expected a string, an object with \"prompt\""),
        (
            "{\"model\": \"m\"}",
            "an object line needs \"prompt\" or \"messages\"",
        ),
        ("{\"prompt\": [1, 2]}", "\"prompt\" must be a string"),
        (
            "{\"prompt\": \"a\", \"messages\": []}",
            "both \"prompt\" and \"messages\"",
        ),
        ("{\"messages\": \"hi\"}", "\"messages\" must be a list"),
        (
            "{\"prompt\": \"a\", \"output_tokens\": 0}",
            "\"output_tokens\" must be an integer from 1 to 4194304, got 0",
        ),
        (
            "{\"prompt\": \"a\", \"max_tokens\": 1e30}",
            "\"max_tokens\" must be an integer",
        ),
        (
            "[{\"role\": \"tool\", \"content\": \"x\"}]",
            "message 0: \"role\" is \"tool\"",
        ),
        ("[\"hi\"]", "message 0: expected an object"),
        (
            "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]",
            "only text is sent",
        ),
        (
            "[{\"role\": \"user\", \"content\": 3}]",
            "\"content\" must be a string",
        ),
    ] {
        let path = file(
            &tmp,
            "bad.jsonl",
            &format!("\"fine\"\n\n{line}\n\"fine\"\n"),
        );
        let e = jsonl::read(&path, 1 << 20, 1 << 20).expect_err(line);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!("{}:3: ", path.display())),
            "{line}: {text}"
        );
        assert!(text.contains(says), "{line}: {text}");
    }
    let path = file(
        &tmp,
        "long.jsonl",
        &format!("[{{\"role\": \"{long}\", \"content\": \"x\"}}]\n"),
    );
    let text = jsonl::read(&path, 1 << 20, 1 << 20)
        .expect_err("bad role")
        .to_string();
    assert!(text.len() < 400 && text.contains("(5000 bytes)"), "{text}");
}

/// The caps: a line or a file past its cap is refused, naming the line and the cap's constant.
#[test]
fn caps_are_named() {
    let tmp = temp();
    let path = file(&tmp, "cap.jsonl", "\"abc\"\n\"abcdef\"\n");
    let e = jsonl::read(&path, 5, 100).expect_err("line 2 is 8 bytes");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: line 2 passes the 5-byte cap (MAX_DATASET_LINE_BYTES)",
            path.display()
        )
    );
    let e = jsonl::read(&path, 100, 10).expect_err("15 bytes");
    assert!(e.to_string().contains("MAX_DATASET_FILE_BYTES"), "{e}");
    let path = file(&tmp, "cap.json", "[]   ");
    let e = sharegpt::read(&path, 4).expect_err("5 bytes");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: the file passes the 4-byte cap (MAX_DATASET_FILE_BYTES)",
            path.display()
        )
    );
    assert_eq!(sharegpt::read(&path, 5).expect("fits").len(), 0);
    // A regular file past MAX_DATASET_FILE_BYTES (sparse: nothing is written) is refused by
    // its size, before a byte is parsed.
    let big = file(&tmp, "big.json", "");
    std::fs::File::options()
        .write(true)
        .open(&big)
        .and_then(|f| f.set_len(MAX_DATASET_FILE_BYTES + 1))
        .expect("a sparse file");
    let e = load(DatasetFormat::ShareGpt, &big, all()).expect_err("too big");
    assert_eq!(
        e,
        format!(
            "{}: the file passes the 1073741824-byte cap (MAX_DATASET_FILE_BYTES)",
            big.display()
        )
    );
}

/// ShareGPT errors: the JSON's line and column, or the conversation's index and id.
#[test]
fn sharegpt_errors_name_the_place() {
    let tmp = temp();
    for (text, says) in [
        (
            "[\n  {\"conversations\": [\n    {\"from\": \"human\"}\n  ]}\n]",
            ":3:21: not a ShareGPT array of conversations: missing field `value`",
        ),
        ("{\"conversations\": []}", ":1:1: not a ShareGPT array"),
        ("[{\"id\": 1}]", ":1:10: not a ShareGPT array of conversations: missing field `conversations`"),
        (
            "[{\"conversations\": []}, {\"id\": \"abc\", \"conversations\": [{\"from\": \"robot\", \"value\": \"x\"}]}]",
            ": conversation 1 (id abc): message 0: \"from\" is \"robot\"",
        ),
        (
            "[{\"id\": 7, \"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}, {\"from\": \"\", \"value\": \"x\"}]}]",
            ": conversation 0 (id 7): message 1",
        ),
    ] {
        let path = file(&tmp, "bad.json", text);
        let e = sharegpt::read(&path, 1 << 20).expect_err(text).to_string();
        assert_eq!(
            e.strip_prefix(&path.display().to_string())
                .map(|rest| rest.starts_with(says)),
            Some(true),
            "{text}: {e}"
        );
    }
    let huge = format!("[{{\"conversations\": \"{}\"}}]", "y".repeat(10_000));
    let path = file(&tmp, "huge.json", &huge);
    let e = sharegpt::read(&path, 1 << 20)
        .expect_err("a string")
        .to_string();
    assert!(e.len() < 500, "{e}");
}

/// Conversations outside the bounds are dropped; nothing left is an error saying why.
#[test]
fn filtering_keeps_the_bounds_and_an_empty_result_is_an_error() {
    let tmp = temp();
    let path = file(
        &tmp,
        "lengths.jsonl",
        "\"one\"\n\"one two three\"\n[{\"role\": \"system\", \"content\": \"s\"}]\n\
         [{\"role\": \"user\", \"content\": \"a b\"}, {\"role\": \"user\", \"content\": \"a b c d e f\"}]\n",
    );
    let d = load(DatasetFormat::Jsonl, &path, (2, 5)).expect("one kept");
    assert_eq!((d.len(), d.read), (1, 4));
    assert_eq!(d.conversation(0).turns[0].text, "one two three");
    let e = load(DatasetFormat::Jsonl, &path, (4, 5)).expect_err("none kept");
    assert_eq!(
        e,
        format!(
            "{}: no conversation left to send: 4 read, 1 without a user message, 3 with a user \
             message below --dataset-min-input-tokens 4, 0 with one above \
             --dataset-max-input-tokens 5",
            path.display()
        )
    );
    let empty = file(&tmp, "empty.jsonl", "\n\n");
    let e = load(DatasetFormat::Jsonl, &empty, all()).expect_err("empty");
    assert!(e.contains("0 read"), "{e}");
}

/// The same seed takes the same order; another seed another order of the same conversations.
#[test]
fn sampling_is_seeded() {
    let d = Arc::new(
        load(
            DatasetFormat::ShareGpt,
            &fixture("sharegpt_small.json"),
            all(),
        )
        .expect("loads"),
    );
    let a = d.order(42);
    assert_eq!(a, d.order(42));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..6).collect::<Vec<_>>(), "a permutation");
    assert!(
        (0..20u64).any(|s| d.order(s) != a),
        "some other seed orders differently"
    );
    assert_ne!(d.order(1), d.order(2));
    // Request k takes order[k % n]: the run goes round the dataset again.
    let picks = Picks::new(&d, 42);
    for (k, &i) in a.iter().enumerate() {
        assert_eq!(picks.get(k), picks.get(k + 6));
        assert_eq!(picks.get(k), d.conversation(i));
    }
}

/// `--dataset-output-tokens` wins over the data, the data over the mode's flag.
#[test]
fn output_lengths_take_the_override_then_the_data_then_the_flag() {
    let tmp = temp();
    let path = file(
        &tmp,
        "out.jsonl",
        "{\"prompt\": \"a\", \"output_tokens\": 7}\n\"b\"\n",
    );
    let tok = BuiltinTokenizer::new();
    let d = read(&spec(DatasetFormat::Jsonl, &path), &tok, all(), None).expect("loads");
    let (with, without) = (&d.conversation(0).turns[0], &d.conversation(1).turns[0]);
    assert_eq!(
        (d.output_tokens(with, 99), d.output_tokens(without, 99)),
        (7, 99)
    );
    let d = read(&spec(DatasetFormat::Jsonl, &path), &tok, all(), Some(3)).expect("loads");
    let (with, without) = (&d.conversation(0).turns[0], &d.conversation(1).turns[0]);
    assert_eq!(
        (d.output_tokens(with, 99), d.output_tokens(without, 99)),
        (3, 3)
    );
}
