//! The chat template: messages -> prompt token ids, with role markers as special tokens and the
//! reasoning of earlier assistant turns dropped.
//!
//! Every message renders on its own as `prefix(role) ++ encode(content) ++ suffix(role)`, after an
//! optional BOS. Hence rendering a conversation is always a token prefix of rendering it with more
//! messages appended, and a generation prompt (`prefix(assistant)`) followed by the answer's ids
//! is a prefix of the conversation with that answer appended (when the answer's ids round-trip,
//! as [`AnswerWords`](super::AnswerWords) guarantee). That is what lets speculative prefill and
//! multi-turn prefix caching hit.

use serde::{Deserialize, Serialize};

use super::Tokenizer;

/// Author of a chat message (the OpenAI roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the whole conversation.
    System,
    /// The human turn.
    User,
    /// The model turn.
    Assistant,
    /// A tool's result.
    Tool,
    /// OpenAI's successor of `system` for reasoning models.
    Developer,
}

impl Role {
    /// All roles, in the order of [`Role::index`].
    const ALL: [Role; 5] = [
        Role::System,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::Developer,
    ];

    /// Position in per-role tables.
    fn index(self) -> usize {
        self as usize
    }

    /// Name as in the OpenAI API.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Developer => "developer",
        }
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub(crate) role: Role,
    /// Its text; for assistant messages a leading `<think>...</think>` block is not rendered.
    pub content: String,
    /// Reasoning returned separately by reasoning models; never rendered into history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message without reasoning.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            reasoning_content: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}

/// `content` without a leading `<think>...</think>` block (and the whitespace after it), as
/// reasoning models' templates render earlier assistant turns. An unclosed `<think>` is kept.
pub(crate) fn strip_reasoning(content: &str) -> &str {
    const CLOSE: &str = "</think>";
    content
        .trim_start()
        .strip_prefix("<think>")
        .and_then(|rest| rest.find(CLOSE).map(|end| &rest[end + CLOSE.len()..]))
        .map_or(content, str::trim_start)
}

/// Which marker convention a template uses, chosen from the tokenizer's special tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateFamily {
    /// DeepSeek V3/R1: `<｜User｜>`, `<｜Assistant｜>`, `<｜end▁of▁sentence｜>`.
    DeepSeek,
    /// Llama 3: `<|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>`.
    Llama3,
    /// ChatML (Qwen and others): `<|im_start|>role\n ... <|im_end|>\n`.
    ChatMl,
    /// The builtin tokenizer's `<|user|> ... <|end|>`.
    Builtin,
    /// No known special tokens: the builtin markers encoded as plain text.
    Plain,
}

/// A chat template resolved against one tokenizer: the token ids of every marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The convention in use (for logs and tests).
    family: TemplateFamily,
    /// Ids at the very start of every rendering.
    bos: Vec<u32>,
    /// Ids before a message's content, by [`Role::index`].
    prefix: [Vec<u32>; 5],
    /// Ids after a message's content, by [`Role::index`].
    suffix: [Vec<u32>; 5],
}

