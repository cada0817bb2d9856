#!/usr/bin/env bash
# NVIDIA Dynamo's OpenAI-compatible frontend + mocker engine as a live server on 127.0.0.1 only,
# on one machine, with no etcd and no NATS. Reference tooling to compare servesim against Dynamo.
#
#   discovery  file backend in $SERVESIM_PEERS/run/dynamo/kv      (--discovery-backend file)
#   requests   TCP request plane on 127.0.0.1                     (--request-plane tcp)
#   events     ZMQ event plane through zmq_broker.py on 127.0.0.1 (--event-plane zmq), so that no
#              publisher binds 0.0.0.0
#   tokenizer  the local directory built by `setup.sh tokenizer`; no model hub is contacted
#
# usage: scripts/peers/run_dynamo.sh start [PORT=8000] [MODEL=mock-model] | stop | status
# env:   SERVESIM_PEERS  root of all state (default: .peers/ in the repository root)
#        MOCKER_ARGS     extra dynamo.mocker flags, split on whitespace,
#                        e.g. "--speedup-ratio 1000 --num-workers 4"
#        ROUTER_MODE     frontend --router-mode: round-robin (default), kv, random, ...
#        FRONTEND_ARGS   extra dynamo.frontend flags, split on whitespace
#        ZMQ_XSUB_PORT, ZMQ_XPUB_PORT   loopback event-plane broker ports (default 5557, 5558)
#        START_TIMEOUT   seconds to wait for the model to be listed (default 60)
#        DYN_LOG         Dynamo's log level (default info)
# Logs and PID files: $SERVESIM_PEERS/run/dynamo/{broker,frontend,mocker}.{log,pid}.
# `stop` only signals the processes recorded in those PID files by `start`.
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RUN=$ROOT/run/dynamo
PY=$PEERS_PY
TOKENIZER=$ROOT/tokenizer/deepseek-v3-tok
XSUB=${ZMQ_XSUB_PORT:-5557}
XPUB=${ZMQ_XPUB_PORT:-5558}
NAMES=(broker frontend mocker)

die() { echo "run_dynamo.sh: $*" >&2; exit 1; }

# A PID file holds "PID STARTTIME" (field 22 of /proc/PID/stat), so it matches only the process
# that `start` launched, never a later process that happens to get the same PID.
proc_starttime() {  # pid -> starttime, fails if no such live (non-zombie) process
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086
  set -- $stat
  [ "$1" != Z ] || return 1
  echo "${20}"
}

running_pid() {  # name -> prints the PID if the process that `start` recorded is still running
  local pid start now
  [ -f "$RUN/$1.pid" ] || return 1
  read -r pid start < "$RUN/$1.pid" || return 1
  now=$(proc_starttime "$pid") || return 1
  [ "$now" = "$start" ] || return 1
  echo "$pid"
}

start_bg() {  # name cmd... : own session (no SIGHUP from the terminal), output to NAME.log
  local name=$1 pid
  shift
  setsid "$@" > "$RUN/$name.log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid $(proc_starttime "$pid")" > "$RUN/$name.pid"
}

stop_one() {  # name -> 0 if something was stopped
  local name=$1 pid
  if ! pid=$(running_pid "$name"); then rm -f "$RUN/$name.pid"; return 1; fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running_pid "$name" > /dev/null || break; sleep 0.2; done
  if running_pid "$name" > /dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    echo "killed $name (pid $pid)"
  else
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$RUN/$name.pid"
}

do_stop() {
  local any=0
  for name in mocker frontend broker; do
    if stop_one "$name"; then any=1; fi
  done
  rm -f "$RUN/instance"
  [ $any = 1 ] || echo "dynamo: nothing running"
}

