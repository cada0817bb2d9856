//! mockserve library.
