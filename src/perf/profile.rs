//! Profiled latency model: measured TTFT and ITL tables interpolated the way Dynamo's mocker
//! does (its `planner_profile_data` / `dynamo_profile` timing model), read from the mocker's
//! `.npz` format or from the same tables as JSON.
//!
//! The tables ([`ProfileTables`]):
//! - `prefill_isl` (1-D, new prompt tokens of a pass) and `prefill_ttft_ms` (same length):
//!   prefill time is a 1-D linear interpolation over the pass's new prompt tokens, extrapolated
//!   linearly past both ends, floored at 0;
//! - `decode_active_kv_tokens` (rows), `decode_context_length` (columns) and `decode_itl`
//!   (rows × columns, ms): decode time is a bilinear interpolation at (active KV tokens of the
//!   decoding requests, their mean context length by integer division), extrapolated past the
//!   grid, floored at 1 ms.
//!
//! An `.npz` is a zip archive (stored or deflated) of NumPy `.npy` files named after the arrays.
//! Only what such a profile needs of the `.npy` format is read and written here: little-endian
//! or native float64/float32/int64/int32 arrays of one or two dimensions.

use std::io::{Read, Seek, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{DecodeBatch, LatencyModel, PrefillBatch};

/// The array names of a profile, in the mocker's `.npz` and in the JSON twin.
pub(crate) const ARRAY_NAMES: [&str; 5] = [
    "prefill_isl",
    "prefill_ttft_ms",
    "decode_active_kv_tokens",
    "decode_context_length",
    "decode_itl",
];

/// The tables of a profiled latency model, in Dynamo mocker's layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileTables {
    /// Prefill axis: new prompt tokens of a pass, strictly increasing.
    pub prefill_isl: Vec<f64>,
    /// Prefill time in ms at each `prefill_isl` point.
    pub prefill_ttft_ms: Vec<f64>,
    /// Decode row axis: active KV tokens (sum of the decoding requests' context), increasing.
    pub decode_active_kv_tokens: Vec<f64>,
    /// Decode column axis: mean context length of the decoding requests, increasing.
    pub decode_context_length: Vec<f64>,
    /// Decode step time in ms: one row per `decode_active_kv_tokens` point, one column per
    /// `decode_context_length` point.
    pub decode_itl: Vec<Vec<f64>>,
}

