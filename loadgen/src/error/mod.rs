//! [`LoadgenError`]: everything that stops a run or makes it fail; `convert`'s and `dataset`'s
//! own errors are here too (the bottom layer), each wrapped by one variant.

pub(crate) mod convert;
pub(crate) mod dataset;

use std::path::PathBuf;

/// Why a loadgen command failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    /// A flag value or combination is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A flag's value is outside the range loadgen accepts (`crate::limits`).
    #[error("invalid configuration: {flag} must be {allowed}, got {got}")]
    OutOfRange {
        /// The flag, e.g. `--concurrency`.
        flag: String,
        /// The value given, as it is shown (scientific notation for huge numbers).
        got: String,
        /// The allowed range, e.g. `from 1 to 100000`.
        allowed: String,
    },
    /// `loadgen calibrate` cannot compare its two sides: records that are not of the trace, no
    /// matching request, an offline replay that failed.
    #[error("calibrate: {0}")]
    Calibrate(String),
    /// The embedded server's settings are invalid.
    #[error("embedded server: {0}")]
    Server(#[from] servesim::scheduler::ConfigError),
    /// The embedded server could not be started.
    #[error("starting the embedded server: {0}")]
    Embedded(String),
    /// The trace could not be read (line-numbered, as `mockserve replay`).
    #[error(transparent)]
    Trace(#[from] servesim::trace::TraceError),
    /// `loadgen trace convert` could not read its input (line-numbered).
    #[error(transparent)]
    Convert(#[from] convert::ConvertError),
    /// A `--dataset` file cannot be used (line-numbered, or the conversation named).
    #[error(transparent)]
    Dataset(#[from] dataset::DatasetError),
    /// `--tokenizer` could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] servesim::tokenizer::TokenizerError),
    /// `GET /v1/models` failed or returned something unusable.
    #[error("model detection at {url}: {message}")]
    ModelDetection {
        /// The models URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The endpoint serves no model.
    #[error("No models found at endpoint {url}. Is a backend running?")]
    NoModels {
        /// The models URL.
        url: String,
    },
    /// The endpoint serves several models and `--model` was not given.
    #[error("Multiple models available at {url} ({}). Please specify --model explicitly.", models.join(", "))]
    MultipleModels {
        /// The models URL.
        url: String,
        /// Their ids.
        models: Vec<String>,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(String),
    /// Every request failed.
    #[error("all {total} requests failed")]
    AllFailed {
        /// Requests sent.
        total: usize,
    },
    /// The server fell behind its own schedule by more than `--max-server-lateness` (or did
    /// not say how late it was).
    #[error("{0}")]
    ServerLate(String),
    /// Too many requests failed.
    #[error("{failed} of {total} requests failed ({:.1}%), above --max-failure-rate {:.1}%", 100.0 * *failed as f64 / *total as f64, 100.0 * max_rate)]
    TooManyFailures {
        /// Failed requests.
        failed: usize,
        /// Requests sent.
        total: usize,
        /// The allowed share.
        max_rate: f64,
    },
    /// `calibrate --gate`: the prediction is not equivalent to the measurement on these
    /// metrics (TOST at the margin failed on the mean or the p90, or had no pairs).
    #[error("calibrate --gate: TOST at ±{margin} failed on {}", failed.join(", "))]
    GateFailed {
        /// The metrics whose verdict failed, by report key.
        failed: Vec<String>,
        /// The margin.
        margin: f64,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A report or record could not be serialised for its file; nothing (or, in a JSONL file,
    /// nothing from that line on) was written.
    #[error("{}: cannot write {what}: {source}", path.display())]
    Serialize {
        /// The file.
        path: PathBuf,
        /// `the report` or `line N`.
        what: String,
        /// The serialiser's error.
        #[source]
        source: serde_json::Error,
    },
    /// A file loadgen reads back (a report, a per-request record file) or one of its lines
    /// passes its size cap (`crate::capped`); nothing past the cap was read.
    #[error("{}: {what} passes the {cap}-byte cap ({constant})", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// `the file` or `line N`.
        what: String,
        /// The cap in bytes.
        cap: u64,
        /// The constant's name.
        constant: &'static str,
    },
    /// A results file is not loadgen/multiturn_bench JSON.
    #[error("{path}: not a multiturn results file: {message}")]
    BadResults {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// `loadgen profile` stopped before it had a profile; the points measured so far are saved.
    #[error("profile: {message} (measurements so far saved to {})", partial.display())]
    Profile {
        /// Why it stopped.
        message: String,
        /// The file holding the measurements so far.
        partial: PathBuf,
    },
    /// The tokio runtime could not be started.
    #[error("starting the tokio runtime: {0}")]
    Runtime(std::io::Error),
}

impl LoadgenError {
    /// The process exit status for this error: [`EXIT_TOO_MANY_FAILURES`] when the run completed
    /// (reports written) but failed the `--max-failure-rate` check, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            LoadgenError::AllFailed { .. } | LoadgenError::TooManyFailures { .. } => {
                EXIT_TOO_MANY_FAILURES
            }
            LoadgenError::GateFailed { .. } => EXIT_GATE_FAILED,
            _ => 1,
        }
    }
}

/// Exit status of a run that completed but whose failed requests are above
/// `--max-failure-rate` (or all of them failed). Other errors exit with 1, flag errors with 2.
pub const EXIT_TOO_MANY_FAILURES: u8 = 3;

/// Exit status of `loadgen calibrate --gate` when a gated metric failed its TOST verdict (after
/// the report is written).
pub const EXIT_GATE_FAILED: u8 = 4;

/// An error and its causes on one line, each cause once (a cause whose text the message already
/// holds is not repeated): `cannot read trace t.jsonl: No such file or directory (os error 2)`.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_the_os_error_once() {
        let missing = std::path::Path::new("/nonexistent/loadgen-trace.jsonl");
        let trace = servesim::trace::load(missing, &servesim::trace::TraceOptions::default())
            .expect_err("missing file");
        let text = chain(&LoadgenError::from(trace));
        assert!(text.contains("loadgen-trace.jsonl"), "{text}");
        assert!(text.contains("os error 2"), "{text}");
        let io = LoadgenError::Io {
            path: missing.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        let text = chain(&io);
        assert_eq!(text.matches("not found").count(), 1, "{text}");
    }
}
