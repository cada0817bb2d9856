//! One endpoint's server ([`Harness`]): started on first use, each input sent to it one at a
//! time with its cost measured, the answer checked, the output limit compared with the body's,
//! and the engine's liveness probed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use mock_server::api::{app, AppState};
use mock_server::config::ServerConfig;
use serde_json::Value;
use tower::ServiceExt;

use super::answer::{check_answer, Answer, Generated};
use super::{Endpoint, LIVENESS_EVERY, MAX_RESPONSE_BYTES, TIMEOUT};
use crate::cost::{Spent, BODY_BUDGET};
use crate::meter::{charge_thread, Meter};

/// Bytes of a violating answer shown in the message.
const SHOWN_ANSWER_BYTES: usize = 4 << 10;

/// Longest an input waits for the previous one to the same server to finish.
const TURN_WAIT: Duration = Duration::from_secs(10);

/// A runtime and the server state living on it.
pub(super) struct Server {
    runtime: tokio::runtime::Runtime,
    router: Router,
    /// The output limit of a request without one, before the context cuts it.
    default_max_tokens: u64,
    /// The context length.
    max_model_len: u64,
}

impl Server {
    /// Starts a server with `flags` whose runtime threads are charged to `meter`.
    fn start(flags: &[&str], meter: &'static Meter) -> Server {
        let cli = match mock_server::Cli::try_parse_from(flags) {
            Ok(cli) => cli,
            Err(e) => panic!("the fuzzed server's flags do not parse: {e}"),
        };
        let config = match ServerConfig::from_args(&cli.serve) {
            Ok(config) => config,
            Err(e) => panic!("the fuzzed server's flags are invalid: {e}"),
        };
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(move || {
                charge_thread(Some(meter));
            })
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => panic!("cannot start a tokio runtime: {e}"),
        };
        let (default_max_tokens, max_model_len) = (
            config.default_max_tokens as u64,
            config.max_model_len as u64,
        );
        // The engine's driver task is spawned on the runtime that builds the state.
        let state = match runtime.block_on(async { AppState::new(config) }) {
            Ok(state) => state,
            Err(e) => panic!("the fuzzed server's engine settings are invalid: {e}"),
        };
        Server {
            runtime,
            router: app(state),
            default_max_tokens,
            max_model_len,
        }
    }

    /// Sends `body` and reads the whole answer, or says why it could not within `timeout`.
    fn exchange(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Answer, String> {
        let request = Request::post(endpoint.path())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_vec()))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let router = self.router.clone();
        let body_len = body.len();
        self.runtime.block_on(async move {
            let exchange = async {
                let response = router
                    .oneshot(request)
                    .await
                    .map_err(|e| format!("the router failed: {e}"))?;
                let status = response.status();
                let content_type = response
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the {status} body failed: {e}"))?
                    .to_bytes()
                    .to_vec();
                Ok(Answer {
                    status,
                    content_type,
                    body,
                })
            };
            tokio::time::timeout(timeout, exchange).await.map_err(|_| {
                format!(
                    "no complete answer within the time budget of {timeout:.1?} for a {}-byte \
                     body (hang, or work out of proportion to the body)",
                    body_len
                )
            })?
        })
    }
}

/// One endpoint's server, its input count and the meter of its cost.
pub(super) struct Harness {
    endpoint: Endpoint,
    /// The server's command line.
    flags: &'static [&'static str],
    /// Charged with the heap of the server's threads and of the thread sending a request.
    pub(super) meter: &'static Meter,
    /// `std` mutex: held only to take or replace the server, never across a request.
    server: Mutex<Option<Arc<Server>>>,
    /// Held while one input is measured: the meter counts one request at a time.
    turn: Mutex<()>,
    inputs: AtomicU64,
}

