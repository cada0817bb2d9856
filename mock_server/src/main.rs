//! mockserve binary.
fn main() {}
