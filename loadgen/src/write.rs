//! The one writer of every file loadgen leaves behind (report JSON, per-request JSONL, HTML,
//! SVG, profiles, converted traces): an I/O or serialisation error comes back as a
//! [`LoadgenError`] naming the file, never as an empty report written in its place.

use std::io::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::error::LoadgenError;

/// Writes `value` as pretty JSON and a final newline. Nothing is written when it cannot be
/// serialised.
pub(crate) fn json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), LoadgenError> {
    let mut text = serde_json::to_vec_pretty(value).map_err(serialize(path))?;
    text.push(b'\n');
    bytes(path, text)
}

/// Writes one compact JSON object a line, through a buffer. A row that cannot be serialised
/// stops the write with an error naming the file and the line.
pub(crate) fn jsonl<T: Serialize>(
    path: &Path,
    rows: impl IntoIterator<Item = T>,
) -> Result<(), LoadgenError> {
    let file = std::fs::File::create(path).map_err(io(path))?;
    let mut w = std::io::BufWriter::new(file);
    for (i, row) in rows.into_iter().enumerate() {
        serde_json::to_writer(&mut w, &row).map_err(|e| {
            if e.is_io() {
                io(path)(std::io::Error::other(e))
            } else {
                LoadgenError::Serialize {
                    path: path.to_path_buf(),
                    what: format!("line {}", i + 1),
                    source: e,
                }
            }
        })?;
        w.write_all(b"\n").map_err(io(path))?;
    }
    w.flush().map_err(io(path))
}

/// Writes `bytes` as they are (a page, a chart, a trace).
pub(crate) fn bytes(path: &Path, bytes: impl AsRef<[u8]>) -> Result<(), LoadgenError> {
    std::fs::write(path, bytes).map_err(io(path))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LoadgenError + '_ {
    move |source| LoadgenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn serialize(path: &Path) -> impl Fn(serde_json::Error) -> LoadgenError + '_ {
    move |source| LoadgenError::Serialize {
        path: path.to_path_buf(),
        what: "the report".into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use mock_server::test_kit::TempDir;

    use super::*;

    fn dir(name: &str) -> TempDir {
        TempDir::new(&format!("loadgen-write-{name}")).expect("a temporary folder")
    }

    #[test]
    fn json_is_pretty_with_a_final_newline_and_jsonl_one_row_a_line() {
        let d = dir("ok");
        let path = d.join("r.json");
        json(&path, &serde_json::json!({"a": 1, "b": [2]})).expect("written");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\n  \"a\": 1,\n  \"b\": [\n    2\n  ]\n}\n"
        );
        let lines = d.join("r.jsonl");
        jsonl(
            &lines,
            [serde_json::json!({"x": 1}), serde_json::json!({"x": 2})],
        )
        .expect("ok");
        assert_eq!(
            std::fs::read_to_string(&lines).expect("read"),
            "{\"x\":1}\n{\"x\":2}\n"
        );
    }

    #[test]
    fn a_value_that_cannot_be_serialised_is_an_error_naming_the_file() {
        let d = dir("bad");
        // JSON object keys must be strings: a map keyed by a sequence cannot be written.
        let bad: BTreeMap<Vec<u8>, u8> = [(vec![1], 1)].into_iter().collect();
        let path = d.join("r.json");
        let e = json(&path, &bad).expect_err("not serialisable");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: cannot write the report: key must be a string",
                path.display()
            )
        );
        assert!(!path.exists(), "nothing is written");
        let lines = d.join("r.jsonl");
        let e = jsonl(&lines, [BTreeMap::new(), bad]).expect_err("second row");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: cannot write line 2: key must be a string",
                lines.display()
            )
        );
        let e = bytes(&d.join("missing").join("x.svg"), "<svg/>").expect_err("no folder");
        assert!(matches!(e, LoadgenError::Io { .. }), "{e}");
    }
}
