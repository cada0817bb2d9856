//! The one duration grammar of the command lines (`loadgen bench --slo ttft=200ms`, `mockserve
//! fleet --worker-faults 2=down@10s..20s`, `mockserve replay --autoscale-tick 30s`): a decimal
//! number, then a unit, `us`, `ms` or `s` (`250us`, `500ms`, `2.5s`, `1e3ms`; blanks around the number are allowed). A bare
//! number is read in the caller's default unit where it has one, and is an error otherwise.
//! Negative, infinite and NaN durations are refused; each caller bounds the value itself.

/// A unit of the grammar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds (`us`).
    Micros,
    /// Milliseconds (`ms`).
    Millis,
    /// Seconds (`s`).
    Seconds,
}

impl Unit {
    /// Milliseconds in one of this unit.
    fn ms(self) -> f64 {
        match self {
            Unit::Micros => 1e-3,
            Unit::Millis => 1.0,
            Unit::Seconds => 1e3,
        }
    }
}

/// Longest part of a bad duration an error repeats; the rest is counted in bytes.
const SHOWN_CHARS: usize = 48;

/// Why a duration cannot be read; each message repeats the text (cut at 48 characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// A bare number where the caller has no default unit.
    #[error("{0} needs a unit: us, ms or s")]
    NoUnit(String),
    /// The part before the unit is not a decimal number.
    #[error("{0} is not a number of us, ms or s")]
    NotANumber(String),
    /// Negative, infinite or NaN.
    #[error("{0} must be a finite duration >= 0")]
    OutOfRange(String),
}

/// `text` quoted for an error, cut at [`SHOWN_CHARS`] characters.
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
    }
}

/// The duration `text` names, in milliseconds; a bare number is in `bare` (an error when None).
pub fn parse_ms(text: &str, bare: Option<Unit>) -> Result<f64, DurationError> {
    let trimmed = text.trim();
    let (number, unit) = if let Some(n) = trimmed.strip_suffix("us") {
        (n, Unit::Micros)
    } else if let Some(n) = trimmed.strip_suffix("ms") {
        (n, Unit::Millis)
    } else if let Some(n) = trimmed.strip_suffix('s') {
        (n, Unit::Seconds)
    } else {
        match bare {
            Some(unit) => (trimmed, unit),
            None => return Err(DurationError::NoUnit(shown(text))),
        }
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| DurationError::NotANumber(shown(text)))?;
    if !value.is_finite() || value < 0.0 {
        return Err(DurationError::OutOfRange(shown(text)));
    }
    Ok(value * unit.ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_the_callers_default() {
        for (text, bare, ms) in [
            ("250us", None, 0.25),
            ("500ms", None, 500.0),
            ("2.5s", None, 2500.0),
            (" 2 s ", None, 2000.0),
            ("1e3ms", None, 1000.0),
            ("0s", None, 0.0),
            ("200", Some(Unit::Millis), 200.0),
            ("3", Some(Unit::Seconds), 3000.0),
        ] {
            assert_eq!(parse_ms(text, bare), Ok(ms), "{text}");
        }
    }

    #[test]
    fn errors_repeat_the_text_and_say_what_is_wrong() {
        for (text, bare, message) in [
            ("5", None, r#""5" needs a unit: us, ms or s"#),
            (
                "fast",
                Some(Unit::Millis),
                r#""fast" is not a number of us, ms or s"#,
            ),
            ("ms", None, r#""ms" is not a number of us, ms or s"#),
            ("2h", None, r#""2h" needs a unit: us, ms or s"#),
            ("-1s", None, r#""-1s" must be a finite duration >= 0"#),
            ("infs", None, r#""infs" must be a finite duration >= 0"#),
            ("NaNms", None, r#""NaNms" must be a finite duration >= 0"#),
            (
                "123456789012345678901234567890123456789012345678901234567890x",
                None,
                r#""123456789012345678901234567890123456789012345678"... (61 bytes) needs a unit: us, ms or s"#,
            ),
        ] {
            let e = parse_ms(text, bare).expect_err(text);
            assert_eq!(e.to_string(), message, "{text}");
        }
    }
}
