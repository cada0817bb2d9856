//! `mockserve plan`, through the binary: each strategy on a small trace, resume from the
//! ledger, shards merged into the unsharded report's bytes, the printed replay command
//! reproducing the ledger's figures, and every bad input named.

mod inputs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mockserve-plan-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Runs `mockserve ARGS` in the workspace root.
fn mockserve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mockserve"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("mockserve runs")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(out: &Output) -> String {
    assert!(!out.status.success(), "should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

const TRACE: &str = "fixtures/trace_small.jsonl";

/// 12 aggregated and 8 disaggregated candidates, 2 of them over `max_gpus`.
const SPACE: &str = "num_workers = {min = 1, max = 3}\n\
max_num_batched_tokens = [1024, 8192]\n\
router_mode = [\"round-robin\", \"kv-router\"]\n\
[disaggregated]\n\
num_prefill_workers = [1, 2]\n\
num_decode_workers = [1, 2]\n\
router_mode = [\"kv-router\"]\n\
[constraints]\n\
max_gpus = 3\n";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.display().to_string()
}

/// The plan command over the small trace with `space`, writing `report` and `ledger`.
fn plan_args<'a>(space: &'a str, report: &'a str, ledger: &'a str) -> Vec<&'a str> {
    vec![
        "plan",
        TRACE,
        "--space",
        space,
        "--slo",
        "ttft=100ms,tpot=20ms",
        "--arrival-speedup-ratio",
        "1",
        "--report-json",
        report,
        "--ledger",
        ledger,
        "-q",
    ]
}

fn ledger_lines(path: &str) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("ledger")
        .lines()
        .map(|l| serde_json::from_str(l).expect("ledger line"))
        .collect()
}

