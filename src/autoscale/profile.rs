//! Rate profiles: a multiplier on a trace's arrival rate over (replayed) time, open loop.
//!
//! A profile is a function `m(t) > 0` of the replayed clock. An arrival recorded at trace time
//! `a` is moved to the time `t` where `M(t) = ∫₀ᵗ m(s) ds = a`: where `m` is 2 the trace is
//! consumed twice as fast (twice the rate), where it is 0.5 half as fast. `M` is strictly
//! increasing, so arrivals keep their order; the mapping is a pure function of the spec
//! (closed-form `M`, inverted by bisection in `f64`, rounded to the microsecond), so the same
//! spec and trace give the same times everywhere.
//!
//! Grammar (`--rate-profile SPEC`):
//! - `diurnal:period=600s,min=0.2`: `m(t) = min + (1 − min)·(1 − cos(2πt/period))/2`, from the
//!   trough `min` at 0 to the peak 1 at `period/2` and back;
//! - `ramp:from=0.2,to=1,over=300s`: linear from `from` to `to` over `over`, then `to`;
//! - `steps:0s=1,120s=3,240s=0.5`: piecewise constant from each time on (the first at `0s`,
//!   times strictly increasing).
//!
//! Durations take `us`, `ms`, `s`, `m` or `h`; every multiplier must be finite and above 0.

use std::fmt;
use std::str::FromStr;

use crate::time::{SimDuration, SimTime};

/// Why a `--rate-profile` spec was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RateProfileError {
    /// No `KIND:` prefix, or an unknown kind.
    #[error("rate profile {spec:?}: expected diurnal:..., ramp:... or steps:...")]
    Kind {
        /// The spec as given.
        spec: String,
    },
    /// A `key=value` part is malformed, unknown, repeated or missing.
    #[error("rate profile {kind}: {message}")]
    Part {
        /// `diurnal`, `ramp` or `steps`.
        kind: &'static str,
        /// What is wrong, naming the key.
        message: String,
    },
}

/// A rate multiplier over the replayed clock (see the module doc for the grammar).
#[derive(Clone, Debug, PartialEq)]
pub enum RateProfile {
    /// A cosine day: `min` at time 0, 1 at `period / 2`.
    Diurnal {
        /// Length of one cycle.
        period: SimDuration,
        /// The trough multiplier, in (0, 1].
        min: f64,
    },
    /// A linear ramp, then flat.
    Ramp {
        /// Multiplier at time 0.
        from: f64,
        /// Multiplier at `over` and after.
        to: f64,
        /// Length of the ramp (0 = a step to `to`).
        over: SimDuration,
    },
    /// Piecewise constant; the first step starts at 0, starts strictly increase.
    Steps(Vec<(SimDuration, f64)>),
}

/// A duration in [`crate::duration`]'s grammar (`600s`, `250ms`, `10us`); a bare number is in
/// seconds. None when it is not one, or beyond what the clock holds.
pub fn parse_duration(v: &str) -> Option<SimDuration> {
    let ms = crate::duration::parse_ms(v, Some(crate::duration::Unit::Seconds)).ok()?;
    (ms < u64::MAX as f64 / 1e6).then(|| SimDuration::from_millis_f64(ms))
}

fn parse_multiplier(kind: &'static str, key: &str, v: &str) -> Result<f64, RateProfileError> {
    match v.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(RateProfileError::Part {
            kind,
            message: format!("{key}={v:?}: the multiplier must be a finite number above 0"),
        }),
    }
}

fn parse_span(kind: &'static str, key: &str, v: &str) -> Result<SimDuration, RateProfileError> {
    parse_duration(v).ok_or_else(|| RateProfileError::Part {
        kind,
        message: format!("{key}={v:?}: expected a duration such as 300s (not negative)"),
    })
}

/// `key=value` parts of a spec body, in order.
fn parts(kind: &'static str, body: &str) -> Result<Vec<(String, String)>, RateProfileError> {
    body.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| RateProfileError::Part {
                    kind,
                    message: format!("expected key=value, got {p:?}"),
                })
        })
        .collect()
}

/// Takes the named keys exactly once each; anything else is an error.
fn named<const N: usize>(
    kind: &'static str,
    body: &str,
    keys: [&str; N],
) -> Result<[String; N], RateProfileError> {
    let mut found: [Option<String>; N] = std::array::from_fn(|_| None);
    for (k, v) in parts(kind, body)? {
        let Some(i) = keys.iter().position(|&key| key == k) else {
            return Err(RateProfileError::Part {
                kind,
                message: format!("unknown key {k:?} (expected {})", keys.join(", ")),
            });
        };
        if found[i].replace(v).is_some() {
            return Err(RateProfileError::Part {
                kind,
                message: format!("key {k:?} given twice"),
            });
        }
    }
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (i, v) in found.into_iter().enumerate() {
        out[i] = v.ok_or_else(|| RateProfileError::Part {
            kind,
            message: format!("missing key {:?}", keys[i]),
        })?;
    }
    Ok(out)
}

