//! The metrics target: fuzzed bytes as a server's answer to `GET /metrics`, read by loadgen's
//! scraper ([`loadgen::scrape`]) the way it reads a real one (bytes that are not UTF-8
//! replaced).
//!
//! Properties, for every input:
//!
//! - reading the serving figures straight from the text ([`Snapshot::read`], which parses only
//!   the lines of the metrics it knows) gives what parsing every line ([`parse`]) and picking
//!   the known samples ([`Snapshot::of`]) gives;
//! - no worker of a snapshot is without a figure;
//! - the time series of two snapshots (the text's first half, then all of it) is built without
//!   a panic, one sample per snapshot.

use loadgen::scrape::{parse, series, Snapshot, WorkerFigures};

/// Checks the properties above for `data`.
pub fn metrics_text(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let read = Snapshot::read(&text);
    let parsed = Snapshot::of(&parse(&text));
    assert_eq!(
        read, parsed,
        "the figures read from the text differ from those of its parsed samples"
    );
    for (worker, figures) in &read.workers {
        assert_ne!(
            *figures,
            WorkerFigures::default(),
            "worker {worker:?} has no figure"
        );
    }
    let mut half = text.len() / 2;
    while !text.is_char_boundary(half) {
        half -= 1;
    }
    let first = Snapshot::read(&text[..half]);
    let (samples, _) = series(&[(0.0, first), (500.0, read)], 0);
    assert_eq!(samples.len(), 2, "one sample per snapshot");
}
