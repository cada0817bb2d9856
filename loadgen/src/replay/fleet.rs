//! `loadgen replay --fleet-lifecycle PATH --slo OBJECTIVES`: the run judged as an elastic
//! fleet's, from the lifecycle `mockserve fleet --elastic --lifecycle-log PATH` wrote and this
//! run's per-request records, in trace time (`mock_server::fleet::elastic::LifecycleLog::judge`:
//! the judge of `mockserve replay --autoscale`).

use std::path::Path;

use mock_server::fleet::elastic::LifecycleLog;
use servesim::replay::autoscale::AutoscaleReport;
use servesim::slo::Slo;

use crate::error::LoadgenError;
use crate::report::replay_report::LiveReport;

/// The judge's verdict on `live`, when `--fleet-lifecycle` asks for it.
pub(super) fn judge(
    path: Option<&Path>,
    slo: Option<&Slo>,
    arrival_speedup: f64,
    live: &LiveReport,
) -> Result<Option<AutoscaleReport>, LoadgenError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let bad = |what: String| {
        LoadgenError::Config(format!("--fleet-lifecycle {}: {what}", path.display()))
    };
    let Some(slo) = slo else {
        return Err(bad("needs --slo (e.g. ttft=2000ms,tpot=50ms)".into()));
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let log: LifecycleLog = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let records: Vec<_> = live.records.iter().map(|r| r.record.clone()).collect();
    log.judge(&records, slo, arrival_speedup)
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[test]
    fn the_lifecycle_needs_objectives_and_a_readable_file() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["loadgen", "replay", "t.jsonl"];
            argv.extend_from_slice(extra);
            crate::Cli::try_parse_from(argv).map(|_| ())
        };
        let err = parse(&["--fleet-lifecycle", "l.json"]).expect_err("needs --slo");
        assert!(err.to_string().contains("--slo"), "{err}");
        // --slo alone is the report's goodput objective.
        parse(&["--slo", "ttft=1s"]).expect("--slo without --fleet-lifecycle");
        let live = crate::report::replay_report::build(&[], std::time::Duration::ZERO);
        let slo: servesim::slo::Slo = "ttft=1s".parse().expect("an SLO");
        let missing = std::path::Path::new("/nonexistent/lifecycle.json");
        let err = super::judge(Some(missing), Some(&slo), 10.0, &live).expect_err("no file");
        assert!(
            err.to_string()
                .contains("--fleet-lifecycle /nonexistent/lifecycle.json: "),
            "{err}"
        );
        assert!(super::judge(None, None, 10.0, &live)
            .expect("nothing asked")
            .is_none());
    }
}
