#!/usr/bin/env bash
# A KV-aware router recovering dropped KV-event batches through the replay endpoint, as the
# fleet's routing judge sees it.
#
# Twice, each on a FRESH fleet of WORKERS workers publishing KV events (map form) with seeded
# drops (`--kv-events-faults $DROP`) and a replay endpoint per worker: vllm-router 0.1.17
# `kv_aware` in front, first subscribed to the events only, then also given every worker's
# replay endpoint (`--kv-event-replay-source`); the same seeded workload through it each time
# (rows REPLAY_FROM.. of traces/mooncake_synthetic_trace.jsonl, as scripts/router-bench.sh
# replays them). Then a table, a row per run: batches dropped and batches the replay endpoints
# served (`servesim_kv_events_faults{fault="drop"}`, `servesim_kv_events_replayed`), the
# decisions made on stale KV events over the run and in each quarter of it (the judge's view
# takes a batch in when the replay endpoint serves it, so a router that recovers every gap
# brings it back to the truth), the achieved and oracle hit rates, and the router's resets (its
# `restart seq` warnings: it forgot a worker's blocks).
#
#   scripts/router-recovery.sh
#
# Prints SKIP and exits 0 when the routers' venv cannot be set up (no PyPI). Needs
# `cargo build -p mock_server -p loadgen` (or MOCKSERVE=path LOADGEN=path), python3, curl.
# Env: WORKERS (4), DROP ("drop=0.2,seed=1"), REPLAY_FROM (3600), REPLAY_REQUESTS (300),
# REPLAY_SPEEDUP (4), TRACE_BLOCK_SIZE (64), RUNS ("events-only with-replay"), ROUTER_FLAGS
# (extra vllm-router flags, e.g. `--log-level debug`), KEEP=1 keeps the scratch folder; ports as
# scripts/router-bench.sh and REPLAY_PORT (5800).
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
drop=${DROP:-"drop=0.2,seed=1"}
replay_port=${REPLAY_PORT:-5800}
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"

slice_trace "$replay_from" "$replay_requests" >"$out/slice.jsonl"

cat >"$out/row.py" <<'PY'
import json, re, sys
label, decisions, metrics, router_log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ds = [json.loads(l) for l in open(decisions) if l.strip()]
text = open(metrics).read()
def total(pattern):
    return sum(float(m.group(1)) for m in re.finditer(pattern + r"[^\n]* (\S+)\n", text))
dropped = total(r'servesim_kv_events_faults_total\{[^}]*fault="drop"')
replayed = total(r"servesim_kv_events_replayed_total\{")
stale = [bool(d.get("stale_evicted") or d.get("stale_missed")) for d in ds]
n = len(ds)
quarters = [sum(stale[i * n // 4:(i + 1) * n // 4]) for i in range(4)]
prompt = sum(d["prompt_tokens"] for d in ds) or 1
achieved = sum(d["chosen_overlap_tokens"] for d in ds) / prompt
oracle = sum(d["best_overlap_tokens"] for d in ds) / prompt
# vllm-router's `restart seq N < M` warnings: it forgot a worker's blocks.
resets = sum(1 for l in open(router_log, errors="replace") if "restart seq" in l)
print(f"| {label} | {n} | {dropped:.0f} | {replayed:.0f} | {sum(stale)} | "
      f"{' / '.join(map(str, quarters))} | {100 * achieved:.1f}% | {100 * oracle:.1f}% | {resets} |")
PY

echo "router-recovery: $workers workers, $drop, $mockserve, $loadgen, scratch $out" >&2
rows=()
for run in ${RUNS:-events-only with-replay}; do
  name="recovery.$run"
  start_fleet "$name" "$workers" --kv-events-replay-endpoint "tcp://*:$replay_port" --kv-events-faults "$drop"
  extra=()
  if [ "$run" = with-replay ]; then
    mapfile -t extra < <(python3 -c 'import json,sys
for w in json.load(open(sys.argv[1]))["workers"]:
    print("--kv-event-replay-source"); print(w["url"] + "=" + w["kv_events_replay_endpoint"])' "$out/$name.fleet.json")
  fi
  start_router "$name" vllm-router kv_aware "${extra[@]}" "${router_flags[@]}"
  t0=$SECONDS
  replay_through_router "$name"
  # Let the router finish recovering the last gaps before reading the judge.
  sleep 2
  fetch_decisions >"$out/$name.decisions.jsonl"
  curl -sf "$admin/metrics" >"$out/$name.metrics.txt"
  stop_router
  stop_fleet
  row=$(python3 "$out/row.py" "kv_aware, $run" "$out/$name.decisions.jsonl" "$out/$name.metrics.txt" "$out/$name.router.log")
  rows+=("$row")
  echo "$row ($((SECONDS - t0)) s)" >&2
done
echo
echo "| router | decisions | batches dropped | batches replayed | stale decisions | stale by quarter | achieved hits | oracle hits | router resets |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
