#!/usr/bin/env bash
# What each fault on the KV event plane costs a KV-aware router, as the fleet's routing judge
# sees it.
#
# For each fault spec in turn (`--kv-events-faults`; `none` for none), a FRESH fleet of WORKERS
# workers (empty caches; KV events in the map form, a replay endpoint per worker),
# vllm-router 0.1.17 `kv_aware` in front (subscribed to every worker's events), then the same
# seeded workload through the router: rows REPLAY_FROM.. of traces/mooncake_synthetic_trace.jsonl
# (REPLAY_REQUESTS of them, timestamps from 0, sped up REPLAY_SPEEDUP times, TRACE_BLOCK_SIZE
# prompt tokens per hash id), as scripts/router-bench.sh replays it. Then ONE table, a row per
# fault, from the judge's decision log: the achieved and the oracle prefix hit rate, regret
# p50/p99, and the decisions made on stale KV events (the events sent so far credited the chosen
# worker with evicted blocks, or showed the best worker with fewer blocks than it held; see
# docs/routers.md), and the router's resets: how often vllm-router took a sequence number lower
# than the last one it applied for a restarted publisher and forgot that worker's blocks.
#
#   scripts/router-faults.sh
#
# Prints SKIP and exits 0 when the routers' venv cannot be set up (no PyPI). Needs
# `cargo build -p mock_server -p loadgen` (release binaries are used when built; or
# MOCKSERVE=path LOADGEN=path), python3, curl. Env: WORKERS (4), FAULTS (space-separated specs),
# FLEET_FLAGS (extra `mockserve fleet` flags, e.g. a smaller pool: `--num-gpu-blocks 2048`),
# REPLAY_FROM (3600), REPLAY_REQUESTS (300), REPLAY_SPEEDUP (4), TRACE_BLOCK_SIZE (64), KEEP=1
# keeps the scratch folder; ports as scripts/router-bench.sh (HTTP_PORT, KV_PORT, ADMIN_PORT,
# ROUTER_PORT) and REPLAY_PORT (5800: the replay endpoints).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
peers=${SERVESIM_PEERS:-$here/.peers}
if ! [ -x "$peers/venv/routers/bin/vllm-router" ] \
  && ! SERVESIM_PEERS=$peers "$here/scripts/peers/setup.sh" routers >/dev/null 2>&1; then
  echo "SKIP: the routers' venv is missing and scripts/peers/setup.sh routers failed (PyPI unreachable?)"
  exit 0
fi
# shellcheck source=router-common.sh
. "$(dirname "$0")/router-common.sh"
workers=${WORKERS:-4}
faults=${FAULTS:-"none drop=0.1,seed=1 duplicate=0.2,seed=1 reorder=0.2,seed=1 delay=200 restart=25"}
replay_port=${REPLAY_PORT:-5800}
read -r -a fleet_flags <<<"${FLEET_FLAGS:-}"

slice_trace "$replay_from" "$replay_requests" >"$out/slice.jsonl"

# One table row from a run's decision log.
cat >"$out/row.py" <<'PY'
import json, sys
label, decisions, router_log = sys.argv[1], sys.argv[2], sys.argv[3]
ds = [json.loads(l) for l in open(decisions) if l.strip()]
# vllm-router's subscriber reads a sequence number below the last one it applied as a restarted
# publisher (a new engine): it warns `restart seq N < M` and forgets that worker's blocks.
resets = sum(1 for l in open(router_log, errors="replace") if "restart seq" in l)
def pct(xs, p):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))] if xs else float("nan")
prompt = sum(d["prompt_tokens"] for d in ds) or 1
achieved = sum(d["chosen_overlap_tokens"] for d in ds) / prompt
oracle = sum(d["best_overlap_tokens"] for d in ds) / prompt
regret = [d["regret_tokens"] for d in ds]
evicted = sum(1 for d in ds if d.get("stale_evicted"))
missed = sum(1 for d in ds if d.get("stale_missed"))
stale = sum(1 for d in ds if d.get("stale_evicted") or d.get("stale_missed"))
share = 100 * stale / len(ds) if ds else float("nan")
print(f"| {label} | {len(ds)} | {100 * achieved:.1f}% | {100 * oracle:.1f}% | "
      f"{pct(regret, 50)} / {pct(regret, 99)} | {stale} ({share:.1f}%) | {evicted} / {missed} | {resets} |")
PY

echo "router-faults: $workers workers, $mockserve, $loadgen, scratch $out" >&2
rows=()
for spec in $faults; do
  name="faults.${spec//[^a-z0-9]/_}"
  flags=(--kv-events-replay-endpoint "tcp://*:$replay_port" "${fleet_flags[@]}")
  if [ "$spec" != none ]; then flags+=(--kv-events-faults "$spec"); fi
  start_fleet "$name" "$workers" "${flags[@]}"
  start_router "$name" vllm-router kv_aware
  t0=$SECONDS
  replay_through_router "$name"
  fetch_decisions >"$out/$name.decisions.jsonl"
  stop_router
  stop_fleet
  row=$(python3 "$out/row.py" "$spec" "$out/$name.decisions.jsonl" "$out/$name.router.log")
  rows+=("$row")
  echo "$row ($((SECONDS - t0)) s)" >&2
done
echo
echo "| --kv-events-faults | decisions | achieved hits | oracle hits | regret p50 / p99 (tokens) | stale decisions | evicted / missed | router resets |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
