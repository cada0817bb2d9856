//! A `mockserve fleet`'s routing judge: its `servesim_routing_*` counters in one scrape
//! ([`RoutingFigures`]) and the routing quality between two scrapes ([`RoutingSummary`]).
//!
//! The judge counts every decision made in front of the fleet, whoever sent the request: its
//! counters cannot tell loadgen's requests from another client's. The run attributes what it
//! can ([`RoutingSummary::attribute`] with [`OwnRouting`], from its own responses): how many
//! of the window's decisions were its requests, and their prefix-cache hits as the chosen
//! workers reported them (`usage.prompt_tokens_details.cached_tokens`). When other decisions
//! fall in the window, the console headline is loadgen's own and the judge's figures are shown
//! as the fleet's.

use serde::Serialize;

use crate::observe::scrape::parse::PromSample;

/// The prefix of the routing judge's series (`mockserve fleet`).
pub(super) const ROUTING_PREFIX: &str = "servesim_routing_";

/// The routing judge's counters in one scrape (cumulative): how the decisions of the router in
/// front of a `mockserve fleet` compare with the best worker at each arrival.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoutingFigures {
    /// Decisions judged.
    pub decisions: f64,
    /// Their prompt tokens.
    pub prompt_tokens: f64,
    /// Prompt tokens cached on the chosen workers.
    pub achieved_hit_tokens: f64,
    /// Prompt tokens cached on the best workers.
    pub oracle_hit_tokens: f64,
    /// The sum of every decision's regret, in tokens.
    pub regret_sum: f64,
    /// The regret histogram: (upper bound, cumulative count), as scraped.
    pub regret_buckets: Vec<(f64, f64)>,
    /// Decisions made on stale KV events, when the fleet publishes them.
    pub stale_decisions: Option<f64>,
    /// Of those, decisions where the events credited the chosen worker with evicted blocks.
    pub stale_evicted_decisions: Option<f64>,
    /// Of those, decisions where the events showed the best worker with fewer blocks.
    pub stale_missed_decisions: Option<f64>,
}

impl RoutingFigures {
    /// Adds sample `s` of a `servesim_routing_*` series.
    pub(super) fn add(&mut self, s: &PromSample) {
        let name = s.name.strip_prefix(ROUTING_PREFIX).unwrap_or_default();
        let slot = match name {
            "decisions_total" => &mut self.decisions,
            "prompt_tokens_total" => &mut self.prompt_tokens,
            "achieved_hit_tokens_total" => &mut self.achieved_hit_tokens,
            "oracle_hit_tokens_total" => &mut self.oracle_hit_tokens,
            "regret_tokens_sum" => &mut self.regret_sum,
            "stale_decisions_total" => self.stale_decisions.insert(0.0),
            "stale_evicted_decisions_total" => self.stale_evicted_decisions.insert(0.0),
            "stale_missed_decisions_total" => self.stale_missed_decisions.insert(0.0),
            "regret_tokens_bucket" => {
                let le = match s.label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(le) => match le.parse::<f64>() {
                        Ok(le) => le,
                        Err(_) => return,
                    },
                    None => return,
                };
                self.regret_buckets.push((le, s.value));
                return;
            }
            _ => return,
        };
        *slot = s.value;
    }
}

/// loadgen's own requests in a routing window, from its responses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct OwnRouting {
    /// Requests that reached a worker (each one a routing decision): the successful ones and
    /// the failed ones whose response named a worker.
    pub requests: u64,
    /// Prompt tokens of the successful ones that reported usage.
    pub prompt_tokens: u64,
    /// Of those, tokens the chosen workers had cached (`cached_tokens`).
    pub cached_tokens: u64,
    /// Distinct workers the responses named (0 when none did, e.g. with `--no-worker-id`).
    pub workers: usize,
}

impl OwnRouting {
    /// Cached over prompt tokens.
    fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.cached_tokens as f64 / self.prompt_tokens as f64)
    }
}

