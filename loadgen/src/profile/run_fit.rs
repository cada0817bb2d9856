//! A latency profile fitted from the per-request records of a trace run (`loadgen calibrate
//! --fit`), instead of `loadgen profile`'s own probe workload. Pure functions.
//!
//! Each request's life on its worker (the worker the server names, else one for all) is its
//! send `S`, first token `F` and last token `L`. `F` and `L` are the server's own times when
//! it sends them (`nvext.timing`'s `ttft_ms` and `total_time_ms` from the engine's submission,
//! `engine_ttft_ms` and `engine_e2e_ms` in the records), else the client's first and last
//! token chunks. A loaded client or host delays and bunches the chunks it sees; the server's
//! times are the engine's.
//!
//! The model: a decode step takes `a + b * running + c * active KV tokens` ms; a pass that
//! finishes prompts adds `p0 + p1 * T + p2 * T^2` ms, `T` their uncached prompt tokens. Two
//! kinds of equation, solved together by least squares:
//! - **decode phase**: `L - F` of a request with `n` tokens is `n - 1` steps plus the prefills
//!   of the passes in which another request of its worker got its first token (requests whose
//!   first tokens coincide, within 0.5 ms, share one prefill of their summed tokens). The
//!   running count and active KV tokens (prompt plus tokens so far, tokens spread evenly over
//!   each request's life) are averaged over 16 points of the phase;
//! - **idle prefill**: the TTFT of a request that met an idle worker (nobody else in flight
//!   from its send to its first token) is one prefill of its uncached prompt.
//!
//! A phase or TTFT during which a prompt longer than one pass (`max_prefill_tokens`, the
//! offline engine's per-pass token budget) was prefilled is left out. A second fit drops the
//! equations more than three robust deviations off; a slope that comes out negative is dropped
//! and the rest refitted. The profile holds the fitted model on grids: prefill from 1 token to
//! the per-pass budget (or the largest prefill seen), decode over the active KV tokens and
//! mean contexts seen.

use serde::Serialize;
use serde_json::Value;
use servesim::perf::ProfileTables;

use super::fit::{median, DecodePoint, Measurements, PrefillPoint};

/// One request of the run, on the run's time line (µs).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Timeline {
    /// When it was sent.
    pub sent_us: u64,
    /// When each token chunk arrived, increasing.
    pub tokens_us: Vec<u64>,
    /// Output tokens (the server's count, else the chunks).
    pub output_tokens: u64,
    /// Prompt tokens (the server's count, else the intended length).
    pub prompt_tokens: u64,
    /// Prompt tokens the server found cached.
    pub cached_tokens: u64,
    /// The server's own TTFT from its engine's submission, when it said.
    pub engine_ttft_ms: Option<f64>,
    /// The server's own submission-to-last-token time, when it said.
    pub engine_e2e_ms: Option<f64>,
    /// The worker that served it, when the server said: each worker's passes are its own.
    pub worker: Option<u64>,
}

/// What the records of a run hold: the completed requests' timelines and the failures.
#[derive(Debug, Default)]
pub(crate) struct RunRecords {
    /// Completed requests with at least one token.
    pub timelines: Vec<Timeline>,
    /// Records that failed (an error, or not completed).
    pub failed: usize,
    /// Records in all.
    pub total: usize,
}

