//! The work budget of one request: what a request may cost the server (CPU and memory) is
//! proportional to its token limits and its size on the wire. Each cap is a named constant here;
//! beyond one, the request is a 400 `invalid_request_error` naming the parameter (`param`) with
//! a message that states the cap.
//!
//! Stop strings are then matched against the new text of each token plus a window of the
//! longest stop's length (`super::answer`), JSON answers stop growing once they are past what
//! the output limit can show (`super::schema`), and the answers of a large request are planned
//! off the runtime's worker threads, stopping when the client leaves or the server shuts down.

use super::error::ApiError;

/// Prompt text (bytes) beyond which tokenizing is moved off the runtime's worker threads.
pub(crate) const INLINE_TEXT_BYTES: usize = 64 << 10;

/// Output tokens a request plans beyond which planning is moved off the runtime's worker
/// threads.
pub(crate) const INLINE_PLAN_TOKENS: usize = 16 << 10;

/// Runs `work` on tokio's blocking pool when `heavy` (so the runtime's worker threads keep
/// answering other requests, `/health` among them), else at once.
pub(crate) async fn off_runtime<T: Send + 'static>(
    heavy: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    if !heavy {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError {
            status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            message: format!("Preparing the request failed: {e}"),
            kind: "server_error",
            param: None,
            code: None,
        })
}

/// Estimated memory of a request body per byte while it is read, parsed and handled: the bytes,
/// the parsed value (a string is its bytes again; an array of token ids is 32 bytes an id, 4 to
/// 16 times its text) and the handler's copies. Reserved in the server's in-flight budget
/// (`--max-inflight-bytes`) as the body arrives.
pub const BODY_MEMORY_FACTOR: u64 = 4;

/// Estimated memory a prompt token costs a generation once, whatever its choices: its id in the
/// tokenizer's output or the parsed body, and the prompt the handler keeps.
pub const PROMPT_TOKEN_BYTES: u64 = 40;

/// Estimated memory a prompt token costs each choice: the engine request's copy of the prompt
/// and its block hashes (measured: 13 bytes).
pub const CHOICE_PROMPT_TOKEN_BYTES: u64 = 16;

/// Estimated memory of one planned output token: its id, its text piece, its engine output
/// and its share of the response (measured on a debug build: 225 to 330 bytes a token for
/// 400,000 to 800,000 planned tokens of `ignore_eos` answers, whole or streamed).
pub const OUTPUT_TOKEN_BYTES: u64 = 320;

/// Estimated memory of one log-probability entry (a token or an alternative): its text and
/// value, planned, and its JSON (measured: about 110 bytes in a whole response of 252,000).
pub const LOGPROB_ENTRY_BYTES: u64 = 128;

/// Estimated memory of `/tokenize` per byte of text (ids, their JSON value and text), and per
/// byte with `return_token_strs` (each token's string, twice more).
pub const TOKENIZE_TEXT_BYTES: u64 = 12;
/// See [`TOKENIZE_TEXT_BYTES`]: with `return_token_strs`.
pub const TOKENIZE_STRS_TEXT_BYTES: u64 = 32;

/// Estimated memory of `/detokenize` per token id: the ids, the decoded text and its JSON.
pub const DETOKENIZE_ID_BYTES: u64 = 16;

/// The estimated memory of a body of `len` bytes ([`BODY_MEMORY_FACTOR`]).
pub(crate) fn body_bytes(len: usize) -> u64 {
    (len as u64).saturating_mul(BODY_MEMORY_FACTOR)
}

