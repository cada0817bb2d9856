//! The elastic fleet's replica series on the admin listener's `/metrics` (what WVA, KEDA and
//! HPA read besides the workers' own series).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The fleet's replica series on the admin listener's `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct ReplicaMetrics {
    /// `servesim_fleet_desired_replicas`.
    pub desired: Gauge,
    /// `servesim_fleet_ready_replicas`.
    pub ready: Gauge,
    /// `servesim_fleet_loading_replicas`.
    pub loading: Gauge,
    /// `servesim_fleet_draining_replicas`.
    pub draining: Gauge,
    /// `servesim_fleet_scale_requests`: accepted scale requests that changed the count.
    pub scale_events: Counter,
    /// `servesim_fleet_autoscale_decisions`: decisions `--autoscale` applied.
    pub decisions: Counter,
}

impl ReplicaMetrics {
    /// Registers every series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "servesim_fleet_desired_replicas",
            "Workers the elastic fleet was asked for (PUT /fleet/scale)",
            self.desired.clone(),
        );
        registry.register(
            "servesim_fleet_ready_replicas",
            "Workers whose model has loaded and that take requests",
            self.ready.clone(),
        );
        registry.register(
            "servesim_fleet_loading_replicas",
            "Provisioned workers still loading their model",
            self.loading.clone(),
        );
        registry.register(
            "servesim_fleet_draining_replicas",
            "Scaled-down workers finishing their requests in flight",
            self.draining.clone(),
        );
        registry.register(
            "servesim_fleet_scale_requests",
            "Scale requests that changed the desired count",
            self.scale_events.clone(),
        );
        registry.register(
            "servesim_fleet_autoscale_decisions",
            "Decisions of --autoscale applied (a failing policy's ticks are not counted)",
            self.decisions.clone(),
        );
    }
}
