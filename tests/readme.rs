//! The documentation's contract with a fresh clone, for `README.md` and every page under `docs/`:
//! every repository path they name exists (or is an output git ignores), every link to a local
//! file or heading resolves, every `docs/` page is linked from the README, the README's layout
//! names every top-level folder, nothing reaches outside the repository, and every `loadgen`,
//! `mockserve` and `cargo run`/`cargo bench` command they show names subcommands and flags that
//! exist (and parses, when it has no placeholders). The cheap commands also run, in-process:
//! `--help`, `--version`, shell completions, `mockserve replay` of the in-repo trace and
//! `loadgen multiturn --ping` against the embedded server.

use std::path::{Component, Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use clap::{CommandFactory, Parser};

/// The repository root.
fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()))
}

fn readme() -> String {
    read(&repo().join("README.md"))
}

/// The pages under `docs/`, sorted.
fn docs_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("folder entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    pages
}

/// README.md and every docs page: the files every check below covers.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![repo().join("README.md")];
    files.extend(docs_pages());
    files
}

/// `path` relative to the repository root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The repository's top-level folders: the first component of every file git tracks, or, without
/// git, every folder in the root but `target/` and dot-folders.
fn top_level_folders() -> Vec<String> {
    let tracked = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|out| out.status.success() && !out.stdout.is_empty());
    let mut folders: Vec<String> = match tracked {
        Some(out) => String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter_map(|path| path.split_once('/').map(|(first, _)| first.to_owned()))
            .collect(),
        None => std::fs::read_dir(repo())
            .expect("the repository root is readable")
            .map(|entry| entry.expect("folder entry").path())
            .filter(|path| path.is_dir())
            .filter_map(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect(),
    };
    folders.retain(|name| name != "target" && !name.starts_with('.'));
    folders.sort();
    folders.dedup();
    folders
}

/// The repository paths `text` names: words made of path characters that start with a top-level
/// folder and a `/` (a sentence's final `.` is not part of the path).
fn repo_paths(text: &str, top_level: &[String]) -> Vec<String> {
    let mut paths: Vec<String> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)))
        .map(|word| word.trim_end_matches('.'))
        .filter(|word| {
            word.split_once('/')
                .is_some_and(|(first, _)| top_level.iter().any(|t| t == first))
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
    let top = ["src", "tests", "traces"].map(String::from);
    assert_eq!(
        repo_paths(text, &top),
        ["src/", "tests/x.rs", "traces/a.jsonl"].map(String::from)
    );
}

/// Whether a `.gitignore` in the repository ignores `path` (relative to the root): a plain line
/// ignores that name in its folder and below, a line starting with `/` that name in its folder
/// only. Enough for the outputs the docs name (`fuzz/scratch/...`, `target/...`).
fn git_ignores(path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    (0..parts.len()).any(|depth| {
        let folder = repo().join(parts[..depth].join("/"));
        let Ok(rules) = std::fs::read_to_string(folder.join(".gitignore")) else {
            return false;
        };
        rules.lines().map(str::trim).any(|rule| {
            let rule = rule.trim_end_matches('/');
            match rule.strip_prefix('/') {
                Some(anchored) => parts[depth] == anchored,
                None => !rule.is_empty() && parts[depth..].contains(&rule),
            }
        })
    })
}

#[test]
fn git_ignores_reads_the_repository_gitignores() {
    assert!(git_ignores("target/tmp/fuzz-findings/chat_body"));
    assert!(git_ignores("fuzz/scratch/chat_body"));
    assert!(!git_ignores("fuzz/corpus/chat_body"));
    assert!(!git_ignores("src/target.rs"));
}

#[test]
fn every_path_the_docs_name_exists() {
    let top_level = top_level_folders();
    let mut named = Vec::new();
    let mut missing = Vec::new();
    for file in markdown_files() {
        for path in repo_paths(&read(&file), &top_level) {
            if !repo().join(&path).exists() && !git_ignores(&path) {
                missing.push(format!("{}: {path}", shown(&file)));
            }
            named.push(path);
        }
    }
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
            named.iter().any(|p| p == expected),
            "neither the README nor docs/ names {expected}"
        );
    }
    assert!(missing.is_empty(), "missing paths: {missing:#?}");
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

