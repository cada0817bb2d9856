//! [`DatasetError`]: why a `--dataset` file cannot be used (its own file, so that the crate's
//! error type names it without depending on the reader).

use std::path::PathBuf;

/// A dataset file that cannot be used: where, and why (never more than `MAX_SHOWN_CHARS`
/// characters of the file's own text).
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// A JSONL line is not one of the accepted shapes.
    #[error("{}:{line}: {message}", path.display())]
    Line {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A ShareGPT document is not an array of conversations.
    #[error("{}:{line}:{column}: not a ShareGPT array of conversations: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde's message.
        message: String,
    },
    /// One ShareGPT conversation is wrong.
    #[error("{}: conversation {index}{}: {message}", path.display(),
        id.as_ref().map(|id| format!(" (id {id})")).unwrap_or_default())]
    Conversation {
        /// The file.
        path: PathBuf,
        /// 0-based index in the array.
        index: usize,
        /// Its `id`, cut.
        id: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// Nothing is left to send after filtering.
    #[error(
        "{}: no conversation left to send: {read} read, {no_user_turn} without a user \
         message, {too_short} with a user message below --dataset-min-input-tokens {min}, \
         {too_long} with one above --dataset-max-input-tokens {max}",
        path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
        /// Conversations read.
        read: usize,
        /// Dropped: no user message.
        no_user_turn: usize,
        /// Dropped: a user message too short.
        too_short: usize,
        /// Dropped: a user message too long.
        too_long: usize,
        /// The bounds.
        min: usize,
        /// See `min`.
        max: usize,
    },
}
