//! The one way the serving commands (`serve`, `fleet`) stop: the first SIGINT or SIGTERM
//! (ctrl-c off Unix), or stdin's end with `--exit-on-stdin-eof`, starts the drain (open
//! requests have `--shutdown-timeout` to finish); a second signal during the drain exits at once,
//! an error. [`run`] owns the runtime and the handlers, [`Shutdown`] is what a command waits on.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;

/// Runs a serving command on a new multi-threaded runtime: installs the signal handlers first
/// (no signal is missed once anything listens), hands them to `command` as a [`Shutdown`], and
/// drops whatever still runs when it returns (only after a second signal: a drain ends what it
/// waits on).
pub(crate) fn run<C, F>(exit_on_stdin_eof: bool, command: C) -> anyhow::Result<()>
where
    C: FnOnce(Shutdown) -> F,
    F: Future<Output = anyhow::Result<()>>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(async {
        let signals = ShutdownSignals::new().context("installing signal handlers")?;
        command(Shutdown {
            signals,
            exit_on_stdin_eof,
        })
        .await
    });
    // Whatever is still running (only after a second signal) is dropped, not awaited.
    runtime.shutdown_background();
    result
}

/// Prints the addresses a command listens on, once everything listens. Nobody reading stdout
/// (a closed pipe) does not stop the server: the failure is one warning on stderr.
pub(crate) fn print_addresses(lines: &str) {
    if let Err(e) = crate::stdout::write(lines.as_bytes()) {
        eprintln!("mockserve: warning: writing to stdout failed: {e}");
    }
}

/// What a serving command waits on to stop.
#[derive(Debug)]
pub(crate) struct Shutdown {
    /// Installed before the command binds anything.
    signals: ShutdownSignals,
    /// `--exit-on-stdin-eof`: stdin's end asks for the stop too.
    exit_on_stdin_eof: bool,
}

impl Shutdown {
    /// Resolves once a stop is asked (a signal, or stdin's end with `--exit-on-stdin-eof`), after
    /// saying so on stderr with the drain's length (`drain`).
    pub(crate) async fn requested(&mut self, drain: Duration) {
        let why = tokio::select! {
            biased;
            () = self.signals.recv() => "",
            () = stdin_closed(self.exit_on_stdin_eof) => "stdin closed; ",
        };
        eprintln!(
            "mockserve: {why}shutting down; open requests have {:.1} s to finish (signal again to \
             exit now)",
            drain.as_secs_f64()
        );
    }

    /// Waits for `drain` (the server's own drain, bounded by `--shutdown-timeout`) unless a
    /// second signal comes first: then an error, and the caller's runtime drops the rest.
    pub(crate) async fn drain<F>(&mut self, drain: F) -> anyhow::Result<()>
    where
        F: Future<Output = anyhow::Result<()>>,
    {
        tokio::select! {
            biased;
            result = drain => result,
            () = self.signals.recv() => anyhow::bail!("second signal: exiting without draining"),
        }
    }
}

/// Resolves once stdin reaches its end (or cannot be read) when `enabled`; never otherwise.
/// The read blocks a plain thread, which the process's exit ends.
async fn stdin_closed(enabled: bool) {
    if !enabled {
        return std::future::pending().await;
    }
    let (closed, on_close) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed.send(());
    });
    let _ = on_close.await;
}

/// SIGINT and SIGTERM, both installed once up front so that no signal is missed between the
/// first (drain) and the second (exit now).
#[derive(Debug)]
struct ShutdownSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Installs the handlers (inside a tokio runtime).
    fn new() -> std::io::Result<ShutdownSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(ShutdownSignals {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(ShutdownSignals {})
    }

    /// Resolves on the next SIGINT or SIGTERM.
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
