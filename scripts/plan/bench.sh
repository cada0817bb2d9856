#!/usr/bin/env bash
# The `mockserve plan` benchmark of docs/plan.md: the grid of scripts/plan/mooncake-space.toml
# (636 candidates) on the public Mooncake trace at arrival speed-up 3, round-robin routing,
# SLO TTFT <= 2 s and per-request TPOT <= 50 ms, objective goodput per GPU; then the same space
# with successive halving, and the space with the KV router added. Each run is pinned to
# CPUS (default: 2 cores) and timed by GNU time (wall, peak RSS).
#
#   scripts/plan/bench.sh [OUT_DIR]        # OUT_DIR defaults to /tmp/plan-bench
#   BIN=path/to/mockserve scripts/plan/bench.sh   # a binary already built
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=${1:-/tmp/plan-bench}
CPUS=${CPUS:-0,1}
JOBS=${JOBS:-2}
mkdir -p "$OUT"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p mock_server --locked >/dev/null
  BIN=target/release/mockserve
fi
TRACE=traces/mooncake_synthetic_trace.jsonl
COMMON=(--slo ttft=2000ms,tpot=50ms --objective goodput-per-gpu --arrival-speedup-ratio 3
  --speedup-steps 0 -j "$JOBS" -q)
run() { # NAME ARGS...
  local name=$1; shift
  rm -f "$OUT/$name.jsonl"
  /usr/bin/time -f "$name wall_s=%e peak_rss_kib=%M" -o "$OUT/$name.time" \
    taskset -c "$CPUS" "$BIN" plan "$TRACE" "$@" "${COMMON[@]}" \
    --ledger "$OUT/$name.jsonl" --report-json "$OUT/$name.json" >"$OUT/$name.txt"
  cat "$OUT/$name.time"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r["best"]
print(f'  trials {r["counts"]["trials"]} (+{r["counts"]["prefix_trials"]} on prefixes); best '
      f'{b["goodput_per_gpu_tok_s"]:.2f} goodput tok/s/GPU, {b["gpus"]} GPUs, {b["mode"]}, '
      f'{b["knobs"]}')
PY
}
run grid --space scripts/plan/mooncake-space.toml --router-mode round-robin
run halving --space scripts/plan/mooncake-space.toml --router-mode round-robin --strategy halving
run grid-kv --space scripts/plan/mooncake-space-kv.toml
