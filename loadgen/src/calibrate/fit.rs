//! `--fit FIT_TRACE`: the profile that times the offline side, fitted from a live run of
//! another trace (or that run's records, `--fit-records`), kept apart from the gate trace:
//! the same file, or a request the two traces share, is refused before anything runs.
//!
//! The fitting itself is `loadgen profile`'s (its `run_fit` module: per-request observations
//! of a trace run become its prefill points and a decode model); this module runs or reads
//! the fit run, checks it, and writes the profile where `--fit-profile` says.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use servesim::trace::{self, TraceFormat};
use xxhash_rust::xxh3::Xxh3;

use super::records;
use crate::error::LoadgenError;
use crate::profile::run_fit;
use crate::replay::ReplayArgs;

fn err(message: String) -> LoadgenError {
    LoadgenError::Calibrate(message)
}

/// The replay flags of the fit run: the gate's, on the fit trace.
pub(crate) fn fit_side(gate: &ReplayArgs, fit_trace: &Path) -> ReplayArgs {
    let mut side = gate.clone();
    side.trace.path = Some(fit_trace.to_path_buf());
    side.run.report.report_json = None;
    side.run.report.per_request_jsonl = None;
    side.run.report.quiet = true;
    side.run.observe.html = None;
    side
}

/// One request of a trace: the key its records carry (`session#turn`, or the agentic
/// `request_id`), its line, and what identifies it across files (a Mooncake row's lengths and
/// hash ids; an agentic node's `request_id`).
struct TraceRow {
    key: String,
    line: usize,
    identity: u64,
}

fn rows_of(args: &ReplayArgs) -> Result<Vec<TraceRow>, LoadgenError> {
    let format = trace::detect_format(args.trace.file(), args.trace.format)?;
    let digest = |parts: &[&[u8]]| {
        let mut h = Xxh3::new();
        for p in parts {
            h.update(&(p.len() as u64).to_le_bytes());
            h.update(p);
        }
        h.digest()
    };
    if format == TraceFormat::Mooncake {
        let t = crate::replay::load_trace(args)?;
        Ok(t.sessions
            .iter()
            .flat_map(|s| {
                s.turns.iter().enumerate().map(move |(i, r)| {
                    let hashes: Vec<u8> = r.hash_ids.iter().flat_map(|h| h.to_le_bytes()).collect();
                    TraceRow {
                        key: format!("{}#{i}", s.id),
                        line: r.line,
                        identity: digest(&[
                            &(r.input_length as u64).to_le_bytes(),
                            &(r.output_length as u64).to_le_bytes(),
                            &hashes,
                        ]),
                    }
                })
            })
            .collect())
    } else {
        let g = crate::replay::load_graph(args, format)?;
        Ok(g.nodes
            .iter()
            .map(|n| {
                let id = n.request.request_id.clone().unwrap_or_default();
                TraceRow {
                    identity: digest(&[id.as_bytes()]),
                    key: id,
                    line: n.request.line,
                }
            })
            .collect())
    }
}

/// Refuses a fit trace that is the gate trace, or shares a request with it (the same Mooncake
/// row, by its lengths and hash ids; the same agentic `request_id`). Returns the fit trace's
/// record keys (the fit records are checked against them).
pub(crate) fn check_separate(
    gate: &ReplayArgs,
    fit_trace: &Path,
) -> Result<Vec<String>, LoadgenError> {
    let gate_path = gate.trace.file();
    let same = match (gate_path.canonicalize(), fit_trace.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => gate_path == fit_trace,
    };
    if same {
        return Err(err(format!(
            "--fit {} is the gate trace: fit on one trace and gate on another (a fit on the \
             requests it is judged on proves nothing)",
            fit_trace.display()
        )));
    }
    let fit_rows = rows_of(&fit_side(gate, fit_trace))?;
    let gate_rows = rows_of(gate)?;
    let by_identity: HashMap<u64, &TraceRow> = gate_rows.iter().map(|r| (r.identity, r)).collect();
    let shared: Vec<(&TraceRow, &TraceRow)> = fit_rows
        .iter()
        .filter_map(|f| by_identity.get(&f.identity).map(|g| (f, *g)))
        .collect();
    if let Some((f, g)) = shared.first() {
        return Err(err(format!(
            "--fit {} and the gate trace {} share {} of their {} and {} requests (first: {}:{} is \
             {}:{}): fit and gate on disjoint traces",
            fit_trace.display(),
            gate_path.display(),
            shared.len(),
            fit_rows.len(),
            gate_rows.len(),
            fit_trace.display(),
            f.line,
            gate_path.display(),
            g.line
        )));
    }
    Ok(fit_rows.into_iter().map(|r| r.key).collect())
}

/// The fit run's records as JSON values with their origins: read from `--fit-records`, or a
/// live run of the fit trace.
async fn fit_records(
    side: &ReplayArgs,
    file: Option<&Path>,
) -> Result<Vec<(Value, String)>, LoadgenError> {
    if let Some(path) = file {
        return records::read_values(path, "--fit-records ");
    }
    crate::stdout::outln!(
        "Fit run: {} live (loadgen replay)",
        side.trace.file().display()
    );
    let runs = crate::replay::replay_with(side, false).await?;
    let run = crate::harness::first(runs)?;
    Ok(run
        .live
        .records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                serde_json::to_value(r).unwrap_or(Value::Null),
                format!("fit record {}", i + 1),
            )
        })
        .collect())
}

