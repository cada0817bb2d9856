//! The search space: a TOML file whose keys are `mockserve replay` flag names with underscores,
//! each a list or `{min, max, step}`, enumerated into candidates (each a list of replay flags).
//!
//! Candidates come in a fixed order: the aggregated grid (keys in name order, the last key
//! varying fastest), then the disaggregated one. A candidate's flags are its identity in the
//! ledger.

use std::collections::BTreeMap;
use std::path::Path;

use clap::Command;

use super::PlanError;

/// The most candidates a space may enumerate without `--max-trials`.
pub const MAX_CANDIDATES: usize = 20_000;

/// A named latency profile: `--perf-profile NAME=PATH:GPUS`.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The name the space's `perf_profile` key uses.
    pub name: String,
    /// The profile file, as given.
    pub path: String,
    /// GPUs one worker uses.
    pub gpus: u64,
}

/// Parses `NAME=PATH:GPUS` or a bare `PATH` (its file stem, 1 GPU); the file must exist.
pub fn parse_profile(s: &str) -> Result<Profile, PlanError> {
    let bad = |why: String| PlanError::Flag(format!("--perf-profile {s:?}: {why}"));
    let (name, rest) = match s.split_once('=') {
        Some((n, r)) => (n.trim().to_string(), r),
        None => (String::new(), s),
    };
    let (path, gpus) = match rest.rsplit_once(':') {
        Some((p, g)) if !name.is_empty() => {
            let gpus = g
                .parse::<u64>()
                .ok()
                .filter(|g| (1..=1024).contains(g))
                .ok_or_else(|| bad(format!("GPUs per worker must be 1 to 1024, got {g:?}")))?;
            (p.to_string(), gpus)
        }
        _ => (rest.to_string(), 1),
    };
    let name = if name.is_empty() {
        Path::new(&path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        name
    };
    if name.is_empty() || path.is_empty() {
        return Err(bad("expected NAME=PATH:GPUS or PATH".into()));
    }
    if !Path::new(&path).is_file() {
        return Err(bad(format!("no such profile file {path}")));
    }
    Ok(Profile { name, path, gpus })
}

/// One value of a dimension.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A flag's value, as the command line takes it.
    Arg(String, serde_json::Value),
    /// A switch (`no_prefix_caching = [true, false]`): given or not.
    Switch(bool),
}

/// One searched key and its values.
#[derive(Clone, Debug)]
pub struct Dim {
    /// The TOML key (the flag name with underscores).
    pub key: String,
    /// The flag's long name.
    pub long: String,
    /// The values, in the order given.
    pub values: Vec<Value>,
}

/// A candidate: the replay flags that differ from the fixed ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Its position in the space's order.
    pub index: usize,
    /// `aggregated` or `disaggregated`.
    pub mode: &'static str,
    /// The flags, as command-line words.
    pub flags: Vec<String>,
    /// The searched keys and their values (the profile by name).
    pub knobs: BTreeMap<String, serde_json::Value>,
    /// GPUs: workers times the profile's GPUs per worker.
    pub gpus: u64,
}

impl Candidate {
    /// Its identity in the ledger: the flags, joined.
    pub fn key(&self) -> String {
        self.flags.join(" ")
    }
}

/// A parsed space file.
#[derive(Clone, Debug)]
pub struct Space {
    /// Aggregated dimensions.
    pub dims: Vec<Dim>,
    /// Disaggregated dimensions (the top level's, with the table's overrides), if any.
    pub disagg: Option<Vec<Dim>>,
    /// `[constraints] max_gpus`.
    pub max_gpus: Option<u64>,
}

/// Keys that are no engine knob.
const NOT_KNOBS: &[&str] = &[
    "trace",
    "report_json",
    "per_request_jsonl",
    "kv_events_jsonl",
    "iterations",
    "quiet",
    "serving_mode",
];

fn key_error(key: &str, why: impl std::fmt::Display) -> PlanError {
    PlanError::Space(format!("key {key}: {why}"))
}

/// A TOML value in a message.
fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => other.type_str().to_string(),
    }
}