/// The estimated memory of a generation's work beyond its body: prompts of `prompt_tokens`
/// each with `n` choices, `output_tokens` planned over all choices, and with `top_logprobs`
/// alternatives per token when log-probabilities are asked for.
pub(crate) fn generation_bytes(
    prompt_tokens: impl Iterator<Item = usize>,
    n: usize,
    output_tokens: usize,
    top_logprobs: Option<usize>,
    echoed: usize,
) -> u64 {
    let per_prompt_token =
        PROMPT_TOKEN_BYTES.saturating_add(CHOICE_PROMPT_TOKEN_BYTES.saturating_mul(n as u64));
    let prompts = prompt_tokens.fold(0u64, |sum, t| {
        sum.saturating_add((t as u64).saturating_mul(per_prompt_token))
    });
    let output = output_tokens as u64;
    let entries = top_logprobs.map_or(0, |top| {
        output
            .saturating_add(echoed as u64)
            .saturating_mul(1 + top as u64)
    });
    prompts
        .saturating_add(output.saturating_mul(OUTPUT_TOKEN_BYTES))
        .saturating_add(entries.saturating_mul(LOGPROB_ENTRY_BYTES))
}

/// Stop strings per request at most (`stop`). OpenAI accepts 4 and vLLM does not limit them;
/// 16 accepts every request OpenAI does and the longer lists some vLLM clients send, while
/// keeping the per-token matching to 16 short scans.
pub const MAX_STOPS: usize = 16;

/// Bytes (UTF-8) per stop string at most (`stop`): a stop is matched against the new text and
/// the last `MAX_STOP_BYTES - 1` bytes before it, so this bounds the window.
pub const MAX_STOP_BYTES: usize = 1024;

/// Stop token ids per request at most (`stop_token_ids`); each output token is compared with
/// every one of them.
pub const MAX_STOP_TOKEN_IDS: usize = 128;

/// Prompts in one `/v1/completions` batch at most (`prompt`).
pub const MAX_PROMPTS: usize = 20_000;

/// Choices of one request at most, prompts × `n` (`n`): each is an engine request of its own.
pub const MAX_CHOICES: usize = 20_000;

/// Output tokens one request may plan at most, summed over its choices (`max_tokens`): every
/// answer is planned token by token before the engine runs it.
pub const MAX_OUTPUT_TOKENS: usize = 1 << 20;

/// Log-probability entries one request may ask for at most (`top_logprobs` on chat, `logprobs`
/// on completions): the output limits of its choices summed, times 1 + the alternatives per
/// token. Answers carry their log-probabilities from the start, streamed or not; a whole
/// response of this many entries is about 12 MB of JSON (`n` 4 x 3,000 tokens x 20
/// alternatives fits; `n` 16 x 2,000 x 20 does not).
pub const MAX_LOGPROB_ENTRIES: usize = 1 << 18;

/// Bytes one word of prompt text may hold at most: a run of letters, of white space or of other
/// symbols, which a byte-pair tokenizer takes as one piece and merges in time that grows with the
/// square of its length. Real text has no such words (digits split every three, and URLs and
/// base64 split at their punctuation); a 64 KiB word tokenizes in well under a second.
pub const MAX_WORD_BYTES: usize = 64 << 10;

/// Coordinates of an embedding (`/v1/embeddings`), the model's dimension: the default and the
/// largest `dimensions` accepted (as OpenAI, `dimensions` only shortens a vector). 1024, as the
/// common open embedding models (BGE-large, E5-large, multilingual-e5, mxbai-embed-large).
pub const EMBEDDING_DIM: usize = 1024;

/// Inputs of one `/v1/embeddings` request at most (`input`), OpenAI's limit: each is an engine
/// request of its own.
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// Tokens of one `/v1/embeddings` request at most, summed over its inputs (`input`), OpenAI's
/// limit: each token's pseudo-random vector is drawn for every coordinate. A response holds at
/// most `MAX_EMBEDDING_INPUTS` × [`EMBEDDING_DIM`] numbers (about 25 MB of JSON, 11 MB of
/// base64).
pub const MAX_EMBEDDING_TOKENS: usize = 300_000;

/// Which run of text a character continues: the pre-tokenizers of the BPE encodings split
/// words at changes between these.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CharClass {
    Letter,
    Space,
    Digit,
    Other,
}

