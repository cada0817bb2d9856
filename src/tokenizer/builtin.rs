//! The builtin word-level tokenizer: no files, no downloads, same ids on every machine.
//!
//! Id layout (stable; new entries only ever go at the end of a section's source list):
//!
//! | ids | tokens |
//! |-----|--------|
//! | `0..256` | byte fallback `<0x00>`..`<0xFF>`: any byte no other token covers |
//! | `256..256+S` | special tokens ([`SPECIAL_TOKENS`]), never produced by [`Tokenizer::encode`] |
//! | then | whitespace (`" "`, `"  "`, `"    "`, `"\t"`, `"\n"`, `"\n\n"`) |
//! | then | digits and ASCII punctuation, each bare and with a leading space |
//! | then | single ASCII letters, bare and with a leading space |
//! | then | every word of [`COMMON_WORDS`] and [`LOREM_WORDS`] as `w`, `" w"`, `W`, `" W"` |
//!
//! Encoding splits text GPT style: a space directly before a letter, digit or punctuation mark
//! belongs to the token that follows it, so `" word"` is one token and `"word"` at the start of a
//! text is one token. A letter run that is not a word is covered greedily by the longest known
//! pieces (single letters always exist); any other character falls back to its UTF-8 bytes.
//! Every string therefore encodes, and `decode(encode(s)) == s`.

use std::collections::HashMap;

use super::words::{COMMON_WORDS, LOREM_WORDS};
use super::{AnswerWords, Tokenizer};

/// Special tokens of the builtin tokenizer, in id order from 256.
///
/// They are only ever inserted by the chat template (looked up with
/// [`Tokenizer::special_token_id`]); the same strings inside message text encode as plain text,
/// so a user cannot forge a role marker.
pub(crate) const SPECIAL_TOKENS: &[&str] = &[
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|developer|>",
    "<|end|>",
    "<think>",
    "</think>",
    "<|pad|>",
];

/// Number of byte-fallback tokens (ids `0..256`).
const NUM_BYTE_TOKENS: u32 = 256;

/// Whitespace tokens other than the leading space of a word.
const WHITESPACE_TOKENS: &[&str] = &[" ", "  ", "    ", "\t", "\n", "\n\n"];

/// Longest whitespace token, in bytes (for the greedy match).
const MAX_WHITESPACE_LEN: usize = 4;

/// The builtin tokenizer (see the module docs for its vocabulary and splitting rules).
#[derive(Clone, Debug)]
pub struct BuiltinTokenizer {
    /// Text of every non-byte, non-special token, indexed by `id - first_text_id`.
    texts: Vec<String>,
    /// Text token -> id, for encoding. Only looked up, never iterated.
    ids: HashMap<String, u32>,
    /// Id of the first text token (after the byte and special tokens).
    first_text_id: u32,
    /// Length in bytes of the longest text token, bounding the greedy match.
    max_token_len: usize,
    /// Round-tripping words for generated answers.
    answer_words: AnswerWords,
}

impl Default for BuiltinTokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl BuiltinTokenizer {
    /// Builds the vocabulary from the embedded word lists (a few thousand entries; cheap).
    pub fn new() -> Self {
        let first_text_id = NUM_BYTE_TOKENS + SPECIAL_TOKENS.len() as u32;
        let mut texts: Vec<String> = Vec::new();
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut add = |text: String| -> u32 {
            if let Some(&id) = ids.get(&text) {
                return id;
            }
            let id = first_text_id + texts.len() as u32;
            ids.insert(text.clone(), id);
            texts.push(text);
            id
        };
        for ws in WHITESPACE_TOKENS {
            add((*ws).to_string());
        }
        for b in (b'!'..=b'~').filter(|b| !b.is_ascii_alphabetic()) {
            let c = char::from(b);
            add(c.to_string());
            add(format!(" {c}"));
        }
        for b in (b'a'..=b'z').chain(b'A'..=b'Z') {
            let c = char::from(b);
            add(c.to_string());
            add(format!(" {c}"));
        }
        let mut initial = Vec::new();
        let mut continuation = Vec::new();
        let words = COMMON_WORDS
            .split_whitespace()
            .chain(LOREM_WORDS.iter().copied());
        for word in words {
            let capitalized = capitalize(word);
            add(word.to_string());
            let spaced = add(format!(" {word}"));
            let cap = add(capitalized.clone());
            add(format!(" {capitalized}"));
            // Single letters are tokens already; only whole words make answers.
            if word.len() > 1 {
                if !continuation.contains(&spaced) {
                    continuation.push(spaced);
                }
                if !initial.contains(&cap) {
                    initial.push(cap);
                }
            }
        }
        let max_token_len = texts.iter().map(String::len).max().unwrap_or(1);
        Self {
            texts,
            ids,
            first_text_id,
            max_token_len,
            answer_words: AnswerWords::new(initial, continuation),
        }
    }