/// `relative` joined to `folder` with `.` and `..` resolved, or `None` when it climbs above the
/// repository root.
fn resolve_in_repo(folder: &Path, relative: &str) -> Option<PathBuf> {
    let start = folder.strip_prefix(repo()).ok()?;
    let mut parts: Vec<String> = start
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for component in Path::new(relative).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(repo().join(parts.join("/")))
}

#[test]
fn nothing_reaches_outside_the_repository() {
    for file in markdown_files() {
        let folder = file.parent().expect("a file has a folder");
        let text = read(&file);
        for word in text.split(|c: char| c.is_whitespace() || "`()[]<>\"'".contains(c)) {
            if let Some(at) = word.find("../") {
                let relative = &word[at..];
                assert!(
                    resolve_in_repo(folder, relative).is_some(),
                    "{} names {word}, outside the repository",
                    shown(&file)
                );
            }
        }
    }
    assert!(
        !readme().contains("../"),
        "README.md names a path above its own folder"
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

/// A markdown file split into fenced code blocks (their lines) and prose (every other line).
struct Markdown {
    /// The lines of every code block but those fenced as `text` (program output).
    code: Vec<String>,
    /// The lines of the code blocks fenced as `text`.
    output: Vec<String>,
    prose: Vec<String>,
}

fn split_markdown(text: &str) -> Markdown {
    let mut markdown = Markdown {
        code: Vec::new(),
        output: Vec::new(),
        prose: Vec::new(),
    };
    let mut in_code = false;
    let mut output = false;
    for line in text.lines() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            in_code = !in_code;
            output = in_code && info.trim() == "text";
        } else if in_code {
            if output {
                markdown.output.push(line.to_owned());
            } else {
                markdown.code.push(line.to_owned());
            }
        } else {
            markdown.prose.push(line.to_owned());
        }
    }
    markdown
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        anchor("Finding the limit: sweep, merge, server metrics, HTML"),
        "finding-the-limit-sweep-merge-server-metrics-html"
    );
    assert_eq!(anchor("`mockserve replay`"), "mockserve-replay");
    assert_eq!(
        anchor("Caps on work per request"),
        "caps-on-work-per-request"
    );
}

/// The anchors of `text`'s headings.
fn anchors(text: &str) -> Vec<String> {
    split_markdown(text)
        .prose
        .iter()
        .filter_map(|line| {
            let title = line.trim_start_matches('#');
            (title.len() < line.len() && title.starts_with(' ')).then(|| anchor(title))
        })
        .collect()
}

/// The targets of the markdown links and images in `text`'s prose: `[text](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let prose = split_markdown(text).prose.join("\n");
    let mut targets = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        targets.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    targets
}

