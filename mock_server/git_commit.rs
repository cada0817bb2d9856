// The body of mockserve's and loadgen's build scripts (each includes it from a build.rs of its own,
// so that `rerun-if-changed=build.rs` names a file of its package).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Output of `git ARGS` run in the crate's directory, trimmed; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()));
    println!("cargo:rerun-if-changed=build.rs");
    let commit = git(&dir, &["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SERVESIM_GIT_COMMIT={commit}");
    // Run again when HEAD moves: a checkout rewrites HEAD, a commit the branch's ref (a loose file
    // or, after `git pack-refs`, packed-refs). `--git-path` finds them in worktrees too.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&dir, &["symbolic-ref", "-q", "HEAD"]));
    for name in &watched {
        if let Some(path) = git(&dir, &["rev-parse", "--git-path", name]) {
            // A relative answer is relative to `dir`, as cargo reads relative paths.
            if dir.join(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
}
