//! A direct reader for trace rows of the plain shape traces are written in: an object of integer
//! fields and an integer `hash_ids` array, as in the public Mooncake traces. The parser tries it
//! before serde_json: it reads a row in one pass over its bytes, where the derived deserializer
//! took most of a replay's start-up. Anything else (strings, fractions, exponents, nulls, signs,
//! unknown or repeated keys, malformed JSON) is left to serde_json, so a row this reader takes
//! comes out exactly as serde_json reads it, and every error is serde_json's.

use super::row::RawRow;

/// `text` (one line) as a row when it has the plain shape; None leaves it to serde_json.
pub(super) fn plain_row(text: &str) -> Option<RawRow> {
    let mut r = Reader {
        bytes: text.as_bytes(),
        at: 0,
    };
    let mut row = RawRow::default();
    // One bit per field: a repeated field (or a field and its alias) is serde_json's error.
    let mut seen = 0u8;
    r.skip_whitespace();
    r.eat(b'{')?;
    r.skip_whitespace();
    if r.peek() == Some(b'}') {
        r.at += 1;
    } else {
        loop {
            let field = Field::named(r.key()?)?;
            let bit = 1u8 << field as u8;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            r.skip_whitespace();
            r.eat(b':')?;
            r.skip_whitespace();
            match field {
                // serde_json reads an integer into an f64 field as `n as f64`.
                Field::Timestamp => row.timestamp = Some(r.integer()? as f64),
                Field::Delay => row.delay = Some(r.integer()? as f64),
                Field::InputLength => row.input_length = Some(r.integer()?),
                Field::OutputLength => row.output_length = Some(r.integer()?),
                Field::HashIds => row.hash_ids = Some(r.integers()?),
            }
            r.skip_whitespace();
            match r.next()? {
                b',' => r.skip_whitespace(),
                b'}' => break,
                _ => return None,
            }
        }
    }
    r.skip_whitespace();
    (r.at == r.bytes.len()).then_some(row)
}

/// True when [`plain_row`] leaves `text` to serde_json or reads it as serde_json reads it:
/// what the fuzzing checkers hold the reader to (the tests below check it row by row).
pub(super) fn agrees_with_serde_json(text: &str) -> bool {
    plain_row(text).is_none_or(|row| serde_json::from_str::<RawRow>(text).ok() == Some(row))
}

/// The fields this reader takes, under their names and aliases (as `RawRow` declares them).
#[derive(Clone, Copy)]
enum Field {
    Timestamp,
    InputLength,
    OutputLength,
    HashIds,
    Delay,
}

impl Field {
    /// The field a key names; None for any other key (serde_json skips those, this reader
    /// does not read arbitrary values).
    fn named(key: &[u8]) -> Option<Field> {
        Some(match key {
            b"timestamp" | b"created_time" => Field::Timestamp,
            b"input_length" | b"input_tokens" => Field::InputLength,
            b"output_length" | b"output_tokens" => Field::OutputLength,
            b"hash_ids" => Field::HashIds,
            b"delay" | b"delay_ms" => Field::Delay,
            _ => return None,
        })
    }
}

