#!/usr/bin/env bash
# Real routers in front of a `mockserve fleet`, scored by the fleet's routing judge.
#
# For each router and policy in turn (vllm-router 0.1.17: kv_aware, cache_aware, power_of_two,
# round_robin; sglang-router 0.3.2: cache_aware, round_robin) and each workload, a FRESH fleet of
# WORKERS workers (empty caches; KV events in the map form vllm-router's kv_aware decodes), the
# router in front (kv_aware subscribed to every worker's KV events), then loadgen through the
# router:
#   replay     a slice of the Mooncake trace with real prefix sharing (rows REPLAY_FROM.. of
#              traces/mooncake_synthetic_trace.jsonl, REPLAY_REQUESTS of them, timestamps rebased
#              to 0, sped up REPLAY_SPEEDUP times), TRACE_BLOCK_SIZE prompt tokens per hash id
#              (64: prompts 8 times shorter than the trace's 512, the same sharing; debug builds
#              keep up), `--metrics-url` on the fleet's admin;
#   multiturn  MT_USERS conversations of MT_TURNS turns each (every turn re-sends the history).
# Then ONE table, a row per (router, policy, workload): decisions, the achieved and the oracle
# prefix hit rate (cached prompt tokens on the chosen / the best worker over prompt tokens, from
# the judge's decision log), regret p50/p99 (exact, from the log), TTFT p50/p99 (loadgen's
# per-request records) and load imbalance (most requests on one worker over the mean).
#
#   scripts/router-bench.sh
#
# loadgen's replay asks no serving worker (`--no-worker-id`: with `nvext` in a request,
# vllm-router 0.1.17's kv_aware credits no cached prefix; the judge says who served), and is
# given the model name: sglang-router's own /v1/models names its workers' model
# `unknown` (it reads it from SGLang's /server_info, which mockserve does not serve); so is
# multiturn.
# Needs `cargo build -p mock_server -p loadgen` (release binaries are used when built; or
# MOCKSERVE=path LOADGEN=path), python3, curl, and the routers' venv under SERVESIM_PEERS (default
# .peers/), which `scripts/peers/setup.sh routers` makes (run here when missing; needs PyPI once).
# Env: WORKERS (8), RUNS ("ROUTER:POLICY ..."), WORKLOADS ("replay multiturn"), FLEET_FLAGS
# (extra `mockserve fleet` flags), ROUTER_FLAGS (extra router flags, e.g. vllm-router's
# `--log-level debug`), KEEP=1 keeps the scratch folder (logs, decision logs,
# loadgen records); ports HTTP_PORT (18300: workers on HTTP_PORT+i), KV_PORT (5700), ADMIN_PORT
# (18299), ROUTER_PORT (18390).
set -euo pipefail
# shellcheck source=router-common.sh
. "$(dirname "$0")/router-common.sh"
workers=${WORKERS:-8}
runs=${RUNS:-"vllm-router:kv_aware vllm-router:cache_aware vllm-router:power_of_two vllm-router:round_robin sglang-router:cache_aware sglang-router:round_robin"}
workloads=${WORKLOADS:-"replay multiturn"}
read -r -a router_flags <<<"${ROUTER_FLAGS:-}"
mt_users=${MT_USERS:-32}
mt_turns=${MT_TURNS:-4}
read -r -a fleet_flags <<<"${FLEET_FLAGS:-}"

# The replay slice, timestamps from 0.
slice_trace "$replay_from" "$replay_requests" >"$out/slice.jsonl"

# One table row from a run's decision log and loadgen's per-request records.
cat >"$out/row.py" <<'PY'
import json, sys
label, workers, decisions, requests = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ds = [json.loads(l) for l in open(decisions) if l.strip()]
rs = [json.loads(l) for l in open(requests) if l.strip()]
def pct(xs, p):  # nearest rank
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))] if xs else float("nan")
prompt = sum(d["prompt_tokens"] for d in ds) or 1
achieved = sum(d["chosen_overlap_tokens"] for d in ds) / prompt
oracle = sum(d["best_overlap_tokens"] for d in ds) / prompt
regret = [d["regret_tokens"] for d in ds]
per = [0] * workers
for d in ds:
    per[d["worker"]] += 1
imbalance = max(per) / (sum(per) / workers) if ds else float("nan")
# replay's records say status and ttft_ms, multiturn's success and ttft_us.
ok = [r for r in rs if r.get("status") == "completed" or r.get("success") is True]
ttft = [r["ttft_ms"] if "ttft_ms" in r else r["ttft_us"] / 1000 for r in ok
        if r.get("ttft_ms", r.get("ttft_us")) is not None]
failed = len(rs) - len(ok)
print(f"| {label} | {workers} | {len(ds)} | {100 * achieved:.1f}% | {100 * oracle:.1f}% | "
      f"{pct(regret, 50)} / {pct(regret, 99)} | {pct(ttft, 50):.0f} / {pct(ttft, 99):.0f} | "
      f"{imbalance:.2f} | {failed} |")
PY

echo "router-bench: $workers workers, $mockserve, $loadgen, scratch $out" >&2
rows=()
for run in $runs; do
  kind=${run%%:*} policy=${run#*:}
  for workload in $workloads; do
    name="$kind.$policy.$workload"
    start_fleet "$name" "$workers" "${fleet_flags[@]}"
    start_router "$name" "$kind" "$policy" "${router_flags[@]}"
    t0=$SECONDS
    case $workload in
      replay)
        replay_through_router "$name" --per-request-jsonl "$out/$name.requests.jsonl" ;;
      multiturn)
        "$loadgen" multiturn --url "$router" --model mock-model --num-users "$mt_users" --num-turns "$mt_turns" \
          --num-user-tokens 256 --max-completion-tokens 32 --ignore-eos --max-failure-rate 1 \
          --per-request-jsonl "$out/$name.requests.jsonl" --output "$out/$name.report.json" \
          -q >"$out/$name.loadgen.log" 2>&1 || echo "  loadgen exited $? (see $out/$name.loadgen.log)" >&2 ;;
      *) echo "unknown workload $workload" >&2; exit 1 ;;
    esac
    fetch_decisions >"$out/$name.decisions.jsonl"
    stop_router
    stop_fleet
    row=$(python3 "$out/row.py" "$kind $policy, $workload" "$workers" "$out/$name.decisions.jsonl" "$out/$name.requests.jsonl")
    rows+=("$row")
    echo "$row ($((SECONDS - t0)) s)" >&2
  done
done
echo
echo "| router, policy, workload | workers | decisions | achieved hits | oracle hits | regret p50 / p99 (tokens) | TTFT p50 / p99 (ms) | load imbalance (max / mean) | failed |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
