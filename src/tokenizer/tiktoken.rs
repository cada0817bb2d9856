//! [`TiktokenTokenizer`]: OpenAI's byte-level BPE encodings (`cl100k_base`, `o200k_base`), embedded
//! in the binary by the `tiktoken-rs` crate. `o200k_base` is the default tokenizer: its counts are
//! close to those of the tokenizers load generators size prompts with (no file, no download).
//!
//! Measured on 128-token prompts (mean of 50; `client_prompts_are_counted_within_ten_percent`
//! checks the ones CI can reproduce): prose sized with DeepSeek-V3's or `cl100k_base`'s tokenizer
//! counts 126 tokens, text decoded from random `o200k_base` ids 131. Text decoded from random ids
//! of *another* vocabulary is full of that vocabulary's rare tokens, which no other tokenizer
//! matches: 183 for DeepSeek-V3 ids, 153 for `cl100k_base` ids; exact counts for such prompts
//! need the client's own `tokenizer.json`.
//!
//! Chat role markers are ChatML's `<|im_start|>` / `<|im_end|>` at the ids OpenAI's chat format
//! gives them (`100264`/`100265` after `cl100k_base`, `200264`/`200265` after `o200k_base`), so
//! the chat template is the ChatML family.
//!
//! Loading an encoding parses a few MB of embedded ranks: it happens once per process per
//! encoding ([`TiktokenTokenizer::new`] hands out clones of one shared instance), and the answer
//! words are computed at load time, so a server that holds one is fully warmed.
//!
//! Encoding splits the text with the encoding's pre-tokenizer pattern (written out by hand for
//! ASCII text, [`pretokenize`](super::pretokenize)) and encodes each piece on its own, as
//! tiktoken does; the ids of short one-token pieces are kept in a per-thread cache. The rank
//! table holds hundreds of thousands of entries, so looking a piece up there is a cache miss or
//! three, while the words of real prompts repeat: the cache's hot part stays in the CPU's cache.
//! Ids are those of tiktoken's own `encode` (a test compares both on random text).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use tiktoken_rs::CoreBPE;

use super::{pretokenize, AnswerWords, Tokenizer, TokenizerError};

/// At most this many continuation words are kept (lowest ids first: the most frequent merges).
const MAX_CONTINUATION_WORDS: usize = 4096;
/// At most this many initial words are kept.
const MAX_INITIAL_WORDS: usize = 1024;

/// Pieces of at most this many bytes that are one token have their id cached (most words).
const MAX_CACHED_PIECE_LEN: usize = 15;
/// A thread's cache of one encoding is emptied when it reaches this many pieces (bounded memory).
const MAX_CACHED_PIECES: usize = 1 << 15;

/// `cl100k_base`'s pre-tokenizer pattern, as tiktoken defines it.
const CL100K_BASE_PAT_STR: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+",
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
);

/// A short piece's bytes, zero-padded, with its length: a cache key held inline, so a lookup
/// reads one table slot and nothing behind a pointer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PieceKey {
    len: u8,
    bytes: [u8; MAX_CACHED_PIECE_LEN],
}

impl PieceKey {
    /// The key of `piece`, `None` for pieces too long to cache.
    fn new(piece: &str) -> Option<PieceKey> {
        let mut bytes = [0u8; MAX_CACHED_PIECE_LEN];
        bytes
            .get_mut(..piece.len())?
            .copy_from_slice(piece.as_bytes());
        Some(PieceKey {
            len: piece.len() as u8,
            bytes,
        })
    }
}

/// A one-token piece → its id.
type PieceCache = FxHashMap<PieceKey, u32>;

thread_local! {
    /// Each thread's piece cache, one per encoding ([`TiktokenEncoding::index`]).
    static PIECE_IDS: RefCell<[PieceCache; 2]> = RefCell::default();
}

/// One of the OpenAI encodings that `tiktoken-rs` embeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TiktokenEncoding {
    /// GPT-4 and GPT-3.5's 100k vocabulary (Llama 3's first 100k tokens are the same).
    Cl100kBase,
    /// GPT-4o's 200k vocabulary (better coverage of non-English text).
    O200kBase,
}

