//! Reading weka files and corpus directories: the plays of every file, in order, each with the
//! key of its ids, lowered together once all are read ([`super::lower_play`]), since the basis
//! of sub-agents' inner times is one for the whole corpus.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::super::graph::{build, HashScope, RequestGraph, TraceFormat};
use super::super::TraceError;
use super::{lower_play, Corpus};

/// Reads a weka file (JSON or JSONL: any sequence of top-level plays or arrays of plays).
pub(in crate::trace) fn parse(
    mut reader: impl BufRead,
    source_name: &str,
) -> Result<RequestGraph, TraceError> {
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|source| TraceError::Io {
            path: PathBuf::from(source_name),
            source,
        })?;
    let name = Path::new(source_name)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(source_name);
    let mut lowering = Lowering::default();
    lowering.file(&text, name, source_name)?;
    lowering.finish(source_name)
}

/// Reads a weka corpus directory: every `.json` and `.jsonl` file below it (other files are
/// left out), in the order of their paths relative to it, which also key their plays' ids.
pub(in crate::trace) fn parse_corpus(dir: &Path) -> Result<RequestGraph, TraceError> {
    let mut files = Vec::new();
    corpus_files(dir, "", &mut files)?;
    files.sort();
    let mut lowering = Lowering::default();
    for (name, path) in &files {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.clone(),
            source,
        })?;
        lowering.file(&text, name, &path.display().to_string())?;
    }
    lowering.finish(&dir.display().to_string())
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
/// inner times is one for the whole corpus).
#[derive(Default)]
struct Lowering {
    plays: Vec<ReadPlay>,
}

/// A play as read: its JSON, the line it starts on, the key of its ids and its file's name.
struct ReadPlay {
    value: serde_json::Value,
    line: usize,
    key: String,
    source_name: String,
}

impl Lowering {
    /// Reads the plays of one file; `name` keys their ids (the file's name, or its path in a
    /// corpus) and `source_name` labels errors.
    fn file(&mut self, text: &str, name: &str, source_name: &str) -> Result<(), TraceError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let one_play_file = name.ends_with(".json");
        let mut in_file = 0;
        loop {
            let offset = stream.byte_offset();
            let start = offset + text[offset..].len() - text[offset..].trim_start().len();
            let line = 1 + text[..start].matches('\n').count();
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
                self.plays.push(ReadPlay {
                    value,
                    line,
                    key,
                    source_name: source_name.to_string(),
                });
                in_file += 1;
            }
        }
    }

    /// The graph of every play read, which with lanes queue in the order they were read.
    fn finish(self, source_name: &str) -> Result<RequestGraph, TraceError> {
        let mut corpus = Corpus {
            relative_inner_times: self
                .plays
                .iter()
                .any(|p| inner_time_before_marker(&p.value)),
            ..Corpus::default()
        };
        let mut hashes = HashScope::default();
        let mut nodes = Vec::new();
        for (index, play) in self.plays.into_iter().enumerate() {
            let lowered = lower_play(
                play.value,
                play.line,
                index,
                &play.key,
                &mut corpus,
                &mut hashes,
            )
            .map_err(|message| TraceError::Line {
                source_name: play.source_name,
                line: play.line,
                message,
            })?;
            nodes.extend(lowered);
        }
        let mut graph = build(
            nodes,
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
fn inner_time_before_marker(play: &serde_json::Value) -> bool {
    use serde_json::Value;
    let basis = play
        .pointer("/source/nested_timestamp_basis")
        .and_then(Value::as_str);
    if basis.is_some_and(|b| b != "auto") {
        return false;
    }
    let Some(entries) = play.get("requests").and_then(Value::as_array) else {
        return false;
    };
    entries
        .iter()
        .filter(|e| e.get("type").and_then(Value::as_str) == Some("subagent"))
        .any(|marker| {
            let Some(t) = marker.get("t").and_then(Value::as_f64) else {
                return false;
            };
            marker
                .get("requests")
                .and_then(Value::as_array)
                .is_some_and(|inner| {
                    inner
                        .iter()
                        .any(|r| r.get("t").and_then(Value::as_f64).is_some_and(|rt| rt < t))
                })
        })
}
