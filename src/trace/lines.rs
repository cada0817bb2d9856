//! Reading trace files within a bound: line by line, no line longer than
//! [`MAX_TRACE_LINE_BYTES`] ([`TraceLines`]), or whole, no file longer than
//! [`MAX_TRACE_FILE_BYTES`] ([`read_whole`]). The bound holds on the bytes as read, so on a
//! `.jsonl.gz` trace's inflated text too: a small file that inflates to one huge line is refused
//! at the cap, not read into memory first. Every trace reader of the engine, and `loadgen trace
//! convert`, reads through these.

use std::io::{BufRead, Read};

/// Most bytes a line of a trace (or of a log `loadgen trace convert` reads) may hold before its
/// newline: 16 MiB. A Mooncake row holds at most [`super::MAX_ROW_TOKENS`] hash ids, about 4 MiB
/// of short ids; a row longer than this is refused with its line, before it is parsed.
pub const MAX_TRACE_LINE_BYTES: usize = 16 << 20;

/// Most bytes a trace read whole may hold (a weka JSON file, a graph read from a stream whose
/// format is detected first, `loadgen trace convert`'s input, the first rows `loadgen replay
/// --max-requests` keeps): 1 GiB, after decompression.
pub const MAX_TRACE_FILE_BYTES: usize = 1 << 30;

/// Why a bounded read stopped.
#[derive(Debug, thiserror::Error)]
pub enum BoundedReadError {
    /// Line `line` (1-based) holds more than `cap` bytes before its newline.
    #[error("the line is longer than {cap} bytes, the most a trace line may hold")]
    LongLine {
        /// 1-based line number.
        line: usize,
        /// The cap, in bytes.
        cap: usize,
    },
    /// The text read whole holds more than `cap` bytes.
    #[error("the file is larger than {cap} bytes, the most a trace read whole may hold")]
    LargeFile {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The reader failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl BoundedReadError {
    /// The error of the trace `source_name` (a file's path as given, or another label).
    pub fn in_trace(self, source_name: &str) -> super::TraceError {
        match self {
            BoundedReadError::LongLine { line, .. } => super::TraceError::Line {
                source_name: source_name.to_string(),
                line,
                message: self.to_string(),
            },
            BoundedReadError::LargeFile { cap } => super::TraceError::TooLarge {
                source_name: source_name.to_string(),
                cap,
            },
            BoundedReadError::Io(source) => super::TraceError::Io {
                path: source_name.into(),
                source,
            },
        }
    }
}

/// The lines of a reader, each at most a cap long, split on `\n` bytes (the newline is not
/// part of the line; a `\r` before it is). One buffer serves every line.
#[derive(Debug)]
pub struct TraceLines<R> {
    reader: R,
    buf: Vec<u8>,
    line: usize,
    cap: usize,
}

impl<R: BufRead> TraceLines<R> {
    /// The lines of `reader`, each at most [`MAX_TRACE_LINE_BYTES`].
    pub fn new(reader: R) -> Self {
        TraceLines::with_cap(reader, MAX_TRACE_LINE_BYTES)
    }

    /// The lines of `reader`, each at most `cap` bytes.
    pub fn with_cap(reader: R, cap: usize) -> Self {
        TraceLines {
            reader,
            buf: Vec::new(),
            line: 0,
            cap,
        }
    }

    /// The next line: its 1-based number and its bytes without the newline; `None` at the end.
    /// A line over the cap is an error naming it; the reader stops there (at most the cap and
    /// one byte of it were read).
    pub fn next_line(&mut self) -> Result<Option<(usize, &[u8])>, BoundedReadError> {
        self.buf.clear();
        let limit = u64::try_from(self.cap)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let read = (&mut self.reader)
            .take(limit)
            .read_until(b'\n', &mut self.buf)?;
        if read == 0 {
            return Ok(None);
        }
        self.line += 1;
        let bytes = match self.buf.strip_suffix(b"\n") {
            Some(bytes) => bytes,
            None if self.buf.len() > self.cap => {
                return Err(BoundedReadError::LongLine {
                    line: self.line,
                    cap: self.cap,
                })
            }
            None => &self.buf,
        };
        Ok(Some((self.line, bytes)))
    }
}

/// Everything `reader` holds, at most `cap` bytes (at most the cap and one byte are read).
pub fn read_whole(reader: impl Read, cap: usize) -> Result<Vec<u8>, BoundedReadError> {
    let mut bytes = Vec::new();
    let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(limit).read_to_end(&mut bytes)?;
    if bytes.len() > cap {
        return Err(BoundedReadError::LargeFile { cap });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8], cap: usize) -> Vec<Result<(usize, Vec<u8>), String>> {
        let mut lines = TraceLines::with_cap(text, cap);
        let mut out = Vec::new();
        loop {
            match lines.next_line() {
                Ok(Some((n, bytes))) => out.push(Ok((n, bytes.to_vec()))),
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    /// A line of exactly the cap is read, with or without its newline; one byte more is
    /// refused with its line number and the cap, and nothing after it is read.
    #[test]
    fn a_line_at_the_cap_is_read_and_one_byte_over_is_refused() {
        assert_eq!(
            lines(b"abcd\nef\r\n\nwxyz", 4),
            [
                Ok((1, b"abcd".to_vec())),
                Ok((2, b"ef\r".to_vec())),
                Ok((3, Vec::new())),
                Ok((4, b"wxyz".to_vec())),
            ]
        );
        let over = lines(b"ab\nabcde\nab\n", 4);
        assert_eq!(over[0], Ok((1, b"ab".to_vec())));
        assert_eq!(
            over[1],
            Err("the line is longer than 4 bytes, the most a trace line may hold".into())
        );
        assert_eq!(over.len(), 2);
        let at_end = lines(b"abcde", 4);
        assert!(matches!(&at_end[..], [Err(_)]), "{at_end:?}");
        let mut reader = TraceLines::with_cap(&b"x\nabcde"[..], 4);
        reader.next_line().expect("line 1");
        assert!(matches!(
            reader.next_line(),
            Err(BoundedReadError::LongLine { line: 2, cap: 4 })
        ));
    }

    /// A whole read of the cap is kept; one byte more is refused after reading at most the
    /// cap and one byte (an endless reader ends).
    #[test]
    fn a_whole_read_is_bounded() {
        assert_eq!(read_whole(&b"abcd"[..], 4).expect("fits"), b"abcd");
        assert!(matches!(
            read_whole(&b"abcde"[..], 4),
            Err(BoundedReadError::LargeFile { cap: 4 })
        ));
        assert!(matches!(
            read_whole(std::io::repeat(b'x'), 1 << 10),
            Err(BoundedReadError::LargeFile { cap: 1024 })
        ));
        let endless = std::io::BufReader::new(std::io::repeat(b'x'));
        assert!(matches!(
            TraceLines::with_cap(endless, 1 << 10).next_line(),
            Err(BoundedReadError::LongLine { line: 1, cap: 1024 })
        ));
    }
}
