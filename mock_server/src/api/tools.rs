//! Tool calling: the request's `tools` and `tool_choice` ([`Tools`]), how tool definitions and
//! earlier tool calls are rendered into the prompt, and the call an answer makes ([`ToolCall`]:
//! a seeded id and arguments generated from the function's JSON schema).

use rand::Rng;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::schema;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// The JSON schema of its arguments (checked by [`schema::check`]).
    pub parameters: Value,
    /// The definition as sent, rendered into the prompt.
    pub definition: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool.
    None,
    /// Call one with `--tool-call-probability` (the default when tools are given).
    Auto,
    /// Always call one.
    Required,
    /// Always call this one (an index into the tools).
    Named(usize),
}

/// The request's tools and how the answer must use them.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// The functions, in the request's order.
    pub tools: Vec<Tool>,
    /// How to choose.
    pub choice: ToolChoice,
}

impl Tools {
    /// Parses `tools` and `tool_choice`; a malformed definition or choice is a 400 naming it.
    pub fn parse(body: &Map<String, Value>) -> Result<Tools, ApiError> {
        let tools = match body.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, t)| parse_tool(t, i))
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid type for 'tools': expected an array of tools",
                    Some("tools"),
                ))
            }
        };
        let bad_choice = |message: String| ApiError::invalid(message, Some("tool_choice"));
        let choice = match body.get("tool_choice") {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad_choice(format!(
                        "Invalid value for 'tool_choice': {other:?}. Supported values are: \
                         'none', 'auto', 'required' or a named function."
                    )))
                }
            },
            Some(Value::Object(named)) => {
                let name = named
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        bad_choice(
                            "Invalid 'tool_choice': expected {\"type\": \"function\", \
                             \"function\": {\"name\": ...}}"
                                .into(),
                        )
                    })?;
                let index = tools.iter().position(|t| t.name == name).ok_or_else(|| {
                    bad_choice(format!(
                        "Invalid 'tool_choice': no function named {name:?} in 'tools'"
                    ))
                })?;
                ToolChoice::Named(index)
            }
            Some(_) => {
                return Err(bad_choice(
                    "Invalid type for 'tool_choice': expected a string or an object".into(),
                ))
            }
        };
        if tools.is_empty() && matches!(choice, ToolChoice::Required) {
            return Err(bad_choice(
                "'tool_choice' is 'required' but no 'tools' are given".into(),
            ));
        }
        Ok(Tools { tools, choice })
    }

    /// The system message that presents the tools to the model, as chat templates do (none
    /// without tools).
    pub fn prompt(&self) -> Option<String> {
        if self.tools.is_empty() {
            return None;
        }
        let mut text = String::from(
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\
             <tools>\n",
        );
        for tool in &self.tools {
            text.push_str(&tool.definition.to_string());
            text.push('\n');
        }
        text.push_str("</tools>");
        Some(text)
    }

    /// The tool this answer calls, if any: `rng` decides for `auto` with probability `p`.
    pub fn pick<R: Rng + ?Sized>(&self, rng: &mut R, p: f64) -> Option<&Tool> {
        if self.tools.is_empty() {
            return None;
        }
        let any = |rng: &mut R| &self.tools[rng.gen_range(0..self.tools.len())];
        match self.choice {
            ToolChoice::None => None,
            ToolChoice::Auto => (rng.gen::<f64>() < p).then(|| any(rng)),
            ToolChoice::Required => Some(any(rng)),
            ToolChoice::Named(i) => self.tools.get(i),
        }
    }
}

