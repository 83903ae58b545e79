"""Structured output and several samples in the engine API: the values, the budget, and a bad schema failing alone.

The tiny `EchoEngine` of `test_base` runs the shared pipeline without a model; the real engines run
the same settings in their own (slow) tests.
"""

from __future__ import annotations

import json

import pytest

from flyteplugins_batcher.engines import (
    MAX_SAMPLES,
    Completion,
    GenerationConfig,
    InvalidPromptError,
    InvalidResponseFormatError,
    Request,
    ResponseFormat,
    Sample,
)
from tests.engines.test_base import EchoEngine

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}


def test_a_response_format_is_a_hashable_value_with_its_schema_as_compact_json():
    written = ResponseFormat.json_schema(PERSON, name="person")
    from_text = ResponseFormat.json_schema(json.dumps(PERSON, indent=2), name="person")
    assert written == from_text and hash(written) == hash(from_text)
    assert written.schema == '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}}}'
    assert written.kind == "json_schema" and written.describe() == "json_schema 'person'"
    assert ResponseFormat.json_object().kind == "json_object" and ResponseFormat.json_object().schema is None
    config = GenerationConfig(response_format=written, n=2, temperature=0.5)
    assert {config: 1}[GenerationConfig(response_format=from_text, n=2, temperature=0.5)] == 1


@pytest.mark.parametrize(("schema", "message"), [("{not json", "must be JSON text"), ("[1]", "must be a JSON object")])
def test_a_schema_that_is_not_a_json_object_is_refused_at_once(schema: str, message: str):
    with pytest.raises(ValueError, match=message):
        ResponseFormat.json_schema(schema)


@pytest.mark.parametrize("n", [0, -1, MAX_SAMPLES + 1, 2.0, True])
def test_n_must_be_a_positive_integer_up_to_the_api_limit(n: object):
    with pytest.raises(ValueError, match=f"n must be an integer from 1 to {MAX_SAMPLES}"):
        GenerationConfig(n=n)  # type: ignore[arg-type]


def test_greedy_samples_are_decoded_once_and_sampled_ones_n_times():
    assert GenerationConfig(n=4).decoded_samples == 1
    assert GenerationConfig(n=4, temperature=0.7).decoded_samples == 4


def test_a_completion_carries_every_sample_and_keeps_the_first_as_its_text():
    single = Completion("4", prompt_tokens=5, completion_tokens=2, finish_reason="stop")
    assert single.samples == (Sample("4", 2, "stop"),)
    several = Completion.from_samples(5, [Sample("4", 2, "stop"), Sample("four", 3, "length")])
    assert (several.text, several.finish_reason, several.completion_tokens) == ("4", "stop", 5)
    with pytest.raises(ValueError, match="count every sample"):
        Completion("4", 5, 9, "stop", (Sample("4", 2, "stop"),))
    with pytest.raises(ValueError, match="at least one sample"):
        Completion.from_samples(5, [])


def test_the_token_budget_counts_every_decoded_sample():
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=10))
    engine.load()
    sampled = Request("abc", GenerationConfig(max_new_tokens=10, n=3, temperature=0.9))
    greedy = Request("abc", GenerationConfig(max_new_tokens=10, n=3))
    assert engine.estimate_tokens(sampled) == 4 + 3 * 10
    assert engine.estimate_tokens(greedy) == 4 + 10  # identical samples: one is decoded and repeated
    assert sampled.estimate_tokens() == 1 + 3 * 10  # without a tokenizer: about 4 characters per token


def test_a_schema_that_does_not_compile_fails_its_record_alone_naming_the_problem():
    pytest.importorskip("xgrammar")
    engine = EchoEngine(generation=GenerationConfig(max_new_tokens=8))
    engine.load()
    broken = ResponseFormat.json_schema({"type": "object", "properties": {"a": {"type": "strin"}}}, name="broken")
    fine = ResponseFormat.json_schema(PERSON, name="person")
    records = [
        "abc",
        Request("bad", GenerationConfig(max_new_tokens=8, response_format=broken), id="r-2"),
        Request("good", GenerationConfig(max_new_tokens=8, response_format=fine)),
    ]
    results = engine.generate(records)
    assert isinstance(results[0], Completion) and isinstance(results[2], Completion)
    error = results[1]
    assert isinstance(error, InvalidResponseFormatError) and isinstance(error, InvalidPromptError)
    assert str(error) == (
        "echo: record 1 (id='r-2', 'bad'): response_format json_schema 'broken' cannot be enforced: "
        'Unsupported type "strin"'
    )
    assert [prompt.index for prompt in engine.calls[0]] == [0, 2]