/// The routing judge's figures over a run (`mockserve fleet`; see docs/routers.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct RoutingSummary {
    /// Decisions judged during the run.
    pub decisions: f64,
    /// Prompt tokens cached on the chosen workers, over all prompt tokens.
    pub achieved_hit_rate: Option<f64>,
    /// Prompt tokens cached on the best workers, over all prompt tokens.
    pub oracle_hit_rate: Option<f64>,
    /// Mean regret per decision, in tokens.
    pub regret_mean_tokens: Option<f64>,
    /// Median regret: the upper bound of the histogram bucket that holds it, in tokens.
    pub regret_p50_tokens: Option<f64>,
    /// 99th percentile of the regret, as the median.
    pub regret_p99_tokens: Option<f64>,
    /// Share of decisions with no regret (the chosen worker held the longest prefix).
    pub best_choice_share: Option<f64>,
    /// Decisions made on stale KV events (see docs/routers.md), when the fleet publishes them.
    pub stale_decisions: Option<f64>,
    /// Of those, the events credited the chosen worker with blocks it had evicted.
    pub stale_evicted_decisions: Option<f64>,
    /// Of those, the events showed the best worker with fewer blocks than it held.
    pub stale_missed_decisions: Option<f64>,
    /// loadgen's own requests in the window (a run sets it; absent in a merge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loadgen: Option<OwnRouting>,
    /// Decisions in the window that were not loadgen's requests (other clients, a router's
    /// retries): `decisions - loadgen.requests`, at least 0. The figures above count them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_decisions: Option<f64>,
}

impl RoutingSummary {
    /// Attributes the window: loadgen's own requests in it, and the decisions that were not.
    pub(crate) fn attribute(&mut self, own: OwnRouting) {
        self.other_decisions = Some((self.decisions - own.requests as f64).max(0.0));
        self.loadgen = Some(own);
    }

    /// The figures between two scrapes (`None` when no decision was judged in between).
    pub(super) fn between(first: &RoutingFigures, last: &RoutingFigures) -> Option<RoutingSummary> {
        let decisions = last.decisions - first.decisions;
        if decisions <= 0.0 {
            return None;
        }
        let prompt = last.prompt_tokens - first.prompt_tokens;
        let rate = |a: f64, b: f64| (prompt > 0.0).then(|| ((a - b) / prompt).clamp(0.0, 1.0));
        // Bucket counts during the run, by upper bound (both scrapes list the same bounds).
        let mut buckets: Vec<(f64, f64)> = last
            .regret_buckets
            .iter()
            .map(|&(le, n)| {
                let before = first
                    .regret_buckets
                    .iter()
                    .find(|(l, _)| *l == le)
                    .map_or(0.0, |(_, n)| *n);
                (le, n - before)
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map_or(0.0, |(_, n)| *n);
        let quantile = |q: f64| {
            (total > 0.0).then(|| {
                buckets
                    .iter()
                    .find(|(_, n)| *n >= q * total)
                    .map_or(f64::INFINITY, |(le, _)| *le)
            })
        };
        // A counter the first scrape lacks (created since) counts from 0.
        let counted = |a: Option<f64>, b: Option<f64>| b.map(|b| (b - a.unwrap_or(0.0)).max(0.0));
        let best = buckets
            .iter()
            .find(|(le, _)| *le == 0.0)
            .and_then(|(_, n)| (total > 0.0).then(|| n / total));
        Some(RoutingSummary {
            decisions,
            achieved_hit_rate: rate(last.achieved_hit_tokens, first.achieved_hit_tokens),
            oracle_hit_rate: rate(last.oracle_hit_tokens, first.oracle_hit_tokens),
            regret_mean_tokens: Some((last.regret_sum - first.regret_sum) / decisions),
            regret_p50_tokens: quantile(0.5),
            regret_p99_tokens: quantile(0.99),
            best_choice_share: best,
            stale_decisions: counted(first.stale_decisions, last.stale_decisions),
            stale_evicted_decisions: counted(
                first.stale_evicted_decisions,
                last.stale_evicted_decisions,
            ),
            stale_missed_decisions: counted(
                first.stale_missed_decisions,
                last.stale_missed_decisions,
            ),
            loadgen: None,
            other_decisions: None,
        })
    }

    /// The console line.
    pub(super) fn console(&self) -> String {
        let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.1}%", 100.0 * r));
        let tokens = |t: Option<f64>| match t {
            Some(t) if t.is_finite() => format!("<= {t:.0}"),
            Some(_) => "beyond the last bucket".to_string(),
            None => "-".to_string(),
        };
        let stale = match self.stale_decisions {
            Some(n) => format!(
                "; stale KV events behind {n:.0} decisions ({}): {:.0} credited evicted \
                 blocks, {:.0} missed stored ones",
                pct(Some(n / self.decisions)),
                self.stale_evicted_decisions.unwrap_or(0.0),
                self.stale_missed_decisions.unwrap_or(0.0),
            ),
            None => String::new(),
        };
        let judged = format!(
            "prefix-cache hits {} of prompt tokens on the chosen workers, {} on the best \
             (oracle); regret p50 {} tokens, p99 {} tokens, mean {:.1}; best choice {} of \
             decisions{stale}",
            pct(self.achieved_hit_rate),
            pct(self.oracle_hit_rate),
            tokens(self.regret_p50_tokens),
            tokens(self.regret_p99_tokens),
            self.regret_mean_tokens.unwrap_or(0.0),
            pct(self.best_choice_share),
        );
        match (self.loadgen, self.other_decisions) {
            (Some(own), Some(others)) if others > 0.0 => {
                let workers = match own.workers {
                    0 => String::new(),
                    n => format!(" across {n} workers"),
                };
                format!(
                    "Routing quality of loadgen's {} requests: prefix-cache hits {} of their \
                     prompt tokens (the chosen workers' cached_tokens){workers}. The routing \
                     judge also counted {others:.0} decisions of other clients in the run's \
                     window; over all {:.0}: {judged}\n",
                    own.requests,
                    pct(own.hit_rate()),
                    self.decisions,
                )
            }
            (Some(_), _) => format!(
                "Routing quality ({:.0} decisions, all loadgen's): {judged}\n",
                self.decisions
            ),
            _ => format!(
                "Routing quality ({:.0} decisions): {judged}\n",
                self.decisions
            ),
        }
    }
}
#[cfg(test)]
mod tests {
    use crate::observe::scrape::parse::parse;
    use crate::observe::scrape::series::{series, ServerMetrics};
    use crate::observe::scrape::snapshot::Snapshot;

