#!/usr/bin/env bash
# A fleet of mockserve processes behind ONE real KV indexer: NVIDIA Dynamo's standalone indexer
# (`python -m dynamo.indexer`, ai-dynamo 1.6.1, from `scripts/peers/setup.sh dynamo`).
#
# Starts FLEET (default 4) `mockserve serve --num-workers 1` processes, process i with its own
# HTTP port and its own event endpoint `tcp://*:KV_PORT+i`, and one indexer subscribed to all of
# them as workers 0..FLEET-1. Then:
#   1. `loadgen bench --url` against every process at once, a shared-prefix workload (the same
#      prefix groups everywhere, unique suffixes seeded per process) on a KV pool small enough
#      that blocks are evicted (so the indexer sees stores and removals from every worker);
#   2. conversation families with a long common system prompt, each variant first sent to a
#      different process, so several workers hold parts of the same prefix;
#   3. for every (conversation, worker) pair in turn: the conversation's ids from `POST /tokenize`,
#      the indexer's `POST /query` score for that worker, then what that process has cached of
#      it (the conversation sent to it again, max_tokens 1: `cached_tokens`). The probe caches the
#      conversation on that worker, which the next pair's query sees (events settle between).
# Prints one row per conversation (indexer score / mockserve cached, per worker) and exits non-zero
# on any mismatch.
#
#   scripts/kv-events-fleet.sh
#
# Needs: `cargo build --release -p mock_server -p loadgen` (or MOCKSERVE=path LOADGEN=path) and
# the Dynamo venv (SERVESIM_PEERS its root, default .peers/). Ports: HTTP_PORT+i (default 18100),
# KV_PORT+i (default 5570), indexer INDEXER_PORT (default 18190).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mockserve=${MOCKSERVE:-"$here/target/release/mockserve"}
loadgen=${LOADGEN:-"$here/target/release/loadgen"}
fleet=${FLEET:-4}
kv_port=${KV_PORT:-5570}
http_port=${HTTP_PORT:-18100}
indexer_port=${INDEXER_PORT:-18190}
block_size=${BLOCK_SIZE:-16}
gpu_blocks=${NUM_GPU_BLOCKS:-384}
requests=${REQUESTS:-200}
# shellcheck source=kv-events-common.sh
. "$here/scripts/kv-events-common.sh"

workers=()
for i in $(seq 0 $((fleet - 1))); do
  "$mockserve" serve --port $((http_port + i)) --num-workers 1 --block-size "$block_size" \
    --speedup-ratio inf --num-gpu-blocks "$gpu_blocks" \
    --kv-events-endpoint "tcp://*:$((kv_port + i))" >"$out/mockserve.$i.log" 2>&1 &
  pids+=($!)
  workers+=("$i=tcp://127.0.0.1:$((kv_port + i))")
done
"$here/scripts/peers/kv_indexer.sh" --port "$indexer_port" --block-size "$block_size" \
  --workers "$(IFS=,; echo "${workers[*]}")" >"$out/indexer.log" 2>&1 &
pids+=($!)
# A second subscriber (pyzmq, libzmq) on every endpoint: the sequence numbers it saw, to tell a
# batch lost on the wire from one a consumer skipped.
cat >"$out/sub.py" <<'PY'
import signal, sys, zmq
path, endpoints = sys.argv[1], sys.argv[2:]
ctx, poller, names = zmq.Context(), zmq.Poller(), {}
for w, e in enumerate(endpoints):
    s = ctx.socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(e)
    poller.register(s, zmq.POLLIN)
    names[s] = w
seqs = {w: [] for w in names.values()}
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
while not stop:
    for s, _ in poller.poll(100):
        _topic, seq, _payload = s.recv_multipart()
        seqs[names[s]].append(int.from_bytes(seq, "big"))
with open(path, "w") as f:
    for w, got in seqs.items():
        gaps = sum(1 for a, b in zip(got, got[1:]) if b != a + 1)
        f.write(f"worker {w}: pyzmq subscriber got {len(got)} batches, seq {got[:1]}..{got[-1:]}, {gaps} gaps\n")
PY
sub_eps=()
for i in $(seq 0 $((fleet - 1))); do sub_eps+=("tcp://127.0.0.1:$((kv_port + i))"); done
py=${SERVESIM_PEERS:-"$here/.peers"}/venv/dynamo/bin/python
sub_pid=""
if [ -x "$py" ]; then
  "$py" "$out/sub.py" "$out/sub.txt" "${sub_eps[@]}" &
  sub_pid=$!
  pids+=("$sub_pid")
fi
for i in $(seq 0 $((fleet - 1))); do wait_http "http://127.0.0.1:$((http_port + i))/health"; done
wait_http "http://127.0.0.1:$indexer_port/query"
sleep 1 # the indexer's subscriptions take effect

