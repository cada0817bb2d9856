#!/usr/bin/env python3
"""Checks mockserve's answers with the official openai Python SDK (not part of CI).

Starts `mockserve --port 0` (the binary given by --mockserve, default target/debug/mockserve),
then drives it through openai.OpenAI: sampled lengths and ignore_eos, stop strings, streamed tool
calls reassembled by the SDK's own types, logprobs, JSON mode, n choices, completions with echo
and a batch of prompts. Prints one line per check and exits non-zero on the first failure.

Run it with any python3: when the `openai` package is not importable, the script re-runs itself
with the venv under $SERVESIM_PEERS (default: .peers/ in the repository root), venv/openai.

Example, from the repository root:
  cargo build -p mock_server && scripts/peers/openai_sdk_answers.py
"""

import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROOT = os.path.abspath(
    os.path.expanduser(os.environ.get("SERVESIM_PEERS") or os.path.join(REPO, ".peers"))
)
VENV_PYTHON = os.path.join(ROOT, "venv", "openai", "bin", "python")

try:
    import openai
except ImportError:
    if os.path.exists(VENV_PYTHON) and os.path.abspath(sys.executable) != VENV_PYTHON:
        os.execv(VENV_PYTHON, [VENV_PYTHON, *sys.argv])
    sys.exit(f"the openai package is not importable, not even with {VENV_PYTHON}")


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather at a place",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 10},
                "where": {
                    "type": "object",
                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                    "required": ["lat", "lon"],
                },
            },
            "required": ["city", "unit", "days", "where"],
        },
    },
}


def check_weather(arguments):
    args = json.loads(arguments)
    assert isinstance(args["city"], str), args
    assert args["unit"] in ("celsius", "fahrenheit"), args
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 10, args
    assert all(isinstance(args["where"][k], (int, float)) for k in ("lat", "lon")), args


def ok(name):
    print(f"ok  {name}")


def run_checks(client):
    messages = [{"role": "user", "content": "tell me about the sea"}]

    # Lengths: sampled without ignore_eos, the limit with it.
    finishes = set()
    for seed in range(12):
        r = client.chat.completions.create(
            model="mock-model", messages=messages, max_tokens=48, seed=seed
        )
        finishes.add(r.choices[0].finish_reason)
        assert r.usage.completion_tokens <= 48
        r = client.chat.completions.create(
            model="mock-model",
            messages=messages,
            max_tokens=48,
            seed=seed,
            extra_body={"ignore_eos": True},
        )
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 48
    assert "stop" in finishes, finishes
    ok(f"sampled lengths end with {sorted(finishes)}, ignore_eos runs to the limit")

    # Stop strings: the text ends before the first occurrence.
    full = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=40, seed=3,
        extra_body={"ignore_eos": True},
    ).choices[0].message.content
    word = full.split(" ")[6]
    stream = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=40, seed=3, stop=[word],
        stream=True, extra_body={"ignore_eos": True},
    )
    text, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == full[: full.index(word)] and word not in text and finish == "stop", (
        text, word, finish)
    ok(f"stop {word!r}: streamed text ends before it")

    # Tool calls, streamed: the SDK's delta types reassemble into valid arguments.
    stream = client.chat.completions.create(
        model="mock-model", messages=messages, tools=[WEATHER], tool_choice="required",
        stream=True, max_tokens=512,
    )
    calls, finish = {}, None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for t in c.delta.tool_calls or []:
                call = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = t.id or call["id"]
                if t.function:
                    call["name"] = t.function.name or call["name"]
                    call["arguments"] += t.function.arguments or ""
    assert finish == "tool_calls" and list(calls) == [0], (finish, calls)
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    check_weather(calls[0]["arguments"])
    r = client.chat.completions.create(
        model="mock-model", messages=messages, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=512,
    )
    call = r.choices[0].message.tool_calls[0]
    check_weather(call.function.arguments)
    history = messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
    ]
    r = client.chat.completions.create(
        model="mock-model", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    assert r.choices[0].message.content
    ok(f"tool call {calls[0]['arguments']} (streamed), history with tool messages accepted")

    try:
        client.chat.completions.create(
            model="mock-model", messages=messages,
            tools=[{"type": "function", "function": {"name": "f", "parameters":
                    {"type": "object", "properties": {"x": {"type": "strng"}}}}}],
        )
        raise AssertionError("a malformed schema was accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "tools[0].function.parameters", e.body
    ok("malformed tool schema: BadRequestError naming the parameters")

    # Logprobs.
    r = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=5, logprobs=True, top_logprobs=3,
        extra_body={"ignore_eos": True},
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 3 for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content
    ok("chat logprobs with top_logprobs=3")

    # JSON mode.
    r = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=400,
        response_format={"type": "json_schema", "json_schema": {
            "name": "weather", "schema": WEATHER["function"]["parameters"]}},
    )
    check_weather(r.choices[0].message.content)
    r = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=400,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    ok("json_schema and json_object answers parse")

    # n choices.
    r = client.chat.completions.create(
        model="mock-model", messages=messages, max_tokens=6, n=3,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 18
    ok("n=3: three choices, usage summed")

    # Completions: a batch of prompts with echo and logprobs.
    prompts = ["once upon a time", "in a galaxy far away"]
    r = client.completions.create(
        model="mock-model", prompt=prompts, max_tokens=4, n=2, echo=True, logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        assert c.text.startswith(prompts[c.index // 2]), c.text
        assert len(c.logprobs.tokens) == 4
    ok("completions: 2 prompts x n=2, echo, logprobs")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mockserve", default=os.path.join(REPO, "target", "debug", "mockserve"),
        help="the mockserve binary (default: target/debug/mockserve)",
    )
    args = parser.parse_args()
    server = subprocess.Popen(
        [args.mockserve, "--port", "0", "--speedup-ratio", "inf", "--num-workers", "1"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = server.stdout.readline()
        prefix = "mockserve listening on "
        if not line.startswith(prefix):
            sys.exit(f"mockserve did not start: {line!r}")
        base = line[len(prefix):].strip()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        print(f"openai {openai.__version__} against {base}")
        run_checks(client)
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
