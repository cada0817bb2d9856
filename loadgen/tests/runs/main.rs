//! loadgen's end-to-end tests, one binary: each module runs loadgen in-process (or its binary)
//! against the embedded mockserve or small stub servers on 127.0.0.1:0.
//!
//! - [`convert`]: `trace convert`, and the round trip of a multiturn run through a trace;
//! - [`failures`]: failed requests are reported as failures in every mode;
//! - [`multiturn`]: `multiturn` and `compare`;
//! - [`profile`]: `profile` recovers known latencies;
//! - [`replay`]: `replay`, live against offline;
//! - [`sweep`]: `sweep`, `merge`, shards, server metrics and the HTML report.

mod convert;
mod failures;
mod multiturn;
mod profile;
mod replay;
mod sweep;
