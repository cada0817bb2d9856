//! The `mockserve` commands that run something, one file each: [`serve`] (the default: the
//! HTTP API over the live engine) and [`replay`] (a trace on a virtual clock). `mockserve
//! fleet` is [`crate::fleet::run`]; the command line itself is [`crate::Cli`].

pub mod plan;
pub mod replay;
pub mod serve;
