"""Request settings checked as the OpenAI API checks them, named as the line wrote them; custom_id types."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flyteplugins_batcher.batch_api import BatchRequest, RequestLineError, parse_request_line
from flyteplugins_batcher.engines import GenerationConfig, ResponseFormat

DEFAULTS = GenerationConfig(max_new_tokens=64)
MESSAGES = [{"role": "user", "content": "hi"}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def chat(**body: Any) -> str:
    return json.dumps(
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": MESSAGES, **body}}
    )


def parsed(text: str) -> BatchRequest:
    request = parse_request_line(text, 1)
    assert isinstance(request, BatchRequest)
    return request


def failure(text: str) -> RequestLineError:
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(text, 7)
    assert raised.value.line == 7
    return raised.value


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"temperature": 5.0}, "body.temperature must be from 0 to 2, got 5.0"),
        ({"temperature": -0.1}, "body.temperature must be from 0 to 2, got -0.1"),
        ({"temperature": "hot"}, "body.temperature must be a number, got 'hot'"),
        ({"top_p": 1.5}, "body.top_p must be from 0 to 1, got 1.5"),
        ({"max_tokens": 0}, "body.max_tokens must be >= 1, got 0"),
        ({"max_tokens": 2.5}, "body.max_tokens must be an integer, got 2.5"),
        ({"max_completion_tokens": -3}, "body.max_completion_tokens must be >= 1, got -3"),
        ({"n": 0}, "body.n must be from 1 to 128, got 0"),
        ({"n": 500}, "body.n must be from 1 to 128, got 500"),
        ({"n": True}, "body.n must be an integer, got True"),
        ({"seed": 1.5}, "body.seed must be an integer, got 1.5"),
        ({"seed": 2**70}, "body.seed must be a 64-bit integer"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "body.stop may hold at most 4 sequences, got 5"),
        ({"stop": [""]}, "body.stop must be a non-empty string or a list of them"),
        ({"response_format": "json"}, "body.response_format must be an object"),
        (
            {"response_format": {"type": "regex"}},
            "body.response_format.type must be one of text, json_object, json_schema",
        ),
        ({"response_format": {"type": "json_schema"}}, "body.response_format.json_schema must be an object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": "x"}}},
            "body.response_format.json_schema.schema must be a JSON schema object, got 'x'",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": PERSON}}},
            "body.response_format.json_schema.name must be a string",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"strict": "yes", "schema": PERSON}}},
            "body.response_format.json_schema.strict must be true or false",
        ),
    ],
)
def test_out_of_range_settings_fail_at_parse_naming_the_field_as_written(body: dict[str, Any], message: str):
    error = failure(chat(**body))
    assert error.code == "invalid_request" and error.custom_id == "r1"
    assert message in error.message


def test_plain_lines_name_fields_without_the_body_prefix():
    error = failure(json.dumps({"prompt": "x", "temperature": 3}))
    assert error.message == "temperature must be from 0 to 2, got 3"


def test_the_api_limits_themselves_are_accepted():
    settings = parsed(chat(temperature=2, top_p=1, max_tokens=1, n=128, seed=-5, stop=["a", "b", "c", "d"])).settings
    assert settings == {
        "max_new_tokens": 1,
        "temperature": 2.0,
        "top_p": 1.0,
        "n": 128,
        "seed": -5,
        "stop": ("a", "b", "c", "d"),
    }
    assert parsed(chat(stop=[])).settings == {}  # an empty list is no stop sequence


def test_top_p_zero_keeps_only_the_most_likely_token_so_it_runs_greedy():
    generation = parsed(chat(top_p=0, temperature=0.9)).generation(DEFAULTS)
    assert generation.greedy and generation.top_p == 1.0


def test_n_samples_become_the_requests_setting():
    request = parsed(chat(n=3, temperature=0.8))
    assert request.samples == 3 and request.generation(DEFAULTS).n == 3
    assert parsed(chat()).samples == 1


@pytest.mark.parametrize(
    ("custom_id", "code", "message"),
    [
        (7, "invalid_custom_id", "custom_id must be a string, got int 7 (write it in quotes)"),
        (["a"], "invalid_custom_id", "custom_id must be a string, got list"),
        ("  ", "invalid_custom_id", "custom_id must not be empty"),
        (None, "missing_custom_id", "needs a custom_id"),
    ],
)
def test_a_custom_id_that_is_not_a_string_has_its_own_code(custom_id: object, code: str, message: str):
    line = json.dumps({"custom_id": custom_id, "url": "/v1/chat/completions", "body": {"messages": MESSAGES}})
    error = failure(line)
    assert error.code == code and message in error.message and error.custom_id is None


def test_response_formats_become_the_requests_setting():
    assert "response_format" not in parsed(chat(response_format={"type": "text"})).settings
    json_object = parsed(chat(response_format={"type": "json_object"})).generation(DEFAULTS).response_format
    assert json_object == ResponseFormat.json_object() and json_object.kind == "json_object"
    body = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    schema_format = parsed(chat(response_format=body)).generation(DEFAULTS).response_format
    assert schema_format is not None and schema_format.kind == "json_schema" and schema_format.name == "person"
    assert json.loads(schema_format.schema or "") == PERSON


def test_a_response_format_keeps_generation_settings_hashable():
    body = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    first = parsed(chat(response_format=body, n=2, temperature=1)).generation(DEFAULTS)
    second = parsed(chat(response_format=body, n=2, temperature=1)).generation(DEFAULTS)
    assert first == second and hash(first) == hash(second) and len({first, second}) == 1
