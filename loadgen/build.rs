// The git commit for `--version`: the same script as mockserve's (a file of loadgen's own, so
// that cargo's `rerun-if-changed=build.rs` names a file that exists).
include!("../mock_server/build.rs");
