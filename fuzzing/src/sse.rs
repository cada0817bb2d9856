//! The SSE target: fuzzed bytes as a server-sent-events stream read by loadgen's
//! [`loadgen::sse::SseParser`], fed in pieces whose sizes the input chooses.
//!
//! Input layout: byte 0 is `0bLLLLLkkk`: `k` split sizes follow (`b + 1` bytes each, used in
//! turn), then the stream; `L` above 0 asks for a parser bounded at `16 * L` bytes per line
//! (0: the default bound), so small bounds are reached by small inputs. Properties:
//!
//! - the events (every `push` plus `finish`) are the same whether the stream is pushed whole,
//!   in the chosen pieces or byte by byte; a refused stream is refused in all three;
//! - the bytes the parser holds never exceed twice its line bound (a line and an event's data),
//!   where the parser reports them.
//!
//! [`Outcome`], [`Holding`] and [`Bounded`] read `push`, `finish`, the buffer size and the
//! constructor whether the parser returns plain values or `Result`s and whether or not it has
//! a bound, so the properties are stated once for either; the parser's own methods of the same
//! names take precedence.

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

/// The constructor of a bounded parser, for a parser without a bound: the bound is ignored.
pub trait Bounded {
    /// A parser; `limit` would bound its lines.
    fn with_limit(limit: usize) -> Self;
}

impl Bounded for SseParser {
    fn with_limit(_limit: usize) -> SseParser {
        SseParser::new()
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

/// The events of `stream` pushed in pieces of `sizes` (cycled; all at once when empty) to a
/// parser bounded at `limit` bytes (its default when `None`), or the parser's refusal; checks
/// the buffer bound after every push.
pub fn parse_in_pieces(
    stream: &[u8],
    sizes: &[usize],
    limit: Option<usize>,
) -> Result<Vec<String>, String> {
    let mut parser = match limit {
        Some(limit) => SseParser::with_limit(limit),
        None => SseParser::new(),
    };
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
    let (sizes, limit, stream) = match data.split_first() {
        None => (Vec::new(), None, data),
        Some((&head, rest)) => {
            let k = usize::from(head & 7).min(rest.len());
            let limit = (head >> 3 != 0).then(|| 16 * usize::from(head >> 3));
            let (sizes, stream) = rest.split_at(k);
            let sizes = sizes.iter().map(|&b| usize::from(b) + 1).collect();
            (sizes, limit, stream)
        }
    };
    let whole = parse_in_pieces(stream, &[], limit);
    let pieces = parse_in_pieces(stream, &sizes, limit);
    let bytes = parse_in_pieces(stream, &[1], limit);
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
        let whole = parse_in_pieces(stream, &[], None).expect("events");
        assert_eq!(whole, ["a", "b\nc", "[DONE]"]);
        assert_eq!(parse_in_pieces(stream, &[3, 1], None), Ok(whole));
        sse_stream(b"\x03\x00\x01\x02data: x\r\rdata: y");
        sse_stream(b"");
        sse_stream(b"\x07");
        sse_stream(b"\x09\x02data: a bounded line longer than sixteen bytes\n\n");
    }
}
