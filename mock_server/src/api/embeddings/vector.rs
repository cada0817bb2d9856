//! The embedding vectors and the response body of `/v1/embeddings`.
//!
//! A vector is the sum of one pseudo-random vector per input token, L2-normalised. Token `t`'s
//! vector under seed `s` is drawn by SplitMix64 from `xxh3(t, s)`, each 64-bit draw giving four
//! coordinates (16 bits each, uniform over (-1, 1), never 0), so it depends on the token, the
//! seed and nothing else: inputs that share tokens point alike (a bag of tokens: the order of
//! the tokens does not matter), unrelated inputs are close to orthogonal, and the same ids give
//! the same vector whether sent as text or as token ids.
//!
//! Only the first `dimensions` coordinates are drawn, then normalised: exactly what truncating
//! the full vector and renormalising gives, as OpenAI does for `dimensions`. The work is one
//! draw per four coordinates per token (distinct tokens of an input are drawn once, weighted by
//! their count), bounded by the request budget's token and value caps.

use std::io::Write;

use base64::Engine as _;

/// One SplitMix64 step: the next state and its output.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 16-bit lane as a coordinate: an odd multiple of 2^-16 in (-1, 1), never 0.
fn lane(bits: u64) -> f64 {
    (f64::from((bits & 0xFFFF) as u16) + 0.5) / 32_768.0 - 1.0
}

/// Adds `weight` times token `token`'s vector (its first `sum.len()` coordinates) to `sum`.
fn add_token(sum: &mut [f64], token: u32, seed: u64, weight: f64) {
    let mut state = xxhash_rust::xxh3::xxh3_64_with_seed(&token.to_le_bytes(), seed);
    for chunk in sum.chunks_mut(4) {
        let draw = splitmix(&mut state);
        for (k, x) in chunk.iter_mut().enumerate() {
            *x += weight * lane(draw >> (16 * k));
        }
    }
}

/// The embedding of `tokens` (not empty) under `seed`, of `dimensions` coordinates, with an L2
/// norm of 1 (within f32 rounding).
pub(crate) fn embed(tokens: &[u32], seed: u64, dimensions: usize) -> Vec<f32> {
    let mut sorted = tokens.to_vec();
    sorted.sort_unstable();
    let mut sum = vec![0.0f64; dimensions];
    for run in sorted.chunk_by(|a, b| a == b) {
        add_token(&mut sum, run[0], seed, run.len() as f64);
    }
    let norm = sum.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 && norm.is_finite() {
        sum.iter().map(|x| (x / norm) as f32).collect()
    } else {
        // Token vectors that cancel exactly (two tokens, one coordinate): a unit vector still.
        let mut unit = vec![0.0f32; dimensions];
        if let Some(first) = unit.first_mut() {
            *first = 1.0;
        }
        unit
    }
}

/// How a response carries each vector (`encoding_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// A JSON array of numbers.
    Float,
    /// The little-endian f32 bytes, standard base64 (padded), as OpenAI sends them.
    Base64,
}

/// What the response body says besides the vectors.
#[derive(Debug)]
pub(crate) struct BodySpec<'a> {
    /// The model name echoed.
    pub model: &'a str,
    /// Prompt tokens over all inputs.
    pub prompt_tokens: usize,
    /// Seed of the vectors.
    pub seed: u64,
    /// Coordinates per vector.
    pub dimensions: usize,
    /// How the vectors are written.
    pub encoding: Encoding,
}

