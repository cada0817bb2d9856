//! Bounded reads of the files loadgen reads back: report JSON (`compare`) and per-request
//! records (`merge`). Nothing is read past a cap: a report file past
//! [`MAX_REPORT_FILE_BYTES`], a record file past [`MAX_RECORD_FILE_BYTES`] or one record line
//! past [`MAX_RECORD_LINE_BYTES`] is refused with the file (and line) and the cap. A stream
//! that is not JSON (`/dev/zero`) fails at its first byte or its first line.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::LoadgenError;

/// Largest report JSON `loadgen compare` reads (1 GiB; a multiturn run of 10^6 requests
/// writes about 300 MB).
pub(crate) const MAX_REPORT_FILE_BYTES: u64 = 1 << 30;

/// Largest per-request JSONL file `loadgen merge` reads (16 GiB).
pub(crate) const MAX_RECORD_FILE_BYTES: u64 = 1 << 34;

/// Longest line of a per-request JSONL file (64 MiB: a record of 2^22 token chunks).
pub(crate) const MAX_RECORD_LINE_BYTES: u64 = 1 << 26;

/// A reader that fails once more than `left` bytes would be read, without reading them.
struct Capped<R> {
    inner: R,
    left: u64,
    hit: bool,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // At the cap: the file must end here.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.hit = true;
                    Err(std::io::Error::other("over the cap"))
                }
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

