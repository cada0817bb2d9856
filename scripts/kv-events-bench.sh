#!/usr/bin/env bash
# What publishing KV events costs: `loadgen bench` serving throughput against a release mockserve
# at --speedup-ratio inf (no simulated time: the server's own CPU is the limit) with KV events off,
# on with nobody subscribed, and on with a ZeroMQ SUB subscriber attached to every worker's
# endpoint (pyzmq from the Dynamo venv; it counts messages, events and sequence gaps).
# Each mode runs ROUNDS times on a fresh server, interleaved (off, on, on+sub, off, ...); the
# report gives each mode's median request throughput and server CPU time per request (from
# /proc), their ratios to "off" in this same run, the batches published per second
# (`servesim_kv_events_published` over the bench's duration) and the events per second the
# subscriber received. On a shared machine other jobs take the CPU in bursts, so each mode's
# best round is its throughput without them (the median is shown too); the script fails when a
# mode's best is 10% or more below "off"'s best.
#
#   scripts/kv-events-bench.sh
#
# Needs: `cargo build --release -p mock_server -p loadgen` (or MOCKSERVE=path LOADGEN=path) and,
# for the subscriber, the Dynamo venv of `scripts/peers/setup.sh dynamo` (SERVESIM_PEERS its root,
# default .peers/). Knobs: REQUESTS (default 3000), CONCURRENCY (64), WORKERS (4), BLOCK_SIZE (16),
# ROUNDS (5); ports HTTP_PORT (18200) and KV_PORT+N (5580).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mockserve=${MOCKSERVE:-"$here/target/release/mockserve"}
loadgen=${LOADGEN:-"$here/target/release/loadgen"}
peers=${SERVESIM_PEERS:-"$here/.peers"}
py=$peers/venv/dynamo/bin/python
requests=${REQUESTS:-3000}
concurrency=${CONCURRENCY:-64}
workers=${WORKERS:-4}
block_size=${BLOCK_SIZE:-16}
rounds=${ROUNDS:-5}
http_port=${HTTP_PORT:-18200}
kv_port=${KV_PORT:-5580}
# shellcheck source=kv-events-common.sh
. "$here/scripts/kv-events-common.sh"

cat >"$out/sub.py" <<'PY'
# One SUB socket per worker endpoint; counts messages, events (the length of the array-form
# batch's event list, read from its MessagePack header) and sequence gaps until SIGTERM, then
# writes "messages events gaps" to the file named by argv[1].
import signal, sys, zmq
path, endpoints = sys.argv[1], sys.argv[2:]
ctx = zmq.Context()
poller = zmq.Poller()
socks = []
for e in endpoints:
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVHWM, 0)
    s.connect(e)
    poller.register(s, zmq.POLLIN)
    socks.append(s)
messages = events = gaps = 0

def event_count(p):
    # [ts, [events...], rank]: fixarray(3), float64 ts (0xcb + 8 bytes), then the list's header.
    if len(p) < 11 or p[0] != 0x93 or p[1] != 0xCB:
        return 0
    h = p[10]
    if 0x90 <= h <= 0x9F:
        return h - 0x90
    if h == 0xDC:
        return int.from_bytes(p[11:13], "big")
    if h == 0xDD:
        return int.from_bytes(p[11:15], "big")
    return 0

last = {}
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
while not stop:
    for s, _ in poller.poll(100):
        while True:
            try:
                _topic, seq, payload = s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            messages += 1
            events += event_count(payload)
            n = int.from_bytes(seq, "big")
            if s in last and n != last[s] + 1:
                gaps += 1
            last[s] = n
open(path, "w").write(f"{messages} {events} {gaps}\n")
PY

