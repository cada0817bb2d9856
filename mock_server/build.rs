//! Records the git commit the binary is built from, for `--version`, as `SERVESIM_GIT_COMMIT`.
//! Outside a git checkout, or without git, the commit is `unknown`; this script never fails.

include!("git_commit.rs");
