//! The tiktoken encodings' pre-tokenizers for ASCII text, written out by hand: where the next
//! piece ends, exactly as the encoding's regular expression (leftmost alternative first, with its
//! backtracking) would end it. In ASCII, `\p{L}` is `[A-Za-z]` (`\p{Lu}` upper, `\p{Ll}` lower,
//! no `Lt`/`Lm`/`Lo`/`M`), `\p{N}` is `[0-9]` and `\s` is `[\t\n\x0B\x0C\r ]`, so a byte's class
//! decides every step. Text with any other character goes through the regular expression.
//! Tests compare both on every short string over the bytes where the alternatives differ.

/// ASCII letter (`\p{L}`).
fn letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

/// ASCII digit (`\p{N}`).
fn digit(b: u8) -> bool {
    b.is_ascii_digit()
}

/// ASCII whitespace (`\s`: tab, line feed, vertical tab, form feed, carriage return, space).
fn space(b: u8) -> bool {
    matches!(b, b'\t'..=b'\r' | b' ')
}

/// `[\r\n]`.
fn newline(b: u8) -> bool {
    matches!(b, b'\r' | b'\n')
}

/// `[^\r\n\p{L}\p{N}]`: the optional character before a word.
fn before_word(b: u8) -> bool {
    !newline(b) && !letter(b) && !digit(b)
}

/// `[^\s\p{L}\p{N}]`: punctuation and other symbols.
fn symbol(b: u8) -> bool {
    !space(b) && !letter(b) && !digit(b)
}

/// The first index at or after `i` where `class` fails.
fn run(b: &[u8], mut i: usize, class: impl Fn(u8) -> bool) -> usize {
    while i < b.len() && class(b[i]) {
        i += 1;
    }
    i
}

/// Length of the contraction `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i` (cl100k's `'(?i:[sdmt]|ll|ve|re)`
/// is the same set), 0 if none.
fn contraction(b: &[u8], i: usize) -> usize {
    let at = |k: usize| b.get(i + k).map(u8::to_ascii_lowercase);
    if at(0) != Some(b'\'') {
        return 0;
    }
    match (at(1), at(2)) {
        (Some(b's' | b't' | b'm' | b'd'), _) => 2,
        (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => 3,
        _ => 0,
    }
}

/// Where a whitespace piece starting at `i` ends: the whole run if it ends the text and
/// `end_first` (cl100k's `\s++$` comes before its newline alternative), else up to the run's last
/// newline if it has one, else (`\s+(?!\S)`) the whole run at the end of the text, all but the
/// run's last character before a non-space (that one goes with the next piece), or the single
/// character.
fn whitespace_end(b: &[u8], i: usize, end_first: bool) -> usize {
    let r = run(b, i, space);
    if r == b.len() && end_first {
        return r;
    }
    if let Some(last) = b[i..r].iter().rposition(|&c| newline(c)) {
        return i + last + 1;
    }
    if r == b.len() {
        r
    } else if r - i >= 2 {
        r - 1
    } else {
        i + 1
    }
}

/// Where the optional ` ?[^\s\p{L}\p{N}]+` symbol run starting at `i` ends, `None` if none does.
fn symbols(b: &[u8], i: usize) -> Option<usize> {
    let j = if b[i] == b' ' && b.get(i + 1).is_some_and(|&c| symbol(c)) {
        i + 1
    } else {
        i
    };
    symbol(b[j]).then(|| run(b, j, symbol))
}

/// The end of the `o200k_base` piece that starts at `i` (`i < b.len()`, `b` ASCII).
pub(crate) fn o200k_piece_end(b: &[u8], i: usize) -> usize {
    // `[^\r\n\p{L}\p{N}]?` then upper* lower+ (or upper+ lower*), then a contraction.
    let word = if letter(b[i]) {
        Some(i)
    } else if before_word(b[i]) && b.get(i + 1).is_some_and(|&c| letter(c)) {
        Some(i + 1)
    } else {
        None
    };
    if let Some(j) = word {
        let end = run(b, run(b, j, |c| c.is_ascii_uppercase()), |c| {
            c.is_ascii_lowercase()
        });
        return end + contraction(b, end);
    }
    if digit(b[i]) {
        return run(b, i, digit).min(i + 3);
    }
    if let Some(end) = symbols(b, i) {
        return run(b, end, |c| newline(c) || c == b'/');
    }
    // `\s*[\r\n]+ | \s+(?!\S) | \s+`.
    whitespace_end(b, i, false)
}

/// The end of the `cl100k_base` piece that starts at `i` (`i < b.len()`, `b` ASCII).
pub(crate) fn cl100k_piece_end(b: &[u8], i: usize) -> usize {
    let c = contraction(b, i);
    if c > 0 {
        return i + c;
    }
    // `[^\r\n\p{L}\p{N}]?+\p{L}++`: any mix of cases.
    if letter(b[i]) {
        return run(b, i, letter);
    }
    if before_word(b[i]) && b.get(i + 1).is_some_and(|&c| letter(c)) {
        return run(b, i + 1, letter);
    }
    if digit(b[i]) {
        return run(b, i, digit).min(i + 3);
    }
    if let Some(end) = symbols(b, i) {
        return run(b, end, newline);
    }
    // `\s++$ | \s*[\r\n] | \s+(?!\S) | \s`.
    whitespace_end(b, i, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::tiktoken::TiktokenEncoding;
    use fancy_regex::Regex;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Bytes of every class the patterns tell apart.
    const ALPHABET: &[u8] = b"aZ1 \t\n\r\x0b\x0c'sStTlLvVeErRmMdD/!.\x00\x7f";
    /// One byte of each class, for the exhaustive part.
    const CLASSES: &[u8] = b"aZ1 \t\n\r\x0b'sLe/!";

    fn pieces(text: &str, end: fn(&[u8], usize) -> usize) -> Vec<&str> {
        let b = text.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let e = end(b, i);
            assert!(e > i && e <= b.len(), "{text:?} at {i}: {e}");
            out.push(&text[i..e]);
            i = e;
        }
        out
    }

    fn regex_pieces<'t>(re: &Regex, text: &'t str) -> Vec<&'t str> {
        re.find_iter(text)
            .map(|m| m.expect("no regex error").as_str())
            .collect()
    }

    fn check(encoding: TiktokenEncoding, end: fn(&[u8], usize) -> usize) {
        let re = Regex::new(encoding.pattern()).expect("pattern compiles");
        let same = |text: &str| {
            assert_eq!(
                pieces(text, end),
                regex_pieces(&re, text),
                "{encoding:?}: {text:?}"
            );
        };
        // Every string of up to four bytes of one per class.
        let mut texts = vec![String::new()];
        for _ in 0..4 {
            let mut longer = Vec::new();
            for t in &texts {
                for &c in CLASSES {
                    let mut s = t.clone();
                    s.push(c as char);
                    same(&s);
                    longer.push(s);
                }
            }
            texts = longer;
        }
        // Longer random strings, biased towards runs.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..10_000 {
            let len = rng.gen_range(0..40);
            let text: String = (0..len)
                .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
                .collect();
            same(&text);
        }
        same("Hello World, it's HTTP/2.0 at 12345 o'clock!\r\n\r\n  indented\tTAB'S   \n ");
    }

    #[test]
    fn o200k_pieces_are_the_patterns() {
        check(TiktokenEncoding::O200kBase, o200k_piece_end);
    }

    #[test]
    fn cl100k_pieces_are_the_patterns() {
        check(TiktokenEncoding::Cl100kBase, cl100k_piece_end);
    }
}
