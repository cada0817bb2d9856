//! The accept loop under [`crate::cmd::serve::serve`]: [`Edge`] serves each accepted socket as one
//! HTTP/1.1 connection (hyper, `TCP_NODELAY`) under the connection-level [`HttpLimits`], and
//! drains on shutdown.
//!
//! - **Header-read and idle deadlines.** Each connection's `Activity` tracks whether a
//!   request is in progress, when the connection last went idle and when the next request's
//!   first byte arrived. With no request in progress, the connection is closed at
//!   `first byte (or accept) + header_read_timeout`, or at `idle since + idle_timeout` while no
//!   byte has come. A request in progress has no deadline here: its body has one in the router
//!   ([`crate::api::layer::edge_limits`]), and a stream runs as long as generation does.
//! - **Connection cap.** Past `max_connections` open connections, a new one is answered
//!   `503` (OpenAI body, `Connection: close`) to its first request and closed; past
//!   [`MAX_REJECTING`] such answers at once, it is closed unanswered.
//! - **Lingering close.** When the server ends a connection after a response, it half-closes
//!   the socket and reads (and drops) what the client still sends for up to [`LINGER`], so a
//!   client still sending an oversized body reads the `413` rather than a reset.
//! - **Drain.** On shutdown the listener closes, idle connections close, responses in progress
//!   end with `Connection: close` (when their head is not yet sent) and close after. After
//!   `shutdown_timeout` the generations still running are stopped (each stream ends with an
//!   error event and `data: [DONE]`); after [`SHUTDOWN_FLUSH`] more, whatever is left is dropped.
//!
//! hyper answers a request it cannot parse itself, before any service sees it, with an empty
//! body: `400` (bad request line or header), `431` (head over its ~400 KiB buffer or more than
//! 100 headers), `414`. Those are the only responses without an OpenAI error body.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, Response};
use axum::response::IntoResponse;
use axum::Router;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::api::ApiError;
use crate::config::HttpLimits;

/// Connections over `max_connections` that may be answering their `503` at once; a connection
/// beyond that is closed unanswered.
pub(crate) const MAX_REJECTING: usize = 256;

/// After the shutdown deadline stops the open generations, how long their final events may
/// take to reach the clients before the remaining connections are dropped.
pub(crate) const SHUTDOWN_FLUSH: Duration = Duration::from_secs(1);

/// After the server ends a connection, how long it keeps reading (and dropping) what the client
/// still sends, so that the client reads the response instead of a connection reset.
pub(crate) const LINGER: Duration = Duration::from_secs(2);

/// Pause after an accept error that is not about one peer (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The HTTP server: what every connection shares.
#[derive(Clone, Debug)]
pub(crate) struct Edge {
    /// The API.
    pub router: Router,
    /// Connection limits and the drain deadline.
    pub limits: HttpLimits,
    /// Cancelled at the drain deadline to end the generations still running
    /// ([`crate::api::AppState::stop_generations`]).
    pub stop_generations: CancellationToken,
}

/// Why a connection was accepted: to be served, or to be told the server is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    Serve,
    Reject,
}

/// What one connection task needs.
#[derive(Debug)]
struct Shared {
    service: TowerToHyperService<Router>,
    limits: HttpLimits,
    /// Cancelled when shutdown begins: every connection finishes its request and closes.
    drain: CancellationToken,
}

impl Edge {
    /// Accepts connections on `listener` until `shutdown` resolves, then drains (see the module
    /// docs) and returns once every connection has ended.
    pub(crate) async fn run(self, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        let Edge {
            router,
            limits,
            stop_generations,
        } = self;
        let shutdown_timeout = limits.shutdown_timeout;
        let open = Arc::new(Semaphore::new(limits.max_connections));
        let rejecting = Arc::new(Semaphore::new(MAX_REJECTING));
        let shared = Arc::new(Shared {
            service: TowerToHyperService::new(router),
            limits,
            drain: CancellationToken::new(),
        });
        let mut connections = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => break,
                // Reap finished connection tasks so the set stays the size of the open ones.
                Some(_) = connections.join_next() => continue,
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    let (admission, permit) = match Arc::clone(&open).try_acquire_owned() {
                        Ok(permit) => (Admission::Serve, permit),
                        Err(_) => match Arc::clone(&rejecting).try_acquire_owned() {
                            Ok(permit) => (Admission::Reject, permit),
                            // Dropping the socket closes it.
                            Err(_) => continue,
                        },
                    };
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        connection(stream, shared, admission).await;
                        // Held for the connection's life, lingering included.
                        drop(permit);
                    });
                }
                Err(e) if is_peer_error(&e) => {}
                Err(e) => {
                    eprintln!("mockserve: accepting a connection failed: {e}; retrying");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            }
        }
        // Stop accepting: new connections are refused from here on.
        drop(listener);
        shared.drain.cancel();
        let deadline = Instant::now() + shutdown_timeout;
        while let Ok(Some(_)) = timeout_at(deadline, connections.join_next()).await {}
        if connections.is_empty() {
            return;
        }
        stop_generations.cancel();
        let flushed = Instant::now() + SHUTDOWN_FLUSH;
        while let Ok(Some(_)) = timeout_at(flushed, connections.join_next()).await {}
        connections.shutdown().await;
    }
}

