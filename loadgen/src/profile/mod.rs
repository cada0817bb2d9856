//! `loadgen profile`: measures an endpoint's latency and writes it as a profile in Dynamo
//! mocker's format (the `.npz` that `--perf-profile` and Dynamo's mocker read, its JSON twin, and
//! an SVG of both curves).
//!
//! - **Prefill**: TTFT at concurrency 1 over a grid of prompt lengths, `max_tokens` 1, every
//!   prompt distinct from its first token (no prefix-cache hits), several samples per point,
//!   less the client overhead (the median round trip of an empty-prompt request, which the
//!   server answers without running the model). With `--prefill-from decode-gap` the prefill
//!   time is instead what the same requests add to the token gap of a concurrent single decode
//!   stream: the engine's time only, without the server's request handling (a frontend's
//!   tokenization and routing are in the TTFT but not in an engine profile).
//! - **Decode**: `N` concurrent streams with prompts of `C` tokens over a grid of batch sizes and
//!   context lengths; the steady part is the window in which every stream has its first token
//!   and none has finished (no prefill runs then), and its median inter-token gap is the decode
//!   step time at active KV tokens = the streams' summed context and context length = their mean
//!   context, both taken at the middle of the window.
//!
//! Measurement runs in `measure`; `fit` turns the points into tables, a summary and the SVG.
//! `run_fit` fits the same tables from the per-request records of a trace run instead of a
//! probe (`loadgen calibrate --fit`).
//! A request that fails mid-profile stops the run with [`LoadgenError::Profile`] after the points
//! measured so far are written next to `--output` (`*.partial.json`).

pub(crate) mod fit;
pub(crate) mod measure;
pub(crate) mod run_fit;

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::error::LoadgenError;
use crate::limits;
use crate::run::target::{Api, EmbeddedOptions, TargetArgs};
use fit::Measurements;

/// `loadgen profile` flags: the grids, samples and time budget, plus the shared target flags
/// (`--url`, `--tokenizer`, and every engine flag of the embedded server, `--perf-profile`
/// included).
#[derive(Args, Clone, Debug)]
pub struct ProfileArgs {
    /// The profile to write (mocker-format .npz); its JSON twin and an SVG of both curves are
    /// written next to it (same name, .json and .svg).
    #[arg(long, default_value = "profile.npz")]
    pub output: PathBuf,

    /// Prompt lengths of the prefill curve, comma-separated (each at most 2^22, at most 64).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "128,512,1024,2048,4096,8192"
    )]
    pub prefill_isl: Vec<usize>,

    /// TTFT samples per prompt length (the median is used), 1 to 1000.
    #[arg(long, default_value_t = 3)]
    pub prefill_samples: usize,

    /// How prefill time is measured: ttft (TTFT at concurrency 1 less the client overhead:
    /// includes the server's own request handling, e.g. a frontend's tokenization) or
    /// decode-gap (the pass that prefills the prompt delays the next token of a concurrent
    /// single decode stream by the prefill time: engine time only).
    #[arg(long, value_enum, default_value_t = PrefillMethod::Ttft)]
    pub prefill_from: PrefillMethod,

    /// Concurrent streams of the decode grid, comma-separated (each at most 100000; a point's
    /// streams hold at most 2^28 tokens).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub decode_batch_sizes: Vec<usize>,

    /// Prompt lengths of the decode grid's streams, comma-separated (each at most 2^22).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,8192")]
    pub decode_context_lengths: Vec<usize>,

    /// Output tokens per stream measured while every stream decodes (each stream asks for these
    /// plus enough to outlast the others' prefill).
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,

    /// Prompt tokens the server is assumed to prefill per pass at least (sizes the extra output
    /// tokens that keep the first streams decoding until the last one has its first token).
    #[arg(long, default_value_t = 2048)]
    pub prefill_chunk: usize,

    /// Stop measuring after this many seconds and write what was measured (at most 604800).
    #[arg(long, default_value_t = 600.0)]
    pub time_budget_s: f64,

    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,

    /// Where requests go (without --url: the embedded server, one worker unless
    /// --num-workers says otherwise).
    #[command(flatten)]
    pub target: TargetArgs,
}

