#!/usr/bin/env bash
# `loadgen calibrate`'s longer cases, whose figures are in docs/calibrate.md: the live side is
# the embedded mockserve, the offline side servesim's replay with the same engine flags (known
# truth: the same engine on both sides), except in the last case, where the live engine's
# decode is 25% slower.
#
#   scripts/calibrate.sh
#
# Cases:
#   mooncake-xS   the first ROWS rows of the public Mooncake trace at arrival speed-up S = 1, 2,
#                 5, 10 (warm-up 2 s of the sped-up schedule);
#   conversation  a generated conversation trace: SESSIONS sessions of 5 turns, each turn's
#                 prompt extending the previous one, a system prompt shared by all, sessions
#                 starting in groups of 5 at the same timestamp (ties);
#   agentic       scripts/gen-agentic-trace.py agentic-mooncake --plays PLAYS at speed-up 10;
#   decode-0.8    the Mooncake rows at speed-up 10, live with --decode-speedup-ratio 0.8,
#                 offline with the defaults (read back with --records).
#
# env: LOADGEN   the binary (default target/release/loadgen, else target/debug/loadgen)
#      TRACE     the Mooncake trace (default traces/mooncake_synthetic_trace.jsonl)
#      ROWS      Mooncake rows per case (default 300)
#      SESSIONS  conversation sessions (default 100: 500 requests)
#      PLAYS     agentic plays (default 12)
#      OUT       where the traces and reports go (default /tmp/calibrate)
# Prints each case's console table, then one summary line per case and metric (bias, MAPE,
# TOST), and for every case but the agentic one the prediction's own spread across 10
# offline replays with arrivals moved by up to 1 ms (--jitter-draws). Exits non-zero if a case
# fails to run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${LOADGEN:-}" ]; then
  for dir in release debug; do
    if [ -x "$here/target/$dir/loadgen" ]; then LOADGEN="$here/target/$dir/loadgen"; break; fi
  done
fi
: "${LOADGEN:?no loadgen binary: cargo build --release -p loadgen}"
TRACE=${TRACE:-$here/traces/mooncake_synthetic_trace.jsonl}
ROWS=${ROWS:-300}
SESSIONS=${SESSIONS:-100}
PLAYS=${PLAYS:-12}
OUT=${OUT:-/tmp/calibrate}
mkdir -p "$OUT"
echo "loadgen: $LOADGEN; load average: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"

for s in 1 2 5 10; do
  echo "== mooncake-x$s"
  "$LOADGEN" calibrate "$TRACE" --max-requests "$ROWS" --arrival-speedup-ratio "$s" \
    --warmup 2s --windows 4 --jitter-draws 10 --report-json "$OUT/mooncake-x$s.json" --quiet
done

python3 - "$SESSIONS" > "$OUT/conversation.jsonl" <<'EOF'
import json, random, sys
rng = random.Random(0)
sessions = int(sys.argv[1])
system = list(range(8))  # 8 blocks of 512 tokens shared by every session
next_id = 1000
for s in range(sessions):
    start = (s // 5) * 2000  # groups of 5 sessions arrive at the same timestamp
    ids = list(system)
    for turn in range(5):
        new = rng.randint(1, 3)
        ids += list(range(next_id, next_id + new))
        next_id += new
        row = {"timestamp": start, "session_id": f"conv-{s}", "input_length": 512 * len(ids),
               "output_length": rng.randint(20, 200), "hash_ids": list(ids)}
        if turn > 0:
            row["delay"] = rng.randint(500, 3000)
        print(json.dumps(row))
EOF
echo "== conversation ($(wc -l < "$OUT/conversation.jsonl") requests)"
"$LOADGEN" calibrate "$OUT/conversation.jsonl" --arrival-speedup-ratio 1 --warmup 2s \
  --windows 4 --jitter-draws 10 --report-json "$OUT/conversation.json" --quiet

python3 "$here/scripts/gen-agentic-trace.py" agentic-mooncake --plays "$PLAYS" > "$OUT/agentic.jsonl"
echo "== agentic ($(($(wc -l < "$OUT/agentic.jsonl") - 1)) requests, $PLAYS plays)"
"$LOADGEN" calibrate "$OUT/agentic.jsonl" --arrival-speedup-ratio 10 --windows 2 \
  --report-json "$OUT/agentic.json" --quiet

echo "== decode-0.8"
"$LOADGEN" replay "$TRACE" --max-requests "$ROWS" --arrival-speedup-ratio 10 \
  --decode-speedup-ratio 0.8 --per-request-jsonl "$OUT/slow.jsonl" --quiet > /dev/null
"$LOADGEN" calibrate "$TRACE" --max-requests "$ROWS" --arrival-speedup-ratio 10 --warmup 2s \
  --jitter-draws 10 --records "$OUT/slow.jsonl" --report-json "$OUT/decode-0.8.json" --quiet

echo "== summary (bias = mean measured / mean predicted - 1; TOST at ±10% on mean and p90)"
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
cases = ["mooncake-x1", "mooncake-x2", "mooncake-x5", "mooncake-x10", "conversation",
         "agentic", "decode-0.8"]
print("| case | metric | n | bias | MAPE | Pearson r | KS D | TOST mean | TOST p90 |")
print("|---|---|---|---|---|---|---|---|---|")
for c in cases:
    r = json.load(open(f"{out}/{c}.json"))
    for k in ["ttft", "itl", "e2e", "cached_tokens", "trajectory_e2e"]:
        m = r["metrics"].get(k)
        if not m:
            continue
        f = lambda x, pct=True: "-" if x is None else (f"{100*x:+.1f}%" if pct else f"{x:.3f}")
        t = lambda t: "-" if t is None else ("pass" if t["pass"] else "fail") + f" {t['ratio']:.3f} [{t['ci_low']:.3f}, {t['ci_high']:.3f}]"
        print(f"| {c} | {k} | {m['n']} | {f(m['bias'])} | {f(m['mape'])[1:] if m['mape'] is not None else '-'} "
              f"| {f(m['pearson_r'], False)} | {f(m['ks_stat'], False)} | {t(m['tost_mean'])} | {t(m['tost_p90'])} |")
print()
print("| case | same worker | live TTFT - engine TTFT: mean / p50 / p90 |")
print("|---|---|---|")
for c in cases:
    p = json.load(open(f"{out}/{c}.json")).get("live_path", {})
    o = p.get("ttft_overhead_ms") or {}
    ms = " / ".join(f"{o[k]:.2f}" for k in ("mean", "p50", "p90")) + " ms" if o else "-"
    print(f"| {c} | {p.get('same_worker', '-')} of {p.get('workers_compared', '-')} | {ms} |")
print()
print("Prediction's own spread (--jitter-draws 10: arrivals moved later by up to 1 ms; "
      "statistic / unmoved prediction), and the measured ratio:")
print()
print("| case | metric | mean: range, measured | p90: range, measured |")
print("|---|---|---|---|")
for c in cases:
    sp = json.load(open(f"{out}/{c}.json")).get("offline_spread")
    if not sp:
        continue
    for k in ["ttft", "itl", "e2e"]:
        m = sp["metrics"].get(k)
        if not m:
            continue
        cell = lambda st: (f"{m[st][0]:.3f}-{m[st][1]:.3f}, {m['measured'][st]:.3f} "
                           + ("within" if m["within"][st] else "outside"))
        print(f"| {c} | {k} | {cell('mean')} | {cell('p90')} |")
EOF
