#!/usr/bin/env python3
"""Writes a synthetic agentic trace for replay comparisons, deterministically from a seed, with
the standard library only.

    scripts/gen-agentic-trace.py agentic-mooncake [--plays N] [--seed S] [--block-size B] > OUT.jsonl
    scripts/gen-agentic-trace.py weka [--plays N] [--seed S] [--block-size B] > OUT.json

`agentic-mooncake` writes an agentic Mooncake v2 trace (header line, then one row per request).
Each play is one agent trajectory arriving at a Poisson time: a main session whose turns each
extend the previous prompt by the previous answer and a tool result, and wait for the previous
turn's completion plus a tool wait (sequence edges). Some turns fan out: 2 to 5 sub-agents are
spawned (spawn edges, mostly on the parent's completion, some on its dispatch), each a short chain
of its own; the next main turn joins the blocking ones (join edges) and leaves the background ones
running. Some main turns are new user messages with a recorded floor (`not_before_ms`) that holds
them back past their dependencies. Prompts start with one of a few system prompts whose hash ids
are shared by every play of that agent kind (ids are file-global), and every later prompt repeats
its predecessor's full blocks, so prefixes are shared within a play and across plays. A chain
whose prompt would pass `--max-prompt` tokens (32,000) is compacted: its next prompt is the system
prompt and a summary.

`weka` writes an AgentX (weka) corpus, one JSON object per play on its own line: a main chain of
`n`/`s` requests whose `hash_ids` extend each other, blocking (`completed`) and background
(`async_launched`) `subagent` markers with inner chains at absolute times, and now and then a side
request with a prefix of its own (a worker stream). Each request has `t` and `api_time` in
seconds; hash ids are play-local, one per full block.

With the defaults (60 plays, seed 0, block size 64) the first writes about 3,000 requests and the
second about 2,500. Same arguments, same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys

KINDS = ("coder", "researcher", "reviewer", "planner")
SUB_KINDS = ("Explore", "general-purpose", "test-runner")


class Ids:
    """Hash ids: fresh ones from a counter; system prompts are drawn once per kind."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def fresh(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def lognormal_ms(rng: random.Random, median_ms: float, sigma: float, cap_ms: float) -> float:
    return round(min(cap_ms, median_ms * math.exp(rng.gauss(0.0, sigma))), 3)


def grow(prev: tuple[int, int, list[int]], added: int, base: tuple[list[int], int], args, rng, ids: Ids):
    """The next prompt of a chain: the previous prompt (isl, osl, ids), its answer and `added`
    new tokens; past --max-prompt the history is compacted: the base prompt and a summary."""
    p_isl, p_osl, p_ids = prev
    isl = p_isl + p_osl + added
    if isl <= args.max_prompt:
        return isl, extend(p_ids, p_isl, isl, args.block_size, ids)
    base_ids, base_len = base
    isl = base_len + rng.randint(1000, 4000)
    return isl, extend(base_ids, base_len, isl, args.block_size, ids)