/// The timelines of per-request records, each with its origin for errors: a live run's
/// (`loadgen replay --per-request-jsonl` lines, or a run's records serialized the same way:
/// the `raw` times), or an offline run's (`mockserve replay --per-request-jsonl`: the engine's
/// own `arrival_ms`, `first_token_ms` and `last_token_ms`).
pub(crate) fn timelines<'a>(
    records: impl IntoIterator<Item = (&'a Value, String)>,
) -> Result<RunRecords, String> {
    let mut out = RunRecords::default();
    let mut rows: Vec<(u64, u64, Timeline)> = Vec::new();
    for (v, origin) in records {
        out.total += 1;
        let failed = v.get("error").is_some_and(|e| !e.is_null())
            || v.get("status").and_then(Value::as_str) != Some("completed");
        if failed {
            out.failed += 1;
            continue;
        }
        let Some(raw) = v.get("raw").filter(|r| r.is_object()) else {
            let (sent, timeline) = offline(v, &origin)?;
            rows.push((0, sent, timeline));
            continue;
        };
        let int = |k: &str| raw.get(k).and_then(Value::as_u64);
        let sent = int("sent_us").ok_or_else(|| format!("{origin}: raw.sent_us missing"))?;
        let start = int("run_start_unix_us").unwrap_or(0);
        let chunks: Vec<u64> = raw
            .get("token_chunks_us")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{origin}: raw.token_chunks_us missing"))?
            .iter()
            .map(|t| {
                t.as_u64()
                    .ok_or_else(|| format!("{origin}: raw.token_chunks_us: {t}"))
            })
            .collect::<Result<_, _>>()?;
        if chunks.is_empty() {
            continue;
        }
        let chunks_len = chunks.len() as u64;
        let positive = |k: &str| {
            v.get(k)
                .and_then(Value::as_f64)
                .filter(|x| x.is_finite() && *x > 0.0)
        };
        if chunks.windows(2).any(|w| w[1] < w[0]) {
            return Err(format!("{origin}: raw.token_chunks_us is not increasing"));
        }
        let prompt = int("prompt_tokens")
            .or_else(|| int("input_length"))
            .ok_or_else(|| format!("{origin}: raw.prompt_tokens and raw.input_length missing"))?;
        let timeline = Timeline {
            sent_us: 0,
            tokens_us: chunks,
            prompt_tokens: prompt,
            cached_tokens: int("cached_tokens").unwrap_or(0).min(prompt),
            output_tokens: int("output_tokens").unwrap_or(chunks_len),
            engine_ttft_ms: positive("engine_ttft_ms"),
            engine_e2e_ms: positive("engine_e2e_ms"),
            worker: int("worker"),
        };
        rows.push((start, sent, timeline));
    }
    // Several processes' records (shards) share one clock: their run starts align them.
    let origin = rows.iter().map(|r| r.0).min().unwrap_or(0);
    out.timelines = rows
        .into_iter()
        .map(|(start, sent, mut t)| {
            let base = start - origin + sent;
            t.sent_us = base;
            for x in &mut t.tokens_us {
                *x += base;
            }
            t
        })
        .collect();
    Ok(out)
}

/// A record of an offline replay: its arrival (µs) and its timeline (times from the arrival),
/// the engine's own.
fn offline(v: &Value, origin: &str) -> Result<(u64, Timeline), String> {
    let num = |k: &str| v.get(k).and_then(Value::as_f64).filter(|x| x.is_finite());
    let int = |k: &str| v.get(k).and_then(Value::as_u64);
    let need = |k: &str| {
        num(k).ok_or_else(|| {
            format!(
                "{origin}: {k} missing: not a per-request record of a replay (loadgen replay or \
                 mockserve replay --per-request-jsonl)"
            )
        })
    };
    let arrival = need("arrival_ms")?;
    let first = need("first_token_ms")?;
    let last = need("last_token_ms")?;
    let us = |ms: f64| (ms.max(0.0) * 1000.0).round() as u64;
    let prompt = int("input_length").ok_or_else(|| format!("{origin}: input_length missing"))?;
    Ok((
        us(arrival),
        Timeline {
            sent_us: 0,
            tokens_us: vec![us(first - arrival), us(last.max(first) - arrival)],
            output_tokens: int("output_length").unwrap_or(1),
            prompt_tokens: prompt,
            cached_tokens: int("reused_input_tokens").unwrap_or(0).min(prompt),
            engine_ttft_ms: Some(first - arrival),
            engine_e2e_ms: Some(last.max(first) - arrival),
            worker: int("worker"),
        },
    ))
}

