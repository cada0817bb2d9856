//! JSON Schema at the HTTP edge: [`check`] refuses a malformed schema (a tool's `parameters`,
//! a `response_format.json_schema.schema`) and [`generate`] draws a seeded value that satisfies
//! one: types, `required`, `enum`/`const`, nested objects and arrays with their size bounds,
//! numeric ranges, string lengths and a few formats, `anyOf`/`oneOf`/`allOf` and local `$ref`s.
//!
//! `pattern` and the rarer keywords are accepted and not enforced on generated values.
//!
//! Generation has a byte budget: a value whose text would pass it (a recursive `$ref`, nested
//! `minItems`) stops there, so its cost follows the answer's output limit.

use rand::Rng;
use serde_json::{json, Map, Value};

/// Nesting depth beyond which [`generate`] stops descending (and [`check`] refuses a schema):
/// bounds the work of recursive `$ref`s.
pub(crate) const MAX_DEPTH: usize = 32;

const TYPES: [&str; 7] = [
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Checks that `schema` is a well-formed JSON Schema as far as generation needs: the error
/// names the offending keyword's path under `at`.
pub(crate) fn check(schema: &Value, at: &str) -> Result<(), String> {
    check_at(schema, schema, at, 0)
}

fn check_at(root: &Value, schema: &Value, at: &str, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("'{at}' nests deeper than {MAX_DEPTH} levels"));
    }
    let object = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(object) => object,
        _ => return Err(format!("'{at}' must be a JSON Schema object")),
    };
    match object.get("type") {
        None => {}
        Some(Value::String(t)) if TYPES.contains(&t.as_str()) => {}
        Some(Value::Array(ts))
            if !ts.is_empty()
                && ts
                    .iter()
                    .all(|t| t.as_str().is_some_and(|t| TYPES.contains(&t))) => {}
        Some(t) => {
            return Err(format!(
                "'{at}.type' is {t}, not one of {} (or an array of them)",
                TYPES.join(", ")
            ))
        }
    }
    if let Some(properties) = object.get("properties") {
        let Some(properties) = properties.as_object() else {
            return Err(format!("'{at}.properties' must be an object"));
        };
        for (name, property) in properties {
            check_at(
                root,
                property,
                &format!("{at}.properties.{name}"),
                depth + 1,
            )?;
        }
    }
    if let Some(required) = object.get("required") {
        let ok = required
            .as_array()
            .is_some_and(|r| r.iter().all(Value::is_string));
        if !ok {
            return Err(format!("'{at}.required' must be an array of strings"));
        }
    }
    if let Some(items) = object.get("items") {
        check_at(root, items, &format!("{at}.items"), depth + 1)?;
    }
    if let Some(values) = object.get("enum") {
        if values.as_array().is_none_or(|v| v.is_empty()) {
            return Err(format!("'{at}.enum' must be a non-empty array"));
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(branches) = object.get(key) {
            let Some(branches) = branches.as_array().filter(|b| !b.is_empty()) else {
                return Err(format!("'{at}.{key}' must be a non-empty array of schemas"));
            };
            for (i, branch) in branches.iter().enumerate() {
                check_at(root, branch, &format!("{at}.{key}[{i}]"), depth + 1)?;
            }
        }
    }
    for key in ["minItems", "maxItems", "minLength", "maxLength"] {
        if let Some(v) = object.get(key) {
            if !v.is_u64() {
                return Err(format!("'{at}.{key}' must be a non-negative integer"));
            }
        }
    }
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if let Some(v) = object.get(key) {
            if !v.is_number() {
                return Err(format!("'{at}.{key}' must be a number"));
            }
        }
    }
    if let Some(reference) = object.get("$ref") {
        let resolved = reference
            .as_str()
            .and_then(|r| resolve(root, r))
            .ok_or_else(|| format!("'{at}.$ref' {reference} does not resolve in this schema"))?;
        if resolved.get("$ref").is_some() && std::ptr::eq(resolved, schema) {
            return Err(format!("'{at}.$ref' refers to itself"));
        }
    }
    Ok(())
}