    /// Text of a text token, `None` for byte, special and unknown ids.
    fn text_of(&self, id: u32) -> Option<&str> {
        let index = id.checked_sub(self.first_text_id)?;
        self.texts.get(index as usize).map(String::as_str)
    }

    /// Covers `piece` (ASCII only) greedily with the longest known tokens.
    fn encode_greedy(&self, piece: &str, out: &mut Vec<u32>) {
        let mut start = 0;
        while start < piece.len() {
            let mut end = piece.len().min(start + self.max_token_len);
            loop {
                if let Some(&id) = self.ids.get(&piece[start..end]) {
                    out.push(id);
                    start = end;
                    break;
                }
                end -= 1;
                if end == start {
                    // Not reachable for ASCII (every printable char and the whitespace tokens
                    // exist), but stay lossless regardless.
                    out.push(u32::from(piece.as_bytes()[start]));
                    start += 1;
                    break;
                }
            }
        }
    }
}

/// `word` with its first letter upper-cased (ASCII).
fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// Character classes of the pre-tokenizer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    /// ASCII letters: runs form one piece.
    Letter,
    /// ASCII digits and punctuation: one piece per character.
    Single,
    /// Space, tab, newline: runs form one piece.
    Space,
    /// Everything else: byte fallback.
    Other,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'!'..=b'~' => Class::Single,
        b' ' | b'\t' | b'\n' => Class::Space,
        _ => Class::Other,
    }
}

impl Tokenizer for BuiltinTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        let bytes = text.as_bytes();
        let mut out = Vec::with_capacity(text.len() / 4 + 1);
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match class(b) {
                Class::Other => {
                    out.push(u32::from(b));
                    i += 1;
                }
                Class::Space => {
                    let mut end = i;
                    while end < bytes.len() && class(bytes[end]) == Class::Space {
                        end += 1;
                    }
                    // A final space before a letter, digit or punctuation goes with it.
                    let next_is_word = end < bytes.len()
                        && matches!(class(bytes[end]), Class::Letter | Class::Single);
                    let ws_end = if next_is_word && bytes[end - 1] == b' ' {
                        end - 1
                    } else {
                        end
                    };
                    let mut j = i;
                    while j < ws_end {
                        let mut k = ws_end.min(j + MAX_WHITESPACE_LEN);
                        while k > j + 1 && !self.ids.contains_key(&text[j..k]) {
                            k -= 1;
                        }
                        self.encode_greedy(&text[j..k], &mut out);
                        j = k;
                    }
                    i = ws_end;
                    if ws_end < end {
                        // The leading space of the next piece.
                        let piece_end = piece_end(bytes, end);
                        self.encode_piece(&text[i..piece_end], &mut out);
                        i = piece_end;
                    }
                }
                Class::Letter | Class::Single => {
                    let end = piece_end(bytes, i);
                    self.encode_piece(&text[i..end], &mut out);
                    i = end;
                }
            }
        }
        out
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 5);
        for &id in ids {
            if id < NUM_BYTE_TOKENS {
                bytes.push(id as u8);
            } else if let Some(text) = self.text_of(id) {
                bytes.extend_from_slice(text.as_bytes());
            } else if let Some(special) = SPECIAL_TOKENS.get((id - NUM_BYTE_TOKENS) as usize) {
                bytes.extend_from_slice(special.as_bytes());
            }
            // Ids beyond the vocabulary decode to nothing.
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    fn vocab_size(&self) -> usize {
        self.first_text_id as usize + self.texts.len()
    }

    fn special_token_id(&self, token: &str) -> Option<u32> {
        SPECIAL_TOKENS
            .iter()
            .position(|s| *s == token)
            .map(|i| NUM_BYTE_TOKENS + i as u32)
    }

    fn answer_words(&self) -> &AnswerWords {
        &self.answer_words
    }
}