echo "load: loadgen bench, $requests requests per process, 4 shared 256-token prefixes"
loads=()
for i in $(seq 0 $((fleet - 1))); do
  "$loadgen" bench --url "http://127.0.0.1:$((http_port + i))" --seed $((i + 1)) \
    --num-requests "$requests" --concurrency 8 --input-tokens 48 --input-tokens-stddev 16 \
    --output-tokens 16 --shared-prefix-tokens 256 --num-prefix-groups 4 --quiet \
    --report-json "$out/bench.$i.json" >"$out/bench.$i.log" 2>&1 &
  loads+=($!)
done
for pid in "${loads[@]}"; do wait "$pid"; done
python3 - "$fleet" "$out" <<'PY'
import json, sys
fleet, out = int(sys.argv[1]), sys.argv[2]
for i in range(fleet):
    r = json.load(open(f"{out}/bench.{i}.json"))
    print(f"  process {i}: {r.get('completed_requests')} requests, "
          f"{r.get('request_throughput_rps', 0):.0f} req/s")
PY

status=0
python3 - "$fleet" "$http_port" "$indexer_port" "$block_size" <<'PY' || status=1
import json, sys, time, urllib.request
fleet, http_port, indexer_port, bs = (int(a) for a in sys.argv[1:5])
ix = f"http://127.0.0.1:{indexer_port}"
settle = 0.3  # seconds for a probe's events to reach the indexer

def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())

def ms(w):
    return f"http://127.0.0.1:{http_port + w}"

def chat(w, messages, max_tokens):
    return post(f"{ms(w)}/v1/chat/completions",
                {"model": "mock-model", "messages": messages, "max_tokens": max_tokens})

def ids(messages):
    return post(f"{ms(0)}/tokenize", {"model": "mock-model", "messages": messages,
                                      "add_generation_prompt": True})["tokens"]

# Families share a long system prompt; variants differ in the user turn. A prompt that is an exact
# multiple of the block size is lengthened by a word: the engine never counts its last token cached.
systems = [
    "You are a careful assistant for a shipping company; answer with tracking details. " * 6,
    "You review Rust code for a simulator; point out panics and blocking calls. " * 5,
    "Translate the user's sentence into formal French, keeping names unchanged. " * 4,
]
convs = []
for f, system in enumerate(systems):
    for v in range(4):
        user = f"Question {v} of family {f}: " + "please explain it step by step " * (1 + v)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if len(ids(messages)) % bs == 0:
            messages[1]["content"] += " thanks"
        convs.append(((f, v), messages, (f + v) % fleet))
for (_, messages, first) in convs:  # each variant first cached on one worker
    chat(first, messages, 8)
time.sleep(1.0)

ok = True
print(f"{'conversation':<14} {'tokens':>6}  " + "  ".join(f"{'worker ' + str(w) + ' ix/ms':>16}" for w in range(fleet)))
for ((f, v), messages, first) in convs:
    prompt = ids(messages)
    cells = []
    for w in range(fleet):
        time.sleep(settle)
        scores = post(f"{ix}/query", {"token_ids": prompt, "model_name": "default"}).get("scores", {})
        score = max(scores.get(str(w), {"0": 0}).values(), default=0)
        cached = chat(w, messages, 1)["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
        good = score == cached
        ok &= good
        cells.append(f"{score:>5} / {cached:<5}{'  ' if good else ' X'}")
    print(f"family {f} v{v:<5} {len(prompt):>6}  " + "  ".join(f"{c:>16}" for c in cells))
print("fleet: " + ("PASS (every indexer score equals the process's cached tokens)" if ok else "FAIL (X: mismatch)"))
sys.exit(0 if ok else 1)
PY

for i in $(seq 0 $((fleet - 1))); do
  m=$(curl -s "http://127.0.0.1:$((http_port + i))/metrics")
  pub=$(echo "$m" | awk '/^servesim_kv_events_published/ {s += $2} END {print s + 0}')
  drop=$(echo "$m" | awk '/^servesim_kv_events_dropped/ {s += $2} END {print s + 0}')
  echo "process $i: $pub batches published, $drop dropped"
done
if [ -n "$sub_pid" ]; then
  kill -TERM "$sub_pid"
  wait "$sub_pid" || true
  cat "$out/sub.txt"
fi
if grep -qE "WARN|ERROR|invalid type" "$out/indexer.log"; then
  echo "indexer warnings and errors:"
  grep -E "WARN|ERROR|invalid type" "$out/indexer.log" | sed 's/\x1b\[[0-9;]*m//g' | head -10
fi
exit $status