/// One request's life as the fit reads it (ms on the run's time line).
#[derive(Clone, Copy, Debug)]
struct Life {
    sent: f64,
    first: f64,
    last: f64,
    tokens: f64,
    prompt: f64,
    new_tokens: f64,
    engine_timed: bool,
}

impl Life {
    fn of(t: &Timeline) -> Life {
        let ms = |us: u64| us as f64 / 1000.0;
        let sent = ms(t.sent_us);
        let client_first = ms(t.tokens_us[0]);
        let client_last = ms(*t.tokens_us.last().unwrap_or(&t.tokens_us[0]));
        let (first, last, engine_timed) = match (t.engine_ttft_ms, t.engine_e2e_ms) {
            (Some(f), Some(l)) if l >= f => (sent + f, sent + l, true),
            _ => (client_first, client_last, false),
        };
        Life {
            sent,
            first,
            last,
            tokens: t.output_tokens.max(1) as f64,
            prompt: t.prompt_tokens as f64,
            new_tokens: t.prompt_tokens.saturating_sub(t.cached_tokens) as f64,
            engine_timed,
        }
    }

    /// Its context at `t` while it decodes: the prompt plus the tokens so far (spread evenly
    /// over its decode phase).
    fn context_at(&self, t: f64) -> f64 {
        let span = (self.last - self.first).max(1e-9);
        let done = 1.0 + (self.tokens - 1.0) * ((t - self.first) / span).clamp(0.0, 1.0);
        self.prompt + done
    }
}

/// The unknowns, in column order: decode `a, b, c`, prefill `p0, p1, p2`.
const COLUMNS: usize = 6;

/// One equation: `x . beta = y`, with what it came from.
#[derive(Clone, Copy, Debug)]
struct Row {
    x: [f64; COLUMNS],
    y: f64,
    /// A decode phase (else an idle TTFT).
    decode: bool,
    engine_timed: bool,
    /// For the decode points shown: mean running, mean active KV tokens, mean step.
    shown: (f64, f64, f64),
}

/// The equations of one worker's requests (see the module doc).
fn equations(lives: &[Life], max_prefill_tokens: f64) -> Vec<Row> {
    // Prefills: first tokens within 0.5 ms of each other are one pass.
    let mut firsts: Vec<(f64, f64)> = lives.iter().map(|l| (l.first, l.new_tokens)).collect();
    firsts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut prefills: Vec<(f64, f64)> = Vec::new();
    for (t, tokens) in firsts {
        match prefills.last_mut() {
            Some(p) if t - p.0 <= 0.5 => p.1 += tokens,
            _ => prefills.push((t, tokens)),
        }
    }
    let long = |from: f64, to: f64| {
        lives
            .iter()
            .any(|o| o.new_tokens > max_prefill_tokens && o.sent < to && o.first > from)
    };
    let mut rows = Vec::new();
    for (i, l) in lives.iter().enumerate() {
        if l.tokens >= 2.0 && l.last > l.first && !long(l.first, l.last) {
            let steps = l.tokens - 1.0;
            let (mut running, mut kv) = (0.0, 0.0);
            const POINTS: usize = 16;
            for k in 0..POINTS {
                let t = l.first + (l.last - l.first) * (k as f64 + 0.5) / POINTS as f64;
                for o in lives.iter().filter(|o| o.first <= t && t < o.last) {
                    running += 1.0;
                    kv += o.context_at(t);
                }
            }
            running /= POINTS as f64;
            kv /= POINTS as f64;
            let inside = prefills
                .iter()
                .filter(|p| p.0 > l.first + 0.5 && p.0 <= l.last + 0.5);
            let (mut count, mut sum, mut squares) = (0.0, 0.0, 0.0);
            for p in inside {
                count += 1.0;
                sum += p.1;
                squares += p.1 * p.1;
            }
            rows.push(Row {
                x: [steps, steps * running, steps * kv, count, sum, squares],
                y: l.last - l.first,
                decode: true,
                engine_timed: l.engine_timed,
                shown: (running, kv, (l.last - l.first) / steps),
            });
        }
        let alone = lives
            .iter()
            .enumerate()
            .all(|(j, o)| j == i || o.sent > l.first || o.last < l.sent);
        if alone && l.new_tokens > 0.0 && l.new_tokens <= max_prefill_tokens {
            let t = l.new_tokens;
            rows.push(Row {
                x: [0.0, 0.0, 0.0, 1.0, t, t * t],
                y: l.first - l.sent,
                decode: false,
                engine_timed: l.engine_timed,
                shown: (0.0, 0.0, 0.0),
            });
        }
    }
    rows
}