impl ChatTemplate {
    /// The template matching `tok`'s special tokens (see [`TemplateFamily`] for the order tried).
    pub fn for_tokenizer(tok: &dyn Tokenizer) -> Self {
        let has_all = |names: &[&str]| names.iter().all(|n| tok.special_token_id(n).is_some());
        // A special token if the tokenizer has one, else `fallback` encoded as text.
        let marker = |name: &str, fallback: &str| match tok.special_token_id(name) {
            Some(id) => vec![id],
            None => tok.encode(fallback),
        };
        let optional = |name: &str| marker(name, "");
        let mut prefix: [Vec<u32>; 5] = Default::default();
        let mut suffix: [Vec<u32>; 5] = Default::default();
        let family;
        let bos;
        if has_all(&["<｜User｜>", "<｜Assistant｜>"]) {
            family = TemplateFamily::DeepSeek;
            bos = optional("<｜begin▁of▁sentence｜>");
            prefix[Role::User.index()] = marker("<｜User｜>", "");
            prefix[Role::Assistant.index()] = marker("<｜Assistant｜>", "");
            suffix[Role::Assistant.index()] = optional("<｜end▁of▁sentence｜>");
            prefix[Role::Tool.index()] = marker("<｜tool▁output▁begin｜>", "\n\nTool: ");
            suffix[Role::Tool.index()] = optional("<｜tool▁output▁end｜>");
        } else if has_all(&["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]) {
            family = TemplateFamily::Llama3;
            bos = optional("<|begin_of_text|>");
            for role in Role::ALL {
                let name = match role {
                    Role::Developer => "system",
                    Role::Tool => "ipython",
                    other => other.as_str(),
                };
                let mut p = marker("<|start_header_id|>", "");
                p.extend(tok.encode(name));
                p.extend(marker("<|end_header_id|>", ""));
                p.extend(tok.encode("\n\n"));
                prefix[role.index()] = p;
                suffix[role.index()] = marker("<|eot_id|>", "");
            }
        } else if has_all(&["<|im_start|>", "<|im_end|>"]) {
            family = TemplateFamily::ChatMl;
            bos = Vec::new();
            for role in Role::ALL {
                let name = match role {
                    Role::Developer => "system",
                    other => other.as_str(),
                };
                let mut p = marker("<|im_start|>", "");
                p.extend(tok.encode(&format!("{name}\n")));
                prefix[role.index()] = p;
                let mut s = marker("<|im_end|>", "");
                s.extend(tok.encode("\n"));
                suffix[role.index()] = s;
            }
        } else {
            family = if has_all(&["<|user|>", "<|assistant|>", "<|end|>"]) {
                TemplateFamily::Builtin
            } else {
                TemplateFamily::Plain
            };
            bos = optional("<|begin_of_text|>");
            for role in Role::ALL {
                let name = format!("<|{}|>", role.as_str());
                prefix[role.index()] = marker(&name, &name);
                suffix[role.index()] = marker("<|end|>", "<|end|>");
            }
        }
        Self {
            family,
            bos,
            prefix,
            suffix,
        }
    }

    /// The convention in use.
    pub fn family(&self) -> TemplateFamily {
        self.family
    }

    /// Ids that open an assistant turn: what `add_generation_prompt` appends.
    pub(crate) fn generation_prompt(&self) -> &[u32] {
        &self.prefix[Role::Assistant.index()]
    }

    /// Prompt ids of `messages`; with `add_generation_prompt`, followed by an open assistant
    /// turn. Assistant reasoning (`reasoning_content` and a leading `<think>` block) is dropped.
    pub fn render(
        &self,
        tok: &dyn Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Vec<u32> {
        let mut out = self.bos.clone();
        for message in messages {
            let i = message.role.index();
            let content = match message.role {
                Role::Assistant => strip_reasoning(&message.content),
                _ => &message.content,
            };
            out.extend_from_slice(&self.prefix[i]);
            out.extend(tok.encode(content));
            out.extend_from_slice(&self.suffix[i]);
        }
        if add_generation_prompt {
            out.extend_from_slice(self.generation_prompt());
        }
        out
    }
}

/// Renders `messages` with the template matching `tok` (see [`ChatTemplate::render`]).
pub fn render_chat(
    tok: &dyn Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
) -> Vec<u32> {
    ChatTemplate::for_tokenizer(tok).render(tok, messages, add_generation_prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{AnswerWords, BuiltinTokenizer, HfTokenizer};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The builtin tokenizer with its special tokens replaced by another family's.
    struct Respecialized {
        base: BuiltinTokenizer,
        specials: &'static [&'static str],
    }

    impl Tokenizer for Respecialized {
        fn encode(&self, text: &str) -> Vec<u32> {
            self.base.encode(text)
        }
        fn decode(&self, ids: &[u32]) -> String {
            self.base.decode(ids)
        }
        fn vocab_size(&self) -> usize {
            self.base.vocab_size() + self.specials.len()
        }
        fn special_token_id(&self, token: &str) -> Option<u32> {
            let i = self.specials.iter().position(|s| *s == token)?;
            Some((self.base.vocab_size() + i) as u32)
        }
        fn answer_words(&self) -> &AnswerWords {
            self.base.answer_words()
        }
    }

    fn tokenizers() -> Vec<Box<dyn Tokenizer>> {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/tokenizer/tiny_bpe.json");
        let hf = match HfTokenizer::from_file(&fixture) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        };
        let re = |specials| Respecialized {
            base: BuiltinTokenizer::new(),
            specials,
        };
        vec![
            Box::new(BuiltinTokenizer::new()),
            Box::new(hf),
            Box::new(re(&[])),
            Box::new(re(&[
                "<｜begin▁of▁sentence｜>",
                "<｜end▁of▁sentence｜>",
                "<｜User｜>",
                "<｜Assistant｜>",
            ])),
            Box::new(re(&[
                "<|begin_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
            ])),
        ]
    }

    #[test]
    fn families_are_detected() {
        let families: Vec<TemplateFamily> = tokenizers()
            .iter()
            .map(|t| ChatTemplate::for_tokenizer(t.as_ref()).family())
            .collect();
        use TemplateFamily::*;
        assert_eq!(families, [Builtin, ChatMl, Plain, DeepSeek, Llama3]);
    }

    #[test]
    fn builtin_rendering_text() {
        let tok = BuiltinTokenizer::new();
        let messages = [
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage {
                reasoning_content: Some("hidden thoughts".into()),
                ..ChatMessage::assistant("<think>\nmore hidden\n</think>\n\nHello")
            },
            ChatMessage::new(Role::Tool, "42"),
        ];
        let ids = render_chat(&tok, &messages, true);
        assert_eq!(
            tok.decode(&ids),
            "<|begin_of_text|><|system|>Be brief.<|end|><|user|>Hi<|end|>\
             <|assistant|>Hello<|end|><|tool|>42<|end|><|assistant|>"
        );
    }

    #[test]
    fn chatml_rendering_text() {
        let tokenizers = tokenizers();
        let tok = tokenizers[1].as_ref();
        let ids = render_chat(tok, &[ChatMessage::user("Hello lorem")], true);
        assert_eq!(
            tok.decode(&ids),
            "<|im_start|>user\nHello lorem<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn strip_reasoning_cases() {
        assert_eq!(strip_reasoning("<think>a</think>b"), "b");
        assert_eq!(strip_reasoning("  <think>a</think>\n\n b c"), "b c");
        assert_eq!(strip_reasoning("<think>unclosed"), "<think>unclosed");
        assert_eq!(
            strip_reasoning("no <think>x</think> here"),
            "no <think>x</think> here"
        );
        assert_eq!(strip_reasoning(" plain "), " plain ");
    }

    fn random_text(rng: &mut ChaCha8Rng) -> String {
        const PIECES: &[&str] = &[
            "lorem", " ipsum", "Hello", " the", ",", ".", "\n", " ", "é", "42", " dolor", "?",
        ];
        (0..rng.gen_range(0..30))
            .map(|_| PIECES[rng.gen_range(0..PIECES.len())])
            .collect()
    }

    fn random_conversation(rng: &mut ChaCha8Rng, tok: &dyn Tokenizer) -> Vec<ChatMessage> {
        let mut messages = Vec::new();
        if rng.gen_bool(0.5) {
            messages.push(ChatMessage::system(random_text(rng)));
        }
        for _ in 0..rng.gen_range(0..4) {
            messages.push(ChatMessage::user(random_text(rng)));
            let n = rng.gen_range(0..20);
            let answer = tok.decode(&tok.answer_words().sample(rng, n));
            let mut reply = ChatMessage::assistant(answer);
            if rng.gen_bool(0.5) {
                reply.reasoning_content = Some(random_text(rng));
            }
            if rng.gen_bool(0.3) {
                reply.content = format!("<think>{}</think>\n{}", random_text(rng), reply.content);
            }
            messages.push(reply);
            if rng.gen_bool(0.3) {
                messages.push(ChatMessage::new(Role::Tool, random_text(rng)));
            }
        }
        messages.push(ChatMessage::user(random_text(rng)));
        messages
    }

    #[test]
    fn next_turn_extends_the_previous_rendering() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for tok in tokenizers() {
            let tok = tok.as_ref();
            for _ in 0..200 {
                let mut messages = random_conversation(&mut rng, tok);
                let prompt = render_chat(tok, &messages, true);
                let n = rng.gen_range(1..100);
                let answer_ids = tok.answer_words().sample(&mut rng, n);
                let mut answer = ChatMessage::assistant(tok.decode(&answer_ids));
                answer.reasoning_content = Some("thinking".into());
                messages.push(answer);

                // What the engine saw plus what it generated is a prefix of the history...
                let with_answer = render_chat(tok, &messages, false);
                let generated: Vec<u32> = prompt.iter().chain(&answer_ids).copied().collect();
                assert!(with_answer.starts_with(&generated));

                // ...and the history (what speculative prefill warms) a prefix of the next turn.
                messages.push(ChatMessage::user(random_text(&mut rng)));
                let next = render_chat(tok, &messages, true);
                assert!(next.starts_with(&with_answer));
            }
        }
    }
}
