//! `mockserve plan`: which deployment serves a trace within SLOs, for the fewest GPUs.
//!
//! - [`args`] is the command line; [`run`] the command (a search, or `plan merge`).
//! - [`space`] reads the search space (a TOML file of replay flag names) into candidates.
//! - [`trial`] replays one candidate and measures its goodput, SLO attainment and highest
//!   arrival speed-up.
//! - [`ledger`] writes every trial as a JSON line as it finishes, and reads ledgers back to
//!   resume a run or merge shards.
//! - [`verify`] checks the best candidate live (`--verify`) through the loadgen binary.
//! - [`report`] ranks the trials (objective, Pareto front) into the JSON report, the console
//!   table and the HTML page, from the ledger's records alone, so a merged run and an unsharded
//!   one write the same bytes.
//!
//! Trials run on scoped threads; each is a deterministic replay, so the figures do not depend
//! on the thread count or the order in which trials finish.

pub mod args;
mod html;
pub mod ledger;
pub mod report;
pub mod space;
pub mod trial;
pub mod verify;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use rand::SeedableRng;

use args::{MergeArgs, SearchCommand};
use ledger::{Header, TrialRecord};
use space::Candidate;

/// A plan's bad input, naming the flag or the space key.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A command-line flag.
    #[error("{0}")]
    Flag(String),
    /// The space file.
    #[error("--space: {0}")]
    Space(String),
    /// A ledger file.
    #[error("{0}")]
    Ledger(String),
}

/// What the ranking maximizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    /// Goodput per GPU.
    GoodputPerGpu,
    /// Total goodput.
    Goodput,
    /// The fewest GPUs meeting the SLOs at the attainment.
    FewestGpus,
    /// The front of goodput per GPU against tokens/s per user.
    Pareto,
}

impl Objective {
    /// Its flag value.
    pub fn name(self) -> &'static str {
        match self {
            Objective::GoodputPerGpu => "goodput-per-gpu",
            Objective::Goodput => "goodput",
            Objective::FewestGpus => "fewest-gpus",
            Objective::Pareto => "pareto",
        }
    }
}

impl std::str::FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "goodput-per-gpu" => Objective::GoodputPerGpu,
            "goodput" => Objective::Goodput,
            "fewest-gpus" => Objective::FewestGpus,
            "pareto" => Objective::Pareto,
            _ => {
                return Err(format!(
                    "unknown objective {s:?} (goodput-per-gpu, goodput, fewest-gpus, pareto)"
                ))
            }
        })
    }
}

/// How candidates are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every candidate.
    Grid,
    /// `--max-trials` seeded draws without replacement.
    Random,
    /// Successive halving on growing trace prefixes.
    Halving,
}

impl Strategy {
    /// Its flag value.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Grid => "grid",
            Strategy::Random => "random",
            Strategy::Halving => "halving",
        }
    }
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "grid" => Strategy::Grid,
            "random" => Strategy::Random,
            "halving" => Strategy::Halving,
            _ => return Err(format!("unknown strategy {s:?} (grid, random, halving)")),
        })
    }
}

/// `--shard I/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This shard, from 0.
    pub index: usize,
    /// Shards in all.
    pub count: usize,
}

impl std::str::FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("expected I/N, got {s:?}"))?;
        let (index, count) = (
            i.trim()
                .parse::<usize>()
                .map_err(|e| format!("{i:?}: {e}"))?,
            n.trim()
                .parse::<usize>()
                .map_err(|e| format!("{n:?}: {e}"))?,
        );
        if count == 0 || index >= count {
            return Err(format!("I must be below N and N above 0, got {s}"));
        }
        Ok(Shard { index, count })
    }
}

/// The attainment the speed-up search and `fewest-gpus` use without `--attainment`.
pub const DEFAULT_ATTAINMENT: f64 = 0.9;

/// Halving keeps one candidate in this many per round.
const ETA: usize = 3;

/// Halving rounds on prefixes before the full trace, at most.
const MAX_PREFIX_ROUNDS: u32 = 3;

/// Runs trials on `jobs` threads; each result is appended to the ledger as it finishes and
/// returned in the order of `todo`. Trials already in `done` are not rerun.
struct Runner<'a> {
    words: Vec<String>,
    settings: trial::Settings<'a>,
    cache: trial::TraceCache,
    jobs: usize,
    ledger: Option<ledger::Appender>,
    done: HashMap<(String, Option<usize>), TrialRecord>,
    quiet: bool,
    best: Option<f64>,
}

