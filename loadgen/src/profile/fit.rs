//! From measurements to a profile: the measured points ([`Measurements`]) become Dynamo mocker's
//! tables ([`ProfileTables`]), a summary table and an SVG of both curves. Pure functions.

use serde::{Deserialize, Serialize};
use servesim::perf::ProfileTables;

use crate::report::chart;

/// One prefill grid point: TTFT of lone requests (`max_tokens` 1, no prefix hits).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillPoint {
    /// Prompt length asked for.
    pub isl: usize,
    /// Prompt tokens as the server counted them (`usage.prompt_tokens`), else `isl`.
    pub prompt_tokens: usize,
    /// Every sample's TTFT in ms, client overhead included.
    pub ttft_ms: Vec<f64>,
    /// The prefill time: median TTFT less the client overhead, or (`--prefill-from
    /// decode-gap`) the median delay the prefill added to a concurrent decode stream.
    pub prefill_ms: f64,
    /// With `--prefill-from decode-gap`: every sample's delay of the decode stream, ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decode_gap_ms: Vec<f64>,
}

/// One decode grid point: the steady inter-token gap of `batch_size` concurrent streams.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodePoint {
    /// Concurrent streams.
    pub batch_size: usize,
    /// Prompt length of each stream asked for.
    pub context_length: usize,
    /// Mean context (prompt + generated tokens) of the streams in the middle of the steady part.
    pub mean_context: f64,
    /// Sum of the streams' contexts then: the model's active KV tokens.
    pub active_kv_tokens: f64,
    /// Median inter-token gap in the steady part, ms.
    pub itl_ms: f64,
    /// Gaps the median was taken over.
    pub gaps: usize,
}

/// Everything one `loadgen profile` run measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurements {
    /// Median round trip of an empty-prompt request, ms: subtracted from every TTFT.
    pub client_overhead_ms: f64,
    /// Prefill points in grid order.
    pub prefill: Vec<PrefillPoint>,
    /// Decode points in grid order.
    pub decode: Vec<DecodePoint>,
}

/// The median of some samples (0 for none).
pub(crate) fn median(samples: &[f64]) -> f64 {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Smallest time a table may hold (validation wants positive times): a prefill faster than the
/// client overhead's noise comes out as this.
const MIN_MS: f64 = 1e-3;

/// The prefill axis and times of the measurements' prefill points: one point per distinct
/// prompt length (samples of equal lengths averaged), sorted; at least 2.
pub(crate) fn tables_prefill(m: &Measurements) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut prefill: Vec<(f64, f64)> = m
        .prefill
        .iter()
        .map(|p| (p.prompt_tokens as f64, p.prefill_ms.max(MIN_MS)))
        .collect();
    prefill.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut prefill_isl: Vec<f64> = Vec::new();
    let mut prefill_ttft_ms: Vec<f64> = Vec::new();
    let mut counts: Vec<f64> = Vec::new();
    for (x, y) in prefill {
        if prefill_isl.last() == Some(&x) {
            let i = prefill_isl.len() - 1;
            prefill_ttft_ms[i] = (prefill_ttft_ms[i] * counts[i] + y) / (counts[i] + 1.0);
            counts[i] += 1.0;
        } else {
            prefill_isl.push(x);
            prefill_ttft_ms.push(y);
            counts.push(1.0);
        }
    }
    if prefill_isl.len() < 2 {
        return Err(format!(
            "the prefill curve needs at least 2 prompt lengths, {} measured",
            prefill_isl.len()
        ));
    }
    Ok((prefill_isl, prefill_ttft_ms))
}

