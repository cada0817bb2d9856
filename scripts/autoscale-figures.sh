#!/usr/bin/env bash
# The figures of docs/autoscale.md: the public Mooncake trace under a diurnal rate profile,
# replayed on a static fleet sized for the peak and on elastic fleets under `load` and
# `saturation`, each judged with the same SLO (the report's `autoscale` section).
#
# Run with: scripts/autoscale-figures.sh [TRACE] [OUT_DIR]
# (MOCKSERVE=target/debug/mockserve works too: the replay is deterministic, only slower)
set -euo pipefail
TRACE=${1:-traces/mooncake_synthetic_trace.jsonl}
OUT=${2:-/tmp/autoscale-figures}
# One compressed day over the trace: trough at 0 and 1,700 s, peak at 850 s.
PROFILE=${PROFILE:-diurnal:period=1700s,min=0.2}
SLO=${SLO:-ttft=2000ms,tpot=50ms}
PEAK=${PEAK:-4}
# The trough's need: one worker misses the SLO at the trough's rate.
MIN=${MIN:-2}
MOCKSERVE=${MOCKSERVE:-target/release/mockserve}
mkdir -p "$OUT"
common=(replay "$TRACE" --arrival-speedup-ratio 1 --rate-profile "$PROFILE" --slo "$SLO" --quiet)
"$MOCKSERVE" "${common[@]}" --num-workers "$PEAK" --report-json "$OUT/static.json" >/dev/null
for policy in load saturation; do
  "$MOCKSERVE" "${common[@]}" --autoscale "$policy" --min-workers "$MIN" --max-workers "$PEAK" \
    --report-json "$OUT/$policy.json" >/dev/null
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
keys = ["gpu_seconds", "mean_gpus", "peak_gpus", "slo_attainment", "violation_seconds",
        "scale_events", "oscillations", "oracle_gpu_seconds", "regret_gpu_seconds",
        "regret_slo_seconds"]
print("| run | " + " | ".join(keys) + " |")
print("|---" * (len(keys) + 1) + "|")
for run in ["static", "load", "saturation"]:
    a = json.load(open(f"{out}/{run}.json"))["autoscale"]
    cells = []
    for k in keys:
        v = a[k]
        cells.append("n/a" if v is None else (f"{v:.4f}" if k == "slo_attainment" else f"{v:.2f}" if k == "mean_gpus" else (f"{v:.0f}" if isinstance(v, float) else str(v))))
    print(f"| {run} | " + " | ".join(cells) + " |")
PY
