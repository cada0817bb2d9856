#!/usr/bin/env bash
# Replays agentic traces with AISimulate (0.13.0.dev, its built-in engine, set up by
# `scripts/peers/setup.sh aisimulate`) and with `mockserve replay`, with the same engine settings
# (aggregated vLLM, round-robin placement, Dynamo mocker's defaults: 16,384 KV blocks of 64
# tokens, 256 sequences and 8,192 tokens per pass, polynomial timing), and prints them side by
# side: the report figures with the relative difference, the per-request dispatch times compared
# (how many are identical, the largest difference) and each tool's process time.
#
#   scripts/compare-aisimulate.sh [CASE...]      (default: every case below)
#
# Cases (NAME: trace, workers, arrival speedup, lanes):
#   am_rr4_s1   agentic Mooncake v2 (scripts/gen-agentic-trace.py agentic-mooncake), 4 workers, 1
#   am_light    a lighter agentic Mooncake v2 trace (40 plays a minute apart), 4 workers, 1
#   am_rr1_s1   the first trace on 1 worker (heavy queueing)
#   am_rr4_s2   4 workers, speedup 2 (floors and tool waits halved)
#   am_rr4_l8   4 workers, speedup 1, 8 agentic lanes
#   weka_rr4_s1 weka corpus with sub-agents (scripts/gen-agentic-trace.py weka), 4 workers, 1
#   weka_rr4_l8 the same in 8 lanes
#   worked      fixtures/agentic/worked_example.jsonl on 1 worker
#
# env: MOCKSERVE   the binary (default: target/release/mockserve if built, else target/debug/mockserve;
#                  `cargo build -p mock_server --locked` is enough for parity, speed wants --release)
#      SEED        seed of the generated traces (default 0)
#      KEEP=DIR    keep the traces, configs and both tools' outputs in DIR (default: a temp dir,
#                  removed at exit)
#      SERVESIM_PEERS  root of the peers (default .peers/), as for scripts/peers/setup.sh
#
# "identical" start times: AISimulate's clock is a float, mockserve's whole nanoseconds (each
# pass time rounded to the nanosecond), so a time counts as identical when the two are within
# 1 us (the largest difference is printed too). Process time is
# user + system CPU of the whole command (AISimulate: Python start-up, its imports and the
# compiled replay; mockserve: the whole binary).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=peers/common.sh
. "$here/scripts/peers/common.sh"
ais="$ROOT/venv/aisimulate/bin/aisimulate"
[ -x "$ais" ] || { echo "compare-aisimulate.sh: $ais missing: run scripts/peers/setup.sh aisimulate" >&2; exit 1; }
if [ -z "${MOCKSERVE:-}" ]; then
  MOCKSERVE=$here/target/release/mockserve
  [ -x "$MOCKSERVE" ] || MOCKSERVE=$here/target/debug/mockserve
fi
[ -x "$MOCKSERVE" ] || { echo "compare-aisimulate.sh: no mockserve binary (cargo build -p mock_server --locked)" >&2; exit 1; }
if [ -n "${KEEP:-}" ]; then
  out=$KEEP
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
seed=${SEED:-0}
"$here/scripts/gen-agentic-trace.py" agentic-mooncake --seed "$seed" >"$out/agentic.jsonl"
"$here/scripts/gen-agentic-trace.py" agentic-mooncake --seed "$seed" --plays 40 --mean-play-gap-ms 60000 \
  >"$out/light.jsonl"
"$here/scripts/gen-agentic-trace.py" weka --seed "$seed" >"$out/weka.jsonl"
cp "$here/fixtures/agentic/worked_example.jsonl" "$out/worked.jsonl"

# AISimulate writes under HOME; keep it inside the peers root like the other peer tools.
peers_isolate
echo "mockserve: $MOCKSERVE ($(cd "$here" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo "aisimulate: $("$ROOT/venv/aisimulate/bin/python" -c 'import importlib.metadata as m; print(m.version("aisimulate"))')"
python3 - "$out" "$ais" "$MOCKSERVE" "$@" <<'PY'
import json, os, resource, subprocess, sys, time