impl TiktokenEncoding {
    /// The encoding's name as OpenAI spells it (also accepted by `--tokenizer`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            TiktokenEncoding::Cl100kBase => "cl100k_base",
            TiktokenEncoding::O200kBase => "o200k_base",
        }
    }

    /// The encoding called `name`, `None` for any other name.
    pub(crate) fn from_name(name: &str) -> Option<TiktokenEncoding> {
        [TiktokenEncoding::Cl100kBase, TiktokenEncoding::O200kBase]
            .into_iter()
            .find(|e| e.name() == name)
    }

    /// Special tokens beyond the ranks: the encoding's own, then the ChatML markers of OpenAI's
    /// chat format (ids in ascending order).
    fn special_tokens(self) -> &'static [(&'static str, u32)] {
        match self {
            TiktokenEncoding::Cl100kBase => &[
                ("<|endoftext|>", 100_257),
                ("<|fim_prefix|>", 100_258),
                ("<|fim_middle|>", 100_259),
                ("<|fim_suffix|>", 100_260),
                ("<|im_start|>", 100_264),
                ("<|im_end|>", 100_265),
                ("<|endofprompt|>", 100_276),
            ],
            TiktokenEncoding::O200kBase => &[
                ("<|endoftext|>", 199_999),
                ("<|endofprompt|>", 200_018),
                ("<|im_start|>", 200_264),
                ("<|im_end|>", 200_265),
            ],
        }
    }

    /// This encoding's slot in per-encoding tables.
    fn index(self) -> usize {
        match self {
            TiktokenEncoding::Cl100kBase => 0,
            TiktokenEncoding::O200kBase => 1,
        }
    }

    /// The pre-tokenizer pattern that splits text into pieces.
    pub(crate) fn pattern(self) -> &'static str {
        match self {
            TiktokenEncoding::Cl100kBase => CL100K_BASE_PAT_STR,
            TiktokenEncoding::O200kBase => tiktoken_rs::O200K_BASE_PAT_STR,
        }
    }

    /// Number of ordinary (rank) tokens: ids `0..num_ranks`.
    fn num_ranks(self) -> u32 {
        match self {
            TiktokenEncoding::Cl100kBase => 100_256,
            TiktokenEncoding::O200kBase => 199_998,
        }
    }

    /// The shared instance of this encoding, loaded on first use.
    fn shared(self) -> Result<Arc<Inner>, TokenizerError> {
        static CL100K: OnceLock<Arc<Inner>> = OnceLock::new();
        static O200K: OnceLock<Arc<Inner>> = OnceLock::new();
        let cell = match self {
            TiktokenEncoding::Cl100kBase => &CL100K,
            TiktokenEncoding::O200kBase => &O200K,
        };
        if let Some(inner) = cell.get() {
            return Ok(inner.clone());
        }
        // Two threads may both load on a race; the first stored wins and both are equal.
        let inner = Arc::new(Inner::load(self)?);
        Ok(cell.get_or_init(|| inner).clone())
    }
}

/// An OpenAI encoding behind the [`Tokenizer`] trait (cheap to clone: one shared instance).
#[derive(Clone)]
pub struct TiktokenTokenizer {
    /// The loaded encoding, shared by every clone in the process.
    inner: Arc<Inner>,
}

/// What a loaded encoding holds.
struct Inner {
    /// Which encoding this is.
    encoding: TiktokenEncoding,
    /// The BPE ranks and pre-tokenizer regex.
    bpe: CoreBPE,
    /// The pre-tokenizer alone: text to pieces.
    pieces: Regex,
    /// Round-tripping answer words, computed at load.
    answer_words: AnswerWords,
}

impl std::fmt::Debug for TiktokenTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiktokenTokenizer")
            .field("encoding", &self.inner.encoding)
            .finish_non_exhaustive()
    }
}

impl TiktokenTokenizer {
    /// The process-wide instance of `encoding`, loaded (and its answer words computed) on the
    /// first call; later calls clone it.
    pub fn new(encoding: TiktokenEncoding) -> Result<TiktokenTokenizer, TokenizerError> {
        Ok(TiktokenTokenizer {
            inner: encoding.shared()?,
        })
    }

