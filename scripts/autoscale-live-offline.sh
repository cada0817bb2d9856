#!/usr/bin/env bash
# Live against offline (docs/autoscale-live.md): the same trace, rate profile, policy, bounds and
# seed, replayed offline (`mockserve replay --autoscale`, the virtual clock) and live at
# speed-up S (`mockserve fleet --elastic --speedup-ratio S` fed by `loadgen replay
# --arrival-speedup-ratio S` through the fleet's front endpoint), both judged by the same judge
# in trace time. Prints one side-by-side table per policy, with the relative differences.
#
# Run with: scripts/autoscale-live-offline.sh [TRACE] [OUT_DIR]
# Settings (environment): S (10), POLICIES ("load saturation"), PERIOD (1700, seconds of the
# diurnal day in trace time), MIN_RATE (0.2), MIN (3), MAX (4), SLO, SEED (0), MAX_REQUESTS
# (all), BIN (target/release).
set -euo pipefail
TRACE=${1:-traces/mooncake_synthetic_trace.jsonl}
OUT=${2:-/tmp/autoscale-live-offline}
S=${S:-10}
POLICIES=${POLICIES:-load saturation}
PERIOD=${PERIOD:-1700}
MIN_RATE=${MIN_RATE:-0.2}
MIN=${MIN:-3}
MAX=${MAX:-4}
SLO=${SLO:-ttft=2000ms,tpot=50ms}
SEED=${SEED:-0}
BIN=${BIN:-target/release}
# The replay sets no context limit: the live fleet's must admit the trace's longest prompts
# (191,378 tokens in the public trace).
MAX_MODEL_LEN=${MAX_MODEL_LEN:-262144}
mkdir -p "$OUT"
if [ -n "${MAX_REQUESTS:-}" ]; then
  head -n "$MAX_REQUESTS" "$TRACE" >"$OUT/trace.jsonl"
  TRACE="$OUT/trace.jsonl"
fi
# The rate profile runs on each tool's replay clock: trace time offline, trace time / S live.
live_period=$(python3 -c "print(f'{$PERIOD / $S:g}')")
# Both sides route round-robin over the ready workers (the fleet's front endpoint does).
engine=(--seed "$SEED" --router-mode round-robin)
# Both sides size a worker at the trace's mean prompt and output lengths, as the replay does by
# default: the live fleet cannot read the trace, and would size at its first tick's requests.
read -r isl osl < <(python3 - "$TRACE" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(sum(r["input_length"] for r in rows) // len(rows), sum(r["output_length"] for r in rows) // len(rows))
PY
)
sizing=(--autoscale-isl "$isl" --autoscale-osl "$osl")
fleet_pid=
stop_fleet() {
  if [ -n "$fleet_pid" ]; then
    kill "$fleet_pid" 2>/dev/null || true
    wait "$fleet_pid" 2>/dev/null || true
    fleet_pid=
  fi
}
trap stop_fleet EXIT
for policy in $POLICIES; do
  "$BIN/mockserve" replay "$TRACE" "${engine[@]}" --arrival-speedup-ratio 1 \
    --rate-profile "diurnal:period=${PERIOD}s,min=$MIN_RATE" --slo "$SLO" \
    --autoscale "$policy" --min-workers "$MIN" --max-workers "$MAX" --no-oracle --quiet "${sizing[@]}" \
    --report-json "$OUT/offline-$policy.json" >/dev/null
  rm -f "$OUT/lifecycle-$policy.json" "$OUT/fleet-$policy.out"
  "$BIN/mockserve" fleet --elastic "${engine[@]}" --speedup-ratio "$S" --autoscale "$policy" \
    --min-workers "$MIN" --max-workers "$MAX" --port 0 --front-port 0 --drain-grace 0s \
    --max-model-len "$MAX_MODEL_LEN" --slo "$SLO" "${sizing[@]}" \
    --lifecycle-log "$OUT/lifecycle-$policy.json" >"$OUT/fleet-$policy.out" 2>"$OUT/fleet-$policy.err" &
  fleet_pid=$!
  front=
  for _ in $(seq 1 300); do
    front=$(sed -n 's/^mockserve fleet front listening on //p' "$OUT/fleet-$policy.out")
    [ -n "$front" ] && break
    kill -0 "$fleet_pid" 2>/dev/null || { cat "$OUT/fleet-$policy.err" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$front" ] || { echo "the fleet did not start" >&2; exit 1; }
  "$BIN/loadgen" replay "$TRACE" --url "$front" --arrival-speedup-ratio "$S" \
    --rate-profile "diurnal:period=${live_period}s,min=$MIN_RATE" \
    --fleet-lifecycle "$OUT/lifecycle-$policy.json" --slo "$SLO" \
    --report-json "$OUT/live-$policy.json" >"$OUT/loadgen-$policy.out"
  stop_fleet
done
python3 - "$OUT" "$S" $POLICIES <<'PY'
import json, sys
out, s, policies = sys.argv[1], sys.argv[2], sys.argv[3:]
keys = ["gpu_seconds", "mean_gpus", "peak_gpus", "slo_attainment", "violation_seconds",
        "scale_events", "oscillations", "duration_s"]
for p in policies:
    off = json.load(open(f"{out}/offline-{p}.json"))["autoscale"]
    live = json.load(open(f"{out}/live-{p}.json"))["autoscale"]
    print(f"\n{p}: offline against live at speed-up {s} (trace time)")
    print("| figure | offline | live | live/offline - 1 |")
    print("|---|---|---|---|")
    for k in keys:
        a, b = off[k], live[k]
        rel = "n/a" if not a else f"{(b - a) / a * 100:+.1f}%"
        fmt = (lambda v: f"{v:.4f}") if k == "slo_attainment" else (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
        print(f"| {k} | {fmt(a)} | {fmt(b)} | {rel} |")
    ev = lambda r: " ".join(f"{e['time_s']:.0f}s:{e['from']}->{e['to']}" for e in r["events"])
    print(f"events offline: {ev(off)}")
    print(f"events live:    {ev(live)}")
PY
