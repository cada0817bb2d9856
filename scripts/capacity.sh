#!/usr/bin/env bash
# Capacity: the most requests per second each server sustains under one and the same client.
# Starts mockserve (speedup 1000 and inf; one worker and several) and, when Dynamo is installed,
# Dynamo's frontend + mocker at speedup 1000, drives each in turn with `loadgen bench` (the same
# flags for every target: closed loop, fixed duration, quiet, no metrics scraping), stops it, and
# prints one table: requests/s, output tokens/s, TTFT p50 and each target's ratio to Dynamo.
#
#   scripts/capacity.sh [--duration S] [--warmup S] [--concurrency N] [--input-tokens N]
#                       [--output-tokens N] [--workers N] [--no-build] [--no-dynamo] [--help]
#
# Needs: cargo (or --no-build with target/release/{mockserve,loadgen} built; MOCKSERVE and
# LOADGEN choose other binaries). Dynamo: `scripts/peers/setup.sh dynamo tokenizer` done and
# SERVESIM_PEERS set; without it the Dynamo row and the ratio column are left out.
# Every process the script starts is stopped on exit, whatever the exit path.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

duration=20
warmup=2
concurrency=32
input_tokens=128
output_tokens=32
workers=4
build=1
dynamo=auto
dynamo_port=${DYNAMO_PORT:-8000}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  cat <<EOF
Flags (defaults in brackets):
  --duration S        seconds each target is driven, warmup included [$duration]
  --warmup S          first seconds left out of the figures [$warmup]
  --concurrency N     closed-loop users [$concurrency]
  --input-tokens N    prompt tokens per request [$input_tokens]
  --output-tokens N   output tokens per request [$output_tokens]
  --workers N         simulated workers of the "several workers" mockserve rows [$workers]
  --no-build          use the release binaries as they are (no cargo build)
  --no-dynamo         leave Dynamo out even when it is installed
  -h, --help          this text
Env: SERVESIM_PEERS (Dynamo's root, see scripts/peers/setup.sh), DYNAMO_PORT [8000],
     MOCKSERVE, LOADGEN (binaries) [target/release/mockserve, target/release/loadgen].
EOF
}

die() { echo "capacity.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case $1 in
    --duration) duration=${2:?--duration needs a value}; shift 2 ;;
    --warmup) warmup=${2:?--warmup needs a value}; shift 2 ;;
    --concurrency) concurrency=${2:?--concurrency needs a value}; shift 2 ;;
    --input-tokens) input_tokens=${2:?--input-tokens needs a value}; shift 2 ;;
    --output-tokens) output_tokens=${2:?--output-tokens needs a value}; shift 2 ;;
    --workers) workers=${2:?--workers needs a value}; shift 2 ;;
    --no-build) build=0; shift ;;
    --no-dynamo) dynamo=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
done
for v in "$duration" "$warmup" "$concurrency" "$input_tokens" "$output_tokens" "$workers" "$dynamo_port"; do
  case $v in '' | *[!0-9]*) die "'$v' is not a whole number" ;; esac
done
[ "$warmup" -lt "$duration" ] || die "--warmup ($warmup s) must be shorter than --duration ($duration s)"

mockserve=${MOCKSERVE:-$here/target/release/mockserve}
loadgen=${LOADGEN:-$here/target/release/loadgen}
if [ $build = 1 ] && [ -z "${MOCKSERVE:-}${LOADGEN:-}" ]; then
  echo "building release binaries (cargo build --release -p mock_server -p loadgen --bins)" >&2
  (cd "$here" && cargo build --release --quiet -p mock_server -p loadgen --bins)
fi
[ -x "$mockserve" ] || die "no mockserve at $mockserve (cargo build --release -p mock_server)"
[ -x "$loadgen" ] || die "no loadgen at $loadgen (cargo build --release -p loadgen)"

run_dynamo=$here/scripts/peers/run_dynamo.sh
if [ $dynamo = auto ]; then
  dynamo=0
  if [ -n "${SERVESIM_PEERS:-}" ] && [ -x "$SERVESIM_PEERS/venv/dynamo/bin/python" ]; then dynamo=1; fi
fi

