//! The Prometheus text exposition format, read leniently: [`parse`] gives every sample it can
//! read ([`PromSample`]) and skips any line it cannot, never an error.

/// One sample of the text format: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    /// Metric name (with its `_total` / `_bucket` suffix as written).
    pub name: String,
    /// Labels in written order.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl PromSample {
    /// The value of label `key`.
    pub(crate) fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus (or OpenMetrics) text format; comments, blank lines and lines that do
/// not parse are skipped.
pub fn parse(text: &str) -> Vec<PromSample> {
    text.lines().filter_map(parse_line).collect()
}

/// True for the characters a metric name is made of.
pub(super) fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

pub(super) fn parse_line(line: &str) -> Option<PromSample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(is_name_char) {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let value_text = rest.split_whitespace().next()?;
    let value = match value_text {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().ok()?,
    };
    Some(PromSample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Labels after the `{`: `(labels, text after the closing brace)`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(tail) = s.strip_prefix('}') {
            return Some((labels, tail));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => {
                    let (_, e) = chars.next()?;
                    value.push(match e {
                        'n' => '\n',
                        other => other,
                    });
                }
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::scrape::fixtures::VLLM;
    use crate::observe::scrape::snapshot::Snapshot;

    #[test]
    fn the_text_format_is_read_and_garbage_is_skipped() {
        let s = parse(VLLM);
        assert_eq!(s.len(), 11);
        assert_eq!(s[0].name, "vllm:num_requests_running");
        assert_eq!(s[0].label("model_name"), Some("m"));
        assert_eq!(s[10].label("le"), Some("+Inf"));
        let odd = parse(
            "a{x=\"q\\\"uo,te}\"} 1 1700000000\nb +Inf\nc NaN\n{broken 1\nd{x=\"unterminated} 2\ne{} \nf{x=\"1\"} notanumber\n\u{0}\u{ff}garbage\n\n   \ng 3e-2",
        );
        let names: Vec<&str> = odd.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "g"]);
        assert_eq!(odd[0].label("x"), Some("q\"uo,te}"));
        assert_eq!(odd[1].value, f64::INFINITY);
        // Any bytes at all: never a panic.
        let mut junk = String::new();
        for i in 0..2000u32 {
            junk.push(char::from_u32((i * 7919) % 0x2FF).unwrap_or('x'));
            if i % 37 == 0 {
                junk.push('\n');
            }
        }
        let _ = parse(&junk);
        let _ = Snapshot::of(&parse(&junk));
    }
}
