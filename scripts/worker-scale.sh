#!/usr/bin/env bash
# How the live server scales with the number of simulated workers: for each count, mockserve's
# start-up time (process start to its "listening" line) and resident memory when idle, then the
# throughput `loadgen bench` gets from an embedded server at --speedup-ratio inf (no simulated
# delays: what is measured is the engine, router and HTTP path).
#
#   scripts/worker-scale.sh [COUNT...]           (default: 1 1024)
#
# Settings via the environment: CONCURRENCY (64), REQUESTS (3000), INPUT_TOKENS (256),
# OUTPUT_TOKENS (32), ROUTER (kv-router). Needs `cargo build --release -p mock_server -p loadgen`.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mockserve="$here/target/release/mockserve"
loadgen="$here/target/release/loadgen"
counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(1 1024)
concurrency=${CONCURRENCY:-64}
requests=${REQUESTS:-3000}
input=${INPUT_TOKENS:-256}
output=${OUTPUT_TOKENS:-32}
router=${ROUTER:-kv-router}
out=$(mktemp -d)
trap 'rm -rf "$out"; [[ -n ${pid:-} ]] && kill "$pid" 2>/dev/null || true' EXIT

printf '%8s %12s %14s %14s %12s %12s\n' workers "startup (s)" "idle RSS (MB)" "RSS/worker KB" "requests/s" "tokens/s"
base_rss=""
for n in "${counts[@]}"; do
  start=$(date +%s.%N)
  "$mockserve" serve --port 0 --num-workers "$n" --router-mode "$router" >"$out/serve.log" 2>&1 &
  pid=$!
  until grep -q "http://" "$out/serve.log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$out/serve.log" >&2; exit 1; }
    sleep 0.01
  done
  ready=$(date +%s.%N)
  sleep 0.2
  rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  [[ -n $base_rss ]] || base_rss=$rss_kb
  per_worker="-"
  if [[ $n -gt 1 ]]; then
    per_worker=$(python3 -c "print(f'{($rss_kb - $base_rss) / ($n - 1):.1f}')")
  fi
  "$loadgen" bench --num-workers "$n" --router-mode "$router" --speedup-ratio inf \
    --concurrency "$concurrency" --num-requests "$requests" --input-tokens "$input" \
    --output-tokens "$output" -q --report-json "$out/bench.json" >/dev/null
  read -r rps tps < <(python3 -c "
import json
r = json.load(open('$out/bench.json'))
print(r.get('request_throughput_rps', r.get('request_throughput', 0)),
      r.get('output_throughput_tok_s', r.get('output_throughput', 0)))")
  printf '%8s %12.3f %14.1f %14s %12.1f %12.1f\n' "$n" "$(python3 -c "print($ready - $start)")" \
    "$(python3 -c "print($rss_kb / 1024)")" "$per_worker" "$rps" "$tps"
done
