"""The request fields beyond text through the real server and the official `openai` client: logprobs (streamed
too), LoRA adapters named as the model and listed by `/v1/models`, structured outputs, tools, and refusals by name.

The server runs the bundled SmolLM2 on the Transformers engine with two peft adapters and the hermes tool parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lora_adapters import lora_flag
from tests.server.conftest import RunningServer, start_server

openai = pytest.importorskip("openai", reason="needs the test extra")

pytestmark = [pytest.mark.slow, pytest.mark.engine_starts(2)]  # the server, the session's adapters

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, lora_adapters: dict[str, str]) -> Iterator[RunningServer]:
    flags = ["--engine", "transformers", "--no-embeddings", "--max-new-tokens", "16", "--tool-call-parser", "hermes"]
    running = start_server(tmp_path_factory.mktemp("fields") / "data", *flags, *lora_flag(lora_adapters))
    yield running
    running.stop()


def test_models_lists_the_adapters_beside_their_base_model(server: RunningServer) -> None:
    client = server.client()
    listed = {model.id: model for model in client.models.list().data}
    base = next(name for name in listed if name not in ("alpha", "beta"))
    assert set(listed) == {base, "alpha", "beta"}
    assert client.models.retrieve("alpha").id == "alpha" and listed["alpha"].model_extra["parent"] == base


def test_logprobs_come_in_openais_shape_and_streamed_equal_them_token_for_token(server: RunningServer) -> None:
    client = server.client()
    answer = client.chat.completions.create(model="alpha", messages=QUESTION, logprobs=True, top_logprobs=2)
    choice = answer.choices[0]
    assert answer.model == "alpha" and choice.logprobs is not None and choice.logprobs.content
    tokens = choice.logprobs.content
    assert "".join(token.token for token in tokens).startswith(choice.message.content)
    for token in tokens:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2 and token.bytes == list(token.token.encode())
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen token is the most likely
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)

    stream = client.chat.completions.create(
        model="alpha", messages=QUESTION, logprobs=True, top_logprobs=2, stream=True
    )
    streamed = [item for chunk in stream for c in chunk.choices if c.logprobs for item in c.logprobs.content]
    assert [(item.token, item.logprob) for item in streamed] == [(item.token, item.logprob) for item in tokens]


def test_a_completions_logprobs_and_the_base_and_adapter_answers_differ(server: RunningServer) -> None:
    client = server.client()
    text = client.completions.create(model="beta", prompt="The capital of France is", max_tokens=4, logprobs=1)
    logprobs = text.choices[0].logprobs
    assert text.model == "beta" and logprobs is not None and len(logprobs.tokens) == 4
    assert logprobs.text_offset == [sum(len(token) for token in logprobs.tokens[:n]) for n in range(4)]
    answers = {
        model: client.chat.completions.create(model=model, messages=QUESTION).choices[0].message.content
        for model in ("alpha", "beta", client.models.list().data[0].id)
    }
    assert len(set(answers.values())) == 3, answers


def test_structured_outputs_choice_and_regex_are_obeyed(server: RunningServer) -> None:
    client = server.client()
    choice = client.chat.completions.create(
        model="alpha", messages=QUESTION, extra_body={"structured_outputs": {"choice": ["four", "five"]}}
    )
    regex = client.chat.completions.create(messages=QUESTION, model="beta", extra_body={"guided_regex": "[0-9]{1,2}"})
    assert choice.choices[0].message.content in ("four", "five")
    assert re.fullmatch("[0-9]{1,2}", regex.choices[0].message.content)


def test_named_and_required_tool_calls_follow_the_tools_schema(server: RunningServer) -> None:
    client = server.client()
    model = client.models.list().data[0].id  # the base model: the random adapters ramble inside a JSON string
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    named = client.chat.completions.create(
        model=model,
        messages=ask,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=32,
    )
    required = client.chat.completions.create(
        model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=48
    )
    assert named.choices[0].finish_reason == "stop" and required.choices[0].finish_reason == "tool_calls"
    for answer in (named, required):
        [call] = answer.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)

    stream = client.chat.completions.create(
        model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=48, stream=True
    )
    calls = [call for chunk in stream for c in chunk.choices if c.delta.tool_calls for call in c.delta.tool_calls]
    assert [call.function.name for call in calls] == ["get_weather"]

    answered = client.chat.completions.create(  # the call's answer in the conversation, and "auto" with a parser
        model=model,
        messages=[
            *ask,
            named.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
        ],
        tools=TOOLS,
    )
    assert answered.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_client_mistakes_and_fields_the_engine_cannot_honour_are_4xx_naming_them(server: RunningServer) -> None:
    client = server.client()
    with pytest.raises(openai.NotFoundError, match="'gamma' does not exist"):
        client.chat.completions.create(model="gamma", messages=QUESTION)
    with pytest.raises(openai.BadRequestError, match="logit_bias names token ids outside the model's vocabulary"):
        client.chat.completions.create(model="alpha", messages=QUESTION, logit_bias={"99999999": 5})
    with pytest.raises(openai.BadRequestError, match=r"structured_outputs\.grammar cannot be enforced"):
        client.chat.completions.create(
            model="alpha", messages=QUESTION, extra_body={"structured_outputs": {"grammar": "x ::="}}
        )
    with pytest.raises(openai.BadRequestError, match=re.escape("top_logprobs is 3, but it needs logprobs: true")):
        client.chat.completions.create(model="alpha", messages=QUESTION, top_logprobs=3)


def test_a_batch_of_adapter_and_base_lines_through_the_batch_api(server: RunningServer, tmp_path: Path) -> None:
    from tests.server.conftest import chat_line, jsonl, wait_for_batch

    client = server.client()
    lines = [chat_line("base", "What is 2 + 2?"), chat_line("alpha", "What is 2 + 2?", model="alpha", logprobs=True)]
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for_batch(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 2
    results: dict[str, Any] = {}
    for row in client.files.content(done.output_file_id).text.splitlines():
        line = json.loads(row)
        results[line["custom_id"]] = line["response"]["body"]
    online = client.chat.completions.create(model="alpha", messages=QUESTION).choices[0].message.content
    assert results["alpha"]["model"] == "alpha" and results["alpha"]["choices"][0]["message"]["content"] == online
    assert results["alpha"]["choices"][0]["logprobs"]["content"] and results["base"]["choices"][0]["logprobs"] is None
