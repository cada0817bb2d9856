//! `mockserve plan --verify`: the best candidate checked live.
//!
//! `--verify-speedup K` runs the candidate's own replay K times faster. On loopback both clocks
//! of the trace are compressed: the arrivals (`--arrival-speedup-ratio` times K) and the engine
//! (`--speedup-ratio` times K), so the fleet sees the load the plan measured, in a tenth of the
//! time at K = 10, and every latency is a K-th of the plan's. Against `--url` the deployment runs
//! at its own speed, so only the arrivals are sped up (K times the candidate's rate).
//!
//! The prediction is the offline replay of exactly the flags the live run gets. The measurement
//! is `loadgen replay` (the binary beside this executable: loadgen depends on this crate, so it
//! is run, not linked) with the same trace and flags: without `--url` it stands mockserve up on
//! 127.0.0.1 with the candidate's engine flags and sends every request over HTTP; with `--url`
//! it measures that deployment. Both sides are printed on the trace's clock (times multiplied by
//! the compression, the same factor on both sides), so they read like the plan's own figures and
//! the SLO bounds apply unchanged. The child is killed when the bound `--verify-timeout-s`
//! passes, so the check never hangs.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use servesim::slo::Slo;

use super::ledger::{Header, TrialRecord};
use super::report::{join, replay_words};
use super::trial;

/// The figures compared: the SLO attainment, then the median and p90 of each latency.
const KEYS: &[&str] = &[
    "median_ttft_ms",
    "p90_ttft_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "median_e2e_latency_ms",
    "p90_e2e_latency_ms",
];

/// What the check needs beyond the best trial.
pub struct Options<'a> {
    /// The arrival speed-up of both sides.
    pub speedup: f64,
    /// A deployment to measure instead of loopback.
    pub url: Option<&'a str>,
    /// The bound on the live run.
    pub timeout: Duration,
    /// The bounds.
    pub slo: &'a Slo,
    /// The share that must meet them.
    pub attainment: f64,
}

/// The checked result: the report's `verify` object and its console table.
pub struct Verified {
    /// The report's `verify`.
    pub json: Value,
    /// The side-by-side table.
    pub table: String,
    /// Requests that failed live (the command fails after writing the report when above 0).
    pub failures: u64,
    /// loadgen's failure counts by reason, as JSON text.
    pub reasons: String,
}

/// The loadgen binary beside the current executable.
fn loadgen_path() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("--verify: cannot find this executable: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let path = dir.join(format!("loadgen{}", std::env::consts::EXE_SUFFIX));
    if path.is_file() {
        Ok(path)
    } else {
        Err(anyhow::anyhow!(
            "--verify needs the loadgen binary beside mockserve, at {} (build it: cargo build -p \
             loadgen)",
            path.display()
        ))
    }
}

/// The candidate's replay as the live check runs it.
#[derive(Clone, Debug, PartialEq)]
struct Scaled {
    /// The replay words: the trial's, with the clock flags replaced.
    words: Vec<String>,
    /// The live run's arrival speed-up.
    arrival_speedup: f64,
    /// The live engine's `--speedup-ratio` (None against `--url`: the deployment's own speed).
    engine_speedup: Option<f64>,
    /// How much faster than the trace's clock both sides run: K on loopback, 1 with `--url`.
    time_scale: f64,
}

/// The replay words `all` (a trial's) run `speedup` times faster: the arrival speed-up times
/// `speedup`, and on `loopback` the engine's `--speedup-ratio` too (the whole replay
/// compressed).
fn scaled(all: &[String], speedup: f64, loopback: bool) -> anyhow::Result<Scaled> {
    let args = trial::parse_replay(all)
        .map_err(|e| anyhow::anyhow!("--verify: the best candidate's flags: {e}"))?;
    let arrival_speedup = args.trace.arrival_speedup_ratio * speedup;
    let engine_speedup = loopback.then_some(args.engine.speedup_ratio * speedup);
    let mut replaced = vec!["--arrival-speedup-ratio"];
    if loopback {
        replaced.push("--speedup-ratio");
    }
    let mut words = Vec::with_capacity(all.len() + 4);
    let mut i = 0;
    while i < all.len() {
        let w = all[i].as_str();
        if replaced.contains(&w) {
            i += 2;
            continue;
        }
        if !replaced
            .iter()
            .any(|f| w.strip_prefix(f).is_some_and(|r| r.starts_with('=')))
        {
            words.push(all[i].clone());
        }
        i += 1;
    }
    if let Some(engine) = engine_speedup {
        words.push("--speedup-ratio".into());
        words.push(engine.to_string());
    }
    words.push("--arrival-speedup-ratio".into());
    words.push(arrival_speedup.to_string());
    Ok(Scaled {
        words,
        arrival_speedup,
        engine_speedup,
        time_scale: if loopback { speedup } else { 1.0 },
    })
}

