//! The trial ledger: JSON lines, a header (`{"plan": ...}`, what was searched) then one
//! record per trial in the order trials finish. A rerun with the same header skips the trials
//! already there; `mockserve plan merge` joins the ledgers of shards whose headers agree.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::args::SearchArgs;
use super::space::Candidate;
use super::trial::{Figures, Outcome, StopNote};
use super::PlanError;

/// What a ledger's trials answer: the trace, the fixed flags, the space and the settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// The trace, as given.
    pub trace: String,
    /// The fixed replay flags.
    pub fixed: Vec<String>,
    /// The bounds (ms).
    pub slo: BTreeMap<String, f64>,
    /// `--attainment`, if given.
    pub attainment: Option<f64>,
    /// The objective's name.
    pub objective: String,
    /// The strategy's name.
    pub strategy: String,
    /// The seed of the draws.
    pub seed: u64,
    /// `--max-trials`, if given.
    pub max_trials: Option<usize>,
    /// Bisection steps of the speed-up search.
    pub speedup_steps: u32,
    /// Candidates in the space (within the constraints).
    pub candidates: usize,
    /// A hash of every candidate's flags.
    pub space_hash: String,
    /// Trials stop once their SLO is lost: with `--attainment` or `fewest-gpus`, unless
    /// `--no-early-stop` (false in ledgers written before early stop).
    #[serde(default)]
    pub early_stop: bool,
    /// `I/N` for a shard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
}

impl Header {
    /// The header of a search.
    pub fn new(
        trace: &str,
        fixed: &[String],
        s: &SearchArgs,
        candidates: usize,
        space_hash: String,
        seed: u64,
    ) -> Header {
        let mut slo = BTreeMap::new();
        for (k, v) in [
            ("ttft_ms", s.slo.ttft_ms),
            ("tpot_ms", s.slo.itl_ms),
            ("e2e_ms", s.slo.e2e_ms),
            ("trajectory_e2e_ms", s.slo.trajectory_e2e_ms),
        ] {
            if let Some(v) = v {
                slo.insert(k.to_string(), v);
            }
        }
        Header {
            trace: trace.to_string(),
            fixed: fixed.to_vec(),
            slo,
            attainment: s.attainment,
            objective: s.objective.name().into(),
            strategy: s.strategy.name().into(),
            seed,
            max_trials: s.max_trials,
            speedup_steps: s.speedup_steps,
            candidates,
            space_hash,
            early_stop: super::trials_stop(s),
            shard: s.shard.map(|sh| format!("{}/{}", sh.index, sh.count)),
        }
    }

    /// The bounds as the replay's SLO.
    pub fn slo(&self) -> servesim::slo::Slo {
        servesim::slo::Slo {
            ttft_ms: self.slo.get("ttft_ms").copied(),
            itl_ms: self.slo.get("tpot_ms").copied(),
            e2e_ms: self.slo.get("e2e_ms").copied(),
            trajectory_e2e_ms: self.slo.get("trajectory_e2e_ms").copied(),
        }
    }

    /// The same search, whatever the shard.
    fn same_search(&self, other: &Header) -> bool {
        Header {
            shard: None,
            ..self.clone()
        } == Header {
            shard: None,
            ..other.clone()
        }
    }
}

/// A hash of the candidates' flags (the space, as enumerated).
pub fn space_hash(all: &[Candidate]) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for c in all {
        h.update(c.key().as_bytes());
        h.update(b"\n");
    }
    format!("{:016x}", h.digest())
}

/// One trial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// The candidate's position in the space.
    pub index: usize,
    /// Its flags, joined: its identity.
    pub candidate: String,
    /// aggregated or disaggregated.
    pub mode: String,
    /// Its flags.
    pub flags: Vec<String>,
    /// The searched keys' values.
    pub knobs: BTreeMap<String, serde_json::Value>,
    /// GPUs.
    pub gpus: u64,
    /// Sessions of the trace prefix replayed (halving's early rounds); None: the whole trace.
    pub prefix_sessions: Option<usize>,
    /// `ok`, `stopped` (its SLO was lost: infeasible, no figures) or `failed`.
    pub status: String,
    /// Why it stopped or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its figures, when it ran to the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    /// Where it stopped, when its SLO was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<StopNote>,
}

impl TrialRecord {
    /// A trial's record.
    pub fn new(c: &Candidate, prefix: Option<usize>, result: Result<Outcome, String>) -> Self {
        let (status, reason, figures, stopped) = match result {
            Ok(Outcome::Figures(f)) => ("ok", None, Some(f), None),
            Ok(Outcome::Stopped { note, reason }) => ("stopped", Some(reason), None, Some(note)),
            Err(e) => ("failed", Some(e), None, None),
        };
        TrialRecord {
            index: c.index,
            candidate: c.key(),
            mode: c.mode.into(),
            flags: c.flags.clone(),
            knobs: c.knobs.clone(),
            gpus: c.gpus,
            prefix_sessions: prefix,
            status: status.into(),
            reason,
            figures,
            stopped,
        }
    }
}

/// The record as its JSON line reads back.
pub fn roundtrip(r: &TrialRecord) -> Result<TrialRecord, PlanError> {
    let line = serde_json::to_string(r).map_err(|e| PlanError::Ledger(e.to_string()))?;
    serde_json::from_str(&line).map_err(|e| PlanError::Ledger(e.to_string()))
}

