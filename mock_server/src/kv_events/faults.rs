//! Seeded faults on the KV event plane (`--kv-events-faults`), so that a router's gap recovery,
//! deduplication and tolerance of late or out-of-order batches can be exercised: each published
//! batch of a worker may be dropped, duplicated, held back behind the next one (reordered), and
//! every batch may be delivered late by a fixed delay. `restart=N` restarts a worker's
//! publisher after every N batches, as a restarted vLLM engine's new publisher does: its
//! numbering starts over at 0 and its replay buffer is empty.
//!
//! Faults act on delivery only: every batch is numbered and kept for replay as usual, so a
//! dropped one leaves a gap in the sequence numbers that the replay endpoint can fill, a
//! duplicate repeats its number, and a reordered one arrives after its successor. The draws
//! come from one generator per worker seeded from the spec's `seed` and the worker's index:
//! the same batches of a worker meet the same faults in every run.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The longest `delay` (one minute): a longer one is no longer a late batch but a lost one.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(60);

/// `--kv-events-faults`: comma-separated `drop=P`, `duplicate=P`, `reorder=P` (probabilities
/// per batch, 0 to 1), `delay=MS` (every batch delivered that much later, 0 to 60000),
/// `restart=N` (a publisher restart after every N batches of a worker) and `seed=N`; at least
/// one fault.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EventFaults {
    /// Share of batches not delivered.
    pub drop: f64,
    /// Share of batches delivered twice.
    pub duplicate: f64,
    /// Share of batches held back and delivered right after the worker's next batch.
    pub reorder: f64,
    /// Delivery delay of every batch.
    pub delay: Duration,
    /// Batches a worker's publisher sends between restarts (0: it never restarts).
    pub restart: u64,
    /// Seed of the draws.
    pub seed: u64,
}

impl Eq for EventFaults {}

impl FromStr for EventFaults {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut faults = EventFaults::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{:?}: expected KEY=VALUE", cut(part)))?;
            if seen.contains(&key) {
                return Err(format!(
                    "{:?} is given twice: give each of drop, duplicate, reorder, delay, \
                     restart and seed at most once",
                    cut(key)
                ));
            }
            seen.push(key);
            let shown = cut(value);
            let share = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("{key}={shown}: a probability from 0 to 1"))
            };
            match key {
                "drop" => faults.drop = share()?,
                "duplicate" => faults.duplicate = share()?,
                "reorder" => faults.reorder = share()?,
                "delay" => {
                    faults.delay = value
                        .parse::<u64>()
                        .ok()
                        .map(Duration::from_millis)
                        .filter(|d| *d <= MAX_DELAY)
                        .ok_or_else(|| {
                            format!(
                                "delay={shown}: whole milliseconds from 0 to {}",
                                MAX_DELAY.as_millis()
                            )
                        })?
                }
                "restart" => {
                    faults.restart = value
                        .parse::<u64>()
                        .ok()
                        .ok_or_else(|| format!("restart={shown}: a number of batches (0: never)"))?
                }
                "seed" => {
                    faults.seed = value
                        .parse()
                        .map_err(|_| format!("seed={shown}: an unsigned integer"))?
                }
                other => {
                    return Err(format!(
                        "unknown fault {:?}: expected drop, duplicate, reorder, delay, restart \
                         or seed",
                        cut(other)
                    ))
                }
            }
        }
        if faults.drop == 0.0
            && faults.duplicate == 0.0
            && faults.reorder == 0.0
            && faults.delay.is_zero()
            && faults.restart == 0
        {
            return Err(format!(
                "{:?} injects nothing: give drop=P, duplicate=P, reorder=P, delay=MS or \
                 restart=N",
                cut(s)
            ));
        }
        Ok(faults)
    }
}

/// Characters of a given value shown in an error at most.
const SHOWN_CHARS: usize = 64;

/// `text` for an error message: its first [`SHOWN_CHARS`] characters, then `...` if longer.
fn cut(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

impl fmt::Display for EventFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "drop={},duplicate={},reorder={},delay={},restart={},seed={}",
            self.drop,
            self.duplicate,
            self.reorder,
            self.delay.as_millis(),
            self.restart,
            self.seed
        )
    }
}

