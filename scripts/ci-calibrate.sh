#!/usr/bin/env bash
# `loadgen calibrate`'s short cases, as CI runs them (.ci/run): live on the embedded mockserve
# against servesim's offline replay with the same engine flags, each with `--gate` (TOST at
# ±10% on the mean and the p90 of TTFT, ITL, E2E and, for the agentic trace, trajectory E2E).
#
#   scripts/ci-calibrate.sh
#
# One worker, so that no routing decision can differ between the two sides: with several, the
# KV router's choices turn on the load and cache at each request's arrival, and a live request
# reaching the server a millisecond after its time lands elsewhere now and then; a short
# slice's p90 rests on a few such requests (docs/calibrate.md, "Why the p90 verdicts move"). The
# several-worker figures are the longer cases' (scripts/calibrate.sh, over the whole trace).
#
# Cases:
#   mooncake-xS   the first rows of the public Mooncake trace at arrival speed-up S = 1, 2, 5,
#                 10 (40, 60, 100, 120 rows; warm-up 1 s of the sped-up schedule);
#   conversation  scripts/gen-conversation-trace.py (60 sessions, 438 requests, tied
#                 timestamps, about 85% of prompt tokens cached) at speed-up 5;
#   agentic       scripts/gen-agentic-trace.py agentic-mooncake --plays 8 at speed-up 20.
#
# Release build: a debug build adds milliseconds to each request's path, a bias of its own.
# Runs every case, prints a line per case, and exits 4 if any gate failed (1 if a case could not
# run). env: OUT, where the traces and reports go (default a temporary directory).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
cargo build --release --locked -p loadgen
loadgen=$here/target/release/loadgen
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
trace=$here/traces/mooncake_synthetic_trace.jsonl
python3 scripts/gen-conversation-trace.py --sessions 60 > "$out/conversation.jsonl"
python3 scripts/gen-agentic-trace.py agentic-mooncake --plays 8 > "$out/agentic.jsonl"
echo "calibrate short cases: load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"

status=0
run() { # NAME TRACE FLAGS...: one case; its status kept, the next case run regardless
  local name=$1 file=$2 rc=0
  shift 2
  "$loadgen" calibrate "$file" --num-workers 1 --gate --windows 2 \
    --report-json "$out/$name.json" --quiet "$@" > "$out/$name.txt" 2>&1 || rc=$?
  echo "== $name: $(tail -n 1 "$out/$name.txt")"
  if [ "$rc" -ne 0 ]; then
    cat "$out/$name.txt"
    if [ "$rc" -eq 4 ] && [ "$status" -ne 1 ]; then status=4; else status=1; fi
  fi
}
run mooncake-x1 "$trace" --max-requests 40 --arrival-speedup-ratio 1 --warmup 1s
run mooncake-x2 "$trace" --max-requests 60 --arrival-speedup-ratio 2 --warmup 1s
run mooncake-x5 "$trace" --max-requests 100 --arrival-speedup-ratio 5 --warmup 1s
run mooncake-x10 "$trace" --max-requests 120 --arrival-speedup-ratio 10 --warmup 1s
run conversation "$out/conversation.jsonl" --arrival-speedup-ratio 5 --warmup 1s
run agentic "$out/agentic.jsonl" --arrival-speedup-ratio 20
exit "$status"
