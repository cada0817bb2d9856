//! [`RawRow`]: a Mooncake trace row as written in the file, before any check.

use serde::Deserialize;

/// A row as written in the file; every field optional so missing ones get our own messages.
/// (Rows of the plain shape are read by [`super::plain::plain_row`] instead, into the same
/// value.)
#[derive(Debug, Default, Deserialize, PartialEq)]
pub(super) struct RawRow {
    #[serde(default, alias = "created_time")]
    pub(super) timestamp: Option<f64>,
    #[serde(default, alias = "input_tokens")]
    pub(super) input_length: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    pub(super) output_length: Option<u64>,
    #[serde(default)]
    pub(super) hash_ids: Option<Vec<u64>>,
    #[serde(default)]
    pub(super) session_id: Option<serde_json::Value>,
    #[serde(default, alias = "delay_ms")]
    pub(super) delay: Option<f64>,
    #[serde(default)]
    pub(super) request_id: Option<serde_json::Value>,
}