/// `--prefill-from`: what the prefill curve is made of.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillMethod {
    /// TTFT at concurrency 1 less the client overhead.
    #[default]
    Ttft,
    /// The extra time the prefill adds to a concurrent decode stream's token gap.
    DecodeGap,
}

/// A validated profile run.
#[derive(Clone, Debug)]
pub struct ProfilePlan {
    /// Prefill prompt lengths, increasing.
    pub prefill_isl: Vec<usize>,
    /// Samples per prompt length.
    pub prefill_samples: usize,
    /// What the prefill curve is made of.
    pub prefill_from: PrefillMethod,
    /// Decode points: (batch size, context length), in run order.
    pub decode: Vec<(usize, usize)>,
    /// Steady output tokens per stream.
    pub decode_tokens: usize,
    /// Assumed prefill tokens per pass.
    pub prefill_chunk: usize,
    /// Measuring stops after this.
    pub time_budget: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
}

impl ProfilePlan {
    /// Output tokens a stream of a decode point asks for: the steady tokens plus one per pass
    /// the batch's prefill may take, plus one per stream (the requests of a large batch reach
    /// a busy server over several passes).
    pub(crate) fn stream_tokens(&self, batch_size: usize, context_length: usize) -> usize {
        let prefill_passes = (batch_size * context_length).div_ceil(self.prefill_chunk.max(1));
        self.decode_tokens + prefill_passes + batch_size + 2
    }
}

/// The three files a run writes.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputPaths {
    /// The mocker-format `.npz`.
    pub npz: PathBuf,
    /// The same tables as JSON, with the raw measurements.
    pub json: PathBuf,
    /// Both curves.
    pub svg: PathBuf,
    /// The measurements of an interrupted run.
    pub partial: PathBuf,
}

impl OutputPaths {
    /// The files next to `output`.
    pub(crate) fn of(output: &Path) -> OutputPaths {
        let stem = output.with_extension("");
        let with = |ext: &str| {
            let mut p = stem.clone().into_os_string();
            p.push(ext);
            PathBuf::from(p)
        };
        OutputPaths {
            npz: output.to_path_buf(),
            json: with(".json"),
            svg: with(".svg"),
            partial: with(".partial.json"),
        }
    }
}

