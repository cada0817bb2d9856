//! [`OutputLengthDist`]: how long an answer runs when the request does not set `ignore_eos`
//! (the `--output-length-dist` flag), sampled from each request's seed.
//!
//! Syntax, where each LENGTH is a token count (`64`) or a share of the request's output limit
//! (`50%`):
//!
//! - `fixed` or `fixed:LENGTH`: always that length (`fixed` alone is `fixed:100%`, the limit:
//!   every answer ends with `finish_reason: "length"`, as if `ignore_eos` were always set);
//! - `uniform:LO,HI`: uniform between `LO` and `HI` (inclusive; `LO` above `HI` is refused
//!   when both are token counts or both shares);
//! - `lognormal:MEAN,SIGMA`: log-normal with mean `MEAN` and shape `SIGMA` (the standard
//!   deviation of the underlying normal; `0.5` is a typical chat spread).
//!
//! A sample is at least 1 token. A sample at or beyond the limit is cut there and the answer
//! ends with `finish_reason: "length"`; a shorter one ends with the model's end of sequence,
//! `finish_reason: "stop"`. The default, `DEFAULT_OUTPUT_LENGTH_DIST`, is
//! `lognormal:50%,0.5`: answers run about half their limit on average and one in twenty reaches it, so
//! `ignore_eos` (which always runs to the limit) matters.

use std::fmt;
use std::str::FromStr;

use rand::Rng;

/// The default `--output-length-dist`.
pub(crate) const DEFAULT_OUTPUT_LENGTH_DIST: &str = "lognormal:50%,0.5";

/// A length: a token count or a share of the request's output limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Length {
    /// This many tokens.
    Tokens(usize),
    /// This share of the limit (1.0 is the limit).
    Share(f64),
}

impl Length {
    /// The length in tokens (fractional) for a request whose limit is `limit`.
    pub fn tokens(self, limit: usize) -> f64 {
        match self {
            Length::Tokens(n) => n as f64,
            Length::Share(s) => s * limit as f64,
        }
    }
}

impl fmt::Display for Length {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Length::Tokens(n) => write!(f, "{n}"),
            Length::Share(s) => write!(f, "{}%", s * 100.0),
        }
    }
}

impl FromStr for Length {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Some(percent) = s.strip_suffix('%') {
            let p: f64 = percent
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a percentage"))?;
            if !p.is_finite() || p < 0.0 {
                return Err(format!(
                    "{s:?}: a share must be a finite, non-negative percentage"
                ));
            }
            return Ok(Length::Share(p / 100.0));
        }
        s.parse::<usize>().map(Length::Tokens).map_err(|_| {
            format!("{s:?} is neither a token count (64) nor a share of the limit (50%)")
        })
    }
}

/// How long answers run without `ignore_eos`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutputLengthDist {
    /// Always this length.
    Fixed(Length),
    /// Uniform between two lengths, inclusive.
    Uniform(Length, Length),
    /// Log-normal with this mean and shape (sigma of the underlying normal).
    LogNormal {
        /// Mean length.
        mean: Length,
        /// Standard deviation of the underlying normal.
        sigma: f64,
    },
}

impl Default for OutputLengthDist {
    fn default() -> Self {
        OutputLengthDist::LogNormal {
            mean: Length::Share(0.5),
            sigma: 0.5,
        }
    }
}

impl OutputLengthDist {
    /// Every answer runs to its limit (`fixed`).
    pub const LIMIT: OutputLengthDist = OutputLengthDist::Fixed(Length::Share(1.0));

    /// A length in tokens, at least 1; it may exceed `limit` (the answer is then cut there).
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, limit: usize) -> usize {
        let tokens = match *self {
            OutputLengthDist::Fixed(length) => length.tokens(limit),
            OutputLengthDist::Uniform(lo, hi) => {
                let (lo, hi) = (lo.tokens(limit).round(), hi.tokens(limit).round());
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                lo + (rng.gen::<f64>() * (hi - lo + 1.0)).floor().min(hi - lo)
            }
            OutputLengthDist::LogNormal { mean, sigma } => {
                let mean = mean.tokens(limit).max(f64::MIN_POSITIVE);
                // Box-Muller; mu chosen so that the distribution's mean is `mean`.
                let u1 = 1.0 - rng.gen::<f64>();
                let u2 = rng.gen::<f64>();
                let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let mu = mean.ln() - sigma * sigma / 2.0;
                (mu + sigma * normal).exp()
            }
        };
        // Saturating: a huge sample is simply cut at the limit.
        (tokens.round() as usize).max(1)
    }
}

impl fmt::Display for OutputLengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputLengthDist::Fixed(length) => write!(f, "fixed:{length}"),
            OutputLengthDist::Uniform(lo, hi) => write!(f, "uniform:{lo},{hi}"),
            OutputLengthDist::LogNormal { mean, sigma } => write!(f, "lognormal:{mean},{sigma}"),
        }
    }
}