#[test]
fn grid_ranks_every_candidate_and_its_command_reproduces_the_ledger() {
    let dir = scratch("grid");
    let space = write(&dir, "space.toml", SPACE);
    let report = dir.join("r.json").display().to_string();
    let ledger = dir.join("l.jsonl").display().to_string();
    let html = dir.join("r.html").display().to_string();
    let mut args = plan_args(&space, &report, &ledger);
    args.extend(["--html", html.as_str(), "--top", "3", "--attainment", "0.9"]);
    let table = ok(&mockserve(&args));
    let r = json(Path::new(&report));
    // 3 x 2 x 2 aggregated; 2 x 2 x 2 disaggregated, minus 2+2 over max_gpus = 3.
    assert_eq!(r["counts"]["candidates"], 18);
    assert_eq!(r["counts"]["trials"], 18);
    // 12 candidates miss the SLOs for more than 10% of the requests: with --attainment, they
    // stop early.
    assert_eq!(r["counts"]["stopped"], 12);
    assert_eq!(r["counts"]["failed"], 0);
    let all = r["trials"].as_array().expect("trials");
    let indexes: Vec<u64> = all.iter().map(|t| t["index"].as_u64().unwrap()).collect();
    assert_eq!(indexes, (0..18).collect::<Vec<u64>>());
    for t in all.iter().filter(|t| t["status"] == "stopped") {
        assert!(t.get("goodput_per_gpu_tok_s").is_none(), "{t}");
        assert!(t["stopped"]["attainment_at_most"].as_f64().unwrap() < 0.9);
        assert!(t["command"]
            .as_str()
            .unwrap()
            .starts_with("mockserve replay "));
    }
    let trials: Vec<&Value> = all.iter().filter(|t| t["status"] == "ok").collect();
    assert_eq!(trials.len(), 6);
    for t in &trials {
        for key in [
            "gpus",
            "goodput_per_gpu_tok_s",
            "goodput_tok_s",
            "slo_attainment",
            "max_speedup",
            "p90_ttft_ms",
            "p99_tpot_ms",
            "mean_e2e_latency_ms",
            "command",
        ] {
            assert!(t.get(key).is_some(), "{key} in {t}");
        }
    }
    assert!(all.iter().all(|t| t["gpus"].as_u64().unwrap() <= 3));
    // The ranking is by goodput per GPU, best first; best is its head.
    let ranking = r["ranking"].as_array().expect("ranking");
    assert_eq!(ranking.len(), 6);
    let g: Vec<f64> = ranking
        .iter()
        .map(|t| t["goodput_per_gpu_tok_s"].as_f64().unwrap())
        .collect();
    assert!(g.windows(2).all(|w| w[0] >= w[1]), "{g:?}");
    assert_eq!(r["best"]["index"], ranking[0]["index"]);
    assert_eq!(r["top"].as_array().unwrap().len(), 3);
    // Goodput = goodput per GPU x GPUs.
    let best = &r["best"];
    let gpus = best["gpus"].as_f64().unwrap();
    assert!(
        (best["goodput_tok_s"].as_f64().unwrap() - gpus * g[0]).abs() < 1e-6,
        "{best}"
    );
    // No point on the front is dominated by any trial.
    for p in r["pareto"].as_array().expect("pareto") {
        let (pg, pu) = (
            p["goodput_per_gpu_tok_s"].as_f64().unwrap(),
            p["tok_s_per_user"].as_f64().unwrap(),
        );
        for t in &trials {
            let (tg, tu) = (
                t["goodput_per_gpu_tok_s"].as_f64().unwrap(),
                t["tok_s_per_user"].as_f64().unwrap(),
            );
            assert!(
                !(tg >= pg && tu >= pu && (tg > pg || tu > pu)),
                "{p} by {t}"
            );
        }
    }
    // The console table and the deployment forms.
    assert!(table.contains("Best (replay): mockserve replay fixtures/trace_small.jsonl"));
    let fleet = best["fleet_command"].as_str().unwrap();
    assert!(
        fleet.starts_with("mockserve fleet --workers ") || fleet.starts_with("mockserve serve"),
        "{fleet}"
    );
    assert!(!fleet.contains("--arrival-speedup-ratio"), "{fleet}");
    let vllm = best["vllm"]["engine_args"].as_array().unwrap();
    assert_eq!(vllm[0], "--max-num-seqs");
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("<polyline"));
    // The ledger: a header, then one line per trial.
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 19);
    assert_eq!(lines[0]["plan"]["objective"], "goodput-per-gpu");
    // Each top candidate's printed command reproduces its ledger figures exactly.
    for top in r["top"].as_array().unwrap() {
        let command = top["command"].as_str().unwrap();
        let words: Vec<&str> = command.split(' ').collect();
        assert_eq!(&words[..2], ["mockserve", "replay"]);
        let out_path = dir.join("replay.json").display().to_string();
        let mut args: Vec<&str> = words[1..].to_vec();
        args.extend(["-q", "--report-json", out_path.as_str()]);
        ok(&mockserve(&args));
        let replayed = json(Path::new(&out_path));
        let recorded = lines
            .iter()
            .find(|l| l["index"] == top["index"])
            .expect("in the ledger");
        let stats = recorded["figures"]["report"].as_object().unwrap();
        assert!(stats.len() >= 30);
        for (k, v) in stats {
            assert_eq!(&replayed[k], v, "{k} of {command}");
        }
        assert_eq!(
            replayed["completed_requests"],
            recorded["figures"]["completed_requests"]
        );
    }
}

#[test]
fn random_is_seeded_and_independent_of_the_thread_count() {
    let dir = scratch("random");
    let space = write(&dir, "space.toml", SPACE);
    let run = |seed: &str, jobs: &str, name: &str| {
        let report = dir.join(format!("{name}.json")).display().to_string();
        let ledger = dir.join(format!("{name}.jsonl")).display().to_string();
        let mut args = plan_args(&space, &report, &ledger);
        args.extend([
            "--strategy",
            "random",
            "--max-trials",
            "4",
            "--seed",
            seed,
            "-j",
            jobs,
            "--attainment",
            "0.5",
        ]);
        ok(&mockserve(&args));
        std::fs::read_to_string(&report).unwrap()
    };
    let a = run("7", "1", "a");
    let b = run("7", "3", "b");
    assert_eq!(
        a, b,
        "the same seed gives the same bytes on 1 and 3 threads"
    );
    let r: Value = serde_json::from_str(&a).unwrap();
    assert_eq!(r["counts"]["trials"], 4);
    let c = run("8", "2", "c");
    let idx = |text: &str| -> Vec<Value> {
        let r: Value = serde_json::from_str(text).unwrap();
        r["trials"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["index"].clone())
            .collect()
    };
    assert_ne!(idx(&a), idx(&c), "another seed draws other candidates");
}

