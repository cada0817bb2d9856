//! When each node of a request graph may be sent: the readiness rule of agentic replay, with
//! no clock of its own.
//!
//! A node is due at `max(floor, max over its dependencies of T(source) + delay_ms / speedup)`,
//! where `T` is the source's dispatch time (dispatch trigger) or the time of its last token
//! (completion trigger), and `floor = (not_before_ms - M) / speedup` with `M` the graph's
//! smallest `not_before_ms`. A node that fails fails its play: the play's nodes not yet due are
//! never handed out, those in flight finish. With lanes, plays queue in order of
//! `source_play_ordinal` (a weka play's place in its file; else `play_id`); the first `L`
//! start at 0 and, when a play settles (every node ended, or after a failure none is in
//! flight), its lane takes the next play at once, whose floors count from that instant and its
//! smallest root `not_before_ms`.
//!
//! Times are [`SimTime`]s, whole nanoseconds: a delay or a floor divided by the speed-up is
//! converted once ([`SimDuration::from_millis_f64`]; exact for a trace's millisecond times
//! with three decimals at the usual speed-ups) and added to its source's trigger time, so a
//! chain of dependencies adds no rounding. Nodes due at the same instant come out in
//! `request_id` order. The offline replay drives a [`Readiness`] on the virtual clock
//! ([`super::replay_graph`]) and `loadgen replay` on the wall clock (nanoseconds since its run
//! started), so both send the same nodes in the same order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use super::NodeTimes;
use crate::time::{SimDuration, SimTime};
use crate::trace::{RequestGraph, Trigger};

/// A graph's ready queue and every node's times so far.
#[derive(Debug)]
pub struct Readiness<'a> {
    graph: &'a RequestGraph,
    speedup: f64,
    /// Per node, its times (`engine_id` and `reused_input_tokens` stay the caller's).
    times: Vec<NodeTimes>,
    /// Per node, dependencies not yet fired.
    waiting: Vec<usize>,
    /// Per node, the (child, dependency index) edges its dispatch and its completion release.
    on_dispatch: Vec<Vec<(usize, usize)>>,
    on_completion: Vec<Vec<(usize, usize)>>,
    /// Per node, its place among the nodes sorted by `request_id`: the tie-break of nodes due
    /// at the same instant.
    rank: Vec<usize>,
    /// Nodes due, earliest first, then by rank.
    due: BinaryHeap<Reverse<(SimTime, usize, usize)>>,
    /// Plays waiting for a lane, in order (empty without lanes).
    queue: VecDeque<usize>,
    /// Per play, the lane it holds or held (with lanes).
    lane_of: Vec<Option<usize>>,
    /// Per play, nodes dispatched and not yet ended.
    in_flight: Vec<usize>,
    /// Per play, nodes ended.
    ended: Vec<usize>,
    /// Per play, whether it has settled.
    settled: Vec<bool>,
    /// Per play, its first failed node.
    failed: Vec<Option<usize>>,
}

/// What a [`Readiness`] leaves when the run is over.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    /// Per node (graph order), its times; `engine_id` and `reused_input_tokens` are unset.
    pub times: Vec<NodeTimes>,
    /// Per play, its first failed node.
    pub failed: Vec<Option<usize>>,
    /// Per play, the lane it held (with lanes).
    pub lane_of: Vec<Option<usize>>,
}

