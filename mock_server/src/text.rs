//! Text <-> token ids at the HTTP edge: the [`TextCodec`] seam and a stand-in word codec.
//!
//! The server needs three things from a tokenizer: render a chat to prompt ids, pick answer ids
//! whose text re-tokenizes to the same ids (so the next turn hits the prefix cache), and decode
//! ids to text. [`WordCodec`] does this with whitespace-separated words until the engine's
//! built-in tokenizer lands; swapping it is a change to [`default_codec`] alone.

use std::sync::Arc;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Who wrote a chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// System prompt.
    System,
    /// Developer instructions (OpenAI's newer name for system).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool result.
    Tool,
}

impl Role {
    /// Parses an OpenAI role name.
    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }

    /// The OpenAI role name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One chat message, reduced to its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// The author.
    pub role: Role,
    /// The text content (text parts joined).
    pub content: String,
}

/// What the server needs from a tokenizer and chat template.
pub trait TextCodec: Send + Sync + std::fmt::Debug {
    /// Renders messages with the chat template; `add_generation_prompt` appends the assistant
    /// header that a reply starts from. Reasoning (`<think>…</think>`) in assistant history is
    /// dropped, as reasoning models' templates do.
    fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Vec<u32>;

    /// Tokenizes plain text (a `/v1/completions` prompt).
    fn encode(&self, text: &str) -> Vec<u32>;

    /// `n` answer token ids, each decoding to text that re-encodes to the same id.
    fn answer_tokens(&self, rng: &mut ChaCha8Rng, n: usize) -> Vec<u32>;

    /// The text of some token ids (concatenating per-token decodes gives the whole text).
    fn decode(&self, ids: &[u32]) -> String;
}

/// The codec the server uses unless told otherwise.
pub fn default_codec() -> Arc<dyn TextCodec> {
    Arc::new(WordCodec)
}

/// Stand-in tokenizer: one token per whitespace-separated word.
///
/// Answer words come from a fixed list and own ids `FIRST_WORD..`; any other word hashes into a
/// range above them. Each answer token decodes to the word plus a trailing space, so streamed
/// text splits back into the same ids.
#[derive(Clone, Copy, Debug, Default)]
pub struct WordCodec;

const IM_START: u32 = 1;
const IM_END: u32 = 2;
const ROLE_BASE: u32 = 10;
const FIRST_WORD: u32 = 100;
const HASHED_BASE: u32 = 1_000;
const HASHED_RANGE: u64 = 1 << 20;

/// Words an answer is made of.
const WORDS: &[&str] = &[
    "the",
    "model",
    "simulated",
    "engine",
    "answers",
    "with",
    "plausible",
    "words",
    "while",
    "tokens",
    "flow",
    "through",
    "a",
    "paged",
    "cache",
    "of",
    "blocks",
    "and",
    "every",
    "pass",
    "emits",
    "one",
    "more",
    "token",
    "for",
    "each",
    "running",
    "request",
    "so",
    "latency",
    "follows",
    "load",
    "prefix",
    "hits",
    "save",
    "prefill",
    "time",
    "on",
    "next",
    "turn",
    "router",
    "picks",
    "worker",
    "best",
    "overlap",
    "decode",
    "steps",
    "batch",
    "queue",
    "waits",
    "in",
    "line",
    "until",
    "memory",
    "frees",
    "up",
    "again",
    "is",
    "fast",
    "steady",
    "clear",
    "simple",
    "quiet",
    "ready",
];

fn role_token(role: Role) -> u32 {
    ROLE_BASE
        + match role {
            Role::System => 0,
            Role::Developer => 1,
            Role::User => 2,
            Role::Assistant => 3,
            Role::Tool => 4,
        }
}

fn word_id(word: &str) -> u32 {
    match WORDS.iter().position(|w| *w == word) {
        Some(i) => FIRST_WORD + i as u32,
        None => HASHED_BASE + (xxhash_rust::xxh3::xxh3_64(word.as_bytes()) % HASHED_RANGE) as u32,
    }
}

/// Assistant text without `<think>…</think>` blocks (an unclosed block drops the rest).
fn strip_reasoning(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("<think>") {
        out.push_str(&rest[..start]);
        match rest[start..].find("</think>") {
            Some(end) => rest = &rest[start + end + "</think>".len()..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

impl TextCodec for WordCodec {
    fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Vec<u32> {
        let mut ids = Vec::new();
        for m in messages {
            ids.push(IM_START);
            ids.push(role_token(m.role));
            if m.role == Role::Assistant {
                ids.extend(self.encode(&strip_reasoning(&m.content)));
            } else {
                ids.extend(self.encode(&m.content));
            }
            ids.push(IM_END);
        }
        if add_generation_prompt {
            ids.push(IM_START);
            ids.push(role_token(Role::Assistant));
        }
        ids
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        text.split_whitespace().map(word_id).collect()
    }

    fn answer_tokens(&self, rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| FIRST_WORD + rng.gen_range(0..WORDS.len() as u32))
            .collect()
    }

    fn decode(&self, ids: &[u32]) -> String {
        let mut s = String::new();
        for &id in ids {
            match id
                .checked_sub(FIRST_WORD)
                .and_then(|i| WORDS.get(i as usize))
            {
                Some(w) => s.push_str(w),
                None => s.push_str(&format!("<{id}>")),
            }
            s.push(' ');
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn answers_round_trip_and_extend_the_prompt() {
        let codec = WordCodec;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let answer = codec.answer_tokens(&mut rng, 50);
        let text = codec.decode(&answer);
        assert_eq!(codec.encode(&text), answer);

        let user = ChatMessage {
            role: Role::User,
            content: "hello there".into(),
        };
        let turn1 = codec.render_chat(std::slice::from_ref(&user), true);
        let history = vec![
            user,
            ChatMessage {
                role: Role::Assistant,
                content: format!("<think>hmm</think>{text}"),
            },
        ];
        let warm = codec.render_chat(&history, false);
        assert_eq!(&warm[..turn1.len()], &turn1[..]);
        assert_eq!(&warm[turn1.len()..warm.len() - 1], &answer[..]);
    }
}
