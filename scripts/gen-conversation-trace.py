#!/usr/bin/env python3
"""Writes a conversation-style Mooncake trace for live-against-offline comparisons,
deterministically from a seed, with the standard library only.

    scripts/gen-conversation-trace.py [--sessions N] [--seed S] [--block-size B] > OUT.jsonl

Each session is one long multi-turn conversation (rows sharing a `session_id`): its first turn
at the session's timestamp, each later turn its `delay` (a user's think time) after the previous
answer ended. Every prompt is cumulative: the previous prompt, the previous answer and the new
user message, so a turn repeats its predecessor's full blocks. Every conversation starts with
one of a few system prompts shared by every session of that kind (hash ids are file-global),
so prefixes are also shared across sessions. Sessions arrive in bursts: several first turns at
the same millisecond (tied timestamps), bursts a Poisson gap apart; think times are whole
multiples of `--delay-step-ms`, so later turns tie too when their predecessors end together.

With the defaults (60 sessions, seed 0, block size 64) it writes about 440 requests averaging
about 2,400 prompt tokens, with about 85% of the prompt tokens in blocks seen before. Same
arguments, same bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=64, help="prompt tokens per hash id")
    p.add_argument("--system-prompts", type=int, default=4, help="distinct system prompts")
    p.add_argument("--burst", type=int, default=6, help="most first turns at one timestamp")
    p.add_argument("--mean-burst-gap-ms", type=float, default=1500.0)
    p.add_argument("--delay-step-ms", type=int, default=250, help="think times are multiples")
    p.add_argument("--max-prompt", type=int, default=8000, help="longest prompt in tokens")
    args = p.parse_args()
    for name in ("sessions", "block_size", "system_prompts", "burst", "delay_step_ms", "max_prompt"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if not args.mean_burst_gap_ms > 0:
        p.error("--mean-burst-gap-ms must be above 0")
    rng = random.Random(args.seed)
    block = args.block_size
    next_id = 1

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + n))
        next_id += n
        return out

    # System prompts: 6 to 16 full blocks each, shared by every session of that kind.
    systems = []
    for _ in range(args.system_prompts):
        n = rng.randint(6, 16)
        systems.append((fresh(n), n * block))

    rows = []
    t = 0.0
    s = 0
    while s < args.sessions:
        at = int(round(t))
        for _ in range(min(rng.randint(1, args.burst), args.sessions - s)):
            ids, length = systems[rng.randrange(len(systems))]
            ids = list(ids)
            turns = rng.randint(3, 12)
            prev_out = 0
            for k in range(turns):
                user = rng.randint(20, 400)
                new_len = length + prev_out + user
                if new_len > args.max_prompt:
                    break
                keep = length // block
                ids = ids[:keep] + fresh(math.ceil(new_len / block) - keep)
                length = new_len
                out = rng.randint(16, 200)
                row = {"session_id": f"conv-{s}"}
                if k == 0:
                    row["timestamp"] = at
                else:
                    row["delay"] = args.delay_step_ms * rng.randint(1, 8)
                row.update(input_length=length, output_length=out, hash_ids=list(ids))
                rows.append(row)
                prev_out = out
            s += 1
        t += rng.expovariate(1.0 / args.mean_burst_gap_ms)
    out = sys.stdout
    for row in rows:
        out.write(json.dumps(row, separators=(", ", ": ")) + "\n")


if __name__ == "__main__":
    main()