out=$(mktemp -d)
server_pid=
dynamo_started=0
cleanup() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  if [ $dynamo_started = 1 ]; then "$run_dynamo" stop >&2 || true; fi
  rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The client: identical for every target.
drive() {  # name url
  local name=$1 url=$2 rc=0
  echo "driving $name for ${duration} s ($concurrency users, $input_tokens in / $output_tokens out)" >&2
  "$loadgen" bench --url "$url" --concurrency "$concurrency" --duration "$duration" \
    --warmup "${warmup}s" --input-tokens "$input_tokens" --output-tokens "$output_tokens" \
    --max-failure-rate 0.01 --no-scrape-metrics -q --report-json "$out/$name.json" \
    >"$out/$name.log" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    echo "capacity.sh: loadgen against $name exited with $rc; its output:" >&2
    tail -n 20 "$out/$name.log" >&2
    exit 1
  fi
  echo "$name" >>"$out/order"
}

# mockserve on a free port: sets `url` once it listens, or fails within 30 s.
start_mockserve() {  # name flags...
  local name=$1
  url=
  shift
  "$mockserve" serve --host 127.0.0.1 --port 0 "$@" >"$out/$name.server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do
    url=$(sed -n 's/^mockserve listening on \(http:[^ ]*\)$/\1/p' "$out/$name.server.log")
    [ -n "$url" ] && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "capacity.sh: mockserve ($name: $*) did not come up; its output:" >&2
    tail -n 20 "$out/$name.server.log" >&2
    exit 1
  fi
}

stop_mockserve() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
}

# name | mockserve flags
targets=(
  "mockserve 1000x 1w|--speedup-ratio 1000 --num-workers 1"
  "mockserve 1000x ${workers}w|--speedup-ratio 1000 --num-workers $workers"
  "mockserve inf 1w|--speedup-ratio inf --num-workers 1"
  "mockserve inf ${workers}w|--speedup-ratio inf --num-workers $workers"
)
for t in "${targets[@]}"; do
  IFS='|' read -r name flags <<<"$t"
  # shellcheck disable=SC2086
  start_mockserve "$name" $flags
  drive "$name" "$url"
  stop_mockserve
done

if [ $dynamo = 1 ]; then
  # Never drive (or stop) a Dynamo this script did not start.
  if "$run_dynamo" status >/dev/null 2>&1; then
    die "Dynamo is already running (scripts/peers/run_dynamo.sh status); stop it first"
  fi
  echo "starting Dynamo's frontend + mocker (speedup 1000) on 127.0.0.1:$dynamo_port" >&2
  dynamo_started=1
  MOCKER_ARGS="--speedup-ratio 1000" "$run_dynamo" start "$dynamo_port" mock-model >&2 ||
    die "Dynamo did not come up (logs in \$SERVESIM_PEERS/run/dynamo)"
  drive "dynamo 1000x 1w" "http://127.0.0.1:$dynamo_port"
  "$run_dynamo" stop >&2 || true
  dynamo_started=0
fi

# A top-level number of a report (loadgen writes one key per line).
figure() {  # file key
  sed -n "s/^ *\"$2\": *\([-0-9.eE+]*\),\{0,1\}$/\1/p" "$1" | head -n 1
}

base=
if [ -f "$out/dynamo 1000x 1w.json" ]; then base=$(figure "$out/dynamo 1000x 1w.json" request_throughput_rps); fi
echo
echo "capacity: loadgen bench --concurrency $concurrency --input-tokens $input_tokens --output-tokens $output_tokens --duration $duration --warmup ${warmup}s, $(nproc) cores"
printf '%-22s %12s %16s %14s %10s\n' target "requests/s" "output tok/s" "TTFT p50 ms" "x Dynamo"
while read -r name; do
  f="$out/$name.json"
  rps=$(figure "$f" request_throughput_rps)
  tps=$(figure "$f" output_throughput_tok_s)
  ttft=$(figure "$f" median_ttft_ms)
  ratio=-
  if [ -n "$base" ]; then ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN { printf "%.1f", a / b }'); fi
  printf '%-22s %12.0f %16.0f %14.2f %10s\n' "$name" "$rps" "$tps" "$ttft" "$ratio"
done <"$out/order"
