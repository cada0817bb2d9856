#!/usr/bin/env bash
# mockserve's KV events read by a real consumer: NVIDIA Dynamo's standalone KV indexer
# (`python -m dynamo.indexer`, ai-dynamo 1.6.1, from `scripts/peers/setup.sh dynamo`).
#
# Starts `mockserve --num-workers 2 --kv-events-endpoint tcp://*:PORT` and the indexer on both
# workers' endpoints (PORT, PORT+1), then for each phase:
#   1. sends conversations pinned to worker 0 and worker 1 (x-worker-instance-id);
#   2. takes each conversation's prompt ids from mockserve's `POST /tokenize`;
#   3. asks the indexer `POST /query {"token_ids": ..., "model_name": "default"}`;
#   4. asks mockserve what it has cached of that prompt: the same conversation again, its
#      `usage.prompt_tokens_details.cached_tokens` (the prefix-cache hit, in tokens);
# and checks that the serving worker's score equals mockserve's cached tokens and the other
# worker scores 0. Phase "evict" runs with a small KV pool (--num-gpu-blocks) and floods worker 0
# with other prompts first, so its conversation is partly or wholly evicted.
#
#   scripts/kv-events-e2e.sh            (prints one line per check, exits non-zero on a mismatch)
#
# Needs: `cargo build -p mock_server` (debug) or MOCKSERVE=path, and the Dynamo venv of
# `scripts/peers/setup.sh dynamo` (SERVESIM_PEERS its root, default .peers/). Ports: PORT (default 5557),
# HTTP 18000, indexer 18090; override with KV_PORT, HTTP_PORT, INDEXER_PORT.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mockserve=${MOCKSERVE:-"$here/target/debug/mockserve"}
kv_port=${KV_PORT:-5557}
http_port=${HTTP_PORT:-18000}
indexer_port=${INDEXER_PORT:-18090}
block_size=${BLOCK_SIZE:-16}
# shellcheck source=kv-events-common.sh
. "$here/scripts/kv-events-common.sh"

run_phase() { # NAME MOCKSERVE_FLAGS FLOOD
  local name=$1 flags=$2 flood=$3
  # shellcheck disable=SC2086
  "$mockserve" serve --port "$http_port" --num-workers 2 --block-size "$block_size" \
    --speedup-ratio inf --kv-events-endpoint "tcp://*:$kv_port" $flags \
    >"$out/$name.mockserve.log" 2>&1 &
  pids+=($!)
  local ms_pid=$!
  "$here/scripts/peers/kv_indexer.sh" --port "$indexer_port" --block-size "$block_size" \
    --workers "0=tcp://127.0.0.1:$kv_port,1=tcp://127.0.0.1:$((kv_port + 1))" \
    >"$out/$name.indexer.log" 2>&1 &
  pids+=($!)
  local ix_pid=$!
  wait_http "http://127.0.0.1:$http_port/health"
  wait_http "http://127.0.0.1:$indexer_port/query"
  sleep 1 # the indexer's subscriptions take effect
  python3 - "$name" "$http_port" "$indexer_port" "$block_size" "$flood" <<'PY'
import json, sys, time, urllib.request
name, http_port, indexer_port, bs, flood = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
ms = f"http://127.0.0.1:{http_port}"
ix = f"http://127.0.0.1:{indexer_port}"

def post(url, body, headers=None):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())

def chat(messages, worker, max_tokens=24):
    return post(f"{ms}/v1/chat/completions", {"model": "mock-model", "messages": messages, "max_tokens": max_tokens},
                {"x-worker-instance-id": str(worker)})

convs = {
    0: [{"role": "user", "content": "Worker zero: summarise the plot of a long novel about the sea, " * 6}],
    1: [{"role": "user", "content": "Worker one: list the prime numbers and explain why they matter, " * 5}],
}
for worker, messages in convs.items():
    chat(messages, worker)
for i in range(flood):  # other prompts on worker 0: evicts part of its conversation
    chat([{"role": "user", "content": f"flood {i}: " + "filler words " * 8}], 0, max_tokens=4)
time.sleep(1.0)  # events reach the indexer
ok = True
for worker, messages in convs.items():
    ids = post(f"{ms}/tokenize", {"model": "mock-model", "messages": messages, "add_generation_prompt": True})["tokens"]
    scores = post(f"{ix}/query", {"token_ids": ids, "model_name": "default"})
    per_worker = {int(w): max(r.values()) for w, r in scores.get("scores", {}).items()}
    # What mockserve has cached of this prompt: the same conversation again on the same worker.
    again = chat(messages, worker, max_tokens=1)
    cached = again["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    got, other = per_worker.get(worker, 0), per_worker.get(1 - worker, 0)
    good = got == cached and other == 0
    ok &= good
    print(f"{name}: conversation on worker {worker}: {len(ids)} prompt tokens "
          f"({len(ids) // bs * bs} in full blocks); indexer score {got}, other worker {other}; "
          f"mockserve cached {cached}: {'OK' if good else 'MISMATCH'}  raw={json.dumps(scores)}")
sys.exit(0 if ok else 1)
PY
  local status=$?
  kill "$ms_pid" "$ix_pid" 2>/dev/null || true
  wait "$ms_pid" "$ix_pid" 2>/dev/null || true
  if grep -qiE "invalid type|decode|error" "$out/$name.indexer.log"; then
    echo "$name: indexer log lines with errors:"
    grep -iE "invalid type|decode|error" "$out/$name.indexer.log" | head -5
  fi
  return $status
}

status=0
run_phase plain "--num-gpu-blocks 16384" 0 || status=1
run_phase evict "--num-gpu-blocks 12" 6 || status=1
exit $status