    /// Which encoding this is.
    pub fn encoding(&self) -> TiktokenEncoding {
        self.inner.encoding
    }
}

impl Inner {
    fn load(encoding: TiktokenEncoding) -> Result<Inner, TokenizerError> {
        let bpe = match encoding {
            TiktokenEncoding::Cl100kBase => tiktoken_rs::cl100k_base(),
            TiktokenEncoding::O200kBase => tiktoken_rs::o200k_base(),
        }
        .map_err(|e| TokenizerError::Embedded {
            name: encoding.name(),
            message: e.to_string(),
        })?;
        let pieces = Regex::new(encoding.pattern()).map_err(|e| TokenizerError::Embedded {
            name: encoding.name(),
            message: e.to_string(),
        })?;
        let mut inner = Inner {
            encoding,
            bpe,
            pieces,
            answer_words: AnswerWords::default(),
        };
        inner.answer_words = inner.compute_answer_words();
        Ok(inner)
    }

    /// `text`'s ids: each piece of the pre-tokenizer's split, from this thread's cache or
    /// encoded and cached.
    fn encode(&self, text: &str) -> Vec<u32> {
        let cached = PIECE_IDS.try_with(|cell| {
            let mut caches = cell.borrow_mut();
            let cache = &mut caches[self.encoding.index()];
            let mut ids = Vec::with_capacity(text.len() / 4 + 1);
            self.for_each_piece(text, |piece| {
                let key = PieceKey::new(piece);
                if let Some(&id) = key.as_ref().and_then(|k| cache.get(k)) {
                    ids.push(id);
                    return Some(());
                }
                let piece_ids = self.encode_piece(piece)?;
                if let (Some(key), &[id]) = (key, piece_ids.as_slice()) {
                    if cache.len() >= MAX_CACHED_PIECES {
                        cache.clear();
                    }
                    cache.insert(key, id);
                }
                ids.extend_from_slice(&piece_ids);
                Some(())
            })?;
            Some(ids)
        });
        match cached {
            Ok(Some(ids)) => ids,
            // A thread being torn down has no cache: encode directly.
            Err(_) => self
                .encode_piece(text)
                .unwrap_or_else(|| self.encode_by_chars(text)),
            Ok(None) => self.encode_by_chars(text),
        }
    }

    /// Calls `f` on each piece of `text` in order (the hand-written split for ASCII text, the
    /// pattern otherwise); `None` if the pattern fails (its backtracking limit) or `f` does.
    fn for_each_piece<'t>(
        &self,
        text: &'t str,
        mut f: impl FnMut(&'t str) -> Option<()>,
    ) -> Option<()> {
        if text.is_ascii() {
            let piece_end = match self.encoding {
                TiktokenEncoding::Cl100kBase => pretokenize::cl100k_piece_end,
                TiktokenEncoding::O200kBase => pretokenize::o200k_piece_end,
            };
            let bytes = text.as_bytes();
            let mut start = 0;
            while start < bytes.len() {
                let end = piece_end(bytes, start);
                f(text.get(start..end)?)?;
                start = end;
            }
            return Some(());
        }
        for piece in self.pieces.find_iter(text) {
            f(piece.ok()?.as_str())?;
        }
        Some(())
    }

    /// tiktoken's ids of `text` (no special tokens), `None` on a regex error (a backtracking
    /// limit on pathological input; `encode_ordinary` would panic there).
    fn encode_piece(&self, text: &str) -> Option<Vec<u32>> {
        self.bpe
            .encode(text, &Default::default())
            .ok()
            .map(|(ids, _)| ids)
    }