impl FromStr for RateProfile {
    type Err = RateProfileError;

    fn from_str(spec: &str) -> Result<RateProfile, RateProfileError> {
        let kind_err = || RateProfileError::Kind {
            spec: spec.to_string(),
        };
        let (kind, body) = spec.trim().split_once(':').ok_or_else(kind_err)?;
        match kind.trim() {
            "diurnal" => {
                let [period, min] = named("diurnal", body, ["period", "min"])?;
                let period = parse_span("diurnal", "period", &period)?;
                if period.as_nanos() == 0 {
                    return Err(RateProfileError::Part {
                        kind: "diurnal",
                        message: "period must be above 0".into(),
                    });
                }
                let min = parse_multiplier("diurnal", "min", &min)?;
                if min > 1.0 {
                    return Err(RateProfileError::Part {
                        kind: "diurnal",
                        message: format!("min={min} must be at most 1 (the peak)"),
                    });
                }
                Ok(RateProfile::Diurnal { period, min })
            }
            "ramp" => {
                let [from, to, over] = named("ramp", body, ["from", "to", "over"])?;
                Ok(RateProfile::Ramp {
                    from: parse_multiplier("ramp", "from", &from)?,
                    to: parse_multiplier("ramp", "to", &to)?,
                    over: parse_span("ramp", "over", &over)?,
                })
            }
            "steps" => {
                let mut steps: Vec<(SimDuration, f64)> = Vec::new();
                for (k, v) in parts("steps", body)? {
                    let at = parse_span("steps", &k, &k)?;
                    let m = parse_multiplier("steps", &k, &v)?;
                    match steps.last() {
                        None if at.as_nanos() != 0 => {
                            return Err(RateProfileError::Part {
                                kind: "steps",
                                message: format!("the first step must start at 0s, not {k}"),
                            })
                        }
                        Some(&(prev, _)) if at <= prev => {
                            return Err(RateProfileError::Part {
                                kind: "steps",
                                message: format!("step {k} does not come after the one before"),
                            })
                        }
                        _ => steps.push((at, m)),
                    }
                }
                if steps.is_empty() {
                    return Err(RateProfileError::Part {
                        kind: "steps",
                        message: "no steps given".into(),
                    });
                }
                Ok(RateProfile::Steps(steps))
            }
            _ => Err(kind_err()),
        }
    }
}

impl fmt::Display for RateProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |d: &SimDuration| d.as_nanos() as f64 / 1e9;
        match self {
            RateProfile::Diurnal { period, min } => {
                write!(f, "diurnal:period={}s,min={min}", s(period))
            }
            RateProfile::Ramp { from, to, over } => {
                write!(f, "ramp:from={from},to={to},over={}s", s(over))
            }
            RateProfile::Steps(steps) => {
                write!(f, "steps:")?;
                for (i, (at, m)) in steps.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    write!(f, "{sep}{}s={m}", s(at))?;
                }
                Ok(())
            }
        }
    }
}

impl RateProfile {
    /// The multiplier at replayed time `t` (microseconds).
    pub fn multiplier_at_us(&self, t: f64) -> f64 {
        match self {
            RateProfile::Diurnal { period, min } => {
                let phase = std::f64::consts::TAU * t / (period.as_nanos() as f64 / 1e3);
                min + (1.0 - min) * (1.0 - phase.cos()) / 2.0
            }
            RateProfile::Ramp { from, to, over } => {
                let over = over.as_nanos() as f64 / 1e3;
                if t >= over {
                    *to
                } else {
                    from + (to - from) * t / over
                }
            }
            RateProfile::Steps(steps) => steps
                .iter()
                .rev()
                .find(|(at, _)| (at.as_nanos() as f64 / 1e3) <= t)
                .map_or(steps[0].1, |&(_, m)| m),
        }
    }

    /// The multiplier at `t`.
    pub fn multiplier(&self, t: SimTime) -> f64 {
        self.multiplier_at_us(t.as_nanos() as f64 / 1e3)
    }

