//! The ShareGPT JSON format: one document, an array of `{"id": ..., "conversations": [{"from":
//! "human", "value": "..."}, {"from": "gpt", "value": "..."}, ...]}`. Roles: `human` or `user`
//! (a user message), `gpt`, `assistant`, `chatgpt`, `bing` or `bard` (a reply), `system`. Other
//! keys of a conversation are ignored. The file is read through a byte cap; an error in the JSON
//! names its line and column, an error in one conversation its index (0-based) and id.

use std::path::Path;

use serde::Deserialize;

use crate::capped::read_json_within;
use crate::dataset::{cut, Conversation, DatasetError, Origin, Role};
use crate::error::LoadgenError;

/// One conversation as the file has it.
#[derive(Deserialize)]
struct RawConversation {
    /// Any JSON (dumps use strings); shown in errors, cut.
    #[serde(default)]
    id: Option<serde_json::Value>,
    conversations: Vec<RawMessage>,
}

/// One message as the file has it.
#[derive(Deserialize)]
struct RawMessage {
    from: String,
    value: String,
}

/// The role a ShareGPT `from` names.
fn role(from: &str) -> Option<Role> {
    match from {
        "human" | "user" => Some(Role::User),
        "gpt" | "assistant" | "chatgpt" | "bing" | "bard" => Some(Role::Assistant),
        "system" => Some(Role::System),
        _ => None,
    }
}

/// Reads the ShareGPT file `path` (at most `cap` bytes) into conversations, in file order.
pub(crate) fn read(path: &Path, cap: u64) -> Result<Vec<Conversation>, LoadgenError> {
    let raw: Vec<RawConversation> = read_json_within(path, cap, "MAX_DATASET_FILE_BYTES")?
        .map_err(|e| DatasetError::Json {
            path: path.to_path_buf(),
            line: e.line(),
            column: e.column(),
            message: cut(&e.to_string()),
        })?;
    raw.into_iter()
        .enumerate()
        .map(|(index, RawConversation { id, conversations })| {
            let bad = |message: String| DatasetError::Conversation {
                path: path.to_path_buf(),
                index,
                id: id.as_ref().map(|id| match id {
                    serde_json::Value::String(s) => cut(s),
                    other => cut(&other.to_string()),
                }),
                message,
            };
            let messages = conversations
                .into_iter()
                .enumerate()
                .map(|(i, m)| match role(&m.from) {
                    Some(r) => Ok((r, m.value)),
                    None => Err(bad(format!(
                        "message {i}: \"from\" is {:?}: expected human, user, gpt, assistant, \
                         chatgpt, bing, bard or system",
                        cut(&m.from)
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Conversation::of_messages(
                Origin::Conversation(index),
                messages,
                None,
            ))
        })
        .collect::<Result<_, DatasetError>>()
        .map_err(LoadgenError::from)
}