/// Least squares over the columns in `use_column`; the coefficients (0 for a column left
/// out), or None when the columns do not determine them.
fn least_squares(rows: &[Row], use_column: [bool; COLUMNS]) -> Option<[f64; COLUMNS]> {
    let cols: Vec<usize> = (0..COLUMNS).filter(|&j| use_column[j]).collect();
    let p = cols.len();
    // Columns scaled to their largest magnitude keep the normal equations well conditioned.
    let scale: Vec<f64> = cols
        .iter()
        .map(|&j| rows.iter().fold(0.0f64, |m, r| m.max(r.x[j].abs())))
        .collect();
    if scale.contains(&0.0) {
        return None;
    }
    // Relative errors: each equation weighs by 1 / y (a long decode phase does not outweigh
    // a short prefill).
    let mut a = vec![vec![0.0f64; p + 1]; p];
    for r in rows {
        let w = 1.0 / r.y.max(1e-3);
        let x: Vec<f64> = cols
            .iter()
            .zip(&scale)
            .map(|(&j, s)| r.x[j] / s * w)
            .collect();
        for (i, row) in a.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().take(p).enumerate() {
                *cell += x[i] * x[j];
            }
            row[p] += x[i] * r.y * w;
        }
    }
    // Gauss-Jordan with partial pivoting.
    for col in 0..p {
        let pivot = (col..p).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-9 * rows.len() as f64 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (i, row) in a.iter_mut().enumerate() {
            if i != col {
                let f = row[col] / pivot_row[col];
                for (cell, &v) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *cell -= f * v;
                }
            }
        }
    }
    let mut beta = [0.0; COLUMNS];
    for (k, &j) in cols.iter().enumerate() {
        beta[j] = a[k][p] / a[k][k] / scale[k];
    }
    Some(beta)
}

/// The column sets tried, most complete first: decode `a` and prefill `p0, p1` always.
const CHOICES: [[bool; COLUMNS]; 8] = [
    [true, true, true, true, true, true],
    [true, false, true, true, true, true],
    [true, true, false, true, true, true],
    [true, false, false, true, true, true],
    [true, true, true, true, true, false],
    [true, false, true, true, true, false],
    [true, true, false, true, true, false],
    [true, false, false, true, true, false],
];

/// The first column set whose fit has a positive step and no negative slope.
fn solve(rows: &[Row]) -> Option<[f64; COLUMNS]> {
    CHOICES.iter().find_map(|&c| {
        least_squares(rows, c)
            .filter(|b| b[0] > 0.0 && [b[1], b[2], b[4], b[5]].iter().all(|&s| s >= 0.0))
    })
}

