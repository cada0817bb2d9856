//! A request body to `POST /v1/chat/completions`; see `servesim_fuzzing::http::chat_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| servesim_fuzzing::http::chat_body(data));
