//! A Mooncake JSONL trace, parsed and replayed; see `servesim_fuzzing::trace::trace_line`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("trace_line");
