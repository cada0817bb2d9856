//! What a run leaves behind: the `replay` and `bench` report with its raw per-request records
//! ([`replay_report`]), the self-contained HTML report (`html`), every SVG chart (`chart`),
//! and one report rebuilt from the records of several runs ([`merge`]).

pub(crate) mod capped;
pub(crate) mod chart;
pub(crate) mod html;
pub mod merge;
pub(crate) mod record_check;
pub mod replay_report;
