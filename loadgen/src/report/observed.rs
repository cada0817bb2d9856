//! What the observers saw, added to a run's report JSON.

use serde_json::{json, Value};

use crate::observe::Observed;
use crate::report::html;
use crate::report::replay_report::LiveReport;

/// Adds what the observers saw to `live`'s report JSON: `server_metrics` (time series and
/// summary, the routing window attributed to the run's own requests), `timeline` (per-second
/// client figures), `latency_cdf` and `config`.
pub(crate) fn annotate(
    json: &mut Value,
    live: &LiveReport,
    observed: &Observed,
    config: Option<Value>,
) {
    let Some(map) = json.as_object_mut() else {
        return;
    };
    map.insert("timeline".into(), html::timeline(live));
    map.insert("latency_cdf".into(), html::latency_cdf(live));
    if let Some(server) = observed.attributed(Some(live.own_routing())) {
        map.insert("server_metrics".into(), json!(server));
    }
    if let Some(c) = config {
        map.insert("config".into(), c);
    }
}
