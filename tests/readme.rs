//! The README's contract with a fresh clone: every repository path it names exists, nothing in it
//! or in `scripts/` reaches outside the repository, and its cheap commands work, run in-process:
//! `--help`, `--version`, shell completions, `mockserve replay` of the in-repo trace and
//! `loadgen multiturn --ping` against the embedded server.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use clap::{CommandFactory, Parser};

/// The repository root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).expect("README.md is readable")
}

/// The repository's top-level folders: a README word starting with one of these and a `/` is a
/// path in the repository.
const TOP_LEVEL: &[&str] = &[
    "benches",
    "fixtures",
    "loadgen",
    "mock_server",
    "profiles",
    "scripts",
    "src",
    "tests",
    "traces",
];

/// The repository paths `text` names: words made of path characters that start with a top-level
/// folder and a `/` (a sentence's final `.` is not part of the path).
fn repo_paths(text: &str) -> Vec<String> {
    let mut paths: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| {
            word.split_once('/')
                .is_some_and(|(first, _)| TOP_LEVEL.contains(&first))
        })
        .map(str::to_owned)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

#[test]
fn repo_paths_are_words_under_top_level_folders() {
    let text = "see `traces/a.jsonl`, src/ and tests/x.rs. Not ../shared/traces/a.jsonl, \
                http://127.0.0.1:8000/v1/models, kv/ or .peers/venv/dynamo";
    assert_eq!(
        repo_paths(text),
        ["src/", "tests/x.rs", "traces/a.jsonl"].map(String::from)
    );
}

#[test]
fn every_path_the_readme_names_exists() {
    let paths = repo_paths(&readme());
    for expected in [
        "traces/mooncake_synthetic_trace.jsonl",
        "profiles/h200_tp1_perf.npz",
        "scripts/compare-dynamo.sh",
        "scripts/ci-example.sh",
        "scripts/peers/setup.sh",
        "scripts/peers/run_dynamo.sh",
        "scripts/peers/dynamo_replay.py",
        "scripts/peers/kv_indexer.sh",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "README names no {expected}"
        );
    }
    let missing: Vec<&String> = paths.iter().filter(|p| !repo().join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "README names missing paths: {missing:?}"
    );
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("folder is readable") {
            let path = entry.expect("folder entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn nothing_reaches_outside_the_repository() {
    let text = readme();
    assert!(
        !text.contains("../"),
        "README.md names a path outside the repository"
    );
    let scripts = files_under(&repo().join("scripts"));
    assert!(scripts.len() >= 6, "{scripts:?}");
    for file in scripts {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        assert!(
            !text.contains("../shared") && !text.contains("/work/"),
            "{} reaches outside the repository",
            file.display()
        );
    }
}

#[test]
fn help_lists_the_subcommands() {
    let help = |result: Result<(), clap::Error>| {
        let err = result.expect_err("--help stops parsing");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        err.to_string()
    };
    let text = help(mock_server::Cli::try_parse_from(["mockserve", "--help"]).map(|_| ()));
    for name in ["serve", "replay", "completions", "--port"] {
        assert!(
            text.contains(name),
            "mockserve --help lacks {name}:\n{text}"
        );
    }
    let text = help(loadgen::Cli::try_parse_from(["loadgen", "--help"]).map(|_| ()));
    for name in ["multiturn", "replay", "bench", "compare", "completions"] {
        assert!(text.contains(name), "loadgen --help lacks {name}:\n{text}");
    }
}

#[test]
fn version_names_the_release_and_the_git_commit() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
    for (name, version) in [
        ("mockserve", mock_server::Cli::command().render_version()),
        ("loadgen", loadgen::Cli::command().render_version()),
    ] {
        let prefix = format!("{name} {} (", env!("CARGO_PKG_VERSION"));
        let commit = version
            .trim_end()
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{version:?} is not `{prefix}COMMIT)`"));
        match &head {
            Some(head) => assert!(
                commit.len() >= 7 && head.starts_with(commit),
                "{name} --version names {commit}, HEAD is {head}"
            ),
            None => assert!(
                commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
                "{version}"
            ),
        }
    }
}

#[test]
fn completions_name_the_subcommands_in_every_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let cli = mock_server::Cli::try_parse_from(["mockserve", "completions", shell])
            .expect("flags parse");
        let Some(mock_server::Command::Completions { shell: parsed }) = cli.command else {
            panic!(
                "`mockserve completions {shell}` parses as {:?}",
                cli.command
            );
        };
        let script = String::from_utf8(mock_server::completions(parsed)).expect("UTF-8");
        for name in ["mockserve", "serve", "replay", "completions"] {
            assert!(script.contains(name), "{shell} script lacks {name}");
        }

        let cli =
            loadgen::Cli::try_parse_from(["loadgen", "completions", shell]).expect("flags parse");
        let loadgen::Command::Completions { shell: parsed } = cli.command else {
            panic!("`loadgen completions {shell}` parses as {:?}", cli.command);
        };
        let script = String::from_utf8(loadgen::completions(parsed)).expect("UTF-8");
        for name in ["loadgen", "multiturn", "replay", "bench", "compare"] {
            assert!(script.contains(name), "{shell} script lacks {name}");
        }
    }
}

#[test]
fn mockserve_replays_a_slice_of_the_public_trace() {
    let trace = std::fs::read_to_string(repo().join("traces/mooncake_synthetic_trace.jsonl"))
        .expect("the public trace is in the repository");
    assert_eq!(trace.lines().count(), 3993);
    let dir = std::env::temp_dir().join(format!("servesim-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let slice = dir.join("first50.jsonl");
    let report = dir.join("report.json");
    let head: Vec<&str> = trace.lines().take(50).collect();
    std::fs::write(&slice, head.join("\n") + "\n").unwrap();
    let cli = mock_server::Cli::try_parse_from([
        "mockserve",
        "replay",
        slice.to_str().unwrap(),
        "--arrival-speedup-ratio",
        "1",
        "-q",
        "--report-json",
        report.to_str().unwrap(),
    ])
    .expect("flags parse");
    mock_server::run(cli).expect("replay runs");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["num_requests"], 50);
    assert_eq!(report["completed_requests"], 50);
    assert!(report["mean_ttft_ms"].as_f64().unwrap() > 0.0, "{report}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn loadgen_pings_the_embedded_server() {
    let cli =
        loadgen::Cli::try_parse_from(["loadgen", "multiturn", "--ping", "--speedup-ratio", "inf"])
            .expect("flags parse");
    // `run` starts its own runtime; a thread and a channel bound the wait.
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || done.send(loadgen::run(cli).map_err(|e| e.to_string())));
    result
        .recv_timeout(Duration::from_secs(120))
        .expect("the ping finishes within 120 s")
        .expect("the ping succeeds");
}