impl Harness {
    pub(super) const fn new(
        endpoint: Endpoint,
        flags: &'static [&'static str],
        meter: &'static Meter,
    ) -> Harness {
        Harness {
            endpoint,
            flags,
            meter,
            server: Mutex::new(None),
            turn: Mutex::new(()),
            inputs: AtomicU64::new(0),
        }
    }

    /// The running server, started (and warmed by one small request, so that what loads on
    /// first use is not charged to an input) when there is none.
    pub(super) fn server(&self) -> Arc<Server> {
        let mut slot = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = slot.as_ref() {
            return Arc::clone(server);
        }
        let server = Arc::new(Server::start(self.flags, self.meter));
        let probe = self.endpoint.probe();
        match server.exchange(self.endpoint, probe.as_bytes(), TIMEOUT) {
            Ok(answer) if answer.status == StatusCode::OK => {}
            Ok(answer) => panic!(
                "a new server answers a small valid request to {} with {}: {}",
                self.endpoint.path(),
                answer.status,
                String::from_utf8_lossy(&answer.body)
            ),
            Err(e) => panic!("a new server does not answer a small valid request: {e}"),
        }
        Arc::clone(slot.insert(server))
    }

    /// Waits for the previous input to this server to be measured.
    fn turn(&self) -> MutexGuard<'_, ()> {
        let started = Instant::now();
        loop {
            match self.turn.try_lock() {
                Ok(turn) => return turn,
                Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
                Err(TryLockError::WouldBlock) if started.elapsed() > TURN_WAIT => panic!(
                    "the previous input to {} has not returned for {TURN_WAIT:?}: its server \
                     is wedged",
                    self.endpoint.path()
                ),
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    /// Sends `data` and measures what it costs, one input at a time.
    fn measured_exchange(&self, server: &Server, data: &[u8]) -> (Result<Answer, String>, Spent) {
        let _turn = self.turn();
        let charged = charge_thread(Some(self.meter));
        self.meter.arm(BODY_BUDGET.ceiling_bytes(data.len()), data);
        let started = Instant::now();
        let answer = server.exchange(self.endpoint, data, BODY_BUDGET.time(data.len()));
        let spent = Spent {
            elapsed: started.elapsed(),
            peak_heap_bytes: self.meter.disarm(),
            answer_bytes: answer.as_ref().map_or(0, |answer| answer.body.len()),
        };
        charge_thread(charged);
        (answer, spent)
    }

    /// Drops the server (after a hang) so the next input starts a fresh one.
    fn discard(&self, server: Arc<Server>) {
        self.server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Ok(server) = Arc::try_unwrap(server) {
            // A wedged task would block an ordinary shutdown.
            server.runtime.shutdown_background();
        }
    }

    pub(super) fn check(&self, data: &[u8]) -> Spent {
        let server = self.server();
        let endpoint = self.endpoint;
        let (answer, spent) = self.measured_exchange(&server, data);
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                self.discard(server);
                let heap = match BODY_BUDGET.check(data.len(), &spent) {
                    Err(over) if over.starts_with("over the heap") => over,
                    _ => format!(
                        "within the heap budget: the heap grew by {} bytes of {}",
                        spent.peak_heap_bytes,
                        BODY_BUDGET.heap_bytes(data.len(), 0)
                    ),
                };
                panic!(
                    "POST {}: {e} (it gave up after {:.1?}); {heap}",
                    endpoint.path(),
                    spent.elapsed
                );
            }
        };
        let verdict = BODY_BUDGET
            .check(data.len(), &spent)
            .and_then(|()| check_answer(endpoint, &answer))
            .and_then(|generated| server.check_limit(data, generated));
        if let Err(e) = verdict {
            let shown = &answer.body[..answer.body.len().min(SHOWN_ANSWER_BYTES)];
            panic!(
                "POST {}: {e}\nstatus {}, content-type {:?}, body ({} bytes{}):\n{}",
                endpoint.path(),
                answer.status,
                answer.content_type,
                answer.body.len(),
                if shown.len() < answer.body.len() {
                    format!(", the first {} shown", shown.len())
                } else {
                    String::new()
                },
                String::from_utf8_lossy(shown)
            );
        }
        let n = self.inputs.fetch_add(1, Ordering::Relaxed) + 1;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE || n % LIVENESS_EVERY == 0 {
            let probe = endpoint.probe();
            let answer = server.exchange(endpoint, probe.as_bytes(), TIMEOUT);
            let verdict = answer.and_then(|answer| match answer.status {
                StatusCode::OK => check_answer(endpoint, &answer)
                    .and_then(|generated| server.check_limit(probe.as_bytes(), generated)),
                status => Err(format!(
                    "got {status}: {}",
                    String::from_utf8_lossy(&answer.body)
                )),
            });
            if let Err(e) = verdict {
                self.discard(server);
                panic!(
                    "the engine stopped answering after this input or one of the {} before it: \
                     a small valid request to {} failed: {e}",
                    LIVENESS_EVERY - 1,
                    endpoint.path()
                );
            }
        }
        spent
    }
}

impl Server {
    /// A completed answer has exactly the output limit the request body asks for.
    fn check_limit(&self, body: &[u8], generated: Option<Generated>) -> Result<(), String> {
        let (Some(generated), Some(requested)) = (generated, requested_limit(body)) else {
            return Ok(());
        };
        let expected = match (requested, generated.prompt_tokens) {
            (Some(limit), _) => limit,
            (None, Some(prompt)) => self
                .default_max_tokens
                .min(self.max_model_len.saturating_sub(prompt)),
            (None, None) => return Ok(()),
        };
        let (count, all_length) = (generated.choices, generated.all_length);
        if count > 1 && requested.is_none() {
            // Each prompt of a batch has its own default limit: not told from the sum.
            return Ok(());
        }
        let limit = expected * count;
        match (all_length, generated.completion_tokens) {
            (true, n) if n == limit => Ok(()),
            (false, n) if n <= limit => Ok(()),
            (_, n) => Err(format!(
                "{n} completion tokens over {count} choice(s), but the output limit is \
                 {expected} per choice (all at the limit: {all_length})"
            )),
        }
    }
}

/// The output limit a body sets: `Some(None)` when it sets none, `None` when that cannot be
/// told (not a JSON object, or a limit that is not a count).
fn requested_limit(body: &[u8]) -> Option<Option<u64>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let field = |key: &str| object.get(key).filter(|v| !v.is_null());
    match field("max_completion_tokens").or_else(|| field("max_tokens")) {
        Some(limit) => Some(Some(limit.as_u64()?)),
        None => Some(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_limit_is_read_as_the_server_reads_it() {
        assert_eq!(requested_limit(br#"{"max_tokens": 5}"#), Some(Some(5)));
        assert_eq!(
            requested_limit(br#"{"max_tokens": 5, "max_completion_tokens": 7}"#),
            Some(Some(7))
        );
        assert_eq!(
            requested_limit(br#"{"max_tokens": 5, "max_completion_tokens": null}"#),
            Some(Some(5))
        );
        assert_eq!(requested_limit(br#"{"model": "m"}"#), Some(None));
        assert_eq!(requested_limit(br#"{"max_tokens": 5.5}"#), None);
        assert_eq!(requested_limit(b"[1]"), None);
    }
}
