//! Reading weka files and corpus directories: the plays of every file, in order, each with the
//! key of its ids, lowered ([`super::lower_play`]) once every file is read, since the basis of
//! sub-agents' inner times is one for the whole corpus.

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
    lowering.file(text, name, source_name);
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
        lowering.file(text, name, &path.display().to_string());
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

/// The files of a corpus as read, lowered together once every file is read (the basis of
/// inner times is one for the whole corpus): a first pass over their plays finds the basis, a
/// second lowers them, so that only the texts stay in memory, not every play's JSON.
#[derive(Default)]
struct Lowering {
    files: Vec<WekaText>,
}

/// A file's text, the name that keys its plays' ids (its name, or its path in a corpus) and the
/// name that labels its errors.
struct WekaText {
    text: String,
    name: String,
    source_name: String,
}

impl WekaText {
    /// Calls `each` with every play of the file, the line it starts on and the key of its ids.
    fn plays(
        &self,
        mut each: impl FnMut(serde_json::Value, usize, String) -> Result<(), TraceError>,
    ) -> Result<(), TraceError> {
        let text = self.text.strip_prefix('\u{feff}').unwrap_or(&self.text);
        let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
        let one_play_file = self.name.ends_with(".json");
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
                        source_name: self.source_name.clone(),
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
                    self.name.clone()
                } else {
                    format!("{}#{in_file:06}", self.name)
                };
                each(value, line, key)?;
                in_file += 1;
            }
        }
    }
}

impl Lowering {
    /// Adds one file; `name` keys its plays' ids (the file's name, or its path in a corpus) and
    /// `source_name` labels errors.
    fn file(&mut self, text: String, name: &str, source_name: &str) {
        self.files.push(WekaText {
            text,
            name: name.to_string(),
            source_name: source_name.to_string(),
        });
    }

    /// The graph of every play, which with lanes queue in the order they were read.
    fn finish(self, source_name: &str) -> Result<RequestGraph, TraceError> {
        let mut relative_inner_times = false;
        for file in &self.files {
            file.plays(|play, _, _| {
                relative_inner_times |= inner_time_before_marker(&play);
                Ok(())
            })?;
        }
        let mut corpus = Corpus {
            relative_inner_times,
            ..Corpus::default()
        };
        let mut hashes = HashScope::default();
        let mut nodes = Vec::new();
        for file in &self.files {
            file.plays(|play, line, key| {
                let index = nodes.len();
                let lowered = lower_play(play, line, index, &key, &mut corpus, &mut hashes)
                    .map_err(|message| TraceError::Line {
                        source_name: file.source_name.clone(),
                        line,
                        message,
                    })?;
                nodes.push(lowered);
                Ok(())
            })?;
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
