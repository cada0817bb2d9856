//! The fleet's admin routes as a target ([`fleet_admin`]): fuzzed bytes as one request to the
//! admin listener of a `mockserve fleet` ([`FLEET_FLAGS`]: four workers, `--api-key`), sent
//! through [`mock_server::fleet::RunningFleet::admin_router`] with `tower::ServiceExt::oneshot`.
//!
//! An input is a request line, then the body: `METHOD TARGET\nBODY`
//! (`POST /fleet/workers/1/fault\n{"state": "down"}`). The request carries the fleet's key
//! unless the line starts with `!`. A line that is no method and target is skipped (hyper
//! answers those itself). The fleet's decision log holds [`SEEDED_DECISIONS`] decisions, more
//! than a page, before the first input. Properties, for every request:
//!
//! - it costs no more than its [`BODY_BUDGET`] (heap and time, as the body targets'), and its
//!   answer is at most [`MAX_RESPONSE_BYTES`];
//! - without the key, the answer is a 401 `invalid_api_key`, whatever the route;
//! - never a 5xx; every other status but a 2xx has the OpenAI error body, with a message of
//!   at most [`MAX_MESSAGE_BYTES`] (no message echoes the request's values whole);
//! - a 200 of `GET /fleet/decisions` is at most `MAX_DECISIONS_PAGE` decisions of consecutive
//!   numbers, each a whole `Decision`, and its `x-fleet-next-since` is the last number + 1;
//! - every [`LIVENESS_EVERY`] inputs, `GET /health` with the key still answers 200.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode, Uri};
use axum::Router;
use clap::Parser;
use http_body_util::BodyExt;
use mock_server::fleet::judge::{Decision, MAX_DECISIONS_PAGE};
use mock_server::fleet::{launch, FleetConfig, RunningFleet};
use mock_server::{Cli, Command};
use serde_json::Value;
use tower::ServiceExt;

use crate::cost::{Spent, BODY_BUDGET};
use crate::http::{check_error_body, LIVENESS_EVERY, MAX_RESPONSE_BYTES, TIMEOUT};
use crate::meter::{charge_thread, Meter};

/// The fuzzed fleet's command line.
pub const FLEET_FLAGS: &[&str] = &[
    "mockserve",
    "fleet",
    "--workers",
    "4",
    "--port",
    "0",
    "--host",
    "127.0.0.1",
    "--admin-port",
    "0",
    "--speedup-ratio",
    "inf",
    "--api-key",
    FLEET_KEY,
    "--decision-log-size",
    "30000",
];

/// The fuzzed fleet's `--api-key`.
pub const FLEET_KEY: &str = "fuzz-key";

/// Decisions in the log before the first input: two pages and some.
pub const SEEDED_DECISIONS: u64 = 25_000;

/// The longest error message an admin answer may carry.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// Bytes of a violating answer shown in the message.
const SHOWN_ANSWER_BYTES: usize = 2 << 10;

/// A runtime and the fleet living on it.
struct Fleet {
    runtime: tokio::runtime::Runtime,
    /// Keeps the fleet's listeners and engine running.
    _running: RunningFleet,
    router: Router,
}

/// The fleet, started on first use. `std` mutex: held for one input at a time, so the meter
/// counts one request at a time.
static FLEET: Mutex<Option<Fleet>> = Mutex::new(None);
static METER: Meter = Meter::new("fleet_admin");
static INPUTS: AtomicU64 = AtomicU64::new(0);

