"""Embedding lines: parsed into a request kind of their own, answered in OpenAI's embeddings response shape."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import jsonschema
import pytest

from flyteplugins_batcher.batch_api import (
    ENDPOINTS,
    BatchRequest,
    EmbeddingRequest,
    RequestLineError,
    embedding_response_line,
    encode_vector,
    parse_request_line,
)
from flyteplugins_batcher.batch_api._embeddings import MAX_EMBEDDING_INPUTS


def required_object(**properties: object) -> dict[str, object]:
    """A JSON schema for an object that must have all of `properties`."""
    return {"type": "object", "required": list(properties), "properties": properties}


INTEGER, STRING = {"type": "integer"}, {"type": "string"}
# OpenAI's documented shapes (API reference: "Create embeddings" response, and the Batch API's output line).
OPENAI_EMBEDDING = required_object(
    object={"const": "embedding"},
    index=INTEGER,
    embedding={"oneOf": [{"type": "array", "items": {"type": "number"}}, STRING]},
)
OPENAI_EMBEDDING_RESPONSE = required_object(
    object={"const": "list"},
    data={"type": "array", "items": OPENAI_EMBEDDING},
    model=STRING,
    usage=required_object(prompt_tokens=INTEGER, total_tokens=INTEGER),
)
OPENAI_BATCH_OUTPUT_LINE = required_object(
    id=STRING,
    custom_id=STRING,
    response=required_object(status_code={"const": 200}, request_id=STRING, body=OPENAI_EMBEDDING_RESPONSE),
    error={"type": "null"},
)


def embeddings_line(custom_id: object = "e1", **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body})


def parse(text: str, **kwargs: Any) -> EmbeddingRequest:
    request = parse_request_line(text, 2, endpoints=ENDPOINTS, **kwargs)
    assert isinstance(request, EmbeddingRequest) and request.kind == "embedding"
    return request


def test_a_string_or_a_list_of_strings_is_a_request_of_its_own_kind():
    one = parse(embeddings_line(input="hello", model="all-MiniLM-L6-v2"))
    assert (one.line, one.custom_id, one.inputs, one.encoding_format, one.model) == (
        2,
        "e1",
        ("hello",),
        "float",
        "all-MiniLM-L6-v2",
    )
    several = parse(embeddings_line(input=["a", "b", "c"], encoding_format="base64"))
    assert several.inputs == ("a", "b", "c") and several.encoding_format == "base64"
    chat = parse_request_line(
        json.dumps(
            {"custom_id": "c", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "x"}]}}
        ),
        3,
    )
    assert isinstance(chat, BatchRequest) and chat.kind == "generation"


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        ({}, "invalid_body", "body.input must be a non-empty string or a non-empty list of strings"),
        ({"input": []}, "invalid_body", "body.input must be a non-empty string"),
        ({"input": ""}, "invalid_body", "body.input is empty: there is no text to embed"),
        ({"input": ["ok", "  "]}, "invalid_body", "body.input[1] is empty"),
        ({"input": [101, 2023]}, "invalid_body", "token-id arrays are not supported; send the texts as strings"),
        ({"input": [[101, 2023]]}, "invalid_body", "token-id arrays are not supported"),
        ({"input": ["a", {"text": "b"}]}, "invalid_body", "body.input must hold only strings"),
        ({"input": ["a"] * (MAX_EMBEDDING_INPUTS + 1)}, "invalid_body", "at most 2048 texts, got 2049"),
        (
            {"input": "a", "encoding_format": "int8"},
            "invalid_request",
            "body.encoding_format must be 'float' or 'base64'",
        ),
        ({"input": "a", "dimensions": 256}, "invalid_request", "body.dimensions is not supported"),
    ],
)
def test_bad_embedding_bodies_fail_alone_with_a_clear_message(body: dict[str, Any], code: str, message: str):
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(embeddings_line(**body), 4, endpoints=ENDPOINTS)
    assert raised.value.code == code and raised.value.custom_id == "e1" and message in raised.value.message


def test_a_job_that_serves_no_embeddings_refuses_them_as_an_invalid_url():
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(embeddings_line(input="x"), 3)
    assert raised.value.code == "invalid_url"
    assert raised.value.message == (
        "url must be one of /v1/chat/completions, /v1/completions, /v1/responses, got '/v1/embeddings'"
    )


def test_the_embedding_model_is_checked_against_the_served_embedding_model():
    line = embeddings_line(input="x", model="text-embedding-3-small")
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(
            line, 1, served_model="SmolLM2", served_embedding_model="all-MiniLM-L6-v2", endpoints=ENDPOINTS
        )
    assert raised.value.code == "model_mismatch" and "'all-MiniLM-L6-v2'" in raised.value.message
    matching = embeddings_line(input="x", model="all-MiniLM-L6-v2")
    assert (
        parse(matching, served_model="SmolLM2", served_embedding_model="all-MiniLM-L6-v2").model == "all-MiniLM-L6-v2"
    )
    assert parse(line, served_embedding_model="m", model_mismatch="ignore").model == "text-embedding-3-small"


def test_the_response_line_has_openais_embeddings_shape_with_float_vectors():
    request = parse(embeddings_line("e7", input=["first", "second"]))
    vectors = [[0.25, -1.5, 3.0], [1.0, 0.0, -0.125]]
    line = embedding_response_line(request, vectors, prompt_tokens=9, model="all-MiniLM-L6-v2", request_number=7)
    jsonschema.validate(line, OPENAI_BATCH_OUTPUT_LINE)
    body = line["response"]["body"]
    assert line["custom_id"] == "e7" and body["model"] == "all-MiniLM-L6-v2"
    assert [item["index"] for item in body["data"]] == [0, 1]
    assert [item["embedding"] for item in body["data"]] == vectors
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    json.dumps(line)  # plain JSON, whatever the vectors were


def test_base64_vectors_are_little_endian_float32_as_openai_encodes_them():
    request = parse(embeddings_line(input=["a", "b"], encoding_format="base64"))
    vectors = [(0.5, -2.0, 1e-3), (3.25, 0.0, -1.0)]
    line = embedding_response_line(request, vectors, prompt_tokens=2, model="m", request_number=1)
    jsonschema.validate(line, OPENAI_BATCH_OUTPUT_LINE)
    for item, vector in zip(line["response"]["body"]["data"], vectors, strict=True):
        raw = base64.b64decode(item["embedding"])
        assert struct.unpack(f"<{len(vector)}f", raw) == pytest.approx(vector, rel=1e-6)
    assert encode_vector([1.0], "base64") == "AACAPw=="  # 1.0f is 00 00 80 3f, little-endian


def test_numpy_vectors_are_written_as_plain_json_numbers():
    numpy = pytest.importorskip("numpy")
    request = parse(embeddings_line(input="a"))
    line = embedding_response_line(
        request, numpy.asarray([[0.5, 0.25]], dtype=numpy.float32), prompt_tokens=1, model="m", request_number=1
    )
    assert json.loads(json.dumps(line))["response"]["body"]["data"][0]["embedding"] == [0.5, 0.25]


def test_a_vector_count_that_does_not_match_the_texts_is_refused():
    request = parse(embeddings_line(input=["a", "b"]))
    with pytest.raises(ValueError, match="2 texts but 1 vectors"):
        embedding_response_line(request, [[1.0]], prompt_tokens=1, model="m", request_number=1)