impl<'a> Readiness<'a> {
    /// Starts a run of the plays `plays` of `graph` (the others are neither due nor skipped)
    /// at time 0: floors and delays divided by `speedup` (finite, > 0), in `lanes` lanes if
    /// given (at least 1).
    pub fn new(
        graph: &'a RequestGraph,
        speedup: f64,
        lanes: Option<usize>,
        plays: &[usize],
    ) -> Self {
        let total = graph.nodes.len();
        let mut on_dispatch = vec![Vec::new(); total];
        let mut on_completion = vec![Vec::new(); total];
        let mut waiting = vec![0; total];
        for (child, node) in graph.nodes.iter().enumerate() {
            waiting[child] = node.dependencies.len();
            for (k, dep) in node.dependencies.iter().enumerate() {
                match dep.trigger {
                    Trigger::Dispatch => on_dispatch[dep.source].push((child, k)),
                    Trigger::Completion => on_completion[dep.source].push((child, k)),
                }
            }
        }
        let mut by_id: Vec<usize> = (0..total).collect();
        by_id.sort_by(|&a, &b| graph.nodes[a].id().cmp(graph.nodes[b].id()));
        let mut rank = vec![0; total];
        for (r, n) in by_id.into_iter().enumerate() {
            rank[n] = r;
        }
        let play_count = graph.plays.len();
        // The floors' shift is the smallest `not_before_ms` of the whole graph: found once.
        let times = graph
            .floors(speedup)
            .into_iter()
            .map(|floor| NodeTimes {
                floor: SimTime::ZERO + floor,
                ..NodeTimes::default()
            })
            .collect();
        let mut run = Readiness {
            graph,
            speedup,
            times,
            waiting,
            on_dispatch,
            on_completion,
            rank,
            due: BinaryHeap::new(),
            queue: VecDeque::new(),
            lane_of: vec![None; play_count],
            in_flight: vec![0; play_count],
            ended: vec![0; play_count],
            settled: vec![false; play_count],
            failed: vec![None; play_count],
        };
        let mut owned: Vec<usize> = plays.iter().copied().filter(|&p| p < play_count).collect();
        match lanes {
            None => {
                for &p in &owned {
                    for &n in &graph.plays[p].nodes {
                        if graph.nodes[n].dependencies.is_empty() {
                            run.schedule(n, run.times[n].floor);
                        }
                    }
                }
            }
            Some(lanes) => {
                owned.sort_by(|&a, &b| {
                    let (a, b) = (&graph.plays[a], &graph.plays[b]);
                    (a.ordinal, &a.id).cmp(&(b.ordinal, &b.id))
                });
                run.queue = owned.into();
                for lane in 0..lanes {
                    let Some(play) = run.queue.pop_front() else {
                        break;
                    };
                    run.start_play(play, lane, SimTime::ZERO);
                }
            }
        }
        run
    }

    fn schedule(&mut self, node: usize, at: SimTime) {
        self.due.push(Reverse((at, self.rank[node], node)));
    }

    /// When the next node is due (it may belong to a play that has failed since).
    pub fn next_due(&self) -> Option<SimTime> {
        self.due.peek().map(|Reverse((at, ..))| *at)
    }

    /// The next node due at or before `now`, with its due time, passing over nodes of failed
    /// plays (they are never sent).
    pub fn pop_due(&mut self, now: SimTime) -> Option<(usize, SimTime)> {
        while let Some(&Reverse((at, _, node))) = self.due.peek() {
            if at > now {
                return None;
            }
            self.due.pop();
            if self.failed[self.graph.nodes[node].play].is_none() {
                return Some((node, at));
            }
        }
        None
    }

    /// Whether no node is due any more (the run ends when nothing is in flight either).
    pub fn is_drained(&self) -> bool {
        self.due.is_empty()
    }

    /// Drops every node still due: the run is stopping.
    pub fn stop(&mut self) {
        self.due.clear();
    }

    /// Whether `node`'s play has failed.
    #[cfg(test)]
    pub(crate) fn play_failed(&self, node: usize) -> bool {
        self.failed[self.graph.nodes[node].play].is_some()
    }

    /// Dependency `dep` of `child` fired at `t` (its source's trigger time).
    fn fire(&mut self, child: usize, dep: usize, t: SimTime) {
        let d = &self.graph.nodes[child].dependencies[dep];
        let due = t + SimDuration::from_millis_f64(d.delay_ms / self.speedup);
        let times = &mut self.times[child];
        if times.due.is_none_or(|(at, _)| due > at) {
            times.due = Some((due, dep));
        }
        let at = times.floor.max(times.due.map_or(due, |(at, _)| at));
        self.waiting[child] = self.waiting[child].saturating_sub(1);
        if self.waiting[child] == 0 {
            self.schedule(child, at);
        }
    }

