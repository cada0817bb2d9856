//! `weka` traces (AgentX; AIPerf's `weka_trace`) lowered into a [`RequestGraph`].

use std::io::BufRead;

use super::graph::RequestGraph;
use super::TraceError;

/// Reads a weka trace.
pub(super) fn parse(_reader: impl BufRead, source_name: &str) -> Result<RequestGraph, TraceError> {
    Err(TraceError::Empty {
        source_name: source_name.to_string(),
    })
}