#[test]
fn halving_spends_prefixes_and_ends_on_a_grid_figure() {
    let dir = scratch("halving");
    let space = write(&dir, "space.toml", SPACE);
    let grid = dir.join("grid.json").display().to_string();
    let grid_ledger = dir.join("grid.jsonl").display().to_string();
    let mut args = plan_args(&space, &grid, &grid_ledger);
    args.extend(["--speedup-steps", "0"]);
    ok(&mockserve(&args));
    let report = dir.join("h.json").display().to_string();
    let ledger = dir.join("h.jsonl").display().to_string();
    let mut args = plan_args(&space, &report, &ledger);
    args.extend(["--strategy", "halving", "--speedup-steps", "0"]);
    ok(&mockserve(&args));
    let h = json(Path::new(&report));
    let g = json(Path::new(&grid));
    // 18 candidates: three prefix rounds (18, 6, 2 candidates), then 1 on the whole trace.
    assert_eq!(h["counts"]["prefix_trials"], 26);
    assert_eq!(h["counts"]["trials"], 1);
    let lines = ledger_lines(&ledger);
    let prefixes: Vec<u64> = lines[1..]
        .iter()
        .filter_map(|l| l["prefix_sessions"].as_u64())
        .collect();
    assert_eq!(prefixes.len(), 26);
    // Its survivor's figures are the grid's trial of the same candidate, byte for byte.
    let best = &h["best"];
    let same = g["trials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["index"] == best["index"])
        .expect("in the grid");
    for key in ["goodput_per_gpu_tok_s", "slo_attainment", "p90_ttft_ms"] {
        assert_eq!(best[key], same[key], "{key}");
    }
}

/// Early stop (the default) against `--no-early-stop` on the same grid: the candidates that
/// meet the SLOs keep their figures, rank and front; each stopped one is below the attainment
/// in full, within its recorded bound, and its reason names the request that lost the SLO.
#[test]
fn early_stop_stops_only_infeasible_candidates_and_changes_no_figure() {
    let dir = scratch("early");
    let space = write(&dir, "space.toml", SPACE);
    let run = |name: &str, extra: &[&str]| {
        let report = dir.join(format!("{name}.json")).display().to_string();
        let ledger = dir.join(format!("{name}.jsonl")).display().to_string();
        let mut args = plan_args(&space, &report, &ledger);
        args.extend(["--attainment", "0.9"]);
        args.extend_from_slice(extra);
        ok(&mockserve(&args));
        (json(Path::new(&report)), ledger_lines(&ledger))
    };
    let (early, early_lines) = run("early", &[]);
    let (full, full_lines) = run("full", &["--no-early-stop"]);
    assert_eq!(early_lines[0]["plan"]["early_stop"], true);
    assert_eq!(full_lines[0]["plan"]["early_stop"], false);
    let by_index = |lines: &[Value]| -> std::collections::BTreeMap<u64, Value> {
        lines[1..]
            .iter()
            .map(|l| (l["index"].as_u64().unwrap(), l.clone()))
            .collect()
    };
    let (e, f) = (by_index(&early_lines), by_index(&full_lines));
    assert_eq!(e.len(), 18);
    let mut stopped = 0;
    for (i, t) in &e {
        let whole = &f[i]["figures"];
        let attained = whole["slo_attainment"].as_f64().unwrap();
        match t["status"].as_str().unwrap() {
            "ok" => {
                assert_eq!(&t["figures"], whole, "candidate {i}");
                assert!(attained >= 0.9);
            }
            "stopped" => {
                stopped += 1;
                assert!(t.get("figures").is_none(), "{t}");
                let note = &t["stopped"];
                let bound = note["attainment_at_most"].as_f64().unwrap();
                assert!(attained <= bound && bound < 0.9, "{i}: {attained} {t}");
                // 20 requests at 90%: the third miss loses it.
                assert!(note["missed_requests"].as_u64().unwrap() >= 3, "{t}");
                assert_eq!(note["num_requests"], 20);
                let reason = t["reason"].as_str().unwrap();
                let line = note["line"].as_u64().unwrap();
                assert!(
                    reason.contains(&format!("the request of trace line {line} (session ")),
                    "{reason}"
                );
                assert!(reason.contains("below the attainment 90%"), "{reason}");
            }
            other => panic!("candidate {i}: status {other}"),
        }
    }
    assert_eq!(stopped, 12);
    assert_eq!(
        e[&0]["reason"],
        "SLO lost at 0.360 s (simulated), 2 of 20 requests ended: the request of trace line 2 \
         (session request_2, turn 0) was the 3rd to miss the SLOs (TPOT 27.341 ms > 20 ms); \
         with 4 missed by then, at most 80.00% of requests can meet them, below the attainment \
         90%. Stopped early (--no-early-stop runs it in full)"
    );
    for key in ["best", "top", "ranking", "pareto"] {
        assert_eq!(early[key], full[key], "{key}");
    }
    assert_eq!(early["counts"]["stopped"], 12);
    assert_eq!(full["counts"]["stopped"], 0);
    // Without --attainment the ranking ranks every candidate: trials run in full.
    let report = dir.join("u.json").display().to_string();
    let ledger = dir.join("u.jsonl").display().to_string();
    ok(&mockserve(&plan_args(&space, &report, &ledger)));
    let lines = ledger_lines(&ledger);
    assert_eq!(lines[0]["plan"]["early_stop"], false);
    assert!(lines[1..].iter().all(|l| l["status"] == "ok"));
    // A resumed early-stop run does not accept the full run's ledger.
    let report = dir.join("x.json").display().to_string();
    let ledger = dir.join("full.jsonl").display().to_string();
    let mut args = plan_args(&space, &report, &ledger);
    args.extend(["--attainment", "0.9"]);
    assert!(fails(&mockserve(&args)).contains("holds another search"));
}

#[test]
fn an_interrupted_run_resumes_from_its_ledger() {
    let dir = scratch("resume");
    let space = write(&dir, "space.toml", SPACE);
    let report = dir.join("r.json").display().to_string();
    let ledger = dir.join("l.jsonl").display().to_string();
    ok(&mockserve(&plan_args(&space, &report, &ledger)));
    let whole = std::fs::read_to_string(&report).unwrap();
    // Keep the header and 5 trials, and half of the 6th line (a cut write).
    let text = std::fs::read_to_string(&ledger).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut cut = lines[..6].join("\n");
    cut.push('\n');
    cut.push_str(&lines[6][..lines[6].len() / 2]);
    std::fs::write(&ledger, cut).unwrap();
    let out = mockserve(&plan_args(&space, &report, &ledger)[..12]);
    ok(&out);
    assert!(String::from_utf8_lossy(&out.stderr).contains("resuming: 5 trials"));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), whole);
    let lines = ledger_lines(&ledger);
    assert_eq!(lines.len(), 19, "no trial twice");
    // Another search refuses the ledger.
    let out = mockserve(&[
        "plan",
        TRACE,
        "--space",
        &space,
        "--slo",
        "ttft=50ms",
        "--ledger",
        &ledger,
        "-q",
    ]);
    assert!(fails(&out).contains("holds another search"));
}

