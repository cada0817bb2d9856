//! A Mooncake JSONL trace, parsed and replayed; see `servesim_fuzzing::trace::trace_line`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| servesim_fuzzing::trace::trace_line(data));
