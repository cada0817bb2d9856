"""mockserve's Anthropic Messages API (/v1/messages) through the pinned anthropic SDK: whole and
streamed messages with a tool use, every event parsed by the SDK's own types, no warnings."""

from __future__ import annotations

import warnings
from typing import Iterator

import anthropic
import pydantic
import pytest
from anthropic.types import (
    Message,
    RawMessageStreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)

from servesim import MockServer

MODEL = "mock-model"

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}

# Strict re-validation: a field the SDK would only have tolerated (wrong type, missing) fails.
EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(autouse=True)
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def client_for(server: MockServer) -> anthropic.Anthropic:
    # The SDK appends /v1/messages itself; no retries, so an error surfaces as it is.
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def strict(message: Message) -> Message:
    return Message.model_validate(message.model_dump(), strict=False)


def test_create_with_a_tool_use_and_its_result(mockserve):
    client = client_for(mockserve)
    question = {"role": "user", "content": "What is the weather in Oslo this week?"}
    message = client.messages.create(
        model=MODEL,
        max_tokens=200,
        system="You are a weather assistant.",
        messages=[question],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert isinstance(message, Message)
    strict(message)
    assert message.id.startswith("msg_")
    assert message.role == "assistant" and message.model == MODEL
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if isinstance(block, ToolUseBlock)]
    assert len(calls) == 1, message.content
    call = calls[0]
    assert call.id.startswith("toolu_") and call.name == "get_weather"
    assert isinstance(call.input, dict)
    assert isinstance(call.input["city"], str) and isinstance(call.input["days"], int)
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    follow = client.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[
            question,
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call.id,
                        "content": [{"type": "text", "text": "Cold all week."}],
                    }
                ],
            },
        ],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
    )
    strict(follow)
    assert follow.stop_reason in ("end_turn", "max_tokens")
    assert len(follow.content) == 1 and isinstance(follow.content[0], TextBlock)
    assert follow.content[0].text
    assert follow.usage.input_tokens > message.usage.input_tokens

    counted = client.messages.count_tokens(
        model=MODEL,
        system="You are a weather assistant.",
        messages=[question],
        tools=[WEATHER_TOOL],
    )
    assert counted.input_tokens == message.usage.input_tokens


def test_stream_events_parse_and_accumulate(mockserve_factory):
    # Every answer runs to max_tokens, so the counts are exact.
    client = client_for(mockserve_factory(output_length_dist="fixed"))
    request = dict(
        model=MODEL,
        max_tokens=12,
        messages=[{"role": "user", "content": "Tell me a short story."}],
    )
    raw = list(client.messages.create(stream=True, **request))
    # The SDK drops `ping` events itself (the Rust tests see it third, after the block start).
    names = [event.type for event in raw]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert names[2:-3] == ["content_block_delta"] * 12
    for event in raw:
        EVENT.validate_python(event.model_dump())
    assert raw[-2].delta.stop_reason == "max_tokens"
    assert raw[-2].usage.output_tokens == 12

    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    strict(final)
    assert final.content[0].text == text and text
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12


def test_stream_a_tool_use(mockserve):
    client = client_for(mockserve)
    with client.messages.stream(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "any"},
    ) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_message()
    assert "input_json" in kinds, kinds
    strict(final)
    assert final.stop_reason == "tool_use"
    call = final.content[-1]
    assert isinstance(call, ToolUseBlock) and call.name == "get_weather"
    assert isinstance(call.input["city"], str) and isinstance(call.input["days"], int)


def test_errors_are_the_sdk_error_types(mockserve):
    client = client_for(mockserve)
    with pytest.raises(anthropic.NotFoundError) as not_found:
        client.messages.create(
            model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    assert not_found.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "text"}]}],
        )
    assert bad.value.body["error"]["message"].startswith("messages.0.content.0.text")


def test_reasoning_streams_as_a_thinking_block(mockserve_factory):
    server = mockserve_factory(output_length_dist="fixed", reasoning_ratio=0.5)
    with client_for(server).messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Think first."}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "thinking" in kinds and "signature" in kinds and "text" in kinds, kinds
    strict(final)
    assert len(final.content) == 2
    assert isinstance(final.content[0], ThinkingBlock) and isinstance(final.content[1], TextBlock)
    assert final.content[0].thinking and final.content[0].signature
