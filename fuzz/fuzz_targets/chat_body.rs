//! A request body to `POST /v1/chat/completions`; see `servesim_fuzzing::http::chat_body`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("chat_body");