one_run() { # MODE ROUND: prints one JSON line with the run's figures
  local mode=$1 round=$2 flags=() sub_pid=""
  if [ "$mode" != off ]; then flags=(--kv-events-endpoint "tcp://*:$kv_port"); fi
  "$mockserve" serve --port "$http_port" --num-workers "$workers" --block-size "$block_size" \
    --speedup-ratio inf "${flags[@]}" >"$out/mockserve.$mode.$round.log" 2>&1 &
  local ms_pid=$!
  pids+=("$ms_pid")
  wait_http "http://127.0.0.1:$http_port/health"
  if [ "$mode" = sub ]; then
    local eps=()
    for w in $(seq 0 $((workers - 1))); do eps+=("tcp://127.0.0.1:$((kv_port + w))"); done
    "$py" "$out/sub.py" "$out/sub.$round" "${eps[@]}" &
    sub_pid=$!
    pids+=("$sub_pid")
    sleep 1 # the subscriptions take effect
  fi
  local cpu0 cpu1
  cpu0=$(awk '{print $14 + $15}' "/proc/$ms_pid/stat")
  "$loadgen" bench --url "http://127.0.0.1:$http_port" --num-requests "$requests" \
    --concurrency "$concurrency" --input-tokens 256 --input-tokens-stddev 64 --output-tokens 32 \
    --shared-prefix-tokens 512 --num-prefix-groups 8 --seed "$round" --quiet \
    --report-json "$out/bench.$mode.$round.json" >"$out/bench.$mode.$round.log" 2>&1
  cpu1=$(awk '{print $14 + $15}' "/proc/$ms_pid/stat")
  curl -s "http://127.0.0.1:$http_port/metrics" >"$out/metrics.$mode.$round"
  sleep 0.5
  local sub_file=""
  if [ -n "$sub_pid" ]; then
    kill -TERM "$sub_pid"
    wait "$sub_pid" || true
    sub_file=$out/sub.$round
  fi
  kill "$ms_pid" 2>/dev/null || true
  wait "$ms_pid" 2>/dev/null || true
  python3 - "$mode" "$out/bench.$mode.$round.json" "$out/metrics.$mode.$round" \
    "$(( (cpu1 - cpu0) * 1000 / $(getconf CLK_TCK) ))" "$sub_file" <<'PY'
import json, sys
mode, bench, metrics, cpu_ms, sub = sys.argv[1:6]
r = json.load(open(bench))
lines = open(metrics).read().splitlines()
def total(name):
    return sum(float(l.split()[-1]) for l in lines if l.startswith(name))
secs = r["duration_ms"] / 1000
row = {"mode": mode, "rps": r["request_throughput_rps"], "completed": r["completed_requests"],
       "secs": secs, "cpu_ms_per_req": int(cpu_ms) / max(r["completed_requests"], 1),
       "published": int(total("servesim_kv_events_published")),
       "dropped": int(total("servesim_kv_events_dropped"))}
if sub:
    got, events, gaps = (int(x) for x in open(sub).read().split())
    row.update(received=got, events=events, gaps=gaps)
print(json.dumps(row))
PY
}

echo "kv-events-bench: $requests requests x $rounds rounds per mode, concurrency $concurrency," \
  "$workers workers, block size $block_size, $(nproc) CPU cores"
for round in $(seq 1 "$rounds"); do
  for mode in off on sub; do
    if [ "$mode" = sub ] && [ ! -x "$py" ]; then continue; fi
    one_run "$mode" "$round" | tee -a "$out/results"
  done
done
python3 - "$out/results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault(r["mode"], []).append(r)
med = lambda rs, k: statistics.median(r[k] for r in rs)
best = lambda rs: max(r["rps"] for r in rs)
least = lambda rs: min(r["cpu_ms_per_req"] for r in rs)
base_best, base_med, base_cpu = best(by["off"]), med(by["off"], "rps"), least(by["off"])
names = {"off": "events off", "on": "events on, no subscriber", "sub": "events on, SUB subscriber"}
print()
print("| mode | req/s best | vs off | req/s median | vs off | server CPU ms/request (least) | vs off "
      "| batches published/s | events/s | dropped | gaps |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
worst = 1.0
for mode in ("off", "on", "sub"):
    if mode not in by:
        continue
    rs = by[mode]
    b, m, cpu = best(rs), med(rs, "rps"), least(rs)
    worst = min(worst, b / base_best)
    pub_s = statistics.median(r["published"] / r["secs"] for r in rs)
    ev_s = f"{statistics.median(r['events'] / r['secs'] for r in rs):.0f}" if "events" in rs[0] else "-"
    gaps = sum(r.get("gaps", 0) for r in rs) if mode == "sub" else "-"
    dropped = sum(r["dropped"] for r in rs)
    print(f"| {names[mode]} | {b:.0f} | {b / base_best:.3f} | {m:.0f} | {m / base_med:.3f} | {cpu:.3f} | "
          f"{cpu / base_cpu:.3f} | {pub_s:.0f} | {ev_s} | {dropped} | {gaps} |")
if "sub" in by:
    got = sum(r["received"] for r in by["sub"])
    pub = sum(r["published"] for r in by["sub"])
    print(f"\nsubscriber received {got} of {pub} published batches")
cost = 1 - worst
print(f"events cost {cost * 100:.1f}% of the best throughput (budget 10%): {'PASS' if cost < 0.10 else 'FAIL'}")
sys.exit(0 if cost < 0.10 else 1)
PY