    /// The smallest multiplier the profile takes (every arrival maps to at most
    /// `a / min_multiplier`).
    fn min_multiplier(&self) -> f64 {
        match self {
            RateProfile::Diurnal { min, .. } => *min,
            RateProfile::Ramp { from, to, .. } => from.min(*to),
            RateProfile::Steps(steps) => steps.iter().map(|s| s.1).fold(f64::INFINITY, f64::min),
        }
    }

    /// `M(t) = ∫₀ᵗ m(s) ds` in trace microseconds, for `t` in replayed microseconds.
    fn integral_us(&self, t: f64) -> f64 {
        match self {
            RateProfile::Diurnal { period, min } => {
                let p = period.as_nanos() as f64 / 1e3;
                let w = std::f64::consts::TAU / p;
                min * t + (1.0 - min) / 2.0 * (t - (w * t).sin() / w)
            }
            RateProfile::Ramp { from, to, over } => {
                let over = over.as_nanos() as f64 / 1e3;
                if t >= over {
                    (from + to) / 2.0 * over + to * (t - over)
                } else {
                    from * t + (to - from) * t * t / (2.0 * over)
                }
            }
            RateProfile::Steps(steps) => {
                let mut total = 0.0;
                for (i, &(at, m)) in steps.iter().enumerate() {
                    let start = at.as_nanos() as f64 / 1e3;
                    if t <= start {
                        break;
                    }
                    let end = steps
                        .get(i + 1)
                        .map_or(f64::INFINITY, |s| s.0.as_nanos() as f64 / 1e3);
                    total += m * (t.min(end) - start);
                }
                total
            }
        }
    }