fn open(path: &Path) -> Result<std::fs::File, LoadgenError> {
    std::fs::File::open(path).map_err(|source| LoadgenError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parses the JSON document in `path`, reading at most [`MAX_REPORT_FILE_BYTES`]. A document
/// that does not parse is [`LoadgenError::BadResults`].
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadgenError> {
    read_json_capped(path, MAX_REPORT_FILE_BYTES, "MAX_REPORT_FILE_BYTES")
}

fn read_json_capped<T: serde::de::DeserializeOwned>(
    path: &Path,
    cap: u64,
    constant: &'static str,
) -> Result<T, LoadgenError> {
    read_json_within(path, cap, constant)?.map_err(|e| LoadgenError::BadResults {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Parses the JSON document in `path`, reading at most `cap` bytes (`constant` names the cap
/// in the error). The outer error is the file's (unreadable, past the cap), the inner one the
/// document's (with its line and column), for the caller to word.
pub(crate) fn read_json_within<T: serde::de::DeserializeOwned>(
    path: &Path,
    cap: u64,
    constant: &'static str,
) -> Result<Result<T, serde_json::Error>, LoadgenError> {
    let mut reader = Capped {
        inner: BufReader::new(open(path)?),
        left: cap,
        hit: false,
    };
    let parsed = serde_json::from_reader(&mut reader);
    match parsed {
        Err(_) if reader.hit => Err(LoadgenError::TooLarge {
            path: path.to_path_buf(),
            what: "the file".into(),
            cap,
            constant,
        }),
        parsed => Ok(parsed),
    }
}

/// The lines of a per-request JSONL file, each at most [`MAX_RECORD_LINE_BYTES`], the file at
/// most [`MAX_RECORD_FILE_BYTES`]; a running hash of the bytes read (to find copies).
pub(crate) struct RecordLines {
    reader: BufReader<std::fs::File>,
    path: PathBuf,
    /// 1-based number of the line last read.
    line: usize,
    /// Bytes read so far.
    bytes: u64,
    hash: xxhash_rust::xxh3::Xxh3,
    /// The caps: a line's bytes (without its newline) and the file's.
    line_cap: u64,
    file_cap: u64,
    /// The caps' constant names, for the errors.
    names: (&'static str, &'static str),
}

impl RecordLines {
    /// Opens `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, LoadgenError> {
        Self::with_caps(path, MAX_RECORD_LINE_BYTES, MAX_RECORD_FILE_BYTES)
    }

    fn with_caps(path: &Path, line_cap: u64, file_cap: u64) -> Result<Self, LoadgenError> {
        Self::with_named_caps(
            path,
            (line_cap, "MAX_RECORD_LINE_BYTES"),
            (file_cap, "MAX_RECORD_FILE_BYTES"),
        )
    }

    /// Opens `path` with other caps than a record file's: (bytes, the constant's name) of a
    /// line and of the file.
    pub(crate) fn with_named_caps(
        path: &Path,
        (line_cap, line_name): (u64, &'static str),
        (file_cap, file_name): (u64, &'static str),
    ) -> Result<Self, LoadgenError> {
        Ok(RecordLines {
            reader: BufReader::new(open(path)?),
            path: path.to_path_buf(),
            line: 0,
            bytes: 0,
            hash: xxhash_rust::xxh3::Xxh3::new(),
            line_cap,
            file_cap,
            names: (line_name, file_name),
        })
    }

    /// Reads the next line into `buf` (without its newline); false at the end of the file.
    pub(crate) fn next(&mut self, buf: &mut Vec<u8>) -> Result<bool, LoadgenError> {
        buf.clear();
        self.line += 1;
        // Never more than one byte past either cap.
        let left = self.file_cap - self.bytes;
        let limit = (self.line_cap + 1).min(left + 1);
        let n = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', buf)
            .map_err(|source| LoadgenError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(false);
        }
        let content = buf.len() - usize::from(buf.ends_with(b"\n"));
        if content as u64 > self.line_cap {
            return Err(LoadgenError::TooLarge {
                path: self.path.clone(),
                what: format!("line {}", self.line),
                cap: self.line_cap,
                constant: self.names.0,
            });
        }
        self.bytes += n as u64;
        if self.bytes > self.file_cap {
            return Err(LoadgenError::TooLarge {
                path: self.path.clone(),
                what: "the file".into(),
                cap: self.file_cap,
                constant: self.names.1,
            });
        }
        self.hash.update(buf);
        buf.truncate(content);
        Ok(true)
    }

    /// The 1-based number of the line last read.
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// The bytes read so far and their hash.
    pub(crate) fn digest(&self) -> (u64, u64) {
        (self.bytes, self.hash.digest())
    }
}

/// Whether two files hold the same bytes (read in blocks, never past `len` + 1 bytes each).
pub(crate) fn same_bytes(a: &Path, b: &Path, len: u64) -> bool {
    let (Ok(fa), Ok(fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else {
        return false;
    };
    let (mut ra, mut rb) = (
        BufReader::new(fa.take(len + 1)),
        BufReader::new(fb.take(len + 1)),
    );
    loop {
        let (Ok(ba), Ok(bb)) = (ra.fill_buf(), rb.fill_buf()) else {
            return false;
        };
        let n = ba.len().min(bb.len());
        if n == 0 {
            return ba.is_empty() && bb.is_empty();
        }
        if ba[..n] != bb[..n] {
            return false;
        }
        ra.consume(n);
        rb.consume(n);
    }
}

#[cfg(test)]
mod tests {
    use mock_server::test_kit::TempDir;

    use super::*;

    #[test]
    fn a_stream_past_the_cap_is_refused_without_reading_it() {
        let dir = TempDir::new("loadgen-capped").expect("a temporary folder");
        let path = dir.join("r.json");
        std::fs::write(&path, "[1, 2, 3]   ").expect("write");
        let v: Vec<u32> = read_json_capped(&path, 12, "C").expect("fits exactly");
        assert_eq!(v, [1, 2, 3]);
        let e = read_json_capped::<Vec<u32>>(&path, 11, "C").expect_err("one byte over");
        assert_eq!(
            e.to_string(),
            format!("{}: the file passes the 11-byte cap (C)", path.display())
        );
        let e = read_json_capped::<Vec<u32>>(&path, 5, "C").expect_err("over");
        assert!(matches!(e, LoadgenError::TooLarge { cap: 5, .. }), "{e}");
    }

    #[test]
    fn record_lines_stop_at_either_cap() {
        let dir = TempDir::new("loadgen-lines").expect("a temporary folder");
        let path = dir.join("r.jsonl");
        std::fs::write(&path, "abcd\nabcde\n").expect("write");
        let mut buf = Vec::new();
        // A line of exactly the cap passes; one byte more is refused, naming its line.
        let mut lines = RecordLines::with_caps(&path, 4, 100).expect("open");
        assert!(lines.next(&mut buf).expect("line 1"));
        assert_eq!(buf, b"abcd");
        let e = lines.next(&mut buf).expect_err("line 2");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: line 2 passes the 4-byte cap (MAX_RECORD_LINE_BYTES)",
                path.display()
            )
        );
        // The whole file (11 bytes) against a 10-byte cap.
        let mut lines = RecordLines::with_caps(&path, 100, 10).expect("open");
        assert!(lines.next(&mut buf).expect("line 1"));
        let e = lines.next(&mut buf).expect_err("past the file cap");
        assert!(matches!(e, LoadgenError::TooLarge { cap: 10, .. }), "{e}");
        let mut lines = RecordLines::with_caps(&path, 100, 11).expect("open");
        while lines.next(&mut buf).expect("fits exactly") {}
        assert_eq!(lines.digest().0, 11);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn dev_zero_fails_at_once() {
        let e = read_json::<serde_json::Value>(Path::new("/dev/zero")).expect_err("not JSON");
        assert!(matches!(e, LoadgenError::BadResults { .. }), "{e}");
        let mut lines = RecordLines::open(Path::new("/dev/zero")).expect("open");
        let e = lines.next(&mut Vec::new()).expect_err("one endless line");
        assert_eq!(
            e.to_string(),
            format!("/dev/zero: line 1 passes the {MAX_RECORD_LINE_BYTES}-byte cap (MAX_RECORD_LINE_BYTES)")
        );
    }
}