/// Fitted, trimmed of the equations more than three robust deviations off, fitted again.
fn solve_robust(rows: &[Row]) -> Option<[f64; COLUMNS]> {
    let first = solve(rows)?;
    let residuals: Vec<f64> = rows
        .iter()
        .map(|r| (r.y - dot(&r.x, &first)) / r.y.max(1e-3))
        .collect();
    let mid = median(&residuals);
    let deviations: Vec<f64> = residuals.iter().map(|r| (r - mid).abs()).collect();
    let limit = (3.0 * 1.4826 * median(&deviations)).max(1e-6);
    let kept: Vec<Row> = rows
        .iter()
        .zip(&residuals)
        .filter(|(_, r)| (**r - mid).abs() <= limit)
        .map(|(r, _)| *r)
        .collect();
    if kept.len() * 2 < rows.len() {
        return Some(first);
    }
    solve(&kept).or(Some(first))
}

fn dot(x: &[f64; COLUMNS], b: &[f64; COLUMNS]) -> f64 {
    x.iter().zip(b).map(|(x, b)| x * b).sum()
}

/// The fitted model, ms.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct RunModel {
    /// Decode step: constant part.
    pub decode_base_ms: f64,
    /// Decode step: per running request.
    pub decode_per_request_ms: f64,
    /// Decode step: per active KV token.
    pub decode_per_kv_token_ms: f64,
    /// Prefill: constant part.
    pub prefill_base_ms: f64,
    /// Prefill: per uncached prompt token.
    pub prefill_per_token_ms: f64,
    /// Prefill: per uncached prompt token squared.
    pub prefill_per_token_squared_ms: f64,
}

impl RunModel {
    fn of(b: [f64; COLUMNS]) -> RunModel {
        RunModel {
            decode_base_ms: b[0],
            decode_per_request_ms: b[1],
            decode_per_kv_token_ms: b[2],
            prefill_base_ms: b[3],
            prefill_per_token_ms: b[4],
            prefill_per_token_squared_ms: b[5],
        }
    }

    /// A decode step of `running` requests holding `active_kv_tokens`.
    pub(crate) fn decode_ms(&self, running: f64, active_kv_tokens: f64) -> f64 {
        self.decode_base_ms
            + self.decode_per_request_ms * running
            + self.decode_per_kv_token_ms * active_kv_tokens
    }

    /// A prefill of `tokens` uncached prompt tokens.
    pub(crate) fn prefill_ms(&self, tokens: f64) -> f64 {
        self.prefill_base_ms
            + self.prefill_per_token_ms * tokens
            + self.prefill_per_token_squared_ms * tokens * tokens
    }
}

/// Fewest decode phases a fit takes.
pub(crate) const MIN_DECODE_PHASES: usize = 8;
/// Fewest distinct prefill sizes (in decode phases or idle TTFTs) a fit takes.
pub(crate) const MIN_PREFILL_SIZES: usize = 3;

/// A profile fitted from a run, and what it was fitted from.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RunFit {
    /// The fitted model.
    pub model: RunModel,
    /// Decode phases (requests' first to last token) among the equations.
    pub decode_phases: usize,
    /// TTFTs of requests that met an idle worker among the equations.
    pub idle_prefills: usize,
    /// Equations timed by the server's own times (`nvext.timing`), of all.
    pub engine_timed: usize,
    /// Equations in all (before the trimmed refit).
    pub equations: usize,
    /// The points shown in the profile's JSON twin and SVG.
    pub measurements: Measurements,
    /// The profile.
    #[serde(skip)]
    pub tables: ProfileTables,
}

