#!/usr/bin/env python3
"""A worked `external` autoscaling policy for `mockserve replay --autoscale external:CMD`.

Run with:
    mockserve replay TRACE --autoscale 'external:python3 scripts/autoscale-external.py' \
        --min-workers 1 --max-workers 8 --slo ttft=2000ms,tpot=50ms

mockserve writes one JSON observation per line on stdin (the fleet as scraped before each tick:
`time_s`, `request_rate`, `mean_isl`, `mean_osl`, `queue`, `pools` and `workers`) and reads one
answer line per observation: {"workers": N}, or {"prefill": P, "decode": D} for a disaggregated
fleet. Each pool here grows by one worker per two requests waiting per ready worker, and shrinks
by one after three quiet ticks in a row (nothing waiting, KV usage under 30%).
Standard library only; deterministic.
"""
import json
import math
import sys

QUIET_TICKS = 3


def desired(pool, quiet):
    """The size one pool should have, and its updated count of quiet ticks."""
    current, ready = pool["current"], max(pool["ready"], 1)
    per_worker = pool["waiting"] / ready
    if per_worker > 2:
        return current + math.ceil(per_worker / 2), 0
    if pool["waiting"] == 0 and pool["kv_usage"] < 0.3 and pool["loading"] == 0:
        quiet += 1
        if quiet >= QUIET_TICKS:
            return current - 1, 0
        return current, quiet
    return current, 0


def main():
    quiet = {}
    for line in sys.stdin:
        obs = json.loads(line)
        sizes = {}
        for pool in obs["pools"]:
            size, quiet[pool["role"]] = desired(pool, quiet.get(pool["role"], 0))
            sizes[pool["role"]] = max(pool["min"], min(pool["max"], size))
        if "aggregated" in sizes:
            answer = {"workers": sizes["aggregated"]}
        else:
            answer = {"prefill": sizes["prefill"], "decode": sizes["decode"]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
