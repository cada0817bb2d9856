//! A tolerant, bounded server-sent-events parser: bytes in (split anywhere), `data` payloads out.
//!
//! Accepts `data:` with or without the space, LF, CRLF or lone-CR line ends, comments (`:`),
//! other fields (ignored), multi-line data (joined with `\n`), and a last event without the blank
//! line before EOF ([`SseParser::finish`]). Lines are decoded only once complete, so a UTF-8
//! character split across reads is kept intact.
//!
//! Memory is bounded: a line longer than the limit, or an event whose data grows past it, is a
//! [`LineTooLong`] error (the parser keeps at most `limit` bytes of line and `limit` bytes of
//! event data, whatever the server sends), and the parser stays failed afterwards.

/// Default bound on one SSE line and on one event's data: 1 MiB. A streamed chunk is usually
/// well under 1 KiB; a megabyte leaves room for large tool-call or logprob chunks.
pub const DEFAULT_MAX_LINE_BYTES: usize = 1 << 20;

/// A line (or an event's data) exceeded the parser's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("SSE line longer than {limit} bytes")]
pub struct LineTooLong {
    /// The limit that was exceeded, in bytes.
    pub limit: usize,
}

/// Incremental SSE parser.
///
/// `SseParser::push_events` is the allocation-free path (events are slices of one buffer that
/// is reused from read to read); [`SseParser::push`] returns owned strings.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the incomplete last line (never more than `limit`).
    line: Vec<u8>,
    /// The data of the events completed by the last push, back to back, then the data lines of
    /// the event being read (from `pending`; never more than `limit` bytes).
    buf: String,
    /// End offset in `buf` of each event completed by the last push.
    ends: Vec<usize>,
    /// Start in `buf` of the event being read, once it has a data line.
    pending: Option<usize>,
    /// The previous byte was a CR (its LF, if any, belongs to the same line end).
    after_cr: bool,
    /// Most bytes of one line, and of one event's data.
    limit: usize,
    /// Set once the limit was exceeded: every later call fails too.
    failed: bool,
}

/// The data of the events one `SseParser::push_events` completed, in order.
#[derive(Debug)]
pub struct Events<'a> {
    buf: &'a str,
    ends: std::slice::Iter<'a, usize>,
    from: usize,
}

impl<'a> Iterator for Events<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let end = *self.ends.next()?;
        let data = &self.buf[self.from..end];
        self.from = end;
        Some(data)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.ends.size_hint()
    }
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new()
    }
}

impl SseParser {
    /// A parser at the start of a stream, with [`DEFAULT_MAX_LINE_BYTES`].
    pub fn new() -> SseParser {
        SseParser::with_limit(DEFAULT_MAX_LINE_BYTES)
    }

    /// A parser whose lines and event data may not exceed `limit` bytes (at least 1).
    pub fn with_limit(limit: usize) -> SseParser {
        SseParser {
            line: Vec::new(),
            buf: String::new(),
            ends: Vec::new(),
            pending: None,
            after_cr: false,
            limit: limit.max(1),
            failed: false,
        }
    }

    /// The bound on one line and on one event's data.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes currently held (incomplete line plus pending event data): never above twice the limit.
    pub fn buffered_bytes(&self) -> usize {
        self.line.len() + self.pending.map_or(0, |start| self.buf.len() - start)
    }