impl Runner<'_> {
    fn run(
        &mut self,
        todo: &[(Candidate, Option<usize>)],
        label: &str,
    ) -> anyhow::Result<Vec<TrialRecord>> {
        let mut out: Vec<Option<TrialRecord>> = vec![None; todo.len()];
        let mut pending = Vec::new();
        for (i, (c, prefix)) in todo.iter().enumerate() {
            match self.done.get(&(c.key(), *prefix)) {
                Some(r) => out[i] = Some(r.clone()),
                None => pending.push(i),
            }
        }
        let bar = if self.quiet || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(todo.len() as u64)
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix} {bar:30} {pos}/{len} trials {elapsed} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_prefix(label.to_string());
        bar.set_position((todo.len() - pending.len()) as u64);
        let next = AtomicUsize::new(0);
        let (tx, rx) = mpsc::channel::<(usize, TrialRecord)>();
        let words = &self.words;
        let settings = &self.settings;
        let cache = &self.cache;
        let pending_ref = &pending;
        let mut write_error = None;
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.min(pending.len()) {
                let tx = tx.clone();
                let next = &next;
                scope.spawn(move || loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = pending_ref.get(k) else {
                        break;
                    };
                    let (c, prefix) = &todo[i];
                    let mut all = words.clone();
                    all.extend(c.flags.iter().cloned());
                    let result = trial::evaluate(&all, c.gpus, *prefix, settings, cache);
                    let record = TrialRecord::new(c, *prefix, result);
                    if tx.send((i, record)).is_err() {
                        break;
                    }
                });
            }
            drop(tx);
            for (i, record) in rx {
                if let (Some(ledger), None) = (&mut self.ledger, &write_error) {
                    if let Err(e) = ledger.append(&record) {
                        write_error = Some(e);
                    }
                }
                if let (None, Some(f)) = (record.prefix_sessions, &record.figures) {
                    if self.best.is_none_or(|b| f.goodput_per_gpu_tok_s > b) {
                        self.best = Some(f.goodput_per_gpu_tok_s);
                    }
                }
                if let Some(b) = self.best {
                    bar.set_message(format!("best {b:.1} goodput tok/s/GPU"));
                }
                bar.inc(1);
                out[i] = Some(record);
            }
        });
        bar.finish_and_clear();
        if let Some(e) = write_error {
            return Err(e.into());
        }
        // Every record goes through its JSON line, as a resumed or merged run reads it.
        out.into_iter()
            .map(|r| {
                let r = r.ok_or_else(|| anyhow::anyhow!("a trial thread stopped"))?;
                Ok(ledger::roundtrip(&r)?)
            })
            .collect()
    }
}

/// Validates the search flags.
fn check_flags(cmd: &SearchCommand) -> Result<(), PlanError> {
    let s = &cmd.search;
    if s.slo.is_empty() {
        return Err(PlanError::Flag(
            "--slo: give at least one bound, e.g. ttft=2000ms,tpot=50ms".into(),
        ));
    }
    if let Some(q) = s.attainment.filter(|q| !(0.0..=1.0).contains(q)) {
        return Err(PlanError::Flag(format!(
            "--attainment must be from 0 to 1, got {q}"
        )));
    }
    if s.jobs == Some(0) {
        return Err(PlanError::Flag("--jobs must be at least 1".into()));
    }
    if s.max_trials == Some(0) {
        return Err(PlanError::Flag("--max-trials must be at least 1".into()));
    }
    if s.top == 0 {
        return Err(PlanError::Flag("--top must be at least 1".into()));
    }
    if s.shard.is_some() && s.strategy == Strategy::Halving {
        return Err(PlanError::Flag(
            "--shard needs --strategy grid or random (halving picks each round from every \
             shard's results)"
                .into(),
        ));
    }
    Ok(())
}

/// `mockserve plan`: a search over a trace ([`search`]), or a merge of shard ledgers
/// ([`merge`]).
pub fn run(args: &args::PlanArgs) -> anyhow::Result<()> {
    match args {
        args::PlanArgs::Search(search) => self::search(search),
        args::PlanArgs::Merge(merge) => self::merge(merge),
    }
}

