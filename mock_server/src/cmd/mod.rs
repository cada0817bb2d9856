//! The `mockserve` commands, one file each: [`serve`] (the default: the HTTP API over the live
//! engine), [`fleet`] (N workers, each its own endpoint) and [`replay`] (a trace on a virtual
//! clock); `shutdown` is the one way `serve` and `fleet` stop. The command line itself is
//! [`crate::Cli`].

pub mod autoscale;
pub mod fleet;
pub mod replay;
pub mod serve;
pub(crate) mod shutdown;