/// What `--fit` did, for the report.
#[derive(Debug)]
pub(crate) struct Fitted {
    /// The report's `fit` section.
    pub json: Value,
}

/// Fits the profile of `--fit FIT_TRACE` and writes it to `profile` (mocker .npz; the JSON
/// twin with the points and the fit's figures, and the SVG, beside it).
pub(crate) async fn fit(
    gate: &ReplayArgs,
    fit_trace: &Path,
    fit_records_file: Option<&Path>,
    profile: &Path,
) -> Result<Fitted, LoadgenError> {
    let keys = check_separate(gate, fit_trace)?;
    let side = fit_side(gate, fit_trace);
    let max_prefill_tokens = gate
        .run
        .target
        .engine
        .cluster_config()?
        .engine
        .max_num_batched_tokens;
    let values = fit_records(&side, fit_records_file).await?;
    let fit_name = fit_trace.display().to_string();
    let source = match fit_records_file {
        Some(p) => format!("--fit-records {}", p.display()),
        None => format!("--fit {fit_name}"),
    };
    // Records of the fit trace, each request once.
    let recs = records::of_values(values.iter().map(|(v, _)| v.clone()), "fit")
        .map_err(|e| err(format!("{source}: {e}")))?;
    let known: std::collections::HashSet<&str> = keys.iter().map(String::as_str).collect();
    if let Some((r, (_, origin))) = recs
        .iter()
        .zip(&values)
        .find(|(r, _)| !known.contains(r.key.as_str()))
    {
        return Err(err(format!(
            "{source}: {origin} ({}) is not a request of the fit trace {fit_name}",
            r.key
        )));
    }
    let run = run_fit::timelines(values.iter().map(|(v, o)| (v, o.clone())))
        .map_err(|e| err(format!("{source}: {e}")))?;
    if run.failed > 0 {
        return Err(err(format!(
            "{source}: {} of {} requests of the fit run failed: a profile is not fitted from a \
             run with failures",
            run.failed, run.total
        )));
    }
    let fitted = run_fit::fit_run(&run.timelines, max_prefill_tokens).map_err(|e| {
        err(format!(
            "{source}: too few observations to fit a profile: {e}"
        ))
    })?;
    let paths = crate::profile::OutputPaths::of(profile);
    fitted
        .tables
        .save(&paths.npz)
        .map_err(|e| LoadgenError::Io {
            path: paths.npz.clone(),
            source: std::io::Error::other(e),
        })?;
    let summary = json!({
        "trace": fit_name,
        "records": fit_records_file.map(|p| p.display().to_string()),
        "profile": profile.display().to_string(),
        "requests": run.total,
        "decode_phases": fitted.decode_phases,
        "idle_prefills": fitted.idle_prefills,
        "equations": fitted.equations,
        "engine_timed": fitted.engine_timed,
        "model": fitted.model,
        "max_prefill_tokens": max_prefill_tokens,
    });
    let mut twin = serde_json::to_value(&fitted.tables)
        .map_err(|e| err(format!("the fitted profile's JSON: {e}")))?;
    twin["measurements"] = serde_json::to_value(&fitted.measurements)
        .map_err(|e| err(format!("the fitted profile's JSON: {e}")))?;
    twin["fitted_from"] = summary.clone();
    crate::write::json(&paths.json, &twin)?;
    crate::write::bytes(
        &paths.svg,
        crate::profile::fit::svg(&fitted.tables, &fitted.measurements),
    )?;
    let m = &fitted.model;
    crate::stdout::outln!(
        "Fitted {} from {source}: {} requests, {} decode phases and {} idle prefills ({} of {} \
         timed by the server's nvext.timing)\n  decode step ms = {:.3} + {:.4} x running + \
         {:.3e} x active KV tokens; prefill ms = {:.3} + {:.3e} x T + {:.3e} x T^2 (T uncached \
         prompt tokens)",
        profile.display(),
        run.total,
        fitted.decode_phases,
        fitted.idle_prefills,
        fitted.engine_timed,
        fitted.equations,
        m.decode_base_ms,
        m.decode_per_request_ms,
        m.decode_per_kv_token_ms,
        m.prefill_base_ms,
        m.prefill_per_token_ms,
        m.prefill_per_token_squared_ms
    );
    Ok(Fitted { json: summary })
}

/// `--fit-records` without `--fit`, and the like: checked with the other flags.
pub(crate) fn check_flags(
    fit: Option<&PathBuf>,
    fit_records: Option<&PathBuf>,
    fit_profile: Option<&PathBuf>,
) -> Result<(), LoadgenError> {
    let config = |m: &str| Err(LoadgenError::Config(m.into()));
    match (fit, fit_records, fit_profile) {
        (None, Some(_), _) => {
            config("--fit-records reads the fit run of --fit FIT_TRACE: give --fit too")
        }
        (Some(_), _, None) => config(
            "--fit FIT_TRACE fits a profile: give --fit-profile PATH, where it is written (and \
             read by the offline side)",
        ),
        _ => Ok(()),
    }
}