    /// Play `play` gets lane `lane` at `now`: its floors are set from `now` and its roots
    /// scheduled.
    fn start_play(&mut self, play: usize, lane: usize, now: SimTime) {
        let graph = self.graph;
        let nodes = &graph.plays[play].nodes;
        self.lane_of[play] = Some(lane);
        let r = nodes
            .iter()
            .filter(|&&n| graph.nodes[n].dependencies.is_empty())
            .map(|&n| graph.nodes[n].not_before_ms)
            .fold(f64::INFINITY, f64::min);
        for &n in nodes {
            let offset = (graph.nodes[n].not_before_ms - r) / self.speedup;
            let floor = now + SimDuration::from_millis_f64(offset);
            self.times[n].floor = floor;
            if graph.nodes[n].dependencies.is_empty() {
                self.schedule(n, floor);
            }
        }
    }

    /// `node` was dispatched (sent) at `at`: its dispatch edges fire.
    pub fn dispatched(&mut self, node: usize, at: SimTime) {
        self.in_flight[self.graph.nodes[node].play] += 1;
        self.times[node].dispatched = Some(at);
        for k in 0..self.on_dispatch[node].len() {
            let (child, dep) = self.on_dispatch[node][k];
            self.fire(child, dep, at);
        }
    }

    /// A token of `node` came at `at` (its completion edges fire from the last one).
    pub(crate) fn token(&mut self, node: usize, at: SimTime) {
        self.times[node].last_token = Some(at);
    }

    /// `node` completed at `end`: its completion edges fire from its last token (`end` if no
    /// token was told).
    pub fn completed(&mut self, node: usize, end: SimTime) {
        let state = &mut self.times[node];
        let t = *state.last_token.get_or_insert(end);
        state.terminal = Some(end);
        for k in 0..self.on_completion[node].len() {
            let (child, dep) = self.on_completion[node][k];
            self.fire(child, dep, t);
        }
        self.ended(self.graph.nodes[node].play, end);
    }

    /// `node` failed at `at` (`kind`: how): its play fails, its completion edges never fire.
    pub fn failed(&mut self, node: usize, at: SimTime, kind: &'static str) {
        let state = &mut self.times[node];
        state.terminal = Some(at);
        state.last_token = None;
        state.failure = Some(kind);
        let play = self.graph.nodes[node].play;
        self.failed[play].get_or_insert(node);
        self.ended(play, at);
    }

    /// `node` was handed out but never sent (its play failed, or the run stopped, while it
    /// waited to be sent).
    pub fn skipped(&mut self, node: usize, now: SimTime) {
        self.settle(self.graph.nodes[node].play, now);
    }

    fn ended(&mut self, play: usize, now: SimTime) {
        self.in_flight[play] = self.in_flight[play].saturating_sub(1);
        self.ended[play] += 1;
        self.settle(play, now);
    }

    /// When `play` has settled (every node ended, or after a failure none is in flight), its
    /// lane takes the next play waiting.
    fn settle(&mut self, play: usize, now: SimTime) {
        let all = self.ended[play] == self.graph.plays[play].nodes.len();
        let failed_and_idle = self.failed[play].is_some() && self.in_flight[play] == 0;
        if self.settled[play] || !(all || failed_and_idle) {
            return;
        }
        self.settled[play] = true;
        if let Some(lane) = self.lane_of[play] {
            if let Some(next) = self.queue.pop_front() {
                self.start_play(next, lane, now);
            }
        }
    }