/// A fault that befell one batch, as `servesim_kv_events_faults` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Not delivered.
    Dropped,
    /// Delivered twice.
    Duplicated,
    /// Held back behind the next batch.
    Reordered,
    /// Delivered late.
    Delayed,
    /// Its publisher restarted just before it: numbered 0, the replay buffer emptied.
    Restarted,
}

impl Fault {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Fault::Dropped => "drop",
            Fault::Duplicated => "duplicate",
            Fault::Reordered => "reorder",
            Fault::Delayed => "delay",
            Fault::Restarted => "restart",
        }
    }
}

/// One worker's faults: its generator, the batch it holds back and the batches since its
/// publisher's last restart.
#[derive(Debug)]
pub(crate) struct RankFaults<T> {
    faults: EventFaults,
    rng: ChaCha8Rng,
    held: Option<T>,
    since_restart: u64,
}

impl<T: Clone> RankFaults<T> {
    /// The faults of worker `rank`.
    pub(crate) fn new(faults: EventFaults, rank: usize) -> RankFaults<T> {
        RankFaults {
            faults,
            rng: ChaCha8Rng::seed_from_u64(faults.seed ^ (rank as u64).rotate_left(32)),
            held: None,
            since_restart: 0,
        }
    }

    /// Whether the publisher restarts before it numbers its next batch: after every
    /// `restart` batches (never the first). Draws nothing, so other faults meet the same
    /// batches with and without it.
    pub(crate) fn restarts(&mut self) -> bool {
        if self.faults.restart == 0 {
            return false;
        }
        if self.since_restart == self.faults.restart {
            self.since_restart = 1;
            return true;
        }
        self.since_restart += 1;
        false
    }

    /// The delivery delay of every batch.
    pub(crate) fn delay(&self) -> Duration {
        self.faults.delay
    }

