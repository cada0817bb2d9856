//! [`Collector`]: request-lifecycle hooks in, a [`ReplayReport`] and per-request records out.

use std::collections::BTreeMap;

use super::distribution::Distribution;
use super::report::{G2Figures, ReplayReport, RequestRecord, RequestStatus};
use super::sketch::QuantileSketch;
use crate::ids::{RequestId, WorkerId};
use crate::time::{SimDuration, SimTime};

/// O(1) lifecycle state of one request.
#[derive(Clone, Debug)]
struct RequestState {
    arrival: SimTime,
    input_length: usize,
    max_output: usize,
    session: Option<Box<str>>,
    turn: usize,
    worker: Option<WorkerId>,
    first_admit: Option<SimTime>,
    first_reused: usize,
    latest_reused: usize,
    latest_g2_reused: usize,
    kv_transfer: Option<SimDuration>,
    first_token: Option<SimTime>,
    second_token: Option<SimTime>,
    last_token: Option<SimTime>,
    num_tokens: u64,
    finished: Option<SimTime>,
    rejected: Option<SimTime>,
}

/// Ids up to this far beyond the dense table's end extend it; sparser ids go to a map.
const DENSE_SLACK: u64 = 1 << 16;

/// Records request lifecycle events and turns them into a [`ReplayReport`].
///
/// Hooks for ids that never arrived are ignored. Token gaps are streamed into sketches as they
/// happen, so the ITL and per-user figures include the gaps of requests that later do not complete
/// (Dynamo counts completed requests only; in a replay that runs to the end every request that
/// emits tokens completes).
#[derive(Clone, Debug, Default)]
pub struct Collector {
    /// Requests by id while ids are dense (the usual case: ids count up from 0).
    dense: Vec<Option<RequestState>>,
    /// Requests whose ids are far beyond the dense table.
    sparse: BTreeMap<u64, RequestState>,
    /// Every consecutive token gap (ms).
    itl: QuantileSketch,
    /// `1000 / gap_ms` for every positive gap: Dynamo's per-gap definition of
    /// `output_token_throughput_per_user`, not a per-request rate (see
    /// [`ReplayReport::output_token_throughput_per_user`]).
    per_user_throughput: QuantileSketch,
}

/// The state of request `id`, wherever it is stored.
fn lookup<'a>(
    dense: &'a mut [Option<RequestState>],
    sparse: &'a mut BTreeMap<u64, RequestState>,
    id: RequestId,
) -> Option<&'a mut RequestState> {
    match usize::try_from(id.0).ok().and_then(|i| dense.get_mut(i)) {
        Some(Some(state)) => Some(state),
        _ => sparse.get_mut(&id.0),
    }
}

fn ms(t: SimTime) -> f64 {
    t.as_millis_f64()
}

fn span_ms(later: SimTime, earlier: SimTime) -> f64 {
    later.saturating_since(earlier).as_millis_f64()
}

impl Collector {
    /// An empty collector.
    pub fn new() -> Collector {
        Collector::default()
    }

    /// A collector with room for requests `0..requests` (ids are usually dense from 0), so
    /// that its table does not stop to grow as they arrive.
    pub(crate) fn with_capacity(requests: usize) -> Collector {
        let mut c = Collector::default();
        c.dense.reserve(requests);
        c
    }

    fn get_mut(&mut self, id: RequestId) -> Option<&mut RequestState> {
        lookup(&mut self.dense, &mut self.sparse, id)
    }

    /// A request became ready to send at `t` (its latency clock starts here). A repeated
    /// arrival for the same id starts it over.
    pub fn on_arrival(
        &mut self,
        id: RequestId,
        t: SimTime,
        input_len: usize,
        max_output: usize,
        session: Option<&str>,
        turn: usize,
    ) {
        let state = RequestState {
            arrival: t,
            input_length: input_len,
            max_output,
            session: session.map(Box::from),
            turn,
            worker: None,
            first_admit: None,
            first_reused: 0,
            latest_reused: 0,
            latest_g2_reused: 0,
            kv_transfer: None,
            first_token: None,
            second_token: None,
            last_token: None,
            num_tokens: 0,
            finished: None,
            rejected: None,
        };
        let dense_len = self.dense.len() as u64;
        match usize::try_from(id.0) {
            Ok(i) if id.0 <= dense_len + DENSE_SLACK => {
                if i >= self.dense.len() {
                    self.dense.resize_with(i + 1, || None);
                }
                self.sparse.remove(&id.0);
                self.dense[i] = Some(state);
            }
            _ => {
                self.sparse.insert(id.0, state);
            }
        }
    }