/// The whole JSON response: `{"object":"list","data":[{"object":"embedding","index",
/// "embedding"}],"model","usage":{"prompt_tokens","total_tokens"}}`, written straight to bytes
/// (no JSON tree of a few million numbers). `None` as soon as `cancelled` says so, checked
/// before each input.
pub(crate) fn response_body(
    inputs: &[Vec<u32>],
    spec: &BodySpec<'_>,
    cancelled: impl Fn() -> bool,
) -> Option<Vec<u8>> {
    // About 12 bytes a number as JSON, 5.4 in base64.
    let per_value = match spec.encoding {
        Encoding::Float => 12,
        Encoding::Base64 => 6,
    };
    let mut out = Vec::with_capacity(inputs.len() * (48 + spec.dimensions * per_value) + 128);
    out.extend_from_slice(br#"{"object":"list","data":["#);
    let mut bytes = Vec::new();
    for (index, tokens) in inputs.iter().enumerate() {
        if cancelled() {
            return None;
        }
        if index > 0 {
            out.push(b',');
        }
        let vector = embed(tokens, spec.seed, spec.dimensions);
        // Writes into a Vec cannot fail; serializing f32s cannot either (finite values).
        let _ = write!(
            out,
            r#"{{"object":"embedding","index":{index},"embedding":"#
        );
        match spec.encoding {
            Encoding::Float => {
                let _ = serde_json::to_writer(&mut out, &vector);
            }
            Encoding::Base64 => {
                bytes.clear();
                bytes.extend(vector.iter().flat_map(|x| x.to_le_bytes()));
                out.push(b'"');
                push_base64(&bytes, &mut out);
                out.push(b'"');
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(br#"],"model":"#);
    let _ = serde_json::to_writer(&mut out, spec.model);
    let _ = write!(
        out,
        r#","usage":{{"prompt_tokens":{0},"total_tokens":{0}}}}}"#,
        spec.prompt_tokens
    );
    Some(out)
}

/// Appends the standard base64 (padded) of `bytes` to `out`.
fn push_base64(bytes: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    let len = base64::encoded_len(bytes.len(), true).unwrap_or(0);
    out.resize(start + len, 0);
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(bytes, &mut out[start..])
        .unwrap_or(0);
    out.truncate(start + written);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[f32]) -> f64 {
        v.iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum()
    }

    #[test]
    fn vectors_are_unit_deterministic_and_truncate_as_openai() {
        let tokens = [5, 9, 9, 1000, 3];
        let full = embed(&tokens, 7, 1024);
        assert_eq!(full.len(), 1024);
        assert!((norm(&full) - 1.0).abs() < 1e-6);
        assert_eq!(full, embed(&tokens, 7, 1024));
        assert_ne!(full, embed(&tokens, 8, 1024));
        // Order does not matter (a bag of tokens).
        assert_eq!(full, embed(&[3, 1000, 9, 5, 9], 7, 1024));
        for dims in [1, 3, 256] {
            let short = embed(&tokens, 7, dims);
            assert!((norm(&short) - 1.0).abs() < 1e-6, "{dims}");
            let cut = &full[..dims];
            let scale = norm(cut);
            for (s, c) in short.iter().zip(cut) {
                assert!((f64::from(*s) - f64::from(*c) / scale).abs() < 1e-6);
            }
        }
        // Cancelling token vectors still give a unit vector.
        for t in 0..200u32 {
            assert!((norm(&embed(&[t, t + 1], 1, 1)) - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn shared_tokens_point_alike() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[0] = 999;
        let c: Vec<u32> = (500..540).collect();
        let near = cosine(&embed(&a, 1, 1024), &embed(&b, 1, 1024));
        let far = cosine(&embed(&a, 1, 1024), &embed(&c, 1, 1024));
        assert!(near > 0.9, "{near}");
        assert!(far.abs() < 0.2, "{far}");
    }

    #[test]
    fn bodies_carry_floats_or_their_base64() {
        let inputs = vec![vec![1, 2, 3], vec![4]];
        let spec = BodySpec {
            model: "m\"x",
            prompt_tokens: 4,
            seed: 3,
            dimensions: 5,
            encoding: Encoding::Float,
        };
        let body = |spec: &BodySpec<'_>| -> serde_json::Value {
            let bytes = response_body(&inputs, spec, || false).expect("not cancelled");
            serde_json::from_slice(&bytes).expect("JSON")
        };
        let floats = body(&spec);
        let b64 = body(&BodySpec {
            encoding: Encoding::Base64,
            ..spec
        });
        assert_eq!(response_body(&inputs, &spec, || true), None);
        assert_eq!(floats["model"], "m\"x");
        assert_eq!(
            floats["usage"],
            serde_json::json!({"prompt_tokens": 4, "total_tokens": 4})
        );
        for i in 0..2 {
            assert_eq!(floats["data"][i]["index"], i);
            assert_eq!(floats["data"][i]["object"], "embedding");
            let want = embed(&inputs[i], 3, 5);
            let got: Vec<f32> =
                serde_json::from_value(floats["data"][i]["embedding"].clone()).expect("floats");
            assert_eq!(got, want);
            let text = b64["data"][i]["embedding"].as_str().expect("a string");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .expect("base64");
            let decoded: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(decoded, want);
        }
    }
}
