//! Prompt text for the `tiktoken` encodings; see `servesim_fuzzing::tokenizer::prompt_text`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("prompt_text");