def extend(prev_ids: list[int], prev_len: int, new_len: int, block: int, ids: Ids) -> list[int]:
    """ids of a prompt of new_len tokens that repeats the first prev_len tokens: the full blocks
    of the previous prompt are kept, the rest (its partial tail block included) is new."""
    keep = min(prev_len // block, len(prev_ids))
    need = math.ceil(new_len / block)
    return prev_ids[:keep] + ids.fresh(need - keep)


# ---------------------------------------------------------------- agentic Mooncake v2


def gen_agentic(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    b = args.block_size
    ids = Ids()
    system = {k: (ids.fresh(n), n * b) for k, n in ((k, rng.randint(16, 48)) for k in KINDS)}
    sub_system = {k: (ids.fresh(n), n * b) for k, n in ((k, rng.randint(8, 24)) for k in SUB_KINDS)}
    rows: list[dict] = []
    t_play = 0.0
    for p in range(args.plays):
        t_play += rng.expovariate(1.0 / args.mean_play_gap_ms)
        play = f"play-{p:04d}"
        kind = KINDS[rng.randrange(len(KINDS))]
        sys_ids, sys_len = system[kind]
        n = 0

        def row(session: str, isl: int, osl: int, hids: list[int], floor: float, deps: list[dict]) -> str:
            nonlocal n
            rid = f"{play}-r{n:03d}"
            n += 1
            rows.append(
                {
                    "request_id": rid,
                    "play_id": play,
                    "session_id": session,
                    "model": "synthetic/agent-model",
                    "input_length": isl,
                    "output_length": osl,
                    "hash_ids": hids,
                    "not_before_ms": round(floor, 3),
                    "dependencies": deps,
                }
            )
            return rid

        def dep(source: str, trigger: str, relation: str, delay: float) -> dict:
            return {"request_id": source, "trigger": trigger, "relation": relation, "delay_ms": delay}

        # Turn 0: the system prompt and the user's task.
        isl = sys_len + rng.randint(100, 2500)
        osl = rng.randint(20, 300)
        hids = extend(sys_ids, sys_len, isl, b, ids)
        last = row("main", isl, osl, hids, t_play, [])
        recorded = 0.0  # the play's recorded clock, for user-message floors
        turns = rng.randint(4, 26)
        pending_joins: list[str] = []
        for _ in range(turns):
            prev_isl, prev_osl, prev_ids = isl, osl, hids
            recorded += rng.uniform(2_000, 12_000)
            deps = [dep(last, "completion", "sequence", lognormal_ms(rng, 400, 1.2, 20_000))]
            deps += [dep(s, "completion", "join", round(rng.uniform(0, 50), 3)) for s in pending_joins]
            pending_joins = []
            user_turn = rng.random() < 0.12
            floor = t_play + recorded if user_turn else 0.0
            isl, hids = grow((prev_isl, prev_osl, prev_ids), rng.randint(50, 3000), (sys_ids, sys_len), args, rng, ids)
            osl = rng.randint(20, 400)
            last = row("main", isl, osl, hids, floor, deps)
            if rng.random() < 0.25:
                # Fan-out: sub-agents started by this turn's tool calls.
                for k in range(rng.randint(2, 5)):
                    sk = SUB_KINDS[rng.randrange(len(SUB_KINDS))]
                    s_ids, s_len = sub_system[sk]
                    session = f"sub-{n:03d}-{k}"
                    if rng.random() < 0.8:
                        spawn = dep(last, "completion", "spawn", round(rng.uniform(1, 80), 3))
                    else:
                        spawn = dep(last, "dispatch", "spawn", round(rng.uniform(0, 500), 3))
                    sisl = s_len + rng.randint(200, 4000)
                    sosl = rng.randint(20, 300)
                    sids = extend(s_ids, s_len, sisl, b, ids)
                    slast = row(session, sisl, sosl, sids, 0.0, [spawn])
                    for _ in range(rng.randint(0, 4)):
                        sisl, sids = grow((sisl, sosl, sids), rng.randint(50, 2000), (s_ids, s_len), args, rng, ids)
                        sosl = rng.randint(20, 300)
                        wait = lognormal_ms(rng, 250, 1.0, 10_000)
                        slast = row(session, sisl, sosl, sids, 0.0, [dep(slast, "completion", "sequence", wait)])
                    if rng.random() < 0.8:
                        pending_joins.append(slast)  # blocking: the next main turn waits
        if pending_joins:
            deps = [dep(last, "completion", "sequence", lognormal_ms(rng, 400, 1.2, 20_000))]
            deps += [dep(s, "completion", "join", 0.0) for s in pending_joins]
            isl2, hids2 = grow((isl, osl, hids), rng.randint(50, 1500), (sys_ids, sys_len), args, rng, ids)
            row("main", isl2, rng.randint(20, 200), hids2, 0.0, deps)
    return rows


# ---------------------------------------------------------------- weka


def gen_weka(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(args.seed)
    b = args.block_size
    model = "synthetic/agent-model"
    plays = []
    for p in range(args.plays):
        ids = Ids()
        t = round(rng.uniform(0, 1_000_000), 3)  # recorded wall clock; every play replays from 0
        sys_ids, sys_len = ids.fresh(rng.randint(16, 48)), 0
        sys_len = len(sys_ids) * b
        sub_sys = {k: ids.fresh(rng.randint(8, 20)) for k in SUB_KINDS}

        def api_s(osl: int) -> float:
            return round(0.05 + osl * rng.uniform(0.004, 0.02), 4)

        def req(t0: float, isl: int, osl: int, hids: list[int]) -> dict:
            kind = "s" if rng.random() < 0.5 else "n"
            return {"type": kind, "t": round(t0, 4), "model": model, "in": isl, "out": osl,
                    "hash_ids": hids[: isl // b], "api_time": api_s(osl)}

        requests: list[dict] = []
        isl = sys_len + rng.randint(100, 2500)
        osl = rng.randint(20, 300)
        hids = extend(sys_ids, sys_len, isl, b, ids)
        requests.append(req(t, isl, osl, hids))
        end = t + requests[-1]["api_time"]
        side: tuple[int, int, list[int]] | None = None
        for _ in range(rng.randint(4, 24)):
            prev_isl, prev_osl, prev_ids = isl, osl, hids
            t = end + lognormal_ms(rng, 400, 1.2, 20_000) / 1000
            if rng.random() < 0.2:
                # A side request with a prefix of its own (title, summary): a worker stream.
                if side is None:
                    s_isl = rng.randint(200, 1500)
                    s_ids = ids.fresh(math.ceil(s_isl / b))
                else:
                    s_isl, s_ids = grow(side, rng.randint(50, 500), ([], 0), args, rng, ids)
                s_osl = rng.randint(10, 80)
                requests.append(req(t, s_isl, s_osl, s_ids))
                side = (s_isl, s_osl, s_ids)
                t += requests[-1]["api_time"] + rng.uniform(0.001, 0.2)
            if rng.random() < 0.25:
                blocking = rng.random() < 0.75
                sk = SUB_KINDS[rng.randrange(len(SUB_KINDS))]
                s_ids0 = sub_sys[sk]
                s_len = len(s_ids0) * b
                marker_t = t
                inner = []
                it = marker_t + rng.uniform(0.01, 0.3)
                sisl = s_len + rng.randint(200, 4000)
                sosl = rng.randint(20, 300)
                sids = extend(s_ids0, s_len, sisl, b, ids)
                for j in range(rng.randint(1, 5)):
                    if j:
                        sisl, sids = grow((sisl, sosl, sids), rng.randint(50, 2000), (s_ids0, s_len), args, rng, ids)
                        sosl = rng.randint(20, 300)
                    inner.append(req(it, sisl, sosl, sids))
                    it += inner[-1]["api_time"] + lognormal_ms(rng, 250, 1.0, 10_000) / 1000
                last_end = inner[-1]["t"] + inner[-1]["api_time"]
                duration = int((last_end - marker_t) * 1000 + rng.uniform(1, 100))  # AISimulate wants an integer
                requests.append({"type": "subagent", "t": round(marker_t, 4), "agent_id": f"agent-{len(requests)}",
                                 "subagent_type": sk, "status": "completed" if blocking else "async_launched",
                                 "duration_ms": duration, "requests": inner})
                if blocking:
                    t = marker_t + duration / 1000 + rng.uniform(0.001, 0.3)
                else:
                    t = marker_t + rng.uniform(0.01, 0.5)
            isl, hids = grow((prev_isl, prev_osl, prev_ids), rng.randint(50, 3000), (sys_ids, sys_len), args, rng, ids)
            osl = rng.randint(20, 400)
            requests.append(req(t, isl, osl, hids))
            end = t + requests[-1]["api_time"]
        plays.append({"id": f"play-{p:04d}", "block_size": b, "hash_id_scope": "local", "requests": requests})
    return plays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("format", choices=["agentic-mooncake", "weka"])
    ap.add_argument("--plays", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=32_000,
                    help="a chain whose prompt would grow past this many tokens is compacted to its "
                    "system prompt and a summary (keeps prompts inside a 40k-token context)")
    ap.add_argument("--mean-play-gap-ms", type=float, default=2_000.0,
                    help="agentic-mooncake: mean gap between play arrivals (Poisson)")
    args = ap.parse_args()
    out = sys.stdout
    if args.format == "agentic-mooncake":
        rows = gen_agentic(args)
        header = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": args.block_size,
                  "hash_id_scope": "local",
                  "source": {"format": "gen-agentic-trace.py", "digest": f"seed-{args.seed}-plays-{args.plays}"}}
        out.write(json.dumps(header, separators=(",", ":")) + "\n")
        for r in rows:
            out.write(json.dumps(r, separators=(",", ":")) + "\n")
    else:
        for play in gen_weka(args):
            out.write(json.dumps(play, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
