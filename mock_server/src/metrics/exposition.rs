//! The text exposition a scrape gets ([`Metrics::encode`]): built off the runtime's worker
//! threads, one build at a time, and a costly one served again for a short while (see the
//! parent module's docs).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::Duration;

use axum::body::Bytes;
use tokio::time::Instant;

use super::Metrics;

/// An exposition built earlier, kept for the scrapes right after it.
#[derive(Debug)]
pub(super) struct Exposition {
    /// When its build began.
    started: Instant,
    /// How long the build took.
    took: Duration,
    /// The text.
    text: Bytes,
}

/// Builds that took at least this long are reused (see [`REUSE_FACTOR`]); cheaper ones never.
pub(crate) const REUSE_THRESHOLD: Duration = Duration::from_millis(25);

/// A costly exposition is served again to scrapes arriving within this many times its build
/// time after its build began.
pub(crate) const REUSE_FACTOR: u32 = 4;

impl Metrics {
    /// The OpenMetrics text exposition: built now, or the one a scrape just before this one
    /// built when building is costly (see the module docs). On a multi-threaded runtime the
    /// build (or the wait for another scrape's) runs in `block_in_place`, so the runtime's other
    /// tasks move to another thread meanwhile.
    pub fn encode(&self) -> Bytes {
        let arrived = Instant::now();
        let build = || {
            let mut last = self
                .exposition
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(e) = last.as_ref() {
                let recent = e.took >= REUSE_THRESHOLD
                    && arrived.saturating_duration_since(e.started) < e.took * REUSE_FACTOR;
                if e.started >= arrived || recent {
                    return e.text.clone();
                }
            }
            let started = Instant::now();
            let text = Bytes::from(self.build());
            *last = Some(Exposition {
                started,
                took: started.elapsed(),
                text: text.clone(),
            });
            text
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(build)
            }
            _ => build(),
        }
    }

    /// Builds the exposition.
    fn build(&self) -> String {
        let room = self.encoded_len.load(Ordering::Relaxed);
        let mut out = String::with_capacity(room + room / 8);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        self.encoded_len.store(out.len(), Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use servesim::ids::WorkerId;

    use super::*;

    #[test]
    fn a_cheap_exposition_is_built_fresh_for_every_scrape() {
        let m = Metrics::new();
        m.init_workers(2);
        let before = m.encode();
        assert_eq!(before, Bytes::from(m.build()));
        m.overloaded.inc();
        let after = m.encode();
        assert_ne!(before, after);
        let text = std::str::from_utf8(&after).expect("utf-8");
        assert!(
            text.contains("servesim_http_requests_overloaded_total 1\n"),
            "{text}"
        );
    }

    #[test]
    fn a_costly_exposition_is_served_again_within_its_window_only() {
        let m = Metrics::new();
        let costly = |took: Duration| Exposition {
            started: Instant::now(),
            took,
            text: Bytes::from_static(b"cached"),
        };
        // Built just now and costly: reused.
        *m.exposition.lock().expect("lock") = Some(costly(Duration::from_secs(60)));
        assert_eq!(m.encode(), Bytes::from_static(b"cached"));
        // Cheap builds are never reused.
        *m.exposition.lock().expect("lock") = Some(costly(Duration::from_millis(1)));
        assert_eq!(m.encode(), Bytes::from(m.build()));
        // Costly but old: rebuilt.
        *m.exposition.lock().expect("lock") = Some(Exposition {
            started: Instant::now() - Duration::from_secs(10),
            took: REUSE_THRESHOLD,
            text: Bytes::from_static(b"cached"),
        });
        assert_eq!(m.encode(), Bytes::from(m.build()));
    }

    /// The cost of scraping 1,024 workers: `cargo test -p mock_server --lib -- --ignored
    /// --nocapture scrape_cost` (debug builds are several times slower than release).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn scrape_cost_at_1024_workers() {
        let m = std::sync::Arc::new(Metrics::for_model("mock-model", 131_072));
        m.init_workers(1024);
        for w in 0..1024 {
            let label = m.engine(WorkerId(w));
            m.ttft.get_or_create(&label).observe(0.05);
            m.request_prompt_tokens.get_or_create(&label).observe(900.0);
        }
        let started = std::time::Instant::now();
        let text = m.build();
        let one = started.elapsed();
        println!(
            "one build: {one:?}, {} bytes, {} lines",
            text.len(),
            text.lines().count()
        );
        // Two scrape loops back to back for two seconds, before (a build per scrape) and now.
        for (name, reuse) in [("a build per scrape", false), ("encode", true)] {
            let scrapes = AtomicUsize::new(0);
            let until = std::time::Instant::now() + Duration::from_secs(2);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        while std::time::Instant::now() < until {
                            let _ = if reuse {
                                m.encode()
                            } else {
                                Bytes::from(m.build())
                            };
                            scrapes.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            println!("{name}: {} scrapes in 2 s", scrapes.load(Ordering::Relaxed));
        }
    }
}
