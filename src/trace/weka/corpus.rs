//! Reading weka files and corpus directories: the plays of every file, in order, each with the
//! line it starts on and the key of its ids, read once and lowered ([`super::lower_play`]) once
//! every file is read, since the basis of sub-agents' inner times is one for the whole corpus.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::super::graph::{build, HashScope, RequestGraph, TraceFormat};
use super::super::lines::{read_whole, MAX_TRACE_FILE_BYTES};
use super::super::TraceError;
use super::{lower_play, read_play, Corpus, WekaPlay};

/// Reads a weka file (JSON or JSONL: any sequence of top-level plays or arrays of plays), of
/// at most [`MAX_TRACE_FILE_BYTES`].
pub(in crate::trace) fn parse(
    reader: impl BufRead,
    source_name: &str,
) -> Result<RequestGraph, TraceError> {
    let text = read_text(reader, source_name)?;
    let name = Path::new(source_name)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(source_name);
    let mut lowering = Lowering::default();
    lowering.file(&text, name, source_name)?;
    lowering.finish(source_name)
}

/// Reads a weka corpus directory: every `.json` and `.jsonl` file below it (other files are
/// left out), in the order of their paths relative to it, which also key their plays' ids;
/// each file at most [`MAX_TRACE_FILE_BYTES`].
pub(in crate::trace) fn parse_corpus(dir: &Path) -> Result<RequestGraph, TraceError> {
    let mut files = Vec::new();
    corpus_files(dir, "", &mut files)?;
    files.sort();
    let mut lowering = Lowering::default();
    for (name, path) in &files {
        let source_name = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.clone(),
            source,
        })?;
        let text = read_text(file, &source_name)?;
        lowering.file(&text, name, &source_name)?;
    }
    lowering.finish(&dir.display().to_string())
}

/// The whole text of a weka file, at most [`MAX_TRACE_FILE_BYTES`].
fn read_text(reader: impl std::io::Read, source_name: &str) -> Result<String, TraceError> {
    let bytes = read_whole(reader, MAX_TRACE_FILE_BYTES).map_err(|e| e.in_trace(source_name))?;
    String::from_utf8(bytes).map_err(|e| {
        let before = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |p| p + 1);
        TraceError::Line {
            source_name: source_name.to_string(),
            line: 1 + before.iter().filter(|&&b| b == b'\n').count(),
            message: format!(
                "not UTF-8 text (invalid byte at column {})",
                before.len() - line_start + 1
            ),
        }
    })
}

/// The weka files below `dir` as (path relative to the corpus, with `/`, and path), where
/// `prefix` is `dir`'s own relative path. Symbolic links are refused, as they could loop.
fn corpus_files(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), TraceError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TraceError::Io { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let path = entry.path();
        let refused = |why: &str| TraceError::Directory {
            path: dir.to_path_buf(),
            message: format!("{} {why}", path.display()),
        };
        let Ok(name) = entry.file_name().into_string() else {
            return Err(refused("has a name that is not UTF-8"));
        };
        let kind = entry.file_type().map_err(io(&path))?;
        let relative = match prefix {
            "" => name,
            _ => format!("{prefix}/{name}"),
        };
        if kind.is_symlink() {
            return Err(refused(
                "is a symbolic link, which a weka corpus may not hold",
            ));
        } else if kind.is_dir() {
            corpus_files(&path, &relative, out)?;
        } else if relative.ends_with(".json") || relative.ends_with(".jsonl") {
            out.push((relative, path));
        }
    }
    Ok(())
}

/// The plays of a corpus as read, lowered together once every file is read (the basis of
/// inner times is one for the whole corpus): each play is parsed once, as its file is read, and
/// kept typed (not as JSON values, not as text) until every file is read.
#[derive(Default)]
struct Lowering {
    plays: Vec<ReadPlay>,
    /// The names that label each file's errors.
    source_names: Vec<String>,
    /// Some play leaving the basis to the corpus has a sub-agent request that starts before its
    /// marker: then every such play's inner times are relative.
    relative_inner_times: bool,
    /// Bytes looked at to count newlines, over every file: each byte once.
    #[cfg(test)]
    newline_scan_bytes: usize,
}

/// A play as read: the play (or why it is not one, reported when it is lowered, in order), the
/// line it starts on, the key of its ids and its file.
struct ReadPlay {
    play: Result<WekaPlay, String>,
    line: usize,
    key: String,
    file: usize,
}

