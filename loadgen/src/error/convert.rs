//! [`ConvertError`]: why `loadgen trace convert` could not read its input.

/// Why a conversion failed: a malformed input line (1-based), an empty input, an input that
/// cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A line is malformed.
    #[error("{source_name}:{line}: {message}")]
    Line {
        /// The input file.
        source_name: String,
        /// 1-based line.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The input holds no request (nothing, blank lines, or only failed records).
    #[error("{source_name}: no requests to convert ({why})")]
    Empty {
        /// The input file.
        source_name: String,
        /// Why.
        why: String,
    },
    /// The input is larger than the engine's `MAX_TRACE_FILE_BYTES`.
    #[error("{source_name}: the input is larger than {cap} bytes, the most a conversion reads")]
    TooLarge {
        /// The input file.
        source_name: String,
        /// The cap, in bytes.
        cap: usize,
    },
    /// The input could not be read.
    #[error("cannot read {source_name}")]
    Read {
        /// The input file.
        source_name: String,
        /// The I/O error.
        source: std::io::Error,
    },
}