impl Fleet {
    fn start() -> Fleet {
        let cli = match Cli::try_parse_from(FLEET_FLAGS) {
            Ok(cli) => cli,
            Err(e) => panic!("the fuzzed fleet's flags do not parse: {e}"),
        };
        let Some(Command::Fleet(args)) = cli.command else {
            panic!("the fuzzed fleet's flags are no fleet");
        };
        let config = match FleetConfig::from_args(&args) {
            Ok(config) => config,
            Err(e) => panic!("the fuzzed fleet's flags are invalid: {e}"),
        };
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(|| {
                charge_thread(Some(&METER));
            })
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => panic!("cannot start a tokio runtime: {e}"),
        };
        let running = match runtime.block_on(launch(config)) {
            Ok(running) => running,
            Err(e) => panic!("the fuzzed fleet does not start: {e}"),
        };
        for seq in 0..SEEDED_DECISIONS {
            let worker = (seq % 4) as u32;
            running.judge.record(Decision {
                seq: 0,
                time_ms: 1.7e12 + seq as f64,
                worker,
                prompt_tokens: 100,
                chosen_overlap_tokens: 16 * worker as usize,
                best_overlap_tokens: 48,
                best_worker: 3,
                regret_tokens: 48 - 16 * worker as usize,
                chosen_load: worker,
                best_load: 0,
                announced_chosen_overlap_tokens: None,
                announced_best_overlap_tokens: None,
                stale_evicted: false,
                stale_missed: seq % 7 == 0,
            });
        }
        let router = running.admin_router();
        Fleet {
            runtime,
            _running: running,
            router,
        }
    }

    /// Sends `request` and reads the whole answer within `timeout`: status, the next-page
    /// header, the body.
    fn exchange(
        &self,
        request: Request<Body>,
        timeout: Duration,
    ) -> Result<(StatusCode, Option<u64>, Vec<u8>), String> {
        let router = self.router.clone();
        self.runtime.block_on(async move {
            let exchange = async {
                let response = router
                    .oneshot(request)
                    .await
                    .map_err(|e| format!("the router failed: {e}"))?;
                let status = response.status();
                let next = response
                    .headers()
                    .get("x-fleet-next-since")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                let body = http_body_util::Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the {status} body failed: {e}"))?
                    .to_bytes()
                    .to_vec();
                Ok((status, next, body))
            };
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| format!("no complete answer within {timeout:.1?} (hang)"))?
        })
    }
}

/// The request an input describes, whether it carries the key, and its path; `None` when
/// its first line is no method and target.
fn request_of(data: &[u8]) -> Option<(Request<Body>, bool, String)> {
    let (line, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let (keyed, line) = match line.strip_prefix(b"!") {
        Some(rest) => (false, rest),
        None => (true, line),
    };
    let space = line.iter().position(|&b| b == b' ')?;
    let method = Method::from_bytes(&line[..space]).ok()?;
    let uri = Uri::try_from(&line[space + 1..]).ok()?;
    if uri.scheme().is_some() || !uri.path().starts_with('/') {
        return None;
    }
    let path = uri.path().to_string();
    let mut request = Request::builder().method(method).uri(uri);
    if keyed {
        request = request.header(header::AUTHORIZATION, format!("Bearer {FLEET_KEY}"));
    }
    let request = request.body(Body::from(body.to_vec())).ok()?;
    Some((request, keyed, path))
}

/// Checks an admin answer against the properties of the module docs.
fn check_answer(
    keyed: bool,
    path: &str,
    (status, next, body): &(StatusCode, Option<u64>, Vec<u8>),
) -> Result<(), String> {
    if status.is_server_error() {
        return Err(format!("status {status}: an admin route answered a 5xx"));
    }
    if !status.is_success() {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| format!("a {status} body is not JSON: {e}"))?;
        check_error_body(&value).map_err(|e| format!("{status}: {e}"))?;
        let message = value["error"]["message"].as_str().unwrap_or_default();
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(format!(
                "a {}-byte error message (at most {MAX_MESSAGE_BYTES}): it echoes the request",
                message.len()
            ));
        }
    }
    if !keyed {
        let code = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
        if *status != StatusCode::UNAUTHORIZED || code.as_deref() != Some("invalid_api_key") {
            return Err(format!(
                "a request without the key got {status} ({code:?}), not a 401 invalid_api_key"
            ));
        }
    }
    if *status == StatusCode::OK && path == "/fleet/decisions" {
        check_page(body, *next)?;
    }
    Ok(())
}

