//! [`TrajectoryFigures`]: the end-to-end latency of an agentic replay's plays (trajectories) as
//! a distribution, under the keys AISimulate's report uses.

use serde::Serialize;

use crate::metrics::Distribution;

/// The plays of an agentic replay as trajectories: how many, how many completed, and the
/// distribution of a completed play's end-to-end latency (its makespan: from its first
/// dispatch to the end of its last request), with AISimulate's keys
/// (`{min,mean,median,p50,p75,p90,p95,p99,max,std}_trajectory_e2e_latency_ms`,
/// `total|completed|incomplete_trajectories`). Percentiles follow the replay report's rank rule
/// (`Distribution::percentile`: with two plays, p50 is the longer one, as AISimulate reports
/// it); `std` is the population standard deviation; no completed play gives zeros.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TrajectoryFigures {
    /// Plays in the report.
    pub total_trajectories: usize,
    /// Plays whose every request completed.
    pub completed_trajectories: usize,
    /// Plays that failed (a request rejected or failed; the rest skipped).
    pub incomplete_trajectories: usize,
    /// Shortest completed play, ms.
    pub min_trajectory_e2e_latency_ms: f64,
    /// Mean over completed plays, ms.
    pub mean_trajectory_e2e_latency_ms: f64,
    /// Median (the same figure as `p50`), ms.
    pub median_trajectory_e2e_latency_ms: f64,
    /// 50th percentile, ms.
    pub p50_trajectory_e2e_latency_ms: f64,
    /// 75th percentile, ms.
    pub p75_trajectory_e2e_latency_ms: f64,
    /// 90th percentile, ms.
    pub p90_trajectory_e2e_latency_ms: f64,
    /// 95th percentile, ms.
    pub p95_trajectory_e2e_latency_ms: f64,
    /// 99th percentile, ms.
    pub p99_trajectory_e2e_latency_ms: f64,
    /// Longest completed play, ms.
    pub max_trajectory_e2e_latency_ms: f64,
    /// Population standard deviation, ms.
    pub std_trajectory_e2e_latency_ms: f64,
}

impl TrajectoryFigures {
    /// The figures of a report's plays (after any filtering), each as (completed, makespan in
    /// ms): `AgenticReport::plays` mapped to `(status == "completed", makespan_ms)`.
    pub fn of(plays: impl IntoIterator<Item = (bool, f64)>) -> TrajectoryFigures {
        let mut total = 0;
        let mut e2e: Vec<f64> = Vec::new();
        for (completed, makespan_ms) in plays {
            total += 1;
            if completed {
                e2e.push(makespan_ms);
            }
        }
        let completed = e2e.len();
        let d = Distribution::from_samples(&mut e2e);
        TrajectoryFigures {
            total_trajectories: total,
            completed_trajectories: completed,
            incomplete_trajectories: total - completed,
            min_trajectory_e2e_latency_ms: d.min,
            mean_trajectory_e2e_latency_ms: d.mean,
            median_trajectory_e2e_latency_ms: d.median,
            p50_trajectory_e2e_latency_ms: d.median,
            p75_trajectory_e2e_latency_ms: d.p75,
            p90_trajectory_e2e_latency_ms: d.p90,
            p95_trajectory_e2e_latency_ms: d.p95,
            p99_trajectory_e2e_latency_ms: d.p99,
            max_trajectory_e2e_latency_ms: d.max,
            std_trajectory_e2e_latency_ms: d.std,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn play(status: &'static str, makespan_ms: f64) -> (bool, f64) {
        (status == "completed", makespan_ms)
    }

    #[test]
    fn completed_plays_make_the_distribution_and_failed_ones_are_counted() {
        let plays = [
            play("completed", 10.0),
            play("failed", 1000.0),
            play("completed", 30.0),
            play("completed", 20.0),
            play("completed", 40.0),
        ];
        let t = TrajectoryFigures::of(plays);
        assert_eq!(
            (
                t.total_trajectories,
                t.completed_trajectories,
                t.incomplete_trajectories
            ),
            (5, 4, 1)
        );
        assert_eq!(t.min_trajectory_e2e_latency_ms, 10.0);
        assert_eq!(t.max_trajectory_e2e_latency_ms, 40.0);
        assert_eq!(t.mean_trajectory_e2e_latency_ms, 25.0);
        // Ranks round((n - 1) p / 100) over 10, 20, 30, 40: p50 -> 2 (1.5 rounds up), p90 -> 3.
        assert_eq!(t.p50_trajectory_e2e_latency_ms, 30.0);
        assert_eq!(t.median_trajectory_e2e_latency_ms, 30.0);
        assert_eq!(t.p75_trajectory_e2e_latency_ms, 30.0);
        assert_eq!(t.p90_trajectory_e2e_latency_ms, 40.0);
        assert!((t.std_trajectory_e2e_latency_ms - 125f64.sqrt()).abs() < 1e-12);
    }

    #[test]
    fn two_plays_give_the_longer_as_p50_and_none_give_zeros() {
        let t = TrajectoryFigures::of([play("completed", 1.0), play("completed", 3.0)]);
        assert_eq!(t.p50_trajectory_e2e_latency_ms, 3.0);
        let none = TrajectoryFigures::of([play("failed", 5.0)]);
        assert_eq!(none.completed_trajectories, 0);
        assert_eq!(none.incomplete_trajectories, 1);
        assert_eq!(none.max_trajectory_e2e_latency_ms, 0.0);
        let json = serde_json::to_value(&t).expect("serializes");
        assert_eq!(json["p50_trajectory_e2e_latency_ms"], 3.0);
        assert_eq!(json["completed_trajectories"], 2);
    }
}