/// A local reference (`#`, `#/$defs/x`, `#/definitions/x`, any JSON pointer into the root).
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        Some(root)
    } else {
        root.pointer(pointer)
    }
}

/// Where generated strings get their words.
pub(crate) trait Words {
    /// One short lowercase word.
    fn word(&mut self) -> String;
}

/// The bytes a generated value may take: once its serialized text reaches them, generation
/// stops descending (an answer already longer than its output limit can show is cut there
/// anyway), so a recursive schema costs what the limit allows, not what the schema nests.
#[derive(Debug)]
struct Budget {
    /// Bytes left; counted on the way (a lower bound of the serialized size).
    left: usize,
}

impl Budget {
    fn spend(&mut self, bytes: usize) {
        self.left = self.left.saturating_sub(bytes);
    }

    fn exhausted(&self) -> bool {
        self.left == 0
    }
}

/// A generated value, and whether the byte budget cut it short.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Generated {
    /// The value (satisfying the schema unless `truncated`).
    pub value: Value,
    /// Generation stopped at the byte budget: nodes beyond it are missing or `null`.
    pub truncated: bool,
}

/// Generates a value satisfying `schema` (itself checked by [`check`]), stopping once its
/// serialized text reaches `max_bytes`. A value within the budget is exactly the one drawn
/// without it.
pub(crate) fn generate<R: Rng + ?Sized>(
    schema: &Value,
    rng: &mut R,
    words: &mut dyn Words,
    max_bytes: usize,
) -> Generated {
    let mut budget = Budget {
        left: max_bytes.max(1),
    };
    let value = generate_at(schema, schema, rng, words, 0, &mut budget);
    Generated {
        value,
        truncated: budget.exhausted(),
    }
}

/// Serialized length of a value the schema gives whole (`const`, `enum`).
fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(1, |v| v.len())
}

fn generate_at<R: Rng + ?Sized>(
    root: &Value,
    schema: &Value,
    rng: &mut R,
    words: &mut dyn Words,
    depth: usize,
    budget: &mut Budget,
) -> Value {
    if budget.exhausted() {
        return Value::Null;
    }
    let Some(object) = schema.as_object() else {
        // `true` (anything) or `false` (nothing can satisfy it): a string either way.
        let word = words.word();
        budget.spend(word.len() + 2);
        return Value::String(word);
    };
    if depth > MAX_DEPTH {
        budget.spend(4);
        return Value::Null;
    }
    if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
        if let Some(target) = resolve(root, reference) {
            return generate_at(root, target, rng, words, depth + 1, budget);
        }
    }
    if let Some(value) = object.get("const") {
        budget.spend(json_len(value));
        return value.clone();
    }
    if let Some(values) = object.get("enum").and_then(Value::as_array) {
        if !values.is_empty() {
            let value = &values[rng.gen_range(0..values.len())];
            budget.spend(json_len(value));
            return value.clone();
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = object.get(key).and_then(Value::as_array) {
            if !branches.is_empty() {
                let branch = &branches[rng.gen_range(0..branches.len())];
                return generate_at(root, branch, rng, words, depth + 1, budget);
            }
        }
    }
    if let Some(branches) = object.get("allOf").and_then(Value::as_array) {
        return generate_all_of(root, object, branches, rng, words, depth, budget);
    }
    let kind = match object.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => {
            let ts: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            let non_null: Vec<&str> = ts.iter().copied().filter(|&t| t != "null").collect();
            match (non_null.is_empty(), ts.is_empty()) {
                (false, _) => non_null[rng.gen_range(0..non_null.len())],
                (true, false) => "null",
                (true, true) => "string",
            }
        }
        _ if object.contains_key("properties") => "object",
        _ if object.contains_key("items") => "array",
        _ => "string",
    };
    match kind {
        "object" => generate_object(root, object, rng, words, depth, budget),
        "array" => {
            let min = bound(object, "minItems").unwrap_or(1);
            let max = bound(object, "maxItems").unwrap_or(min + 2).max(min);
            let count = rng.gen_range(min..=max.min(min + 8));
            let items = object.get("items").cloned().unwrap_or(json!({}));
            budget.spend(2);
            let mut values = Vec::with_capacity(count.min(64));
            for _ in 0..count {
                if budget.exhausted() {
                    break;
                }
                // The comma before every item but the first.
                budget.spend(usize::from(!values.is_empty()));
                values.push(generate_at(root, &items, rng, words, depth + 1, budget));
            }
            Value::Array(values)
        }
        "integer" => {
            let (lo, hi) = range(object, true);
            let lo = lo.ceil() as i64;
            let hi = (hi.floor() as i64).max(lo);
            budget.spend(1);
            json!(rng.gen_range(lo..=hi))
        }
        "number" => {
            let (lo, hi) = range(object, false);
            let x = lo + rng.gen::<f64>() * (hi - lo).max(0.0);
            let rounded = (x * 100.0).round() / 100.0;
            budget.spend(1);
            json!(if (lo..=hi).contains(&rounded) {
                rounded
            } else {
                x
            })
        }
        "boolean" => {
            budget.spend(4);
            Value::Bool(rng.gen())
        }
        "null" => {
            budget.spend(4);
            Value::Null
        }
        _ => {
            let s = generate_string(object, rng, words);
            budget.spend(s.len() + 2);
            Value::String(s)
        }
    }
}

