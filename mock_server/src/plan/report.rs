//! The plan's report, built from ledger records alone: the ranking by objective, the Pareto
//! front of goodput per GPU against tokens/s per user, the reproducing commands of the top
//! candidates, as JSON, a console table and an HTML page. Trials are ordered by candidate, so
//! the bytes do not depend on the order in which they finished, nor on sharding.

use std::cmp::Ordering;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::ledger::{Header, TrialRecord};
use super::trial::Figures;
use super::{Objective, DEFAULT_ATTAINMENT};

/// A built report.
pub struct Report {
    json: Value,
    table: String,
    html: String,
    failure: Option<String>,
    best: Option<TrialRecord>,
}

/// Trace flags that a live fleet does not take (with whether they take a value).
const TRACE_FLAGS: &[(&str, bool)] = &[
    ("--arrival-speedup-ratio", true),
    ("--trace-format", true),
    ("--trace-block-size", true),
    ("--agentic-lanes", true),
    ("--allow-long-schedule", false),
];

fn objective(header: &Header) -> Objective {
    header.objective.parse().unwrap_or(Objective::GoodputPerGpu)
}

/// True when the ranking keeps only candidates meeting the SLOs at the attainment: with
/// `--attainment`, for `fewest-gpus`, and with early stop (a candidate below the attainment
/// stops, without figures to rank).
fn gated(header: &Header) -> bool {
    header.attainment.is_some() || objective(header) == Objective::FewestGpus || header.early_stop
}

fn attainment(header: &Header) -> f64 {
    header.attainment.unwrap_or(DEFAULT_ATTAINMENT)
}

/// Indices (into `figs`) of the Pareto front: no other trial has at least the goodput per GPU
/// and the tokens/s per user, and more of one.
fn front(figs: &[(usize, &Figures)]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, a) in figs {
        let dominated = figs.iter().any(|(_, b)| {
            b.goodput_per_gpu_tok_s >= a.goodput_per_gpu_tok_s
                && b.tok_s_per_user >= a.tok_s_per_user
                && (b.goodput_per_gpu_tok_s > a.goodput_per_gpu_tok_s
                    || b.tok_s_per_user > a.tok_s_per_user)
        });
        if !dominated {
            out.push(*i);
        }
    }
    out
}

/// Positions in `records`, best first: trials that ran to the end, those meeting the SLOs
/// first when the objective needs it, then by the objective; then trials stopped once their SLO
/// was lost, those that held longest (most requests ended) first; then failed ones. The
/// candidate's index breaks ties.
pub fn order(header: &Header, records: &[TrialRecord]) -> Vec<usize> {
    let q = attainment(header);
    let gate = gated(header);
    let obj = objective(header);
    let eligible: Vec<(usize, &Figures)> = records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.figures.as_ref().map(|f| (i, f)))
        .filter(|(_, f)| !gate || f.slo_attainment >= q)
        .collect();
    let on_front = if obj == Objective::Pareto {
        front(&eligible)
    } else {
        Vec::new()
    };
    let mut idx: Vec<usize> = (0..records.len()).collect();
    let desc = |a: f64, b: f64| b.total_cmp(&a);
    idx.sort_by(|&i, &j| {
        let (a, b) = (&records[i], &records[j]);
        let (fa, fb) = match (&a.figures, &b.figures) {
            (Some(fa), Some(fb)) => (fa, fb),
            (Some(_), None) => return Ordering::Less,
            (None, Some(_)) => return Ordering::Greater,
            (None, None) => {
                let held = |r: &TrialRecord| r.stopped.as_ref().map(|s| s.ended_requests);
                return held(b).cmp(&held(a)).then(a.index.cmp(&b.index));
            }
        };
        let meets = |f: &Figures| !gate || f.slo_attainment >= q;
        meets(fb)
            .cmp(&meets(fa))
            .then_with(|| match obj {
                Objective::GoodputPerGpu => {
                    desc(fa.goodput_per_gpu_tok_s, fb.goodput_per_gpu_tok_s)
                        .then(desc(fa.goodput_tok_s, fb.goodput_tok_s))
                }
                Objective::Goodput => {
                    desc(fa.goodput_tok_s, fb.goodput_tok_s).then(a.gpus.cmp(&b.gpus))
                }
                Objective::FewestGpus if meets(fa) => a
                    .gpus
                    .cmp(&b.gpus)
                    .then(desc(fa.goodput_per_gpu_tok_s, fb.goodput_per_gpu_tok_s)),
                Objective::FewestGpus => desc(fa.slo_attainment, fb.slo_attainment),
                Objective::Pareto => on_front
                    .contains(&j)
                    .cmp(&on_front.contains(&i))
                    .then(desc(fa.goodput_per_gpu_tok_s, fb.goodput_per_gpu_tok_s)),
            })
            .then(a.index.cmp(&b.index))
    });
    idx
}

