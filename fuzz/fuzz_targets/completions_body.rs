//! A request body to `POST /v1/completions`; see `servesim_fuzzing::http::completions_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| servesim_fuzzing::http::completions_body(data));