impl ProfileArgs {
    /// Validates the flags.
    pub fn plan(&self) -> Result<ProfilePlan, LoadgenError> {
        let bad = |m: String| Err(LoadgenError::Config(m));
        let ext = self
            .output
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if ext == "json" || ext == "svg" {
            return bad(format!(
                "--output {} names the .npz; the .json and .svg are written next to it",
                self.output.display()
            ));
        }
        for (flag, values, max) in [
            (
                "--prefill-isl",
                &self.prefill_isl,
                limits::MAX_PROMPT_TOKENS,
            ),
            (
                "--decode-batch-sizes",
                &self.decode_batch_sizes,
                limits::MAX_CONCURRENCY,
            ),
            (
                "--decode-context-lengths",
                &self.decode_context_lengths,
                limits::MAX_PROMPT_TOKENS,
            ),
        ] {
            limits::count(
                &format!("the number of {flag} values"),
                values.len(),
                0,
                limits::MAX_GRID_VALUES,
            )?;
            for &v in values {
                limits::count(flag, v, 0, max)?;
            }
        }
        limits::count(
            "--prefill-samples",
            self.prefill_samples,
            1,
            limits::MAX_PROFILE_SAMPLES,
        )?;
        limits::count(
            "--decode-tokens",
            self.decode_tokens,
            4,
            limits::MAX_OUTPUT_TOKENS,
        )?;
        limits::count(
            "--prefill-chunk",
            self.prefill_chunk,
            1,
            limits::MAX_PROMPT_TOKENS,
        )?;
        let time_budget_s = limits::positive(
            "--time-budget-s",
            self.time_budget_s,
            limits::MAX_DURATION_S,
        )?;
        let mut prefill_isl = self.prefill_isl.clone();
        prefill_isl.sort_unstable();
        prefill_isl.dedup();
        if prefill_isl.len() < 2 || prefill_isl[0] == 0 {
            return bad("--prefill-isl needs at least 2 distinct positive lengths".into());
        }
        if self.prefill_samples == 0 {
            return bad("--prefill-samples must be positive".into());
        }
        let mut batches = self.decode_batch_sizes.clone();
        batches.sort_unstable();
        batches.dedup();
        let mut contexts = self.decode_context_lengths.clone();
        contexts.sort_unstable();
        contexts.dedup();
        if batches.is_empty() || batches[0] == 0 {
            return bad("--decode-batch-sizes needs positive batch sizes".into());
        }
        if contexts.len() < 2 || contexts[0] == 0 {
            return bad(
                "--decode-context-lengths needs at least 2 distinct positive lengths".into(),
            );
        }
        if self.decode_tokens < 4 {
            return bad("--decode-tokens must be at least 4".into());
        }
        if self.prefill_chunk == 0 {
            return bad("--prefill-chunk must be positive".into());
        }
        let decode: Vec<(usize, usize)> = contexts
            .iter()
            .flat_map(|&c| batches.iter().map(move |&b| (b, c)))
            .collect();
        for &(b, c) in &decode {
            limits::product(
                "a decode point's batch size x (context length + output tokens)",
                &[
                    b,
                    c + self.decode_tokens + b * c / self.prefill_chunk + b + 2,
                ],
                limits::MAX_TOKENS_IN_FLIGHT,
                "MAX_TOKENS_IN_FLIGHT",
            )?;
        }
        limits::output_paths([("--output", Some(self.output.as_path()))])?;
        Ok(ProfilePlan {
            prefill_isl,
            prefill_samples: self.prefill_samples,
            prefill_from: self.prefill_from,
            decode,
            decode_tokens: self.decode_tokens,
            prefill_chunk: self.prefill_chunk,
            time_budget: Duration::from_secs_f64(time_budget_s),
            progress: !self.quiet,
        })
    }
}

/// What a completed run produced.
#[derive(Clone, Debug)]
pub struct ProfileRun {
    /// The raw points.
    pub measurements: Measurements,
    /// The profile written.
    pub tables: servesim::perf::ProfileTables,
    /// Where.
    pub paths: OutputPaths,
}

/// Runs `loadgen profile`: measure, fit, write the three files, print the summary.
pub async fn profile(args: &ProfileArgs) -> Result<ProfileRun, LoadgenError> {
    let plan = args.plan()?;
    let mut target_args = args.target.clone();
    // A profile describes one engine: the embedded server runs one worker unless told otherwise.
    target_args.engine.num_workers.get_or_insert(1);
    let spec = target_args.spec(&EmbeddedOptions::default())?;
    if let Some(server) = &spec.server {
        let engine = &server.cluster.engine;
        if let Some(&isl) = plan
            .prefill_isl
            .iter()
            .find(|&&isl| isl > engine.max_num_batched_tokens)
        {
            crate::stdout::errln!(
                "loadgen: warning: --prefill-isl {isl} is above the embedded server's \
                 --max-num-batched-tokens ({}): its prefill takes several passes",
                engine.max_num_batched_tokens
            );
        }
        crate::stdout::outln!(
            "Profiling the embedded server: latency model {}",
            engine.latency.model.describe()
        );
    }
    let paths = OutputPaths::of(&args.output);
    // Fail on an unwritable output before measuring for minutes.
    crate::write::bytes(&paths.partial, b"{}\n")?;
    let _ = std::fs::remove_file(&paths.partial);
    let connected = spec.connect(Api::Completions).await?;
    let result = measure::run(&connected, &plan).await;
    connected.shutdown().await;
    let (measurements, failure) = match result {
        Ok(m) => (m, None),
        Err((m, message)) => (m, Some(message)),
    };
    if let Some(message) = failure {
        crate::write::json(&paths.partial, &measurements)?;
        return Err(LoadgenError::Profile {
            message,
            partial: paths.partial,
        });
    }
    let tables = fit::tables(&measurements).map_err(|message| LoadgenError::Profile {
        message: format!("the measurements do not make a profile: {message}"),
        partial: paths.partial.clone(),
    });
    let tables = match tables {
        Ok(t) => t,
        Err(e) => {
            crate::write::json(&paths.partial, &measurements)?;
            return Err(e);
        }
    };
    tables.save(&paths.npz).map_err(|e| LoadgenError::Io {
        path: paths.npz.clone(),
        source: std::io::Error::other(e),
    })?;
    crate::write::json(
        &paths.json,
        &WithMeasurements {
            tables: &tables,
            measurements: &measurements,
        },
    )?;
    crate::write::bytes(&paths.svg, fit::svg(&tables, &measurements))?;
    crate::stdout::out!("\n{}", fit::summary(&measurements, Some(&tables)));
    crate::stdout::outln!(
        "\nSaved profile to {} (JSON {}, curves {})",
        paths.npz.display(),
        paths.json.display(),
        paths.svg.display()
    );
    Ok(ProfileRun {
        measurements,
        tables,
        paths,
    })
}

