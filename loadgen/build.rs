//! Records the git commit the binary is built from, for `--version`: the script of mockserve's
//! (`../mock_server/git_commit.rs`), from a file of loadgen's own so that its
//! `rerun-if-changed=build.rs` names a file that exists.

include!("../mock_server/git_commit.rs");
