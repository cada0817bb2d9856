//! Request parsing: the `ApiJson` extractor and the validated [`ChatRequest`] /
//! `CompletionRequest` values, with OpenAI error bodies naming the field at fault.
//!
//! Bodies are parsed to a JSON object first and each known field is then read with its own type,
//! so a wrong type names its `param`. Unknown top-level fields are ignored (clients send vendor
//! extras); `nvext.agent_hints` is strict, as in Dynamo.

use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::budget::{exceeded, MAX_PROMPTS, MAX_STOPS, MAX_STOP_BYTES, MAX_STOP_TOKEN_IDS};
use super::error::ApiError;
use super::json_mode::ResponseFormat;
use super::logprobs::MAX_TOP_LOGPROBS;
use super::tools::{render_tool_calls, Tools};
use crate::text::{ChatMessage, Role};

/// Choices per prompt at most (`n`), as OpenAI's API.
pub(crate) const MAX_N: usize = 128;

/// A JSON object body; any rejection is an [`ApiError`].
#[derive(Debug)]
pub(crate) struct ApiJson(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for ApiJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            });
        if !is_json {
            return Err(ApiError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ..ApiError::invalid(
                    "Expected request with `Content-Type: application/json`",
                    None,
                )
            });
        }
        // The router's `DefaultBodyLimit` applies here: an oversized body is a 413.
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large()
                } else {
                    ApiError::invalid(format!("Could not read the body: {e}"), None)
                }
            })?;
        // A large body is parsed on the blocking pool, as its text is tokenized.
        let heavy = bytes.len() > super::budget::INLINE_TEXT_BYTES;
        let parsed =
            super::budget::off_runtime(heavy, move || serde_json::from_slice::<Value>(&bytes))
                .await?;
        match parsed {
            Ok(Value::Object(map)) => Ok(ApiJson(map)),
            Ok(_) => Err(ApiError::invalid(
                "The request body must be a JSON object",
                None,
            )),
            Err(e) => Err(ApiError::invalid(
                format!("We could not parse the JSON body of your request: {e}"),
                None,
            )),
        }
    }
}

/// `nvext.agent_hints` (Dynamo): unknown fields are rejected.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentHints {
    /// Soft priority (accepted, not yet used by the engine).
    pub priority: Option<i32>,
    /// Router queue tier (accepted, not yet used).
    pub strict_priority: Option<u32>,
    /// Expected output tokens (accepted, not yet used).
    pub osl: Option<u32>,
    /// Warm the next turn's prefix after this one finishes.
    pub speculative_prefill: Option<bool>,
    /// Deprecated queue shift in seconds (accepted, not yet used).
    pub latency_sensitivity: Option<f64>,
}

/// The `agent_hints` fields Dynamo knows.
pub(crate) const AGENT_HINT_FIELDS: [&str; 5] = [
    "priority",
    "strict_priority",
    "osl",
    "speculative_prefill",
    "latency_sensitivity",
];

/// The `nvext` fields Dynamo knows (the union across its versions).
pub(crate) const NVEXT_FIELDS: [&str; 20] = [
    "greed_sampling",
    "use_raw_prompt",
    "annotations",
    "backend_instance_id",
    "token_data",
    "max_thinking_tokens",
    "cache_salt",
    "extra_fields",
    "metadata_upload",
    "prefill_worker_id",
    "decode_worker_id",
    "dp_rank",
    "prefill_dp_rank",
    "agent_hints",
    "agent_context",
    "request_timestamp_ms",
    "session_control",
    "routing_constraints",
    "router",
    "speculative_prefill",
];