/// The tables the measurements describe:
/// - prefill: one point per distinct prompt length (samples of equal lengths averaged);
/// - decode: one column per context length asked for (at the mean measured context of its
///   points), one row per distinct measured active-KV-token count; a column's value at a row is
///   the linear interpolation of its own points over active KV tokens, the nearest point's value
///   outside their range (the profile README's construction).
pub(crate) fn tables(m: &Measurements) -> Result<ProfileTables, String> {
    let (prefill_isl, prefill_ttft_ms) = tables_prefill(m)?;
    let mut contexts: Vec<usize> = m.decode.iter().map(|d| d.context_length).collect();
    contexts.sort_unstable();
    contexts.dedup();
    let columns: Vec<(f64, Vec<(f64, f64)>)> = contexts
        .iter()
        .map(|&c| {
            let points: Vec<&DecodePoint> =
                m.decode.iter().filter(|d| d.context_length == c).collect();
            let y = points.iter().map(|d| d.mean_context).sum::<f64>() / points.len() as f64;
            let mut xs: Vec<(f64, f64)> = points
                .iter()
                .map(|d| (d.active_kv_tokens, d.itl_ms.max(MIN_MS)))
                .collect();
            xs.sort_by(|a, b| a.0.total_cmp(&b.0));
            (y, xs)
        })
        .collect();
    let mut rows: Vec<f64> = m
        .decode
        .iter()
        .map(|d| d.active_kv_tokens.round())
        .collect();
    rows.sort_by(f64::total_cmp);
    rows.dedup();
    let increasing = columns.windows(2).all(|w| w[0].0 < w[1].0);
    if columns.len() < 2 || rows.len() < 2 || !increasing {
        return Err(format!(
            "the decode grid needs at least 2 context lengths and 2 distinct active-KV-token \
             counts, measured {} context lengths and {} counts",
            columns.len(),
            rows.len()
        ));
    }
    let decode_itl = rows
        .iter()
        .map(|&x| columns.iter().map(|(_, pts)| along(pts, x)).collect())
        .collect();
    let tables = ProfileTables {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens: rows,
        decode_context_length: columns.iter().map(|(y, _)| *y).collect(),
        decode_itl,
    };
    tables
        .validate()
        .map_err(|(array, message)| format!("array `{array}`: {message}"))?;
    Ok(tables)
}

/// Piecewise-linear value of sorted points at `x`, clamped to the end values outside them.
fn along(points: &[(f64, f64)], x: f64) -> f64 {
    match points {
        [] => MIN_MS,
        [only] => only.1,
        _ => {
            let first = points[0];
            let last = points[points.len() - 1];
            if x <= first.0 {
                return first.1;
            }
            if x >= last.0 {
                return last.1;
            }
            let i = points.partition_point(|p| p.0 <= x).saturating_sub(1);
            let (a, b) = (points[i], points[i + 1]);
            if b.0 == a.0 {
                return a.1;
            }
            a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0)
        }
    }
}

/// The measured points and what a profile predicts at them, as a plain-text table.
pub(crate) fn summary(m: &Measurements, model: Option<&ProfileTables>) -> String {
    let mut s = format!(
        "Client overhead (empty-prompt round trip, median): {:.3} ms\n\nPrefill (TTFT at concurrency 1, max_tokens 1)\n",
        m.client_overhead_ms
    );
    s.push_str(&format!(
        "{:>10} {:>10} {:>8} {:>14} {:>12} {:>12}\n",
        "isl", "tokens", "samples", "median TTFT ms", "prefill ms", "profile ms"
    ));
    for p in &m.prefill {
        let predicted = model.map_or(String::from("-"), |t| {
            format!("{:.3}", t.prefill_at(p.prompt_tokens as f64))
        });
        s.push_str(&format!(
            "{:>10} {:>10} {:>8} {:>14.3} {:>12.3} {:>12}\n",
            p.isl,
            p.prompt_tokens,
            p.ttft_ms.len(),
            median(&p.ttft_ms),
            p.prefill_ms,
            predicted
        ));
    }
    s.push_str("\nDecode (steady inter-token gap of concurrent streams)\n");
    s.push_str(&format!(
        "{:>6} {:>10} {:>12} {:>14} {:>10} {:>6} {:>12}\n",
        "batch", "context", "mean context", "active KV", "ITL ms", "gaps", "profile ms"
    ));
    for d in &m.decode {
        let predicted = model.map_or(String::from("-"), |t| {
            format!("{:.3}", t.decode_at(d.active_kv_tokens, d.mean_context))
        });
        s.push_str(&format!(
            "{:>6} {:>10} {:>12.1} {:>14.0} {:>10.3} {:>6} {:>12}\n",
            d.batch_size,
            d.context_length,
            d.mean_context,
            d.active_kv_tokens,
            d.itl_ms,
            d.gaps,
            predicted
        ));
    }
    s
}

