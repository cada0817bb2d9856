//! Autoscaling hooks of the cluster (issue 46): which workers take new requests, whether a
//! draining worker still holds work, and dropping a stopped worker's KV cache. The cluster is
//! built at its largest size; an elastic driver (`replay::autoscale`) switches workers on and
//! off through these calls, and the routers route only over the workers marked as taking
//! requests.

use super::Cluster;
use crate::router::Router;

impl Cluster {
    /// From now on only the workers marked true take new requests (aggregated or prefill
    /// workers at the front router, decode workers at the decode router); requests already
    /// placed stay where they are. A pool with no worker marked routes over all of its workers
    /// (a request is always placed). Parked requests are routed at once if the new set has
    /// room. `mask` has one entry per worker; missing entries count as true.
    pub fn set_accepting(&mut self, mask: &[bool]) {
        let at = |w: usize| mask.get(w).copied().unwrap_or(true);
        let front: Vec<bool> = (0..self.num_front).map(at).collect();
        set_mask(&mut self.router, front);
        if let Some(pool) = &mut self.decode {
            let decode: Vec<bool> = (self.num_front..self.workers.len()).map(at).collect();
            set_mask(&mut pool.router, decode);
        }
        self.unpark();
    }

    /// True when worker `w` holds no request (queued, running, or on its way to it as a KV
    /// hand-off) and runs no pass: a draining worker can then stop.
    pub fn worker_is_idle(&self, w: usize) -> bool {
        let Some(worker) = self.workers.get(w) else {
            return true;
        };
        worker.pass_end().is_none()
            && worker.scheduler().num_waiting() == 0
            && worker.stats().scheduler.running == 0
            && !self.placement.values().any(|p| p.0 as usize == w)
    }

    /// Drops an idle worker's KV cache (a stopped worker loses it; a new one starts empty);
    /// its router hears the `Cleared` event. False, changing nothing, when it is not idle.
    pub fn drop_worker_cache(&mut self, w: usize) -> bool {
        self.worker_is_idle(w) && self.reset_prefix_cache(w)
    }

    /// Workers behind the front router (all of them when aggregated; the prefill pool when
    /// disaggregated, whose decode workers follow).
    pub fn num_front_workers(&self) -> usize {
        self.num_front
    }
}

/// Sets a router's mask; all-true means no mask.
fn set_mask(router: &mut Router, mask: Vec<bool>) {
    if mask.iter().all(|&e| e) {
        router.set_eligible(None);
    } else {
        router.set_eligible(Some(mask));
    }
}

#[cfg(test)]
mod tests {
    use crate::cluster::{Cluster, ClusterConfig, Output};
    use crate::request::{EngineRequest, Prompt};
    use crate::router::{RouterConfig, RouterMode};
    use crate::time::SimTime;

    fn request(cluster: &Cluster, seed: u32) -> EngineRequest {
        let prompt: Vec<u32> = (0..256).map(|i| i + seed * 1000).collect();
        EngineRequest {
            prompt: Prompt::from_tokens(&prompt, cluster.block_size()),
            max_output_tokens: 4,
            output_tokens: Vec::new(),
        }
    }

    fn run_to_end(cluster: &mut Cluster, mut now: SimTime) -> Vec<Output> {
        let mut all = Vec::new();
        loop {
            all.extend(cluster.advance(now));
            match cluster.next_event_time() {
                Some(t) => now = t,
                None => return all,
            }
        }
    }

    #[test]
    fn only_accepting_workers_get_requests_for_every_router_mode() {
        for mode in [
            RouterMode::RoundRobin,
            RouterMode::Random,
            RouterMode::KvRouter,
        ] {
            let mut cluster = Cluster::new(ClusterConfig {
                num_workers: 4,
                router: RouterConfig {
                    mode,
                    ..RouterConfig::default()
                },
                ..ClusterConfig::default()
            })
            .unwrap();
            cluster.set_accepting(&[false, true, false, true]);
            let mut workers = std::collections::BTreeSet::new();
            for i in 0..12 {
                let r = request(&cluster, i);
                cluster.submit(r, SimTime::ZERO).unwrap();
            }
            for (w, stats) in cluster.snapshot().workers.iter().enumerate() {
                if stats.scheduler.waiting + stats.scheduler.running > 0 {
                    workers.insert(w);
                }
            }
            assert_eq!(workers, [1, 3].into_iter().collect(), "{mode:?}");
            assert!(cluster.worker_is_idle(0) && cluster.worker_is_idle(2));
            assert!(!cluster.worker_is_idle(1));
            // A draining worker finishes what it holds, then is idle and loses its cache.
            cluster.set_accepting(&[true, false, false, false]);
            let outputs = run_to_end(&mut cluster, SimTime::ZERO);
            let finished = outputs
                .iter()
                .filter(|o| matches!(o, Output::Finished { .. }))
                .count();
            assert_eq!(finished, 12, "{mode:?}");
            assert!(cluster.worker_is_idle(1));
            let cached = |c: &Cluster| c.snapshot().workers[1].scheduler.inactive_blocks;
            assert!(cached(&cluster) > 0);
            assert!(cluster.drop_worker_cache(1));
            assert_eq!(cached(&cluster), 0);
        }
    }

    #[test]
    fn a_mask_without_any_worker_routes_over_all() {
        let mut cluster = Cluster::new(ClusterConfig {
            num_workers: 2,
            ..ClusterConfig::default()
        })
        .unwrap();
        cluster.set_accepting(&[false, false]);
        let r = request(&cluster, 1);
        assert!(cluster.submit(r, SimTime::ZERO).is_ok());
        let outputs = run_to_end(&mut cluster, SimTime::ZERO);
        assert!(outputs.iter().any(|o| matches!(o, Output::Finished { .. })));
    }
}