port_free() {  # port: nothing listens on 127.0.0.1:PORT (or on a wildcard address)
  "$PY" - "$1" <<'EOF'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

model_listed() {  # port model: GET /v1/models lists MODEL (proxy variables ignored)
  "$PY" - "$1" "$2" <<'EOF'
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(f"http://127.0.0.1:{sys.argv[1]}/v1/models", timeout=2) as r:
        ids = [m.get("id") for m in json.load(r).get("data", [])]
except Exception:
    sys.exit(1)
sys.exit(0 if sys.argv[2] in ids else 1)
EOF
}

dyn_env() {
  peers_isolate
  export DYN_FILE_KV=$RUN/kv DYN_LOG=${DYN_LOG:-info}
  # Every host Dynamo binds or advertises: loopback.
  export DYN_HTTP_HOST=127.0.0.1 DYN_HTTP_RPC_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
  export DYN_TCP_RPC_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_EVENT_PLANE_HOST=127.0.0.1
  export DYN_ZMQ_BROKER_URL="xsub=tcp://127.0.0.1:$XSUB,xpub=tcp://127.0.0.1:$XPUB"
}

do_start() {
  local port=$1 model=$2 n_running=0 name t0 mocker_args frontend_args
  case $port in '' | *[!0-9]*) die "PORT must be a number, not '$port'" ;; esac
  [ -x "$PY" ] || die "no Dynamo venv at $ROOT/venv/dynamo: run scripts/peers/setup.sh dynamo"
  [ -f "$TOKENIZER/tokenizer.json" ] || die "no tokenizer at $TOKENIZER: run scripts/peers/setup.sh tokenizer"
  for name in "${NAMES[@]}"; do
    if running_pid "$name" > /dev/null; then n_running=$((n_running + 1)); fi
  done
  if [ $n_running = ${#NAMES[@]} ]; then
    if [ "$(cat "$RUN/instance" 2>/dev/null)" = "$port $model" ]; then
      echo "dynamo already running on http://127.0.0.1:$port/v1 model=$model"
      return 0
    fi
    die "dynamo is running with other settings ($(cat "$RUN/instance" 2>/dev/null)); run '$0 stop' first"
  fi
  if [ $n_running -gt 0 ]; then
    echo "a previous start is partly running; stopping it"
    do_stop
  fi
  for p in "$port" "$XSUB" "$XPUB"; do
    port_free "$p" || die "port $p on 127.0.0.1 is in use (PORT, ZMQ_XSUB_PORT, ZMQ_XPUB_PORT choose the ports)"
  done
  read -r -a mocker_args <<< "${MOCKER_ARGS:-}"
  read -r -a frontend_args <<< "${FRONTEND_ARGS:-}"
  mkdir -p "$RUN" "$ROOT/home" "$ROOT/cache"
  rm -rf "$RUN/kv"   # stale discovery entries from an earlier run
  dyn_env
  t0=$(date +%s%N)

  start_bg broker "$PY" "$PEERS_HERE/zmq_broker.py" "$XSUB" "$XPUB"
  for _ in $(seq 50); do grep -q '^zmq broker' "$RUN/broker.log" 2>/dev/null && break; sleep 0.1; done
  start_bg frontend "$PY" -m dynamo.frontend --http-host 127.0.0.1 --http-port "$port" \
    --discovery-backend file --request-plane tcp --event-plane zmq \
    --router-mode "${ROUTER_MODE:-round-robin}" "${frontend_args[@]}"
  start_bg mocker "$PY" -m dynamo.mocker --model-path "$TOKENIZER" --model-name "$model" \
    --discovery-backend file --request-plane tcp --event-plane zmq "${mocker_args[@]}"
  echo "$port $model" > "$RUN/instance"

  local deadline=$((SECONDS + ${START_TIMEOUT:-60}))
  while [ $SECONDS -lt $deadline ]; do
    if model_listed "$port" "$model"; then
      local ms=$((($(date +%s%N) - t0) / 1000000))
      echo "dynamo ready on http://127.0.0.1:$port/v1 model=$model in $((ms / 1000)).$((ms % 1000 / 100)) s" \
        "(router ${ROUTER_MODE:-round-robin}; mocker args: ${MOCKER_ARGS:-none}; logs in $RUN)"
      return 0
    fi
    for name in "${NAMES[@]}"; do
      if ! running_pid "$name" > /dev/null; then
        echo "run_dynamo.sh: $name exited during start; last lines of $RUN/$name.log:" >&2
        tail -n 20 "$RUN/$name.log" >&2
        do_stop > /dev/null
        exit 1
      fi
    done
    sleep 0.3
  done
  echo "run_dynamo.sh: model '$model' not listed after ${START_TIMEOUT:-60} s; logs in $RUN" >&2
  do_stop > /dev/null
  exit 1
}

do_status() {
  local name pid all=1
  for name in "${NAMES[@]}"; do
    if pid=$(running_pid "$name"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; all=0; fi
  done
  if [ $all = 1 ]; then
    read -r port model < "$RUN/instance"
    echo "serving model=$model on http://127.0.0.1:$port/v1"
    return 0
  fi
  return 3
}

case ${1:-} in
  start) do_start "${2:-8000}" "${3:-mock-model}" ;;
  stop) do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 start [PORT=8000] [MODEL=mock-model] | stop | status" >&2; exit 2 ;;
esac
