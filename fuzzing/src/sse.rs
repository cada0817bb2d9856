//! The SSE target: fuzzed bytes as a server-sent-events stream read by loadgen's
//! [`loadgen::sse::SseParser`], fed in pieces whose sizes the input chooses.
//!
//! Input layout: byte 0 modulo 8 is the number `k` of split sizes, the next `k` bytes are the
//! sizes (`b + 1` bytes each, used in turn), the rest is the stream. Properties:
//!
//! - the events (every `push` plus `finish`) are the same whether the stream is pushed whole,
//!   in the chosen pieces or byte by byte; a refused stream is refused in all three;
//! - the bytes the parser holds never exceed twice its line bound (a line and an event's data),
//!   where the parser reports them.
//!
//! [`Outcome`] and [`Holding`] read `push`, `finish` and the buffer size whether the parser
//! returns plain values or `Result`s and whether or not it reports its buffer, so the property
//! is stated once for either.

use loadgen::sse::SseParser;

/// What `SseParser::push` and `finish` return, as one `Result`.
pub trait Outcome<T> {
    /// The value, or the parser's refusal as text.
    fn into_outcome(self) -> Result<T, String>;
}

impl Outcome<Vec<String>> for Vec<String> {
    fn into_outcome(self) -> Result<Vec<String>, String> {
        Ok(self)
    }
}

impl Outcome<Option<String>> for Option<String> {
    fn into_outcome(self) -> Result<Option<String>, String> {
        Ok(self)
    }
}

impl<T, E: std::fmt::Display> Outcome<T> for Result<T, E> {
    fn into_outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

/// The parser's buffer size and bound, for a parser that does not report them. A parser's own
/// `buffered_bytes()` and `limit()` methods take precedence over these.
pub trait Holding {
    /// Bytes held: unknown.
    fn buffered_bytes(&self) -> Option<usize>;
    /// The line bound: unknown.
    fn limit(&self) -> Option<usize>;
}

impl Holding for SseParser {
    fn buffered_bytes(&self) -> Option<usize> {
        None
    }
    fn limit(&self) -> Option<usize> {
        None
    }
}

/// The parser's (buffered bytes, bound), when it reports them.
pub fn holding(parser: &SseParser) -> Option<(usize, usize)> {
    known(parser.buffered_bytes()).zip(known(parser.limit()))
}

/// A reported size (`usize`) or an unknown one (`Option<usize>`) as an `Option`.
fn known(size: impl Into<Option<usize>>) -> Option<usize> {
    size.into()
}

/// The events of `stream` pushed in pieces of `sizes` (cycled; all at once when empty), or the
/// parser's refusal; checks the buffer bound after every push.
pub fn parse_in_pieces(stream: &[u8], sizes: &[usize]) -> Result<Vec<String>, String> {
    let mut parser = SseParser::new();
    let mut events = Vec::new();
    let mut rest = stream;
    let mut size = sizes.iter().copied().cycle();
    while !rest.is_empty() {
        let n = size.next().unwrap_or(rest.len()).clamp(1, rest.len());
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        let pushed = parser.push(piece).into_outcome();
        if let Some((buffered, limit)) = holding(&parser) {
            assert!(
                buffered <= limit.saturating_mul(2),
                "the parser holds {buffered} bytes, over twice its {limit}-byte bound"
            );
        }
        events.extend(pushed?);
    }
    events.extend(parser.finish().into_outcome()?);
    Ok(events)
}

/// Checks an SSE stream (see the module docs for the layout and the properties).
pub fn sse_stream(data: &[u8]) {
    let (sizes, stream) = match data.split_first() {
        None => (Vec::new(), data),
        Some((&k, rest)) => {
            let k = usize::from(k % 8).min(rest.len());
            let (sizes, stream) = rest.split_at(k);
            (sizes.iter().map(|&b| usize::from(b) + 1).collect(), stream)
        }
    };
    let whole = parse_in_pieces(stream, &[]);
    let pieces = parse_in_pieces(stream, &sizes);
    let bytes = parse_in_pieces(stream, &[1]);
    let refused = |r: &Result<Vec<String>, String>| r.is_err();
    if refused(&whole) || refused(&pieces) || refused(&bytes) {
        assert!(
            refused(&whole) && refused(&pieces) && refused(&bytes),
            "the stream is refused in some splits only: whole {whole:?}, pieces of {sizes:?} \
             {pieces:?}, byte by byte {bytes:?}"
        );
        return;
    }
    assert_eq!(whole, pieces, "pieces of {sizes:?} give other events");
    assert_eq!(whole, bytes, "byte by byte gives other events");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cycle_and_events_match() {
        let stream = b"data: a\r\n\r\n: c\ndata: b\ndata: c\n\ndata: [DONE]";
        let whole = parse_in_pieces(stream, &[]).expect("events");
        assert_eq!(whole, ["a", "b\nc", "[DONE]"]);
        assert_eq!(parse_in_pieces(stream, &[3, 1]), Ok(whole));
        sse_stream(b"\x03\x00\x01\x02data: x\r\rdata: y");
        sse_stream(b"");
        sse_stream(b"\x07");
    }
}