    /// A worker admitted the request at `t` with `reused_tokens` prompt tokens already cached.
    /// Called again after a preemption; the first admission's reuse is kept separately.
    pub fn on_admit(&mut self, id: RequestId, t: SimTime, reused_tokens: usize, worker: WorkerId) {
        if let Some(s) = self.get_mut(id) {
            if s.first_admit.is_none() {
                s.first_admit = Some(t);
                s.first_reused = reused_tokens;
            }
            s.latest_reused = reused_tokens;
            s.worker = Some(worker);
        }
    }

    /// The admission just recorded by [`Collector::on_admit`] had `tokens` of its reused prompt
    /// tokens onboarded from the host tier (G2).
    pub(crate) fn on_g2_reuse(&mut self, id: RequestId, tokens: usize) {
        if let Some(s) = self.get_mut(id) {
            s.latest_g2_reused = tokens;
        }
    }

    /// Disaggregated mode: the request's prompt KV takes `duration` to reach its decode worker.
    pub(crate) fn on_kv_transfer(&mut self, id: RequestId, duration: SimDuration) {
        if let Some(s) = self.get_mut(id) {
            let total = s.kv_transfer.unwrap_or(SimDuration::ZERO) + duration;
            s.kv_transfer = Some(total);
        }
    }

    /// The request emitted one token at `t`.
    pub fn on_token(&mut self, id: RequestId, t: SimTime) {
        let Collector {
            dense,
            sparse,
            itl,
            per_user_throughput,
        } = self;
        let Some(s) = lookup(dense, sparse, id) else {
            return;
        };
        if let Some(prev) = s.last_token {
            let gap = span_ms(t, prev);
            itl.add(gap);
            if gap > 0.0 {
                per_user_throughput.add(1000.0 / gap);
            }
        }
        match s.num_tokens {
            0 => s.first_token = Some(t),
            1 => s.second_token = Some(t),
            _ => {}
        }
        s.last_token = Some(t);
        s.num_tokens += 1;
    }

    /// The request's whole answer arrived at `t` without generating a token (an embedding):
    /// its TTFT and end-to-end latency end at `t`, it adds no output token and no ITL gap.
    pub fn on_answer(&mut self, id: RequestId, t: SimTime) {
        if let Some(s) = self.get_mut(id) {
            s.first_token.get_or_insert(t);
            s.last_token = Some(t);
        }
    }

    /// The request finished (all tokens emitted, or stopped) at `t`.
    pub fn on_finish(&mut self, id: RequestId, t: SimTime) {
        if let Some(s) = self.get_mut(id) {
            s.finished = Some(t);
        }
    }

    /// The request was refused at `t`.
    pub fn on_reject(&mut self, id: RequestId, t: SimTime) {
        if let Some(s) = self.get_mut(id) {
            s.rejected = Some(t);
        }
    }