/// `slo` on a clock `scale` times faster: every bound divided by it.
fn slo_at(slo: &Slo, scale: f64) -> Slo {
    Slo {
        ttft_ms: slo.ttft_ms.map(|v| v / scale),
        itl_ms: slo.itl_ms.map(|v| v / scale),
        e2e_ms: slo.e2e_ms.map(|v| v / scale),
        trajectory_e2e_ms: slo.trajectory_e2e_ms.map(|v| v / scale),
    }
}

/// Runs `cmd` until it exits or `timeout` passes (then kills it); returns its status and the
/// last of its stderr.
fn run_bounded(
    mut cmd: Command,
    timeout: Duration,
) -> anyhow::Result<(std::process::ExitStatus, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("--verify: cannot start loadgen: {e}"))?;
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut text);
        }
        text
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                anyhow::bail!(
                    "--verify: the live run took longer than --verify-timeout-s {}; loadgen was \
                     stopped",
                    timeout.as_secs()
                );
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!("--verify: waiting for loadgen: {e}");
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let tail: String = {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    Ok((status, tail))
}

/// A percentile (linear between the closest ranks) of `v`, sorted here.
fn percentile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

/// What the live run's per-request lines say: the good requests under `slo` (the same test as
/// the offline trial's: completed, and every bound met by TTFT, mean ITL and E2E), the count,
/// and the engine's own TTFT and E2E where the server reported them.
struct LiveCounts {
    requests: u64,
    good: u64,
    engine_ttft: Vec<f64>,
    engine_e2e: Vec<f64>,
}

fn live_counts(path: &Path, slo: &Slo) -> anyhow::Result<LiveCounts> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--verify: reading {}: {e}", path.display()))?;
    let mut out = LiveCounts {
        requests: 0,
        good: 0,
        engine_ttft: Vec::new(),
        engine_e2e: Vec::new(),
    };
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let r: Value = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!("--verify: {}:{}: not JSON: {e}", path.display(), n + 1)
        })?;
        let f = |k: &str| r.get(k).and_then(Value::as_f64);
        out.requests += 1;
        let within = |limit: Option<f64>, v: Option<f64>| match (limit, v) {
            (None, _) => true,
            (Some(l), Some(v)) => v <= l,
            (Some(_), None) => false,
        };
        let completed = r.get("status").and_then(Value::as_str) == Some("completed");
        let good = completed
            && within(slo.ttft_ms, f("ttft_ms"))
            && (slo.itl_ms.is_none() || f("itl_ms").is_none_or(|v| Some(v) <= slo.itl_ms))
            && within(slo.e2e_ms, f("e2e_latency_ms"));
        out.good += u64::from(good);
        if let Some(v) = f("engine_ttft_ms") {
            out.engine_ttft.push(v);
        }
        if let Some(v) = f("engine_e2e_ms") {
            out.engine_e2e.push(v);
        }
    }
    Ok(out)
}

