//! The stable mutation runner: seeds from a corpus directory, then seeded mutations for a time
//! budget, each input run by a watchdog thread that turns a panic into a violation and a
//! checker that does not return in time into a hang.
//!
//! The inputs depend only on the seed and the corpus; the budget decides how many of them run.
//! On the first violation the runner stops and returns a [`Finding`] (seed, iteration, the input
//! escaped and in hex) and saves the input to a file that replays it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::costly::is_costly_seed;
use crate::mutate::Mutator;
use crate::Target;

/// Mutants kept as bases for further mutation, besides the corpus.
const POOL: usize = 256;

/// Bytes of an input shown in a [`Finding`] (the saved file has all of it).
const SHOWN_BYTES: usize = 512;

/// How to run one target.
#[derive(Clone, Debug)]
pub struct FuzzOptions {
    /// Seeds the mutation generator: the same seed and corpus give the same inputs.
    pub seed: u64,
    /// Stop mutating after this long (the corpus always runs in full first).
    pub budget: Duration,
    /// Stop after this many inputs, corpus included, if earlier.
    pub max_iterations: Option<u64>,
    /// A checker that has not returned after this long is a hang.
    pub hang_timeout: Duration,
    /// The seed inputs: every file in this directory.
    pub corpus_dir: PathBuf,
    /// Where a violating input is saved (under `<target>/`); nowhere when `None`.
    pub findings_dir: Option<PathBuf>,
}

/// What a run that found nothing did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FuzzStats {
    /// Inputs checked, corpus included.
    pub iterations: u64,
    /// Seed inputs.
    pub corpus: usize,
    /// Wall-clock time spent.
    pub elapsed: Duration,
    /// The longest one input took to check.
    pub slowest: Duration,
}

/// An input that violates a property, and how to get it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// The target.
    pub target: &'static str,
    /// The mutation seed of the run.
    pub seed: u64,
    /// 0-based index of the input in the run (corpus files first, in name order).
    pub iteration: u64,
    /// The input.
    pub input: Vec<u8>,
    /// The violated property, as the checker said it.
    pub message: String,
    /// The file the input was saved to.
    pub saved: Option<PathBuf>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = &self.input[..self.input.len().min(SHOWN_BYTES)];
        let more = if shown.len() < self.input.len() {
            format!(" (first {} shown)", shown.len())
        } else {
            String::new()
        };
        writeln!(
            f,
            "fuzz target `{}` violated a property at iteration {} with seed {}:",
            self.target, self.iteration, self.seed
        )?;
        writeln!(f, "{}", self.message)?;
        writeln!(f, "input, {} bytes{more}, escaped:", self.input.len())?;
        writeln!(f, "{}", shown.escape_ascii())?;
        writeln!(f, "hex:")?;
        for row in shown.chunks(32) {
            let hex: String = row.iter().map(|b| format!("{b:02x}")).collect();
            writeln!(f, "{hex}")?;
        }
        match &self.saved {
            Some(path) => write!(
                f,
                "saved to {}; replay it by copying it into fuzz/regressions/{}/ and running \
                 `cargo test -p servesim_fuzzing --test fuzz corpus_and_regressions`, or with \
                 `cargo +nightly fuzz run {} {}`",
                path.display(),
                self.target,
                self.target,
                path.display()
            ),
            None => write!(f, "not saved (no findings directory)"),
        }
    }
}

/// Why a run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    /// The corpus directory could not be read.
    #[error("cannot read the corpus {}: {source}", path.display())]
    Corpus {
        /// The directory or file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The corpus directory holds no input.
    #[error("the corpus {} holds no input", path.display())]
    EmptyCorpus {
        /// The directory.
        path: PathBuf,
    },
    /// The watchdog thread could not be started.
    #[error("cannot start the watchdog thread: {0}")]
    Thread(io::Error),
    /// An input violated a property.
    #[error("{0}")]
    Violation(Box<Finding>),
}

