//! Goodput: the share and rate of requests that meet the service-level objectives of `--slo`
//! (the grammar is the engine's, `servesim::slo`, shared with `mockserve plan`).

use serde::Serialize;

use crate::report::replay_report::LiveRecord;

pub use servesim::slo::Slo;

/// Goodput figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Goodput {
    /// Requests meeting every SLO.
    pub good_requests: usize,
    /// Requests counted (errors included).
    pub total_requests: usize,
    /// good / total.
    pub share: f64,
    /// good per second of the measured window.
    pub rate_rps: f64,
}

/// Goodput of `records` over `duration_s` (errors count as misses).
pub fn goodput(slo: &Slo, records: &[LiveRecord], duration_s: f64) -> Goodput {
    let good = records
        .iter()
        .filter(|r| r.error.is_none() && slo.met(&r.record))
        .count();
    Goodput {
        good_requests: good,
        total_requests: records.len(),
        share: if records.is_empty() {
            0.0
        } else {
            good as f64 / records.len() as f64
        },
        rate_rps: if duration_s > 0.0 {
            good as f64 / duration_s
        } else {
            0.0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use servesim::metrics::{RequestRecord, RequestStatus};

    fn rec(ttft: f64, itl: Option<f64>, e2e: f64, ok: bool) -> LiveRecord {
        LiveRecord {
            record: RequestRecord {
                request_id: 0,
                session_id: None,
                turn_index: 0,
                worker: None,
                arrival_ms: 0.0,
                first_admit_ms: None,
                first_token_ms: None,
                last_token_ms: None,
                finish_ms: None,
                ttft_ms: ok.then_some(ttft),
                ttst_ms: None,
                e2e_latency_ms: ok.then_some(e2e),
                itl_ms: itl,
                input_length: 1,
                output_length: 1,
                max_output_tokens: 1,
                reused_input_tokens: 0,
                g2_reused_input_tokens: 0,
                kv_transfer_ms: None,
                status: if ok {
                    RequestStatus::Completed
                } else {
                    RequestStatus::Rejected
                },
            },
            scheduled_ms: 0.0,
            sent_ms: 0.0,
            schedule_lag_ms: 0.0,
            prompt_tokens: None,
            expected_reused_tokens: None,
            chunks: 1,
            usage_output_tokens: Some(1),
            usage_mismatch: false,
            error: (!ok).then(|| "HTTP 500".to_string()),
            error_kind: (!ok).then_some("http"),
            error_status: (!ok).then_some(500),
            finish_reason: None,
            engine_ttft_ms: None,
            engine_e2e_ms: None,
            raw: Default::default(),
            agentic: None,
        }
    }

    #[test]
    fn slo_parsing_and_goodput_arithmetic() {
        let slo: Slo = "ttft=200ms,itl=50ms,e2e=10s".parse().expect("valid");
        assert_eq!(
            slo,
            Slo {
                ttft_ms: Some(200.0),
                itl_ms: Some(50.0),
                e2e_ms: Some(10_000.0),
                trajectory_e2e_ms: None,
            }
        );
        assert_eq!(
            "ttft=fast".parse::<Slo>().map_err(|e| e.to_string()),
            Err(r#"--slo: ttft: "fast" is not a number of us, ms or s"#.to_string())
        );
        assert_eq!(
            "e2e=-2s".parse::<Slo>().map_err(|e| e.to_string()),
            Err(r#"--slo: e2e: "-2s" must be a finite duration >= 0"#.to_string())
        );
        assert_eq!(
            "itl=250us, e2e=3"
                .parse::<Slo>()
                .map(|s| (s.itl_ms, s.e2e_ms)),
            Ok((Some(0.25), Some(3.0)))
        );
        assert_eq!(
            "foo=1ms".parse::<Slo>().map_err(|e| e.to_string()),
            Err(
                r#"--slo: unknown objective "foo" (ttft, itl or tpot, e2e, trajectory_e2e)"#
                    .to_string()
            )
        );
        let records = vec![
            rec(100.0, Some(20.0), 5_000.0, true), // good
            rec(250.0, Some(20.0), 5_000.0, true), // TTFT miss
            rec(100.0, Some(60.0), 5_000.0, true), // ITL miss
            rec(100.0, None, 11_000.0, true),      // E2E miss
            rec(100.0, None, 1_000.0, true),       // good (one token: no ITL)
            rec(0.0, None, 0.0, false),            // error: a miss
        ];
        let g = goodput(&slo, &records, 2.0);
        assert_eq!((g.good_requests, g.total_requests), (2, 6));
        assert!((g.share - 2.0 / 6.0).abs() < 1e-12);
        assert!((g.rate_rps - 1.0).abs() < 1e-12);
    }
}