/// The check of `best`: predicted (offline at the speed-up) and measured side by side.
pub fn run(
    header: &Header,
    best: &TrialRecord,
    opts: &Options,
    cache: &trial::TraceCache,
) -> anyhow::Result<Verified> {
    if !(opts.speedup.is_finite() && opts.speedup > 0.0) {
        anyhow::bail!("--verify-speedup must be above 0, got {}", opts.speedup);
    }
    let loadgen = loadgen_path()?;
    let run = scaled(
        &replay_words(header, best),
        opts.speedup,
        opts.url.is_none(),
    )?;
    let scale = run.time_scale;
    // The bounds on the run's clock: the same requests meet them as on the trace's.
    let slo = slo_at(opts.slo, scale);
    let words = &run.words;
    let settings = trial::Settings {
        slo: &slo,
        attainment: opts.attainment,
        speedup_steps: 0,
        early_stop: trial::EarlyStop::Off,
        one_thread: false,
    };
    let predicted = trial::run(words, best.gpus, None, &settings, cache)
        .map_err(|e| anyhow::anyhow!("--verify: the offline replay at the speed-up: {e}"))?;
    let dir = std::env::temp_dir().join(format!(
        "mockserve-plan-verify-{}-{}",
        std::process::id(),
        best.index
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| anyhow::anyhow!("--verify: creating {}: {e}", dir.display()))?;
    let report_path = dir.join("live.json");
    let requests_path = dir.join("live.jsonl");
    let mut args = vec!["replay".to_string()];
    args.extend(words.iter().cloned());
    if let Some(url) = opts.url {
        args.push("--url".into());
        args.push(url.to_string());
    }
    args.push("--quiet".into());
    let mut shown = vec!["loadgen".to_string()];
    shown.extend(args.iter().cloned());
    let mut cmd = Command::new(&loadgen);
    cmd.args(&args)
        .arg("--report-json")
        .arg(&report_path)
        .arg("--per-request-jsonl")
        .arg(&requests_path);
    let outcome = run_bounded(cmd, opts.timeout);
    let result = outcome.and_then(|(status, stderr)| {
        let report: Option<Value> = std::fs::read_to_string(&report_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let Some(report) = report else {
            anyhow::bail!(
                "--verify: loadgen exited with {status} and wrote no report; its stderr:\n{stderr}"
            );
        };
        let counts = live_counts(&requests_path, &slo)?;
        Ok((status, stderr, report, counts))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let (status, stderr, live, counts) = result?;
    let failures = live
        .pointer("/failures/total")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if !status.success() && failures == 0 {
        anyhow::bail!("--verify: loadgen exited with {status}; its stderr:\n{stderr}");
    }
    let measured_attainment = if counts.requests > 0 {
        counts.good as f64 / counts.requests as f64
    } else {
        0.0
    };
    let mut pred = Map::new();
    let mut meas = Map::new();
    let mut diff = Map::new();
    pred.insert("slo_attainment".into(), predicted.slo_attainment.into());
    meas.insert("slo_attainment".into(), measured_attainment.into());
    let target = opts
        .url
        .map_or_else(|| "live on 127.0.0.1".to_string(), |u| u.to_string());
    let clocks = match run.engine_speedup {
        Some(engine) => format!(
            "{}x faster: arrival speed-up {}, engine speed-up {}; times on the trace's clock",
            opts.speedup, run.arrival_speedup, engine
        ),
        None => format!("arrival speed-up {}", run.arrival_speedup),
    };
    let mut table = format!(
        "Verify ({target}, {clocks}): {} requests live, {} failed\n{:<24} {:>11} {:>11} \
         {:>11}\n",
        counts.requests, failures, "figure", "predicted", "measured", "difference"
    );
    table.push_str(&format!(
        "{:<24} {:>10.1}% {:>10.1}%\n",
        "slo_attainment",
        predicted.slo_attainment * 100.0,
        measured_attainment * 100.0
    ));
    let cell = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.3}"));
    let row = |table: &mut String, key: &str, p: Option<f64>, m: Option<f64>| {
        let d = match (p, m) {
            (Some(p), Some(m)) if p > 0.0 => Some(100.0 * (m / p - 1.0)),
            _ => None,
        };
        table.push_str(&format!(
            "{:<24} {:>11} {:>11} {:>11}\n",
            key,
            cell(p),
            cell(m),
            d.map_or_else(|| "-".into(), |d| format!("{d:+.2}%"))
        ));
        d
    };
    for key in KEYS {
        let p = predicted.report.get(*key).map(|v| v * scale);
        let m = live.get(*key).and_then(Value::as_f64).map(|v| v * scale);
        pred.insert((*key).into(), p.into());
        meas.insert((*key).into(), m.into());
        let d = row(&mut table, key, p, m);
        diff.insert((*key).into(), d.into());
    }
    // The server's own times (from its engine's submission): the client's figures less the
    // time spent outside the engine.
    let (mut et, mut ee) = (counts.engine_ttft, counts.engine_e2e);
    let at = |v: &mut Vec<f64>, q: f64| percentile(v, q).map(|x| x * scale);
    let engine = [
        ("median_engine_ttft_ms", "median_ttft_ms", at(&mut et, 0.5)),
        ("p90_engine_ttft_ms", "p90_ttft_ms", at(&mut et, 0.9)),
        (
            "median_engine_e2e_ms",
            "median_e2e_latency_ms",
            at(&mut ee, 0.5),
        ),
        ("p90_engine_e2e_ms", "p90_e2e_latency_ms", at(&mut ee, 0.9)),
    ];
    for (key, predicted_key, m) in engine {
        meas.insert(key.into(), m.into());
        if m.is_some() {
            let p = pred.get(predicted_key).and_then(Value::as_f64);
            row(&mut table, key, p, m);
        }
    }
    let json = json!({
        "speedup": opts.speedup,
        "arrival_speedup_ratio": run.arrival_speedup,
        "engine_speedup_ratio": run.engine_speedup,
        "time_scale": scale,
        "target": opts.url.unwrap_or("127.0.0.1 (loadgen's embedded mockserve)"),
        "candidate": best.index,
        "command": join(&shown),
        "requests": counts.requests,
        "good_requests": counts.good,
        "failures": failures,
        "failure_reasons": live.pointer("/failures/by_reason").cloned().unwrap_or(Value::Null),
        "predicted": pred,
        "measured": meas,
        "difference_pct": diff,
    });
    let reasons = json["failure_reasons"].to_string();
    Ok(Verified {
        json,
        table,
        failures,
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&mut v, 0.5), Some(2.5));
        assert!(percentile(&mut v, 0.9).is_some_and(|p| (p - 3.7).abs() < 1e-9));
        assert_eq!(percentile(&mut [], 0.5), None);
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    /// On loopback the whole replay is compressed (arrivals and engine, whichever way the
    /// flags were written); against a deployment only the arrivals, its engine flags kept.
    #[test]
    fn speedup_compresses_both_clocks_on_loopback_and_the_arrivals_only_elsewhere() {
        let trial = words(&[
            "t.jsonl",
            "--num-workers",
            "4",
            "--arrival-speedup-ratio",
            "3",
            "--speedup-ratio=2",
        ]);
        let live = scaled(&trial, 10.0, true).expect("valid flags");
        assert_eq!(
            live,
            Scaled {
                words: words(&[
                    "t.jsonl",
                    "--num-workers",
                    "4",
                    "--speedup-ratio",
                    "20",
                    "--arrival-speedup-ratio",
                    "30",
                ]),
                arrival_speedup: 30.0,
                engine_speedup: Some(20.0),
                time_scale: 10.0,
            }
        );
        let remote = scaled(&trial, 10.0, false).expect("valid flags");
        assert_eq!(
            remote.words,
            words(&[
                "t.jsonl",
                "--num-workers",
                "4",
                "--speedup-ratio=2",
                "--arrival-speedup-ratio",
                "30",
            ])
        );
        assert_eq!((remote.engine_speedup, remote.time_scale), (None, 1.0));
        // The defaults (arrival 4, engine 1) are scaled too.
        let plain = scaled(&words(&["t.jsonl"]), 2.5, true).expect("valid flags");
        assert_eq!(
            plain.words,
            words(&[
                "t.jsonl",
                "--speedup-ratio",
                "2.5",
                "--arrival-speedup-ratio",
                "10"
            ])
        );
        let bounds = slo_at(
            &Slo {
                ttft_ms: Some(2000.0),
                itl_ms: None,
                e2e_ms: Some(50.0),
                ..Slo::default()
            },
            10.0,
        );
        assert_eq!(
            (bounds.ttft_ms, bounds.itl_ms, bounds.e2e_ms),
            (Some(200.0), None, Some(5.0))
        );
    }
}
