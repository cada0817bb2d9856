"""mockserve's /v1/embeddings answering the pinned openai SDK: float and base64 vectors parsed by
the SDK's own types with no warnings, the SDK's default (it asks for base64 and decodes it), and
bad input (dimensions 0 or 10^9, a million inputs, an empty one) raised as the SDK's
BadRequestError naming the parameter."""

from __future__ import annotations

import array
import base64
import json
import math
import urllib.request
import warnings
from typing import List

import openai
import pytest

from servesim import MockServer

MODEL = "mock-model"
DIM = 1024
TEXTS = ["The quick brown fox", "jumps over the lazy dog"]


def client_for(server: MockServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)


def as_f32(values: List[float]) -> array.array:
    """The floats as the f32 values the server computed (JSON numbers are their shortest text)."""
    return array.array("f", values)


def test_float_and_base64_embeddings_agree(mockserve):
    with client_for(mockserve) as client, warnings.catch_warnings():
        warnings.simplefilter("error")
        floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
        b64 = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
        # Without encoding_format the SDK asks for base64 and decodes it to floats itself.
        default = client.embeddings.create(model=MODEL, input=TEXTS)
    assert floats.object == "list"
    assert floats.model == MODEL
    assert [d.index for d in floats.data] == [0, 1]
    assert all(d.object == "embedding" for d in floats.data)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    assert b64.usage == floats.usage
    for f, b, d in zip(floats.data, b64.data, default.data):
        assert len(f.embedding) == DIM
        assert math.isclose(math.sqrt(sum(x * x for x in f.embedding)), 1.0, abs_tol=1e-5)
        # An explicit base64 is left as the server's string: little-endian f32 bytes.
        assert isinstance(b.embedding, str)
        decoded = array.array("f", base64.b64decode(b.embedding))
        assert decoded == as_f32(f.embedding)
        assert as_f32(d.embedding) == decoded


def tokenize(server: MockServer, text: str) -> List[int]:
    request = urllib.request.Request(
        server.url + "/tokenize",
        data=json.dumps({"prompt": text}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())["tokens"]


def test_dimensions_and_token_ids(mockserve):
    ids = tokenize(mockserve, "hello there")
    with client_for(mockserve) as client, warnings.catch_warnings():
        warnings.simplefilter("error")
        full = client.embeddings.create(model=MODEL, input="hello there", encoding_format="float")
        short = client.embeddings.create(
            model=MODEL, input="hello there", dimensions=8, encoding_format="base64"
        )
        # The same text as token ids (the /tokenize ids) gives the same vector.
        by_ids = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
    vector = array.array("f", base64.b64decode(short.data[0].embedding))
    assert len(vector) == 8
    head = full.data[0].embedding[:8]
    scale = math.sqrt(sum(x * x for x in head))
    for got, want in zip(vector, head):
        assert math.isclose(got, want / scale, abs_tol=1e-5)
    assert by_ids.data[0].embedding == full.data[0].embedding
    assert by_ids.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize(
    "kwargs, param, says",
    [
        ({"input": "x", "dimensions": 0}, "dimensions", "between 1 and 1024"),
        ({"input": "x", "dimensions": 10**9}, "dimensions", "between 1 and 1024"),
        ({"input": ["x"] * (2048 + 1)}, "input", "2049 inputs given"),
        # A million inputs, passed as extra_body: the SDK's own transform of a million-item
        # `input` takes about a minute on the client.
        ({"input": "x", "extra_body": {"input": ["x"] * 10**6}}, "input", "1000000 inputs given"),
        ({"input": ""}, "input", "empty"),
    ],
    ids=["dimensions-0", "dimensions-1e9", "2049-inputs", "a-million-inputs", "empty"],
)
def test_bad_input_is_a_bad_request_naming_it(mockserve, kwargs, param, says):
    with client_for(mockserve) as client, pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, **kwargs)
    assert raised.value.status_code == 400
    assert raised.value.param == param
    assert raised.value.type == "invalid_request_error"
    assert says in raised.value.message, raised.value.message
