//! Standard output for every command: [`write()`] is the one way `mockserve` prints to stdout.

/// Writes `bytes` to stdout and flushes. Every stdout write of `mockserve` goes through here
/// (`print!` panics on a closed pipe): a reader that went away, as `mockserve replay … | head`
/// does, is not an error; the output is dropped and the result is `Ok(false)`, so the command
/// carries on (or ends) quietly. Other write errors are returned.
pub(crate) fn write(bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e),
    }
}
