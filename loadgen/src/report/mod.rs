//! What a run leaves behind: the `replay` and `bench` report with its raw per-request records
//! ([`replay_report`]), the self-contained HTML report (`html`), every SVG chart (`chart`),
//! one report rebuilt from the records of several runs ([`merge`]), the aggregate of
//! `--num-runs` (`repeat`) and the per-adapter figures of `--lora-mix` (`lora`).

pub(crate) mod capped;
pub(crate) mod chart;
pub(crate) mod html;
pub(crate) mod lora;
pub mod merge;
pub(crate) mod record_check;
pub(crate) mod repeat;
pub mod replay_report;