    /// Feeds bytes; returns the data of every event they complete, in order, or [`LineTooLong`]
    /// (events completed earlier in the same bytes are dropped with it: the stream has failed).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, LineTooLong> {
        Ok(self.push_events(bytes)?.map(str::to_string).collect())
    }

    /// As [`SseParser::push`], without allocating: the events borrow the parser's buffer until
    /// the next call.
    pub(crate) fn push_events(&mut self, bytes: &[u8]) -> Result<Events<'_>, LineTooLong> {
        self.check()?;
        // Drop the events the previous push returned; keep the pending event's data.
        match self.pending {
            Some(start) => {
                self.buf.drain(..start);
                self.pending = Some(0);
            }
            None => self.buf.clear(),
        }
        self.ends.clear();
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(i) => {
                    self.after_cr = rest[i] == b'\r';
                    if self.line.is_empty() {
                        // The whole line is in this read: no copy.
                        if i > self.limit {
                            return Err(self.fail());
                        }
                        self.end_line(&rest[..i])?;
                    } else {
                        self.extend_line(&rest[..i])?;
                        // Taken out and put back, so its allocation is reused.
                        let mut line = std::mem::take(&mut self.line);
                        self.end_line(&line)?;
                        line.clear();
                        self.line = line;
                    }
                    rest = &rest[i + 1..];
                }
                None => {
                    self.extend_line(rest)?;
                    rest = &[];
                }
            }
        }
        Ok(self.events())
    }

    /// Ends the stream: the data of an event left without its blank line, if any.
    pub fn finish(&mut self) -> Result<Option<String>, LineTooLong> {
        self.check()?;
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.end_line(&line)?;
        }
        Ok(self
            .pending
            .take()
            .map(|start| self.buf[start..].to_string()))
    }

    fn events(&self) -> Events<'_> {
        Events {
            buf: &self.buf,
            ends: self.ends.iter(),
            from: 0,
        }
    }

    fn check(&self) -> Result<(), LineTooLong> {
        if self.failed {
            Err(LineTooLong { limit: self.limit })
        } else {
            Ok(())
        }
    }

    fn fail(&mut self) -> LineTooLong {
        self.failed = true;
        self.line = Vec::new();
        self.buf = String::new();
        self.ends = Vec::new();
        self.pending = None;
        LineTooLong { limit: self.limit }
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), LineTooLong> {
        if self.line.len() + bytes.len() > self.limit {
            return Err(self.fail());
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Handles one complete line (without its line end).
    fn end_line(&mut self, line: &[u8]) -> Result<(), LineTooLong> {
        if line.is_empty() {
            if self.pending.take().is_some() {
                self.ends.push(self.buf.len());
            }
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        // The field name compares as decoded text: invalid UTF-8 never spells `data`.
        if field == b"data" {
            // `from_utf8` is the fast check; only invalid text pays for the lossy decoding.
            let value = match std::str::from_utf8(value) {
                Ok(text) => std::borrow::Cow::Borrowed(text),
                Err(_) => String::from_utf8_lossy(value),
            };
            let held = self.pending.map_or(0, |start| self.buf.len() - start + 1);
            if held + value.len() > self.limit {
                return Err(self.fail());
            }
            match self.pending {
                Some(_) => self.buf.push('\n'),
                None => self.pending = Some(self.buf.len()),
            }
            self.buf.push_str(&value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn all_with(limit: usize, chunks: &[&[u8]]) -> Result<Vec<String>, LineTooLong> {
        let mut p = SseParser::with_limit(limit);
        let mut out = Vec::new();
        for c in chunks {
            out.extend(p.push(c)?);
        }
        out.extend(p.finish()?);
        Ok(out)
    }

    fn all(chunks: &[&[u8]]) -> Vec<String> {
        all_with(DEFAULT_MAX_LINE_BYTES, chunks).expect("within the limit")
    }

    #[test]
    fn plain_and_spaceless_data() {
        assert_eq!(all(&[b"data: a\n\ndata:b\n\n"]), ["a", "b"]);
    }

    #[test]
    fn crlf_and_lone_cr() {
        assert_eq!(
            all(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\n"]),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn split_anywhere_gives_the_same_events() {
        let stream = "data: {\"x\":\"é\"}\r\n\r\n: comment\nevent: m\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
        let whole = all(&[stream.as_bytes()]);
        assert_eq!(whole, ["{\"x\":\"é\"}", "one\ntwo", "[DONE]"]);
        let bytes = stream.as_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(all(&[&bytes[..cut], &bytes[cut..]]), whole, "cut at {cut}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(all(&singles), whole);
    }

    #[test]
    fn last_event_without_blank_line_is_flushed() {
        assert_eq!(all(&[b"data: a\n\ndata: b"]), ["a", "b"]);
        assert!(all(&[b": only a comment\n"]).is_empty());
    }

    #[test]
    fn borrowed_events_match_owned_ones_and_the_buffer_is_reused() {
        let stream = b"data: a\n\ndata: {\"k\":1}\ndata: two\n\ndata: pend\ndata: in";
        let mut p = SseParser::new();
        let got: Vec<&str> = p.push_events(stream).expect("within the limit").collect();
        assert_eq!(got, ["a", "{\"k\":1}\ntwo"]);
        // The pending event's data and the incomplete line.
        assert_eq!(p.buffered_bytes(), "pend".len() + "data: in".len());
        // Both survive into the next push; the events returned before do not.
        let got: Vec<&str> = p.push_events(b"g\n\n").expect("within the limit").collect();
        assert_eq!(got, ["pend\ning"]);
        assert_eq!(p.buffered_bytes(), 0);
        assert_eq!(p.push_events(b"").expect("empty").count(), 0);
        assert_eq!(p.finish(), Ok(None));
    }

    #[test]
    fn invalid_utf8_is_replaced_and_never_spells_a_field() {
        assert_eq!(all(&[b"data: a\xffb\n\n"]), ["a\u{fffd}b"]);
        assert!(all(&[b"d\xffata: x\n\n"]).is_empty());
        // The limit counts the decoded data (each bad byte becomes three).
        assert_eq!(
            all_with(8, &[b"data:\xff\xff\n\n"]),
            Ok(vec!["\u{fffd}\u{fffd}".to_string()])
        );
        assert_eq!(
            all_with(8, &[b"data:\xff\xff\xff\n\n"]),
            Err(LineTooLong { limit: 8 })
        );
    }

    #[test]
    fn a_line_over_the_limit_fails_and_stays_failed() {
        let limit = 16;
        // Exactly at the limit is fine: "data: " + 10 bytes = 16.
        assert_eq!(
            all_with(limit, &[b"data: 0123456789\n\n"]),
            Ok(vec!["0123456789".to_string()])
        );
        // One byte more fails, whether the line ends or not, and in whatever reads it comes.
        for stream in [&b"data: 0123456789A\n\n"[..], b"data: 0123456789A"] {
            assert_eq!(all_with(limit, &[stream]), Err(LineTooLong { limit }));
            let singles: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(all_with(limit, &singles), Err(LineTooLong { limit }));
        }
        let mut p = SseParser::with_limit(limit);
        assert!(p.push(&[b'x'; 17]).is_err());
        assert!(p.push(b"data: ok\n\n").is_err());
        assert!(p.finish().is_err());
        // Many short data lines of one event count against the limit too.
        assert_eq!(
            all_with(limit, &[b"data: 12345\ndata: 12345\ndata: 12345\n\n"]),
            Err(LineTooLong { limit })
        );
    }

    /// A random valid stream: events of random data (1-3 lines each, UTF-8), random line ends,
    /// comments and other fields in between.
    fn random_stream(rng: &mut ChaCha8Rng) -> (Vec<u8>, Vec<String>) {
        const PIECES: [&str; 8] = ["a", "{\"k\":1}", "é", "日本", " ", "[DONE]", "x:y", "🙂"];
        let ends = ["\n", "\r\n", "\r"];
        let mut bytes = Vec::new();
        let mut expected = Vec::new();
        for _ in 0..rng.gen_range(0..8) {
            if rng.gen_bool(0.3) {
                bytes.extend_from_slice(b": comment\n");
            }
            if rng.gen_bool(0.2) {
                bytes.extend_from_slice(b"event: message\r\n");
            }
            let mut lines = Vec::new();
            for _ in 0..rng.gen_range(1..4) {
                let line: String = (0..rng.gen_range(0..5))
                    .map(|_| PIECES[rng.gen_range(0..PIECES.len())])
                    .collect();
                let space = if rng.gen_bool(0.5) { " " } else { "" };
                // A leading space in the value is eaten by the optional one after the colon.
                let sent = format!("data:{space}{line}");
                let kept = if space.is_empty() {
                    line.strip_prefix(' ').unwrap_or(&line).to_string()
                } else {
                    line.clone()
                };
                bytes.extend_from_slice(sent.as_bytes());
                bytes.extend_from_slice(ends[rng.gen_range(0..3)].as_bytes());
                lines.push(kept);
            }
            // A CR line end followed by an LF blank line would merge: use LF for the blank line
            // after a CR end only via a fresh CR LF pair.
            let blank = ends[rng.gen_range(0..3)];
            if bytes.last() == Some(&b'\r') && blank == "\n" {
                bytes.extend_from_slice(b"\r\n");
            } else {
                bytes.extend_from_slice(blank.as_bytes());
            }
            expected.push(lines.join("\n"));
        }
        (bytes, expected)
    }

    /// Property: any split of a valid stream into reads parses identically (seeded loop).
    #[test]
    fn any_split_of_a_valid_stream_parses_identically() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for case in 0..500 {
            let (bytes, expected) = random_stream(&mut rng);
            assert_eq!(all(&[&bytes]), expected, "case {case}: whole");
            let mut reads: Vec<&[u8]> = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = rng.gen_range(1..=rest.len().min(9));
                reads.push(&rest[..n]);
                rest = &rest[n..];
            }
            assert_eq!(all(&reads), expected, "case {case}: {} reads", reads.len());
        }
    }

    /// Property: arbitrary bytes in arbitrary reads never panic and never hold more than the
    /// bound (line plus pending event data), whatever the limit.
    #[test]
    fn arbitrary_bytes_never_panic_or_exceed_the_bound() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let alphabet = b"data: \r\n\n:x\xff\xc3\xa9[DONE]";
        for case in 0..2000 {
            let limit = rng.gen_range(1..64);
            let mut p = SseParser::with_limit(limit);
            for _ in 0..rng.gen_range(0..20) {
                let read: Vec<u8> = (0..rng.gen_range(0..40))
                    .map(|_| {
                        if rng.gen_bool(0.7) {
                            alphabet[rng.gen_range(0..alphabet.len())]
                        } else {
                            rng.gen()
                        }
                    })
                    .collect();
                if let Ok(events) = p.push(&read) {
                    assert!(events.iter().all(|e| e.len() <= limit), "case {case}");
                }
                assert!(p.buffered_bytes() <= 2 * limit, "case {case}");
            }
            if let Ok(Some(e)) = p.finish() {
                assert!(e.len() <= limit, "case {case}");
            }
        }
    }
}
