#!/usr/bin/env bash
# N loadgen shards on N hosts of their own, one mockserve on another: each in a network
# namespace (`ip netns` + veth on one bridge, 10.200.0.0/24), so every generator has its own
# address and network stack. For a multiturn run and a trace replay:
#   1. the unsharded run from one namespace against a fresh mockserve;
#   2. the N shards (`--shard I/N`, one namespace each, started together with `--start-at`)
#      against another fresh mockserve;
#   3. `loadgen merge` of the N shards' records,
# then checks that the merge holds exactly the unsharded run's requests with the same prompt,
# output and cached tokens, and the same request counts. Prints PASS or FAIL per workload and
# exits non-zero on any FAIL.
#
#   sudo scripts/shards-netns.sh
#
# Needs root, iproute2 and jq; without root or `ip netns` it prints SKIP and exits 0.
# Binaries: MOCKSERVE and LOADGEN (default target/debug/, built when missing). N shards (default
# 4); the namespaces are named servesim-<pid>-* and removed on exit; KEEP=1 keeps the records,
# logs and compared tables and prints where.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shards=${N:-4}
mockserve=${MOCKSERVE:-"$here/target/debug/mockserve"}
loadgen=${LOADGEN:-"$here/target/debug/loadgen"}

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: needs root and iproute2 (ip netns)"
    exit 0
fi
command -v jq >/dev/null || { echo "FAIL: needs jq" >&2; exit 1; }
if (( shards < 1 || shards > 200 )); then
    echo "FAIL: N must be 1 to 200, got $shards" >&2
    exit 1
fi
if [[ ! -x $mockserve || ! -x $loadgen ]]; then
    (cd "$here" && cargo build --locked -p mock_server -p loadgen)
fi

ns=servesim-$$
work=$(mktemp -d)
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    for n in $(ip netns list | awk '{print $1}' | grep "^$ns-" || true); do
        ip netns del "$n" 2>/dev/null || true
    done
    if [[ -n ${KEEP:-} ]]; then echo "records, logs and tables: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# One bridge in a namespace of its own (the host's network is left alone); host k is namespace
# $ns-k with address 10.200.0.(k+1) on its end of a veth pair whose other end is on the bridge.
ip netns add "$ns-br"
ip -n "$ns-br" link add br0 type bridge
ip -n "$ns-br" link set br0 up
host() {
    local k=$1
    ip netns add "$ns-$k"
    ip -n "$ns-br" link add "v$k" type veth peer name eth0 netns "$ns-$k"
    ip -n "$ns-br" link set "v$k" master br0 up
    ip -n "$ns-$k" addr add "10.200.0.$((k + 1))/24" dev eth0
    ip -n "$ns-$k" link set eth0 up
    ip -n "$ns-$k" link set lo up
}
host 0 # the server
for i in $(seq 1 "$shards"); do host "$i"; done
url=http://10.200.0.1:8000

start_server() {
    ip netns exec "$ns-0" "$mockserve" serve --host 10.200.0.1 --port 8000 \
        --speedup-ratio 1000 >"$work/server.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 100); do
        ip netns exec "$ns-1" curl -sf "$url/health" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "FAIL: mockserve did not answer /health:" >&2
    cat "$work/server.log" >&2
    exit 1
}
stop_server() {
    kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
    server_pid=
}

# A trace of 3-turn sessions whose prompts share no block with another session's: the cache hits
# of each request depend on its own session only, so they are the same however the sessions'
# requests interleave.
sessions=$((shards * 3))
for s in $(seq 0 $((sessions - 1))); do
    for t in 0 1 2; do
        ids=$(seq -s, $((s * 10)) $((s * 10 + t)))
        delay=
        (( t > 0 )) && delay='"delay": 20, '
        echo "{\"timestamp\": $((s * 7 + t * 40)), \"session_id\": \"s$s\", $delay\"input_length\": $(((t + 1) * 64)), \"output_length\": $((4 + s % 5)), \"hash_ids\": [$ids]}"
    done
done | sort -t: -k2 -n >"$work/trace.jsonl"

# Prints "session turn prompt output cached" per request, sorted.
table() {
    jq -r "$1" "$2" | sort -n -k1 -k2
}

status=0
run() {
    local name=$1 key=$2
    shift 2
    start_server
    ip netns exec "$ns-1" "$loadgen" "$@" --url "$url" --per-request-jsonl "$work/$name-whole.jsonl" \
        >"$work/$name-whole.log" 2>&1 ||
        { echo "FAIL $name: the unsharded run failed"; cat "$work/$name-whole.log"; status=1; stop_server; return; }
    stop_server
    start_server
    local at=$(($(date +%s) + 3)) pids=() files=()
    for i in $(seq 0 $((shards - 1))); do
        ip netns exec "$ns-$((i + 1))" "$loadgen" "$@" --url "$url" --shard "$i/$shards" --start-at "$at" \
            --per-request-jsonl "$work/$name-$i.jsonl" >"$work/$name-$i.log" 2>&1 &
        pids+=($!)
        files+=("$work/$name-$i.jsonl")
    done
    local failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    stop_server
    if (( failed )); then
        echo "FAIL $name: a shard failed"; tail -n 5 "$work/$name"-*.log; status=1; return
    fi
    "$loadgen" merge "${files[@]}" --report-json "$work/$name-merged.json" \
        --per-request-jsonl "$work/$name-merged.jsonl" >"$work/$name-merge.log" 2>&1 ||
        { echo "FAIL $name: merge failed"; cat "$work/$name-merge.log"; status=1; return; }
    table "$key" "$work/$name-whole.jsonl" >"$work/$name-whole.tsv"
    table "$key" "$work/$name-merged.jsonl" >"$work/$name-merged.tsv"
    local requests
    requests=$(wc -l <"$work/$name-whole.tsv")
    if [[ $requests -eq 0 ]] || grep -qv $'^[0-9]*\t[0-9]*\t[0-9]*\t[0-9]*\t[0-9]*$' "$work/$name-whole.tsv"; then
        echo "FAIL $name: the unsharded run has failed requests (no usage):"
        grep -v $'^[0-9]*\t[0-9]*\t[0-9]*\t[0-9]*\t[0-9]*$' "$work/$name-whole.tsv" | head -n 5
        status=1
    elif diff -u "$work/$name-whole.tsv" "$work/$name-merged.tsv" >"$work/$name.diff"; then
        echo "PASS $name: $shards shards from $shards namespaces merge to the unsharded run's $requests requests (same prompt, output and cached tokens)"
    else
        echo "FAIL $name: the merge differs from the unsharded run (unsharded -, merged +):"
        head -n 20 "$work/$name.diff"
        status=1
    fi
}

run multiturn '[.user_id, .turn, .prompt_tokens, .output_tokens, .cached_tokens] | @tsv' \
    multiturn --quiet --num-users $((shards * 2)) --num-turns 3 --num-user-tokens 64 \
    --max-completion-tokens 8 --mean-delay-ms 50 --seed 7
run replay '.raw | [.session, .turn, .prompt_tokens, .output_tokens, .cached_tokens] | @tsv' \
    replay "$work/trace.jsonl" --quiet
exit $status