/// A TOML scalar as a flag value.
fn scalar(key: &str, v: &toml::Value) -> Result<(String, serde_json::Value), PlanError> {
    Ok(match v {
        toml::Value::Integer(i) => (i.to_string(), (*i).into()),
        toml::Value::Float(f) => (
            f.to_string(),
            serde_json::Number::from_f64(*f)
                .map(Into::into)
                .ok_or_else(|| key_error(key, "not a finite number"))?,
        ),
        toml::Value::String(s) => (s.clone(), s.clone().into()),
        toml::Value::Boolean(b) => (b.to_string(), (*b).into()),
        other => {
            return Err(key_error(
                key,
                format!("expected a number or a string, got {}", other.type_str()),
            ))
        }
    })
}

/// The values of one key: a list, `{min, max, step}` or one scalar.
fn values(key: &str, v: &toml::Value, switch: bool) -> Result<Vec<Value>, PlanError> {
    let list: Vec<toml::Value> = match v {
        toml::Value::Array(a) => a.clone(),
        toml::Value::Table(t) => {
            for k in t.keys() {
                if !matches!(k.as_str(), "min" | "max" | "step") {
                    return Err(key_error(
                        key,
                        format!("unknown range key {k:?} (min, max, step)"),
                    ));
                }
            }
            let get = |k: &str| t.get(k);
            let (Some(min), Some(max)) = (get("min"), get("max")) else {
                return Err(key_error(key, "a range needs min and max"));
            };
            match (min, max, get("step")) {
                (toml::Value::Integer(lo), toml::Value::Integer(hi), step) => {
                    let step = match step {
                        None => 1,
                        Some(toml::Value::Integer(s)) if *s > 0 => *s,
                        Some(s) => {
                            return Err(key_error(
                                key,
                                format!("step must be above 0, got {}", show(s)),
                            ))
                        }
                    };
                    if lo > hi {
                        return Err(key_error(key, format!("min {lo} is above max {hi}")));
                    }
                    let n = (hi - lo) / step + 1;
                    if n as usize > MAX_CANDIDATES {
                        return Err(key_error(
                            key,
                            format!("{n} values, over the cap of {MAX_CANDIDATES}"),
                        ));
                    }
                    (0..n)
                        .map(|i| toml::Value::Integer(lo + i * step))
                        .collect()
                }
                (lo, hi, step) => {
                    let num = |v: &toml::Value| match v {
                        toml::Value::Integer(i) => Some(*i as f64),
                        toml::Value::Float(f) if f.is_finite() => Some(*f),
                        _ => None,
                    };
                    let (Some(lo), Some(hi)) = (num(lo), num(hi)) else {
                        return Err(key_error(key, "min and max must be numbers"));
                    };
                    let Some(step) = step.and_then(num).filter(|s| *s > 0.0) else {
                        return Err(key_error(key, "a range of decimals needs a step above 0"));
                    };
                    if lo > hi {
                        return Err(key_error(key, format!("min {lo} is above max {hi}")));
                    }
                    let n = ((hi - lo) / step + 1e-9).floor() as usize + 1;
                    if n > MAX_CANDIDATES {
                        return Err(key_error(
                            key,
                            format!("{n} values, over the cap of {MAX_CANDIDATES}"),
                        ));
                    }
                    (0..n)
                        .map(|i| toml::Value::Float(lo + i as f64 * step))
                        .collect()
                }
            }
        }
        scalar_value => vec![scalar_value.clone()],
    };
    if list.is_empty() {
        return Err(key_error(key, "an empty list: give at least one value"));
    }
    let mut out: Vec<Value> = Vec::with_capacity(list.len());
    for item in &list {
        let value = if switch {
            match item {
                toml::Value::Boolean(b) => Value::Switch(*b),
                other => {
                    return Err(key_error(
                        key,
                        format!("a switch takes true or false, got {}", show(other)),
                    ))
                }
            }
        } else {
            let (arg, json) = scalar(key, item)?;
            Value::Arg(arg, json)
        };
        if out.contains(&value) {
            return Err(key_error(
                key,
                format!("value {} is listed twice", show(item)),
            ));
        }
        out.push(value);
    }
    Ok(out)
}

