"""`/v1/responses` lines: read as the chat request they mean (the same engine `Request`), answered as a Responses API
`response` validated by the `openai` package's own type, bad input refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flyteplugins_batcher.batch_api import (
    BatchRequest,
    RequestLineError,
    parse_request_line,
    response_line,
)
from flyteplugins_batcher.engines import Completion, GenerationConfig, ResponseFormat, Sample

openai_types = pytest.importorskip("openai.types.responses", reason="needs the test extra")

WEATHER = {
    "type": "function",
    "name": "weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def line(url: str = "/v1/responses", **body: Any) -> str:
    return json.dumps({"custom_id": "r1", "method": "POST", "url": url, "body": body})


def parse(text: str, **checks: Any) -> BatchRequest:
    request = parse_request_line(text, 2, served_model="m", **checks)
    assert isinstance(request, BatchRequest)
    return request


def failure(text: str, **checks: Any) -> RequestLineError:
    with pytest.raises(RequestLineError) as raised:
        parse(text, **checks)
    return raised.value


def answered(request: BatchRequest, text: str, finish: str = "stop") -> Any:
    completion = Completion.from_samples(11, [Sample(text, 4, finish)], cached_tokens=3)  # type: ignore[arg-type]
    output = response_line(request, completion, model="m", request_number=2)
    assert output["custom_id"] == "r1" and output["response"]["status_code"] == 200
    return openai_types.Response.model_validate(output["response"]["body"])


def test_a_responses_request_is_the_same_engine_request_as_the_chat_request_it_means():
    responses = parse(
        line(
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            instructions="Be brief.",
            max_output_tokens=12,
            temperature=0.5,
            top_p=0.9,
        )
    )
    chat = parse(
        line(
            "/v1/chat/completions",
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            max_tokens=12,
            temperature=0.5,
            top_p=0.9,
        )
    )
    defaults = GenerationConfig()
    assert responses.engine_request(defaults) == chat.engine_request(defaults)
    assert responses.endpoint == "/v1/responses" and responses.chat


def test_a_string_input_is_one_user_message():
    assert parse(line(input="What is 2 + 2?")).prompt == [{"role": "user", "content": "What is 2 + 2?"}]


def test_function_call_items_and_their_outputs_become_the_tool_turns_of_the_conversation():
    request = parse(
        line(
            input=[
                {"type": "message", "role": "user", "content": "Weather in Paris and Rome?"},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city": "Rome"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
            ],
            tools=[WEATHER],
            tool_choice="none",
        )
    )
    assistant, first, second = request.prompt[1:]
    assert [call["id"] for call in assistant["tool_calls"]] == ["c1", "c2"]
    assert (first["role"], first["tool_call_id"], first["content"]) == ("tool", "c1", "sunny")
    assert (second["tool_call_id"], second["content"]) == ("c2", "rain")
    assert request.tools is not None and request.tools.tools[0]["function"]["name"] == "weather"


def test_text_format_with_a_schema_is_enforced_structured_output():
    request = parse(
        line(input="Invent a user", text={"format": {"type": "json_schema", "name": "u", "schema": SCHEMA}})
    )
    assert request.settings["response_format"] == ResponseFormat.json_schema(SCHEMA, name="u")
    assert parse(line(input="x", text={"format": {"type": "json_object"}})).settings["response_format"].is_json
    assert "response_format" not in parse(line(input="x", text={"format": {"type": "text"}})).settings


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "u", "schema": {"type": "objekt"}}}},
            "invalid_request",
            "body.text.format.schema is not a valid JSON schema: 'objekt' is not valid",
        ),
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "schema": [1]}}},
            "invalid_request",
            "body.text.format.schema must be a JSON schema object",
        ),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "invalid_request", "body.text.format.type must be"),
        (
            {"input": [{"type": "input_image", "image_url": "https://example.com/cat.png"}]},
            "invalid_body",
            "body.input[0].type 'input_image' is not supported here",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "invalid_body",
            "body.input[0].content[0].type 'input_file' is not supported here",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "invalid_body", "body.input[0].type 'item_reference'"),
        ({"input": [{"role": "tool", "content": "x"}]}, "invalid_body", "body.input[0].role must be one of user"),
        ({"input": ""}, "invalid_body", "body.input is empty"),
        ({"input": "x", "previous_response_id": "resp_1"}, "invalid_request", "body.previous_response_id needs a"),
        ({"input": "x", "background": True}, "invalid_request", "body.background is not supported"),
        ({"input": "x", "store": "yes"}, "invalid_request", "body.store must be true or false"),
        ({"input": "x", "truncation": "auto"}, "invalid_request", "body.truncation must be 'disabled'"),
        ({"input": "x", "max_output_tokens": 0}, "invalid_request", "body.max_output_tokens must be >= 1"),
        ({"input": "x", "temperature": 3}, "invalid_request", "body.temperature must be from 0 to 2"),
        (
            {"input": "x", "tools": [{"type": "web_search"}]},
            "invalid_request",
            "body.tools[0].type is 'web_search'; only function tools are supported here",
        ),
        (
            {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "clock"}},
            "invalid_request",
            "body.tool_choice.name is 'clock', which is not one of the tools (weather)",
        ),
    ],
)
def test_bad_responses_bodies_fail_alone_naming_the_field(body: dict[str, Any], code: str, message: str):
    error = failure(line(**body))
    assert error.code == code and error.message.startswith(message), error.message
    assert error.custom_id == "r1" and error.line == 2


def test_a_max_output_tokens_that_fills_the_context_fails_naming_it():
    error = failure(line(input="x", max_output_tokens=4096), context_length=2048)
    assert error.code == "context_length_exceeded" and error.message.startswith("body.max_output_tokens is 4096")


def test_store_is_accepted_and_answered_honestly_as_not_stored():
    response = answered(parse(line(input="Hi", store=True)), "Hello")
    assert response.store is False


def test_the_answer_is_a_response_with_its_text_usage_and_the_request_echoed():
    request = parse(
        line(input="Hi", instructions="Be brief.", max_output_tokens=5, temperature=0.2, metadata={"run": "7"})
    )
    response = answered(request, "Hello there")
    assert (response.object, response.status, response.output_text, response.model) == (
        "response",
        "completed",
        "Hello there",
        "m",
    )
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (11, 4, 15)
    assert (usage.input_tokens_details.cached_tokens, usage.output_tokens_details.reasoning_tokens) == (3, 0)
    assert (response.instructions, response.max_output_tokens, response.temperature) == ("Be brief.", 5, 0.2)
    assert response.metadata == {"run": "7"} and response.id == "resp-2"
    assert response.output[0].id == "msg-2"


def test_an_answer_cut_by_max_output_tokens_is_incomplete():
    response = answered(parse(line(input="Hi", max_output_tokens=4)), "Hello th", finish="length")
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_tool_calls_in_the_answer_are_function_call_items():
    request = parse(line(input="Weather in Paris?", tools=[WEATHER], tool_choice="required"))
    response = answered(request, '[{"name": "weather", "parameters": {"city": "Paris"}}]')
    [call] = response.output
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and response.tool_choice == "required"
    assert response.tools[0].name == "weather"
    named = parse(line(input="Weather?", tools=[WEATHER], tool_choice={"type": "function", "name": "weather"}))
    assert answered(named, '{"city": "Oslo"}').output[0].arguments == '{"city": "Oslo"}'
