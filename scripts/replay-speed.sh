#!/usr/bin/env bash
# Offline-replay speed of `mockserve replay` for every setting of scripts/compare-dynamo.sh:
# the best process wall time of RUNS runs (trace parsing included), the instruction count under
# callgrind (repeatable on a noisy machine; needs valgrind), and, when Dynamo 1.6.1 is set up
# (scripts/peers/setup.sh dynamo, SERVESIM_PEERS pointing at its root), Dynamo's replay of the same
# setting, run alternately with ours (the best of RUNS runs of each), and how many times faster
# ours is.
#
#   scripts/replay-speed.sh [--runs N] [--copies K] [--no-dynamo] [--instructions] [TRACE]
#
#   --runs N          wall-time runs per setting, ours and Dynamo's each, the best is kept
#                     (default 3)
#   --copies K        replay K back-to-back copies of TRACE instead (scripts/concat-trace.py writes
#                     them to a temporary file; nothing is kept)
#   --no-dynamo       skip Dynamo even when it is installed
#   --instructions    also count instructions with valgrind --tool=callgrind (about a minute per
#                     setting)
#   TRACE             default traces/mooncake_synthetic_trace.jsonl
#
# Needs a release build (`cargo build --release -p mock_server`). Dynamo's figures are its
# process wall time ("proc", Python start-up and imports included) and the wall time of its
# replay call alone ("call", what dynamo_replay.py reports as python_wall_s); "x" is Dynamo's call
# time over our process time, the stricter of the two ratios.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mockserve="$here/target/release/mockserve"
runs=3
copies=1
dynamo=1
instructions=0
trace="$here/traces/mooncake_synthetic_trace.jsonl"
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --copies) copies=$2; shift 2 ;;
    --no-dynamo) dynamo=0; shift ;;
    --instructions) instructions=1; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) trace=$1; shift ;;
  esac
done
[[ -x $mockserve ]] || { echo "no $mockserve: run cargo build --release -p mock_server" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [[ $copies -gt 1 ]]; then
  python3 "$here/scripts/concat-trace.py" "$trace" "$copies" >"$out/trace.jsonl"
  trace="$out/trace.jsonl"
fi
peers=${SERVESIM_PEERS:-$here/.peers}
if [[ $dynamo -eq 1 && ! -x $peers/venv/dynamo/bin/python ]]; then
  dynamo=0
fi
if [[ $instructions -eq 1 ]] && ! command -v valgrind >/dev/null; then
  echo "valgrind not found: no instruction counts" >&2
  instructions=0
fi

# The settings of scripts/compare-dynamo.sh: name | dynamo_replay.py flags | mockserve flags.
eval "$(sed -n '/^profile=/p; /^cases=(/,/^)/p' "$here/scripts/compare-dynamo.sh")"

now() { date +%s.%N; }
printf '%s: %s requests, %s, %s core(s)\n' "$(basename "$trace")" "$(wc -l <"$trace")" \
  "$(uname -m)" "$(nproc)"
printf '%-12s %10s %12s %10s %10s %8s\n' setting "ours (s)" "instructions" "dyn proc" "dyn call" "x"
for case in "${cases[@]}"; do
  IFS='|' read -r name dflags oflags <<<"$case"
  # Ours and Dynamo's runs alternate, so both see the machine in the same state; the best of
  # each is kept.
  best="" dproc="" dcall=""
  for _ in $(seq "$runs"); do
    start=$(now)
    # shellcheck disable=SC2086
    "$mockserve" replay "$trace" -q $oflags >/dev/null 2>&1
    t=$(python3 -c "print($(now) - $start)")
    best=$(python3 -c "print(min(x for x in [$t, ${best:-$t}]))")
    if [[ $dynamo -eq 1 ]]; then
      start=$(now)
      # shellcheck disable=SC2086
      SERVESIM_PEERS=$peers "$here/scripts/peers/dynamo_replay.py" "$trace" $dflags >"$out/d.json"
      p=$(python3 -c "print(f'{$(now) - $start:.3f}')")
      c=$(python3 -c "import json; print(f\"{json.load(open('$out/d.json'))['python_wall_s']:.3f}\")")
      dproc=$(python3 -c "print(f'{min($p, ${dproc:-$p}):.3f}')")
      dcall=$(python3 -c "print(f'{min($c, ${dcall:-$c}):.3f}')")
    fi
  done
  instr="-"
  if [[ $instructions -eq 1 ]]; then
    # shellcheck disable=SC2086
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.out" "$mockserve" replay "$trace" -q \
      $oflags >/dev/null 2>"$out/cg.log"
    instr=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/cg.log")
  fi
  ratio="-"
  if [[ $dynamo -eq 1 ]]; then
    ratio=$(python3 -c "print(f'{$dcall / $best:.1f}')")
  else
    dproc="-" dcall="-"
  fi
  printf '%-12s %10.3f %12s %10s %10s %8s\n' "$name" "$best" "$instr" "$dproc" "$dcall" "$ratio"
done