impl Lowering {
    /// Reads one file's plays; `name` keys their ids (the file's name, or its path in a corpus)
    /// and `source_name` labels errors. A value that is not JSON is an error of its line at
    /// once. Lines are counted as the values are read, each newline once.
    fn file(&mut self, text: &str, name: &str, source_name: &str) -> Result<(), TraceError> {
        let file = self.source_names.len();
        self.source_names.push(source_name.to_string());
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let one_play_file = name.ends_with(".json");
        let mut in_file = 0;
        // Newlines before `counted` are in `line` already.
        let (mut counted, mut line) = (0, 1);
        loop {
            let offset = stream.byte_offset();
            let rest = &text[offset..];
            let start = offset + rest.len() - rest.trim_start().len();
            line += text.as_bytes()[counted..start]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            #[cfg(test)]
            {
                self.newline_scan_bytes += start - counted;
            }
            counted = start;
            let value = match stream.next() {
                None => return Ok(()),
                Some(Ok(value)) => value,
                Some(Err(e)) => {
                    return Err(TraceError::Line {
                        source_name: source_name.to_string(),
                        line: e.line(),
                        message: format!("invalid JSON: {e}").replace(
                            &format!(" at line {} column {}", e.line(), e.column()),
                            &format!(" (column {})", e.column()),
                        ),
                    })
                }
            };
            let values = match value {
                serde_json::Value::Array(values) => values,
                other => vec![other],
            };
            for value in values {
                let key = if one_play_file && in_file == 0 {
                    name.to_string()
                } else {
                    format!("{name}#{in_file:06}")
                };
                let play = read_play(value);
                if let Ok(play) = &play {
                    self.relative_inner_times |= inner_time_before_marker(play);
                }
                self.plays.push(ReadPlay {
                    play,
                    line,
                    key,
                    file,
                });
                in_file += 1;
            }
        }
    }

    /// The graph of every play, which with lanes queue in the order they were read.
    fn finish(self, source_name: &str) -> Result<RequestGraph, TraceError> {
        let mut corpus = Corpus {
            relative_inner_times: self.relative_inner_times,
            ..Corpus::default()
        };
        let mut hashes = HashScope::default();
        let mut nodes = Vec::new();
        for (index, read) in self.plays.into_iter().enumerate() {
            let line = read.line;
            let lowered = read
                .play
                .and_then(|play| lower_play(play, line, index, &read.key, &mut corpus, &mut hashes))
                .map_err(|message| TraceError::Line {
                    source_name: self.source_names[read.file].clone(),
                    line,
                    message,
                })?;
            nodes.push(lowered);
        }
        let mut graph = build(
            nodes.into_iter().flatten().collect(),
            source_name,
            TraceFormat::Weka,
            corpus.block_size.unwrap_or(1),
            None,
        )?;
        for (i, play) in graph.plays.iter_mut().enumerate() {
            play.ordinal = Some(i as u64);
        }
        Ok(graph)
    }
}

/// Whether a play, as written and leaving its basis to the corpus, has a sub-agent request
/// that starts before its marker: then every such play's inner times are relative.
fn inner_time_before_marker(play: &WekaPlay) -> bool {
    let basis = play
        .source
        .as_ref()
        .and_then(|s| s.nested_timestamp_basis.as_deref());
    if basis.is_some_and(|b| b != "auto") {
        return false;
    }
    play.requests
        .iter()
        .flatten()
        .filter(|e| e.kind.as_deref() == Some("subagent"))
        .any(|marker| {
            let Some(t) = marker.t else {
                return false;
            };
            marker
                .requests
                .iter()
                .flatten()
                .any(|r| r.t.is_some_and(|rt| rt < t))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reading a file is linear (issue 43: 40k one-request plays took 31.8 s, newlines were
    /// counted from the file's start for each play): each byte is looked at once to count
    /// lines, each play is parsed once (kept typed for lowering), and every play still knows its
    /// line.
    #[test]
    fn a_file_is_read_in_one_pass_and_every_play_knows_its_line() {
        let play = |i: usize| {
            format!(
                r#"{{"id":"p{i}","block_size":64,"hash_id_scope":"local","requests":[{{"type":"n","t":0,"model":"M","in":64,"out":1}}]}}"#
            )
        };
        let mut text = String::new();
        for i in 0..3_000 {
            text.push_str(&play(i));
            text.push_str(if i % 2 == 0 { "\n" } else { "\n\n" });
        }
        let mut lowering = Lowering::default();
        lowering.file(&text, "w.jsonl", "w.jsonl").expect("reads");
        assert!(lowering.newline_scan_bytes <= text.len());
        assert_eq!(lowering.plays.len(), 3_000);
        let lines: Vec<usize> = lowering.plays.iter().map(|p| p.line).collect();
        assert_eq!(lines[..5], [1, 2, 4, 5, 7]);
        assert_eq!(lines[2_999], 4_499);
        assert!(lowering.plays.iter().all(|p| p.play.is_ok()));
        let g = lowering.finish("w.jsonl").expect("lowers");
        assert_eq!(g.nodes.len(), 3_000);
        let bad = format!("{text}{}\n", play(3_000).replace("\"in\":64", "\"in\":0"));
        let e = parse(bad.as_bytes(), "w.jsonl").expect_err("in: 0");
        assert!(
            e.to_string().starts_with("w.jsonl:4501: requests[0]"),
            "{e}"
        );
    }
}