/// Fits a profile from a run's timelines; the error says what was too few.
pub(crate) fn fit_run(reqs: &[Timeline], max_prefill_tokens: usize) -> Result<RunFit, String> {
    let mut workers: Vec<Option<u64>> = reqs.iter().map(|r| r.worker).collect();
    workers.sort_unstable();
    workers.dedup();
    let mut rows: Vec<Row> = Vec::new();
    for w in workers {
        let lives: Vec<Life> = reqs
            .iter()
            .filter(|r| r.worker == w && !r.tokens_us.is_empty())
            .map(Life::of)
            .collect();
        rows.extend(equations(&lives, max_prefill_tokens as f64));
    }
    let decode_phases = rows.iter().filter(|r| r.decode).count();
    let idle_prefills = rows.len() - decode_phases;
    let mut sizes: Vec<u64> = rows
        .iter()
        .filter(|r| r.x[3] > 0.0)
        .map(|r| (r.x[4] / r.x[3]).round() as u64)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let too_few = |what: String| {
        format!(
            "{what} ({} requests): fit on a longer trace, or one whose requests overlap less",
            reqs.len()
        )
    };
    if decode_phases < MIN_DECODE_PHASES {
        return Err(too_few(format!(
            "{decode_phases} decode phases, at least {MIN_DECODE_PHASES} needed"
        )));
    }
    if sizes.len() < MIN_PREFILL_SIZES {
        return Err(too_few(format!(
            "prefills of {} distinct sizes seen, at least {MIN_PREFILL_SIZES} needed",
            sizes.len()
        )));
    }
    let beta = solve_robust(&rows)
        .ok_or_else(|| too_few("the observations do not determine the model".into()))?;
    let model = RunModel::of(beta);
    let decode_rows: Vec<&Row> = rows.iter().filter(|r| r.decode).collect();
    let prefill_seen: Vec<f64> = rows
        .iter()
        .filter(|r| r.x[3] > 0.0)
        .flat_map(|r| [r.x[4] / r.x[3]])
        .collect();
    // Up to the per-pass budget: the offline engine prefills chunks that large even when the
    // fit run's prompts were shorter (the table would otherwise extend its last segment).
    let (_, t_hi) = span(&prefill_seen);
    let prefill_isl = grid(1.0, t_hi.max(max_prefill_tokens as f64).max(2.0), 12);
    let prefill_ttft_ms: Vec<f64> = prefill_isl
        .iter()
        .map(|&t| model.prefill_ms(t).max(1e-3))
        .collect();
    let kv: Vec<f64> = decode_rows.iter().map(|r| r.shown.1).collect();
    let ctx: Vec<f64> = decode_rows
        .iter()
        .map(|r| r.shown.1 / r.shown.0.max(1.0))
        .collect();
    let (kv_lo, kv_hi) = span(&kv);
    let (ctx_lo, ctx_hi) = span(&ctx);
    // Grids over what was observed; the profile's interpolation extends them linearly.
    let rows_axis = grid(kv_lo.max(1.0), kv_hi.max(kv_lo.max(1.0) + 1.0), 8);
    let columns = grid(ctx_lo.max(1.0), ctx_hi.max(ctx_lo.max(1.0) + 1.0), 6);
    let decode_itl = rows_axis
        .iter()
        .map(|&k| {
            columns
                .iter()
                .map(|&c| model.decode_ms(k / c, k).max(1e-3))
                .collect()
        })
        .collect();
    let tables = ProfileTables {
        prefill_isl,
        prefill_ttft_ms,
        decode_active_kv_tokens: rows_axis,
        decode_context_length: columns,
        decode_itl,
    };
    tables
        .validate()
        .map_err(|(array, message)| format!("array `{array}`: {message}"))?;
    let measurements = Measurements {
        client_overhead_ms: 0.0,
        prefill: rows
            .iter()
            .filter(|r| !r.decode)
            .map(|r| PrefillPoint {
                isl: r.x[4] as usize,
                prompt_tokens: r.x[4] as usize,
                ttft_ms: vec![r.y],
                prefill_ms: r.y,
                decode_gap_ms: Vec::new(),
            })
            .collect(),
        decode: decode_rows
            .iter()
            .map(|r| DecodePoint {
                batch_size: r.shown.0.round() as usize,
                context_length: (r.shown.1 / r.shown.0.max(1.0)).round() as usize,
                mean_context: r.shown.1 / r.shown.0.max(1.0),
                active_kv_tokens: r.shown.1,
                itl_ms: r.shown.2,
                gaps: r.x[0] as usize,
            })
            .collect(),
    };
    Ok(RunFit {
        model,
        decode_phases,
        idle_prefills,
        engine_timed: rows.iter().filter(|r| r.engine_timed).count(),
        equations: rows.len(),
        measurements,
        tables,
    })
}