/// A word as a POSIX shell reads it.
fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./=:,-+@%".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

pub(super) fn join(words: &[String]) -> String {
    words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

/// The replay words of a trial (after `mockserve replay`).
pub(super) fn replay_words(header: &Header, r: &TrialRecord) -> Vec<String> {
    // No trace word for synthetic load: its flags are among the fixed ones.
    let mut words: Vec<String> = Some(header.trace.clone())
        .filter(|t| !t.is_empty())
        .into_iter()
        .collect();
    words.extend(header.fixed.iter().cloned());
    words.extend(r.flags.iter().cloned());
    words
}

/// The engine flags of a trial without the trace's.
fn engine_words(header: &Header, r: &TrialRecord) -> Vec<String> {
    let mut out = Vec::new();
    let all: Vec<&String> = header.fixed.iter().chain(&r.flags).collect();
    let mut i = 0;
    while i < all.len() {
        let synthetic = crate::synthetic::FLAGS.contains(&all[i].as_str());
        match TRACE_FLAGS.iter().find(|(f, _)| f == all[i]) {
            _ if synthetic => i += 2,
            Some((_, takes)) => i += if *takes { 2 } else { 1 },
            None => {
                out.push(all[i].clone());
                i += 1;
            }
        }
    }
    out
}

/// The deployment forms of a trial: the fleet command, the deploy/ values, vLLM's arguments.
fn deployment(header: &Header, r: &TrialRecord) -> Map<String, Value> {
    let mut m = Map::new();
    let Ok(args) = super::trial::parse_replay(&replay_words(header, r)) else {
        return m;
    };
    let e = &args.engine;
    let engine = engine_words(header, r);
    let disagg = r.mode == "disaggregated";
    let workers = if disagg {
        e.num_prefill_workers.unwrap_or(1) + e.num_decode_workers.unwrap_or(1)
    } else {
        e.num_workers.unwrap_or(crate::args::DEFAULT_NUM_WORKERS)
    };
    let gpus_per_worker = (r.gpus / workers.max(1) as u64).max(1);
    if disagg {
        let mut words = vec!["mockserve".to_string(), "serve".into()];
        words.extend(engine.iter().cloned());
        m.insert("fleet_command".into(), join(&words).into());
    } else {
        let mut words = vec![
            "mockserve".to_string(),
            "fleet".into(),
            "--workers".into(),
            workers.to_string(),
        ];
        let mut i = 0;
        while i < engine.len() {
            if engine[i] == "--num-workers" {
                i += 2;
                continue;
            }
            words.push(engine[i].clone());
            i += 1;
        }
        m.insert("fleet_command".into(), join(&words).into());
        // One worker per pod in deploy/mockserve-statefulset.yaml.
        let mut pod_args = vec!["--num-workers=1".to_string()];
        let mut i = 0;
        while i < engine.len() {
            let w = &engine[i];
            let value = engine.get(i + 1).filter(|v| !v.starts_with("--"));
            if w == "--num-workers" || w == "--router-mode" || w == "--seed" {
                i += if value.is_some() { 2 } else { 1 };
                continue;
            }
            match value {
                Some(v) => {
                    pod_args.push(format!("{w}={v}"));
                    i += 2;
                }
                None => {
                    pod_args.push(w.clone());
                    i += 1;
                }
            }
        }
        m.insert(
            "deploy".into(),
            json!({
                "manifest": "deploy/mockserve-statefulset.yaml",
                "replicas": workers,
                "args": pod_args,
            }),
        );
    }
    let mut vllm = vec![
        "--max-num-seqs".to_string(),
        e.max_num_seqs.to_string(),
        "--max-num-batched-tokens".into(),
        e.max_num_batched_tokens.to_string(),
        "--block-size".into(),
        e.block_size.to_string(),
        "--num-gpu-blocks-override".into(),
        e.num_gpu_blocks.to_string(),
    ];
    if gpus_per_worker > 1 {
        vllm.push("--tensor-parallel-size".into());
        vllm.push(gpus_per_worker.to_string());
    }
    if e.no_prefix_caching {
        vllm.push("--no-enable-prefix-caching".into());
    }
    if e.no_chunked_prefill {
        vllm.push("--no-enable-chunked-prefill".into());
    }
    let replicas = if disagg {
        json!({"prefill": e.num_prefill_workers.unwrap_or(1), "decode": e.num_decode_workers.unwrap_or(1)})
    } else {
        json!({"aggregated": workers})
    };
    m.insert(
        "vllm".into(),
        json!({"engine_args": vllm, "replicas": replicas}),
    );
    m
}

/// A trial as the report writes it.
fn entry(header: &Header, r: &TrialRecord) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("index".into(), r.index.into());
    m.insert("mode".into(), r.mode.clone().into());
    m.insert("gpus".into(), r.gpus.into());
    m.insert(
        "knobs".into(),
        Value::Object(r.knobs.clone().into_iter().collect()),
    );
    m.insert("status".into(), r.status.clone().into());
    if let Some(reason) = &r.reason {
        m.insert("reason".into(), reason.clone().into());
    }
    if let Some(stop) = &r.stopped {
        if let Ok(v) = serde_json::to_value(stop) {
            m.insert("stopped".into(), v);
        }
    }
    if let Some(f) = &r.figures {
        if let Ok(Value::Object(fig)) = serde_json::to_value(f) {
            for (k, v) in fig {
                if k == "report" {
                    if let Value::Object(stats) = v {
                        m.extend(stats);
                    }
                } else {
                    m.insert(k, v);
                }
            }
        }
    }
    let mut words = vec!["mockserve".to_string(), "replay".into()];
    words.extend(replay_words(header, r));
    m.insert("command".into(), join(&words).into());
    m
}