fn char_class(c: char) -> CharClass {
    if c.is_alphabetic() {
        CharClass::Letter
    } else if c.is_whitespace() {
        CharClass::Space
    } else if c.is_numeric() {
        CharClass::Digit
    } else {
        CharClass::Other
    }
}

/// [`char_class`] of each ASCII character, so that ASCII text is classified a byte at a time.
static ASCII_CLASSES: std::sync::LazyLock<[CharClass; 128]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|b| char_class(char::from(b as u8))));

/// Checks that no word of `text` (a run of one class of characters, digits aside) is longer
/// than [`MAX_WORD_BYTES`]: a 400 naming `param` otherwise. One pass over the text, none for a
/// text that is no longer than a word may be; ASCII characters are classified from a table.
pub(crate) fn check_word_lengths(text: &str, param: &str) -> Result<(), ApiError> {
    if text.len() <= MAX_WORD_BYTES {
        return Ok(());
    }
    let ascii = &*ASCII_CLASSES;
    let bytes = text.as_bytes();
    let mut class = None;
    let mut run = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let (this, len) = if b.is_ascii() {
            (ascii[usize::from(b)], 1)
        } else {
            // `i` is on a character boundary: every step moves by a whole character.
            let c = text[i..]
                .chars()
                .next()
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            (char_class(c), c.len_utf8())
        };
        i += len;
        if class == Some(this) {
            run += len;
        } else {
            class = Some(this);
            run = len;
        }
        if this != CharClass::Digit && run > MAX_WORD_BYTES {
            return Err(exceeded(
                param,
                format!("the text holds a word (a run of letters, spaces or symbols) of over {MAX_WORD_BYTES} bytes"),
                format!("{MAX_WORD_BYTES} bytes per word"),
            ));
        }
    }
    Ok(())
}

/// A 400 for a parameter beyond its cap: `what` says what was asked, `cap` what is allowed.
pub fn exceeded(
    param: &str,
    what: impl std::fmt::Display,
    cap: impl std::fmt::Display,
) -> ApiError {
    ApiError::invalid(
        format!("Invalid '{param}': {what}; at most {cap} are accepted."),
        Some(param),
    )
    .with_code("request_too_large")
}

/// Checks that every id is in the vocabulary (`0..vocab_size`): a 400 naming `param` for the
/// first that is not, as vLLM answers.
pub(crate) fn check_token_ids(ids: &[u32], vocab_size: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        None => Ok(()),
        Some(id) => Err(ApiError::invalid(
            format!(
                "Invalid '{param}': token id {id} is out of vocabulary (the vocabulary has \
                 {vocab_size} tokens, ids 0 to {}).",
                vocab_size.saturating_sub(1)
            ),
            Some(param),
        )),
    }
}