out, ais, mockserve, wanted = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
# name: (trace, AISimulate format, workers, speedup, lanes)
CASES = {
    "am_rr4_s1": ("agentic.jsonl", "agentic_mooncake", 4, 1.0, None),
    "am_light": ("light.jsonl", "agentic_mooncake", 4, 1.0, None),
    "am_rr1_s1": ("agentic.jsonl", "agentic_mooncake", 1, 1.0, None),
    "am_rr4_s2": ("agentic.jsonl", "agentic_mooncake", 4, 2.0, None),
    "am_rr4_l8": ("agentic.jsonl", "agentic_mooncake", 4, 1.0, 8),
    "weka_rr4_s1": ("weka.jsonl", "weka", 4, 1.0, None),
    "weka_rr4_l8": ("weka.jsonl", "weka", 4, 1.0, 8),
    "worked": ("worked.jsonl", "agentic_mooncake", 1, 1.0, None),
}
for name in wanted:
    if name not in CASES:
        sys.exit(f"unknown case {name!r} (one of {', '.join(CASES)})")
BLOCK, BLOCKS, SEQS, TOKENS = 64, 16384, 256, 8192


def timed(cmd, **kw):
    """Runs cmd; returns (wall s, user + system CPU s of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, **kw)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_aisimulate(name, trace, fmt, workers, speedup, lanes):
    load = {"type": "trace_timestamps", "speedup": speedup}
    if lanes:
        load["agentic_lanes"] = lanes
    config = {
        "traffic": {"source": {"type": "trace", "format": fmt, "paths": [trace]}, "load": load},
        "engine": {
            "mode": "aggregated", "model": "Qwen/Qwen3-32B-FP8", "hardware": "h200_sxm", "backend": "vllm",
            "workers": {"aggregated": {
                "parallelism": {"replicas": workers},
                "scheduler": {"max_batched_tokens": TOKENS, "max_sequences": SEQS},
                "kv_cache": {"block_size": BLOCK, "capacity": {"type": "fixed", "blocks": BLOCKS}},
                "timing": {"type": "polynomial"},
            }},
        },
    }
    cfg = os.path.join(out, f"{name}.aisimulate.yaml")
    with open(cfg, "w") as f:
        json.dump(config, f, indent=1)  # JSON is YAML
    res = os.path.join(out, f"{name}.aisimulate")
    cost = timed([ais, "predict", "-c", cfg, "--format", "json", "--capture-per-request",
                  "--output-dir", res, "--overwrite"], stdout=subprocess.DEVNULL)
    report = json.load(open(os.path.join(res, "prediction.json")))
    records = {}
    for line in open(os.path.join(res, "requests.jsonl")):
        r = json.loads(line)
        records[node_id(r)] = (r["dispatched_at_ms"], r.get("first_token_ms"), r.get("last_token_ms"))
    return report, records, cost


def node_id(record):
    """The node's request id (weka's `weka:<digest>:...` digests agree between the tools)."""
    return record["agentic"]["request_id"]


def run_mockserve(name, trace, fmt, workers, speedup, lanes):
    rep, per = os.path.join(out, f"{name}.mockserve.json"), os.path.join(out, f"{name}.mockserve.jsonl")
    cmd = [mockserve, "replay", trace, "-q", "--trace-format", fmt.replace("_", "-"),
           "--num-workers", str(workers), "--router-mode", "round-robin",
           "--arrival-speedup-ratio", str(speedup), "--block-size", str(BLOCK),
           "--num-gpu-blocks", str(BLOCKS), "--max-num-seqs", str(SEQS),
           "--max-num-batched-tokens", str(TOKENS), "--report-json", rep, "--per-request-jsonl", per]
    if lanes:
        cmd += ["--agentic-lanes", str(lanes)]
    cost = timed(cmd, stdout=subprocess.DEVNULL)
    report = json.load(open(rep))
    records = {}
    for line in open(per):
        r = json.loads(line)
        records[node_id(r)] = (r["arrival_ms"], r.get("first_token_ms"), r.get("last_token_ms"))
    return report, records, cost


KEYS = ["num_requests", "completed_requests", "duration_ms",
        "mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
        "mean_itl_ms", "median_itl_ms", "p90_itl_ms", "p99_itl_ms",
        "mean_e2e_latency_ms", "median_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms",
        "request_throughput_rps", "output_throughput_tok_s", "prefix_cache_reused_ratio",
        "mean_trajectory_e2e_latency_ms", "completed_trajectories"]
TOL = 0.5  # percent


def ours_value(report, key):
    plays = report.get("agentic", {}).get("plays", [])
    if key == "mean_trajectory_e2e_latency_ms":
        done = [p["makespan_ms"] for p in plays if p["status"] == "completed"]
        return sum(done) / len(done) if done else None
    if key == "completed_trajectories":
        return report.get("agentic", {}).get("completed_plays")
    return report.get(key)


def rule_check(trace, speedup, records):
    """Nodes of an agentic Mooncake v2 trace (no lanes) whose dispatch time is exactly
    max(floor, max over dependencies of T(source) + delay / speedup), from the tool's own times."""
    rows = [json.loads(line) for line in open(trace) if line.strip()][1:]
    low = min(r["not_before_ms"] for r in rows)
    ok = total = 0
    for r in rows:
        if r["request_id"] not in records:
            continue
        ready = (r["not_before_ms"] - low) / speedup
        for d in r.get("dependencies") or []:
            src = records[d["request_id"]]
            ready = max(ready, (src[0] if d["trigger"] == "dispatch" else src[2]) + d["delay_ms"] / speedup)
        total += 1
        ok += abs(records[r["request_id"]][0] - ready) <= 0.0015
    return ok, total