/// Accept errors about one connection (the next accept may well succeed at once).
fn is_peer_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
    )
}

/// Serves one socket until the client or a deadline ends it, then closes it lingering.
async fn connection(stream: TcpStream, shared: Arc<Shared>, admission: Admission) {
    // Without TCP_NODELAY, Nagle plus delayed ACK stalls streamed chunks by ~40 ms.
    let _ = stream.set_nodelay(true);
    let reject = admission == Admission::Reject;
    let activity = Arc::new(Activity::new(Instant::now()));
    let io = TokioIo::new(Watched {
        stream,
        activity: Arc::clone(&activity),
    });
    let service = EdgeService {
        shared: Arc::clone(&shared),
        activity: Arc::clone(&activity),
        reject,
    };
    let mut conn = http1::Builder::new()
        .keep_alive(!reject)
        // The header-read deadline is the connection task's (below), told apart from idling.
        .header_read_timeout(None)
        .serve_connection(io, service);
    let limits = &shared.limits;
    let mut draining = false;
    loop {
        let deadline = activity.deadline(limits);
        let expiry = async move {
            match deadline {
                Some(at) => sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            // Errors here are the client's (gone, or a request hyper could not parse and has
            // answered); either way the connection is over.
            _ = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => break,
            () = shared.drain.cancelled(), if !draining => {
                draining = true;
                Pin::new(&mut conn).graceful_shutdown();
            }
            () = activity.changed.notified() => {}
            () = expiry => {
                if activity.deadline(limits).is_some_and(|at| at <= Instant::now()) {
                    // Dropping the connection closes the socket.
                    return;
                }
            }
        }
    }
    let stream = conn.into_parts().io.into_inner().stream;
    linger(stream).await;
}

/// Half-closes `stream` and drops what the client still sends until it closes too or
/// [`LINGER`] passes, so that the response is read rather than reset.
async fn linger(mut stream: TcpStream) {
    if std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx))
        .await
        .is_err()
    {
        return;
    }
    let deadline = Instant::now() + LINGER;
    let mut sink = vec![0u8; 16 << 10];
    while let Ok(Ok(())) = timeout_at(deadline, stream.readable()).await {
        match stream.try_read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// The per-connection service: the router (or the over-the-cap `503`), with each request
/// counted in the connection's [`Activity`] until its response body is done.
#[derive(Debug)]
struct EdgeService {
    shared: Arc<Shared>,
    activity: Arc<Activity>,
    /// The connection is over `max_connections`: answer 503 and close.
    reject: bool,
}

impl Service<Request<Incoming>> for EdgeService {
    type Response = Response<Tracked>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Tracked>, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let guard = RequestGuard::begin(Arc::clone(&self.activity));
        if self.reject {
            let response =
                ApiError::too_many_connections(self.shared.limits.max_connections).into_response();
            return Box::pin(std::future::ready(Ok(Tracked::wrap(response, guard))));
        }
        let response = self.shared.service.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(Tracked::wrap(response, guard))
        })
    }
}

/// A response body that keeps its request counted as in progress until hyper drops it (sent,
/// or the client went away).
#[derive(Debug)]
struct Tracked {
    body: Body,
    _guard: RequestGuard,
}