    /// The run's times, failures and lanes.
    pub fn finish(self) -> Settled {
        Settled {
            times: self.times,
            failed: self.failed,
            lane_of: self.lane_of,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{parse_graph, TraceFormat};

    fn worked_example() -> RequestGraph {
        let path = format!(
            "{}/fixtures/agentic/worked_example.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read(path).expect("fixture");
        parse_graph(&text[..], "w", TraceFormat::Auto, 64).expect("parses")
    }

    fn ms(t: u64) -> SimTime {
        SimTime::from_micros(t * 1000)
    }

    /// Every node due up to `now`, as (request_id, due ms).
    fn due(ready: &mut Readiness<'_>, graph: &RequestGraph, now: SimTime) -> Vec<(String, u64)> {
        std::iter::from_fn(|| ready.pop_due(now))
            .map(|(n, at)| (graph.nodes[n].id().to_string(), at.as_micros() / 1000))
            .collect()
    }

    /// The reference's worked example, driven by hand: r1 is due 100 ms after r0 is sent, r2
    /// at max(last(r0) + 200, floor 1000), r3 at max(last(r2), last(r1) + 50), q0 at its floor.
    #[test]
    fn the_worked_example_releases_each_node_when_its_rule_says() {
        let graph = worked_example();
        let all: Vec<usize> = (0..graph.plays.len()).collect();
        let mut ready = Readiness::new(&graph, 1.0, None, &all);
        assert_eq!(due(&mut ready, &graph, ms(0)), [("r0".to_string(), 0)]);
        ready.dispatched(0, ms(0));
        assert_eq!(ready.next_due(), Some(ms(100)));
        assert_eq!(
            due(&mut ready, &graph, ms(300)),
            [("r1".into(), 100), ("q0".into(), 300)]
        );
        ready.dispatched(1, ms(100));
        ready.dispatched(4, ms(300));
        ready.token(0, ms(40));
        ready.completed(0, ms(41));
        assert_eq!(ready.next_due(), Some(ms(1000)), "r2 waits for its floor");
        ready.completed(1, ms(500));
        ready.completed(4, ms(350));
        assert_eq!(due(&mut ready, &graph, ms(1000)), [("r2".into(), 1000)]);
        ready.dispatched(2, ms(1000));
        assert!(ready.pop_due(ms(10_000)).is_none(), "r3 waits for r2");
        ready.completed(2, ms(1200));
        assert_eq!(due(&mut ready, &graph, ms(1200)), [("r3".into(), 1200)]);
        ready.dispatched(3, ms(1200));
        ready.completed(3, ms(1300));
        assert!(ready.is_drained());
        let settled = ready.finish();
        assert_eq!(settled.failed, [None, None]);
        // r3's due time was set by r2 (dependency 0): last token 1200 + 0.
        assert_eq!(settled.times[3].due, Some((ms(1200), 0)));
        assert_eq!(
            settled.times[0].last_token,
            Some(ms(40)),
            "the last token, not the end"
        );
    }

    /// A failed node fails its play: the nodes it would have released never come out, the
    /// other play runs on; and nodes due together come out in request_id order.
    #[test]
    fn a_failure_holds_back_its_play_and_ties_go_in_request_id_order() {
        let graph = worked_example();
        let all: Vec<usize> = (0..graph.plays.len()).collect();
        let mut ready = Readiness::new(&graph, 1.0, None, &all);
        assert_eq!(due(&mut ready, &graph, ms(0)), [("r0".to_string(), 0)]);
        ready.dispatched(0, ms(0));
        assert_eq!(due(&mut ready, &graph, ms(100)), [("r1".into(), 100)]);
        ready.dispatched(1, ms(100));
        ready.failed(1, ms(150), "http");
        assert!(ready.play_failed(0));
        ready.completed(0, ms(200));
        assert_eq!(
            due(&mut ready, &graph, ms(5000)),
            [("q0".into(), 300)],
            "r2 is never handed out; p1 runs on"
        );
        let settled = ready.finish();
        assert_eq!(settled.failed, [Some(1), None]);
        assert_eq!(settled.times[1].failure, Some("http"));
        assert_eq!(settled.times[1].last_token, None);

        // q0 (floor 300) and r0 at speed-up 1 with q0's floor lowered to 0: both due at 0,
        // handed out q0 first ("q0" < "r0").
        let text = std::fs::read_to_string(format!(
            "{}/fixtures/agentic/worked_example.jsonl",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("fixture")
        .replace("\"not_before_ms\":300", "\"not_before_ms\":0");
        let graph = parse_graph(text.as_bytes(), "w", TraceFormat::Auto, 64).expect("parses");
        let mut ready = Readiness::new(&graph, 1.0, None, &all);
        assert_eq!(
            due(&mut ready, &graph, ms(0)),
            [("q0".into(), 0), ("r0".into(), 0)]
        );
    }

    /// Due times are exact nanoseconds: at speed-up 2, `c` and `d` (0.7 µs after `a`'s last
    /// token) come out before `b` (1 µs after), though all three round to the same microsecond
    /// and `b` ranks first; `c` and `d`, due at the same instant, come out in rank order; and
    /// the times the run leaves are the same nanoseconds.
    #[test]
    fn due_times_compare_unrounded_and_ties_go_in_request_id_order() {
        let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64,"hash_id_scope":"local","source":{"format":"hand","digest":"x"}}"#;
        let row = |id: &str, deps: &str| {
            format!(
                r#"{{"request_id":"{id}","play_id":"p","session_id":"s","model":"M","input_length":64,"output_length":2,"hash_ids":[1],"not_before_ms":0,"dependencies":[{deps}]}}"#
            )
        };
        let after_a = |delay_ms: &str| {
            format!(
                r#"{{"request_id":"a","trigger":"completion","relation":"sequence","delay_ms":{delay_ms}}}"#
            )
        };
        let text = [
            header.to_string(),
            row("a", ""),
            row("d", &after_a("0.0014")),
            row("b", &after_a("0.002")),
            row("c", &after_a("0.0014")),
        ]
        .join("\n");
        let graph = parse_graph(text.as_bytes(), "t", TraceFormat::Auto, 64).expect("parses");
        let mut ready = Readiness::new(&graph, 2.0, None, &[0]);
        assert_eq!(due(&mut ready, &graph, ms(0)), [("a".to_string(), 0)]);
        ready.dispatched(0, ms(0));
        let last = SimTime::from_micros(100);
        ready.token(0, last);
        ready.completed(0, last);
        let out: Vec<(String, u64)> = std::iter::from_fn(|| ready.pop_due(ms(1)))
            .map(|(n, at)| (graph.nodes[n].id().to_string(), at.as_nanos()))
            .collect();
        assert_eq!(
            out,
            [
                ("c".into(), 100_700),
                ("d".into(), 100_700),
                ("b".into(), 101_000)
            ],
            "due at 100.7, 100.7 and 101.0 µs"
        );
        let settled = ready.finish();
        let due_ns = |n: usize| settled.times[n].due.map(|(at, _)| at.as_nanos());
        assert_eq!(
            (due_ns(1), due_ns(2), due_ns(3)),
            (Some(100_700), Some(101_000), Some(100_700))
        );
    }

    /// Start-up is linear: the floors' shift (the smallest `not_before_ms`) is found by one
    /// scan of the graph, not one per node (2,000 scans of 2,000 nodes before, issue 43), with
    /// lanes or without; and the floors it gives are each node's `not_before_ms` less it.
    #[test]
    fn start_up_scans_the_nodes_for_the_floors_shift_once() {
        use crate::trace::graph_min_scans;
        let header = r#"{"schema":"dynamo.agentic_mooncake","version":2,"block_size":64}"#;
        let rows: Vec<String> = (0..2_000)
            .map(|i| {
                format!(
                    r#"{{"request_id":"r{i}","play_id":"p{i}","session_id":"s","model":"M","input_length":64,"output_length":2,"hash_ids":[{i}],"not_before_ms":{},"dependencies":[]}}"#,
                    5 + i % 7
                )
            })
            .collect();
        let text = format!("{header}\n{}\n", rows.join("\n"));
        let graph = parse_graph(text.as_bytes(), "t", TraceFormat::Auto, 64).expect("parses");
        let plays: Vec<usize> = (0..graph.plays.len()).collect();
        for lanes in [None, Some(3)] {
            let before = graph_min_scans();
            let ready = Readiness::new(&graph, 2.0, lanes, &plays);
            assert_eq!(graph_min_scans() - before, 1, "lanes {lanes:?}");
            if lanes.is_none() {
                let floors: Vec<u64> = ready.times.iter().map(|t| t.floor.as_micros()).collect();
                assert_eq!(floors[..8], [0, 500, 1000, 1500, 2000, 2500, 3000, 0]);
            }
        }
    }

    /// With one lane, q0's play starts when p0 settles; a shard's plays alone are handed out.
    #[test]
    fn lanes_and_shards_decide_which_plays_run_when() {
        let graph = worked_example();
        let mut ready = Readiness::new(&graph, 1.0, Some(1), &[0, 1]);
        assert_eq!(due(&mut ready, &graph, ms(10_000)), [("r0".to_string(), 0)]);
        ready.dispatched(0, ms(0));
        ready.failed(0, ms(20), "rejected");
        assert_eq!(
            due(&mut ready, &graph, ms(20)),
            [("q0".into(), 20)],
            "p0 settled at 20: q0 takes its lane and its floor counts from there"
        );
        let only_p1 = Readiness::new(&graph, 2.0, None, &[1]);
        assert_eq!(
            only_p1.next_due(),
            Some(ms(150)),
            "q0's floor at speed-up 2"
        );
    }
}
