"""Reading OpenAI-batch and plain request lines; every bad line fails alone, with a code and a message."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from flyteplugins_batcher.batch_api import RequestLineError, SeenIds, error_line, parse_request_line, response_line
from flyteplugins_batcher.engines import Completion, GenerationConfig

DEFAULTS = GenerationConfig(max_new_tokens=64, temperature=0.0)


def openai_line(custom_id: str = "r1", url: str = "/v1/chat/completions", **body: object) -> str:
    body = body or {"messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_an_openai_chat_line_becomes_a_request_with_its_own_settings():
    line = openai_line(
        "q-7",
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        max_tokens=12,
        temperature=0.5,
        top_p=0.9,
        stop=["\n\n"],
        seed=3,
    )
    parsed = parse_request_line(line, 4, served_model="SmolLM2-135M-Instruct")
    assert (parsed.line, parsed.custom_id, parsed.endpoint) == (4, "q-7", "/v1/chat/completions")
    assert parsed.prompt == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    expected = GenerationConfig(max_new_tokens=12, temperature=0.5, top_p=0.9, stop=("\n\n",), seed=3)
    assert parsed.generation(DEFAULTS) == expected


def test_completions_lines_and_plain_lines_are_accepted_with_run_defaults():
    completion = parse_request_line(openai_line(url="/v1/completions", prompt="Once upon"), 1)
    assert completion.prompt == "Once upon" and completion.generation(DEFAULTS) is DEFAULTS
    plain = parse_request_line(json.dumps({"prompt": "Hello", "max_tokens": 5}), 9)
    assert plain.custom_id == "line-9" and plain.endpoint == "/v1/completions"
    assert plain.generation(DEFAULTS).max_new_tokens == 5
    chat = parse_request_line(json.dumps({"custom_id": "c", "messages": [{"role": "user", "content": "x"}]}), 2)
    assert chat.endpoint == "/v1/chat/completions"
    # An OpenAI completions prompt is raw text; a plain line's prompt is answered like a user message.
    assert (completion.raw_prompt, plain.raw_prompt, chat.raw_prompt) == (True, False, False)


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("{not json", "invalid_json", "not valid JSON"),
        ("[1, 2]", "invalid_json", "must be a JSON object"),
        (
            json.dumps({"url": "/v1/chat/completions", "body": {"messages": []}}),
            "missing_custom_id",
            "needs a custom_id",
        ),
        (openai_line(url="/v1/files"), "invalid_url", "'/v1/files'"),
        (openai_line(url="/v1/chat/completions", max_tokens=5), "invalid_body", "body.messages"),
        (
            openai_line(url="/v1/completions", messages=[{"role": "user", "content": "x"}]),
            "invalid_body",
            "body.prompt",
        ),
        (json.dumps({"custom_id": "x", "question": "hi"}), "invalid_body", "needs 'messages' or 'prompt'"),
        (openai_line(messages=[{"role": "user", "content": "x"}], max_tokens="ten"), "invalid_request", "max_tokens"),
        (
            openai_line(messages=[{"role": "user", "content": "x"}], n=0),
            "invalid_request",
            "body.n must be from 1 to 128",
        ),
        (openai_line(messages=[{"role": "user", "content": "x"}], model="gpt-4o"), "model_mismatch", "'gpt-4o'"),
    ],
)
def test_each_kind_of_bad_line_has_its_own_code(text: str, code: str, fragment: str):
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(text, 5, served_model="SmolLM2-135M-Instruct")
    assert raised.value.code == code and raised.value.line == 5
    assert fragment in raised.value.message


def test_a_model_mismatch_can_be_ignored_by_rule():
    line = openai_line(messages=[{"role": "user", "content": "x"}], model="gpt-4o")
    assert parse_request_line(line, 1, served_model="SmolLM2", model_mismatch="ignore").model == "gpt-4o"


def test_settings_the_engine_cannot_combine_fail_the_line_when_applied():
    parsed = parse_request_line(openai_line(messages=[{"role": "user", "content": "x"}], max_tokens=300), 3)
    with pytest.raises(RequestLineError, match="max_new_tokens must be an integer >= 1") as raised:
        replace(parsed, settings={**parsed.settings, "max_new_tokens": 0}).generation(DEFAULTS)
    assert raised.value.code == "invalid_request" and raised.value.custom_id == "r1"


def test_duplicate_ids_are_found_on_disk_with_the_first_line():
    with SeenIds() as seen:
        assert seen.add("a", 1) is None and seen.add("b", 2) is None
        assert seen.add("a", 7) == 1
        assert all(seen.add(f"id-{n}", n) is None for n in range(10_000))


def test_result_and_error_lines_have_the_openai_batch_shape():
    chat = parse_request_line(openai_line("c1"), 1)
    plain = parse_request_line(json.dumps({"custom_id": "p1", "prompt": "x"}), 2)
    completion = Completion("4", prompt_tokens=10, completion_tokens=2, finish_reason="stop")

    chat_line = response_line(chat, completion, model="SmolLM2", request_number=1)
    assert chat_line["custom_id"] == "c1" and chat_line["error"] is None
    body = chat_line["response"]["body"]
    assert chat_line["response"]["status_code"] == 200 and body["model"] == "SmolLM2"
    message = body["choices"][0]["message"]
    assert {key: value for key, value in message.items() if value is not None} == {"role": "assistant", "content": "4"}
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["stop_reason"] is None
    assert body["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert (
        response_line(plain, completion, model="m", request_number=2)["response"]["body"]["choices"][0]["text"] == "4"
    )

    failed = error_line(RequestLineError("invalid_json", "not valid JSON", line=3), request_number=3)
    assert failed["response"] is None and failed["error"] == {
        "code": "invalid_json",
        "message": "not valid JSON",
        "line": 3,
    }