/// A profile that cannot be read or used; every variant names the file (or source) it is about.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read or written.
    #[error("profile {source_name}: {error}")]
    Io {
        /// The file.
        source_name: String,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The file is not an `.npz` archive or JSON document of a profile.
    #[error("profile {source_name}: {message}")]
    Format {
        /// The file.
        source_name: String,
        /// What is wrong with it.
        message: String,
    },
    /// One array is missing, malformed or holds values the model cannot use.
    #[error("profile {source_name}: array `{array}`: {message}")]
    Array {
        /// The file.
        source_name: String,
        /// The array's name (one of `ARRAY_NAMES`).
        array: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// A problem with one array, before the file name is attached.
type ArrayProblem = (&'static str, String);

impl ProfileTables {
    /// Checks that the tables describe a usable model: every axis has at least two finite,
    /// non-negative, strictly increasing points; the value arrays match their axes' lengths and
    /// hold finite positive times. The error names the offending array.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        axis("prefill_isl", &self.prefill_isl)?;
        axis("decode_active_kv_tokens", &self.decode_active_kv_tokens)?;
        axis("decode_context_length", &self.decode_context_length)?;
        if self.prefill_ttft_ms.len() != self.prefill_isl.len() {
            return Err((
                "prefill_ttft_ms",
                format!(
                    "has {} values but prefill_isl has {} points",
                    self.prefill_ttft_ms.len(),
                    self.prefill_isl.len()
                ),
            ));
        }
        times("prefill_ttft_ms", &self.prefill_ttft_ms)?;
        let (rows, cols) = (
            self.decode_active_kv_tokens.len(),
            self.decode_context_length.len(),
        );
        if self.decode_itl.len() != rows || self.decode_itl.iter().any(|row| row.len() != cols) {
            return Err((
                "decode_itl",
                format!(
                    "shape is {} but must be ({rows}, {cols}) (decode_active_kv_tokens × \
                     decode_context_length)",
                    shape_text(&self.decode_itl)
                ),
            ));
        }
        for row in &self.decode_itl {
            times("decode_itl", row)?;
        }
        Ok(())
    }

    /// Reads a profile from a file: an `.npz` archive (recognised by its zip signature) or the
    /// JSON twin, then validates it.
    pub(crate) fn load(path: &Path) -> Result<ProfileTables, ProfileError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|error| ProfileError::Io {
            source_name: name.clone(),
            error,
        })?;
        ProfileTables::from_bytes(&bytes, &name)
    }

    /// Reads a profile from the bytes of an `.npz` archive or a JSON document; `source_name`
    /// names it in errors.
    pub fn from_bytes(bytes: &[u8], source_name: &str) -> Result<ProfileTables, ProfileError> {
        let tables = if bytes.starts_with(b"PK") {
            read_npz(std::io::Cursor::new(bytes), source_name)?
        } else {
            serde_json::from_slice::<ProfileTables>(bytes).map_err(|e| ProfileError::Format {
                source_name: source_name.to_string(),
                message: format!(
                    "neither an .npz archive nor profile JSON with arrays {}: {e}",
                    ARRAY_NAMES.join(", ")
                ),
            })?
        };
        tables
            .validate()
            .map_err(|(array, message)| ProfileError::Array {
                source_name: source_name.to_string(),
                array,
                message,
            })?;
        Ok(tables)
    }

    /// Writes the tables as a mocker-format `.npz` (stored float64 arrays).
    pub(crate) fn write_npz<W: Write + Seek>(&self, writer: W) -> std::io::Result<()> {
        let mut zip = zip::ZipWriter::new(writer);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let flat_itl: Vec<f64> = self.decode_itl.iter().flatten().copied().collect();
        let cols = self.decode_itl.first().map_or(0, Vec::len);
        let arrays: [(&str, Vec<usize>, &[f64]); 5] = [
            (
                "prefill_isl",
                vec![self.prefill_isl.len()],
                &self.prefill_isl,
            ),
            (
                "prefill_ttft_ms",
                vec![self.prefill_ttft_ms.len()],
                &self.prefill_ttft_ms,
            ),
            (
                "decode_active_kv_tokens",
                vec![self.decode_active_kv_tokens.len()],
                &self.decode_active_kv_tokens,
            ),
            (
                "decode_context_length",
                vec![self.decode_context_length.len()],
                &self.decode_context_length,
            ),
            ("decode_itl", vec![self.decode_itl.len(), cols], &flat_itl),
        ];
        for (name, shape, data) in arrays {
            zip.start_file(format!("{name}.npy"), options)
                .map_err(std::io::Error::other)?;
            zip.write_all(&npy_bytes(&shape, data))?;
        }
        zip.finish().map_err(std::io::Error::other)?;
        Ok(())
    }

    /// Writes the tables to `path`: the JSON twin when the name ends in `.json`, else `.npz`.
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let io = |error| ProfileError::Io {
            source_name: path.display().to_string(),
            error,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut writer = std::io::BufWriter::new(file);
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        {
            serde_json::to_writer_pretty(&mut writer, self).map_err(|e| io(e.into()))?;
            writer.write_all(b"\n").map_err(io)?;
        } else {
            self.write_npz(&mut writer).map_err(io)?;
        }
        writer.flush().map_err(io)
    }

    /// Prefill time in ms of `new_tokens` new prompt tokens (0 for none).
    pub fn prefill_at(&self, new_tokens: f64) -> f64 {
        if new_tokens <= 0.0 {
            return 0.0;
        }
        let (i, t) = segment(&self.prefill_isl, new_tokens);
        lerp(self.prefill_ttft_ms[i], self.prefill_ttft_ms[i + 1], t).max(0.0)
    }

    /// Decode step time in ms at `active_kv_tokens` and `mean_context_length`, floored at 1 ms.
    pub fn decode_at(&self, active_kv_tokens: f64, mean_context_length: f64) -> f64 {
        let (i, tx) = segment(&self.decode_active_kv_tokens, active_kv_tokens);
        let (j, ty) = segment(&self.decode_context_length, mean_context_length);
        let z = &self.decode_itl;
        let low = lerp(z[i][j], z[i + 1][j], tx);
        let high = lerp(z[i][j + 1], z[i + 1][j + 1], tx);
        lerp(low, high, ty).max(1.0)
    }
}

