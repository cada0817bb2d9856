//! Prompt text encoded by servesim's `tiktoken` encodings: the ids are tiktoken's own (the
//! reference is `tiktoken-rs`, whose pattern and ranks servesim's split and piece cache stand in
//! front of), encoding twice gives the same ids (the second time from the cache), and the ids
//! decode back to the text.

use std::collections::HashSet;
use std::sync::OnceLock;

use servesim::tokenizer::{TiktokenEncoding, TiktokenTokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

/// Both encodings: servesim's and the reference, loaded once per process.
fn encodings() -> &'static [(TiktokenTokenizer, CoreBPE); 2] {
    static LOADED: OnceLock<[(TiktokenTokenizer, CoreBPE); 2]> = OnceLock::new();
    LOADED.get_or_init(|| {
        let load = |encoding: TiktokenEncoding| {
            let ours = TiktokenTokenizer::new(encoding).expect("embedded encoding loads");
            let reference = match encoding {
                TiktokenEncoding::Cl100kBase => tiktoken_rs::cl100k_base(),
                TiktokenEncoding::O200kBase => tiktoken_rs::o200k_base(),
            }
            .expect("reference encoding loads");
            (ours, reference)
        };
        [
            load(TiktokenEncoding::Cl100kBase),
            load(TiktokenEncoding::O200kBase),
        ]
    })
}

/// Checks both encodings on `data` read as UTF-8 (invalid bytes replaced).
pub fn prompt_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for (ours, reference) in encodings() {
        let ids = ours.encode(&text);
        // The reference's error is its pattern's backtracking limit: servesim then encodes
        // character by character, which the round trip below still checks.
        if let Ok((expected, _)) = reference.encode(&text, &HashSet::new()) {
            assert_eq!(ids, expected, "{:?}: ids of {text:?}", ours.encoding());
        }
        assert_eq!(
            ours.encode(&text),
            ids,
            "{:?}: second encoding",
            ours.encoding()
        );
        assert_eq!(ours.decode(&ids), text, "{:?}: round trip", ours.encoding());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_of_every_kind_pass() {
        for text in [
            "",
            "Hello world, it's HTTP/2.0 at 12345 o'clock!\r\n\r\n  x\t ",
            "unicode é 日本 🦀 and ASCII",
            "   \n",
        ] {
            prompt_text(text.as_bytes());
        }
        prompt_text(b"\xff\xfe invalid \xc3");
    }
}