summary = []
for name in wanted or CASES:
    trace, fmt, workers, speedup, lanes = CASES[name]
    trace = os.path.join(out, trace)
    a_rep, a_rec, a_cost = run_aisimulate(name, trace, fmt, workers, speedup, lanes)
    o_rep, o_rec, o_cost = run_mockserve(name, trace, fmt, workers, speedup, lanes)
    print(f"== {name}: {os.path.basename(trace)}, {workers} worker(s), round-robin, speedup {speedup:g}"
          + (f", {lanes} lanes" if lanes else ""))
    worst = 0.0
    for k in KEYS:
        a, b = a_rep.get(k), ours_value(o_rep, k)
        if a is None or b is None:
            print(f"  {k:32s} aisimulate {a!s:>14}   mockserve {b!s:>14}")
            continue
        if a == b:
            diff = 0.0
        else:
            diff = (b - a) / abs(a) * 100 if a else float("inf")
        worst = max(worst, abs(diff))
        flag = "" if abs(diff) <= TOL else "   <-- over 0.5%"
        print(f"  {k:32s} aisimulate {a:14.3f}   mockserve {b:14.3f}   {diff:+.3f}%{flag}")
    only_a, only_o = a_rec.keys() - o_rec.keys(), o_rec.keys() - a_rec.keys()
    both = a_rec.keys() & o_rec.keys()
    line = []
    for i, what in enumerate(("dispatch", "first token", "last token")):
        diffs = [abs(a_rec[r][i] - o_rec[r][i]) for r in both if a_rec[r][i] is not None and o_rec[r][i] is not None]
        same = sum(d <= 0.001 + 1e-9 for d in diffs)
        line.append(f"{what}: {same}/{len(diffs)} within 1 us, max diff {max(diffs, default=0):.3f} ms")
    print("  per request  " + "; ".join(line))
    if fmt == "agentic_mooncake" and not lanes:
        (ao, at), (oo, ot) = rule_check(trace, speedup, a_rec), rule_check(trace, speedup, o_rec)
        print(f"  readiness rule  aisimulate {ao}/{at} dispatches follow it from its own times, mockserve {oo}/{ot}")
    if only_a or only_o:
        print(f"  requests only in aisimulate: {len(only_a)} {sorted(only_a)[:3]}; only in mockserve: {len(only_o)} {sorted(only_o)[:3]}")
    print(f"  {'process time (user+sys, s)':32s} aisimulate {a_cost[1]:14.2f}   mockserve {o_cost[1]:14.2f}   x{a_cost[1] / max(o_cost[1], 1e-9):.1f} faster")
    print(f"  {'wall (whole command, s)':32s} aisimulate {a_cost[0]:14.2f}   mockserve {o_cost[0]:14.2f}   x{a_cost[0] / max(o_cost[0], 1e-9):.1f} faster")
    print(f"  {'replay alone (wall_time_ms)':32s} aisimulate {a_rep.get('wall_time_ms', 0):14.1f}   mockserve {o_rep.get('wall_time_ms', 0):14.1f}")
    summary.append((name, worst, a_cost[1], o_cost[1]))
print("== summary: worst figure difference, process time aisimulate / mockserve")
for name, worst, a, o in summary:
    print(f"  {name:12s} {worst:8.3f}%   {a:7.2f} s / {o:6.2f} s   x{a / max(o, 1e-9):.1f}")
PY