fn span(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        })
}

/// `n` points from `lo` to `hi` (geometric: the axes span orders of magnitude), rounded and
/// strictly increasing.
fn grid(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let mut out: Vec<f64> = (0..n)
        .map(|i| (lo * (hi / lo).powf(i as f64 / (n - 1) as f64)).round())
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small continuous-batching engine: every pass admits whoever has arrived, prefills
    /// their prompts and steps the running ones; a pass takes `prefill(new tokens) +
    /// decode(running, active KV)`. Returns the requests' timelines (sent = arrival).
    fn engine(
        arrivals: &[(u64, u64, usize)],
        prefill_ms: impl Fn(f64) -> f64,
        decode_ms: impl Fn(f64, f64) -> f64,
    ) -> Vec<Timeline> {
        let mut out: Vec<Timeline> = arrivals
            .iter()
            .map(|&(at, prompt, out)| Timeline {
                sent_us: at,
                tokens_us: Vec::new(),
                output_tokens: out as u64,
                prompt_tokens: prompt,
                cached_tokens: 0,
                engine_ttft_ms: None,
                engine_e2e_ms: None,
                worker: None,
            })
            .collect();
        let mut now = 0u64;
        let mut next = 0usize;
        let mut running: Vec<usize> = Vec::new();
        loop {
            if running.is_empty() {
                match arrivals.get(next) {
                    Some(&(at, _, _)) => now = now.max(at),
                    None => break,
                }
            }
            let mut admitted = Vec::new();
            while next < arrivals.len() && arrivals[next].0 <= now {
                admitted.push(next);
                next += 1;
            }
            let new: f64 = admitted.iter().map(|&i| arrivals[i].1 as f64).sum();
            let kv: f64 = running
                .iter()
                .map(|&i| (arrivals[i].1 as usize + out[i].tokens_us.len()) as f64)
                .sum();
            let mut ms = if new > 0.0 { prefill_ms(new) } else { 0.0 };
            if !running.is_empty() {
                ms += decode_ms(running.len() as f64, kv);
            }
            now += (ms * 1000.0).round() as u64;
            for &i in running.iter().chain(&admitted) {
                // The client sees each stream's chunk a few µs apart.
                out[i].tokens_us.push(now + (i as u64 % 5) * 7);
            }
            running.extend(admitted);
            running.retain(|&i| out[i].tokens_us.len() < arrivals[i].2);
        }
        out
    }

    fn workload() -> Vec<(u64, u64, usize)> {
        // Arrivals 0.7 s apart on average, with bursts: idle prefills, busy ones, and
        // batches of one to six.
        (0..60u64)
            .map(|i| {
                let at = i * 700_000 / 3 + (i % 4) * 90_000;
                let prompt = 200 + (i * 733) % 3000;
                let out = 20 + (i * 37 % 90) as usize;
                (at, prompt, out)
            })
            .collect()
    }

    #[test]
    fn a_known_engine_is_recovered_from_its_token_times() {
        let prefill = |t: f64| 12.0 + 0.02 * t;
        let decode = |n: f64, kv: f64| 6.0 + 0.5 * n + 0.0004 * kv;
        let reqs = engine(&workload(), prefill, decode);
        let fit = fit_run(&reqs, 8192).expect("fits");
        let m = fit.model;
        assert!((m.decode_base_ms - 6.0).abs() < 0.1, "{m:?}");
        assert!((m.decode_per_request_ms - 0.5).abs() < 0.02, "{m:?}");
        assert!((m.decode_per_kv_token_ms - 0.0004).abs() < 0.00002, "{m:?}");
        assert!((m.prefill_base_ms - 12.0).abs() < 0.5, "{m:?}");
        assert!((m.prefill_per_token_ms - 0.02).abs() < 0.001, "{m:?}");
        assert_eq!(fit.decode_phases, 60);
        assert_eq!(fit.idle_prefills, 2);
        for tokens in [500.0, 1500.0, 2500.0] {
            let got = fit.tables.prefill_at(tokens);
            let want = prefill(tokens);
            assert!(
                (got - want).abs() / want < 0.03,
                "{tokens}: {got} vs {want}"
            );
        }
        for (n, ctx) in [(2.0, 800.0), (5.0, 2000.0)] {
            let got = fit.tables.decode_at(n * ctx, ctx);
            let want = decode(n, n * ctx);
            assert!(
                (got - want).abs() / want < 0.03,
                "{n} x {ctx}: {got} vs {want}"
            );
        }
        // The same timelines, the same profile.
        let again = fit_run(&reqs, 8192).expect("fits");
        assert_eq!(again.tables, fit.tables);
    }

    #[test]
    fn too_few_observations_say_what_is_missing() {
        let reqs = engine(&workload()[..2], |t| 10.0 + 0.01 * t, |_, _| 5.0);
        let e = fit_run(&reqs, 8192).expect_err("two requests");
        assert!(
            e.starts_with("2 decode phases, at least 8 needed (2 requests)"),
            "{e}"
        );
        let e = fit_run(&[], 8192).expect_err("nothing");
        assert!(e.starts_with("0 decode phases, at least 8 needed"), "{e}");
    }

    #[test]
    fn records_become_timelines_and_failures_are_counted() {
        let ok = json!({"status": "completed", "engine_ttft_ms": 12.5,
            "raw": {"run_start_unix_us": 1_000, "sent_us": 500, "token_chunks_us": [100, 300],
                    "prompt_tokens": 64, "cached_tokens": 16, "input_length": 60}});
        let shard = json!({"status": "completed",
            "raw": {"run_start_unix_us": 1_200, "sent_us": 0, "token_chunks_us": [50],
                    "input_length": 10}});
        let failed = json!({"status": "completed", "error": "HTTP 500: boom", "raw": {}});
        let run = timelines([
            (&ok, "a:1".to_string()),
            (&shard, "a:2".to_string()),
            (&failed, "a:3".to_string()),
        ])
        .expect("parses");
        assert_eq!((run.total, run.failed), (3, 1));
        assert_eq!(run.timelines[0].sent_us, 500);
        assert_eq!(run.timelines[0].tokens_us, [600, 800]);
        assert_eq!(run.timelines[0].engine_ttft_ms, Some(12.5));
        assert_eq!(
            (
                run.timelines[0].prompt_tokens,
                run.timelines[0].cached_tokens
            ),
            (64, 16)
        );
        assert_eq!(
            (run.timelines[1].sent_us, run.timelines[1].tokens_us[0]),
            (200, 250)
        );
        let offline = json!({"status": "completed", "arrival_ms": 1.5, "first_token_ms": 3.0,
            "last_token_ms": 9.0, "input_length": 100, "reused_input_tokens": 32,
            "output_length": 4, "worker": 2});
        let run = timelines([(&offline, "o.jsonl:3".to_string())]).expect("offline record");
        let t = &run.timelines[0];
        assert_eq!(
            (t.sent_us, t.tokens_us.as_slice()),
            (1500, &[3000, 9000][..])
        );
        assert_eq!((t.engine_ttft_ms, t.engine_e2e_ms), (Some(1.5), Some(7.5)));
        assert_eq!(
            (t.cached_tokens, t.output_tokens, t.worker),
            (32, 4, Some(2))
        );
        let other = json!({"status": "completed", "session_id": "s", "turn_index": 0});
        let e = timelines([(&other, "o.jsonl:4".to_string())]).expect_err("no times");
        assert!(
            e.starts_with("o.jsonl:4: arrival_ms missing: not a per-request record"),
            "{e}"
        );
    }
}
