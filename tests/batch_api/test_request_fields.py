"""The request fields `vllm run-batch` answers beyond text: logprobs, structured outputs, tools, penalties, logit
bias, chat template keywords and LoRA adapters; read from a line, and answered in OpenAI's shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flyteplugins_batcher.batch_api import BatchRequest, RequestLineError, completion_body, parse_request_line
from flyteplugins_batcher.engines import Completion, GenerationConfig, ResponseFormat, Sample, TokenLogprob

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time"}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(**body: Any) -> str:
    return json.dumps(
        {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": MESSAGES, **body}}
    )


def completion(**body: Any) -> str:
    return json.dumps({"custom_id": "c1", "url": "/v1/completions", "body": {"prompt": "Paris is", **body}})


def parsed(text: str, **checks: Any) -> BatchRequest:
    request = parse_request_line(text, 1, **checks)
    assert isinstance(request, BatchRequest)
    return request


def failure(text: str, **checks: Any) -> RequestLineError:
    with pytest.raises(RequestLineError) as raised:
        parse_request_line(text, 3, **checks)
    assert raised.value.line == 3
    return raised.value


# -- reading -----------------------------------------------------------------------------------------------------


def test_logprobs_are_read_in_each_endpoints_form() -> None:
    assert parsed(chat(logprobs=True)).settings["logprobs"] == 0
    assert parsed(chat(logprobs=True, top_logprobs=3)).settings["logprobs"] == 3
    assert "logprobs" not in parsed(chat(logprobs=False, top_logprobs=0)).settings
    assert parsed(completion(logprobs=2)).settings["logprobs"] == 2
    assert parsed(completion(logprobs=0)).generation(GenerationConfig()).logprobs == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (chat(top_logprobs=2), "body.top_logprobs is 2, but it needs body.logprobs: true"),
        (chat(logprobs=True, top_logprobs=21), "body.top_logprobs must be from 0 to 20, got 21"),
        (chat(logprobs="yes"), "body.logprobs must be true or false, got 'yes'"),
        (completion(logprobs=True), "body.logprobs must be an integer, got True"),
        (completion(logprobs=30), "body.logprobs must be from 0 to 20, got 30"),
    ],
)
def test_bad_logprobs_fail_their_line_naming_the_field(text: str, message: str) -> None:
    error = failure(text)
    assert (error.code, error.message) == ("invalid_request", message)


def test_structured_outputs_and_their_older_names_become_one_response_format() -> None:
    def constraint(text: str) -> ResponseFormat:
        return parsed(text).settings["response_format"]

    assert constraint(chat(structured_outputs={"choice": ["yes", "no"]})) == ResponseFormat.choice(["yes", "no"])
    assert constraint(chat(guided_choice=["yes", "no"])) == ResponseFormat.choice(["yes", "no"])
    assert constraint(chat(structured_outputs={"regex": r"\d+"})) == ResponseFormat.regex(r"\d+")
    assert constraint(chat(guided_regex=r"\d+")).kind == "regex"
    assert constraint(chat(structured_outputs={"grammar": 'root ::= "a"'})) == ResponseFormat.grammar('root ::= "a"')
    assert constraint(chat(guided_json=json.dumps(CITY))) == ResponseFormat.json_schema(CITY)
    assert constraint(chat(structured_outputs={"json": CITY, "disable_any_whitespace": True})).kind == "json_schema"
    assert constraint(chat(structured_outputs={"json_object": True})) == ResponseFormat.json_object()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            chat(guided_regex="a", response_format={"type": "json_object"}),
            "body.response_format and guided_regex each constrain the output; give only one",
        ),
        (chat(structured_outputs={"choice": []}), "body.structured_outputs.choice must be a non-empty list of strings"),
        (chat(structured_outputs={"choice": ["a", 1]}), "body.structured_outputs.choice must be a non-empty list"),
        (chat(structured_outputs={"structural_tag": "x"}), "body.structured_outputs.structural_tag is not supported"),
        (chat(guided_json="{nope"), "body.guided_json is not JSON"),
        (chat(structured_outputs="regex"), "body.structured_outputs must be an object, got 'regex'"),
    ],
)
def test_bad_constraints_fail_their_line_naming_the_field(text: str, message: str) -> None:
    error = failure(text)
    assert error.code == "invalid_request" and error.message.startswith(message), error.message


def test_penalties_bias_and_template_keywords_are_read_and_checked() -> None:
    request = parsed(
        chat(presence_penalty=0.5, frequency_penalty=-1, logit_bias={"504": -100, "34": 2.5}, seed=9, stop="\n")
    )
    config = request.generation(GenerationConfig())
    assert (config.presence_penalty, config.frequency_penalty, config.seed, config.stop) == (0.5, -1.0, 9, ("\n",))
    assert config.logit_bias == ((34, 2.5), (504, -100.0))
    assert parsed(chat(chat_template_kwargs={"enable_thinking": False})).template_kwargs == {"enable_thinking": False}
    messages = {
        chat(presence_penalty=3): "body.presence_penalty must be from -2 to 2, got 3",
        chat(logit_bias={"x": 1}): "body.logit_bias keys must be token ids (integers), got 'x'",
        chat(logit_bias={"5": 101}): "body.logit_bias.5 must be from -100 to 100, got 101",
        chat(chat_template_kwargs={"tokenize": True}): "body.chat_template_kwargs.tokenize is set by the server itself",
        chat(chat_template_kwargs=[1]): "body.chat_template_kwargs must be an object, got [1]",
    }
    for text, message in messages.items():
        assert failure(text).message.startswith(message)


def test_a_named_or_required_tool_choice_constrains_the_output_to_the_tools_schemas() -> None:
    named = parsed(chat(tools=TOOLS, tool_choice=NAMED))
    assert named.settings["response_format"] == ResponseFormat.json_schema(CITY, name="get_weather")
    required = parsed(chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False))
    schema = json.loads(required.settings["response_format"].schema)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    variants = schema["items"]["anyOf"]
    assert [variant["properties"]["name"]["enum"] for variant in variants] == [["get_weather"], ["get_time"]]
    assert variants[1]["properties"]["parameters"] == {"type": "object", "properties": {}}  # a tool without any
    assert "response_format" not in parsed(chat(tools=TOOLS, tool_choice="none")).settings
    auto = parsed(chat(tools=TOOLS), tool_parser="hermes")
    assert auto.tools is not None and auto.tools.choice == "auto" and "response_format" not in auto.settings


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (chat(tools=TOOLS), 'body.tool_choice is "auto" (the default once tools are given), which needs a tool parser'),
        (chat(tools=TOOLS, tool_choice="auto"), 'body.tool_choice is "auto"'),
        (chat(tool_choice="required"), "body.tool_choice is 'required', but the request gives no tools"),
        (
            chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
            "body.tool_choice.function.name is 'nope', which is not one of the tools (get_weather, get_time)",
        ),
        (chat(tools=[{"type": "function"}]), 'body.tools[0] must be {"type": "function"'),
        (
            chat(tools=TOOLS, tool_choice=NAMED, guided_regex="a"),
            "body.tool_choice constrains the output to tool calls",
        ),
    ],
)
def test_bad_tool_use_fails_its_line_saying_why(text: str, message: str) -> None:
    error = failure(text)
    assert error.code == "invalid_request" and error.message.startswith(message), error.message
    if "a tool parser" in message:
        assert "--tool-call-parser" in error.message and "hermes" in error.message


def test_an_unknown_tool_parser_fails_the_lines_that_need_one_naming_those_there_are() -> None:
    error = failure(chat(tools=TOOLS), tool_parser="mistral")
    assert error.message == (
        "body.tool_choice is \"auto\", but the tool parser 'mistral' is not one this server has (hermes, llama3_json)"
    )
    assert parsed(chat(tools=TOOLS, tool_choice="required"), tool_parser="mistral").tools is not None


def test_a_conversation_may_hold_tool_calls_and_their_answers() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]},
    ]
    request = parsed(json.dumps({"custom_id": "t", "url": "/v1/chat/completions", "body": {"messages": messages}}))
    assert request.prompt[1] == {"role": "assistant", "content": "", "tool_calls": [call]}
    assert request.prompt[2] == {"role": "tool", "content": "18 C", "tool_call_id": "call_1"}


def test_a_model_naming_an_adapter_picks_it_and_an_unknown_one_fails_its_line() -> None:
    checks = {"served_model": "base", "adapters": ("sql", "chat")}
    assert parsed(chat(model="sql"), **checks).adapter == "sql"
    assert parsed(chat(model="base"), **checks).adapter is None
    assert parsed(completion(model="chat"), **checks).adapter == "chat"
    error = failure(chat(model="gamma"), **checks)
    assert error.code == "model_mismatch"
    assert error.message.startswith("body.model 'gamma' is not the served model 'base' or one of its LoRA adapters")


# -- answering ---------------------------------------------------------------------------------------------------


def test_logprobs_are_answered_in_each_endpoints_shape() -> None:
    tokens = (
        TokenLogprob(" Par", -0.25, ((" Par", -0.25), (" the", -1.5))),
        TokenLogprob("is", -0.01, (("is", -0.01),)),
    )
    answer = Completion.from_samples(3, [Sample(" Paris", 2, "stop", tokens)])

    chat_choice = completion_body(parsed(chat(logprobs=True)), answer, model="m", response_id="x")["choices"][0]
    first = chat_choice["logprobs"]["content"][0]
    assert first == {
        "token": " Par",
        "logprob": -0.25,
        "bytes": [32, 80, 97, 114],
        "top_logprobs": [
            {"token": " Par", "logprob": -0.25, "bytes": [32, 80, 97, 114]},
            {"token": " the", "logprob": -1.5, "bytes": [32, 116, 104, 101]},
        ],
    }
    text_choice = completion_body(parsed(completion(logprobs=1)), answer, model="m", response_id="y")["choices"][0]
    assert text_choice["logprobs"] == {
        "tokens": [" Par", "is"],
        "token_logprobs": [-0.25, -0.01],
        "top_logprobs": [{" Par": -0.25, " the": -1.5}, {"is": -0.01}],
        "text_offset": [0, 4],
    }


def answer_to(request: BatchRequest, text: str, finish_reason: str = "stop") -> dict[str, Any]:
    body = completion_body(
        request, Completion.from_samples(5, [Sample(text, 9, finish_reason)]), model="m", response_id="id"
    )  # type: ignore[arg-type]
    return body["choices"][0]


def given(message: dict) -> dict:
    """A message's fields that are not null (vLLM's and OpenAI's others are written null)."""
    return {key: value for key, value in message.items() if value is not None}


