#!/usr/bin/env bash
# The `mockserve plan` benchmark of docs/plan.md, on the public Mooncake trace at arrival
# speed-up 3, round-robin routing, SLO TTFT <= 2 s and per-request TPOT <= 50 ms for 90% of
# requests, objective goodput per GPU, no speed-up search. In one run, each search pinned to
# CPUS (default: 2 cores) with -j JOBS and timed by GNU time (wall, peak RSS):
#   grid-full   the grid of scripts/plan/mooncake-space.toml (636 candidates), every trial in
#               full (--no-early-stop): the baseline;
#   grid        the same grid, trials stopped once their SLO is lost (the default);
#   halving     the same space with successive halving (early stop on);
#   halving-kv  scripts/plan/mooncake-space-kv.toml (the KV router added) with halving.
# It prints the ratios (early stop's speed-up of the grid, halving's share of the grid's time),
# core-seconds per candidate, whether halving's best is within 2% of the grid's, and checks
# that early stop changed no figure of a candidate that ran to the end.
#
#   scripts/plan/bench.sh [OUT_DIR]        # OUT_DIR defaults to /tmp/plan-bench
#   BIN=path/to/mockserve scripts/plan/bench.sh   # a binary already built
#   ONLY="grid halving" scripts/plan/bench.sh     # some of the searches
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=${1:-/tmp/plan-bench}
CPUS=${CPUS:-0,1}
JOBS=${JOBS:-2}
ONLY=${ONLY:-grid-full grid halving halving-kv}
mkdir -p "$OUT"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p mock_server --locked >/dev/null
  BIN=target/release/mockserve
fi
TRACE=traces/mooncake_synthetic_trace.jsonl
SPACE=scripts/plan/mooncake-space.toml
COMMON=(--slo ttft=2000ms,tpot=50ms --attainment 0.9 --objective goodput-per-gpu
  --arrival-speedup-ratio 3 --speedup-steps 0 -j "$JOBS" -q)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); cores $CPUS, -j $JOBS"
run() { # NAME ARGS...
  local name=$1; shift
  case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  rm -f "$OUT/$name.jsonl"
  /usr/bin/time -f "%e %M" -o "$OUT/$name.time" \
    taskset -c "$CPUS" "$BIN" plan "$TRACE" "$@" "${COMMON[@]}" \
    --ledger "$OUT/$name.jsonl" --report-json "$OUT/$name.json" >"$OUT/$name.txt"
  echo "$name done (load average $(cut -d' ' -f1-3 /proc/loadavg))"
}
run grid-full --space "$SPACE" --router-mode round-robin --no-early-stop
run grid --space "$SPACE" --router-mode round-robin
run halving --space "$SPACE" --router-mode round-robin --strategy halving
run halving-kv --space scripts/plan/mooncake-space-kv.toml --strategy halving
python3 - "$OUT" "$CPUS" $ONLY <<'PY'
import json, os, sys
out, cpus, names = sys.argv[1], sys.argv[2], sys.argv[3:]
cores = 0
for part in cpus.split(','):
    lo, _, hi = part.partition('-')
    cores += int(hi or lo) - int(lo) + 1
res = {}
for n in names:
    wall, rss = open(f'{out}/{n}.time').read().split()
    r = json.load(open(f'{out}/{n}.json'))
    res[n] = (float(wall), int(rss), r)
    c, b = r['counts'], r['best']
    best = (f'{b["goodput_per_gpu_tok_s"]:.2f} goodput tok/s/GPU, {b["gpus"]} GPUs, {b["mode"]}, '
            f'{b["knobs"]}') if b else 'none'
    print(f'{n}: wall_s={float(wall):.1f} peak_rss_mib={int(rss) / 1024:.0f} '
          f'trials={c["trials"]} (+{c["prefix_trials"]} on prefixes) stopped={c.get("stopped", 0)} '
          f'core_s_per_trial={float(wall) * cores / max(1, c["trials"] + c["prefix_trials"]):.3f}')
    print(f'  best {best}')
def ratio(a, b, what):
    if a in res and b in res:
        print(f'{what}: {res[a][0] / res[b][0]:.2f}')
ratio('grid-full', 'grid', 'early stop speed-up of the grid (grid-full wall / grid wall)')
ratio('halving', 'grid', "halving's share of the grid's time (halving wall / grid wall)")
if 'grid' in res and 'halving' in res and res['grid'][2]['best'] and res['halving'][2]['best']:
    g = res['grid'][2]['best']['goodput_per_gpu_tok_s']
    h = res['halving'][2]['best']['goodput_per_gpu_tok_s']
    print(f"halving's best is {100 * (g - h) / g:.2f}% below the grid's (aim: within 2%)")
if 'grid-full' in res and 'grid' in res:
    def ledger(n):
        lines = [json.loads(l) for l in open(f'{out}/{n}.jsonl')][1:]
        return {l['index']: l for l in lines}
    full, early = ledger('grid-full'), ledger('grid')
    ok = [i for i, l in early.items() if l['status'] == 'ok']
    same = all(full[i]['figures'] == early[i]['figures'] for i in ok)
    lost = [i for i, l in early.items() if l['status'] == 'stopped']
    below = all(full[i]['figures']['slo_attainment'] < 0.9 for i in lost)
    print(f'early stop: {len(ok)} candidates ran to the end with the same figures as in full: '
          f'{same}; {len(lost)} stopped, all below the attainment in full: {below}')
    if not (same and below):
        sys.exit('early stop changed a figure or stopped a feasible candidate')
PY
