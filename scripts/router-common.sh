# Shared by scripts/router-{bench,failover,faults,recovery}.sh (sourced, not run): the binaries,
# the routers' venv, a scratch directory `$out` (kept when KEEP=1), background processes stopped
# on exit, helpers to start a fleet and a router in front of it, and the replay slice of the
# public trace that bench, faults and recovery send through the router (REPLAY_FROM (3600),
# REPLAY_REQUESTS (300), REPLAY_SPEEDUP (4), TRACE_BLOCK_SIZE (64)).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pick_bin() { # NAME: $here/target/release/NAME if built, else target/debug/NAME
  if [ -x "$here/target/release/$1" ]; then echo "$here/target/release/$1"; else echo "$here/target/debug/$1"; fi
}
mockserve=${MOCKSERVE:-$(pick_bin mockserve)}
loadgen=${LOADGEN:-$(pick_bin loadgen)}
for b in "$mockserve" "$loadgen"; do
  [ -x "$b" ] || { echo "missing $b: cargo build -p mock_server -p loadgen (or set MOCKSERVE/LOADGEN)" >&2; exit 1; }
done
peers=${SERVESIM_PEERS:-$here/.peers}
venv=$peers/venv/routers
if ! [ -x "$venv/bin/vllm-router" ] || ! "$venv/bin/python" -c 'import sglang_router' 2>/dev/null; then
  echo "setting up the routers' venv under $peers (scripts/peers/setup.sh routers)" >&2
  SERVESIM_PEERS=$peers "$here/scripts/peers/setup.sh" routers >&2
fi
http_port=${HTTP_PORT:-18300}
kv_port=${KV_PORT:-5700}
admin_port=${ADMIN_PORT:-18299}
router_port=${ROUTER_PORT:-18390}
admin=http://127.0.0.1:$admin_port
router=http://127.0.0.1:$router_port
replay_from=${REPLAY_FROM:-3600}
replay_requests=${REPLAY_REQUESTS:-300}
replay_speedup=${REPLAY_SPEEDUP:-4}
trace_block_size=${TRACE_BLOCK_SIZE:-64}

out=$(mktemp -d "${TMPDIR:-/tmp}/router-bench.XXXXXX")
pids=()
fleet_pid="" router_pid=""
slice_trace() { # FROM N: rows FROM.. of the public Mooncake trace, N of them, timestamps from 0
    python3 - "$here/traces/mooncake_synthetic_trace.jsonl" "$1" "$2" <<'PY'
import json, sys
path, start, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip()][start:start + n]
t0 = rows[0]["timestamp"]
for r in rows:
    r["timestamp"] -= t0
    print(json.dumps(r))
PY
}
replay_through_router() { # NAME [FLAG...]: loadgen replay of $out/slice.jsonl through the router
  "$loadgen" replay "$out/slice.jsonl" --url "$router" --model mock-model --metrics-url "$admin/metrics" \
    --arrival-speedup-ratio "$replay_speedup" --trace-block-size "$trace_block_size" --no-worker-id --max-failure-rate 1 \
    --report-json "$out/$1.report.json" "${@:2}" -q >"$out/$1.loadgen.log" 2>&1 \
    || echo "  loadgen exited $? (see $out/$1.loadgen.log)" >&2
}
cleanup() {
  for pid in "${pids[@]}" $fleet_pid $router_pid; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $out" >&2; else rm -rf "$out"; fi
}
trap cleanup EXIT

wait_http() { # URL [SECONDS]: waits for a 2xx answer
  local tries=$((${2:-60} * 10))
  for _ in $(seq 1 "$tries"); do
    if curl -sf -o /dev/null "$1"; then return 0; fi
    sleep 0.1
  done
  echo "no answer from $1" >&2
  return 1
}

start_fleet() { # NAME WORKERS [mockserve fleet flags...]: a fresh fleet, its manifest in $out/NAME.fleet.json
  local name=$1 workers=$2
  shift 2
  rm -f "$out/$name.fleet.json"
  "$mockserve" fleet --workers "$workers" --port "$http_port" --admin-port "$admin_port" \
    --block-size 16 --kv-events-endpoint "tcp://*:$kv_port" --kv-events-format map-events \
    --fleet-manifest "$out/$name.fleet.json" "$@" >"$out/$name.fleet.log" 2>&1 &
  fleet_pid=$!
  wait_http "$admin/health"
}

fetch_decisions() { # the fleet's whole decision log, page by page (10,000 decisions at most each), to stdout
  local since=0 next page headers
  page=$(mktemp) headers=$(mktemp)
  while curl -sf -D "$headers" "$admin/fleet/decisions?since=$since" >"$page" && [ -s "$page" ]; do
    cat "$page"
    next=$(tr -d '\r' <"$headers" | sed -n 's/^x-fleet-next-since: //p')
    [ -n "$next" ] && [ "$next" != "$since" ] || break
    since=$next
  done
  rm -f "$page" "$headers"
}

stop_fleet() {
  if [ -n "$fleet_pid" ]; then kill "$fleet_pid" 2>/dev/null || true; wait "$fleet_pid" 2>/dev/null || true; fi
  fleet_pid=""
}

start_router() { # NAME ROUTER POLICY [router flags...]: ROUTER is vllm-router or sglang-router
  local name=$1 kind=$2 policy=$3 urls=() args=()
  shift 3
  mapfile -t urls < <(python3 -c 'import json,sys; [print(w["url"]) for w in json.load(open(sys.argv[1]))["workers"]]' "$out/$name.fleet.json")
  case $kind in
    vllm-router)
      args=("$venv/bin/vllm-router" --host 127.0.0.1 --port "$router_port" --policy "$policy" --worker-urls "${urls[@]}")
      if [ "$policy" = kv_aware ]; then
        mapfile -t -O "${#args[@]}" args < <(python3 -c 'import json,sys
for w in json.load(open(sys.argv[1]))["workers"]:
    print("--kv-event-source"); print(w["url"] + "=" + w["kv_events_endpoint"])' "$out/$name.fleet.json")
        args+=(--kv-event-block-size 16 --kv-event-model mock-model)
      fi ;;
    sglang-router)
      args=("$venv/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$router_port" --policy "$policy" --worker-urls "${urls[@]}") ;;
    *) echo "unknown router $kind" >&2; return 1 ;;
  esac
  "${args[@]}" "$@" >"$out/$name.router.log" 2>&1 &
  router_pid=$!
  wait_http "$router/health" 120
  # sglang-router answers /health before it has registered its workers (in the background):
  # wait until its /v1/models names one.
  for _ in $(seq 1 300); do
    if curl -sf "$router/v1/models" | grep -q '"id"'; then break; fi
    sleep 0.1
  done
  # Let a KV-aware router subscribe before the first request.
  sleep 1
}

stop_router() {
  if [ -n "$router_pid" ]; then kill "$router_pid" 2>/dev/null || true; wait "$router_pid" 2>/dev/null || true; fi
  router_pid=""
}