/// Reads one table's keys into dimensions, checking each against the replay's flags.
fn dims_of(
    table: &toml::Table,
    replay: &Command,
    fixed: &[String],
    prefix: &str,
) -> Result<Vec<Dim>, PlanError> {
    let mut dims = Vec::new();
    for (key, v) in table {
        if matches!(key.as_str(), "disaggregated" | "constraints") && prefix.is_empty() {
            continue;
        }
        let name = format!("{prefix}{key}");
        let long = key.replace('_', "-");
        let arg = replay
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
            .filter(|a| !NOT_KNOBS.contains(&a.get_id().as_str()))
            .ok_or_else(|| {
                key_error(
                    &name,
                    "not a `mockserve replay` engine flag (keys are flag names with underscores)",
                )
            })?;
        if fixed.iter().any(|f| f == &format!("--{long}")) {
            return Err(key_error(
                &name,
                format!("also given as the fixed flag --{long}; give it once"),
            ));
        }
        let switch = !arg.get_action().takes_values();
        dims.push(Dim {
            key: key.clone(),
            long,
            values: values(&name, v, switch)?,
        });
    }
    Ok(dims)
}

/// Parses a space file against the replay's flags and the fixed ones.
pub fn parse(path: &Path, replay: &Command, fixed: &[String]) -> Result<Space, PlanError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PlanError::Flag(format!("--space {}: {e}", path.display())))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| PlanError::Flag(format!("--space {}: {e}", path.display())))?;
    let dims = dims_of(&table, replay, fixed, "")?;
    for worker_key in ["num_prefill_workers", "num_decode_workers"] {
        if dims.iter().any(|d| d.key == worker_key) {
            return Err(key_error(
                worker_key,
                "belongs in the [disaggregated] table",
            ));
        }
    }
    let disagg = match table.get("disaggregated") {
        None => None,
        Some(toml::Value::Table(t)) => {
            let overrides = dims_of(t, replay, fixed, "disaggregated.")?;
            if overrides.iter().any(|d| d.key == "num_workers") {
                return Err(key_error(
                    "disaggregated.num_workers",
                    "disaggregated candidates are sized by num_prefill_workers and \
                     num_decode_workers",
                ));
            }
            let mut merged: Vec<Dim> = dims
                .iter()
                .filter(|d| d.key != "num_workers")
                .filter(|d| !overrides.iter().any(|o| o.key == d.key))
                .cloned()
                .collect();
            merged.extend(overrides);
            merged.sort_by(|a, b| a.key.cmp(&b.key));
            Some(merged)
        }
        Some(_) => return Err(key_error("disaggregated", "must be a table")),
    };
    let max_gpus = match table.get("constraints") {
        None => None,
        Some(toml::Value::Table(t)) => {
            let mut max_gpus = None;
            for (k, v) in t {
                match (k.as_str(), v) {
                    ("max_gpus", toml::Value::Integer(n)) if *n > 0 => max_gpus = Some(*n as u64),
                    ("max_gpus", other) => {
                        return Err(key_error(
                            "constraints.max_gpus",
                            format!("must be a whole number above 0, got {}", show(other)),
                        ))
                    }
                    (other, _) => {
                        return Err(key_error(
                            &format!("constraints.{other}"),
                            "unknown constraint (max_gpus)",
                        ))
                    }
                }
            }
            max_gpus
        }
        Some(_) => return Err(key_error("constraints", "must be a table")),
    };
    if dims.is_empty() && disagg.is_none() {
        return Err(PlanError::Space(
            "no key to search: give at least one replay flag name with a list or a range, or a \
             [disaggregated] table"
                .into(),
        ));
    }
    Ok(Space {
        dims,
        disagg,
        max_gpus,
    })
}

/// The value of `--long` among command-line words, if given.
pub fn flag_value<'a>(words: &'a [String], long: &str) -> Option<&'a str> {
    let flag = format!("--{long}");
    words
        .iter()
        .position(|w| *w == flag)
        .and_then(|i| words.get(i + 1))
        .map(String::as_str)
}