/// A page of decisions: at most a page of whole decisions, consecutive, and the next page's
/// `since` after the last.
fn check_page(body: &[u8], next: Option<u64>) -> Result<(), String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("a page is not UTF-8: {e}"))?;
    let mut seqs = Vec::new();
    for line in text.lines() {
        let decision: Decision =
            serde_json::from_str(line).map_err(|e| format!("a page line is no decision: {e}"))?;
        seqs.push(decision.seq);
    }
    if seqs.len() > MAX_DECISIONS_PAGE {
        return Err(format!(
            "a page of {} decisions (at most {MAX_DECISIONS_PAGE})",
            seqs.len()
        ));
    }
    if seqs.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err("a page's decisions are not consecutive".into());
    }
    let Some(next) = next else {
        return Err("a page without x-fleet-next-since".into());
    };
    match seqs.last() {
        Some(&last) if next != last + 1 => {
            Err(format!("x-fleet-next-since {next} after decision {last}"))
        }
        _ => Ok(()),
    }
}

/// Checks one admin request (see the module docs for the input and the properties).
pub fn fleet_admin(data: &[u8]) {
    let Some((request, keyed, path)) = request_of(data) else {
        return;
    };
    let method = request.method().clone();
    let mut slot = FLEET.lock().unwrap_or_else(PoisonError::into_inner);
    let fleet = slot.get_or_insert_with(Fleet::start);
    let charged = charge_thread(Some(&METER));
    METER.arm(BODY_BUDGET.ceiling_bytes(data.len()), data);
    let started = Instant::now();
    let answer = fleet.exchange(request, BODY_BUDGET.time(data.len()));
    let spent = Spent {
        elapsed: started.elapsed(),
        peak_heap_bytes: METER.disarm(),
        answer_bytes: answer.as_ref().map_or(0, |(_, _, body)| body.len()),
    };
    charge_thread(charged);
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            // A wedged fleet would fail every later input: the next one starts afresh.
            if let Some(fleet) = slot.take() {
                fleet.runtime.shutdown_background();
            }
            panic!("{method} {path}: {e}");
        }
    };
    let verdict = BODY_BUDGET
        .check(data.len(), &spent)
        .and_then(|()| check_answer(keyed, &path, &answer));
    if let Err(e) = verdict {
        let (status, _, body) = &answer;
        let shown = &body[..body.len().min(SHOWN_ANSWER_BYTES)];
        panic!(
            "{method} {path}: {e}\nstatus {status}, body ({} bytes):\n{}",
            body.len(),
            String::from_utf8_lossy(shown)
        );
    }
    if INPUTS.fetch_add(1, Ordering::Relaxed) % LIVENESS_EVERY == LIVENESS_EVERY - 1 {
        let probe = Request::get("/health")
            .header(header::AUTHORIZATION, format!("Bearer {FLEET_KEY}"))
            .body(Body::empty());
        let answer = probe
            .map_err(|e| e.to_string())
            .and_then(|probe| fleet.exchange(probe, TIMEOUT));
        match answer {
            Ok((StatusCode::OK, _, _)) => {}
            Ok((status, _, body)) => panic!(
                "the fleet's /health answered {status} after this input or one of the {} \
                 before it: {}",
                LIVENESS_EVERY - 1,
                String::from_utf8_lossy(&body)
            ),
            Err(e) => panic!("the fleet's /health failed after this input: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_line_and_the_key_are_read_from_the_input() {
        let (request, keyed, path) =
            request_of(b"POST /fleet/workers/1/fault\n{\"state\":\"ok\"}").expect("a request");
        assert!(keyed);
        assert_eq!(request.method(), Method::POST);
        assert_eq!(path, "/fleet/workers/1/fault");
        let (request, keyed, _) = request_of(b"!GET /fleet/decisions?limit=3").expect("one");
        assert!(!keyed);
        assert!(request.headers().get(header::AUTHORIZATION).is_none());
        assert!(request_of(b"GET").is_none());
        assert!(request_of(b"GET http://x/").is_none());
    }

    #[test]
    fn admin_requests_pass_the_checker() {
        fleet_admin(b"GET /fleet/decisions?since=10&limit=5");
        fleet_admin(b"GET /fleet/decisions");
        fleet_admin(b"!POST /fleet/workers/1/fault\n{\"state\":\"down\"}");
        fleet_admin(b"POST /fleet/workers/+1/fault\n{\"state\":\"down\"}");
        fleet_admin(b"POST /fleet/workers/2/fault\n{\"state\":\"slow\",\"factor\":2}");
        fleet_admin(b"POST /fleet/workers/2/fault\n{\"state\":\"ok\"}");
        fleet_admin(b"GET /metrics");
    }
}
