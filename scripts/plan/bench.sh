#!/usr/bin/env bash
# The `mockserve plan` benchmark of docs/plan.md, on the public Mooncake trace at arrival
# speed-up 3, round-robin routing, SLO TTFT <= 2 s and per-request TPOT <= 50 ms, objective
# goodput per GPU, no speed-up search, over scripts/plan/mooncake-space.toml (636 candidates).
# In one run, each search pinned to CPUS (default: 2 cores) with -j JOBS and timed by GNU time
# (wall, CPU, peak RSS):
#   grid-full     the grid with --attainment Q (default 0.75), every trial in full
#                 (--no-early-stop): the baseline; its ledger also gives the best candidate
#                 without the attainment (the objective of AISimulate's recommend);
#   grid          the same grid, trials stopped once their SLO is lost (the default with
#                 --attainment);
#   halving       successive halving without --attainment (every trial in full);
#   halving-stop  successive halving with --attainment Q (trials stopped early).
# It prints the ratios (early stop's speed-up of the grid, halving's share of the grid's time),
# CPU seconds per trial, whether each halving's best is within 2% of the grid's, and checks
# that early stop changed no figure of a candidate that ran to the end and stopped only
# candidates below the attainment.
#
#   scripts/plan/bench.sh [OUT_DIR]        # OUT_DIR defaults to /tmp/plan-bench
#   BIN=path/to/mockserve scripts/plan/bench.sh   # a binary already built
#   ONLY="grid halving" Q=0.7 scripts/plan/bench.sh   # some of the searches, another target
#   TRACE=fixtures/trace_small.jsonl SPACE=S.toml scripts/plan/bench.sh   # a smoke test
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
OUT=${1:-/tmp/plan-bench}
CPUS=${CPUS:-0,1}
JOBS=${JOBS:-2}
ONLY=${ONLY:-grid-full grid halving halving-stop}
Q=${Q:-0.75}
mkdir -p "$OUT"
if [ -z "${BIN:-}" ]; then
  cargo build --release -p mock_server --locked >/dev/null
  BIN=target/release/mockserve
fi
TRACE=${TRACE:-traces/mooncake_synthetic_trace.jsonl}
SPACE=${SPACE:-scripts/plan/mooncake-space.toml}
COMMON=(--slo ttft=2000ms,tpot=50ms --objective goodput-per-gpu --router-mode round-robin
  --arrival-speedup-ratio 3 --speedup-steps 0 -j "$JOBS" -q)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); cores $CPUS, -j $JOBS"
run() { # NAME ARGS...
  local name=$1; shift
  case " $ONLY " in *" $name "*) ;; *) return 0 ;; esac
  rm -f "$OUT/$name.jsonl"
  /usr/bin/time -f "%e %M %U %S" -o "$OUT/$name.time" \
    taskset -c "$CPUS" "$BIN" plan "$TRACE" "$@" "${COMMON[@]}" \
    --ledger "$OUT/$name.jsonl" --report-json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1 ||
    echo "$name exited non-zero: $(tail -n 1 "$OUT/$name.txt")"
  echo "$name done (load average $(cut -d' ' -f1-3 /proc/loadavg))"
}
run grid-full --space "$SPACE" --attainment "$Q" --no-early-stop
run grid --space "$SPACE" --attainment "$Q"
run halving --space "$SPACE" --strategy halving
run halving-stop --space "$SPACE" --strategy halving --attainment "$Q"
python3 - "$OUT" "$CPUS" "$Q" $ONLY <<'PY'
import json, os, sys
out, cpus, q, names = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
cores = 0
for part in cpus.split(','):
    lo, _, hi = part.partition('-')
    cores += int(hi or lo) - int(lo) + 1
res = {}
for n in names:
    wall, rss, user, sys_s = open(f'{out}/{n}.time').read().split()[-4:]
    r = json.load(open(f'{out}/{n}.json'))
    cpu = float(user) + float(sys_s)
    res[n] = (float(wall), int(rss), r, cpu)
    c, b = r['counts'], r['best']
    best = (f'{b["goodput_per_gpu_tok_s"]:.2f} goodput tok/s/GPU, {b["gpus"]} GPUs, {b["mode"]}, '
            f'{b["knobs"]}') if b else 'none'
    print(f'{n}: wall_s={float(wall):.1f} peak_rss_mib={int(rss) / 1024:.0f} '
          f'trials={c["trials"]} (+{c["prefix_trials"]} on prefixes) stopped={c.get("stopped", 0)} '
          f'cpu_s={cpu:.1f} cpu_s_per_trial={cpu / max(1, c["trials"] + c["prefix_trials"]):.3f} '
          f'wall_core_s_per_trial={float(wall) * cores / max(1, c["trials"] + c["prefix_trials"]):.3f}')
    print(f'  best {best}')
def ratio(a, b, what):
    if a in res and b in res:
        print(f'{what}: wall {res[a][0] / max(res[b][0], 0.01):.2f}, '
              f'CPU {res[a][3] / max(res[b][3], 0.01):.2f}')
ratio('grid-full', 'grid', 'early stop speed-up of the grid (grid-full / grid)')
ratio('halving', 'grid-full', "halving's share of the full grid's time (halving / grid-full)")
ratio('halving-stop', 'grid', "halving-stop's share of the grid's time (halving-stop / grid)")
def best_of(n, gated):
    lines = [json.loads(l) for l in open(f'{out}/{n}.jsonl')][1:]
    ok = [l for l in lines if l['status'] == 'ok' and l['prefix_sessions'] is None
          and (not gated or l['figures']['slo_attainment'] >= q)]
    return max((l['figures']['goodput_per_gpu_tok_s'] for l in ok), default=None)
for h, g, gated in [('halving', 'grid-full', False), ('halving-stop', 'grid', True)]:
    if h in res and g in res:
        gb, hb = best_of(g, gated), best_of(h, gated)
        if gb and hb:
            print(f"{h}'s best {hb:.2f} is {100 * (gb - hb) / gb:.2f}% below {g}'s {gb:.2f} "
                  f"(aim: within 2%)")
        else:
            print(f'{h}: best {hb}, {g}: best {gb}')
if 'grid-full' in res and 'grid' in res:
    def ledger(n):
        lines = [json.loads(l) for l in open(f'{out}/{n}.jsonl')][1:]
        return {l['index']: l for l in lines}
    full, early = ledger('grid-full'), ledger('grid')
    ok = [i for i, l in early.items() if l['status'] == 'ok']
    same = all(full[i]['figures'] == early[i]['figures'] for i in ok)
    lost = [i for i, l in early.items() if l['status'] == 'stopped']
    below = all(full[i]['figures']['slo_attainment'] < q for i in lost)
    print(f'early stop: {len(ok)} candidates ran to the end with the same figures as in full: '
          f'{same}; {len(lost)} stopped, all below the attainment in full: {below}')
    if not (same and below):
        sys.exit('early stop changed a figure or stopped a feasible candidate')
PY