impl Tracked {
    fn wrap(response: Response<Body>, guard: RequestGuard) -> Response<Tracked> {
        response.map(|body| Tracked {
            body,
            _guard: guard,
        })
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// One request in progress on a connection: begun when hyper hands it to the service, ended
/// when dropped.
#[derive(Debug)]
struct RequestGuard(Arc<Activity>);

impl RequestGuard {
    fn begin(activity: Arc<Activity>) -> RequestGuard {
        activity.lock().request_began();
        RequestGuard(activity)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.lock().request_ended(Instant::now());
        self.0.changed.notify_one();
    }
}

/// What one connection is doing, as far as its deadlines care. Shared by its socket (bytes
/// read), its service (requests begun and answered) and its task (which sleeps until the
/// deadline).
#[derive(Debug)]
struct Activity {
    /// std `Mutex`: held for a few assignments, never across an `.await`.
    phase: Mutex<Phase>,
    /// Woken when the deadline may have moved earlier (a request's first byte) or appeared (a
    /// response ended), so the connection task sleeps on the right deadline.
    changed: Notify,
}

impl Activity {
    fn new(accepted: Instant) -> Activity {
        Activity {
            phase: Mutex::new(Phase::new(accepted)),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // The phase is a few plain fields, valid even after a panic elsewhere.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deadline(&self, limits: &HttpLimits) -> Option<Instant> {
        self.lock().deadline(limits)
    }

    /// The socket returned bytes.
    fn bytes_read(&self) {
        if self.lock().bytes_read(Instant::now()) {
            self.changed.notify_one();
        }
    }
}

/// The deadline state machine of one connection (pure; [`Activity`] shares it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Phase {
    /// Requests being served: handed to the service, response body not yet done.
    in_flight: usize,
    /// When the connection last went idle (the end of a response, or the accept).
    idle_since: Instant,
    /// When the next request's head began: its first byte, or the accept for the first
    /// request (whose header deadline runs from the accept).
    head_since: Option<Instant>,
}

impl Phase {
    fn new(accepted: Instant) -> Phase {
        Phase {
            in_flight: 0,
            idle_since: accepted,
            head_since: Some(accepted),
        }
    }

    /// When the connection is to be closed, if nothing happens before; `None` while a request
    /// is in progress.
    fn deadline(&self, limits: &HttpLimits) -> Option<Instant> {
        if self.in_flight > 0 {
            None
        } else if let Some(head) = self.head_since {
            Some(head + limits.header_read_timeout)
        } else {
            Some(self.idle_since + limits.idle_timeout)
        }
    }

    /// Bytes arrived; true when they start a request's head (the deadline moved).
    fn bytes_read(&mut self, now: Instant) -> bool {
        let starts_head = self.in_flight == 0 && self.head_since.is_none();
        if starts_head {
            self.head_since = Some(now);
        }
        starts_head
    }

    fn request_began(&mut self) {
        self.in_flight += 1;
        self.head_since = None;
    }

    fn request_ended(&mut self, now: Instant) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            self.idle_since = now;
            self.head_since = None;
        }
    }
}

/// The socket, reporting to the connection's [`Activity`] when bytes arrive.
#[derive(Debug)]
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.bytes_read();
        }
        poll
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> HttpLimits {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(100),
            ..HttpLimits::default()
        }
    }

    #[test]
    fn phase_deadlines_follow_the_request_cycle() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let limits = limits();
        let mut phase = Phase::new(t0);
        // A fresh connection has the header deadline from its accept; its bytes keep it.
        assert_eq!(phase.deadline(&limits), Some(t0 + s(10)));
        assert!(!phase.bytes_read(t0 + s(3)));
        assert_eq!(phase.deadline(&limits), Some(t0 + s(10)));
        // A request in progress has no deadline, whatever it reads.
        phase.request_began();
        assert_eq!(phase.deadline(&limits), None);
        assert!(!phase.bytes_read(t0 + s(4)));
        assert_eq!(phase.deadline(&limits), None);
        // Answered: idle deadline from the end of the response.
        phase.request_ended(t0 + s(50));
        assert_eq!(phase.deadline(&limits), Some(t0 + s(150)));
        // The next request's first byte: header deadline from that byte, earlier than idle.
        assert!(phase.bytes_read(t0 + s(60)));
        assert_eq!(phase.deadline(&limits), Some(t0 + s(70)));
        assert!(!phase.bytes_read(t0 + s(65)));
        assert_eq!(phase.deadline(&limits), Some(t0 + s(70)));
        phase.request_began();
        phase.request_ended(t0 + s(80));
        assert_eq!(phase.deadline(&limits), Some(t0 + s(180)));
    }

    #[test]
    fn overlapping_requests_keep_the_connection_busy() {
        let t0 = Instant::now();
        let limits = limits();
        let mut phase = Phase::new(t0);
        phase.request_began();
        phase.request_began();
        phase.request_ended(t0);
        assert_eq!(phase.deadline(&limits), None);
        phase.request_ended(t0 + Duration::from_secs(1));
        assert_eq!(phase.deadline(&limits), Some(t0 + Duration::from_secs(101)));
        // An extra end (cannot happen) does not underflow.
        phase.request_ended(t0);
        assert_eq!(phase.in_flight, 0);
    }
}