/// An SVG of both curves: prefill time over prompt tokens (left), decode step time over active
/// KV tokens with one line per context length (right); table points as lines, measured points
/// as dots.
pub(crate) fn svg(t: &ProfileTables, m: &Measurements) -> String {
    let colors = chart::PROFILE_COLORS;
    let prefill = chart::Panel {
        title: "prefill: TTFT over new prompt tokens",
        x_label: "prompt tokens",
        lines: vec![(
            String::new(),
            colors[0],
            t.prefill_isl
                .iter()
                .copied()
                .zip(t.prefill_ttft_ms.iter().copied())
                .collect(),
        )],
        dots: m
            .prefill
            .iter()
            .map(|p| (p.prompt_tokens as f64, p.prefill_ms))
            .collect(),
    };
    let decode = chart::Panel {
        title: "decode: ITL over active KV tokens",
        x_label: "active KV tokens",
        lines: t
            .decode_context_length
            .iter()
            .enumerate()
            .map(|(j, c)| {
                (
                    format!("context {c:.0}"),
                    colors[j % colors.len()],
                    t.decode_active_kv_tokens
                        .iter()
                        .zip(&t.decode_itl)
                        .map(|(x, row)| (*x, row[j]))
                        .collect(),
                )
            })
            .collect(),
        dots: m
            .decode
            .iter()
            .map(|d| (d.active_kv_tokens, d.itl_ms))
            .collect(),
    };
    chart::panels(&[prefill, decode])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(batch_size: usize, context_length: usize, itl_ms: f64) -> DecodePoint {
        let mean_context = context_length as f64 + 10.0;
        DecodePoint {
            batch_size,
            context_length,
            mean_context,
            active_kv_tokens: batch_size as f64 * mean_context,
            itl_ms,
            gaps: 20,
        }
    }

    fn measurements() -> Measurements {
        let prefill = |isl: usize, ms: f64| PrefillPoint {
            isl,
            prompt_tokens: isl,
            ttft_ms: vec![ms + 1.0],
            prefill_ms: ms,
            decode_gap_ms: Vec::new(),
        };
        Measurements {
            client_overhead_ms: 1.0,
            prefill: vec![prefill(1000, 30.0), prefill(100, 20.0), prefill(1000, 40.0)],
            decode: vec![
                point(1, 100, 5.0),
                point(4, 100, 9.0),
                point(1, 1000, 6.0),
                point(4, 1000, 12.0),
            ],
        }
    }

    #[test]
    fn measured_points_become_the_mocker_tables() {
        let t = tables(&measurements()).expect("valid");
        // Equal prompt lengths are averaged; the axis is sorted.
        assert_eq!(t.prefill_isl, [100.0, 1000.0]);
        assert_eq!(t.prefill_ttft_ms, [20.0, 35.0]);
        // Columns at the mean measured contexts; rows at every measured active-KV count.
        assert_eq!(t.decode_context_length, [110.0, 1010.0]);
        assert_eq!(t.decode_active_kv_tokens, [110.0, 440.0, 1010.0, 4040.0]);
        // Column 110: its own points at 110 and 440, clamped beyond. Column 1010: clamped below
        // its first point (1010), interpolated at 440 would be clamped too.
        assert_eq!(t.decode_itl[0], [5.0, 6.0]);
        assert_eq!(t.decode_itl[1], [9.0, 6.0]);
        assert_eq!(t.decode_itl[2], [9.0, 6.0]);
        assert_eq!(t.decode_itl[3], [9.0, 12.0]);
        // At every measured point the profile predicts the measurement.
        let m = measurements();
        for d in &m.decode {
            let predicted = t.decode_at(d.active_kv_tokens, d.mean_context);
            assert!((predicted - d.itl_ms).abs() < 1e-9, "{d:?}: {predicted}");
        }
    }

    #[test]
    fn too_few_points_are_refused_with_the_reason() {
        let mut m = measurements();
        m.prefill.truncate(1);
        assert!(tables(&m)
            .expect_err("one length")
            .contains("2 prompt lengths"));
        let mut m = measurements();
        m.decode.retain(|d| d.context_length == 100);
        assert!(tables(&m)
            .expect_err("one column")
            .contains("2 context lengths"));
    }

    #[test]
    fn median_summary_and_svg() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let m = measurements();
        let t = tables(&m).expect("valid");
        let text = summary(&m, Some(&t));
        assert!(
            text.contains("Prefill") && text.contains("Decode"),
            "{text}"
        );
        let svg = svg(&t, &m);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            (svg.len(), xxhash_rust::xxh3::xxh3_64(svg.as_bytes())),
            (1578, 5865883984525431562)
        );
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("<circle").count(), 7);
    }
}