def test_tool_calls_are_answered_in_openais_shape_with_vllms_finish_reasons() -> None:
    named = answer_to(parsed(chat(tools=TOOLS, tool_choice=NAMED)), '{"city": "Paris"}')
    assert named["finish_reason"] == "stop" and named["message"]["content"] is None
    [call] = named["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}

    required = answer_to(
        parsed(chat(tools=TOOLS, tool_choice="required")),
        '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]',
    )
    assert required["finish_reason"] == "tool_calls"
    functions = [call["function"] for call in required["message"]["tool_calls"]]
    assert functions == [
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"name": "get_time", "arguments": "{}"},
    ]
    assert len({call["id"] for call in required["message"]["tool_calls"]}) == 2

    hermes = parsed(chat(tools=TOOLS), tool_parser="hermes")
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    auto = answer_to(hermes, text)
    assert auto["finish_reason"] == "tool_calls" and auto["message"]["content"] == "Let me check."
    assert auto["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert given(answer_to(hermes, "It is sunny.")["message"]) == {"role": "assistant", "content": "It is sunny."}
    llama = parsed(chat(tools=TOOLS), tool_parser="llama3_json")
    found = answer_to(llama, '{"name": "get_time", "parameters": {}}')["message"]["tool_calls"]
    assert [call["function"]["name"] for call in found] == ["get_time"]


def test_an_answer_cut_short_keeps_its_text_and_its_length_finish() -> None:
    cut = answer_to(parsed(chat(tools=TOOLS, tool_choice=NAMED)), '{"city": "Par', "length")
    assert cut["finish_reason"] == "length"
    assert given(cut["message"]) == {"role": "assistant", "content": '{"city": "Par'}


def test_an_adapters_answer_names_the_adapter_as_its_model() -> None:
    request = parsed(chat(model="sql"), served_model="base", adapters=("sql",))
    body = completion_body(request, Completion.from_samples(1, [Sample("x", 1, "stop")]), model="base", response_id="r")
    assert body["model"] == "sql"