/// End of the letter run or single character starting at `start` (which may be a leading space).
fn piece_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start;
    if bytes[i] == b' ' {
        i += 1;
    }
    match bytes.get(i).map(|&b| class(b)) {
        Some(Class::Letter) => {
            while i < bytes.len() && class(bytes[i]) == Class::Letter {
                i += 1;
            }
            i
        }
        Some(_) => i + 1,
        None => i,
    }
}

impl BuiltinTokenizer {
    /// Encodes one pre-tokenized piece: a whole-word token when there is one, else greedy.
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        match self.ids.get(piece) {
            Some(&id) => out.push(id),
            None => self.encode_greedy(piece, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn texts(tok: &BuiltinTokenizer, ids: &[u32]) -> Vec<String> {
        ids.iter().map(|&id| tok.decode(&[id])).collect()
    }

    #[test]
    fn words_carry_their_leading_space() {
        let tok = BuiltinTokenizer::new();
        let ids = tok.encode("lorem ipsum dolor, sit amet.\n\nThe end");
        assert_eq!(
            texts(&tok, &ids),
            ["lorem", " ipsum", " dolor", ",", " sit", " amet", ".", "\n\n", "The", " end"]
        );
    }

    #[test]
    fn unknown_words_digits_and_unicode_still_encode() {
        let tok = BuiltinTokenizer::new();
        let ids = tok.encode(" xyzzy 42 é");
        assert_eq!(tok.decode(&ids), " xyzzy 42 é");
        assert_eq!(
            texts(&tok, &ids)[..4],
            [" x".to_string(), "y".into(), "z".into(), "z".into()]
        );
        // "é" is two UTF-8 bytes: two byte-fallback tokens.
        assert!(ids[ids.len() - 2..].iter().all(|&id| id < NUM_BYTE_TOKENS));
    }

    #[test]
    fn special_strings_in_text_are_plain_text() {
        let tok = BuiltinTokenizer::new();
        let user = tok.special_token_id("<|user|>");
        assert_eq!(user, Some(NUM_BYTE_TOKENS + 3));
        let ids = tok.encode("<|user|>");
        assert!(ids.len() > 1);
        assert!(!ids.contains(&(NUM_BYTE_TOKENS + 3)));
        assert_eq!(tok.decode(&[NUM_BYTE_TOKENS + 3]), "<|user|>");
        assert_eq!(tok.special_token_id("<|nope|>"), None);
    }

    #[test]
    fn word_lists_are_lowercase_ascii() {
        for w in COMMON_WORDS
            .split_whitespace()
            .chain(LOREM_WORDS.iter().copied())
        {
            assert!(w.bytes().all(|b| b.is_ascii_lowercase()), "{w:?}");
        }
        let tok = BuiltinTokenizer::new();
        assert!(tok.vocab_size() > 4000, "{}", tok.vocab_size());
        assert!(tok.answer_words().continuation().len() > 1000);
    }

    /// Random strings over an alphabet heavy in the splitter's edge cases.
    fn random_string(rng: &mut ChaCha8Rng) -> String {
        const PIECES: &[&str] = &[
            " ", "  ", "   ", "\n", "\t", "\r\n", "a", "Z", "the", " lorem", "ipsum", ".", ",",
            "'", "7", "é", "日本", "🦀", "\u{0}", "\u{7f}", "<|user|>", "<think>", "ß", " \n ",
        ];
        let len = rng.gen_range(0..40);
        (0..len)
            .map(|_| {
                if rng.gen_bool(0.2) {
                    char::from_u32(rng.gen_range(0..0x11_0000))
                        .unwrap_or('x')
                        .to_string()
                } else {
                    PIECES[rng.gen_range(0..PIECES.len())].to_string()
                }
            })
            .collect()
    }

    #[test]
    fn decode_inverts_encode_on_random_strings() {
        let tok = BuiltinTokenizer::new();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..5000 {
            let s = random_string(&mut rng);
            let ids = tok.encode(&s);
            assert!(ids.iter().all(|&id| (id as usize) < tok.vocab_size()));
            assert!(ids.iter().all(|&id| tok.text_of(id).is_some() || id < 256));
            assert_eq!(tok.decode(&ids), s);
        }
    }
}
