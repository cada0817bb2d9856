//! [`LoadgenError`]: everything that stops a run or makes it fail.

use std::path::PathBuf;

/// Why a loadgen command failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadgenError {
    /// A flag value or combination is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The embedded server's settings are invalid.
    #[error("embedded server: {0}")]
    Server(#[from] servesim::scheduler::ConfigError),
    /// The embedded server could not be started.
    #[error("starting the embedded server: {0}")]
    Embedded(String),
    /// The trace could not be read (line-numbered, as `mockserve replay`).
    #[error(transparent)]
    Trace(#[from] servesim::trace::TraceError),
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
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A results file is not loadgen/multiturn_bench JSON.
    #[error("{path}: not a multiturn results file: {message}")]
    BadResults {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The tokio runtime could not be started.
    #[error("starting the tokio runtime: {0}")]
    Runtime(std::io::Error),
}
