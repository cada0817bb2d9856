//! An SSE stream read by loadgen's parser, split where the input says; see
//! `servesim_fuzzing::sse::sse_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| servesim_fuzzing::sse::sse_stream(data));
