//! An agentic Mooncake trace, read into a request graph whose replay is started and driven;
//! see `servesim_fuzzing::graph::agentic_line`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("agentic_line");
