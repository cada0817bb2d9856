//! `mockserve plan`: a configuration search over a trace ([`crate::plan::search`]), or a merge
//! of shard ledgers ([`crate::plan::merge`]); the flags are [`crate::plan::args`].

pub use crate::plan::args::{MergeArgs, PlanArgs, SearchArgs, SearchCommand};

/// Runs `mockserve plan`.
pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    match args {
        PlanArgs::Search(search) => crate::plan::search(search),
        PlanArgs::Merge(merge) => crate::plan::merge(merge),
    }
}