/// Dynamo's `nvext` request extension, strict as Dynamo's (`deny_unknown_fields`). Read here:
/// `agent_hints.speculative_prefill` (or the older top-level `speculative_prefill`),
/// `backend_instance_id` and `extra_fields` (`worker_id`, `timing`); the rest is accepted and
/// type-checked only.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NvExt {
    /// Force greedy sampling (no effect: answers are drawn from a seed).
    pub greed_sampling: Option<bool>,
    /// Bypass the chat template (not supported; accepted).
    pub use_raw_prompt: Option<bool>,
    /// Out-of-band SSE annotations (accepted, none emitted).
    pub annotations: Option<Vec<String>>,
    /// Pin the request to this worker.
    pub backend_instance_id: Option<u64>,
    /// A pre-tokenized prompt (accepted, ignored).
    pub token_data: Option<Vec<u32>>,
    /// Pass-through, no-op in Dynamo too.
    pub max_thinking_tokens: Option<u32>,
    /// Prefix-cache isolation (accepted, ignored).
    pub cache_salt: Option<String>,
    /// Response `nvext` opt-ins; `worker_id` and `timing` are served.
    pub extra_fields: Option<Vec<String>>,
    /// Metadata upload target (accepted, ignored).
    pub metadata_upload: Option<Value>,
    /// Disaggregated pinning (accepted, ignored: serving is aggregated).
    pub prefill_worker_id: Option<u64>,
    /// Disaggregated pinning (accepted, ignored).
    pub decode_worker_id: Option<u64>,
    /// Data-parallel rank (accepted, ignored).
    pub dp_rank: Option<u32>,
    /// Prefill data-parallel rank (accepted, ignored).
    pub prefill_dp_rank: Option<u32>,
    /// Agent hints.
    pub agent_hints: Option<AgentHints>,
    /// Session identity (accepted, ignored).
    pub agent_context: Option<Value>,
    /// Virtual arrival time for trace replay (accepted, ignored).
    pub request_timestamp_ms: Option<f64>,
    /// Sticky sessions of older Dynamo (accepted, ignored).
    pub session_control: Option<Value>,
    /// Taint-based routing constraints (accepted, ignored).
    pub routing_constraints: Option<Value>,
    /// Global-router targets (accepted, ignored).
    pub router: Option<Value>,
    /// The older spelling of the hint, directly under `nvext`.
    pub speculative_prefill: Option<bool>,
}

impl NvExt {
    /// Parses `nvext`, naming an unknown field (`nvext.x` or `nvext.agent_hints.x`) in `param`.
    pub(crate) fn parse(value: &Value) -> Result<NvExt, ApiError> {
        let Some(object) = value.as_object() else {
            return Err(ApiError::invalid(
                "Invalid type for 'nvext': expected an object",
                Some("nvext"),
            ));
        };
        let unknown = |field: &str, at: &str, known: &[&str]| {
            ApiError::invalid(
                format!(
                    "Unknown field `{field}` in '{at}'; expected one of: {}",
                    known.join(", ")
                ),
                Some(&format!("{at}.{field}")),
            )
        };
        if let Some(field) = object.keys().find(|k| !NVEXT_FIELDS.contains(&k.as_str())) {
            return Err(unknown(field, "nvext", &NVEXT_FIELDS));
        }
        if let Some(Value::Object(hints)) = object.get("agent_hints") {
            if let Some(field) = hints
                .keys()
                .find(|k| !AGENT_HINT_FIELDS.contains(&k.as_str()))
            {
                return Err(unknown(field, "nvext.agent_hints", &AGENT_HINT_FIELDS));
            }
        }
        serde_json::from_value(value.clone())
            .map_err(|e| ApiError::invalid(format!("Invalid 'nvext': {e}"), Some("nvext")))
    }

    /// Whether `extra_fields` asks for `name`.
    pub(crate) fn wants(&self, name: &str) -> bool {
        self.extra_fields
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == name))
    }
}

/// Fields shared by chat and text completions.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationParams {
    /// Requested model name.
    pub model: String,
    /// Output limit (`max_completion_tokens`, else `max_tokens`); None means the default.
    pub max_tokens: Option<usize>,
    /// Stream SSE chunks.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Seeds the answer's words.
    pub seed: Option<u64>,
    /// Dynamo extension.
    pub nvext: NvExt,
    /// Choices per prompt (`n`, 1 to `MAX_N`).
    pub n: usize,
    /// Run every answer to its output limit (vLLM's `ignore_eos`).
    pub ignore_eos: bool,
    /// No stop before this many output tokens (vLLM's `min_tokens`).
    pub min_tokens: usize,
    /// Stop strings (`stop`, empty strings dropped).
    pub stop: Vec<String>,
    /// Stop token ids (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// Keep a matched stop string in the text (vLLM's `include_stop_str_in_output`).
    pub include_stop_str: bool,
    /// Log-probabilities: `Some(alternatives per token)` when asked for (chat `logprobs` with
    /// `top_logprobs`, completions `logprobs`).
    pub logprobs: Option<usize>,
    /// `response_format`.
    pub response_format: ResponseFormat,
}