    /// What to deliver, in order, now that `message` (the next batch) is published, and the
    /// faults drawn for it. Three draws per batch, whichever apply, so that one fault's share
    /// does not move another's draws.
    pub(crate) fn deliver(&mut self, message: T) -> (Vec<T>, Vec<Fault>) {
        let (drop, duplicate, reorder) = (
            self.rng.gen::<f64>() < self.faults.drop,
            self.rng.gen::<f64>() < self.faults.duplicate,
            self.rng.gen::<f64>() < self.faults.reorder,
        );
        let mut out = Vec::with_capacity(3);
        let mut faults = Vec::new();
        let held = self.held.take();
        if drop {
            faults.push(Fault::Dropped);
        } else if reorder && held.is_none() {
            faults.push(Fault::Reordered);
            self.held = Some(if duplicate {
                faults.push(Fault::Duplicated);
                out.push(message.clone());
                message
            } else {
                message
            });
        } else {
            out.push(message.clone());
            if duplicate {
                faults.push(Fault::Duplicated);
                out.push(message);
            }
        }
        out.extend(held);
        if !self.faults.delay.is_zero() && !out.is_empty() {
            faults.push(Fault::Delayed);
        }
        (out, faults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;

    #[test]
    fn the_spec_parses_prints_back_and_refuses_nonsense() {
        let f: EventFaults = "drop=0.1, duplicate=0.05,reorder=0.2,delay=250,restart=7,seed=9"
            .parse()
            .expect("valid");
        assert_eq!(
            f,
            EventFaults {
                drop: 0.1,
                duplicate: 0.05,
                reorder: 0.2,
                delay: Duration::from_millis(250),
                restart: 7,
                seed: 9
            }
        );
        assert_eq!(f.to_string().parse::<EventFaults>(), Ok(f));
        for (bad, why) in [
            ("drop=1.5", "a probability from 0 to 1"),
            ("drop=-0.1", "a probability from 0 to 1"),
            ("delay=60001", "whole milliseconds from 0 to 60000"),
            ("delay=1.5", "whole milliseconds"),
            ("restart=-1", "a number of batches"),
            ("restart=0", "injects nothing"),
            ("jitter=3", "unknown fault \"jitter\""),
            ("drop", "expected KEY=VALUE"),
            ("seed=3", "injects nothing"),
            ("", "injects nothing"),
            ("drop=0.1,drop=0.2", "\"drop\" is given twice"),
            ("seed=1,delay=5,seed=1", "\"seed\" is given twice"),
        ] {
            let e = bad.parse::<EventFaults>().expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
        // A huge value is cut in the message.
        let huge = format!("drop={}", "9".repeat(100_000));
        let e = huge.parse::<EventFaults>().expect_err("refused");
        assert!(
            e.len() < 200 && e.contains("drop=999") && e.contains("..."),
            "{e}"
        );
    }

    fn run(spec: &str, n: u8) -> (Vec<u8>, Vec<Vec<Fault>>) {
        let mut r = RankFaults::<Bytes>::new(spec.parse().expect("valid"), 0);
        let mut delivered = Vec::new();
        let mut faults = Vec::new();
        for i in 0..n {
            let (out, f) = r.deliver(Bytes::from(vec![i]));
            delivered.extend(out.iter().map(|m| m[0]));
            faults.push(f);
        }
        (delivered, faults)
    }

    /// Each fault does what it says to the delivered sequence, and the same seed draws the
    /// same faults.
    #[test]
    fn faults_shape_the_delivered_sequence() {
        let (d, _) = run("drop=1", 5);
        assert!(d.is_empty());
        let (d, _) = run("duplicate=1", 3);
        assert_eq!(d, [0, 0, 1, 1, 2, 2]);
        // Every other batch held back behind the next (a held one is never held twice).
        let (d, f) = run("reorder=1", 4);
        assert_eq!(d, [1, 0, 3, 2]);
        assert_eq!(f[0], [Fault::Reordered]);
        assert!(f[1].is_empty());
        let (d, f) = run("delay=5", 2);
        assert_eq!(d, [0, 1]);
        assert_eq!(f, [[Fault::Delayed], [Fault::Delayed]]);
        // A share: about that many, the same ones for the same seed, others for another.
        let (a, fa) = run("drop=0.3,seed=1", 200);
        let (b, _) = run("drop=0.3,seed=1", 200);
        let (c, _) = run("drop=0.3,seed=2", 200);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let dropped = fa.iter().filter(|f| f.contains(&Fault::Dropped)).count();
        assert_eq!(a.len(), 200 - dropped);
        assert!((40..=80).contains(&dropped), "{dropped} dropped");
        // A reordered batch comes out, even when the next one is dropped.
        let mut r = RankFaults::<Bytes>::new("reorder=1,drop=0".parse().expect("valid"), 0);
        assert!(r.deliver(Bytes::from_static(b"a")).0.is_empty());
        r.faults.drop = 1.0;
        assert_eq!(
            r.deliver(Bytes::from_static(b"b")).0,
            [Bytes::from_static(b"a")]
        );
    }

    /// `restart=3`: the publisher restarts before batches 3, 6, 9, ... (counting from 0),
    /// and the other faults meet the same batches with or without it.
    #[test]
    fn restarts_come_every_n_batches_without_moving_the_draws() {
        let mut r = RankFaults::<u8>::new("restart=3".parse().expect("valid"), 0);
        let restarts: Vec<bool> = (0..10).map(|_| r.restarts()).collect();
        assert_eq!(
            restarts,
            [false, false, false, true, false, false, true, false, false, true]
        );
        let mut never = RankFaults::<u8>::new("drop=0.5".parse().expect("valid"), 0);
        assert!((0..10).all(|_| !never.restarts()));
        let draws = |spec: &str| {
            let mut r = RankFaults::<u8>::new(spec.parse().expect("valid"), 0);
            (0..50u8)
                .map(|i| {
                    r.restarts();
                    r.deliver(i).0
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draws("drop=0.4,seed=3"), draws("drop=0.4,restart=5,seed=3"));
    }
}