/// The bounds as `--slo` reads them.
fn slo_text(header: &Header) -> String {
    header
        .slo
        .iter()
        .map(|(k, v)| format!("{}={v}ms", k.trim_end_matches("_ms")))
        .collect::<Vec<_>>()
        .join(",")
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn knobs_text(r: &TrialRecord) -> String {
    r.knobs
        .iter()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            format!("{k}={v}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl Report {
    /// The report of a search's records (whole-trace trials rank; prefix trials are counted).
    pub fn build(header: &Header, records: Vec<TrialRecord>, top: usize) -> Report {
        let mut full: Vec<TrialRecord> = records
            .iter()
            .filter(|r| r.prefix_sessions.is_none())
            .cloned()
            .collect();
        full.sort_by_key(|r| r.index);
        full.dedup_by_key(|r| r.index);
        let prefix_trials = records.len() - full.len();
        let q = attainment(header);
        let gate = gated(header);
        let ranked: Vec<usize> = order(header, &full)
            .into_iter()
            .filter(|&i| {
                full[i]
                    .figures
                    .as_ref()
                    .is_some_and(|f| !gate || f.slo_attainment >= q)
            })
            .collect();
        let eligible: Vec<(usize, &Figures)> = ranked
            .iter()
            .filter_map(|&i| full[i].figures.as_ref().map(|f| (i, f)))
            .collect();
        let mut pareto = front(&eligible);
        pareto.sort_by(|&a, &b| {
            let (fa, fb) = (&full[a].figures, &full[b].figures);
            let g = |f: &Option<Figures>| f.as_ref().map_or(0.0, |f| f.goodput_per_gpu_tok_s);
            g(fb)
                .total_cmp(&g(fa))
                .then(full[a].index.cmp(&full[b].index))
        });
        let with_deploy = |i: usize, rank: usize| {
            let mut m = Map::new();
            m.insert("rank".into(), rank.into());
            m.extend(entry(header, &full[i]));
            m.extend(deployment(header, &full[i]));
            Value::Object(m)
        };
        let stopped = full.iter().filter(|r| r.stopped.is_some()).count();
        let failed = full
            .iter()
            .filter(|r| r.figures.is_none() && r.stopped.is_none())
            .count();
        let mut plan = serde_json::to_value(header).unwrap_or(Value::Null);
        if let Value::Object(p) = &mut plan {
            p.remove("shard");
        }
        let json = json!({
            "plan": plan,
            "counts": {
                "candidates": header.candidates,
                "trials": full.len(),
                "failed": failed,
                "stopped": stopped,
                "ranked": ranked.len(),
                "prefix_trials": prefix_trials,
            },
            "best": ranked.first().map(|&i| with_deploy(i, 1)),
            "top": ranked.iter().take(top).enumerate().map(|(k, &i)| with_deploy(i, k + 1)).collect::<Vec<_>>(),
            "ranking": ranked.iter().enumerate().map(|(k, &i)| {
                let mut m = Map::new();
                m.insert("rank".into(), (k + 1).into());
                m.extend(entry(header, &full[i]));
                Value::Object(m)
            }).collect::<Vec<_>>(),
            "pareto": pareto.iter().map(|&i| Value::Object(entry(header, &full[i]))).collect::<Vec<_>>(),
            "trials": full.iter().map(|r| Value::Object(entry(header, r))).collect::<Vec<_>>(),
        });
        let mut table = format!(
            "Plan over {}: {} candidates, {} trials on the whole trace ({} failed, {} stopped once \
             their SLO was lost){}, objective {}, SLO {}{}\n",
            if header.trace.is_empty() {
                "synthetic load"
            } else {
                &header.trace
            },
            header.candidates,
            full.len(),
            failed,
            stopped,
            if prefix_trials > 0 {
                format!(", {prefix_trials} on prefixes")
            } else {
                String::new()
            },
            header.objective,
            header
                .slo
                .iter()
                .map(|(k, v)| format!("{k}<={v}"))
                .collect::<Vec<_>>()
                .join(","),
            header.attainment.map_or_else(String::new, |q| format!(
                " for {:.0}% of requests",
                q * 100.0
            )),
        );
        table.push_str(&format!(
            "{:>4} {:>5} {:>13} {:>12} {:>8} {:>9} {:>9} {:>8}  {}\n",
            "rank",
            "gpus",
            "goodput/gpu",
            "goodput",
            "attain",
            "p90 ttft",
            "p90 tpot",
            "max x",
            "candidate"
        ));
        for (k, &i) in ranked.iter().take(top).enumerate() {
            let r = &full[i];
            let Some(f) = &r.figures else { continue };
            table.push_str(&format!(
                "{:>4} {:>5} {:>13.2} {:>12.2} {:>7.1}% {:>9} {:>9} {:>8}  {} {}\n",
                k + 1,
                r.gpus,
                f.goodput_per_gpu_tok_s,
                f.goodput_tok_s,
                f.slo_attainment * 100.0,
                num(f.report.get("p90_ttft_ms").copied(), 1),
                num(f.report.get("p90_tpot_ms").copied(), 1),
                num(f.max_speedup, 2),
                r.mode,
                knobs_text(r)
            ));
        }
        table.push_str(&format!("Pareto front: {} candidates\n", pareto.len()));
        let mut failure = None;
        if let Some(best) = json.get("best").filter(|b| !b.is_null()) {
            for (label, key) in [("replay", "command"), ("live", "fleet_command")] {
                if let Some(c) = best.get(key).and_then(Value::as_str) {
                    table.push_str(&format!("Best ({label}): {c}\n"));
                }
            }
            if let Some(v) = best.pointer("/vllm/engine_args") {
                let args: Vec<String> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(str::to_string))
                    .collect();
                table.push_str(&format!("Best (vLLM): {}\n", args.join(" ")));
            }
        } else if full
            .iter()
            .all(|r| r.figures.is_none() && r.stopped.is_none())
        {
            failure = Some(match full.first().and_then(|r| r.reason.clone()) {
                Some(reason) => format!("every trial failed; the first: {reason}"),
                None => "no trial ran".into(),
            });
        } else {
            let closest = if full.iter().all(|r| r.figures.is_none()) {
                // Every trial that ran stopped: none has an attainment, only a bound on it.
                let closest = order(header, &full)
                    .into_iter()
                    .find(|&i| full[i].stopped.is_some());
                closest.map_or_else(String::new, |i| {
                    let r = &full[i];
                    let (at_most, ended, requests) = r.stopped.as_ref().map_or((0.0, 0, 0), |s| {
                        (s.attainment_at_most, s.ended_requests, s.num_requests)
                    });
                    format!(
                        "; every trial stopped once its SLO was lost. The one that held longest \
                         ({ended} of {requests} requests ended; {} GPUs, {}) meets them for at most \
                         {:.2}% of requests: an upper bound, not its attainment (--no-early-stop \
                         measures it in full): {}",
                        r.gpus,
                        knobs_text(r),
                        at_most * 100.0,
                        entry(header, r)
                            .get("command")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                    )
                })
            } else {
                let closest = order(
                    &Header {
                        attainment: None,
                        objective: "goodput-per-gpu".into(),
                        ..header.clone()
                    },
                    &full,
                )
                .into_iter()
                .filter(|&i| full[i].figures.is_some())
                .max_by(|&a, &b| {
                    let att = |i: usize| full[i].figures.as_ref().map_or(0.0, |f| f.slo_attainment);
                    att(a)
                        .total_cmp(&att(b))
                        .then(full[b].index.cmp(&full[a].index))
                });
                closest.map_or_else(String::new, |i| {
                    let r = &full[i];
                    format!(
                        "; the closest meets them for {:.1}% of requests ({} GPUs, {}): {}",
                        r.figures.as_ref().map_or(0.0, |f| f.slo_attainment * 100.0),
                        r.gpus,
                        knobs_text(r),
                        entry(header, r)
                            .get("command")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                    )
                })
            };
            failure = Some(format!(
                "no candidate meets --slo {} for {:.0}% of requests (--attainment){closest}",
                slo_text(header),
                q * 100.0
            ));
        }
        let html = super::html::page(header, &full, &ranked, &pareto, top);
        let best = ranked.first().map(|&i| full[i].clone());
        Report {
            json,
            table,
            html,
            failure,
            best,
        }
    }

    /// The best candidate's trial, if one ranks.
    pub fn best(&self) -> Option<&TrialRecord> {
        self.best.as_ref()
    }

    /// Adds the live check: `verify` in the JSON, and its table after the ranking.
    pub fn add_verify(&mut self, verify: Value, table: &str) {
        if let Value::Object(m) = &mut self.json {
            m.insert("verify".into(), verify);
        }
        self.table.push_str(table);
    }

    /// The report as JSON text.
    pub fn json_text(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.json).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Prints the table and writes the files.
    pub fn write(&self, json: Option<&Path>, html: Option<&Path>) -> anyhow::Result<()> {
        use anyhow::Context;
        crate::stdout::write(self.table.as_bytes()).context("writing the table to stdout")?;
        if let Some(path) = json {
            std::fs::write(path, self.json_text())
                .with_context(|| format!("--report-json {}", path.display()))?;
        }
        if let Some(path) = html {
            std::fs::write(path, &self.html)
                .with_context(|| format!("--html {}", path.display()))?;
        }
        Ok(())
    }

    /// An error when no candidate qualifies.
    pub fn verdict(&self) -> anyhow::Result<()> {
        match &self.failure {
            Some(f) => Err(anyhow::anyhow!("{f}")),
            None => Ok(()),
        }
    }
}
