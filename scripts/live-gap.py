#!/usr/bin/env python3
"""Where a live replay's time went, per request, outside the engine.

Usage: python3 scripts/live-gap.py LIVE.jsonl [OFFLINE.jsonl]

LIVE.jsonl is `loadgen replay --per-request-jsonl` (against a server that reports
`nvext.timing`, such as the embedded mockserve). For the completed requests it prints the mean,
median, p90, p99 and max (ms, the run's clock) of:

- the send's lateness (sent minus scheduled);
- the send to the response headers (mockserve answers them once the request is submitted);
- the headers to the first token;
- the client's TTFT, the engine's own (`engine_ttft_ms`) and their difference;
- each request's mean ITL and every gap between token chunks.

With OFFLINE.jsonl (`mockserve replay --per-request-jsonl` of the same trace and flags) it also
prints the engine's TTFT minus the offline TTFT, the requests matched in arrival order.
"""

import json
import sys


def percentile(values, q):
    """Linear between the closest ranks (as `mockserve plan --verify`)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary(name, values):
    """One line of statistics."""
    return (
        f"{name:26} n={len(values):7} mean={sum(values) / len(values):9.3f} "
        f"median={percentile(values, 0.5):9.3f} p90={percentile(values, 0.9):9.3f} "
        f"p99={percentile(values, 0.99):9.3f} max={max(values):9.3f}"
    )


def read(path):
    """The JSON lines of `path`."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv):
    if len(argv) not in (2, 3):
        sys.exit(__doc__.strip().splitlines()[2])
    rows = read(argv[1])
    done = [r for r in rows if r.get("status") == "completed"]
    print(f"{len(rows)} requests, {len(done)} completed")
    cols = {}

    def add(key, value):
        if value is not None:
            cols.setdefault(key, []).append(value)

    for r in done:
        raw = r["raw"]
        add("lag (sent - scheduled)", (raw["sent_us"] - raw["scheduled_us"]) / 1000)
        headers = raw.get("headers_us")
        add("send -> headers", headers / 1000 if headers is not None else None)
        chunks = raw["token_chunks_us"]
        if chunks and headers is not None:
            add("headers -> first token", (chunks[0] - headers) / 1000)
        add("client TTFT", r.get("ttft_ms"))
        add("engine TTFT", r.get("engine_ttft_ms"))
        if r.get("ttft_ms") is not None and r.get("engine_ttft_ms") is not None:
            add("client - engine TTFT", r["ttft_ms"] - r["engine_ttft_ms"])
        add("mean ITL of a request", r.get("itl_ms"))
        for a, b in zip(chunks, chunks[1:]):
            add("gap between chunks", (b - a) / 1000)
    for key, values in cols.items():
        print(summary(key, values))
    if len(argv) == 3:
        offline = sorted(read(argv[2]), key=lambda r: (r["arrival_ms"], r["request_id"]))
        live = sorted(
            rows, key=lambda r: (r["raw"]["scheduled_us"], r["raw"]["session"], r["raw"]["turn"])
        )
        diff = [
            lv["engine_ttft_ms"] - of["ttft_ms"]
            for of, lv in zip(offline, live)
            if of.get("ttft_ms") is not None and lv.get("engine_ttft_ms") is not None
        ]
        if diff:
            print(summary("engine - offline TTFT", diff))


if __name__ == "__main__":
    main(sys.argv)