    /// A `mockserve fleet`'s routing judge: its counters and regret histogram at two scrapes.
    fn fleet_exposition(decisions: u64, achieved: u64, oracle: u64, buckets: [u64; 3]) -> String {
        let prompt = decisions * 100;
        let regret = oracle - achieved;
        format!(
            "# TYPE servesim_routing_decisions counter\n\
             servesim_routing_decisions_total {decisions}\n\
             servesim_routing_prompt_tokens_total {prompt}\n\
             servesim_routing_achieved_hit_tokens_total {achieved}\n\
             servesim_routing_oracle_hit_tokens_total {oracle}\n\
             servesim_routing_regret_tokens_sum {regret}.0\n\
             servesim_routing_regret_tokens_count {decisions}\n\
             servesim_routing_regret_tokens_bucket{{le=\"0.0\"}} {}\n\
             servesim_routing_regret_tokens_bucket{{le=\"64.0\"}} {}\n\
             servesim_routing_regret_tokens_bucket{{le=\"+Inf\"}} {}\n\
             vllm:num_requests_running{{model_name=\"m\",engine=\"0\"}} 1\n# EOF\n",
            buckets[0], buckets[1], buckets[2]
        )
    }

    #[test]
    fn a_fleets_routing_judge_gives_the_routing_quality_of_the_run() {
        let before = Snapshot::read(&fleet_exposition(10, 0, 0, [10, 10, 10]));
        assert_eq!(
            before,
            Snapshot::of(&parse(&fleet_exposition(10, 0, 0, [10, 10, 10])))
        );
        let routing = before.routing.as_ref().expect("routing figures");
        assert_eq!(routing.decisions, 10.0);
        assert_eq!(routing.regret_buckets.len(), 3);
        // 100 decisions during the run, 100 prompt tokens each: 5,000 hit on the chosen
        // workers, 6,000 on the best; 80 best choices, 19 at most 64 tokens off, 1 beyond.
        let after = Snapshot::read(&fleet_exposition(110, 5_000, 6_000, [90, 109, 110]));
        let (_, summary) = series(&[(0.0, before), (1000.0, after)], 0);
        let r = summary.routing.expect("a routing summary");
        assert_eq!(r.decisions, 100.0);
        assert_eq!(r.achieved_hit_rate, Some(0.5));
        assert_eq!(r.oracle_hit_rate, Some(0.6));
        assert_eq!(r.regret_mean_tokens, Some(10.0));
        assert_eq!(r.regret_p50_tokens, Some(0.0));
        assert_eq!(r.regret_p99_tokens, Some(64.0));
        assert_eq!(r.best_choice_share, Some(0.8));
        let metrics = ServerMetrics {
            summary,
            ..ServerMetrics::default()
        };
        let console = metrics.console();
        assert!(
            console.contains(
                "Routing quality (100 decisions): prefix-cache hits 50.0% of prompt \
                              tokens on the chosen workers, 60.0% on the best (oracle); regret \
                              p50 <= 0 tokens, p99 <= 64 tokens, mean 10.0; best choice 80.0%"
            ),
            "{console}"
        );
        // No decision during the run: no routing line.
        let idle = Snapshot::read(&fleet_exposition(10, 0, 0, [10, 10, 10]));
        let (_, summary) = series(&[(0.0, idle.clone()), (1000.0, idle)], 0);
        assert_eq!(summary.routing, None);
        assert!(!console.contains("stale"), "{console}");
    }

