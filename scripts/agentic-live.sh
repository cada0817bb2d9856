#!/usr/bin/env bash
# Live against offline on an agentic trace: `loadgen replay` runs a generated agentic Mooncake
# trace (scripts/gen-agentic-trace.py: fan-out, joins, tool waits) against the embedded mockserve
# on the wall clock, `mockserve replay` runs the same file with the same engine on the virtual
# clock, and the two reports are printed side by side: requests, tokens, prefix reuse, TTFT and
# E2E (mean, median, p90), makespan, each with its difference.
#
#   scripts/agentic-live.sh
#
# env: SPEEDUP   arrival speed-up of both runs (default 10)
#      WORKERS   simulated workers (default 4)
#      PLAYS     plays in the generated trace (default: the generator's 60)
#      SEED      seed of the generated trace (default 0)
#      MOCKSERVE, LOADGEN  the binaries (default: the first built of target/release/
#                and target/debug/; a debug loadgen adds milliseconds of its own
#                to every request)
#      MAX_DIFF  largest difference in percent allowed in mean TTFT and mean E2E (default 5)
#      KEEP=DIR  keep the trace and both reports in DIR
# Prints one line per figure; exits non-zero if either run fails, if the two runs completed a
# different number of requests, or if mean TTFT or mean E2E differ by more than MAX_DIFF percent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
pick_bin() { # NAME: target/release/NAME if built, else target/debug/NAME
  local dir
  for dir in release debug; do
    if [ -x "$here/target/$dir/$1" ]; then echo "$here/target/$dir/$1"; return; fi
  done
  echo "agentic-live.sh: no $1 binary: cargo build --release -p mock_server -p loadgen" >&2
  exit 1
}
mockserve=${MOCKSERVE:-$(pick_bin mockserve)}
loadgen=${LOADGEN:-$(pick_bin loadgen)}
speedup=${SPEEDUP:-10}
workers=${WORKERS:-4}
seed=${SEED:-0}
if [ -n "${KEEP:-}" ]; then
  out=$KEEP
  mkdir -p "$out"
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/agentic-live.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi

gen=("$here/scripts/gen-agentic-trace.py" agentic-mooncake --seed "$seed")
[ -n "${PLAYS:-}" ] && gen+=(--plays "$PLAYS")
"${gen[@]}" >"$out/trace.jsonl"
engine=(--num-workers "$workers" --arrival-speedup-ratio "$speedup" --trace-format agentic-mooncake)
echo "trace: $(wc -l <"$out/trace.jsonl") lines, seed $seed; $workers workers, arrival speed-up $speedup"
echo "mockserve: $mockserve"
echo "loadgen:   $loadgen"

"$mockserve" replay "$out/trace.jsonl" "${engine[@]}" -q --report-json "$out/offline.json" >/dev/null
"$loadgen" replay "$out/trace.jsonl" "${engine[@]}" --quiet --report-json "$out/live.json" >/dev/null

python3 - "$out/offline.json" "$out/live.json" "${MAX_DIFF:-5}" <<'EOF'
import json, sys

offline, live = (json.load(open(p)) for p in sys.argv[1:3])
max_diff = float(sys.argv[3])
keys = ["completed_requests", "total_input_tokens", "total_output_tokens",
        "prefix_cache_reused_ratio", "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms",
        "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "duration_ms"]
missing = [k for k in keys if k not in offline or k not in live]
if missing:
    sys.exit(f"agentic-live.sh: a report lacks {missing}")
print(f"{'figure':28s} {'offline':>14s} {'live':>14s} {'difference':>11s}")
for k in keys:
    o, l = offline[k], live[k]
    diff = 100.0 * (l / o - 1.0) if o else 0.0
    print(f"{k:28s} {o:14.3f} {l:14.3f} {diff:+10.2f}%")
bad = []
if live["completed_requests"] != offline["completed_requests"]:
    bad.append("completed requests differ")
for k in ["mean_ttft_ms", "mean_e2e_latency_ms"]:
    diff = 100.0 * abs(live[k] / offline[k] - 1.0) if offline[k] else 0.0
    if diff > max_diff:
        bad.append(f"{k} differs by {diff:.2f}% (at most {max_diff}%)")
if bad:
    sys.exit("agentic-live.sh: live and offline disagree: " + "; ".join(bad))
print(f"live agrees with offline: mean TTFT and mean E2E within {max_diff}%")
EOF