    /// The ids of `text` one character at a time: the fallback for input the pre-tokenizer
    /// cannot split within its backtracking limit.
    fn encode_by_chars(&self, text: &str) -> Vec<u32> {
        text.chars()
            .flat_map(|c| {
                let mut buf = [0u8; 4];
                self.encode_piece(c.encode_utf8(&mut buf))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Bytes of one id, `None` for ids outside the vocabulary.
    fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        if let Some((text, _)) = self
            .encoding
            .special_tokens()
            .iter()
            .find(|(_, sid)| *sid == id)
        {
            return Some(text.as_bytes().to_vec());
        }
        if id >= self.encoding.num_ranks() {
            return None;
        }
        self.bpe.decode_bytes(&[id]).ok()
    }

    /// Round-trip checked answer words, scanning ids in increasing order (deterministic).
    fn compute_answer_words(&self) -> AnswerWords {
        let round_trips = |ids: &[u32]| {
            let bytes: Vec<u8> = ids
                .iter()
                .filter_map(|&id| self.token_bytes(id))
                .flatten()
                .collect();
            String::from_utf8(bytes).is_ok_and(|text| self.encode(&text) == ids)
        };
        let num_ranks = self.encoding.num_ranks();
        let mut continuation = Vec::new();
        let mut initial_candidates = Vec::new();
        for id in 0..num_ranks {
            if continuation.len() >= MAX_CONTINUATION_WORDS
                && initial_candidates.len() >= MAX_INITIAL_WORDS
            {
                break;
            }
            let Some(bytes) = self.token_bytes(id) else {
                continue;
            };
            if let Some(word) = bytes.strip_prefix(b" ") {
                if continuation.len() < MAX_CONTINUATION_WORDS
                    && is_word(word)
                    && round_trips(&[id, id])
                {
                    continuation.push(id);
                }
            } else if initial_candidates.len() < MAX_INITIAL_WORDS
                && is_word(&bytes)
                && bytes[0].is_ascii_uppercase()
                && bytes[1..].iter().all(u8::is_ascii_lowercase)
            {
                initial_candidates.push(id);
            }
        }
        let initial = match continuation.first() {
            Some(&next) => initial_candidates
                .into_iter()
                .filter(|&id| round_trips(&[id, next]))
                .collect(),
            None => Vec::new(),
        };
        AnswerWords::new(initial, continuation)
    }
}

/// Two or more ASCII letters.
fn is_word(s: &[u8]) -> bool {
    s.len() >= 2 && s.iter().all(u8::is_ascii_alphabetic)
}

impl Tokenizer for TiktokenTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.inner.encode(text)
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 5);
        for &id in ids {
            if let Some(b) = self.inner.token_bytes(id) {
                bytes.extend_from_slice(&b);
            }
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    fn vocab_size(&self) -> usize {
        let specials = self.inner.encoding.special_tokens();
        specials
            .iter()
            .map(|&(_, id)| id as usize + 1)
            .max()
            .unwrap_or(0)
    }

    fn special_token_id(&self, token: &str) -> Option<u32> {
        self.inner
            .encoding
            .special_tokens()
            .iter()
            .find(|(text, _)| *text == token)
            .map(|&(_, id)| id)
    }

    fn answer_words(&self) -> &AnswerWords {
        &self.inner.answer_words
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::chat::render_chat;
    use crate::tokenizer::tests::check_answer_words_round_trip;
    use crate::tokenizer::{ChatMessage, ChatTemplate, HfTokenizer, TemplateFamily};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::path::Path;

    fn tok(encoding: TiktokenEncoding) -> TiktokenTokenizer {
        match TiktokenTokenizer::new(encoding) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn cl100k_matches_openai_ids() {
        let t = tok(TiktokenEncoding::Cl100kBase);
        // tiktoken: enc.encode("hello world") == [15339, 1917].
        assert_eq!(t.encode("hello world"), [15339, 1917]);
        assert_eq!(t.decode(&[15339, 1917]), "hello world");
        assert_eq!(t.vocab_size(), 100_277);
    }

    #[test]
    fn special_strings_in_text_are_plain_text() {
        for encoding in [TiktokenEncoding::Cl100kBase, TiktokenEncoding::O200kBase] {
            let t = tok(encoding);
            let start = t.special_token_id("<|im_start|>");
            assert!(start.is_some());
            let ids = t.encode("<|im_start|><|endoftext|>");
            assert!(ids.len() > 2);
            assert!(!ids.iter().any(|&id| Some(id) == start));
            assert_eq!(t.decode(&ids), "<|im_start|><|endoftext|>");
            assert_eq!(
                t.decode(&start.into_iter().collect::<Vec<_>>()),
                "<|im_start|>"
            );
            assert_eq!(t.special_token_id("<|nope|>"), None);
            // Ids outside the vocabulary decode to nothing.
            assert_eq!(t.decode(&[u32::MAX, t.vocab_size() as u32]), "");
        }
    }

    #[test]
    fn chat_template_is_chatml() {
        let t = tok(TiktokenEncoding::Cl100kBase);
        assert_eq!(
            ChatTemplate::for_tokenizer(&t).family(),
            TemplateFamily::ChatMl
        );
        let ids = render_chat(&t, &[ChatMessage::user("Hello there")], true);
        assert_eq!(
            t.decode(&ids),
            "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn answer_words_round_trip() {
        for encoding in [TiktokenEncoding::Cl100kBase, TiktokenEncoding::O200kBase] {
            let t = tok(encoding);
            assert!(t.answer_words().continuation().len() >= 1000);
            assert!(t.answer_words().initial().len() >= 200);
            check_answer_words_round_trip(&t, 100);
        }
    }

    /// Prose for prompts built the way genai-perf and aiperf build them: a window of a corpus's
    /// token ids, decoded.
    const PROSE: &str = include_str!("../../fixtures/tokenizer/prose.txt");

    /// Mean count by `server` of 50 prompts of `n` tokens of `client`, made by `make`.
    fn mean_count(
        client: &dyn Tokenizer,
        server: &dyn Tokenizer,
        n: usize,
        make: impl Fn(&dyn Tokenizer, &mut ChaCha8Rng, usize) -> String,
    ) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let total: usize = (0..50)
            .map(|_| server.encode(&make(client, &mut rng, n)).len())
            .sum();
        total as f64 / 50.0
    }

    /// `n` random ids below `max_id`, decoded (vLLM's and inference-perf's random prompts).
    fn random_ids(max_id: u32) -> impl Fn(&dyn Tokenizer, &mut ChaCha8Rng, usize) -> String {
        move |client, rng, n| {
            let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..max_id)).collect();
            client.decode(&ids)
        }
    }

    /// A random window of `n` ids of [`PROSE`], decoded.
    fn prose(client: &dyn Tokenizer, rng: &mut ChaCha8Rng, n: usize) -> String {
        let ids = client.encode(PROSE);
        let start = rng.gen_range(0..ids.len() - n);
        client.decode(&ids[start..start + n])
    }

    #[test]
    fn client_prompts_are_counted_within_ten_percent() {
        let server = match crate::tokenizer::default_tokenizer() {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let cl100k = tok(TiktokenEncoding::Cl100kBase);
        let o200k = tok(TiktokenEncoding::O200kBase);
        let within = |count: f64, what: &str| {
            assert!((115.2..=140.8).contains(&count), "{what}: {count}");
        };
        within(
            mean_count(&o200k, &server, 128, random_ids(199_998)),
            "o200k random ids",
        );
        within(mean_count(&cl100k, &server, 128, prose), "cl100k prose");
        within(mean_count(&o200k, &server, 128, prose), "o200k prose");
        // The word-level builtin tokenizer, for contrast, is far off.
        let builtin = crate::tokenizer::BuiltinTokenizer::new();
        assert!(mean_count(&cl100k, &builtin, 128, prose) > 180.0);

        let deepseek = Path::new("/work/peers/tokenizer/deepseek-v3-tok/tokenizer.json");
        if deepseek.exists() {
            let client = match HfTokenizer::from_file(deepseek) {
                Ok(t) => t,
                Err(e) => panic!("{e}"),
            };
            within(
                mean_count(&client, &server, 128, prose),
                "DeepSeek-V3 prose",
            );
            // Another vocabulary's rare tokens: documented, bounded loosely.
            let random = mean_count(&client, &server, 128, random_ids(128_000));
            assert!(
                (128.0..=220.0).contains(&random),
                "DeepSeek-V3 random ids: {random}"
            );
        }
    }

    /// Random text of the kinds pre-tokenizers split differently: words, contractions, digit
    /// runs, punctuation, every whitespace mix, letters with marks, CJK, emoji, special strings.
    fn random_text(rng: &mut ChaCha8Rng) -> String {
        const PARTS: &[&str] = &[
            "hello",
            " world",
            "World",
            "HTTP",
            "x",
            "'s",
            "'LL",
            "'re",
            "don't",
            "0",
            "12",
            "123456",
            " ",
            "  ",
            "   ",
            "\t",
            "\n",
            "\r\n",
            " \n ",
            "\n\n",
            "!",
            "?!",
            " ...",
            ",",
            "/",
            "//",
            " (",
            ")\n",
            "é",
            "e\u{301}",
            "日本語",
            "🦀",
            "\u{a0}",
            "Ǆ",
            "<|im_start|>",
            "<|endoftext|>",
            "a/b",
            "-",
            "_",
            "$1.5",
            "ÀÉÎ",
        ];
        let n = rng.gen_range(0..40);
        (0..n)
            .map(|_| PARTS[rng.gen_range(0..PARTS.len())])
            .collect()
    }

    #[test]
    fn cached_pieces_give_tiktokens_own_ids() {
        for encoding in [TiktokenEncoding::Cl100kBase, TiktokenEncoding::O200kBase] {
            let t = tok(encoding);
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            for _ in 0..3000 {
                let text = random_text(&mut rng);
                let expected = t.inner.encode_piece(&text).expect("no regex error");
                // Twice: the second time every short piece comes from the cache.
                assert_eq!(t.encode(&text), expected, "{encoding:?}: {text:?}");
                assert_eq!(t.encode(&text), expected, "{encoding:?}: {text:?}");
            }
            // Every short sequence of the parts where splits depend on what follows.
            const EDGES: &[&str] = &[
                "\n", " ", "  ", "\r\n", "\t", "a", "Ab", "1", "!", "'s", "é", "\u{a0}",
            ];
            for a in EDGES {
                for b in EDGES {
                    for c in EDGES {
                        let text = format!("{a}{b}{c}");
                        let expected = t.inner.encode_piece(&text).expect("no regex error");
                        assert_eq!(t.encode(&text), expected, "{encoding:?}: {text:?}");
                    }
                }
            }
            // A long prompt of prose, whose words repeat.
            assert_eq!(
                t.encode(PROSE),
                t.inner.encode_piece(PROSE).expect("no regex error")
            );
        }
    }

    #[test]
    fn piece_cache_stays_bounded() {
        let t = tok(TiktokenEncoding::O200kBase);
        let index = TiktokenEncoding::O200kBase.index();
        let cached = || PIECE_IDS.with(|c| c.borrow()[index].len());
        // Every id's text on its own: enough distinct one-token pieces to fill the cache.
        let (mut peak, mut cleared) = (0, false);
        for id in 0..t.inner.encoding.num_ranks() {
            let text = t.decode(&[id]);
            assert_eq!(
                t.encode(&text),
                t.inner.encode_piece(&text).unwrap_or_default()
            );
            let len = cached();
            assert!(len <= MAX_CACHED_PIECES, "{len}");
            cleared |= len < peak;
            peak = peak.max(len);
            if cleared {
                break;
            }
        }
        assert!(cleared && peak == MAX_CACHED_PIECES, "peak {peak}");
        // Pieces longer than the limit are encoded but not kept.
        assert!(PieceKey::new(&" w".repeat(MAX_CACHED_PIECE_LEN)).is_none());
        // Keys of pieces that differ only in trailing NUL bytes differ.
        assert!(PieceKey::new("\0") != PieceKey::new("\0\0"));
    }

    #[test]
    fn text_round_trips_and_clones_share_one_instance() {
        let t = tok(TiktokenEncoding::O200kBase);
        for s in [
            "",
            "a b  c\n\nd",
            "unicode é 日本 🦀",
            "   \n\t  x",
            "<think>hm</think>",
        ] {
            assert_eq!(t.decode(&t.encode(s)), s);
        }
        let u = tok(TiktokenEncoding::O200kBase);
        assert!(Arc::ptr_eq(&t.inner, &u.inner));
        assert_eq!(
            TiktokenEncoding::from_name("o200k_base"),
            Some(TiktokenEncoding::O200kBase)
        );
        assert_eq!(TiktokenEncoding::from_name("gpt2"), None);
    }
}
