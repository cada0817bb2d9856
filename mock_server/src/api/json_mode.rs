//! `response_format`: plain text, any JSON object (`json_object`) or a value of a given JSON
//! schema (`json_schema`). In the JSON modes the answer text is one valid JSON document, drawn
//! from the request's seed and sized after the sampled output length.

use rand::Rng;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::schema;

/// What the answer text must be.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum ResponseFormat {
    /// Free text (`{"type": "text"}` or no `response_format`).
    #[default]
    Text,
    /// A JSON object.
    JsonObject,
    /// A value of this schema (checked by [`schema::check`]).
    JsonSchema(Value),
}

impl ResponseFormat {
    /// Parses `response_format`; anything malformed is a 400 naming it.
    pub(crate) fn parse(body: &Map<String, Value>) -> Result<ResponseFormat, ApiError> {
        const PARAM: &str = "response_format";
        let format = match body.get(PARAM) {
            None | Some(Value::Null) => return Ok(ResponseFormat::Text),
            Some(Value::Object(format)) => format,
            Some(_) => {
                return Err(ApiError::invalid(
                    "Invalid type for 'response_format': expected an object",
                    Some(PARAM),
                ))
            }
        };
        match format.get("type").and_then(Value::as_str) {
            Some("text") => Ok(ResponseFormat::Text),
            Some("json_object") => Ok(ResponseFormat::JsonObject),
            Some("json_schema") => {
                let at = "response_format.json_schema";
                let schema = format
                    .get("json_schema")
                    .and_then(|s| s.get("schema"))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("Missing required parameter: '{at}.schema'."),
                            Some(at),
                        )
                    })?;
                let at = "response_format.json_schema.schema";
                schema::check(schema, at).map_err(|e| ApiError::invalid(e, Some(at)))?;
                Ok(ResponseFormat::JsonSchema(schema.clone()))
            }
            _ => Err(ApiError::invalid(
                "Invalid 'response_format.type': expected 'text', 'json_object' or 'json_schema'",
                Some("response_format.type"),
            )),
        }
    }

    /// The answer text in a JSON mode (None for free text). A `json_object` answer grows field
    /// by field until `size(text)` reaches `target` (tokens, say), so answers still vary in
    /// length, but never past `max` while a smaller object fits; a schema's value is as its
    /// schema makes it, cut at `max_bytes` ([`schema::generate`]; the flag says whether it was).
    pub(crate) fn generate<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        words: &mut dyn schema::Words,
        (target, max): (usize, usize),
        max_bytes: usize,
        size: &dyn Fn(&str) -> usize,
    ) -> Option<(String, bool)> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonSchema(s) => {
                let generated = schema::generate(s, rng, words, max_bytes);
                Some((generated.value.to_string(), generated.truncated))
            }
            ResponseFormat::JsonObject => {
                let mut object = Map::new();
                let mut fitting: Option<String> = None;
                loop {
                    let key = format!("{}_{}", words.word(), object.len());
                    let n = rng.gen_range(1..=6);
                    let value: Vec<String> = (0..n).map(|_| words.word()).collect();
                    object.insert(key, Value::String(value.join(" ")));
                    let text = Value::Object(object.clone()).to_string();
                    let tokens = size(&text);
                    if tokens > max {
                        return Some((fitting.unwrap_or(text), false));
                    }
                    if tokens >= target || object.len() >= 4096 {
                        return Some((text, false));
                    }
                    fitting = Some(text);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<ResponseFormat, ApiError> {
        ResponseFormat::parse(body.as_object().expect("an object"))
    }

    #[test]
    fn formats_parse_and_bad_ones_are_named() {
        assert_eq!(parse(json!({})), Ok(ResponseFormat::Text));
        assert_eq!(
            parse(json!({"response_format": {"type": "json_object"}})),
            Ok(ResponseFormat::JsonObject)
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            parse(json!({"response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema.clone()}}})),
            Ok(ResponseFormat::JsonSchema(schema))
        );
        for (body, param) in [
            (json!({"response_format": "json"}), "response_format"),
            (
                json!({"response_format": {"type": "yaml"}}),
                "response_format.type",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
            ),
            (
                json!({"response_format": {"type": "json_schema",
                    "json_schema": {"schema": {"type": "thing"}}}}),
                "response_format.json_schema.schema",
            ),
        ] {
            let e = parse(body.clone()).expect_err("malformed");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }
}