/// A position in a line's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    /// Consumes `want`, or fails.
    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// Skips JSON whitespace (space, tab, line feed, carriage return).
    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// A key of lowercase letters and underscores, in quotes (no escapes).
    fn key(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        while let Some(b) = self.peek() {
            match b {
                b'"' => break,
                b'a'..=b'z' | b'_' => self.at += 1,
                _ => return None,
            }
        }
        let key = &self.bytes[start..self.at];
        self.eat(b'"')?;
        Some(key)
    }

    /// A JSON integer without sign, fraction or exponent, of at most 19 digits (so it fits a
    /// u64 without an overflow check; longer ones are left to serde_json).
    fn integer(&mut self) -> Option<u64> {
        let start = self.at;
        let mut end = start;
        let mut n = 0u64;
        while let Some(&b) = self.bytes.get(end) {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            n = n.wrapping_mul(10).wrapping_add(u64::from(digit));
            end += 1;
        }
        let digits = end - start;
        // JSON has no leading zeros.
        if digits == 0 || digits > 19 || (digits > 1 && self.bytes[start] == b'0') {
            return None;
        }
        self.at = end;
        // A fraction or exponent makes it a float.
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        Some(n)
    }

    /// An array of such integers.
    fn integers(&mut self) -> Option<Vec<u64>> {
        self.eat(b'[')?;
        self.skip_whitespace();
        let mut out = Vec::new();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(out);
        }
        loop {
            out.push(self.integer()?);
            self.skip_whitespace();
            match self.next()? {
                b',' => self.skip_whitespace(),
                b']' => return Some(out),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// What serde_json reads of `text`, if it reads a row.
    fn serde_row(text: &str) -> Option<RawRow> {
        serde_json::from_str(text).ok()
    }

    /// Every row of the public trace has the plain shape and reads as serde_json reads it.
    #[test]
    fn the_public_trace_reads_as_serde_json_reads_it() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("traces/mooncake_synthetic_trace.jsonl");
        let text = std::fs::read_to_string(path).expect("the public trace");
        let mut rows = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let plain = plain_row(line).unwrap_or_else(|| panic!("plain shape: {line}"));
            assert_eq!(Some(plain), serde_row(line), "{line}");
            rows += 1;
        }
        assert_eq!(rows, 3993);
    }

    /// A value for `key`: mostly what the plain reader takes, sometimes what only serde_json
    /// takes or nothing does.
    fn value(rng: &mut ChaCha8Rng, key: &str) -> String {
        let integer = |rng: &mut ChaCha8Rng| match rng.gen_range(0..10) {
            0 => "0".to_string(),
            1 => u64::MAX.to_string(),
            2 => "9999999999999999999".to_string(),
            3 => "18446744073709551616".to_string(),
            _ => rng.gen_range(0..100_000u64).to_string(),
        };
        match rng.gen_range(0..24) {
            0 => "null".to_string(),
            1 => format!("{}.5", rng.gen_range(0..1000)),
            2 => format!("{}e2", rng.gen_range(0..10)),
            3 => format!("-{}", rng.gen_range(0..10)),
            4 => format!("0{}", rng.gen_range(0..10)),
            5 => "\"7\"".to_string(),
            _ if key == "hash_ids" => {
                let n = rng.gen_range(0..6);
                let items: Vec<String> = (0..n).map(|_| integer(rng)).collect();
                let sep = [",", ", ", " ,", ",\t"][rng.gen_range(0..4)];
                format!("[{}]", items.join(sep))
            }
            _ => integer(rng),
        }
    }

    /// A row of random keys (fields, aliases, repeats, keys serde_json skips) and values.
    fn row(rng: &mut ChaCha8Rng) -> String {
        const KEYS: [&str; 14] = [
            "timestamp",
            "created_time",
            "input_length",
            "input_tokens",
            "output_length",
            "output_tokens",
            "hash_ids",
            "hash_ids",
            "delay",
            "delay_ms",
            "session_id",
            "request_id",
            "extra",
            "Timestamp",
        ];
        let n = rng.gen_range(0..6);
        let ws = |rng: &mut ChaCha8Rng| [" ", "", "", "\t", "  "][rng.gen_range(0..5)];
        let fields: Vec<String> = (0..n)
            .map(|_| {
                let key = KEYS[rng.gen_range(0..KEYS.len())];
                let v = value(rng, key);
                format!("{}\"{key}\"{}:{}{v}{}", ws(rng), ws(rng), ws(rng), ws(rng))
            })
            .collect();
        format!("{}{{{}}}{}", ws(rng), fields.join(","), ws(rng))
    }

    /// Rows the plain reader takes read as serde_json reads them, over seeded random rows and
    /// byte-level mutations of them; the plain reader takes many of them.
    #[test]
    fn rows_read_plainly_read_as_serde_json_reads_them() {
        const ALPHABET: &[u8] = b"{}[]\",: 0123456789.e-\\tn";
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (mut plain, mut total) = (0, 0);
        for _ in 0..40_000 {
            let mut text = row(&mut rng).into_bytes();
            if rng.gen_bool(0.3) && !text.is_empty() {
                let at = rng.gen_range(0..text.len());
                let b = ALPHABET[rng.gen_range(0..ALPHABET.len())];
                match rng.gen_range(0..3) {
                    0 => text[at] = b,
                    1 => text.insert(at, b),
                    _ => {
                        text.remove(at);
                    }
                }
            }
            let text = String::from_utf8(text).expect("ASCII");
            total += 1;
            if let Some(row) = plain_row(&text) {
                plain += 1;
                assert_eq!(Some(row), serde_row(&text), "{text}");
            }
        }
        assert!(
            plain * 8 > total,
            "the plain reader took {plain} of {total} rows"
        );
    }

    /// What the plain reader leaves to serde_json, case by case.
    #[test]
    fn other_shapes_are_left_to_serde_json() {
        let plain =
            r#"{"timestamp": 5, "input_length": 6, "output_length": 3, "hash_ids": [1, 2]}"#;
        let row = plain_row(plain).expect("plain");
        assert_eq!(row.timestamp, Some(5.0));
        assert_eq!(row.hash_ids, Some(vec![1, 2]));
        for text in [
            r#"{"timestamp": 5.5, "hash_ids": [1]}"#,
            r#"{"timestamp": 1e3, "hash_ids": [1]}"#,
            r#"{"timestamp": null, "hash_ids": [1]}"#,
            r#"{"timestamp": 5, "created_time": 5, "hash_ids": [1]}"#,
            r#"{"hash_ids": [1], "hash_ids": [1]}"#,
            r#"{"hash_ids": [01]}"#,
            r#"{"hash_ids": [-1]}"#,
            r#"{"hash_ids": [18446744073709551615]}"#,
            r#"{"hash_ids": [1,]}"#,
            r#"{"hash_ids": [1], }"#,
            r#"{"session_id": "a", "hash_ids": [1]}"#,
            r#"{"extra": 1, "hash_ids": [1]}"#,
            r#"{"hash\u005fids": [1]}"#,
            r#"{"hash_ids": [1]} x"#,
            r#"{"hash_ids": [1]"#,
        ] {
            assert_eq!(plain_row(text), None, "{text}");
        }
    }
}