/// The work one request plans, checked against the caps above: `limits` holds each prompt's
/// output limit, `n` the choices per prompt, `top_logprobs` the alternatives per token when
/// log-probabilities are asked for, under the name `logprobs_param`; `echoed` counts the prompt
/// tokens whose log-probabilities the choices carry too (completions `echo`, summed over
/// choices).
pub(crate) fn check_plan(
    limits: &[usize],
    n: usize,
    top_logprobs: Option<usize>,
    logprobs_param: &str,
    echoed: usize,
) -> Result<(), ApiError> {
    let choices = limits.len().saturating_mul(n);
    if choices > MAX_CHOICES {
        return Err(exceeded(
            "n",
            format!(
                "{} prompts × {n} choices make {choices} choices",
                limits.len()
            ),
            format!("{MAX_CHOICES} choices per request"),
        ));
    }
    let tokens = limits
        .iter()
        .fold(0usize, |sum, &l| sum.saturating_add(l.saturating_mul(n)));
    if tokens > MAX_OUTPUT_TOKENS {
        return Err(exceeded(
            "max_tokens",
            format!(
                "the output limits of the request's {choices} choices add up to {tokens} tokens"
            ),
            format!("{MAX_OUTPUT_TOKENS} output tokens per request"),
        ));
    }
    if let Some(top) = top_logprobs {
        let entries = tokens.saturating_add(echoed).saturating_mul(1 + top);
        if entries > MAX_LOGPROB_ENTRIES {
            let echoed = if echoed > 0 {
                format!(" and {echoed} echoed prompt tokens")
            } else {
                String::new()
            };
            return Err(exceeded(
                logprobs_param,
                format!(
                    "{tokens} output tokens{echoed} × (1 + {top} alternatives) make {entries} \
                     log-probability entries"
                ),
                format!("{MAX_LOGPROB_ENTRIES} entries per request"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word check one character at a time, as it was before the ASCII table.
    fn longest_word_fits(text: &str) -> bool {
        let mut class = None;
        let mut run = 0usize;
        for c in text.chars() {
            let this = char_class(c);
            if class == Some(this) {
                run += c.len_utf8();
            } else {
                class = Some(this);
                run = c.len_utf8();
            }
            if this != CharClass::Digit && run > MAX_WORD_BYTES {
                return false;
            }
        }
        true
    }

    /// The table-driven check decides as the character-at-a-time one: runs of ASCII letters,
    /// spaces (a vertical tab among them), symbols and digits, and runs with multi-byte
    /// characters in them, each at the cap and one byte over it.
    #[test]
    fn word_check_matches_the_character_classes() {
        let cap = MAX_WORD_BYTES;
        let texts = [
            "a".repeat(cap),
            "a".repeat(cap + 1),
            format!("x {}", "b".repeat(cap)),
            format!("x {}", "b".repeat(cap + 1)),
            " \t\x0b".repeat(cap / 3 + 1),
            "~".repeat(cap + 1),
            "7".repeat(cap + 5),
            format!("{}é", "a".repeat(cap - 2)),
            format!("{}é", "a".repeat(cap - 1)),
            format!("{}\u{3000}", " ".repeat(cap - 3)),
            format!("{}\u{3000}", " ".repeat(cap - 2)),
            "ab ".repeat(cap),
            "é!".repeat(cap),
        ];
        for text in &texts {
            assert_eq!(
                check_word_lengths(text, "prompt").is_ok(),
                longest_word_fits(text),
                "{} bytes starting {:?}",
                text.len(),
                &text.chars().take(4).collect::<String>()
            );
        }
        assert!(check_word_lengths(&"a".repeat(cap + 1), "prompt").is_err());
        assert!(check_word_lengths(&"ab ".repeat(cap), "prompt").is_ok());
    }

    #[test]
    fn plans_beyond_a_cap_name_its_parameter() {
        assert_eq!(
            check_plan(&[3000; 4], 1, Some(20), "top_logprobs", 0),
            Ok(())
        );
        let e = check_plan(&[2000; 16], 1, Some(20), "top_logprobs", 0).expect_err("too many");
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        assert!(e.message.contains("262144 entries"), "{}", e.message);
        let e = check_plan(&[1; 20_001], 1, None, "logprobs", 0).expect_err("too many");
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = check_plan(&[1 << 20, 1], 1, None, "logprobs", 0).expect_err("too many");
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(check_plan(&[1; 20_000], 1, None, "logprobs", 0), Ok(()));
        // Echoed prompt tokens carry log-probabilities too.
        assert_eq!(check_plan(&[100], 1, Some(20), "logprobs", 12_000), Ok(()));
        let e = check_plan(&[100], 1, Some(20), "logprobs", 13_000).expect_err("too many");
        assert!(
            e.message.contains("13000 echoed prompt tokens"),
            "{}",
            e.message
        );
        assert_eq!(check_token_ids(&[0, 9], 10, "prompt"), Ok(()));
        let e = check_token_ids(&[0, 10], 10, "prompt").expect_err("out of vocabulary");
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