/// Every file directly in `dir`, sorted by name, with its bytes; dot files are skipped, and so
/// are the costly seeds ([`crate::costly::is_costly_seed`]), which are checked one process at a
/// time: a server that spends on them without bound would abort the process at the heap
/// ceiling, or keep a thread busy for minutes, and take every other check with it.
pub fn load_corpus(dir: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>, FuzzError> {
    let corpus_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FuzzError::Corpus { path, source }
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(corpus_err(dir))? {
        let entry = entry.map_err(corpus_err(dir))?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        let skipped = hidden || is_costly_seed(&entry.path());
        if !skipped && entry.file_type().map_err(corpus_err(dir))?.is_file() {
            paths.push(entry.path());
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path).map_err(corpus_err(&path))?;
            Ok((path, bytes))
        })
        .collect()
}

/// Runs a checker on its own thread and waits for it at most a timeout.
struct Watchdog {
    inputs: mpsc::Sender<Vec<u8>>,
    verdicts: mpsc::Receiver<Result<(), String>>,
    timeout: Duration,
}

impl Watchdog {
    fn spawn(target: &Target, timeout: Duration) -> Result<Watchdog, FuzzError> {
        let (inputs, input_rx) = mpsc::channel::<Vec<u8>>();
        let (verdict_tx, verdicts) = mpsc::channel();
        let check = target.check;
        std::thread::Builder::new()
            .name(format!("fuzz-{}", target.name))
            .spawn(move || {
                for input in input_rx {
                    let verdict = std::panic::catch_unwind(|| check(&input)).map_err(|payload| {
                        payload
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "the checker panicked".to_string())
                    });
                    if verdict_tx.send(verdict).is_err() {
                        break;
                    }
                }
            })
            .map_err(FuzzError::Thread)?;
        Ok(Watchdog {
            inputs,
            verdicts,
            timeout,
        })
    }

    /// The checker's verdict on `input`; a checker still running after the timeout is left
    /// behind (it cannot be stopped) and this watchdog is spent.
    fn run(&self, input: &[u8]) -> Result<(), String> {
        self.inputs
            .send(input.to_vec())
            .map_err(|_| "the checker thread is gone".to_string())?;
        match self.verdicts.recv_timeout(self.timeout) {
            Ok(verdict) => verdict,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
                "the checker did not return within {:?} (hang)",
                self.timeout
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the checker thread died without a verdict".to_string())
            }
        }
    }
}

/// Checks one input once, under a watchdog.
pub fn check_once(target: &Target, input: &[u8], hang_timeout: Duration) -> Result<(), String> {
    Watchdog::spawn(target, hang_timeout)
        .map_err(|e| e.to_string())?
        .run(input)
}