    #[test]
    fn the_routing_line_counts_only_loadgens_requests() {
        use super::OwnRouting;
        let before = Snapshot::read(&fleet_exposition(10, 0, 0, [10, 10, 10]));
        let after = Snapshot::read(&fleet_exposition(110, 5_000, 6_000, [90, 109, 110]));
        let (_, summary) = series(&[(0.0, before), (1000.0, after)], 0);
        let judged = summary.routing.expect("a routing summary");
        // 60 of the window's 100 decisions were loadgen's; another client made 40.
        let mut r = judged;
        r.attribute(OwnRouting {
            requests: 60,
            prompt_tokens: 6_000,
            cached_tokens: 1_500,
            workers: 2,
        });
        assert_eq!(r.other_decisions, Some(40.0));
        assert_eq!(
            r.console(),
            "Routing quality of loadgen's 60 requests: prefix-cache hits 25.0% of their prompt \
             tokens (the chosen workers' cached_tokens) across 2 workers. The routing judge \
             also counted 40 decisions of other clients in the run's window; over all 100: \
             prefix-cache hits 50.0% of prompt tokens on the chosen workers, 60.0% on the best \
             (oracle); regret p50 <= 0 tokens, p99 <= 64 tokens, mean 10.0; best choice 80.0% \
             of decisions\n"
        );
        let json = serde_json::to_value(r).expect("json");
        assert_eq!(json["loadgen"]["requests"], 60);
        assert_eq!(json["other_decisions"], 40.0);
        // Every decision was loadgen's: the judge's figures are its own.
        let mut r = judged;
        r.attribute(OwnRouting {
            requests: 100,
            ..OwnRouting::default()
        });
        assert_eq!(r.other_decisions, Some(0.0));
        assert!(
            r.console()
                .starts_with("Routing quality (100 decisions, all loadgen's): prefix-cache"),
            "{}",
            r.console()
        );
    }

    #[test]
    fn a_fleet_publishing_kv_events_gives_its_stale_decisions() {
        let with_stale = |decisions: u64, evicted: u64, missed: u64, either: u64| {
            fleet_exposition(decisions, 0, 0, [decisions; 3]).replace(
                "# EOF\n",
                &format!(
                    "servesim_routing_stale_decisions_total {either}\n\
                     servesim_routing_stale_evicted_decisions_total {evicted}\n\
                     servesim_routing_stale_missed_decisions_total {missed}\n# EOF\n"
                ),
            )
        };
        let before = Snapshot::read(&with_stale(10, 1, 2, 3));
        let after = Snapshot::read(&with_stale(50, 3, 12, 13));
        let (_, summary) = series(&[(0.0, before), (1000.0, after)], 0);
        let r = summary.routing.expect("a routing summary");
        assert_eq!(r.decisions, 40.0);
        assert_eq!(r.stale_decisions, Some(10.0));
        assert_eq!(r.stale_evicted_decisions, Some(2.0));
        assert_eq!(r.stale_missed_decisions, Some(10.0));
        let console = r.console();
        assert!(
            console.contains(
                "; stale KV events behind 10 decisions (25.0%): 2 credited evicted blocks, 10 \
                 missed stored ones\n"
            ),
            "{console}"
        );
    }
}