#[test]
fn every_local_link_resolves() {
    let mut broken = Vec::new();
    for file in markdown_files() {
        let text = read(&file);
        let folder = file.parent().expect("a file has a folder");
        for target in link_targets(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let linked = if path.is_empty() {
                Some(file.clone())
            } else {
                resolve_in_repo(folder, path)
            };
            let Some(linked) = linked.filter(|linked| linked.exists()) else {
                broken.push(format!("{}: {target} (no such file)", shown(&file)));
                continue;
            };
            if let Some(fragment) = fragment {
                let headings = if linked.extension().is_some_and(|ext| ext == "md") {
                    anchors(&read(&linked))
                } else {
                    Vec::new()
                };
                if !headings.iter().any(|h| h == fragment) {
                    broken.push(format!("{}: {target} (no such heading)", shown(&file)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn the_readme_links_every_docs_page() {
    let targets = link_targets(&readme());
    let pages = docs_pages();
    assert!(pages.len() >= 9, "{pages:?}");
    for page in pages {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(
            targets
                .iter()
                .any(|t| t.split('#').next() == Some(name.as_str())),
            "README.md does not link {name}"
        );
    }
}

#[test]
fn the_layout_names_every_top_level_folder() {
    let text = readme();
    let layout = text
        .split("\n## Layout")
        .nth(1)
        .expect("README.md has a Layout section");
    let layout = layout.split("\n## ").next().unwrap_or(layout);
    let markdown = split_markdown(layout);
    let named: Vec<&str> = (markdown.code.iter().chain(&markdown.output))
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|word| word.strip_suffix('/'))
        .collect();
    for folder in top_level_folders() {
        assert!(
            named.contains(&folder.as_str()),
            "the README's layout does not name {folder}/ (it names {named:?})"
        );
    }
    for folder in &named {
        assert!(
            repo().join(folder).is_dir(),
            "the README's layout names {folder}/, which does not exist"
        );
    }
}

/// Every module folder of every crate (a folder under a crate's `src/` with a `mod.rs`, or beside
/// a file of its name, `foo/` and `foo.rs`), as (the crate's source root as docs write it, e.g.
/// `mock_server/src/`, the folder's path under it).
fn module_folders() -> Vec<(String, String)> {
    let mut roots = vec![(String::from("src/"), repo().join("src"))];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo())
        .expect("the repository is readable")
        .map(|entry| entry.expect("folder entry").path())
        .filter(|dir| dir.join("Cargo.toml").is_file() && dir.join("src").is_dir())
        .collect();
    crates.sort();
    for dir in crates {
        roots.push((format!("{}/src/", shown(&dir)), dir.join("src")));
    }
    let mut folders = Vec::new();
    for (root, src) in roots {
        let mut found: Vec<String> = files_under(&src)
            .iter()
            .filter_map(|file| {
                let folder = file.parent()?;
                let is_module =
                    file.file_name()? == "mod.rs" || folder.with_extension("rs").is_file();
                is_module.then_some(folder)
            })
            .filter_map(|folder| folder.strip_prefix(&src).ok())
            .filter(|folder| !folder.as_os_str().is_empty())
            .map(|folder| folder.display().to_string())
            .collect();
        found.sort();
        found.dedup();
        folders.extend(found.into_iter().map(|folder| (root.clone(), folder)));
    }
    folders
}

/// Whether `text` names `word` as a word of its own (not the tail of a longer name).
fn names_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(at, _)| {
        !text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '/')
    })
}

/// docs/architecture.md names every module folder of every crate: in the crate's own listing
/// (the code-block line that starts with its source root, `mock_server/src/`, to the block's
/// end) as `NAME/`, or anywhere in the page by its whole path (`indexer_bench/src/indexer/`).
/// A new folder, or one moved, fails here until the page says what it holds.
#[test]
fn the_architecture_names_every_module_folder() {
    let page = read(&repo().join("docs/architecture.md"));
    let folders = module_folders();
    assert!(
        folders
            .iter()
            .any(|(root, f)| root == "mock_server/src/" && f == "api"),
        "module folders found: {folders:?}"
    );
    let mut missing = Vec::new();
    for (root, folder) in &folders {
        let listing = page.split("\n```").find(|block| {
            block
                .lines()
                .nth(1)
                .is_some_and(|l| l.starts_with(root.as_str()))
        });
        let name = folder.rsplit('/').next().unwrap_or(folder);
        let whole = format!("{root}{folder}/");
        let listed = listing.is_some_and(|block| names_word(block, &format!("{name}/")));
        if !listed && !page.contains(&whole) {
            missing.push(whole);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these module folders: {missing:?}"
    );
}

#[test]
fn the_readme_shows_the_main_job_and_what_ci_runs() {
    let text = readme();
    assert!(text.contains("\ncargo run --release -p loadgen -- multiturn\n"));
    let ci = read(&repo().join(".ci/run"));
    let test_command = ci
        .lines()
        .rfind(|line| line.starts_with("cargo test --workspace"))
        .expect(".ci/run runs cargo test --workspace");
    assert_eq!(
        test_command,
        "cargo test --workspace --all-targets --locked && cargo test --workspace --doc --locked"
    );
    assert!(
        text.lines().any(|line| line == test_command),
        "README.md does not show .ci/run's command {test_command:?}"
    );
}

/// The programs whose command lines the docs show.
#[derive(Debug, Clone, Copy)]
enum Program {
    Loadgen,
    Mockserve,
    MooncakeBench,
}

impl Program {
    fn command(self) -> clap::Command {
        let mut command = match self {
            Program::Loadgen => loadgen::Cli::command(),
            Program::Mockserve => mock_server::Cli::command(),
            Program::MooncakeBench => indexer_bench::cli::MooncakeArgs::command(),
        };
        command.build();
        command
    }

    /// Parses `args` (without the program name); `Ok` for a successful parse or a help or
    /// version request.
    fn parse(self, args: &[String]) -> Result<(), String> {
        let argv = std::iter::once("prog".to_owned()).chain(args.iter().cloned());
        let result = match self {
            Program::Loadgen => loadgen::Cli::try_parse_from(argv).map(|_| ()),
            Program::Mockserve => mock_server::Cli::try_parse_from(argv).map(|_| ()),
            Program::MooncakeBench => {
                indexer_bench::cli::MooncakeArgs::try_parse_from(argv).map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Splits a shell line into words: whitespace separates, quotes group (and are removed). A
/// quoted word is marked, since it may be a command line of its own (`sh -c '...'`).
fn shell_words(line: &str) -> Vec<(String, bool)> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                quoted = true;
            }
            None if c.is_whitespace() => {
                if !word.is_empty() || quoted {
                    words.push((std::mem::take(&mut word), quoted));
                }
                quoted = false;
            }
            None => word.push(c),
        }
    }
    if !word.is_empty() || quoted {
        words.push((word, quoted));
    }
    words
}

/// The simple commands of a shell line: split at `&&`, `||`, `;`, `|`, `&`, `do`, `then`, a
/// process substitution `<(`, and cut at a redirection. Every quoted word with a space in it is
/// also taken as a command line of its own.
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut nested = Vec::new();
    let mut redirected = false;
    for (word, quoted) in shell_words(line) {
        if quoted && word.contains(' ') {
            nested.extend(simple_commands(&word));
        }
        let mut word = word.as_str();
        if !quoted {
            if let Some(inner) = word.strip_prefix("<(").or_else(|| word.strip_prefix("$(")) {
                commands.push(Vec::new());
                redirected = false;
                word = inner;
            }
            if matches!(word, "&&" | "||" | ";" | "|" | "&" | "do" | "then") {
                commands.push(Vec::new());
                redirected = false;
                continue;
            }
            if word.starts_with('>') || word.starts_with("2>") || word.starts_with('<') {
                redirected = true;
            }
        }
        let ends = !quoted && word.ends_with(';');
        let word = if quoted {
            word
        } else {
            word.trim_end_matches(';').trim_end_matches(')')
        };
        if !redirected && !word.is_empty() {
            commands
                .last_mut()
                .expect("never empty")
                .push(word.to_owned());
        }
        if ends {
            commands.push(Vec::new());
            redirected = false;
        }
    }
    commands.extend(nested);
    commands.retain(|c| !c.is_empty());
    commands
}

#[test]
fn simple_commands_split_like_a_shell() {
    assert_eq!(
        simple_commands(
            "cargo build --release && X=1 scripts/a.sh sh -c 'loadgen bench --url \"$U\"' > out &"
        ),
        vec![
            vec!["cargo", "build", "--release"],
            vec![
                "X=1",
                "scripts/a.sh",
                "sh",
                "-c",
                "loadgen bench --url \"$U\""
            ],
            vec!["loadgen", "bench", "--url", "$U"],
        ]
    );
    assert_eq!(
        simple_commands("source <(mockserve completions bash)"),
        vec![vec!["source"], vec!["mockserve", "completions", "bash"]]
    );
}

/// The program a simple command runs and its arguments, for the programs the docs describe:
/// `loadgen`, `mockserve` (also as a path), `cargo run -p loadgen|mock_server -- ...` and the
/// `cargo bench --bench NAME -- ...` entry points.
fn invocation(words: &[String]) -> Option<(Program, Vec<String>)> {
    let words: Vec<&str> = words
        .iter()
        .map(String::as_str)
        .skip_while(|w| w.contains('=') && !w.starts_with('-'))
        .collect();
    let (&first, rest) = words.split_first()?;
    let owned = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let after_dashes = |args: &[&str]| {
        args.iter()
            .position(|a| *a == "--")
            .map(|at| owned(&args[at + 1..]))
    };
    let value_of = |flag: &str| rest.windows(2).find(|w| w[0] == flag).map(|w| w[1]);
    match first {
        "loadgen" => Some((Program::Loadgen, owned(rest))),
        _ if first == "mockserve" || first.ends_with("/mockserve") => {
            Some((Program::Mockserve, owned(rest)))
        }
        "cargo" if rest.first() == Some(&"run") => {
            let args = after_dashes(rest).unwrap_or_default();
            match value_of("-p")? {
                "loadgen" => Some((Program::Loadgen, args)),
                "mock_server" => Some((Program::Mockserve, args)),
                _ => None,
            }
        }
        "cargo" if rest.first() == Some(&"bench") => {
            let args = after_dashes(rest)?;
            let prefixed = |sub: &str| {
                std::iter::once(sub.to_owned())
                    .chain(args.clone())
                    .collect()
            };
            match value_of("--bench")? {
                "multiturn_bench" => Some((Program::Loadgen, prefixed("multiturn"))),
                "offline_replay_bench" => Some((Program::Mockserve, prefixed("replay"))),
                "mooncake_bench" => Some((Program::MooncakeBench, args)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether `word` stands for something to fill in: `[flags]`, `TRACE`, `...`, `$i`, `<target>`.
fn is_placeholder(word: &str) -> bool {
    let uppercase_run = word
        .as_bytes()
        .split(|b| !b.is_ascii_uppercase())
        .any(|run| run.len() >= 3);
    uppercase_run || word.contains(['[', ']', '$', '<', '>', '*', '…']) || word.contains("...")
}

/// Checks one command line of `program`: its subcommand exists, every flag it names exists on
/// that (sub)command, and, when nothing in it is a placeholder and `whole` says the line is a
/// whole command, it parses.
fn check_invocation(program: Program, args: &[String], whole: bool) -> Result<(), String> {
    let root = program.command();
    let mut command = &root;
    // The first word naming a subcommand descends; a nested one (`loadgen trace convert`) must
    // follow its parent's word.
    let mut parent_at: Option<usize> = None;
    for (at, word) in args.iter().map(|a| a.trim_matches(['[', ']'])).enumerate() {
        if word == "--" {
            break;
        }
        let may_descend = parent_at.is_none_or(|p| at == p + 1);
        if !word.starts_with('-') && may_descend && command.has_subcommands() {
            if let Some(sub) = command.find_subcommand(word) {
                command = sub;
                parent_at = Some(at);
            } else if at == 0 && !matches!(program, Program::MooncakeBench) {
                return Err(format!("`{word}` is not a subcommand"));
            } else if parent_at.is_some()
                && !is_placeholder(word)
                // `mockserve plan TRACE` or `mockserve plan merge`: a positional, not a subcommand.
                && command.get_positionals().next().is_none()
            {
                return Err(format!(
                    "`{word}` is not a subcommand of `{}`",
                    command.get_name()
                ));
            }
        }
        if let Some(long) = word.strip_prefix("--").filter(|l| !l.is_empty()) {
            let long = long.split('=').next().unwrap_or(long);
            let known = command.get_arguments().any(|arg| {
                arg.get_long() == Some(long)
                    || arg
                        .get_all_aliases()
                        .is_some_and(|aliases| aliases.contains(&long))
            });
            if !known {
                return Err(format!("`{}` has no flag --{long}", command.get_name()));
            }
        } else if let Some(short) = word
            .strip_prefix('-')
            .filter(|s| s.len() == 1 && s.chars().all(|c| c.is_ascii_alphabetic()))
        {
            let short = short.chars().next().expect("one char");
            if !command
                .get_arguments()
                .any(|arg| arg.get_short() == Some(short))
            {
                return Err(format!("`{}` has no flag -{short}", command.get_name()));
            }
        }
    }
    if whole && !args.iter().any(|a| is_placeholder(a)) {
        program.parse(args)?;
    }
    Ok(())
}

/// The command lines of a markdown text: every line of its code blocks but output (fenced as
/// `text`; a trailing `\` joins the next line, a `#` starts a comment) as whole commands, and every inline code span of its prose
/// that starts with `loadgen ` or `mockserve ` as a fragment.
fn command_lines(text: &str) -> Vec<(String, bool)> {
    let markdown = split_markdown(text);
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in &markdown.code {
        let line = match line.find(" #") {
            Some(at) => &line[..at],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                lines.push((std::mem::take(&mut pending), true));
            }
        }
    }
    let prose = markdown.prose.join("\n");
    for paragraph in prose.split("\n\n") {
        let paragraph = paragraph.replace('\n', " ");
        for (at, span) in paragraph.split('`').enumerate() {
            if at % 2 == 1 && (span.starts_with("loadgen ") || span.starts_with("mockserve ")) {
                lines.push((span.to_owned(), false));
            }
        }
    }
    lines
}

/// The problems of every command line in `text`.
fn command_problems(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, whole) in command_lines(text) {
        for words in simple_commands(&line) {
            if let Some((program, args)) = invocation(&words) {
                if let Err(e) = check_invocation(program, &args, whole) {
                    problems.push(format!("{}: {e}", line.trim()));
                }
            }
        }
    }
    problems
}

#[test]
fn command_checks_catch_unknown_flags_and_subcommands() {
    assert!(command_problems("```\nloadgen bench --concurrency 4\n```\n").is_empty());
    assert!(command_problems("`loadgen sweep --trace TRACE`").is_empty());
    assert!(command_problems("```text\nloadgen says hello\n```\n").is_empty());
    assert!(command_problems(
        "```\ncargo bench --bench mooncake_bench -- T -n 2 branch-sharded --num-shards 2\n```\n"
    )
    .is_empty());
    assert!(command_problems("`loadgen trace convert IN --block-size 64 -o OUT`").is_empty());
    for bad in [
        "```\nloadgen trace convert in.jsonl --block-size 64 -o t.jsonl --no-such-flag\n```\n",
        "```\nloadgen trace frobnicate in.jsonl\n```\n",
        "```\nloadgen bench --no-such-flag 4\n```\n",
        "```\nloadgen frobnicate --url x\n```\n",
        "```\ncargo run --release -p mock_server -- replay TRACE --no-such-flag\n```\n",
        "```\ncargo bench --bench multiturn_bench -- [--no-such-flag]\n```\n",
        "```\ncargo bench --bench mooncake_bench -- TRACE --no-such-flag\n```\n",
        "```\nscripts/ci-example.sh sh -c 'loadgen multiturn --no-such-flag'\n```\n",
        "```\nloadgen bench --concurrency many\n```\n",
        "text `mockserve replay TRACE -Z` text",
        "```bash\ncargo bench --bench mooncake_bench -- T flat --no-such-flag\n```\n",
    ] {
        assert_eq!(command_problems(bad).len(), 1, "{bad}");
    }
}

#[test]
fn every_command_the_docs_show_exists_and_parses() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        checked += command_lines(&text)
            .iter()
            .flat_map(|(line, _)| simple_commands(line))
            .filter(|words| invocation(words).is_some())
            .count();
        problems.extend(
            command_problems(&text)
                .into_iter()
                .map(|p| format!("{}: {p}", shown(&file))),
        );
    }
    assert!(checked >= 40, "only {checked} commands found");
    assert!(problems.is_empty(), "{problems:#?}");
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
