//! A weka file, read into a request graph whose replay is started and driven; see
//! `servesim_fuzzing::graph::weka_play`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("weka_play");
