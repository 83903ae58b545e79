"""Result lines for several samples, and the error code each engine failure maps to."""

from __future__ import annotations

import json

import pytest

from flyteplugins_batcher.batch_api import BatchRequest, error_code, parse_request_line, response_line
from flyteplugins_batcher.engines import (
    Completion,
    ContextLengthExceededError,
    EngineDeadError,
    InvalidPromptError,
    InvalidResponseFormatError,
    Sample,
)


def parsed(url: str, **body: object) -> BatchRequest:
    line = json.dumps({"custom_id": "r9", "method": "POST", "url": url, "body": body})
    request = parse_request_line(line, 9)
    assert isinstance(request, BatchRequest)
    return request


def test_n_samples_are_choices_0_to_n_minus_1_and_usage_counts_them_all():
    request = parsed("/v1/chat/completions", messages=[{"role": "user", "content": "color?"}], n=3, temperature=1)
    samples = [Sample("red", 2, "stop"), Sample("a deep blue", 4, "length"), Sample("green", 1, "stop")]
    completion = Completion.from_samples(11, samples, cached_tokens=8)
    body = response_line(request, completion, model="m", request_number=9)["response"]["body"]
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    assert [choice["message"]["content"] for choice in body["choices"]] == ["red", "a deep blue", "green"]
    assert [choice["finish_reason"] for choice in body["choices"]] == ["stop", "length", "stop"]
    assert body["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": 7,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 8},  # the prompt's cached part, once for all samples
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def test_usage_says_the_prompt_tokens_found_in_the_prefix_cache_as_openai_and_vllm_write_it():
    request = parsed("/v1/completions", prompt="Once")
    for cached in (0, 1, 40):
        completion = Completion(
            "upon", prompt_tokens=40, completion_tokens=1, finish_reason="stop", cached_tokens=cached
        )
        body = response_line(request, completion, model="m", request_number=1)["response"]["body"]
        assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": cached}
        assert body["usage"]["prompt_tokens"] == 40 and body["usage"]["total_tokens"] == 41  # cached still counted


def test_completion_lines_carry_text_choices():
    request = parsed("/v1/completions", prompt="Once", n=2, temperature=1)
    completion = Completion.from_samples(3, [Sample(" upon", 1, "stop"), Sample(" more", 1, "stop")])
    body = response_line(request, completion, model="m", request_number=1)["response"]["body"]
    assert body["object"] == "text_completion" and [choice["text"] for choice in body["choices"]] == [" upon", " more"]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ContextLengthExceededError("engine: record 0: prompt is too long"), "context_length_exceeded"),
        (InvalidResponseFormatError("engine: record 0: response_format cannot be enforced"), "invalid_request"),
        (InvalidPromptError("engine: record 0: empty prompt"), "invalid_prompt"),
        # The code is the error's own, never read from its text.
        (ContextLengthExceededError("engine: record 0: 9000 tokens"), "context_length_exceeded"),
        (InvalidPromptError("engine: record 0: the chat template says the prompt is too long"), "invalid_prompt"),
        (EngineDeadError("the engine died"), "inference_failed"),
        (RuntimeError("boom"), "inference_failed"),
    ],
)
def test_each_engine_failure_maps_to_an_error_code(error: Exception, code: str):
    assert error_code(error) == code
    if isinstance(error, InvalidPromptError):
        assert error.code == code