impl GenerationParams {
    /// Whether the request asked for speculative prefill of its next turn.
    pub(crate) fn speculative_prefill(&self) -> bool {
        self.nvext
            .agent_hints
            .as_ref()
            .and_then(|h| h.speculative_prefill)
            .or(self.nvext.speculative_prefill)
            .unwrap_or(false)
    }
}

/// A validated `POST /v1/chat/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// Shared fields.
    pub params: GenerationParams,
    /// The conversation, with the tools presented in a leading system message and earlier
    /// tool calls rendered into their assistant messages.
    pub messages: Vec<ChatMessage>,
    /// `tools` and `tool_choice`.
    pub tools: Tools,
}

/// A `/v1/completions` prompt.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PromptInput {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
}

/// A validated `POST /v1/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct CompletionRequest {
    /// Shared fields.
    pub params: GenerationParams,
    /// The prompts (one, or a batch); each gets `n` choices.
    pub prompts: Vec<PromptInput>,
    /// Answer texts start with their prompt's text.
    pub echo: bool,
}

/// Reads an optional field with its type; `null` counts as absent.
fn field<T: DeserializeOwned>(
    body: &Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| ApiError::invalid(format!("Invalid value for '{name}': {e}"), Some(name))),
    }
}

fn positive(body: &Map<String, Value>, name: &str) -> Result<Option<usize>, ApiError> {
    match field::<i64>(body, name)? {
        None => Ok(None),
        Some(v) if v >= 1 => Ok(Some(v as usize)),
        Some(v) => Err(ApiError::invalid(
            format!("Invalid '{name}': {v}. It must be at least 1."),
            Some(name),
        )),
    }
}

fn generation_params(body: &Map<String, Value>) -> Result<GenerationParams, ApiError> {
    let model = match body.get("model") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "you must provide a model parameter",
                Some("model"),
            ))
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::invalid(
                "Invalid type for 'model': expected a string",
                Some("model"),
            ))
        }
    };
    let max_tokens = match positive(body, "max_completion_tokens")? {
        Some(v) => {
            positive(body, "max_tokens")?;
            Some(v)
        }
        None => positive(body, "max_tokens")?,
    };
    let n = match field::<i64>(body, "n")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                format!("Invalid 'n': {n}. It must be between 1 and {MAX_N}."),
                Some("n"),
            ))
        }
    };
    let stream = field::<bool>(body, "stream")?.unwrap_or(false);
    let include_usage = match field::<Map<String, Value>>(body, "stream_options")? {
        Some(options) => field::<bool>(&options, "include_usage")
            .map_err(|e| ApiError {
                param: Some("stream_options.include_usage".into()),
                ..e
            })?
            .unwrap_or(false),
        None => false,
    };
    let seed = field::<i64>(body, "seed")?.map(|s| s as u64);
    if let Some(t) = field::<f64>(body, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid(
                format!(
                    "Invalid 'temperature': {}. It must be between 0 and 2.",
                    servesim::scheduler::show_number(t)
                ),
                Some("temperature"),
            ));
        }
    }
    let ignore_eos = field::<bool>(body, "ignore_eos")?.unwrap_or(false);
    let min_tokens =
        field::<u64>(body, "min_tokens")?.map_or(0, |m| m.min(u32::MAX as u64) as usize);
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        Some(_) => {
            return Err(ApiError::invalid(
                "Invalid type for 'stop': expected a string or an array of strings",
                Some("stop"),
            ))
        }
    };
    if stop.len() > MAX_STOPS {
        return Err(exceeded(
            "stop",
            format!("{} stop strings given", stop.len()),
            format!("{MAX_STOPS} stop strings"),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(exceeded(
            "stop",
            format!("a stop string of {} bytes given", long.len()),
            format!("{MAX_STOP_BYTES} bytes (UTF-8) per stop string"),
        ));
    }
    let stop = stop.into_iter().filter(|s| !s.is_empty()).collect();
    let stop_token_ids = field::<Vec<u32>>(body, "stop_token_ids")?.unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(exceeded(
            "stop_token_ids",
            format!("{} stop token ids given", stop_token_ids.len()),
            format!("{MAX_STOP_TOKEN_IDS} stop token ids"),
        ));
    }
    if let Some(max) = max_tokens.filter(|&max| min_tokens > max) {
        return Err(ApiError::invalid(
            format!(
                "Invalid 'min_tokens': {min_tokens}. It must be at most the output limit \
                 ('max_tokens' or 'max_completion_tokens'), {max}."
            ),
            Some("min_tokens"),
        ));
    }
    let include_stop_str = field::<bool>(body, "include_stop_str_in_output")?.unwrap_or(false);
    let response_format = ResponseFormat::parse(body)?;
    let nvext = match body.get("nvext") {
        None | Some(Value::Null) => NvExt::default(),
        Some(v) => NvExt::parse(v)?,
    };
    Ok(GenerationParams {
        model,
        max_tokens,
        stream,
        include_usage: stream && include_usage,
        seed,
        nvext,
        n,
        ignore_eos,
        min_tokens,
        stop,
        stop_token_ids,
        include_stop_str,
        logprobs: None,
        response_format,
    })
}