/// The profile's JSON twin: the fitted tables' keys, then `measurements` (the points they were
/// fitted to).
struct WithMeasurements<'a, T, M> {
    tables: &'a T,
    measurements: &'a M,
}

impl<T: serde::Serialize, M: serde::Serialize> serde::Serialize for WithMeasurements<'_, T, M> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error as _;
        let mut json = serde_json::to_value(self.tables).map_err(S::Error::custom)?;
        let measurements = serde_json::to_value(self.measurements).map_err(S::Error::custom)?;
        match json.as_object_mut() {
            Some(obj) => {
                obj.insert("measurements".into(), measurements);
            }
            None => return Err(S::Error::custom("the fitted tables are not a JSON object")),
        }
        json.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> ProfileArgs {
        let mut argv = vec!["loadgen", "profile"];
        argv.extend_from_slice(flags);
        match crate::Cli::try_parse_from(argv).expect("parses").command {
            crate::Command::Profile(a) => a,
            _ => panic!("profile"),
        }
    }

    #[test]
    fn flags_become_a_plan() {
        let plan = args(&[
            "--prefill-isl",
            "512,128,512",
            "--decode-batch-sizes",
            "4,1",
        ])
        .plan()
        .expect("valid");
        assert_eq!(plan.prefill_isl, [128, 512]);
        assert_eq!(plan.decode[..2], [(1, 512), (4, 512)]);
        assert_eq!(plan.decode.len(), 6);
        // 4 streams of 2048 tokens, 2048 per pass: 4 passes of prefill, 4 streams, plus 32
        // steady tokens.
        assert_eq!(plan.stream_tokens(4, 2048), 42);
        for (flags, needle) in [
            (&["--prefill-isl", "128"][..], "--prefill-isl"),
            (&["--prefill-samples", "0"][..], "--prefill-samples"),
            (
                &["--decode-context-lengths", "512"][..],
                "--decode-context-lengths",
            ),
            (&["--decode-batch-sizes", "0"][..], "--decode-batch-sizes"),
            (&["--output", "p.json"][..], "--output"),
            (&["--time-budget-s", "nan"][..], "--time-budget-s"),
        ] {
            let msg = args(flags).plan().expect_err("refused").to_string();
            assert!(msg.contains(needle), "{flags:?}: {msg}");
        }
    }

    #[test]
    fn output_files_sit_next_to_the_npz() {
        let p = OutputPaths::of(Path::new("out/h200.npz"));
        assert_eq!(p.json, Path::new("out/h200.json"));
        assert_eq!(p.svg, Path::new("out/h200.svg"));
        assert_eq!(p.partial, Path::new("out/h200.partial.json"));
    }
}