/// Runs the corpus, then seeded mutants until the budget is spent; the first violation stops it.
pub fn fuzz(target: &'static Target, options: &FuzzOptions) -> Result<FuzzStats, FuzzError> {
    let started = Instant::now();
    let corpus = load_corpus(&options.corpus_dir)?;
    if corpus.is_empty() {
        return Err(FuzzError::EmptyCorpus {
            path: options.corpus_dir.clone(),
        });
    }
    let seeds = corpus.len();
    let mut pool: Vec<Vec<u8>> = corpus.into_iter().map(|(_, bytes)| bytes).collect();
    let watchdog = Watchdog::spawn(target, options.hang_timeout)?;
    let violation = |iteration: u64, input: &[u8], message: String| {
        let mut finding = Finding {
            target: target.name,
            seed: options.seed,
            iteration,
            input: input.to_vec(),
            message,
            saved: None,
        };
        if let Some(dir) = &options.findings_dir {
            let dir = dir.join(target.name);
            let path = dir.join(format!("seed-{}-iteration-{iteration}", options.seed));
            if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&path, input).is_ok() {
                finding.saved = Some(path);
            }
        }
        FuzzError::Violation(Box::new(finding))
    };
    let mut iteration = 0u64;
    let mut slowest = Duration::ZERO;
    let mut timed_run = |input: &[u8]| {
        let start = Instant::now();
        let verdict = watchdog.run(input);
        slowest = slowest.max(start.elapsed());
        verdict
    };
    for input in &pool {
        timed_run(input).map_err(|m| violation(iteration, input, m))?;
        iteration += 1;
    }
    let mutator = Mutator::new(target);
    let mut rng = ChaCha8Rng::seed_from_u64(options.seed);
    while started.elapsed() < options.budget
        && options.max_iterations.is_none_or(|max| iteration < max)
    {
        // Half the bases are seeds, so mutants that wandered off do not crowd them out.
        let base = match rng.gen_bool(0.5) {
            true => &pool[rng.gen_range(0..seeds)],
            false => &pool[rng.gen_range(0..pool.len())],
        };
        let other = &pool[rng.gen_range(0..pool.len())];
        let input = mutator.mutate(&mut rng, base, other);
        if let Err(message) = timed_run(&input) {
            return Err(violation(iteration, &input, message));
        }
        // Some mutants become bases: stacked mutations reach further than one step from a seed.
        if rng.gen_bool(0.1) {
            if pool.len() < seeds + POOL {
                pool.push(input);
            } else {
                let slot = rng.gen_range(seeds..pool.len());
                pool[slot] = input;
            }
        }
        iteration += 1;
    }
    Ok(FuzzStats {
        iterations: iteration,
        corpus: seeds,
        elapsed: started.elapsed(),
        slowest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn panics_on_x(data: &[u8]) {
        assert!(!data.contains(&b'x'), "found an x");
    }

    fn hangs_on_h(data: &[u8]) {
        if data.contains(&b'h') {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    const ALPHABET: &[&[u8]] = &[b"a", b"x", b"h"];

    fn toy(name: &'static str, check: fn(&[u8])) -> &'static Target {
        Box::leak(Box::new(Target {
            name,
            check,
            dictionary: ALPHABET,
            fields: &[],
            max_len: 64,
        }))
    }

    fn options(dir: &Path, seed: u64) -> FuzzOptions {
        FuzzOptions {
            seed,
            budget: Duration::from_secs(60),
            max_iterations: Some(100_000),
            hang_timeout: Duration::from_secs(1),
            corpus_dir: dir.join("corpus"),
            findings_dir: Some(dir.join("findings")),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("servesim-fuzz-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("corpus")).expect("scratch dir");
        std::fs::write(dir.join("corpus").join("seed"), b"aaaa").expect("seed");
        dir
    }

    #[test]
    fn a_violation_is_found_saved_and_reproducible() {
        let dir = scratch("violation");
        let target = toy("toy_panic", panics_on_x);
        // A loaded machine must not turn the panic into a hang.
        let patient = |seed| FuzzOptions {
            hang_timeout: Duration::from_secs(30),
            ..options(&dir, seed)
        };
        let find = |seed| match fuzz(target, &patient(seed)) {
            Err(FuzzError::Violation(finding)) => finding,
            other => panic!("expected a violation, got {other:?}"),
        };
        let finding = find(3);
        assert!(
            finding.message.contains("found an x"),
            "{}",
            finding.message
        );
        let saved = std::fs::read(finding.saved.as_ref().expect("saved")).expect("readable");
        assert_eq!(saved, finding.input);
        assert_eq!(
            find(3),
            finding,
            "the same seed finds the same input at the same step"
        );
        assert!(check_once(target, &saved, Duration::from_secs(5)).is_err());
        let text = finding.to_string();
        assert!(text.contains("seed 3") && text.contains("hex:"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hang_is_a_violation() {
        let dir = scratch("hang");
        match fuzz(toy("toy_hang", hangs_on_h), &options(&dir, 0)) {
            Err(FuzzError::Violation(finding)) => {
                assert!(finding.message.contains("hang"), "{}", finding.message);
                assert!(finding.input.contains(&b'h'));
            }
            other => panic!("expected a hang, got {other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_clean_run_stops_at_its_limit() {
        let dir = scratch("clean");
        let mut opts = options(&dir, 0);
        opts.max_iterations = Some(500);
        let stats = fuzz(toy("toy_clean", |_| {}), &opts).expect("nothing to find");
        assert_eq!((stats.iterations, stats.corpus), (500, 1));
        assert!(stats.slowest <= stats.elapsed);
        opts.corpus_dir = dir.join("findings");
        assert!(matches!(
            fuzz(toy("toy_clean", |_| {}), &opts),
            Err(FuzzError::Corpus { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