/// The index `i` of the axis segment `[axis[i], axis[i + 1]]` used for `x` (the one holding it,
/// or the end segment on the side `x` lies beyond) and the position of `x` on it, in units of
/// the segment (below 0 or above 1 when extrapolating). The axis has at least two points.
fn segment(axis: &[f64], x: f64) -> (usize, f64) {
    let last = axis.len().saturating_sub(2);
    let i = axis
        .partition_point(|&a| a <= x)
        .saturating_sub(1)
        .min(last);
    let t = (x - axis[i]) / (axis[i + 1] - axis[i]);
    (i, t)
}

fn lerp(a: f64, b: f64, t: f64) -> f64 {
    a + (b - a) * t
}

fn axis(name: &'static str, values: &[f64]) -> Result<(), ArrayProblem> {
    if values.len() < 2 {
        return Err((
            name,
            format!("needs at least 2 points, has {}", values.len()),
        ));
    }
    if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err((name, format!("holds {v}; points must be finite and >= 0")));
    }
    if let Some(w) = values.windows(2).find(|w| w[1] <= w[0]) {
        return Err((
            name,
            format!("is not strictly increasing ({} then {})", w[0], w[1]),
        ));
    }
    Ok(())
}

fn times(name: &'static str, values: &[f64]) -> Result<(), ArrayProblem> {
    match values.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        Some(v) => Err((name, format!("holds {v}; times must be finite and > 0"))),
        None => Ok(()),
    }
}

fn shape_text(rows: &[Vec<f64>]) -> String {
    let cols: Vec<usize> = rows.iter().map(Vec::len).collect();
    match cols.first() {
        Some(&c) if cols.iter().all(|&n| n == c) => format!("({}, {c})", rows.len()),
        Some(_) => format!("{} ragged rows", rows.len()),
        None => "(0,)".to_string(),
    }
}

/// Reads the five arrays of a mocker `.npz`.
fn read_npz<R: Read + Seek>(reader: R, source_name: &str) -> Result<ProfileTables, ProfileError> {
    let format = |message: String| ProfileError::Format {
        source_name: source_name.to_string(),
        message,
    };
    let mut zip = zip::ZipArchive::new(reader)
        .map_err(|e| format(format!("not a readable .npz (zip) archive: {e}")))?;
    let mut read = |array: &'static str| -> Result<Npy, ProfileError> {
        let problem = |message: String| ProfileError::Array {
            source_name: source_name.to_string(),
            array,
            message,
        };
        let mut file = match zip.by_name(&format!("{array}.npy")) {
            Ok(f) => f,
            Err(zip::result::ZipError::FileNotFound) => {
                return Err(problem("missing from the archive".to_string()))
            }
            Err(e) => return Err(problem(format!("cannot be read: {e}"))),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| problem(format!("cannot be read: {e}")))?;
        parse_npy(&bytes).map_err(problem)
    };
    let vector = |npy: Npy, array: &'static str| -> Result<Vec<f64>, ProfileError> {
        match npy.shape.as_slice() {
            [_] => Ok(npy.data),
            shape => Err(ProfileError::Array {
                source_name: source_name.to_string(),
                array,
                message: format!("must be 1-D, has shape {shape:?}"),
            }),
        }
    };
    let prefill_isl = vector(read("prefill_isl")?, "prefill_isl")?;
    let prefill_ttft_ms = vector(read("prefill_ttft_ms")?, "prefill_ttft_ms")?;
    let decode_active_kv_tokens =
        vector(read("decode_active_kv_tokens")?, "decode_active_kv_tokens")?;
    let decode_context_length = vector(read("decode_context_length")?, "decode_context_length")?;
    let itl = read("decode_itl")?;
    let decode_itl = match itl.shape.as_slice() {
        [rows, cols] if *cols > 0 => {
            debug_assert_eq!(itl.data.len(), rows * cols);
            itl.data.chunks(*cols).map(<[f64]>::to_vec).collect()
        }
        shape => {
            return Err(ProfileError::Array {
                source_name: source_name.to_string(),
                array: "decode_itl",
                message: format!("must be 2-D with columns, has shape {shape:?}"),
            })
        }
    };
    Ok(ProfileTables {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens,
        decode_context_length,
        decode_itl,
    })
}

