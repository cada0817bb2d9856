#!/usr/bin/env bash
# Live against offline on every trace kind: for each trace and arrival speed-up, `mockserve
# replay` runs the trace on the virtual clock and `loadgen replay` sends it to the embedded
# mockserve on the wall clock, with the same engine flags; the script prints mean and p90 of
# TTFT, ITL and E2E side by side with their differences, the prefix reuse, and how many requests
# ran on the same worker on both sides (matched by session and turn, or by agentic request id).
#
#   scripts/live-offline.sh
#
# The traces (each generated or cut deterministically into the scratch folder):
#   mooncake      the first $ROWS rows (default 400) of traces/mooncake_synthetic_trace.jsonl
#   conversation  scripts/gen-conversation-trace.py --seed $SEED (60 sessions, about 440
#                 requests: long multi-turn sessions, shared system prompts, tied first turns)
#   agentic       scripts/gen-agentic-trace.py agentic-mooncake --seed $SEED --plays $PLAYS
#
# env: KINDS     the traces to run (default "mooncake conversation agentic")
#      SPEEDUPS  arrival speed-ups (default "1 2 5 10")
#      WORKERS   simulated workers (default 4)
#      ROWS, PLAYS, SEED  trace sizes and seed (defaults 400, 8, 0)
#      MAX_DIFF  largest difference in percent allowed on each mean and p90 (default 10)
#      MOCKSERVE, LOADGEN  the binaries (default: the first built of target/release/ and
#                target/debug/; a debug build adds milliseconds of its own to every request)
#      KEEP=DIR  keep the traces and every report in DIR
# Exits non-zero if a run fails, if the two sides complete a different number of requests, or if
# a mean or p90 differs by more than MAX_DIFF percent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
pick_bin() { # NAME: target/release/NAME if built, else target/debug/NAME
  local dir
  for dir in release debug; do
    if [ -x "$here/target/$dir/$1" ]; then echo "$here/target/$dir/$1"; return; fi
  done
  echo "live-offline.sh: no $1 binary: cargo build --release -p mock_server -p loadgen" >&2
  exit 1
}
mockserve=${MOCKSERVE:-$(pick_bin mockserve)}
loadgen=${LOADGEN:-$(pick_bin loadgen)}
kinds=${KINDS:-mooncake conversation agentic}
speedups=${SPEEDUPS:-1 2 5 10}
workers=${WORKERS:-4}
seed=${SEED:-0}
max_diff=${MAX_DIFF:-10}
if [ -n "${KEEP:-}" ]; then
  out=$KEEP
  mkdir -p "$out"
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/live-offline.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
echo "mockserve: $mockserve"
echo "loadgen:   $loadgen"
echo "$workers workers; speed-ups $speedups; at most $max_diff% apart on each mean and p90"

status=0
for kind in $kinds; do
  extra=()
  case $kind in
    mooncake)
      head -n "${ROWS:-400}" "$here/traces/mooncake_synthetic_trace.jsonl" >"$out/$kind.jsonl" ;;
    conversation)
      "$here/scripts/gen-conversation-trace.py" --seed "$seed" >"$out/$kind.jsonl"
      extra=(--trace-block-size 64) ;;
    agentic)
      "$here/scripts/gen-agentic-trace.py" agentic-mooncake --seed "$seed" --plays "${PLAYS:-8}" \
        >"$out/$kind.jsonl"
      extra=(--trace-format agentic-mooncake) ;;
    *) echo "live-offline.sh: unknown trace kind $kind (mooncake, conversation, agentic)" >&2; exit 2 ;;
  esac
  for s in $speedups; do
    tag="$kind-x$s"
    flags=(--num-workers "$workers" --arrival-speedup-ratio "$s" "${extra[@]}")
    echo
    echo "== $kind ($(wc -l <"$out/$kind.jsonl") lines), arrival speed-up $s"
    "$mockserve" replay "$out/$kind.jsonl" "${flags[@]}" -q \
      --report-json "$out/$tag.offline.json" --per-request-jsonl "$out/$tag.offline.jsonl" >/dev/null
    "$loadgen" replay "$out/$kind.jsonl" "${flags[@]}" --quiet \
      --report-json "$out/$tag.live.json" --per-request-jsonl "$out/$tag.live.jsonl" >/dev/null
    python3 - "$out/$tag" "$max_diff" <<'EOF' || status=1
import json, sys

base, max_diff = sys.argv[1], float(sys.argv[2])
offline, live = (json.load(open(f"{base}.{side}.json")) for side in ("offline", "live"))

def key(r):
    agentic = r.get("agentic") or (r.get("raw") or {}).get("agentic")
    if isinstance(agentic, dict) and "request_id" in agentic:
        return agentic["request_id"]
    return (r["session_id"], r["turn_index"])

def workers(side):
    out = {}
    for line in open(f"{base}.{side}.jsonl"):
        r = json.loads(line)
        out[key(r)] = r.get("worker")
    return out

bad = []
if live["completed_requests"] != offline["completed_requests"]:
    bad.append(f"completed requests differ: {offline['completed_requests']} offline, "
               f"{live['completed_requests']} live")
print(f"{'figure':24s} {'offline':>11s} {'live':>11s} {'difference':>11s}")
for metric in ("ttft", "itl", "e2e_latency"):
    for stat in ("mean", "p90"):
        k = f"{stat}_{metric}_ms"
        o, l = offline[k], live[k]
        diff = 100.0 * (l / o - 1.0) if o else 0.0
        print(f"{k:24s} {o:11.3f} {l:11.3f} {diff:+10.2f}%")
        if abs(diff) > max_diff:
            bad.append(f"{k} differs by {diff:+.2f}%")
o, l = offline["prefix_cache_reused_ratio"], live["prefix_cache_reused_ratio"]
print(f"{'prefix_cache_reused':24s} {o:11.4f} {l:11.4f}")
off_w, live_w = workers("offline"), workers("live")
common = [k for k in off_w if k in live_w and live_w[k] is not None]
same = sum(1 for k in common if off_w[k] == live_w[k])
print(f"same worker live as offline: {same} of {len(common)} requests")
if bad:
    print("DISAGREE: " + "; ".join(bad))
    sys.exit(1)
print("agree")
EOF
  done
done
exit $status
