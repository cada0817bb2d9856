#!/usr/bin/env python3
"""Offline replay of a Mooncake trace with NVIDIA Dynamo's mocker and router, in simulated time.

Reference tooling to compare servesim against Dynamo. It calls dynamo.replay.run_trace_replay
(ai-dynamo 1.6.1): no servers, no network. The summary that Dynamo computes is printed as JSON on
stdout (latencies in simulated milliseconds), with two keys added: "python_wall_s" (wall-clock
seconds of the call) and "replay_args" (the settings used).

Run it with any python3: when the `dynamo` package is not importable, the script re-runs itself
with the venv that `scripts/peers/setup.sh dynamo` built under $SERVESIM_PEERS (default: .peers/
in the repository root).

Example, from the repository root:
  scripts/peers/dynamo_replay.py traces/mooncake_synthetic_trace.jsonl --workers 4 \
      --router kv_router --speedup 4 --per-request replay.jsonl
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.abspath(
    os.path.expanduser(os.environ.get("SERVESIM_PEERS") or os.path.join(REPO, ".peers"))
)
VENV = os.path.join(ROOT, "venv", "dynamo")
VENV_PYTHON = os.path.join(VENV, "bin", "python")


def isolate_environment() -> None:
    """Keep HOME and caches under the root, never reach for a model hub, keep logs quiet."""
    os.environ["SERVESIM_PEERS"] = ROOT  # HOME changes below; children must keep the same root
    os.environ["HOME"] = os.path.join(ROOT, "home")
    os.environ["XDG_CACHE_HOME"] = os.path.join(ROOT, "cache")
    os.environ["HF_HOME"] = os.path.join(ROOT, "cache", "huggingface")
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "DO_NOT_TRACK"):
        os.environ[key] = "1"
    # At "info" the KV router logs one line per routing decision (thousands per trace).
    os.environ.setdefault("DYN_LOG", "warn")


def import_replay():
    """Import Dynamo's replay API, re-running this script in the setup venv if needed."""
    try:
        from dynamo.replay import run_trace_replay
    except ImportError as err:
        in_venv = os.path.realpath(sys.prefix) == os.path.realpath(VENV)
        if in_venv or not os.access(VENV_PYTHON, os.X_OK):
            sys.exit(f"error: cannot import dynamo.replay ({err}); run scripts/peers/setup.sh dynamo "
                     f"(venv expected at {VENV})")
        os.execv(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__), *sys.argv[1:]])
    return run_trace_replay


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="Offline replay of a Mooncake trace with Dynamo's mocker + router "
        "(ai-dynamo 1.6.1, simulated time). Prints Dynamo's summary as JSON.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("trace", help="Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids)")
    ap.add_argument("--workers", type=positive_int, default=1, help="number of simulated workers")
    ap.add_argument("--router", default="round_robin", choices=["round_robin", "kv_router"],
                    help="how requests are spread over the workers")
    ap.add_argument("--block-size", type=positive_int, default=64, help="mocker KV block size in tokens")
    ap.add_argument("--trace-block-size", type=positive_int, default=512,
                    help="tokens per hash_id in the trace")
    ap.add_argument("--speedup", type=positive_float, default=1.0,
                    help="arrival speedup ratio: divides the trace's inter-arrival times")
    ap.add_argument("--engine-type", default="vllm", choices=["vllm", "sglang", "trtllm"],
                    help="which engine's scheduler the mocker simulates")
    # Unset engine limits keep Dynamo's defaults (SUPPRESS: no attribute unless given).
    ap.add_argument("--num-gpu-blocks", type=positive_int, default=argparse.SUPPRESS,
                    help="KV blocks per worker (default: Dynamo's, 16384)")
    ap.add_argument("--max-num-seqs", type=positive_int, default=argparse.SUPPRESS,
                    help="max sequences per batch (default: Dynamo's, 256)")
    ap.add_argument("--max-num-batched-tokens", type=positive_int, default=argparse.SUPPRESS,
                    help="max tokens per forward pass (default: Dynamo's, 8192)")
    ap.add_argument("--perf-profile", metavar="PROFILE.npz", default=argparse.SUPPRESS,
                    help="profiled timing model (mocker-format NPZ, e.g. profiles/h200_tp1_perf.npz) "
                    "instead of the polynomial")
    ap.add_argument("--per-request", metavar="OUT.jsonl", default=argparse.SUPPRESS,
                    help="also write one JSON record per request to this file")
    args = ap.parse_args()
    if not os.path.isfile(args.trace):
        ap.error(f"trace file not found: {args.trace}")
    if hasattr(args, "perf_profile") and not os.path.isfile(args.perf_profile):
        ap.error(f"profile file not found: {args.perf_profile}")
    return args


def main() -> None:
    args = parse_args()
    isolate_environment()
    run_trace_replay = import_replay()

    # extra_engine_args is an engine launch config: {"engine": {...per-rank settings...}, ...}.
    engine = {"backend": args.engine_type, "block_size": args.block_size}
    for key in ("num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens"):
        if hasattr(args, key):
            engine[key] = getattr(args, key)
    if hasattr(args, "perf_profile"):
        # Dynamo 1.6.1's replay takes a profile as an external timing provider.
        engine["timing_model"] = {"type": "external", "provider": "dynamo_profile",
                                  "config": {"path": os.path.abspath(args.perf_profile)}}
    per_request = getattr(args, "per_request", None)
    # Open the output first so that a bad path fails before the replay runs.
    per_request_file = None
    if per_request is not None:
        try:
            per_request_file = open(per_request, "w")
        except OSError as err:
            sys.exit(f"error: cannot write {per_request}: {err.strerror}")

    t0 = time.perf_counter()
    try:
        report = run_trace_replay(
            args.trace,
            trace_format="mooncake",
            trace_block_size=args.trace_block_size,
            extra_engine_args={"engine": engine},
            num_workers=args.workers,
            router_mode=args.router,
            arrival_speedup_ratio=args.speedup,
            capture_per_request=per_request_file is not None,
        )
    except Exception as err:  # Dynamo reports bad traces and bad settings as plain exceptions
        sys.exit(f"error: replay failed: {err}")
    wall_s = time.perf_counter() - t0

    if per_request_file is not None:
        with per_request_file:
            for record in report.per_request or []:
                per_request_file.write(json.dumps(record) + "\n")

    summary = dict(report.summary)
    summary["python_wall_s"] = round(wall_s, 3)
    summary["replay_args"] = {
        "trace": args.trace,
        "workers": args.workers,
        "router": args.router,
        "trace_block_size": args.trace_block_size,
        "arrival_speedup_ratio": args.speedup,
        "engine": engine,
    }
    json.dump(summary, sys.stdout, indent=1, default=str)
    print()


if __name__ == "__main__":
    main()
