//! Bytes from a peer of mockserve's KV-event sockets; see
//! `servesim_fuzzing::zmtp::zmtp_frames`.
#![no_main]

servesim_fuzzing::libfuzzer_target!("zmtp_frames");
