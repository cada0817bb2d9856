//! Real prompts (`--dataset sharegpt:PATH` or `--dataset jsonl:PATH`) for `bench`, `sweep` and
//! `multiturn`: a file read through caps ([`MAX_DATASET_FILE_BYTES`],
//! [`MAX_DATASET_LINE_BYTES`]), every entry a conversation of user turns, each turn's prompt
//! counted with the target's tokenizer (the one synthetic prompts are sized with: `--tokenizer`,
//! else servesim's default), conversations outside `--dataset-min-input-tokens` /
//! `--dataset-max-input-tokens` dropped, and the rest taken in a seeded order.
//!
//! A conversation's turns: each user message starts one; the reply right after it (the first
//! assistant message before the next user message) gives that turn's output length, its token
//! count (at least 1). `--dataset-output-tokens` overrides every turn's; a turn with no reply
//! and no length in its line takes the mode's own (`--output-tokens` in `bench`,
//! `--max-completion-tokens` in `multiturn`). The first system message is the conversation's
//! system prompt (`multiturn` sends it); assistant messages before the first user message are
//! skipped. `bench` sends each conversation's first turn (vLLM's rule for ShareGPT: the first
//! human turn is the prompt, the next gpt turn's length the output length); `multiturn` sends
//! the whole conversation as one user's session.
//!
//! Sampling: a seeded shuffle of the conversations kept (the run's `--seed`); request `k` (or
//! user `k` of `multiturn`) takes conversation `order[k % n]`, so the same seed sends the same
//! prompts in the same order and a dataset smaller than the run is taken again from its start.
//!
//! The formats: `sharegpt` (one JSON array) and `jsonl` (one conversation a line).

mod jsonl;
mod sharegpt;

pub use crate::error::dataset::DatasetError;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use servesim::tokenizer::Tokenizer;

use crate::error::LoadgenError;
use crate::limits;
use crate::run::target::TargetArgs;

/// Largest dataset file read (1 GiB; ShareGPT_V3_unfiltered_cleaned_split.json is 642 MB).
pub const MAX_DATASET_FILE_BYTES: u64 = 1 << 30;

/// Longest line of a JSONL dataset (64 MiB: a prompt of 2^22 tokens and then some).
pub const MAX_DATASET_LINE_BYTES: u64 = 1 << 26;

/// Longest piece of a file's text an error message repeats (characters).
const MAX_SHOWN_CHARS: usize = 120;

/// Mixed into the seed of the sampling order (apart from the other draws of the seed).
const ORDER_SALT: u64 = 0xDA7A_5E7D_0000_0001;

/// `s`, cut to [`MAX_SHOWN_CHARS`] characters.
pub(crate) fn cut(s: &str) -> String {
    match s.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((i, _)) => format!("{}... ({} bytes)", &s[..i], s.len()),
        None => s.to_string(),
    }
}

/// The file formats `--dataset` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatasetFormat {
    /// A ShareGPT JSON array.
    ShareGpt,
    /// One JSON value a line.
    Jsonl,
}

/// `--dataset FORMAT:PATH`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetSpec {
    /// How the file is read.
    pub format: DatasetFormat,
    /// The file.
    pub path: PathBuf,
}

impl FromStr for DatasetSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, path) = s
            .split_once(':')
            .ok_or_else(|| format!("expected sharegpt:PATH or jsonl:PATH, got {:?}", cut(s)))?;
        let format = match kind {
            "sharegpt" => DatasetFormat::ShareGpt,
            "jsonl" => DatasetFormat::Jsonl,
            other => {
                return Err(format!(
                    "unknown dataset format {:?}: expected sharegpt or jsonl",
                    cut(other)
                ))
            }
        };
        if path.is_empty() {
            return Err(format!("{kind}: needs a file path after the colon"));
        }
        Ok(DatasetSpec {
            format,
            path: PathBuf::from(path),
        })
    }
}