/// A decoded `.npy` array: its shape and its values in C (row-major) order.
#[derive(Debug, PartialEq)]
struct Npy {
    shape: Vec<usize>,
    data: Vec<f64>,
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// Decodes a `.npy` file of float64, float32, int64 or int32 values.
fn parse_npy(bytes: &[u8]) -> Result<Npy, String> {
    let rest = bytes
        .strip_prefix(NPY_MAGIC)
        .ok_or("not a .npy array (no \\x93NUMPY signature)")?;
    let (header_len, rest) = match rest {
        [1, _, a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
        [2 | 3, _, a, b, c, d, rest @ ..] => (u32::from_le_bytes([*a, *b, *c, *d]) as usize, rest),
        [major, ..] => return Err(format!(".npy format version {major} is not supported")),
        [] => return Err("truncated .npy header".to_string()),
    };
    if rest.len() < header_len {
        return Err("truncated .npy header".to_string());
    }
    let (header, data) = rest.split_at(header_len);
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let descr = dict_value(header, "descr").ok_or("the .npy header has no 'descr'")?;
    let descr = match descr.chars().next() {
        Some(q @ ('\'' | '"')) => descr[1..].split(q).next().unwrap_or_default(),
        _ => return Err("the .npy header's 'descr' is not a string".to_string()),
    };
    let fortran = dict_value(header, "fortran_order")
        .ok_or("the .npy header has no 'fortran_order'")?
        .starts_with("True");
    let shape_text = dict_value(header, "shape").ok_or("the .npy header has no 'shape'")?;
    let shape = shape_text
        .trim_start_matches('(')
        .split(')')
        .next()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad .npy shape {shape_text:?}"))
        })
        .collect::<Result<Vec<usize>, String>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or("the .npy shape overflows")?;
    // Native byte order ('=') is little-endian on every platform NumPy profiles come from.
    let (width, decode): (usize, fn(&[u8]) -> f64) = match descr {
        "<f8" | "=f8" | "float64" => (8, |b| f64::from_le_bytes(array8(b))),
        "<f4" | "=f4" | "float32" => (4, |b| f64::from(f32::from_le_bytes(array4(b)))),
        "<i8" | "=i8" | "int64" => (8, |b| i64::from_le_bytes(array8(b)) as f64),
        "<i4" | "=i4" | "int32" => (4, |b| f64::from(i32::from_le_bytes(array4(b)))),
        other => {
            return Err(format!(
                "dtype {other:?} is not supported (expected little-endian float64, float32, \
                 int64 or int32)"
            ))
        }
    };
    let needed = count.checked_mul(width).ok_or("the .npy shape overflows")?;
    if data.len() < needed {
        return Err(format!(
            "truncated: shape {shape:?} needs {needed} data bytes, the file has {}",
            data.len()
        ));
    }
    let mut values: Vec<f64> = data[..needed].chunks_exact(width).map(decode).collect();
    if fortran && shape.len() == 2 {
        // Column-major on disk: transpose into row-major.
        let (rows, cols) = (shape[0], shape[1]);
        let column_major = values;
        values = (0..rows * cols)
            .map(|k| column_major[(k % cols) * rows + k / cols])
            .collect();
    }
    Ok(Npy {
        shape,
        data: values,
    })
}

fn array8(b: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    a
}

fn array4(b: &[u8]) -> [u8; 4] {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    a
}

/// The text of a value in the `.npy` header's Python dict literal, from just after `'key':`.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?;
    Some(rest.trim_start())
}