#[test]
fn shards_merged_equal_the_unsharded_run() {
    let dir = scratch("shards");
    let space = write(&dir, "space.toml", SPACE);
    let report = dir.join("r.json").display().to_string();
    let ledger = dir.join("l.jsonl").display().to_string();
    ok(&mockserve(&plan_args(&space, &report, &ledger)));
    let mut ledgers = Vec::new();
    for i in 0..4 {
        let l = dir.join(format!("s{i}.jsonl")).display().to_string();
        let r = dir.join(format!("s{i}.json")).display().to_string();
        let shard = format!("{i}/4");
        let mut args = plan_args(&space, &r, &l);
        args.extend(["--shard", shard.as_str()]);
        ok(&mockserve(&args));
        ledgers.push(l);
    }
    let merged = dir.join("m.json").display().to_string();
    let merged_ledger = dir.join("m.jsonl").display().to_string();
    let mut args = vec!["plan", "merge"];
    args.extend(ledgers.iter().map(String::as_str));
    args.extend(["--report-json", &merged, "--ledger", &merged_ledger]);
    ok(&mockserve(&args));
    assert_eq!(
        std::fs::read_to_string(&merged).unwrap(),
        std::fs::read_to_string(&report).unwrap()
    );
    // The merged ledger holds the unsharded one's lines, in candidate order.
    let mut one: Vec<Value> = ledger_lines(&ledger)[1..].to_vec();
    one.sort_by_key(|l| l["index"].as_u64());
    assert_eq!(ledger_lines(&merged_ledger)[1..], one[..]);
    // Shards of another search do not merge.
    let other = dir.join("o.jsonl").display().to_string();
    let r = dir.join("o.json").display().to_string();
    let mut args = plan_args(&space, &r, &other);
    args[5] = "ttft=1s";
    args.extend(["--shard", "0/4"]);
    ok(&mockserve(&args));
    let out = mockserve(&["plan", "merge", &ledgers[1], &other]);
    assert!(fails(&out).contains("from another search"));
}