fn message_content(value: Option<&Value>, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("text") {
                    Some(Value::String(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    _ if part.is_object() => {}
                    _ => {
                        return Err(ApiError::invalid(
                            format!("Invalid content part in '{param}'"),
                            Some(&param),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(
            format!("Invalid type for '{param}': expected a string or an array of parts"),
            Some(&param),
        )),
    }
}

impl ChatRequest {
    /// Validates a chat body.
    pub fn parse(body: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
        let params = generation_params(body)?;
        let raw = match body.get("messages") {
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "Missing required parameter: 'messages'.",
                    Some("messages"),
                ))
            }
            Some(Value::Array(items)) => items,
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid type for 'messages': expected an array of messages",
                    Some("messages"),
                ))
            }
        };
        if raw.is_empty() {
            return Err(ApiError::invalid(
                "Invalid 'messages': empty array. Expected an array with minimum length 1.",
                Some("messages"),
            ));
        }
        let mut messages = Vec::with_capacity(raw.len());
        for (i, m) in raw.iter().enumerate() {
            let Some(m) = m.as_object() else {
                return Err(ApiError::invalid(
                    format!("Invalid type for 'messages[{i}]': expected an object"),
                    Some(&format!("messages[{i}]")),
                ));
            };
            let role_param = format!("messages[{i}].role");
            let role = match m.get("role") {
                Some(Value::String(r)) => parse_role(r).ok_or_else(|| {
                    ApiError::invalid(
                        format!(
                            "Invalid value for '{role_param}': {r:?}. Supported values are: \
                             'system', 'developer', 'user', 'assistant' and 'tool'."
                        ),
                        Some(&role_param),
                    )
                })?,
                _ => {
                    return Err(ApiError::invalid(
                        format!("Missing or invalid '{role_param}'"),
                        Some(&role_param),
                    ))
                }
            };
            let mut content = message_content(m.get("content"), i)?;
            if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
                let at = format!("messages[{i}].tool_calls");
                if role != Role::Assistant {
                    return Err(ApiError::invalid(
                        format!("Invalid '{at}': only assistant messages carry tool calls"),
                        Some(&at),
                    ));
                }
                content.push_str(&render_tool_calls(calls, &at)?);
            }
            messages.push(ChatMessage::new(role, content));
        }
        let tools = Tools::parse(body)?;
        if let Some(text) = tools.prompt() {
            messages.insert(0, ChatMessage::system(text));
        }
        let mut params = params;
        let logprobs = field::<bool>(body, "logprobs")?.unwrap_or(false);
        let top = match field::<i64>(body, "top_logprobs")? {
            None => 0,
            Some(t) if (0..=MAX_TOP_LOGPROBS as i64).contains(&t) => t as usize,
            Some(t) => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid 'top_logprobs': {t}. It must be between 0 and {MAX_TOP_LOGPROBS}."
                    ),
                    Some("top_logprobs"),
                ))
            }
        };
        if top > 0 && !logprobs {
            return Err(ApiError::invalid(
                "'top_logprobs' requires 'logprobs' to be true",
                Some("top_logprobs"),
            ));
        }
        params.logprobs = logprobs.then_some(top);
        Ok(ChatRequest {
            params,
            messages,
            tools,
        })
    }
}

