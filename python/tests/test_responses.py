"""mockserve's /v1/responses through the pinned openai SDK: ``client.responses.create``
whole and streamed, with a function call, reasoning items and a ``previous_response_id``
chain. Every streamed event is parsed by the SDK's own types, and any warning fails the test."""

from __future__ import annotations

import json
import warnings
from typing import Iterator, List

import openai
import pytest
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseIncompleteEvent,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)

from servesim import MockServer

MODEL = "mock-model"

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    },
}


@pytest.fixture(autouse=True)
def warnings_fail() -> Iterator[None]:
    # Any warning (a pydantic serializer warning over an unexpected field, say) is an error.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


@pytest.fixture
def reasoning_server(mockserve_factory) -> MockServer:
    return mockserve_factory(reasoning_ratio=0.5)


def client_for(server: MockServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def test_whole_response_with_reasoning(reasoning_server):
    response = client_for(reasoning_server).responses.create(
        model=MODEL,
        instructions="Be brief.",
        input="Tell me about the weather.",
        max_output_tokens=400,
        temperature=0.5,
    )
    assert isinstance(response, Response)
    assert response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    kinds = [type(item) for item in response.output]
    assert kinds[0] is ResponseReasoningItem, kinds
    assert ResponseOutputMessage in kinds, kinds
    assert response.output_text
    usage = response.usage
    assert usage is not None
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert 0 < usage.output_tokens_details.reasoning_tokens < usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    # Round trips through the SDK's serializer without warnings.
    assert json.loads(response.model_dump_json())["id"] == response.id


def test_streamed_events_parse_as_sdk_types(reasoning_server):
    stream = client_for(reasoning_server).responses.create(
        model=MODEL, input="Hello there", max_output_tokens=12, stream=True
    )
    events: List[ResponseStreamEvent] = list(stream)
    assert isinstance(events[0], ResponseCreatedEvent)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Each event is the SDK's own class for its type, never a bare fallback.
    for event in events:
        assert type(event).__name__.startswith("Response"), event
        assert type(event).model_fields["type"].annotation.__args__ == (event.type,)
    last = events[-1]
    assert isinstance(last, (ResponseCompletedEvent, ResponseIncompleteEvent))
    text = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert text == last.response.output_text
    assert last.response.usage is not None
    assert last.response.usage.output_tokens <= 12


def test_function_call_and_previous_response_id(mockserve):
    client = client_for(mockserve)
    first = client.responses.create(
        model=MODEL,
        input="What is the weather in Paris for two days? " * 8,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=400,
    )
    calls = [item for item in first.output if isinstance(item, ResponseFunctionToolCall)]
    assert len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert isinstance(arguments["city"], str) and isinstance(arguments["days"], int)

    # Tools are not carried over (as on OpenAI's API): sent again, they keep the prefix.
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        max_output_tokens=20,
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0

    assert client.responses.retrieve(first.id).id == first.id
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.create(model=MODEL, previous_response_id=first.id, input="and then?")
    assert raised.value.body["code"] == "previous_response_not_found"
    assert raised.value.body["param"] == "previous_response_id"


def test_streamed_function_call(mockserve):
    stream = client_for(mockserve).responses.create(
        model=MODEL,
        input="Weather in Oslo?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=400,
        stream=True,
    )
    events = list(stream)
    deltas = [e.delta for e in events if isinstance(e, ResponseFunctionCallArgumentsDeltaEvent)]
    assert len(deltas) > 1
    last = events[-1]
    assert isinstance(last, ResponseCompletedEvent)
    (item,) = last.response.output
    assert isinstance(item, ResponseFunctionToolCall)
    assert item.arguments == "".join(deltas)
    json.loads(item.arguments)


def test_bad_input_is_an_openai_error(mockserve):
    with pytest.raises(openai.BadRequestError) as raised:
        client_for(mockserve).responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "nope"}]}]
        )
    assert raised.value.body["param"] == "input[0].content[0]"
