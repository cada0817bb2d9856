#!/usr/bin/env bash
# vllm-router's failover, against a `mockserve fleet` worker that goes down for a window.
#
# Starts a fleet of WORKERS (default 4) workers where worker DOWN_WORKER (default 1) is `down`
# from DOWN_FROM to DOWN_UNTIL seconds after the fleet starts (`--worker-faults`: its listener
# closed, connections refused, /health refused, its running requests cut), puts vllm-router 0.1.17
# in front with retries, health checks and its circuit breaker (POLICY, default round_robin), and
# drives it with `loadgen bench` at RATE requests/s for DURATION seconds. Then prints:
#   - the timeline: requests each worker received per BUCKET seconds (from the judge's decision
#     log, seconds since the fleet started), so requests visibly leave the down worker and come
#     back;
#   - the accounting: requests loadgen sent, of them succeeded and failed (from its report; their
#     sum must equal the sent ones, and so must its per-request records), and the fleet's `servesim_routing_decisions_total` (requests that reached
#     a worker: the successful ones plus any a worker received that then failed or that the
#     router sent again elsewhere), with the fleet's fault counters.
# Exits non-zero when loadgen's counts do not add up or the down worker received a request
# during its window.
#
#   scripts/router-failover.sh
#
# Needs what scripts/router-bench.sh needs (see there); same ports and KEEP=1.
set -euo pipefail
# shellcheck source=router-common.sh
. "$(dirname "$0")/router-common.sh"
workers=${WORKERS:-4}
down=${DOWN_WORKER:-1}
down_from=${DOWN_FROM:-12}
down_until=${DOWN_UNTIL:-22}
rate=${RATE:-20}
duration=${DURATION:-30}
bucket=${BUCKET:-2}
policy=${POLICY:-round_robin}

start_fleet failover "$workers" --fixed-latency 20,5 \
  --worker-faults "$down=down@${down_from}s..${down_until}s"
fleet_start=$(date +%s.%N)
start_router failover vllm-router "$policy" \
  --retry-max-retries 3 --retry-initial-backoff-ms 50 --retry-max-backoff-ms 500 \
  --cb-failure-threshold 3 --cb-success-threshold 1 --cb-timeout-duration-secs 2 \
  --health-check-interval-secs 1 --health-check-timeout-secs 1 \
  --health-failure-threshold 1 --health-success-threshold 1 --health-check-endpoint /health
echo "router-failover: $workers workers, worker $down down from ${down_from}s to ${down_until}s;" \
  "vllm-router --policy $policy; loadgen at $rate requests/s for ${duration}s from" \
  "$(python3 -c "import sys,time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$fleet_start")s" >&2
"$loadgen" bench --url "$router" --metrics-url "$admin/metrics" --request-rate "$rate" \
  --duration "$duration" --input-tokens 256 --output-tokens 16 --max-failure-rate 1 \
  --per-request-jsonl "$out/requests.jsonl" --report-json "$out/report.json" -q \
  >"$out/loadgen.log" 2>&1 || echo "loadgen exited $? (see $out/loadgen.log)" >&2
sleep 1
fetch_decisions >"$out/decisions.jsonl"
curl -sf "$admin/metrics" >"$out/metrics.txt"
curl -sf "$admin/fleet/workers" >"$out/workers.json"
stop_router
stop_fleet
python3 - "$out" "$fleet_start" "$workers" "$down" "$down_from" "$down_until" "$bucket" <<'PY'
import json, sys
out, fleet_start, workers, down, t_from, t_until, bucket = sys.argv[1], float(sys.argv[2]), *map(int, sys.argv[3:5]), *map(float, sys.argv[5:8])
ds = [json.loads(l) for l in open(f"{out}/decisions.jsonl") if l.strip()]
rs = [json.loads(l) for l in open(f"{out}/requests.jsonl") if l.strip()]
print(f"Requests each worker received, per {bucket:g} s since the fleet started (worker {down} down "
      f"from {t_from:g} s to {t_until:g} s):\n")
print("| seconds | " + " | ".join(f"worker {w}" for w in range(workers)) + " |")
print("| --- |" + " --- |" * workers)
rows = {}
for d in ds:
    t = d["time_ms"] / 1000 - fleet_start
    rows.setdefault(int(t // bucket), [0] * workers)[d["worker"]] += 1
for b in sorted(rows):
    lo = b * bucket
    mark = " (down)" if lo + bucket > t_from and lo < t_until else ""
    print(f"| {lo:g}-{lo + bucket:g}{mark} | " + " | ".join(str(n) for n in rows[b]) + " |")
inside = [d for d in ds if d["worker"] == down and t_from + 0.05 < d["time_ms"] / 1000 - fleet_start < t_until - 0.05]
metrics = {}
for line in open(f"{out}/metrics.txt"):
    if line.startswith(("servesim_routing_decisions_total", "servesim_worker_fault")):
        name, value = line.rsplit(" ", 1)
        metrics[name] = float(value)
report = json.load(open(f"{out}/report.json"))
sent, ok, failed = report["num_requests"], report["completed_requests"], report["failures"]["total"]
reasons = {}
for r in rs:
    if r.get("status") != "completed":
        key = str(r.get("error") or r.get("status"))[:80]
        reasons[key] = reasons.get(key, 0) + 1
decided = metrics.get("servesim_routing_decisions_total", float("nan"))
print()
print(f"loadgen: {sent} sent = {ok} succeeded + {failed} failed ({len(rs)} per-request records)")
for why, n in sorted(reasons.items()):
    print(f"  failed: {n} x {why}")
print(f"fleet: servesim_routing_decisions_total {decided:g} (decision log {len(ds)}): "
      f"{decided - ok:+g} against loadgen's successes")
for name, value in sorted(metrics.items()):
    if name.startswith("servesim_worker_fault"):
        print(f"  {name} {value:g}")
print(f"decisions on worker {down} inside its down window: {len(inside)}")
bad = ok + failed != sent or len(rs) != sent or inside
sys.exit(1 if bad else 0)
PY
