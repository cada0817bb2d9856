//! A tolerant server-sent-events parser: bytes in (split anywhere), `data` payloads out.
//!
//! Accepts `data:` with or without the space, LF, CRLF or lone-CR line ends, comments (`:`),
//! other fields (ignored), multi-line data (joined with `\n`), and a last event without the blank
//! line before EOF ([`SseParser::finish`]). Lines are decoded only once complete, so a UTF-8
//! character split across reads is kept intact.

/// Incremental SSE parser.
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the incomplete last line.
    line: Vec<u8>,
    /// Data lines of the event being read.
    data: Option<String>,
    /// The previous byte was a CR (its LF, if any, belongs to the same line end).
    after_cr: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> SseParser {
        SseParser::default()
    }

    /// Feeds bytes; returns the data of every event they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(&mut events),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(&mut events);
                }
                _ => self.line.push(b),
            }
        }
        events
    }

    /// Ends the stream: the data of an event left without its blank line, if any.
    pub fn finish(&mut self) -> Option<String> {
        if !self.line.is_empty() {
            let mut events = Vec::new();
            self.end_line(&mut events);
        }
        self.data.take()
    }

    fn end_line(&mut self, events: &mut Vec<String>) {
        let line = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                events.push(data);
            }
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::new();
        let mut out: Vec<String> = chunks.iter().flat_map(|c| p.push(c)).collect();
        out.extend(p.finish());
        out
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
}
