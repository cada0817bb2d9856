//! A request to a `mockserve fleet`'s admin listener; see `servesim_fuzzing::fleet::fleet_admin`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("fleet_admin");
