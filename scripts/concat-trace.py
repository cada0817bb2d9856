#!/usr/bin/env python3
"""Writes a larger Mooncake trace: COPIES back-to-back copies of TRACE, each later copy's
timestamps shifted past the previous copy's end and its hash ids (and session ids, if any) shifted
past every id seen so far, so the copies share no prefix and no session.

    scripts/concat-trace.py TRACE COPIES > OUT.jsonl

Used to measure replay speed on a bigger workload without committing large files, e.g.
`scripts/concat-trace.py traces/mooncake_synthetic_trace.jsonl 4 > /tmp/big.jsonl`.
"""
import json
import sys


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, copies = sys.argv[1], int(sys.argv[2])
    rows = [json.loads(line) for line in open(path) if line.strip()]
    span_ms = max(r.get("timestamp", 0) for r in rows) + 1000
    id_span = max((h for r in rows for h in r.get("hash_ids", [])), default=0) + 1
    out = sys.stdout
    for k in range(copies):
        for r in rows:
            r2 = dict(r)
            if "timestamp" in r2:
                r2["timestamp"] = r["timestamp"] + k * span_ms
            r2["hash_ids"] = [h + k * id_span for h in r.get("hash_ids", [])]
            if "session_id" in r2:
                r2["session_id"] = f"{r['session_id']}-{k}"
            out.write(json.dumps(r2) + "\n")


if __name__ == "__main__":
    main()
