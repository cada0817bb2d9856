#!/usr/bin/env bash
# Replays the public Mooncake trace with Dynamo's offline replay (ai-dynamo 1.6.1, set up by
# scripts/peers/setup.sh) and with `mockserve replay`, back to back, and prints the key figures
# side by side, with each tool's wall time.
#
#   scripts/compare-dynamo.sh [TRACE]      (default: traces/mooncake_synthetic_trace.jsonl)
#
# Needs: a release build (`cargo build --release`) and `scripts/peers/setup.sh dynamo` done
# (SERVESIM_PEERS pointing at its root if not the default .peers/).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
trace=${1:-"$here/traces/mooncake_synthetic_trace.jsonl"}
mockserve="$here/target/release/mockserve"
profile="$here/profiles/h200_tp1_perf.npz"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# name | dynamo_replay.py flags | mockserve replay flags
cases=(
  "kv4_s1|--workers 4 --router kv_router --speedup 1|--num-workers 4 --router-mode kv-router --arrival-speedup-ratio 1"
  "rr4_s1|--workers 4 --speedup 1|--num-workers 4 --router-mode round-robin --arrival-speedup-ratio 1"
  "rr1_s1|--workers 1 --speedup 1|--num-workers 1 --router-mode round-robin --arrival-speedup-ratio 1"
  "kv2_s1|--workers 2 --router kv_router --speedup 1|--num-workers 2 --router-mode kv-router --arrival-speedup-ratio 1"
  "rr4_s4|--workers 4 --speedup 4|--num-workers 4 --router-mode round-robin --arrival-speedup-ratio 4"
  "kv4_s4|--workers 4 --router kv_router --speedup 4|--num-workers 4 --router-mode kv-router --arrival-speedup-ratio 4"
  "kv8_s4|--workers 8 --router kv_router --speedup 4|--num-workers 8 --router-mode kv-router --arrival-speedup-ratio 4"
  "sglang4_s4|--workers 4 --router kv_router --speedup 4 --engine-type sglang|--num-workers 4 --router-mode kv-router --arrival-speedup-ratio 4 --engine-type sglang"
  "trtllm4_s4|--workers 4 --router kv_router --speedup 4 --engine-type trtllm|--num-workers 4 --router-mode kv-router --arrival-speedup-ratio 4 --engine-type trtllm"
  # The measured H200 profile instead of the polynomial (Dynamo: an external dynamo_profile
  # timing model; mockserve: --perf-profile).
  "h200_kv4_s1|--workers 4 --router kv_router --speedup 1 --perf-profile $profile|--num-workers 4 --router-mode kv-router --arrival-speedup-ratio 1 --perf-profile $profile"
  "h200_rr4_s1|--workers 4 --speedup 1 --perf-profile $profile|--num-workers 4 --router-mode round-robin --arrival-speedup-ratio 1 --perf-profile $profile"
)
for case in "${cases[@]}"; do
  IFS='|' read -r name dflags oflags <<<"$case"
  # shellcheck disable=SC2086
  "$here/scripts/peers/dynamo_replay.py" "$trace" $dflags >"$out/$name.dynamo.json"
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$mockserve" replay "$trace" -q $oflags --report-json "$out/$name.ours.json" >/dev/null
  end=$(date +%s.%N)
  python3 - "$name" "$out/$name.dynamo.json" "$out/$name.ours.json" "$start" "$end" <<'PY'
import json, sys
name, d, o, start, end = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4]), float(sys.argv[5])
keys = ["mean_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms", "mean_itl_ms", "output_throughput_tok_s", "prefix_cache_reused_ratio"]
print(f"== {name}")
for k in keys:
    a, b = d[k], o[k]
    diff = f"{b - a:+.3f}" if k == "prefix_cache_reused_ratio" else f"{(b - a) / a * 100:+.2f}%"
    print(f"  {k:28s} dynamo {a:14.3f}   mockserve {b:14.3f}   {diff}")
print(f"  {'wall (whole command, s)':28s} dynamo {d['python_wall_s']:14.3f}   mockserve {end - start:14.3f}   x{d['python_wall_s'] / (end - start):.2f} faster")
PY
done