impl fmt::Display for DatasetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.format {
            DatasetFormat::ShareGpt => "sharegpt",
            DatasetFormat::Jsonl => "jsonl",
        };
        write!(f, "{kind}:{}", self.path.display())
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    User,
    Assistant,
    System,
}

/// Where a conversation is in its file (kept for the tests and future messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// 1-based line of a JSONL file.
    Line(usize),
    /// 0-based index of a ShareGPT array.
    Conversation(usize),
}

/// A conversation as read, before counting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conversation {
    pub(crate) origin: Origin,
    /// The first system message.
    pub(crate) system: Option<String>,
    pub(crate) turns: Vec<RawTurn>,
}

/// One user turn as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawTurn {
    pub(crate) user: String,
    /// The reply right after it.
    pub(crate) reply: Option<String>,
    /// A length the line gives (JSONL `output_tokens`, `max_tokens`...).
    pub(crate) output_tokens: Option<usize>,
}

impl Conversation {
    /// The turns of `messages` (the module's rules); `output_tokens` sets every turn's.
    pub(crate) fn of_messages(
        origin: Origin,
        messages: Vec<(Role, String)>,
        output_tokens: Option<usize>,
    ) -> Conversation {
        let mut system = None;
        let mut turns: Vec<RawTurn> = Vec::new();
        let mut replied = true;
        for (role, text) in messages {
            match role {
                Role::System => {
                    system.get_or_insert(text);
                }
                Role::User => {
                    turns.push(RawTurn {
                        user: text,
                        reply: None,
                        output_tokens,
                    });
                    replied = false;
                }
                Role::Assistant if !replied => {
                    if let Some(t) = turns.last_mut() {
                        t.reply = Some(text);
                    }
                    replied = true;
                }
                Role::Assistant => {}
            }
        }
        Conversation {
            origin,
            system,
            turns,
        }
    }
}

/// One user turn, counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Turn {
    /// The user message.
    pub text: String,
    /// Its tokens.
    pub input_tokens: usize,
    /// Its output length from the data (the reply's tokens, or the line's length), if any.
    pub output_tokens: Option<usize>,
}

/// One conversation, counted and kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt {
    /// The system prompt, if the data has one.
    pub system: Option<String>,
    /// The user turns in order (at least one).
    pub turns: Vec<Turn>,
}

/// A dataset read, counted and filtered: what a run samples from.
#[derive(Debug, PartialEq)]
pub struct Dataset {
    /// `--dataset`.
    pub spec: DatasetSpec,
    /// The conversations kept, in file order.
    conversations: Vec<Prompt>,
    /// Conversations read.
    pub read: usize,
    /// `--dataset-output-tokens`.
    pub output_tokens: Option<usize>,
}

impl Dataset {
    /// Counts `read` with `tok`, keeps the conversations whose every user message has between
    /// `min` and `max` tokens.
    fn build(
        spec: &DatasetSpec,
        read: Vec<Conversation>,
        tok: &dyn Tokenizer,
        (min, max): (usize, usize),
        output_tokens: Option<usize>,
    ) -> Result<Dataset, DatasetError> {
        let total = read.len();
        let (mut no_user_turn, mut too_short, mut too_long) = (0, 0, 0);
        let mut conversations = Vec::new();
        for c in read {
            if c.turns.is_empty() {
                no_user_turn += 1;
                continue;
            }
            let turns: Vec<Turn> = c
                .turns
                .into_iter()
                .map(|t| Turn {
                    input_tokens: tok.encode(&t.user).len(),
                    output_tokens: t.output_tokens.or_else(|| {
                        t.reply
                            .map(|r| tok.encode(&r).len().clamp(1, limits::MAX_OUTPUT_TOKENS))
                    }),
                    text: t.user,
                })
                .collect();
            if turns.iter().any(|t| t.input_tokens < min) {
                too_short += 1;
            } else if turns.iter().any(|t| t.input_tokens > max) {
                too_long += 1;
            } else {
                conversations.push(Prompt {
                    system: c.system,
                    turns,
                });
            }
        }
        if conversations.is_empty() {
            return Err(DatasetError::Empty {
                path: spec.path.clone(),
                read: total,
                no_user_turn,
                too_short,
                too_long,
                min,
                max,
            });
        }
        Ok(Dataset {
            spec: spec.clone(),
            conversations,
            read: total,
            output_tokens,
        })
    }