impl Space {
    /// Candidates before constraints: the product's size (saturating).
    pub fn size(&self, profile_choices: usize) -> usize {
        let product = |dims: &[Dim]| {
            dims.iter()
                .fold(profile_choices, |n, d| n.saturating_mul(d.values.len()))
        };
        let agg = if self.dims.is_empty() && self.disagg.is_some() {
            0
        } else {
            product(&self.dims)
        };
        agg.saturating_add(self.disagg.as_deref().map_or(0, product))
    }

    /// Every candidate within the constraints, in the space's order. `profiles` are those
    /// given; when the space has no `perf_profile` key and several are given, each is a choice.
    /// Returns the candidates and how many the constraints dropped.
    pub fn candidates(
        &self,
        profiles: &[Profile],
        fixed: &[String],
    ) -> Result<(Vec<Candidate>, usize), PlanError> {
        let mut out = Vec::new();
        let mut dropped = 0;
        let modes: Vec<(&'static str, &[Dim])> = {
            let mut m = Vec::new();
            if !self.dims.is_empty() || self.disagg.is_none() {
                m.push(("aggregated", self.dims.as_slice()));
            }
            if let Some(d) = &self.disagg {
                m.push(("disaggregated", d.as_slice()));
            }
            m
        };
        let fixed_workers = |long: &str, default: u64| {
            flag_value(fixed, long)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        for (mode, dims) in modes {
            // The implicit profile dimension, first.
            let mut dims: Vec<Dim> = dims.to_vec();
            let profile_dim = dims.iter().position(|d| d.key == "perf_profile");
            if profile_dim.is_none() && profiles.len() > 1 {
                dims.insert(
                    0,
                    Dim {
                        key: "perf_profile".into(),
                        long: "perf-profile".into(),
                        values: profiles
                            .iter()
                            .map(|p| Value::Arg(p.name.clone(), p.name.clone().into()))
                            .collect(),
                    },
                );
            }
            let total: usize = dims.iter().map(|d| d.values.len()).product();
            for mut n in 0..total {
                let mut picks = vec![0; dims.len()];
                for (i, d) in dims.iter().enumerate().rev() {
                    picks[i] = n % d.values.len();
                    n /= d.values.len();
                }
                let mut flags = Vec::new();
                let mut knobs = BTreeMap::new();
                let mut gpus_per_worker = match profiles {
                    [only] => only.gpus,
                    _ => 1,
                };
                if mode == "disaggregated" {
                    flags.push("--serving-mode".to_string());
                    flags.push("disagg".to_string());
                }
                for (d, &p) in dims.iter().zip(&picks) {
                    match &d.values[p] {
                        Value::Switch(on) => {
                            if *on {
                                flags.push(format!("--{}", d.long));
                            }
                            knobs.insert(d.key.clone(), (*on).into());
                        }
                        Value::Arg(arg, json) if d.key == "perf_profile" => {
                            let profile =
                                profiles.iter().find(|p| &p.name == arg).ok_or_else(|| {
                                    key_error(
                                        "perf_profile",
                                        format!(
                                            "no --perf-profile named {arg:?} (give \
                                             --perf-profile {arg}=PATH:GPUS)"
                                        ),
                                    )
                                })?;
                            gpus_per_worker = profile.gpus;
                            flags.push("--perf-profile".into());
                            flags.push(profile.path.clone());
                            knobs.insert(d.key.clone(), json.clone());
                        }
                        Value::Arg(arg, json) => {
                            flags.push(format!("--{}", d.long));
                            flags.push(arg.clone());
                            knobs.insert(d.key.clone(), json.clone());
                        }
                    }
                }
                let count = |long: &str, default: u64| {
                    flag_value(&flags, long)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or_else(|| fixed_workers(long, default))
                };
                let workers = if mode == "disaggregated" {
                    count("num-prefill-workers", 1) + count("num-decode-workers", 1)
                } else {
                    count("num-workers", crate::args::DEFAULT_NUM_WORKERS as u64)
                };
                let gpus = workers * gpus_per_worker;
                if self.max_gpus.is_some_and(|m| gpus > m) {
                    dropped += 1;
                    continue;
                }
                out.push(Candidate {
                    index: out.len(),
                    mode,
                    flags,
                    knobs,
                    gpus,
                });
            }
        }
        Ok((out, dropped))
    }
}
