//! What a run leaves behind: the `replay` and `bench` report with its raw per-request records
//! ([`replay_report`]), the self-contained HTML report (`html`), every SVG chart (`chart`),
//! what the observers saw added to it (`observed`), the aggregate of `--num-runs` (`repeat`) and the per-adapter figures of `--lora-mix`
//! (`lora`).

pub(crate) mod chart;
pub(crate) mod html;
pub(crate) mod lora;
pub(crate) mod observed;
pub(crate) mod repeat;
pub mod replay_report;