    /// Conversations kept (at least one).
    pub fn len(&self) -> usize {
        self.conversations.len()
    }

    /// Never true: an empty dataset is an error.
    pub fn is_empty(&self) -> bool {
        self.conversations.is_empty()
    }

    /// The order a run seeded with `seed` takes the conversations in (indices; request `k`
    /// takes `order[k % len]`).
    pub fn order(&self, seed: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.conversations.len()).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ ORDER_SALT));
        order
    }

    /// Conversation `i` (an index of [`Dataset::order`]).
    pub fn conversation(&self, i: usize) -> &Prompt {
        &self.conversations[i % self.conversations.len()]
    }

    /// The output length of `turn`: `--dataset-output-tokens`, else the data's, else
    /// `fallback` (the mode's own flag).
    pub fn output_tokens(&self, turn: &Turn, fallback: usize) -> usize {
        self.output_tokens
            .or(turn.output_tokens)
            .unwrap_or(fallback)
    }

    /// The most prompt tokens one conversation sends in all its turns (for the in-flight caps).
    pub(crate) fn longest_prompt_tokens(&self) -> usize {
        self.conversations
            .iter()
            .map(|c| c.turns.iter().map(|t| t.input_tokens).sum::<usize>())
            .max()
            .unwrap_or(0)
    }

    /// The dataset in a report's `config`.
    pub(crate) fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "dataset": self.spec.to_string(),
            "conversations_read": self.read,
            "conversations_kept": self.len(),
            "dataset_output_tokens": self.output_tokens,
        })
    }
}

/// The conversations a run sends, in its seed's order.
#[derive(Debug)]
pub(crate) struct Picks {
    dataset: Arc<Dataset>,
    order: Vec<usize>,
}

impl Picks {
    /// `dataset` in the order of `seed`.
    pub(crate) fn new(dataset: &Arc<Dataset>, seed: u64) -> Picks {
        Picks {
            order: dataset.order(seed),
            dataset: dataset.clone(),
        }
    }

    /// The conversation of request (or user) `k`.
    pub(crate) fn get(&self, k: usize) -> &Prompt {
        self.dataset.conversation(self.order[k % self.order.len()])
    }

    /// The dataset.
    pub(crate) fn dataset(&self) -> &Dataset {
        &self.dataset
    }
}

/// A dataset loaded once for every plan built from the same flags (a sweep's points, the check
/// before a run and the run): clones share it.
#[derive(Clone, Default)]
struct Loaded(Arc<OnceLock<Arc<Dataset>>>);

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Loaded"
        } else {
            "NotLoaded"
        })
    }
}

/// The dataset flags of `bench`, `sweep` and `multiturn`.
#[derive(clap::Args, Clone, Debug)]
pub struct DatasetArgs {
    /// Send real prompts: sharegpt:PATH (a ShareGPT JSON array of {"conversations": [{"from",
    /// "value"}, ...]}) or jsonl:PATH (one prompt string, {"prompt"}, {"messages"} or message
    /// list a line). bench sends each conversation's first user turn; multiturn each whole
    /// conversation as one user's session. The file is at most 1 GiB (a JSONL line 64 MiB).
    #[arg(long, value_name = "FORMAT:PATH")]
    pub dataset: Option<DatasetSpec>,
    /// Drop conversations with a user message of fewer tokens (the target's tokenizer), 0 to
    /// 2^22.
    #[arg(long, default_value_t = 1)]
    pub dataset_min_input_tokens: usize,
    /// Drop conversations with a user message of more tokens, 1 to 2^22.
    #[arg(long, default_value_t = limits::MAX_PROMPT_TOKENS)]
    pub dataset_max_input_tokens: usize,
    /// Ask every turn for this many output tokens instead of its reply's length in the data
    /// (1 to 2^22). Without it, a turn without a reply asks for --output-tokens (bench) or
    /// --max-completion-tokens (multiturn).
    #[arg(long)]
    pub dataset_output_tokens: Option<usize>,
    /// The dataset once loaded.
    #[arg(skip)]
    loaded: Loaded,
}

