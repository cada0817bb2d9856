//! An SSE stream read by loadgen's parser, split where the input says; see
//! `servesim_fuzzing::sse::sse_stream`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("sse_stream");