    /// The report and one record per request (in id order). `wall_time` is the host time the
    /// run took; it only feeds [`WALL_CLOCK_KEYS`](super::WALL_CLOCK_KEYS).
    pub fn finish(self, wall_time: std::time::Duration) -> (ReplayReport, Vec<RequestRecord>) {
        let Collector {
            dense,
            sparse,
            itl,
            per_user_throughput,
        } = self;
        let mut requests: Vec<(u64, RequestState)> = dense
            .into_iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i as u64, s)))
            .collect();
        if !sparse.is_empty() {
            requests.extend(sparse);
            requests.sort_by_key(|(id, _)| *id);
        }

        let mut report = ReplayReport {
            num_requests: requests.len() as u64,
            ..ReplayReport::default()
        };
        let (mut ttft, mut ttst, mut tpot, mut e2e) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut reused, mut first_reused, mut g2_reused) = (0u64, 0u64, 0u64);
        let mut duration_ms: f64 = 0.0;
        let mut records = Vec::with_capacity(requests.len());
        for (id, s) in requests {
            let completed = s.first_admit.is_some() && s.finished.is_some() && s.rejected.is_none();
            let status = if completed {
                RequestStatus::Completed
            } else if s.rejected.is_some() {
                RequestStatus::Rejected
            } else {
                RequestStatus::Incomplete
            };
            let ttft_ms = s.first_token.map(|t| span_ms(t, s.arrival));
            let ttst_ms = s
                .first_token
                .zip(s.second_token)
                .map(|(a, b)| span_ms(b, a));
            let e2e_ms = s.last_token.map(|t| span_ms(t, s.arrival));
            let itl_ms = match (s.first_token, s.last_token) {
                (Some(a), Some(b)) if s.num_tokens > 1 => {
                    Some(span_ms(b, a) / (s.num_tokens - 1) as f64)
                }
                _ => None,
            };
            report.rejected_requests += u64::from(status == RequestStatus::Rejected);
            if completed {
                report.completed_requests += 1;
                report.total_input_tokens += s.input_length as u64;
                report.total_output_tokens += s.num_tokens;
                reused += s.latest_reused as u64;
                first_reused += s.first_reused as u64;
                g2_reused += s.latest_g2_reused as u64;
                if let Some(t) = s.finished {
                    duration_ms = duration_ms.max(ms(t));
                }
                ttft.extend(ttft_ms);
                ttst.extend(ttst_ms);
                tpot.extend(itl_ms);
                e2e.extend(e2e_ms);
            }
            records.push(RequestRecord {
                request_id: id,
                session_id: s.session.map(String::from),
                turn_index: s.turn,
                worker: s.worker.map(|w| w.0),
                arrival_ms: ms(s.arrival),
                first_admit_ms: s.first_admit.map(ms),
                first_token_ms: s.first_token.map(ms),
                last_token_ms: s.last_token.map(ms),
                finish_ms: s.finished.or(s.rejected).map(ms),
                ttft_ms,
                ttst_ms,
                e2e_latency_ms: e2e_ms,
                itl_ms,
                input_length: s.input_length,
                output_length: s.num_tokens,
                max_output_tokens: s.max_output,
                reused_input_tokens: s.latest_reused,
                g2_reused_input_tokens: s.latest_g2_reused,
                kv_transfer_ms: s.kv_transfer.map(SimDuration::as_millis_f64),
                status,
            });
        }

        let duration_s = (duration_ms / 1000.0).max(1e-9);
        let wall_ms = wall_time.as_secs_f64() * 1000.0;
        let per_wall_s = |n: u64| {
            if wall_ms > 0.0 {
                n as f64 / wall_ms * 1000.0
            } else {
                0.0
            }
        };
        let ratio = |num: u64, den: u64| {
            if den > 0 {
                num as f64 / den as f64
            } else {
                0.0
            }
        };
        report.duration_ms = duration_ms;
        report.wall_time_ms = wall_ms;
        report.request_throughput_rps = report.completed_requests as f64 / duration_s;
        report.input_throughput_tok_s = report.total_input_tokens as f64 / duration_s;
        report.output_throughput_tok_s = report.total_output_tokens as f64 / duration_s;
        report.processed_tokens = report.total_input_tokens + report.total_output_tokens;
        report.total_throughput_tok_s = report.processed_tokens as f64 / duration_s;
        report.processed_tokens_per_s = per_wall_s(report.processed_tokens);
        report.processed_output_tokens_per_s = per_wall_s(report.total_output_tokens);
        report.prefix_cache_reused_ratio = ratio(reused, report.total_input_tokens);
        report.first_admission_prefix_cache_reused_ratio =
            ratio(first_reused, report.total_input_tokens);
        report.ttft = Distribution::from_samples(&mut ttft);
        report.ttst = Distribution::from_samples(&mut ttst);
        report.tpot = Distribution::from_samples(&mut tpot);
        report.e2e_latency = Distribution::from_samples(&mut e2e);
        report.itl = itl.distribution();
        report.output_token_throughput_per_user = per_user_throughput.distribution();
        // Filled in by the replay when G2 is on; the token count is only known here.
        report.g2 = Some(G2Figures {
            g2_reused_tokens: g2_reused,
            g2_prefix_cache_reused_ratio: ratio(g2_reused, report.total_input_tokens),
            ..G2Figures::default()
        })
        .filter(|_| g2_reused > 0);
        (report, records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::sketch::SKETCH_RELATIVE_ACCURACY;

    fn t_ms(ms: u64) -> SimTime {
        SimTime::from_micros(ms * 1000)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn an_answer_without_tokens_has_latency_and_no_gaps() {
        // An embedding: TTFT and E2E at the answer, no output token, no ITL; the report says so.
        let mut c = Collector::new();
        let id = RequestId(0);
        c.on_arrival(id, SimTime::ZERO, 100, 1, None, 0);
        c.on_admit(id, SimTime::ZERO, 0, WorkerId(0));
        c.on_answer(id, t_ms(7));
        c.on_finish(id, t_ms(7));
        let (r, records) = c.finish(std::time::Duration::from_millis(5));
        assert_eq!((r.ttft.mean, r.e2e_latency.mean), (7.0, 7.0));
        assert_eq!((r.total_output_tokens, r.completed_requests), (0, 1));
        assert_eq!((records[0].itl_ms, records[0].output_length), (None, 0));
        assert_eq!(r.output_throughput_tok_s, 0.0);
        let text = r.to_string();
        assert!(
            text.contains("(no output tokens: no TTST, TPOT or ITL)"),
            "{text}"
        );
        assert!(!text.contains("\n  ITL "), "{text}");
    }

    #[test]
    fn itl_uses_per_token_gaps() {
        // Dynamo's test_replay_itl_uses_per_token_gaps.
        let mut c = Collector::new();
        let id = RequestId(0);
        c.on_arrival(id, SimTime::ZERO, 100, 4, None, 0);
        c.on_admit(id, SimTime::ZERO, 0, WorkerId(0));
        for ms in [10, 11, 12, 110] {
            c.on_token(id, t_ms(ms));
        }
        c.on_finish(id, t_ms(110));
        let (r, records) = c.finish(std::time::Duration::from_millis(5));
        assert!(close(r.tpot.mean, 100.0 / 3.0));
        assert_eq!(r.itl.median, 1.0);
        assert_eq!(
            (r.itl.p75, r.itl.p90, r.itl.p95, r.itl.max),
            (98.0, 98.0, 98.0, 98.0)
        );
        assert_eq!(r.max_itl_ms(), 98.0);
        assert_eq!(r.ttst.mean, 1.0);
        assert_eq!(r.ttft.mean, 10.0);
        assert_eq!(r.e2e_latency.mean, 110.0);
        assert!(close(r.output_token_throughput_per_user.min, 1000.0 / 98.0));
        assert_eq!(r.output_token_throughput_per_user.max, 1000.0);
        assert_eq!(records[0].itl_ms, Some(100.0 / 3.0));
        assert_eq!(records[0].status, RequestStatus::Completed);
        assert_eq!(r.wall_time_ms, 5.0);
        assert!(close(r.processed_tokens_per_s, 104.0 / 5.0 * 1000.0));
    }

    #[test]
    fn two_request_report_by_hand() {
        let mut c = Collector::new();
        let (a, b) = (RequestId(0), RequestId(1));
        c.on_arrival(a, t_ms(0), 1000, 3, Some("s"), 0);
        c.on_arrival(b, t_ms(100), 3000, 2, Some("s"), 1);
        c.on_admit(a, t_ms(5), 0, WorkerId(0));
        c.on_admit(b, t_ms(100), 1000, WorkerId(1));
        for ms in [50, 60, 80] {
            c.on_token(a, t_ms(ms));
        }
        c.on_finish(a, t_ms(80));
        c.on_token(b, t_ms(300));
        // b is preempted and re-admitted with more reuse, then finishes.
        c.on_admit(b, t_ms(350), 2000, WorkerId(2));
        c.on_token(b, t_ms(400));
        c.on_finish(b, t_ms(400));
        let (r, records) = c.finish(std::time::Duration::from_millis(2));
        assert_eq!((r.num_requests, r.completed_requests), (2, 2));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (4000, 5));
        assert_eq!(r.duration_ms, 400.0);
        assert!(close(r.request_throughput_rps, 5.0));
        assert!(close(r.input_throughput_tok_s, 10_000.0));
        assert!(close(r.output_throughput_tok_s, 12.5));
        assert!(close(r.total_throughput_tok_s, 10_012.5));
        assert_eq!(r.processed_tokens, 4005);
        assert!(close(r.processed_tokens_per_s, 4005.0 / 2.0 * 1000.0));
        assert!(close(r.processed_output_tokens_per_s, 2500.0));
        assert!(close(r.prefix_cache_reused_ratio, 0.5));
        assert!(close(r.first_admission_prefix_cache_reused_ratio, 0.25));
        // TTFT a=50, b=200; E2E a=80, b=300; TTST a=10, b=100; TPOT a=15, b=100.
        assert_eq!((r.ttft.mean, r.ttft.min, r.ttft.max), (125.0, 50.0, 200.0));
        assert_eq!(r.ttft.median, 200.0); // rank round(0.5) = 1
        assert_eq!(r.ttft.std, 75.0);
        assert_eq!((r.e2e_latency.min, r.e2e_latency.max), (80.0, 300.0));
        assert_eq!((r.ttst.min, r.ttst.max), (10.0, 100.0));
        assert_eq!((r.tpot.min, r.tpot.max), (15.0, 100.0));
        // ITL gaps 10, 20, 100.
        assert!(close(r.itl.mean, 130.0 / 3.0));
        assert_eq!((r.itl.min, r.itl.max, r.max_itl_ms()), (10.0, 100.0, 100.0));
        assert!((r.itl.median - 20.0).abs() <= 20.0 * SKETCH_RELATIVE_ACCURACY);
        assert_eq!(records.len(), 2);
        let rb = &records[1];
        assert_eq!(rb.worker, Some(2));
        assert_eq!(rb.reused_input_tokens, 2000);
        assert_eq!(rb.session_id.as_deref(), Some("s"));
        assert_eq!(
            (rb.turn_index, rb.output_length, rb.max_output_tokens),
            (1, 2, 2)
        );
        assert_eq!(rb.first_admit_ms, Some(100.0));
        assert_eq!(rb.ttft_ms, Some(200.0));
    }

    #[test]
    fn rejected_and_incomplete_requests_are_counted_but_not_completed() {
        let mut c = Collector::new();
        c.on_arrival(RequestId(0), t_ms(0), 10, 2, None, 0);
        c.on_reject(RequestId(0), t_ms(1));
        c.on_arrival(RequestId(1), t_ms(0), 10, 2, None, 0);
        c.on_admit(RequestId(1), t_ms(1), 0, WorkerId(0));
        c.on_token(RequestId(1), t_ms(2));
        // Far-away id goes to the sparse map; unknown ids are ignored.
        c.on_arrival(RequestId(u64::MAX), t_ms(0), 10, 2, None, 0);
        c.on_token(RequestId(42), t_ms(3));
        c.on_finish(RequestId(43), t_ms(3));
        let (r, records) = c.finish(std::time::Duration::ZERO);
        assert_eq!((r.num_requests, r.completed_requests), (3, 0));
        assert_eq!(r.duration_ms, 0.0);
        assert_eq!(r.processed_tokens_per_s, 0.0);
        let statuses: Vec<_> = records.iter().map(|x| (x.request_id, x.status)).collect();
        assert_eq!(
            statuses,
            [
                (0, RequestStatus::Rejected),
                (1, RequestStatus::Incomplete),
                (u64::MAX, RequestStatus::Incomplete)
            ]
        );
        assert_eq!(records[0].finish_ms, Some(1.0));
        let line = serde_json::to_string(&records[0]).expect("serialises");
        assert!(line.contains("\"status\":\"rejected\""), "{line}");
        assert!(line.contains("\"first_token_ms\":null"), "{line}");
    }

    #[test]
    fn empty_collector_gives_zeros() {
        let (r, records) = Collector::new().finish(std::time::Duration::ZERO);
        assert!(records.is_empty());
        assert_eq!(r, ReplayReport::default());
        let json = serde_json::to_value(&r).expect("serialises");
        let obj = json.as_object().expect("object");
        assert!(obj.values().all(|v| v.as_f64() == Some(0.0)), "{json}");
    }

    #[test]
    fn wall_clock_free_reports_compare_equal() {
        let run = |wall_ms| {
            let mut c = Collector::new();
            c.on_arrival(RequestId(0), t_ms(0), 8, 1, None, 0);
            c.on_admit(RequestId(0), t_ms(0), 4, WorkerId(0));
            c.on_token(RequestId(0), t_ms(7));
            c.on_finish(RequestId(0), t_ms(7));
            c.finish(std::time::Duration::from_millis(wall_ms)).0
        };
        let (a, b) = (run(3), run(9));
        assert_ne!(a, b);
        let ja = serde_json::to_string(&a.without_wall_clock()).expect("json");
        let jb = serde_json::to_string(&b.without_wall_clock()).expect("json");
        assert_eq!(ja, jb);
    }

    #[test]
    fn display_shows_every_section() {
        let mut c = Collector::new();
        c.on_arrival(RequestId(0), t_ms(0), 8, 2, None, 0);
        c.on_admit(RequestId(0), t_ms(0), 0, WorkerId(0));
        c.on_token(RequestId(0), t_ms(7));
        c.on_token(RequestId(0), t_ms(9));
        c.on_finish(RequestId(0), t_ms(9));
        let text = c.finish(std::time::Duration::from_millis(1)).0.to_string();
        for needle in [
            "completed_requests",
            "prefix_cache_reused_ratio",
            "TTFT",
            "E2E",
            "p99",
            "tok/s/user",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        let ttft_row = text
            .lines()
            .find(|l| l.trim_start().starts_with("TTFT"))
            .expect("row");
        assert!(ttft_row.contains("7.000"), "{ttft_row}");
    }
}
