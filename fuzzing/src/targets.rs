//! [`Target`]: what a fuzz target is (the list of them is [`crate::TARGETS`]).

/// One fuzz target: a checker and what its mutator should know about the input format.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// The name: a directory under `fuzz/corpus/` and `fuzz/regressions/`, and a libFuzzer target.
    pub name: &'static str,
    /// Returns when every property holds; panics naming the violated one otherwise.
    pub check: fn(&[u8]),
    /// Byte strings worth inserting anywhere (tokens of the format, awkward values).
    pub dictionary: &'static [&'static [u8]],
    /// JSON object keys worth adding, for formats made of JSON objects.
    pub fields: &'static [&'static str],
    /// Inputs are cut to this many bytes.
    pub max_len: usize,
}