/// Encodes a float64 array as `.npy` version 1.0 (C order, little-endian).
fn npy_bytes(shape: &[usize], data: &[f64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape_text = match dims.as_slice() {
        [one] => format!("({one},)"),
        many => format!("({})", many.join(", ")),
    };
    let mut header = format!("{{'descr': '<f8', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let unpadded = NPY_MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 8 * data.len());
    out.extend_from_slice(NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// A latency model interpolated from profiled tables (Dynamo mocker's interpolated model).
#[derive(Clone, PartialEq)]
pub struct Profiled {
    /// The measured tables, validated.
    pub tables: ProfileTables,
    /// Where they came from (a file name), for reports.
    pub(crate) source: String,
}

impl Profiled {
    /// Loads and validates a profile file (`.npz` or JSON).
    pub fn load(path: &Path) -> Result<Profiled, ProfileError> {
        Ok(Profiled {
            tables: ProfileTables::load(path)?,
            source: path.display().to_string(),
        })
    }
}

impl std::fmt::Debug for Profiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The tables are long; a report needs the model and its file.
        f.debug_struct("Profiled")
            .field("source", &self.source)
            .field("prefill_points", &self.tables.prefill_isl.len())
            .field(
                "decode_grid",
                &(
                    self.tables.decode_active_kv_tokens.len(),
                    self.tables.decode_context_length.len(),
                ),
            )
            .finish()
    }
}

impl LatencyModel for Profiled {
    fn prefill_ms(&self, batch: &PrefillBatch) -> f64 {
        self.tables.prefill_at(batch.new_tokens() as f64)
    }

    fn decode_ms(&self, batch: &DecodeBatch) -> f64 {
        if batch.num_requests == 0 {
            return 0.0;
        }
        // The mean context length is an integer mean, like the prefill's batch means: with it,
        // round-robin replays match Dynamo's per-request times to the microsecond far more often
        // than with a fractional mean.
        let mean_context = batch.active_kv_tokens / batch.num_requests;
        self.tables
            .decode_at(batch.active_kv_tokens as f64, mean_context as f64)
    }

    fn describe(&self) -> String {
        format!("profile {}", self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ProfileTables {
        ProfileTables {
            prefill_isl: vec![100.0, 1100.0, 2100.0],
            prefill_ttft_ms: vec![20.0, 40.0, 100.0],
            decode_active_kv_tokens: vec![0.0, 1000.0],
            decode_context_length: vec![100.0, 300.0],
            decode_itl: vec![vec![5.0, 7.0], vec![9.0, 15.0]],
        }
    }

    fn model() -> Profiled {
        Profiled {
            tables: small(),
            source: "small".into(),
        }
    }

    fn prefill(tokens: usize) -> PrefillBatch {
        PrefillBatch {
            num_requests: 1,
            total_isl: tokens,
            total_prefix: 0,
        }
    }

    fn decode(num_requests: usize, active_kv_tokens: usize) -> DecodeBatch {
        DecodeBatch {
            num_requests,
            active_kv_tokens,
            total_kv_tokens: 1 << 20,
        }
    }

    fn repo_profile() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/h200_tp1_perf.npz")
    }

    #[test]
    fn prefill_interpolates_and_extrapolates_linearly() {
        let m = model();
        assert_eq!(m.prefill_ms(&prefill(100)), 20.0);
        assert_eq!(m.prefill_ms(&prefill(600)), 30.0);
        assert_eq!(m.prefill_ms(&prefill(1100)), 40.0);
        assert_eq!(m.prefill_ms(&prefill(1600)), 70.0);
        // Past the ends: the end segments continue (slope 0.02 below, 0.06 above).
        assert_eq!(m.prefill_ms(&prefill(50)), 19.0);
        assert_eq!(m.prefill_ms(&prefill(3100)), 160.0);
        // No new tokens: no prefill; a steep extrapolation never goes negative.
        assert_eq!(m.prefill_ms(&prefill(0)), 0.0);
        let steep = ProfileTables {
            prefill_ttft_ms: vec![1.0, 40.0, 100.0],
            ..small()
        };
        assert_eq!(steep.prefill_at(50.0), 0.0);
        // New tokens of a batch: integer means (2 requests, isl 700 and 500, prefix 0 and 200: 2 * (600 - 100)).
        let batch = PrefillBatch {
            num_requests: 2,
            total_isl: 1200,
            total_prefix: 200,
        };
        assert_eq!(m.prefill_ms(&batch), 38.0);
    }

    #[test]
    fn decode_is_bilinear_over_active_tokens_and_mean_context() {
        let m = model();
        // Corners.
        assert_eq!(m.tables.decode_at(0.0, 100.0), 5.0);
        assert_eq!(m.tables.decode_at(1000.0, 300.0), 15.0);
        // Centre: mean of the four corners.
        assert_eq!(m.tables.decode_at(500.0, 200.0), 9.0);
        // Through the batch: 2 requests, 400 active tokens -> mean context 200.
        // x: t = 0.4 -> rows (5 + 4*0.4, 7 + 8*0.4) at the two columns = (6.6, 10.2); y: half.
        assert!((m.decode_ms(&decode(2, 400)) - 8.4).abs() < 1e-12);
        // Extrapolation on both axes: t_x = 2, t_y = 1.5 (active 2000, mean context 400).
        // Column 100: 5 + 4*2 = 13; column 300: 7 + 8*2 = 23; then 13 + 10*1.5 = 28.
        assert_eq!(m.decode_ms(&decode(5, 2000)), 28.0);
        // Floor at 1 ms, and nothing to decode costs nothing.
        let low = ProfileTables {
            decode_itl: vec![vec![1.5, 1.2], vec![1.5, 1.2]],
            ..small()
        };
        assert_eq!(low.decode_at(0.0, 10_000.0), 1.0);
        assert_eq!(m.decode_ms(&DecodeBatch::default()), 0.0);
    }

    #[test]
    fn repository_profile_loads_and_matches_its_tables() {
        let m = Profiled::load(&repo_profile()).expect("loads");
        let t = &m.tables;
        assert_eq!(t.prefill_isl.len(), 17);
        assert_eq!(t.decode_itl.len(), 21);
        assert_eq!(
            t.decode_context_length,
            [350.0, 2997.0, 5644.0, 8291.0, 10938.0, 13585.0]
        );
        // Table points are reproduced exactly; the midpoint of the first prefill segment is the
        // mean of its ends.
        assert_eq!(m.prefill_ms(&prefill(1117)), t.prefill_ttft_ms[1]);
        assert!((t.prefill_ttft_ms[1] - 38.494131).abs() < 1e-9);
        assert!((t.prefill_at(608.5) - (19.525209 + 38.494131) / 2.0).abs() < 1e-12);
        assert_eq!(t.decode_at(0.0, 350.0), t.decode_itl[0][0]);
        assert!((t.decode_at(945_029.0, 13_585.0) - 36.168_974_58).abs() < 1e-8);
        assert!(
            m.describe().contains("h200_tp1_perf.npz"),
            "{}",
            m.describe()
        );
        assert!(format!("{m:?}").len() < 200);
    }

    #[test]
    fn npz_and_json_round_trip() {
        let tables = Profiled::load(&repo_profile()).expect("loads").tables;
        let mut npz = std::io::Cursor::new(Vec::new());
        tables.write_npz(&mut npz).expect("writes");
        let back = ProfileTables::from_bytes(npz.get_ref(), "written.npz").expect("reads");
        assert_eq!(back, tables);
        // JSON keeps the values to the last digit or so (serde_json's fast float parsing).
        let json = serde_json::to_vec(&tables).expect("json");
        let back = ProfileTables::from_bytes(&json, "x.json").expect("reads");
        let flat = |t: &ProfileTables| -> Vec<f64> {
            let mut v = [
                &t.prefill_isl,
                &t.prefill_ttft_ms,
                &t.decode_active_kv_tokens,
            ]
            .into_iter()
            .chain([&t.decode_context_length])
            .flatten()
            .copied()
            .collect::<Vec<f64>>();
            v.extend(t.decode_itl.iter().flatten());
            v
        };
        let (a, b) = (flat(&tables), flat(&back));
        assert_eq!(a.len(), b.len());
        assert!(a
            .iter()
            .zip(&b)
            .all(|(x, y)| (x - y).abs() <= 1e-12 * x.abs().max(1.0)));
        // The writer's .npy headers are aligned as NumPy requires.
        let npy = npy_bytes(&[21, 6], &[0.0; 126]);
        assert_eq!((npy.len() - 126 * 8) % 64, 0);
        assert_eq!(parse_npy(&npy).expect("parses").shape, vec![21, 6]);
    }

    /// A `.npy` file with a hand-written header (no alignment padding: readers must not care).
    fn npy_with(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = NPY_MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16 + 1).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn fortran_order_and_other_dtypes_are_read() {
        let column_major: Vec<u8> = [1.0f64, 4.0, 2.0, 5.0, 3.0, 6.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let npy = npy_with(
            "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }",
            &column_major,
        );
        let parsed = parse_npy(&npy).expect("parses");
        assert_eq!(parsed.shape, [2, 3]);
        assert_eq!(parsed.data, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let ints: Vec<u8> = [7i32, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let npy = npy_with(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
            &ints,
        );
        assert_eq!(parse_npy(&npy).expect("parses").data, [7.0, -2.0]);
        let npy = npy_with(
            "{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }",
            &[0; 8],
        );
        assert!(parse_npy(&npy).expect_err("big-endian").contains(">f8"));
    }

    fn error_of(bytes: &[u8]) -> String {
        ProfileTables::from_bytes(bytes, "bad.npz")
            .expect_err("refused")
            .to_string()
    }

    fn npz_of(tables: &ProfileTables) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        tables.write_npz(&mut out).expect("writes");
        out.into_inner()
    }

    #[test]
    fn bad_profiles_are_refused_naming_the_file_and_array() {
        let good = npz_of(&small());
        // Truncated archive.
        let msg = error_of(&good[..good.len() / 2]);
        assert!(msg.contains("bad.npz") && msg.contains("zip"), "{msg}");
        // Wrong decode shape.
        let wrong_shape = ProfileTables {
            decode_itl: vec![vec![5.0, 7.0, 1.0], vec![9.0, 15.0, 1.0]],
            ..small()
        };
        let msg = error_of(&npz_of(&wrong_shape));
        assert!(
            msg.contains("`decode_itl`") && msg.contains("(2, 2)"),
            "{msg}"
        );
        // Negative time.
        let negative = ProfileTables {
            prefill_ttft_ms: vec![20.0, -1.0, 100.0],
            ..small()
        };
        let msg = error_of(&npz_of(&negative));
        assert!(
            msg.contains("`prefill_ttft_ms`") && msg.contains("-1"),
            "{msg}"
        );
        // Axis out of order.
        let unordered = ProfileTables {
            decode_context_length: vec![300.0, 100.0],
            ..small()
        };
        let msg = error_of(&npz_of(&unordered));
        assert!(
            msg.contains("`decode_context_length`") && msg.contains("strictly increasing"),
            "{msg}"
        );
        // Length mismatch, NaN, and a one-point axis.
        let short = ProfileTables {
            prefill_ttft_ms: vec![20.0, 40.0],
            ..small()
        };
        assert!(error_of(&npz_of(&short)).contains("`prefill_ttft_ms`: has 2 values"));
        let nan = ProfileTables {
            decode_itl: vec![vec![5.0, f64::NAN], vec![9.0, 15.0]],
            ..small()
        };
        assert!(error_of(&npz_of(&nan)).contains("`decode_itl`"));
        let one = ProfileTables {
            prefill_isl: vec![100.0],
            prefill_ttft_ms: vec![20.0],
            ..small()
        };
        assert!(error_of(&npz_of(&one)).contains("at least 2 points"));
        // A truncated array inside a well-formed archive, and a missing array.
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default();
        let full = npy_bytes(&[3], &[100.0, 1100.0, 2100.0]);
        zip.start_file("prefill_isl.npy", options).expect("zip");
        zip.write_all(&full[..full.len() - 4]).expect("zip");
        let bytes = zip.finish().expect("zip").into_inner();
        let msg = error_of(&bytes);
        assert!(
            msg.contains("`prefill_isl`") && msg.contains("truncated"),
            "{msg}"
        );
        let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        zip.start_file("prefill_isl.npy", options).expect("zip");
        zip.write_all(&full).expect("zip");
        let msg = error_of(&zip.finish().expect("zip").into_inner());
        assert!(
            msg.contains("`prefill_ttft_ms`") && msg.contains("missing"),
            "{msg}"
        );
        // Neither zip nor JSON.
        let msg = error_of(b"hello");
        assert!(msg.contains("bad.npz") && msg.contains("neither"), "{msg}");
        // JSON with a bad array is checked the same way.
        let json = serde_json::to_vec(&negative).expect("json");
        assert!(error_of(&json).contains("`prefill_ttft_ms`"));
    }

    #[test]
    fn missing_file_is_an_io_error_naming_it() {
        let msg = Profiled::load(Path::new("/nonexistent/p.npz"))
            .expect_err("refused")
            .to_string();
        assert!(msg.contains("/nonexistent/p.npz"), "{msg}");
    }
}