fn generate_all_of<R: Rng + ?Sized>(
    root: &Value,
    object: &Map<String, Value>,
    branches: &[Value],
    rng: &mut R,
    words: &mut dyn Words,
    depth: usize,
    budget: &mut Budget,
) -> Value {
    // Objects merge their properties and requirements; anything else takes the first branch.
    let mut merged = object.clone();
    merged.remove("allOf");
    let mut properties = Map::new();
    let mut required = Vec::new();
    for branch in branches {
        let branch = match branch.get("$ref").and_then(Value::as_str) {
            Some(r) => resolve(root, r).unwrap_or(branch),
            None => branch,
        };
        if let Some(p) = branch.get("properties").and_then(Value::as_object) {
            properties.extend(p.clone());
        }
        if let Some(r) = branch.get("required").and_then(Value::as_array) {
            required.extend(r.iter().cloned());
        }
    }
    if properties.is_empty() {
        let first = branches.first().unwrap_or(&Value::Bool(true));
        return generate_at(root, first, rng, words, depth + 1, budget);
    }
    if let Some(p) = object.get("properties").and_then(Value::as_object) {
        properties.extend(p.clone());
    }
    merged.insert("type".into(), json!("object"));
    merged.insert("properties".into(), Value::Object(properties));
    merged.insert("required".into(), Value::Array(required));
    generate_object(root, &merged, rng, words, depth, budget)
}

fn generate_object<R: Rng + ?Sized>(
    root: &Value,
    object: &Map<String, Value>,
    rng: &mut R,
    words: &mut dyn Words,
    depth: usize,
    budget: &mut Budget,
) -> Value {
    let required: Vec<&str> = object
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Map::new();
    budget.spend(2);
    match object.get("properties").and_then(Value::as_object) {
        Some(properties) => {
            for (name, property) in properties {
                if budget.exhausted() {
                    break;
                }
                if required.contains(&name.as_str()) || rng.gen_bool(0.5) {
                    // `"name":`, after a comma unless it is the first.
                    budget.spend(name.len() + 3 + usize::from(!out.is_empty()));
                    out.insert(
                        name.clone(),
                        generate_at(root, property, rng, words, depth + 1, budget),
                    );
                }
            }
        }
        None if object.get("additionalProperties") != Some(&Value::Bool(false)) => {
            for _ in 0..rng.gen_range(1..=3) {
                let (key, value) = (words.word(), words.word());
                budget.spend(key.len() + value.len() + 5 + usize::from(!out.is_empty()));
                out.insert(key, Value::String(value));
            }
        }
        None => {}
    }
    if budget.exhausted() {
        return Value::Object(out);
    }
    // Required names without a property schema still get a value.
    for name in required {
        if !out.contains_key(name) {
            let word = words.word();
            budget.spend(name.len() + word.len() + 5 + usize::from(!out.is_empty()));
            out.insert(name.to_string(), Value::String(word));
        }
    }
    Value::Object(out)
}