#[test]
fn fewest_gpus_and_named_profiles() {
    let dir = scratch("profiles");
    let space = write(
        &dir,
        "space.toml",
        "num_workers = [1, 2, 3]\nperf_profile = [\"tp1\", \"tp2\"]\n",
    );
    let report = dir.join("r.json").display().to_string();
    let ledger = dir.join("l.jsonl").display().to_string();
    let mut args = plan_args(&space, &report, &ledger);
    args[5] = "ttft=2s";
    args.extend([
        "--perf-profile",
        "tp1=profiles/h200_tp1_perf.npz:1",
        "--perf-profile",
        "tp2=profiles/h200_tp1_perf.npz:2",
        "--objective",
        "fewest-gpus",
        "--attainment",
        "0.5",
        "--speedup-steps",
        "0",
    ]);
    ok(&mockserve(&args));
    let r = json(Path::new(&report));
    let gpus: Vec<u64> = r["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["gpus"].as_u64().unwrap())
        .collect();
    // num_workers x profile, the profile varying fastest.
    assert_eq!(gpus, [1, 2, 2, 4, 3, 6]);
    let ranked: Vec<u64> = r["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["gpus"].as_u64().unwrap())
        .collect();
    assert!(ranked.windows(2).all(|w| w[0] <= w[1]), "{ranked:?}");
    assert_eq!(r["best"]["gpus"], 1);
    let tp2 = r["trials"][1]["command"].as_str().unwrap();
    assert!(
        tp2.contains("--perf-profile profiles/h200_tp1_perf.npz"),
        "{tp2}"
    );
    // The ranking carries no deployment forms; the top does.
    assert!(r["ranking"][0].get("vllm").is_none());
    let top = r["top"].as_array().unwrap();
    let tp2_top = top
        .iter()
        .find(|t| t["knobs"]["perf_profile"] == "tp2")
        .expect("tp2 in the top 5");
    let engine_args = tp2_top["vllm"]["engine_args"].to_string();
    assert!(
        engine_args.contains("\"--tensor-parallel-size\",\"2\""),
        "{engine_args}"
    );
}

#[test]
fn bad_input_is_named() {
    let dir = scratch("errors");
    let report = dir.join("r.json").display().to_string();
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "max_num_seqs = []\n",
            &[],
            "key max_num_seqs: an empty list",
        ),
        (
            "num_workers = {min = 8, max = 1}\n",
            &[],
            "key num_workers: min 8 is above max 1",
        ),
        (
            "num_workers = [1, 2]\n",
            &["--num-workers", "2"],
            "key num_workers: also given as the fixed flag --num-workers",
        ),
        ("router_mode = [\"fastest\"]\n", &[], "key router_mode: "),
        (
            "warp_speed = [1]\n",
            &[],
            "key warp_speed: not a `mockserve replay`",
        ),
        (
            "num_workers = [1]\n[disaggregated]\nnum_workers = [2]\n",
            &[],
            "key disaggregated.num_workers",
        ),
        ("", &[], "no key to search"),
        (
            "num_workers = {min = 2, max = 4}\n[constraints]\nmax_gpus = 1\n",
            &[],
            "no candidate left: all 3 exceed [constraints] max_gpus = 1",
        ),
        (
            "num_workers = {min = 1, max = 200}\nmax_num_seqs = {min = 1, max = 200}\n",
            &[],
            "40000 candidates, over the cap of 20000: give --max-trials",
        ),
        (
            "num_workers = {min = 1, max = 200}\nmax_num_seqs = {min = 1, max = 200}\n",
            &["--max-trials", "10"],
            "--max-trials 10: the grid has 40000 candidates",
        ),
        (
            "perf_profile = [\"h100\"]\n",
            &[],
            "key perf_profile names profiles, but no --perf-profile",
        ),
        (
            "perf_profile = [\"h100\"]\n",
            &["--perf-profile", "h200=profiles/h200_tp1_perf.npz:1"],
            "no --perf-profile named \"h100\"",
        ),
        (
            "num_workers = [1]\n",
            &["--perf-profile", "h100=/nonexistent/h100.npz:1"],
            "--perf-profile \"h100=/nonexistent/h100.npz:1\": no such profile file",
        ),
        (
            "num_workers = [1]\n",
            &["--attainment", "2"],
            "--attainment must be from 0 to 1",
        ),
        (
            "num_workers = [1]\n",
            &["--strategy", "halving", "--shard", "0/2"],
            "--shard needs --strategy grid or random",
        ),
        (
            "num_workers = [1]\n",
            &["--per-request-jsonl", "x.jsonl"],
            "--per-request-jsonl describes one replay's output",
        ),
        (
            "num_workers = [1]\n",
            &["--autoscale", "load"],
            "--autoscale scales one replay's fleet; `mockserve plan` searches static fleets",
        ),
        (
            "num_workers = [1, 2]\n",
            &[
                "--slo",
                "ttft=1us",
                "--attainment",
                "0.9",
                "--no-early-stop",
            ],
            "no candidate meets --slo ttft=0.001ms for 90% of requests (--attainment); the \
             closest meets them for 0.0% of requests (1 GPUs, num_workers=1): mockserve replay",
        ),
        (
            "num_workers = [1, 2]\n",
            &["--slo", "ttft=1us", "--attainment", "0.9"],
            "no candidate meets --slo ttft=0.001ms for 90% of requests (--attainment); every \
             trial stopped once its SLO was lost. The one that held longest (0 of 20 requests \
             ended; 1 GPUs, num_workers=1) meets them for at most 85.00% of requests: an upper \
             bound, not its attainment (--no-early-stop measures it in full): mockserve replay",
        ),
    ];
    for (i, (space, extra, needle)) in cases.iter().enumerate() {
        let space = write(&dir, &format!("space{i}.toml"), space);
        let mut args = vec!["plan", TRACE, "--space", space.as_str(), "-q"];
        if !extra.contains(&"--slo") {
            args.extend(["--slo", "ttft=1s"]);
        }
        args.extend(["--report-json", report.as_str(), "--speedup-steps", "0"]);
        args.extend_from_slice(extra);
        let err = fails(&mockserve(&args));
        assert!(err.contains(needle), "case {i}: {needle:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // The closest candidate is in the report written before the error.
    let r = json(Path::new(&report));
    assert_eq!(r["ranking"].as_array().unwrap().len(), 0);
    assert_eq!(r["counts"]["trials"], 2);
    let out = mockserve(&[
        "plan",
        TRACE,
        "--space",
        "/nonexistent/space.toml",
        "--slo",
        "ttft=1s",
    ]);
    assert!(fails(&out).contains("--space /nonexistent/space.toml"));
    let out = mockserve(&["plan", TRACE, "--space", "x.toml", "--slo", "ttft=soon"]);
    assert!(fails(&out).contains("\"soon\" is not a number of us, ms or s"));
}

/// The loadgen binary beside mockserve (`.ci/run` builds both before the tests).
fn loadgen_beside() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_mockserve")).with_file_name("loadgen");
    assert!(
        path.is_file(),
        "--verify runs {}: build it first (cargo build -p loadgen), as .ci/run does",
        path.display()
    );
    path
}

/// The small space of the verify tests: 1 or 2 workers at 8,192 batched tokens.
const VERIFY_SPACE: &str = "num_workers = [1, 2]\nmax_num_batched_tokens = [8192]\n";

#[test]
fn verify_replays_the_best_candidate_live_beside_its_prediction() {
    loadgen_beside();
    let dir = scratch("verify");
    let space = write(&dir, "space.toml", VERIFY_SPACE);
    let report = dir.join("r.json").display().to_string();
    let out = mockserve(&[
        "plan",
        TRACE,
        "--space",
        &space,
        // The engine planned 10 times slower than its default, so that the check, 10 times
        // faster, runs it at its default speed: a debug client's own time stays small beside
        // the latencies it measures.
        "--slo",
        "ttft=1000ms,tpot=200ms",
        "--arrival-speedup-ratio",
        "1",
        "--speedup-ratio",
        "0.1",
        "--report-json",
        &report,
        "--verify",
        "--verify-speedup",
        "10",
        "-q",
    ]);
    let stdout = ok(&out);
    assert!(
        stdout.contains(
            "Verify (live on 127.0.0.1, 10x faster: arrival speed-up 10, engine speed-up 1; \
             times on the trace's clock): 20 requests live, 0 failed"
        ),
        "{stdout}"
    );
    let r = json(Path::new(&report));
    let v = &r["verify"];
    assert_eq!(v["candidate"], r["best"]["index"]);
    assert_eq!(v["speedup"], 10.0);
    assert_eq!(v["time_scale"], 10.0);
    assert_eq!(v["arrival_speedup_ratio"], 10.0);
    assert_eq!(v["engine_speedup_ratio"], 1.0);
    assert_eq!(v["requests"], 20);
    assert_eq!(v["failures"], 0);
    let best_workers = r["best"]["knobs"]["num_workers"].as_u64().expect("knob");
    assert_eq!(
        v["command"],
        format!(
            "loadgen replay {TRACE} --max-num-batched-tokens 8192 --num-workers {best_workers} \
             --speedup-ratio 1 --arrival-speedup-ratio 10 --quiet"
        )
    );
    // The prediction is the offline replay of the live run's flags, the whole replay 10 times
    // faster (arrivals and engine), printed on the trace's clock: the replay command's figures
    // at --arrival-speedup-ratio 10 --speedup-ratio 1, times 10.
    let offline = dir.join("offline.json").display().to_string();
    let workers = best_workers.to_string();
    ok(&mockserve(&[
        "replay",
        TRACE,
        "--max-num-batched-tokens",
        "8192",
        "--num-workers",
        &workers,
        "--arrival-speedup-ratio",
        "10",
        "--speedup-ratio",
        "1",
        "-q",
        "--report-json",
        &offline,
    ]));
    let offline = json(Path::new(&offline));
    for key in [
        "median_ttft_ms",
        "p90_ttft_ms",
        "p90_itl_ms",
        "p90_e2e_latency_ms",
    ] {
        let offline = offline[key].as_f64().expect("offline figure");
        assert_eq!(v["predicted"][key].as_f64(), Some(offline * 10.0), "{key}");
    }
    // Live on loopback runs the same engine: the figures agree within a generous bound (a
    // debug build and a shared machine add host time to every request), the TTFTs the
    // server's own (from its engine's submission), which the client's time does not blur.
    let figure = |side: &str, key: &str| v[side][key].as_f64().expect(key);
    for (measured, predicted) in [
        ("p90_engine_ttft_ms", "p90_ttft_ms"),
        ("median_engine_ttft_ms", "median_ttft_ms"),
        ("p90_e2e_latency_ms", "p90_e2e_latency_ms"),
    ] {
        let (p, m) = (figure("predicted", predicted), figure("measured", measured));
        assert!(
            (m / p - 1.0).abs() < 0.5,
            "{measured}: predicted {p}, measured {m}"
        );
    }
    for key in ["p90_ttft_ms", "p90_e2e_latency_ms", "median_ttft_ms"] {
        let (p, m) = (figure("predicted", key), figure("measured", key));
        let d = v["difference_pct"][key].as_f64().expect("difference");
        assert!((d - 100.0 * (m / p - 1.0)).abs() < 1e-9);
    }
    let (pa, ma) = (
        v["predicted"]["slo_attainment"]
            .as_f64()
            .expect("attainment"),
        v["measured"]["slo_attainment"]
            .as_f64()
            .expect("attainment"),
    );
    assert!(
        (0.0..=1.0).contains(&ma) && (pa - ma).abs() <= 0.25,
        "{pa} {ma}"
    );
    assert_eq!(
        v["good_requests"].as_f64().expect("good"),
        (ma * 20.0).round()
    );
    // The engine's own times come back through nvext.timing and sit below the client's.
    let et = v["measured"]["p90_engine_ttft_ms"]
        .as_f64()
        .expect("engine ttft");
    assert!(et > 0.0 && et <= v["measured"]["p90_ttft_ms"].as_f64().expect("ttft"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn verify_failures_are_named_and_the_report_is_still_written() {
    let dir = scratch("verify-bad");
    let space = write(&dir, "space.toml", VERIFY_SPACE);
    let report = dir.join("r.json").display().to_string();
    let base = |extra: &[&str]| {
        let mut args = vec![
            "plan",
            TRACE,
            "--space",
            space.as_str(),
            "--slo",
            "ttft=100ms",
            "--arrival-speedup-ratio",
            "1",
            "--speedup-steps",
            "0",
            "--report-json",
            report.as_str(),
            "-q",
        ];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        mockserve(&args)
    };
    // The verify flags need --verify.
    let err = fails(&run(base(&["--verify-speedup", "5"])));
    assert!(err.contains("--verify"), "{err}");
    let err = fails(&run(base(&["--verify", "--verify-speedup", "0"])));
    assert!(
        err.contains("--verify-speedup must be above 0, got 0"),
        "{err}"
    );
    // A deployment that does not answer: every request fails, the command says so and fails,
    // and the report (without verify) is written.
    loadgen_beside();
    let err = fails(&run(base(&[
        "--verify",
        "--url",
        "http://127.0.0.1:1",
        "--verify-timeout-s",
        "120",
    ])));
    assert!(
        err.contains("--verify: loadgen exited with exit status: 1 and wrote no report")
            && err.contains("http://127.0.0.1:1/v1/models"),
        "{err}"
    );
    assert!(json(Path::new(&report))["best"].is_object());
    // A live run past its bound is stopped, never waited on: the trace's 560 ms of arrivals
    // last 56 s at speed-up 0.01.
    let started = std::time::Instant::now();
    let err = fails(&run(base(&[
        "--verify",
        "--verify-speedup",
        "0.01",
        "--verify-timeout-s",
        "1",
    ])));
    assert!(
        err.contains(
            "--verify: the live run took longer than --verify-timeout-s 1; loadgen was stopped"
        ),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // Without loadgen beside the executable, the error names where it was looked for.
    let alone = dir.join("bin");
    std::fs::create_dir_all(&alone).expect("bin dir");
    let exe = alone.join("mockserve");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_mockserve"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_mockserve"), &exe).expect("copy mockserve");
    }
    let args = base(&["--verify"]);
    let out = Command::new(&exe)
        .args(&args)
        .current_dir(root())
        .output()
        .expect("mockserve runs");
    let err = fails(&out);
    assert!(
        err.contains(&format!(
            "--verify needs the loadgen binary beside mockserve, at {}",
            alone.join("loadgen").display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