impl CompletionRequest {
    /// Validates a text-completion body. The prompt is a string, an array of token ids, or an
    /// array of either (a batch); no prompt may be empty (`""`, `[""]` and `[[]]` are a 400, as
    /// on vLLM).
    pub(crate) fn parse(body: &Map<String, Value>) -> Result<CompletionRequest, ApiError> {
        let mut params = generation_params(body)?;
        let bad = || {
            ApiError::invalid(
                "Invalid 'prompt': expected a string, an array of token ids, or an array of \
                 either",
                Some("prompt"),
            )
        };
        let ids = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
            items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|t| u32::try_from(t).ok())
                        .ok_or_else(bad)
                })
                .collect()
        };
        let prompts = match body.get("prompt") {
            None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "Missing required parameter: 'prompt'.",
                    Some("prompt"),
                ))
            }
            Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
            Some(Value::Array(items)) if items.is_empty() => return Err(bad()),
            Some(Value::Array(items))
                if items.len() > MAX_PROMPTS
                    && items.iter().all(|v| v.is_string() || v.is_array()) =>
            {
                return Err(exceeded(
                    "prompt",
                    format!("a batch of {} prompts given", items.len()),
                    format!("{MAX_PROMPTS} prompts per request"),
                ))
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
                .iter()
                .map(|v| PromptInput::Text(v.as_str().unwrap_or_default().to_string()))
                .collect(),
            Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
                .iter()
                .map(|v| ids(v.as_array().map_or(&[][..], Vec::as_slice)).map(PromptInput::Tokens))
                .collect::<Result<_, _>>()?,
            Some(Value::Array(items)) => vec![PromptInput::Tokens(ids(items)?)],
            Some(_) => return Err(bad()),
        };
        let empty = prompts.iter().any(|prompt| match prompt {
            PromptInput::Text(text) => text.is_empty(),
            PromptInput::Tokens(ids) => ids.is_empty(),
        });
        if empty {
            return Err(
                ApiError::invalid("The prompt cannot be empty.", Some("prompt"))
                    .with_code("empty_prompt"),
            );
        }
        params.logprobs = match field::<i64>(body, "logprobs")? {
            None => None,
            Some(t) if (0..=MAX_TOP_LOGPROBS as i64).contains(&t) => Some(t as usize),
            Some(t) => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid 'logprobs': {t}. It must be between 0 and {MAX_TOP_LOGPROBS}."
                    ),
                    Some("logprobs"),
                ))
            }
        };
        let echo = field::<bool>(body, "echo")?.unwrap_or(false);
        Ok(CompletionRequest {
            params,
            prompts,
            echo,
        })
    }
}

/// An OpenAI role name.
fn parse_role(s: &str) -> Option<Role> {
    Some(match s {
        "system" => Role::System,
        "developer" => Role::Developer,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" => Role::Tool,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn completion(prompt: Value) -> Result<CompletionRequest, ApiError> {
        let body = json!({"model": "m", "prompt": prompt});
        CompletionRequest::parse(body.as_object().expect("an object"))
    }

    #[test]
    fn empty_prompts_are_refused_naming_the_prompt() {
        for prompt in [
            json!(""),
            json!([""]),
            json!([[]]),
            json!([]),
            json!(["a", ""]),
            json!([[1], []]),
        ] {
            let e = completion(prompt.clone()).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{prompt}");
            assert_eq!(e.param.as_deref(), Some("prompt"), "{prompt}");
        }
        for (prompt, count) in [
            (json!("x"), 1),
            (json!(["x"]), 1),
            (json!([[1]]), 1),
            (json!([1, 2]), 1),
            (json!(["x", "y"]), 2),
            (json!([[1], [2, 3], [4]]), 3),
        ] {
            let parsed = completion(prompt.clone()).expect("valid");
            assert_eq!(parsed.prompts.len(), count, "{prompt}");
        }
        for prompt in [json!(["x", [1]]), json!([1, "x"]), json!({})] {
            assert!(completion(prompt.clone()).is_err(), "{prompt}");
        }
    }
}