fn parse_tool(tool: &Value, i: usize) -> Result<Tool, ApiError> {
    let at = format!("tools[{i}]");
    let bad = |param: String, message: String| ApiError::invalid(message, Some(&param));
    let Some(object) = tool.as_object() else {
        return Err(bad(
            at.clone(),
            format!("Invalid type for '{at}': expected an object"),
        ));
    };
    match object.get("type").and_then(Value::as_str) {
        Some("function") => {}
        _ => {
            return Err(bad(
                format!("{at}.type"),
                format!("Invalid value for '{at}.type': only 'function' tools are supported"),
            ))
        }
    }
    let Some(function) = object.get("function").and_then(Value::as_object) else {
        return Err(bad(
            format!("{at}.function"),
            format!("Missing required parameter: '{at}.function'."),
        ));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if valid_name(name) => name.clone(),
        _ => {
            return Err(bad(
                format!("{at}.function.name"),
                format!(
                    "Invalid '{at}.function.name': a function name is 1 to 64 letters, digits, \
                     underscores or dashes"
                ),
            ))
        }
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) => {
            let param = format!("{at}.function.parameters");
            if !p.is_object() {
                return Err(bad(
                    param.clone(),
                    format!("Invalid '{param}': expected a JSON Schema object"),
                ));
            }
            schema::check(p, &param).map_err(|e| {
                bad(
                    param.clone(),
                    format!("Invalid schema for function {name:?}: {e}"),
                )
            })?;
            p.clone()
        }
    };
    Ok(Tool {
        name,
        parameters,
        definition: tool.clone(),
    })
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A call the answer makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolCall {
    /// `call_` and 24 seeded letters and digits.
    pub id: String,
    /// The function.
    pub name: String,
    /// Its arguments: a JSON object as text (satisfying the function's schema when complete).
    pub arguments: String,
}

impl ToolCall {
    /// A call of `tool` with arguments drawn from its schema, and whether they were cut at
    /// `max_bytes` ([`schema::generate`]).
    pub(crate) fn generate<R: Rng + ?Sized>(
        tool: &Tool,
        rng: &mut R,
        words: &mut dyn schema::Words,
        max_bytes: usize,
    ) -> (ToolCall, bool) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let id: String = (0..24)
            .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
            .collect();
        let generated = schema::generate(&tool.parameters, rng, words, max_bytes);
        let call = ToolCall {
            id: format!("call_{id}"),
            name: tool.name.clone(),
            arguments: generated.value.to_string(),
        };
        (call, generated.truncated)
    }
}

/// The text an assistant message's `tool_calls` add to its content in the prompt (the
/// Hermes/Qwen convention), or an error naming the malformed call.
pub(crate) fn render_tool_calls(calls: &Value, at: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::invalid(
            format!(
                "Invalid '{at}': expected an array of {{\"id\", \"type\": \"function\", \
                 \"function\": {{\"name\", \"arguments\"}}}}"
            ),
            Some(at),
        )
    };
    let calls = calls.as_array().ok_or_else(bad)?;
    let mut text = String::new();
    for call in calls {
        let function = call.get("function").ok_or_else(bad)?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(bad)?;
        let arguments = match function.get("arguments") {
            Some(Value::String(a)) => a.as_str(),
            None | Some(Value::Null) => "{}",
            Some(_) => return Err(bad()),
        };
        text.push_str(&render_call(name, arguments));
    }
    Ok(text)
}

/// The prompt text of calls an answer made (as [`render_tool_calls`] renders them in history).
pub(crate) fn render_calls(calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|c| render_call(&c.name, &c.arguments))
        .collect()
}

fn render_call(name: &str, arguments: &str) -> String {
    format!(
        "<tool_call>\n{{\"name\": {}, \"arguments\": {arguments}}}\n</tool_call>",
        Value::String(name.into())
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn tools(body: Value) -> Result<Tools, ApiError> {
        Tools::parse(body.as_object().expect("an object"))
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    #[test]
    fn choices_parse_and_malformed_tools_are_named() {
        let t = tools(json!({"tools": [weather()]})).expect("valid");
        assert_eq!(t.choice, ToolChoice::Auto);
        let t = tools(json!({"tools": [weather()], "tool_choice":
            {"type": "function", "function": {"name": "get_weather"}}}))
        .expect("valid");
        assert_eq!(t.choice, ToolChoice::Named(0));
        for (body, param) in [
            (json!({"tools": {}}), "tools"),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
            ),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f",
                "parameters": {"type": "object", "properties": {"x": {"type": "nope"}}}}}]}),
                "tools[0].function.parameters",
            ),
            (
                json!({"tools": [weather()], "tool_choice": "sometimes"}),
                "tool_choice",
            ),
            (
                json!({"tools": [weather()], "tool_choice":
                {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
        ] {
            let e = tools(body.clone()).expect_err("malformed");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    #[test]
    fn history_calls_render() {
        let text = render_tool_calls(
            &json!([{"id": "call_1", "type": "function",
                     "function": {"name": "f", "arguments": "{\"a\":1}"}}]),
            "messages[1].tool_calls",
        )
        .expect("valid");
        assert_eq!(
            text,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>"
        );
        assert!(render_tool_calls(&json!({}), "x").is_err());
    }
}