    /// The replayed time of an arrival recorded at trace time `arrival`: the `t` with
    /// `M(t) = arrival`, to the nearest microsecond. Monotone: later arrivals never map earlier.
    pub fn map_time(&self, arrival: SimTime) -> SimTime {
        let target = arrival.as_nanos() as f64 / 1e3;
        if target <= 0.0 {
            return SimTime::ZERO;
        }
        let (mut lo, mut hi) = (0.0f64, target / self.min_multiplier() + 1.0);
        // 200 halvings reach the spacing of f64 long before; stop once the interval is below a
        // thousandth of a microsecond or stops shrinking.
        for _ in 0..200 {
            let mid = lo + (hi - lo) / 2.0;
            if mid <= lo || mid >= hi || hi - lo < 1e-3 {
                break;
            }
            if self.integral_us(mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let t = (lo + hi) / 2.0;
        SimTime::from_nanos((t * 1e3).round().min(u64::MAX as f64) as u64)
    }

    /// [`RateProfile::map_time`] of every arrival, in order.
    pub fn map_times(&self, arrivals: &[SimTime]) -> Vec<SimTime> {
        arrivals.iter().map(|&a| self.map_time(a)).collect()
    }

    /// Applies the profile to a trace in place: every session's first arrival is mapped
    /// ([`RateProfile::map_time`]); the delays between the turns of a session (closed loop,
    /// after the previous turn completes) stay as recorded.
    pub fn apply(&self, trace: &mut crate::trace::Trace) {
        for session in &mut trace.sessions {
            session.first_arrival = self.map_time(session.first_arrival);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> RateProfile {
        s.parse().unwrap()
    }

    #[test]
    fn specs_parse_and_print_back() {
        assert_eq!(
            p("diurnal:period=600s,min=0.2"),
            RateProfile::Diurnal {
                period: SimDuration::from_micros(600_000_000),
                min: 0.2
            }
        );
        assert_eq!(
            p("ramp:from=0.2,to=1,over=300s"),
            RateProfile::Ramp {
                from: 0.2,
                to: 1.0,
                over: SimDuration::from_micros(300_000_000)
            }
        );
        let steps = p("steps:0s=1,120s=3,240s=0.5");
        assert_eq!(
            steps,
            RateProfile::Steps(vec![
                (SimDuration::from_micros(0), 1.0),
                (SimDuration::from_micros(120_000_000), 3.0),
                (SimDuration::from_micros(240_000_000), 0.5)
            ])
        );
        for s in [
            "diurnal:period=600s,min=0.2",
            "ramp:from=0.2,to=1,over=300s",
            "steps:0s=1,120s=3,240s=0.5",
        ] {
            assert_eq!(p(s).to_string(), s);
        }
    }

    #[test]
    fn bad_specs_name_what_is_wrong() {
        let err = |s: &str| s.parse::<RateProfile>().unwrap_err().to_string();
        assert!(err("sine:period=1s").contains("expected diurnal"));
        assert!(err("diurnal").contains("expected diurnal"));
        assert_eq!(
            err("diurnal:period=600s"),
            "rate profile diurnal: missing key \"min\""
        );
        assert!(err("diurnal:period=600s,min=0").contains("above 0"));
        assert!(err("diurnal:period=600s,min=1.5").contains("at most 1"));
        assert!(err("diurnal:period=-5s,min=0.5").contains("not negative"));
        assert!(err("diurnal:period=0s,min=0.5").contains("period must be above 0"));
        assert!(err("ramp:from=0.2,to=1,over=300s,x=1").contains("unknown key \"x\""));
        assert!(err("ramp:from=0.2,from=1,to=1,over=3s").contains("twice"));
        assert!(err("ramp:from=-1,to=1,over=300s").contains("from=\"-1\""));
        assert!(err("steps:10s=1").contains("must start at 0s"));
        assert!(err("steps:0s=1,5s=2,5s=3").contains("does not come after"));
        assert!(err("steps:0s=1,5s=nan").contains("above 0"));
        assert!(err("steps:").contains("no steps"));
    }

    #[test]
    fn a_constant_profile_scales_time_exactly() {
        // Three times the rate: every arrival a third as late.
        let triple = p("steps:0s=3");
        assert_eq!(
            triple.map_time(SimTime::from_micros(3_000_000)),
            SimTime::from_micros(1_000_000)
        );
        assert_eq!(
            triple.map_time(SimTime::from_micros(0)),
            SimTime::from_micros(0)
        );
        let half = p("steps:0s=0.5");
        assert_eq!(
            half.map_time(SimTime::from_micros(1_000_000)),
            SimTime::from_micros(2_000_000)
        );
    }

    #[test]
    fn steps_switch_rate_at_their_boundaries() {
        // Rate 1 for 120 s consumes 120 s of trace; then rate 3.
        let s = p("steps:0s=1,120s=3,240s=0.5");
        assert_eq!(
            s.map_time(SimTime::from_micros(60_000_000)),
            SimTime::from_micros(60_000_000)
        );
        assert_eq!(
            s.map_time(SimTime::from_micros(120_000_000)),
            SimTime::from_micros(120_000_000)
        );
        // 150 s of trace: 120 by t=120, the other 30 at rate 3 take 10 s.
        assert_eq!(
            s.map_time(SimTime::from_micros(150_000_000)),
            SimTime::from_micros(130_000_000)
        );
        // By 240 s: 120 + 360 = 480 s of trace; 10 more at rate 0.5 take 20 s.
        assert_eq!(
            s.map_time(SimTime::from_micros(490_000_000)),
            SimTime::from_micros(260_000_000)
        );
    }

    #[test]
    fn ramp_and_diurnal_integrate_their_rate() {
        // ramp 0.2 -> 1 over 300 s consumes (0.2+1)/2*300 = 180 s of trace.
        let r = p("ramp:from=0.2,to=1,over=300s");
        assert_eq!(
            r.map_time(SimTime::from_micros(180_000_000)),
            SimTime::from_micros(300_000_000)
        );
        assert_eq!(
            r.map_time(SimTime::from_micros(280_000_000)),
            SimTime::from_micros(400_000_000)
        );
        // One diurnal period consumes (min + (1-min)/2) * period of trace.
        let d = p("diurnal:period=600s,min=0.2");
        assert_eq!(
            d.map_time(SimTime::from_micros(360_000_000)),
            SimTime::from_micros(600_000_000)
        );
        assert!((d.multiplier(SimTime::from_micros(300_000_000)) - 1.0).abs() < 1e-12);
        assert!((d.multiplier(SimTime::ZERO) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn mapping_is_monotone_and_deterministic() {
        let d = p("diurnal:period=97s,min=0.13");
        let arrivals: Vec<SimTime> = (0..2000)
            .map(|i| SimTime::from_micros(i * 123_457))
            .collect();
        let a = d.map_times(&arrivals);
        assert_eq!(a, d.map_times(&arrivals));
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // Each mapped time integrates back to its arrival (within a microsecond of rate 1).
        for (t, orig) in a.iter().zip(&arrivals) {
            assert!(
                (d.integral_us(t.as_nanos() as f64 / 1e3) - (orig.as_nanos() as f64 / 1e3)).abs()
                    <= 1.0
            );
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(
            parse_duration("250ms"),
            Some(SimDuration::from_micros(250_000))
        );
        assert_eq!(parse_duration("2m"), None);
        assert_eq!(
            parse_duration("7"),
            Some(SimDuration::from_micros(7_000_000))
        );
        assert_eq!(parse_duration("10us"), Some(SimDuration::from_micros(10)));
        assert_eq!(parse_duration("-1s"), None);
        assert_eq!(parse_duration("abc"), None);
    }
}
