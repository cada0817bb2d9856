//! loadgen's end-to-end tests, one binary: each module runs loadgen in-process (or its binary)
//! against the embedded mockserve or small stub servers on 127.0.0.1:0.
//!
//! - [`bounds`]: issue 43: a closed stdout pipe, merge's header checks, capped reads, the
//!   agentic in-flight cap, the routing line's own decisions;
//! - [`calibrate`]: `calibrate`, a live run against the offline replay, and its bad input;
//! - [`calibrate_fit`]: `calibrate --fit`: fit on one trace's run, gate on another;
//! - [`convert`]: `trace convert`, and the round trip of a multiturn run through a trace;
//! - [`dataset`]: `--dataset` prompts in `bench` and `multiturn`, and their errors;
//! - [`endpoints`]: `--endpoint responses|messages|embeddings` count tokens as chat does;
//! - [`failures`]: failed requests are reported as failures in every mode;
//! - [`multiturn`]: `multiturn` and `compare`;
//! - [`profile`]: `profile` recovers known latencies;
//! - [`repeat`]: `--num-runs` (the aggregate across runs) and `--lora-mix` (adapters per
//!   request, per-adapter figures, the server's LoRA series);
//! - [`replay`]: `replay`, live against offline;
//! - [`sweep`]: `sweep`, `merge`, shards, server metrics and the HTML report.

mod common;

mod bounds;
mod calibrate;
mod calibrate_fit;
mod convert;
mod dataset;
mod endpoints;
mod failures;
mod multiturn;
mod profile;
mod repeat;
mod replay;
mod sweep;
