"""The servesim wheel end to end: the pytest fixtures, MockServer, and mockserve answering the
openai SDK (streaming, tool calls, 429 from a full queue, startup errors)."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from importlib import metadata
from pathlib import Path
from typing import Callable, List

import openai
import pytest

import servesim
from servesim import MockServer, MockServerError

MODEL = "mock-model"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


def client_for(server: MockServer) -> openai.OpenAI:
    # No retries: a 429 must surface as RateLimitError, not be retried away.
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def test_binaries_are_installed_and_found():
    # The installed package, not python/servesim of a checkout.
    assert "site-packages" in Path(servesim.__file__).parts, servesim.__file__
    for name in ("mockserve", "loadgen"):
        path = servesim.binary_path(name)
        # pip put it in the environment's scripts directory (bin/, on PATH once activated).
        assert Path(path).parent == Path(sysconfig.get_path("scripts")), path
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
        assert version.stdout.startswith(f"{name} {servesim.__version__}"), version.stdout


def test_flags_map_to_mockserve_arguments():
    assert servesim.flag_args(
        {"max_waiting": 2, "no_kv_events": True, "seed": None, "no_prefix_caching": False}
    ) == ["--max-waiting", "2", "--no-kv-events"]
    assert servesim.flag_args({"fault_types": ["rate-limit", "unavailable"]}) == [
        "--fault-types",
        "rate-limit,unavailable",
    ]


def test_fixture_serves_health_and_base_url(mockserve):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", mockserve.base_url)
    assert mockserve.base_url == mockserve.url + "/v1"
    with urllib.request.urlopen(mockserve.url + "/health", timeout=10) as answer:
        assert answer.status == 200
        assert json.loads(answer.read()) == {"status": "ok"}


def test_streaming_chat_completion(mockserve):
    stream = client_for(mockserve).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about the weather."}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    text = "".join(choice.delta.content or "" for choice in choices)
    assert len(choices) >= 16, "one chunk per token at least"
    assert text.strip(), "streamed text is empty"
    assert [c.finish_reason for c in choices if c.finish_reason] == ["length"]
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 16


def test_forced_tool_call_has_json_arguments(mockserve):
    answer = client_for(mockserve).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    arguments = json.loads(calls[0].function.arguments)
    assert isinstance(arguments, dict)
    assert set(arguments) == {"city", "days"}
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)


def gauge(server: MockServer, name: str) -> float:
    """Sum of a /metrics gauge over its label sets (every worker)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as answer:
        text = answer.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.M)
    values = [float(v) for v in pattern.findall(text)]
    assert values, f"{name} not in /metrics"
    return sum(values)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_full_queue_answers_429(mockserve_factory):
    # One worker running one sequence at a time, decoding 100 ms per token: request A runs
    # (for 30 s), request B waits for admission, and with --max-waiting 1 request C is refused.
    # Each step is observed on /metrics before the next, so no timing decides the outcome.
    server = mockserve_factory(
        num_workers=1,
        max_num_seqs=1,
        max_waiting=1,
        fixed_latency="0,100",
        shutdown_timeout=0,
    )
    client = client_for(server)
    errors: List[BaseException] = []

    def slow_request() -> None:
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "a long answer please"}],
                max_tokens=300,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for _ in stream:
                pass
        except (openai.APIError, ValueError) as e:  # the server stops under the stream
            errors.append(e)

    threads = [threading.Thread(target=slow_request, daemon=True) for _ in range(2)]
    threads[0].start()
    wait_for(lambda: gauge(server, "vllm:num_requests_running") == 1, "request A running")
    threads[1].start()
    wait_for(lambda: gauge(server, "vllm:num_requests_waiting") == 1, "request B waiting")

    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "one more"}], max_tokens=1
        )
    assert refused.value.status_code == 429
    assert gauge(server, "vllm:num_requests_running") == 1
    assert gauge(server, "vllm:num_requests_waiting") == 1

    server.stop()  # --shutdown-timeout 0: the open streams end at once
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_bad_flag_raises_with_stderr():
    with pytest.raises(MockServerError) as failed:
        MockServer(no_such_flag=1).start()
    assert failed.value.returncode == 2
    assert "--no-such-flag" in failed.value.stderr
    assert "--no-such-flag" in str(failed.value)


def test_never_healthy_raises_with_stderr():
    # /health answers 503 for the 600 s of --startup-delay; a 15 s startup timeout gives up
    # (the word-level tokenizer loads at once, so the address comes well within it).
    server = MockServer(startup_delay=600, tokenizer="builtin", startup_timeout=15)
    started = time.monotonic()
    with pytest.raises(MockServerError, match=r"/health did not answer 200 within 15 s \(last: status 503\)"):
        server.start()
    assert time.monotonic() - started < 60
    assert server.process is not None and server.process.poll() is not None


def test_stop_is_idempotent_and_reports_exit_status(mockserve_factory):
    server = mockserve_factory(tokenizer="builtin")
    assert server.stop() == 0
    assert server.stop() == 0


def test_installed_files_match_record_and_plugin_is_registered():
    dist = metadata.distribution("servesim")
    assert dist.read_text("WHEEL") is not None and "Root-Is-Purelib: false" in dist.read_text("WHEEL")
    hashed = [f for f in dist.files or [] if f.hash is not None]
    assert {f.name for f in hashed} >= {"mockserve", "loadgen", "__init__.py", "pytest_plugin.py"}
    for f in hashed:
        digest = hashlib.new(f.hash.mode, Path(f.locate()).read_bytes()).digest()
        assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == f.hash.value, f
    plugins = metadata.entry_points().select(group="pytest11")
    assert [p.value for p in plugins if p.name == "servesim"] == ["servesim.pytest_plugin"]


def _gone(pid: int) -> bool:
    """The process ended (a zombie not yet reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # The state follows the command name in parentheses: "Z" is a zombie.
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


# A test process that starts a server, reports mockserve's pid on stdout, then ends as the
# parameter says without calling stop().
_PARENT = """
import os, signal, sys, time
from servesim import MockServer
how = sys.argv[1]
with MockServer(tokenizer="builtin") as server:
    print(server.process.pid, flush=True)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    elif how == "os_exit":
        os._exit(0)
"""

_NO_STOP = """
import sys
from servesim import MockServer
server = MockServer(tokenizer="builtin").start()
print(server.process.pid, flush=True)
# The interpreter ends without stop(): no with block, no atexit hook.
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["sigkill", "sigterm", "os_exit", "no_stop"])
def test_mockserve_dies_with_its_parent(how):
    script = _NO_STOP if how == "no_stop" else _PARENT
    parent = subprocess.Popen(
        [sys.executable, "-c", script, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (line, parent.stderr.read() if parent.poll() is not None else b"")
        pid = int(line)
        parent.wait(timeout=60)
        # The parent is gone; its mockserve must follow within a few seconds.
        wait_for(lambda: _gone(pid), f"mockserve {pid} to exit after its parent ({how})", 10.0)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_server_started_in_a_thread_outlives_the_thread():
    # The parent-death signal follows the forking thread, so it is not asked for outside the
    # main thread: a server started from a worker thread keeps serving after that thread ends.
    started: List[MockServer] = []
    thread = threading.Thread(target=lambda: started.append(MockServer(tokenizer="builtin").start()))
    thread.start()
    thread.join(timeout=60)
    assert started, "the server did not start"
    server = started[0]
    try:
        time.sleep(0.5)
        with urllib.request.urlopen(server.url + "/health", timeout=10) as answer:
            assert answer.status == 200
    finally:
        assert server.stop() == 0