impl FromStr for OutputLengthDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, rest) = match s.split_once(':') {
            Some((kind, rest)) => (kind.trim(), Some(rest)),
            None => (s.trim(), None),
        };
        let args: Vec<&str> = rest.map(|r| r.split(',').collect()).unwrap_or_default();
        let syntax = "expected fixed[:LENGTH], uniform:LO,HI or lognormal:MEAN,SIGMA, where a \
                      LENGTH is a token count (64) or a share of the limit (50%)";
        match (kind, args.as_slice()) {
            ("fixed", []) => Ok(OutputLengthDist::LIMIT),
            ("fixed", [length]) => Ok(OutputLengthDist::Fixed(length.parse()?)),
            ("uniform", [lo, hi]) => {
                let (lo, hi): (Length, Length) = (lo.parse()?, hi.parse()?);
                // Ends of one kind must be in order; a token count and a share are ordered
                // per request, by its limit.
                let reversed = match (lo, hi) {
                    (Length::Tokens(a), Length::Tokens(b)) => a > b,
                    (Length::Share(a), Length::Share(b)) => a > b,
                    _ => false,
                };
                if reversed {
                    return Err(format!("uniform:{lo},{hi}: LO must not be above HI"));
                }
                Ok(OutputLengthDist::Uniform(lo, hi))
            }
            ("lognormal", [mean, sigma]) => {
                let sigma: f64 = sigma
                    .trim()
                    .parse()
                    .map_err(|_| format!("{sigma:?} is not a number (SIGMA)"))?;
                if !sigma.is_finite() || sigma < 0.0 {
                    return Err(format!("SIGMA must be finite and at least 0, not {sigma}"));
                }
                Ok(OutputLengthDist::LogNormal {
                    mean: mean.parse()?,
                    sigma,
                })
            }
            _ => Err(format!(
                "invalid output length distribution {s:?}: {syntax}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn parses_and_prints_every_form() {
        for (text, want) in [
            ("fixed", OutputLengthDist::LIMIT),
            ("fixed:64", OutputLengthDist::Fixed(Length::Tokens(64))),
            (
                "uniform:10%,100%",
                OutputLengthDist::Uniform(Length::Share(0.1), Length::Share(1.0)),
            ),
            (
                "lognormal:200,0.4",
                OutputLengthDist::LogNormal {
                    mean: Length::Tokens(200),
                    sigma: 0.4,
                },
            ),
        ] {
            let parsed: OutputLengthDist = text.parse().expect(text);
            assert_eq!(parsed, want, "{text}");
            assert_eq!(parsed.to_string().parse::<OutputLengthDist>(), Ok(want));
        }
        assert_eq!(
            DEFAULT_OUTPUT_LENGTH_DIST.parse(),
            Ok(OutputLengthDist::default())
        );
        for bad in [
            "",
            "fixed:",
            "uniform:1",
            "lognormal:50%,-1",
            "lognormal:50%,x",
            "normal:1,2",
            "fixed:-5%",
            "fixed:1.5",
            "uniform:10,5",
            "uniform:50%,10%",
        ] {
            assert!(bad.parse::<OutputLengthDist>().is_err(), "{bad}");
        }
        assert_eq!(
            "uniform:10,5".parse::<OutputLengthDist>(),
            Err("uniform:10,5: LO must not be above HI".into())
        );
        // A count and a share are ordered per request (by its limit): accepted either way.
        assert!("uniform:500,10%".parse::<OutputLengthDist>().is_ok());
    }

    #[test]
    fn samples_stay_in_range_and_follow_the_mean() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let uniform: OutputLengthDist = "uniform:10,20".parse().expect("parses");
        let mut seen = [false; 11];
        for _ in 0..2000 {
            let n = uniform.sample(&mut rng, 1000);
            assert!((10..=20).contains(&n), "{n}");
            seen[n - 10] = true;
        }
        assert!(seen.iter().all(|&s| s), "both ends are reached");

        let fixed: OutputLengthDist = "fixed:50%".parse().expect("parses");
        assert_eq!(fixed.sample(&mut rng, 100), 50);
        assert_eq!(OutputLengthDist::LIMIT.sample(&mut rng, 7), 7);
        assert_eq!(
            OutputLengthDist::Fixed(Length::Tokens(0)).sample(&mut rng, 7),
            1
        );

        let lognormal = OutputLengthDist::default();
        let samples: Vec<usize> = (0..4000)
            .map(|_| lognormal.sample(&mut rng, 1000))
            .collect();
        let mean = samples.iter().sum::<usize>() as f64 / samples.len() as f64;
        assert!((450.0..550.0).contains(&mean), "mean {mean}");
        let over = samples.iter().filter(|&&n| n >= 1000).count() as f64 / 4000.0;
        assert!((0.02..0.2).contains(&over), "share at the limit {over}");
    }
}
