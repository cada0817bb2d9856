//! A request body to `POST /v1/completions`; see `servesim_fuzzing::http::completions_body`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("completions_body");
