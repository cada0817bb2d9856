//! A server's `/metrics` answer read by loadgen's scraper; see
//! `servesim_fuzzing::metrics::metrics_text`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("metrics_text");