/// `mockserve plan TRACE ...`.
pub fn search(cmd: &SearchCommand) -> anyhow::Result<()> {
    check_flags(cmd)?;
    let s = &cmd.search;
    let profiles = cmd
        .profiles
        .iter()
        .map(|p| space::parse_profile(p))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, p) in profiles.iter().enumerate() {
        if profiles[..i].iter().any(|q| q.name == p.name) {
            return Err(PlanError::Flag(format!(
                "--perf-profile: the name {:?} is given twice",
                p.name
            ))
            .into());
        }
    }
    // The trace, or "" for synthetic load (its flags are among the fixed ones).
    let trace = cmd
        .trace
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut fixed = cmd.fixed.clone();
    let replay_cmd =
        <crate::cmd::replay::ReplayArgs as clap::Args>::augment_args(clap::Command::new("replay"));
    let space = space::parse(&s.space, &replay_cmd, &fixed)?;
    let searched_profile = space
        .dims
        .iter()
        .chain(space.disagg.iter().flatten())
        .any(|d| d.key == "perf_profile");
    if searched_profile && profiles.is_empty() {
        return Err(PlanError::Space(
            "key perf_profile names profiles, but no --perf-profile NAME=PATH:GPUS is given".into(),
        )
        .into());
    }
    if profiles.len() == 1 && !searched_profile {
        fixed.push("--perf-profile".into());
        fixed.push(profiles[0].path.clone());
    }
    let mut base: Vec<String> = cmd.trace.iter().map(|_| trace.clone()).collect();
    base.extend(fixed.iter().cloned());
    let replay =
        trial::parse_replay(&base).map_err(|e| PlanError::Flag(format!("fixed flags: {e}")))?;
    args::check_input(&s.slo, &replay)?;
    // Every value of every key, alone over the fixed flags: a bad one is named by its key.
    for d in space.dims.iter().chain(space.disagg.iter().flatten()) {
        for v in &d.values {
            let mut words = base.clone();
            if let space::Value::Arg(arg, _) = v {
                if d.key == "perf_profile" {
                    continue;
                }
                words.push(format!("--{}", d.long));
                words.push(arg.clone());
            }
            if let Err(e) = trial::parse_replay(&words) {
                return Err(PlanError::Space(format!("key {}: {e}", d.key)).into());
            }
        }
    }
    let choices = if searched_profile {
        1
    } else {
        profiles.len().max(1)
    };
    let size = space.size(choices);
    if size > space::MAX_CANDIDATES && s.max_trials.is_none() {
        return Err(PlanError::Space(format!(
            "{size} candidates, over the cap of {}: give --max-trials N (with --strategy random \
             or halving) or narrow the space",
            space::MAX_CANDIDATES
        ))
        .into());
    }
    let (all, dropped) = space.candidates(&profiles, &fixed)?;
    if all.is_empty() {
        return Err(PlanError::Space(format!(
            "no candidate left: all {dropped} exceed [constraints] max_gpus = {}",
            space.max_gpus.unwrap_or(0)
        ))
        .into());
    }
    let chosen: Vec<Candidate> = match s.strategy {
        Strategy::Grid => {
            if let Some(m) = s.max_trials.filter(|m| *m < all.len()) {
                return Err(PlanError::Flag(format!(
                    "--max-trials {m}: the grid has {} candidates; use --strategy random or \
                     halving to try fewer",
                    all.len()
                ))
                .into());
            }
            all.clone()
        }
        Strategy::Random | Strategy::Halving => {
            let n = s
                .max_trials
                .unwrap_or(if s.strategy == Strategy::Random {
                    64
                } else {
                    all.len()
                })
                .min(all.len());
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed(&cmd.fixed));
            let mut picked = rand::seq::index::sample(&mut rng, all.len(), n).into_vec();
            picked.sort_unstable();
            picked.into_iter().map(|i| all[i].clone()).collect()
        }
    };
    let chosen: Vec<Candidate> = match s.shard {
        Some(sh) => chosen
            .into_iter()
            .filter(|c| c.index % sh.count == sh.index)
            .collect(),
        None => chosen,
    };
    let header = Header::new(
        &trace,
        &fixed,
        s,
        all.len(),
        ledger::space_hash(&all),
        seed(&cmd.fixed),
    );
    let mut done = HashMap::new();
    let appender = match &s.ledger {
        Some(path) => {
            let (app, previous) = ledger::Appender::open(path, &header)?;
            for r in previous {
                done.insert((r.candidate.clone(), r.prefix_sessions), r);
            }
            Some(app)
        }
        None => None,
    };
    if !done.is_empty() && !cmd.quiet {
        eprintln!(
            "mockserve: resuming: {} trials already in the ledger are not rerun",
            done.len()
        );
    }
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let jobs = s.jobs.unwrap_or(cores);
    let slo = s.slo;
    let mut runner = Runner {
        words: base,
        settings: trial::Settings {
            slo: &slo,
            attainment: s.attainment.unwrap_or(DEFAULT_ATTAINMENT),
            speedup_steps: s.speedup_steps,
            early_stop: if s.no_early_stop {
                trial::EarlyStop::Off
            } else if trials_stop(s) {
                trial::EarlyStop::Trials
            } else {
                trial::EarlyStop::Steps
            },
            // Trials on every core leave none to a replay's helper threads.
            one_thread: jobs >= cores,
        },
        cache: trial::TraceCache::default(),
        jobs,
        ledger: appender,
        done,
        quiet: cmd.quiet,
        best: None,
    };
    let records = match s.strategy {
        Strategy::Grid | Strategy::Random => {
            let todo: Vec<_> = chosen.into_iter().map(|c| (c, None)).collect();
            runner.run(&todo, s.strategy.name())?
        }
        Strategy::Halving => halving(&mut runner, chosen, &header)?,
    };
    let mut report = report::Report::build(&header, records, s.top);
    if !s.verify {
        report.write(cmd.report_json.as_deref(), s.html.as_deref())?;
        return report.verdict();
    }
    let Some(best) = report.best().cloned() else {
        report.write(cmd.report_json.as_deref(), s.html.as_deref())?;
        report.verdict()?;
        anyhow::bail!("--verify: no candidate ranks, so none is checked");
    };
    let opts = verify::Options {
        speedup: s.verify_speedup,
        url: s.url.as_deref(),
        timeout: std::time::Duration::from_secs(s.verify_timeout_s),
        slo: &slo,
        attainment: s.attainment.unwrap_or(DEFAULT_ATTAINMENT),
    };
    if !cmd.quiet {
        match s.url {
            Some(ref url) => eprintln!(
                "mockserve: verifying the best candidate on {url} at arrival speed-up {}",
                s.verify_speedup
            ),
            None => eprintln!(
                "mockserve: verifying the best candidate live on loopback, its whole clock {}x \
                 faster",
                s.verify_speedup
            ),
        }
    }
    match verify::run(&header, &best, &opts, &runner.cache) {
        Ok(v) => {
            report.add_verify(v.json, &v.table);
            report.write(cmd.report_json.as_deref(), s.html.as_deref())?;
            report.verdict()?;
            if v.failures > 0 {
                anyhow::bail!(
                    "--verify: {} requests failed in the live run (the report's verify has the \
                     figures of the rest); by reason: {}",
                    v.failures,
                    v.reasons
                );
            }
            Ok(())
        }
        Err(e) => {
            report.write(cmd.report_json.as_deref(), s.html.as_deref())?;
            Err(e)
        }
    }
}