impl DatasetArgs {
    /// The dataset, read and counted with the tokenizer `target` sizes prompts with (loaded
    /// once; clones of these flags share it); None without `--dataset`.
    pub fn load(&self, target: &TargetArgs) -> Result<Option<Arc<Dataset>>, LoadgenError> {
        let Some(spec) = &self.dataset else {
            if self.dataset_output_tokens.is_some() {
                return Err(LoadgenError::Config(
                    "--dataset-output-tokens needs --dataset".into(),
                ));
            }
            return Ok(None);
        };
        let min = limits::count(
            "--dataset-min-input-tokens",
            self.dataset_min_input_tokens,
            0,
            limits::MAX_PROMPT_TOKENS,
        )?;
        let max = limits::count(
            "--dataset-max-input-tokens",
            self.dataset_max_input_tokens,
            1,
            limits::MAX_PROMPT_TOKENS,
        )?;
        if min > max {
            return Err(LoadgenError::Config(format!(
                "--dataset-min-input-tokens {min} is above --dataset-max-input-tokens {max}"
            )));
        }
        if let Some(n) = self.dataset_output_tokens {
            limits::count("--dataset-output-tokens", n, 1, limits::MAX_OUTPUT_TOKENS)?;
        }
        if let Some(d) = self.loaded.0.get() {
            return Ok(Some(d.clone()));
        }
        let tok: Box<dyn Tokenizer> = match &target.tokenizer {
            Some(path) => servesim::tokenizer::load_tokenizer(path)?,
            None => Box::new(servesim::tokenizer::default_tokenizer()?),
        };
        let dataset = Arc::new(read(
            spec,
            tok.as_ref(),
            (min, max),
            self.dataset_output_tokens,
        )?);
        Ok(Some(self.loaded.0.get_or_init(|| dataset).clone()))
    }
}

/// Reads, counts and filters the dataset `spec` names.
pub fn read(
    spec: &DatasetSpec,
    tok: &dyn Tokenizer,
    bounds: (usize, usize),
    output_tokens: Option<usize>,
) -> Result<Dataset, LoadgenError> {
    let conversations = read_conversations(spec)?;
    Ok(Dataset::build(
        spec,
        conversations,
        tok,
        bounds,
        output_tokens,
    )?)
}

/// The conversations of the file, as read.
fn read_conversations(spec: &DatasetSpec) -> Result<Vec<Conversation>, LoadgenError> {
    let path: &Path = &spec.path;
    // A regular file past the cap is refused before a byte is parsed (a device or a pipe is
    // read up to the cap).
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.is_file() && meta.len() > MAX_DATASET_FILE_BYTES {
            return Err(LoadgenError::TooLarge {
                path: path.to_path_buf(),
                what: "the file".into(),
                cap: MAX_DATASET_FILE_BYTES,
                constant: "MAX_DATASET_FILE_BYTES",
            });
        }
    }
    match spec.format {
        DatasetFormat::ShareGpt => sharegpt::read(path, MAX_DATASET_FILE_BYTES),
        DatasetFormat::Jsonl => jsonl::read(path, MAX_DATASET_LINE_BYTES, MAX_DATASET_FILE_BYTES),
    }
}

#[cfg(test)]
mod tests;
