#!/usr/bin/env bash
# A scale-down behind a real router: an elastic mockserve fleet of 2 workers behind vllm-router
# (round robin), loadgen sending through the router; mid-run the fleet is scaled to 1 and the
# router is reconfigured from the discovery file (POST /remove_worker?url=... for every URL that
# left it, within --drain-grace). Prints loadgen's counts and exits non-zero on any failure.
#
# Needs: target/{release,debug}/{mockserve,loadgen} and vllm-router on PATH or as $VLLM_ROUTER
# (pip install --only-binary=:all: vllm-router==0.1.17).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pick_bin() { if [ -x "$here/target/release/$1" ]; then echo "$here/target/release/$1"; else echo "$here/target/debug/$1"; fi; }
mockserve=${MOCKSERVE:-$(pick_bin mockserve)}
loadgen=${LOADGEN:-$(pick_bin loadgen)}
router_bin=${VLLM_ROUTER:-vllm-router}
port=${HTTP_PORT:-18400} admin_port=${ADMIN_PORT:-18399} router_port=${ROUTER_PORT:-18490}
admin=http://127.0.0.1:$admin_port router=http://127.0.0.1:$router_port
out=$(mktemp -d "${TMPDIR:-/tmp}/router-elastic.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ "${KEEP:-0}" = 1 ] || rm -rf "$out"; }
trap cleanup EXIT

urls() { python3 -c 'import json,sys; print(" ".join("http://%s:%s" % (e["address"], e["port"]) for e in json.load(open(sys.argv[1]))["endpoints"]))' "$out/endpoints.json"; }
scale() { curl -sf -X PUT "$admin/fleet/scale" -d "{\"spec\":{\"replicas\":$1}}" >/dev/null; }

"$mockserve" fleet --elastic --min-workers 1 --max-workers 2 --port "$port" --admin-port "$admin_port" \
  --model-load 0s --model-load-jitter 0s --drain-grace 3s --fixed-latency 5,10 \
  --discovery-file "$out/endpoints.json" >"$out/fleet.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -sf "$admin/fleet/scale" >/dev/null 2>&1 && break; sleep 0.1; done
scale 2
for _ in $(seq 100); do [ "$(urls | wc -w)" = 2 ] && break; sleep 0.1; done
before=$(urls)
echo "workers: $before"
# shellcheck disable=SC2086
"$router_bin" --worker-urls $before --policy round_robin --host 127.0.0.1 --port "$router_port" >"$out/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do curl -sf "$router/health" >/dev/null 2>&1 && break; sleep 0.1; done

# 400 requests of 50 output tokens (0.5 s each), 8 at a time: about 25 s.
"$loadgen" bench --url "$router" --concurrency 8 --num-requests 400 --input-tokens 64 --output-tokens 50 \
  --report-json "$out/report.json" >"$out/loadgen.log" 2>&1 &
bench=$!
sleep 8
scale 1
after=$(urls)
for u in $before; do
  case " $after " in *" $u "*) ;; *) echo "draining $u: $(curl -s "$u/metrics" | grep -E '^vllm:num_requests_running' | awk '{s += $2} END {print s}') requests running when the drain started";; esac
done
for u in $before; do
  case " $after " in *" $u "*) ;; *) curl -sf -X POST "$router/remove_worker?url=$u" >/dev/null && echo "removed $u from the router";; esac
done
status=0
wait "$bench" || status=$?
curl -s "$admin/fleet/scale"; echo
python3 - "$out/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key: return v
            x = find(v, key)
            if x is not None: return x
    return None
print("completed:", r["completed_requests"], "of", r["num_requests"], "failures:", r["failures"])
PY
grep -i -E "warning|ending" "$out/fleet.log" || echo "fleet log: no warning (no drain timed out)"
echo "loadgen exit status: $status"
exit "$status"