/// True when trials stop once their SLO is lost: the ranking keeps only the candidates that
/// meet the SLOs at the attainment (`--attainment`, or `fewest-gpus`), so a candidate below it
/// needs no figures; `--no-early-stop` runs them in full. Without either, the ranking ranks
/// every candidate by its figures, and only the speed-up search's steps stop early.
pub(crate) fn trials_stop(s: &args::SearchArgs) -> bool {
    !s.no_early_stop && (s.attainment.is_some() || s.objective == Objective::FewestGpus)
}

/// The seed: the replay's `--seed` (the router's tie-breaks), which also seeds the draws.
fn seed(fixed: &[String]) -> u64 {
    space::flag_value(fixed, "seed")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Successive halving: every candidate on a short prefix of the trace's sessions, the best
/// third on a prefix three times longer, and so on up to the whole trace.
fn halving(
    runner: &mut Runner,
    mut alive: Vec<Candidate>,
    header: &Header,
) -> anyhow::Result<Vec<TrialRecord>> {
    let base = trial::parse_replay(&runner.words).map_err(anyhow::Error::msg)?;
    let sessions = runner
        .cache
        .sessions(&base)
        .map_err(|e| anyhow::anyhow!("{}: {e}", header.trace))?;
    let mut rounds = 0u32;
    while rounds < MAX_PREFIX_ROUNDS && alive.len() > ETA.pow(rounds) {
        rounds += 1;
    }
    let mut records = Vec::new();
    for r in 0..=rounds {
        let left = rounds - r;
        let prefix = (left > 0).then(|| sessions.div_ceil(ETA.pow(left)).max(1));
        let todo: Vec<_> = alive.iter().map(|c| (c.clone(), prefix)).collect();
        let label = format!("halving {}/{}", r + 1, rounds + 1);
        let got = runner.run(&todo, &label)?;
        if left > 0 {
            let keep = alive.len().div_ceil(ETA).max(1);
            let order = report::order(header, &got);
            alive = order
                .into_iter()
                .take(keep)
                .map(|i| alive[i].clone())
                .collect();
            alive.sort_by_key(|c| c.index);
        }
        records.extend(got);
    }
    Ok(records)
}

/// `mockserve plan merge LEDGER... --report-json R.json`.
pub fn merge(args: &MergeArgs) -> anyhow::Result<()> {
    let (header, records) = ledger::read_all(&args.ledgers)?;
    if let Some(path) = &args.ledger {
        ledger::write_merged(path, &header, &records)?;
    }
    let report = report::Report::build(&header, records, args.top);
    report.write(args.report_json.as_deref(), args.html.as_deref())?;
    report.verdict()
}
