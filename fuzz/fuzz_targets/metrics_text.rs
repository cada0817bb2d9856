//! A server's `/metrics` answer read by loadgen's scraper; see
//! `servesim_fuzzing::metrics::metrics_text`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| servesim_fuzzing::metrics::metrics_text(data));

// Half of the mutations are libFuzzer's own, half the target's structure-aware ones.
libfuzzer_sys::fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    if seed % 2 == 0 {
        libfuzzer_sys::fuzzer_mutate(data, size, max_size)
    } else {
        let target = servesim_fuzzing::target("metrics_text").expect("a known target");
        servesim_fuzzing::mutate::mutate_in_place(target, data, size, max_size, u64::from(seed))
    }
});