/// A header line.
#[derive(Serialize, Deserialize)]
struct HeaderLine {
    plan: Header,
}

/// Reads a ledger: its header and records, each line checked.
fn read(path: &Path) -> Result<(Header, Vec<TrialRecord>), PlanError> {
    let file = std::fs::File::open(path)
        .map_err(|e| PlanError::Ledger(format!("ledger {}: {e}", path.display())))?;
    let mut header = None;
    let mut records = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let at = || format!("ledger {}:{}", path.display(), n + 1);
        let line = line.map_err(|e| PlanError::Ledger(format!("{}: {e}", at())))?;
        if line.trim().is_empty() {
            continue;
        }
        if n == 0 {
            let h: HeaderLine = serde_json::from_str(&line).map_err(|e| {
                PlanError::Ledger(format!("{}: not a plan ledger header: {e}", at()))
            })?;
            header = Some(h.plan);
            continue;
        }
        match serde_json::from_str::<TrialRecord>(&line) {
            Ok(r) => records.push(r),
            // A line cut by an interruption is the last one: its trial runs again.
            Err(e) if e.is_eof() => break,
            Err(e) => return Err(PlanError::Ledger(format!("{}: {e}", at()))),
        }
    }
    let header =
        header.ok_or_else(|| PlanError::Ledger(format!("ledger {}: empty", path.display())))?;
    Ok((header, records))
}

/// Appends records to a ledger, one flushed line each.
pub struct Appender {
    file: std::io::BufWriter<std::fs::File>,
    path: String,
}

impl Appender {
    /// Opens a ledger: a new one gets the header; an existing one must have the same search,
    /// and its records are returned (to skip them).
    pub fn open(path: &Path, header: &Header) -> Result<(Appender, Vec<TrialRecord>), PlanError> {
        let name = path.display().to_string();
        let exists = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
        let previous = if exists {
            let (h, records) = read(path)?;
            if h != *header {
                return Err(PlanError::Ledger(format!(
                    "--ledger {name} holds another search (trace, flags, space, SLOs or shard \
                     differ); give a new file to start over"
                )));
            }
            // Drop a cut last line before appending.
            let text = std::fs::read_to_string(path)
                .map_err(|e| PlanError::Ledger(format!("--ledger {name}: {e}")))?;
            if !text.ends_with('\n') {
                let keep = text.rfind('\n').map_or(0, |i| i + 1);
                std::fs::write(path, &text[..keep])
                    .map_err(|e| PlanError::Ledger(format!("--ledger {name}: {e}")))?;
            }
            records
        } else {
            Vec::new()
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| PlanError::Ledger(format!("--ledger {name}: {e}")))?;
        let mut app = Appender {
            file: std::io::BufWriter::new(file),
            path: name,
        };
        if !exists {
            app.line(&HeaderLine {
                plan: header.clone(),
            })?;
        }
        Ok((app, previous))
    }

    fn line<T: Serialize>(&mut self, value: &T) -> Result<(), PlanError> {
        let err = |e: String| PlanError::Ledger(format!("--ledger {}: {e}", self.path));
        let mut text = serde_json::to_string(value).map_err(|e| err(e.to_string()))?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| err(e.to_string()))
    }

    /// Appends one record.
    pub fn append(&mut self, r: &TrialRecord) -> Result<(), PlanError> {
        self.line(r)
    }
}

/// Reads shard ledgers: their headers must describe the same search; records of the same trial
/// in several ledgers count once.
pub fn read_all(paths: &[std::path::PathBuf]) -> Result<(Header, Vec<TrialRecord>), PlanError> {
    let mut header: Option<Header> = None;
    let mut by_trial: BTreeMap<(usize, Option<usize>), TrialRecord> = BTreeMap::new();
    for path in paths {
        let (h, records) = read(path)?;
        match &header {
            None => header = Some(h),
            Some(first) if !first.same_search(&h) => {
                return Err(PlanError::Ledger(format!(
                    "ledger {} is from another search than {} (trace, flags, space or SLOs \
                     differ)",
                    path.display(),
                    paths[0].display()
                )))
            }
            Some(_) => {}
        }
        for r in records {
            by_trial.entry((r.index, r.prefix_sessions)).or_insert(r);
        }
    }
    let mut header = header.ok_or_else(|| PlanError::Ledger("no ledger given".into()))?;
    header.shard = None;
    Ok((header, by_trial.into_values().collect()))
}

/// Writes a merged ledger: the header, then the trials in candidate order.
pub fn write_merged(
    path: &Path,
    header: &Header,
    records: &[TrialRecord],
) -> Result<(), PlanError> {
    let err = |e: std::io::Error| PlanError::Ledger(format!("--ledger {}: {e}", path.display()));
    let mut out = String::new();
    let line = |v: serde_json::Result<String>| v.map_err(|e| PlanError::Ledger(e.to_string()));
    out.push_str(&line(serde_json::to_string(&HeaderLine {
        plan: header.clone(),
    }))?);
    out.push('\n');
    for r in records {
        out.push_str(&line(serde_json::to_string(r))?);
        out.push('\n');
    }
    std::fs::write(path, out).map_err(err)
}
