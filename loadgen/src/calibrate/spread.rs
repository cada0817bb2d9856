//! `--jitter-draws K`: the prediction's own spread. The offline replay is deterministic, but a
//! KV router's choices turn on each worker's load at a request's arrival, so moving arrivals by
//! less than a live request's path (a millisecond) can move a tail figure by several percent.
//! K more offline replays, each arrival moved later by a seeded uniform draw in `[0, J)` ms of
//! sped-up time, give the range of each statistic relative to the unmoved prediction; a
//! measured ratio inside that range is an error this prediction cannot tell from its own
//! sensitivity to arrival times.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use servesim::time::{SimDuration, SimTime};
use servesim::trace::Trace;

use super::report::{Calibration, Summary};

/// `trace` with every arrival moved later by a draw in `[0, jitter_ms)` ms (seeded): each
/// session's first arrival, and each later turn's delay after the previous answer. Sessions
/// tied at one arrival keep their trace order (a live client sends tied requests in trace
/// order), so a tied session never moves before the one before it.
pub(crate) fn jittered(trace: &Trace, jitter_ms: f64, seed: u64) -> Trace {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let draw =
        |rng: &mut ChaCha8Rng| SimDuration::from_micros_f64(rng.gen_range(0.0..jitter_ms * 1000.0));
    let mut out = trace.clone();
    // In the pacer's order (first arrival, then trace order), so tied sessions are neighbours.
    let mut order: Vec<usize> = (0..out.sessions.len()).collect();
    order.sort_by_key(|&i| (trace.sessions[i].first_arrival, i));
    let mut previous: Option<(SimTime, SimTime)> = None;
    for i in order {
        let session = &mut out.sessions[i];
        let unmoved = session.first_arrival;
        let mut moved = unmoved + draw(&mut rng);
        if let Some((before, before_moved)) = previous {
            if before == unmoved {
                moved = moved.max(before_moved);
            }
        }
        session.first_arrival = moved;
        previous = Some((unmoved, moved));
        for turn in session.turns.iter_mut().skip(1) {
            turn.delay = SimDuration::from_nanos(turn.delay.as_nanos() + draw(&mut rng).as_nanos());
        }
    }
    out
}

/// Ratio of `x` to `base`, or None when the base is 0.
fn ratio(x: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| x / base)
}

/// The `offline_spread` section: per metric, the range of the draws' predicted mean and p90
/// relative to the unmoved prediction (1 included), the measured ratios (TOST's), and whether
/// both lie inside their ranges.
pub(crate) fn section(
    first: &Calibration,
    draws: &[BTreeMap<&'static str, Summary>],
    jitter_ms: f64,
    seed: u64,
) -> Value {
    let mut metrics = BTreeMap::new();
    for (key, figures) in &first.metrics {
        let base = figures.predicted;
        let range = |stat: fn(&Summary) -> f64| {
            let ratios = draws
                .iter()
                .filter_map(|d| d.get(key))
                .filter_map(|s| ratio(stat(s), stat(&base)));
            ratios.fold((1.0f64, 1.0f64), |(lo, hi), r| (lo.min(r), hi.max(r)))
        };
        let mean = range(|s| s.mean);
        let p90 = range(|s| s.p90);
        let measured_mean = figures.tost_mean.map(|t| t.ratio);
        let measured_p90 = figures.tost_p90.map(|t| t.ratio);
        let inside = |r: Option<f64>, (lo, hi): (f64, f64)| r.is_some_and(|r| lo <= r && r <= hi);
        metrics.insert(
            *key,
            json!({
                "mean": [mean.0, mean.1],
                "p90": [p90.0, p90.1],
                "measured": {"mean": measured_mean, "p90": measured_p90},
                "within": {"mean": inside(measured_mean, mean), "p90": inside(measured_p90, p90)},
            }),
        );
    }
    json!({
        "draws": draws.len(),
        "jitter_ms": jitter_ms,
        "seed": seed,
        "definition": "stat(offline replay with each arrival moved later by U[0, jitter_ms)) / \
                       stat(unmoved offline replay), over the same compared requests; the range \
                       includes 1 (the unmoved prediction)",
        "metrics": metrics,
    })
}

/// The section on the console: a line per metric.
pub(crate) fn lines(spread: &Value, names: &[(&str, &str, &str)]) -> String {
    let mut out = format!(
        "Prediction's own spread: {} offline replays with each arrival moved later by up to {} \
         ms (statistic / unmoved prediction)\n",
        spread["draws"], spread["jitter_ms"]
    );
    for (key, name, _) in names {
        let m = &spread["metrics"][key];
        if m.is_null() {
            continue;
        }
        let range = |k: &str| {
            format!(
                "{:.3}-{:.3}",
                m[k][0].as_f64().unwrap_or(1.0),
                m[k][1].as_f64().unwrap_or(1.0)
            )
        };
        let measured = |k: &str| {
            m["measured"][k]
                .as_f64()
                .map_or("-".into(), |r| format!("{r:.3}"))
        };
        let verdict = |k: &str| {
            if m["within"][k] == true {
                "within"
            } else {
                "outside"
            }
        };
        out.push_str(&format!(
            "  {name:<15} mean {} (measured {}: {})  p90 {} (measured {}: {})\n",
            range("mean"),
            measured("mean"),
            verdict("mean"),
            range("p90"),
            measured("p90"),
            verdict("p90"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::trace::{Session, TraceRequest};

    fn turn(delay_ms: u64) -> TraceRequest {
        TraceRequest {
            line: 1,
            request_id: None,
            input_length: 16,
            requested_input_length: None,
            output_length: 2,
            hash_ids: vec![1],
            delay: SimDuration::from_micros(delay_ms * 1000),
        }
    }

    fn session(id: &str, at_ms: u64, turns: usize) -> Session {
        Session {
            id: id.into(),
            first_arrival: SimTime::from_micros(at_ms * 1000),
            turns: (0..turns)
                .map(|t| turn(if t == 0 { 0 } else { 100 }))
                .collect(),
        }
    }

    #[test]
    fn arrivals_move_later_within_the_bound_and_ties_keep_their_order() {
        let trace = Trace {
            sessions: vec![
                session("a", 0, 1),
                session("b", 0, 1),
                session("d", 5, 3),
                session("c", 0, 1),
            ],
        };
        for seed in 0..50 {
            let moved = jittered(&trace, 1.0, seed);
            for (m, u) in moved.sessions.iter().zip(&trace.sessions) {
                let d = m.first_arrival.as_nanos() - u.first_arrival.as_nanos();
                assert!(d < 1_000_000, "moved {d} ns");
                for (mt, ut) in m.turns.iter().zip(&u.turns).skip(1) {
                    let d = mt.delay.as_nanos() - ut.delay.as_nanos();
                    assert!(d < 1_000_000, "delay moved {d} ns");
                }
                assert_eq!(m.turns[0].delay, u.turns[0].delay, "turn 0 has no delay");
            }
            // a, b and c (listed after d) are tied: moved, they keep their trace order.
            let tied: Vec<u64> = [0, 1, 3]
                .iter()
                .map(|&i| moved.sessions[i].first_arrival.as_nanos())
                .collect();
            assert!(tied.windows(2).all(|w| w[0] <= w[1]), "{tied:?}");
            // Same seed, same draws.
            assert_eq!(jittered(&trace, 1.0, seed), moved);
        }
        assert_ne!(jittered(&trace, 1.0, 0), jittered(&trace, 1.0, 1));
    }
}