fn bound(object: &Map<String, Value>, key: &str) -> Option<usize> {
    object
        .get(key)
        .and_then(Value::as_u64)
        .map(|v| v.min(1 << 16) as usize)
}

/// The inclusive range a number must fall in (exclusive bounds nudged inwards).
fn range(object: &Map<String, Value>, integer: bool) -> (f64, f64) {
    let step = if integer { 1.0 } else { 0.01 };
    let get = |k: &str| object.get(k).and_then(Value::as_f64);
    let lo = get("minimum")
        .into_iter()
        .chain(get("exclusiveMinimum").map(|v| v + step))
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.max(v)))
        });
    let hi = get("maximum")
        .into_iter()
        .chain(get("exclusiveMaximum").map(|v| v - step))
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.min(v)))
        });
    match (lo, hi) {
        (Some(lo), Some(hi)) => (lo, hi.max(lo)),
        (Some(lo), None) => (lo, lo + 100.0),
        (None, Some(hi)) => ((hi - 100.0).min(hi.min(0.0)), hi),
        (None, None) => (0.0, 100.0),
    }
}

fn generate_string<R: Rng + ?Sized>(
    object: &Map<String, Value>,
    rng: &mut R,
    words: &mut dyn Words,
) -> String {
    let formatted = match object.get("format").and_then(Value::as_str) {
        Some("date-time") => Some(format!(
            "2025-{:02}-{:02}T{:02}:{:02}:00Z",
            rng.gen_range(1..=12),
            rng.gen_range(1..=28),
            rng.gen_range(0..24),
            rng.gen_range(0..60)
        )),
        Some("date") => Some(format!(
            "2025-{:02}-{:02}",
            rng.gen_range(1..=12),
            rng.gen_range(1..=28)
        )),
        Some("email") => Some(format!("{}@example.com", words.word())),
        Some("uri") | Some("url") => Some(format!("https://example.com/{}", words.word())),
        Some("uuid") => Some(format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            rng.gen::<u32>(),
            rng.gen::<u16>(),
            rng.gen_range(0..0x1000u16),
            rng.gen_range(0..0x1000u16),
            rng.gen::<u64>() & 0xffff_ffff_ffff
        )),
        _ => None,
    };
    let min = bound(object, "minLength").unwrap_or(0);
    let max = bound(object, "maxLength");
    let mut s = formatted.unwrap_or_else(|| {
        let n = rng.gen_range(1..=4);
        (0..n).map(|_| words.word()).collect::<Vec<_>>().join(" ")
    });
    while s.chars().count() < min {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&words.word());
    }
    if let Some(max) = max {
        if s.chars().count() > max {
            s = s.chars().take(max).collect();
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    struct Fixed(usize);

    impl Words for Fixed {
        fn word(&mut self) -> String {
            self.0 += 1;
            format!("w{}", self.0)
        }
    }

    fn weather() -> Value {
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 3, "maxLength": 12},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "where": {"$ref": "#/$defs/point"},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
                "ok": {"type": ["boolean", "null"]}
            },
            "required": ["city", "unit", "days", "where", "tags"],
            "$defs": {"point": {"type": "object", "properties": {
                "lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "exclusiveMinimum": -180, "exclusiveMaximum": 180}
            }, "required": ["lat", "lon"]}}
        })
    }

    #[test]
    fn generated_values_satisfy_the_schema() {
        let schema = weather();
        check(&schema, "s").expect("well formed");
        let mut words = Fixed(0);
        for seed in 0..200 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let v = generate(&schema, &mut rng, &mut words, usize::MAX).value;
            let city = v["city"].as_str().expect("city");
            assert!((3..=12).contains(&city.chars().count()), "{v}");
            assert!(["celsius", "fahrenheit"].contains(&v["unit"].as_str().expect("unit")));
            let days = v["days"].as_i64().expect("days");
            assert!((1..=7).contains(&days), "{v}");
            let lat = v["where"]["lat"].as_f64().expect("lat");
            let lon = v["where"]["lon"].as_f64().expect("lon");
            assert!(
                (-90.0..=90.0).contains(&lat) && lon > -180.0 && lon < 180.0,
                "{v}"
            );
            let tags = v["tags"].as_array().expect("tags");
            assert!((2..=3).contains(&tags.len()) && tags.iter().all(Value::is_string));
            assert!(v.get("ok").is_none_or(|ok| ok.is_boolean() || ok.is_null()));
        }
    }

    #[test]
    fn malformed_schemas_are_named() {
        for (schema, names) in [
            (json!({"type": "strin"}), "s.type"),
            (json!({"properties": []}), "s.properties"),
            (
                json!({"properties": {"a": {"type": 3}}}),
                "s.properties.a.type",
            ),
            (json!({"required": "a"}), "s.required"),
            (json!({"enum": []}), "s.enum"),
            (json!({"items": 5}), "s.items"),
            (json!({"$ref": "#/$defs/missing"}), "s.$ref"),
            (json!({"minItems": -1}), "s.minItems"),
            (json!("object"), "'s'"),
        ] {
            let e = check(&schema, "s").expect_err("malformed");
            assert!(e.contains(names), "{e} should name {names}");
        }
        assert!(check(&json!({}), "s").is_ok());
        assert!(check(&json!(true), "s").is_ok());
    }

    #[test]
    fn same_seed_same_value() {
        let schema = weather();
        let a = generate(
            &schema,
            &mut ChaCha8Rng::seed_from_u64(9),
            &mut Fixed(0),
            1 << 20,
        );
        let b = generate(
            &schema,
            &mut ChaCha8Rng::seed_from_u64(9),
            &mut Fixed(0),
            1 << 20,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn the_byte_budget_cuts_recursive_schemas_and_leaves_smaller_values_alone() {
        let schema = weather();
        for seed in 0..50 {
            let whole = generate(
                &schema,
                &mut ChaCha8Rng::seed_from_u64(seed),
                &mut Fixed(0),
                usize::MAX,
            );
            let text = whole.value.to_string();
            let fits = generate(
                &schema,
                &mut ChaCha8Rng::seed_from_u64(seed),
                &mut Fixed(0),
                text.len() + 1,
            );
            assert_eq!(
                fits,
                Generated {
                    value: whole.value.clone(),
                    truncated: false
                }
            );
        }
        let recursive = json!({
            "$defs": {"n": {"type": "array", "minItems": 2, "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n"
        });
        check(&recursive, "s").expect("well formed");
        for max_bytes in [1, 100, 10_000, 1_000_000] {
            let cut = generate(
                &recursive,
                &mut ChaCha8Rng::seed_from_u64(1),
                &mut Fixed(0),
                max_bytes,
            );
            assert!(cut.truncated);
            let len = cut.value.to_string().len();
            // The counted bytes are a lower bound: the text passes the budget by little.
            assert!(
                len >= max_bytes && len <= 2 * max_bytes + 64,
                "{len} for {max_bytes}"
            );
        }
    }
}
