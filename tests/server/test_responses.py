"""`POST /v1/responses` and `/v1/responses` batches on a real server (SmolLM2 on CPU), through the official `openai`
client with strict response validation: every response, event and batch answer is read by the package's own types."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import RunningServer, jsonl, openai, wait_for_batch

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
USER = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_response_answers_with_its_text_usage_and_settings(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    response = client.responses.create(
        model=MODEL, input="What is 2 + 2?", instructions="Answer with one number.", temperature=0, max_output_tokens=8
    )
    assert response.object == "response" and response.model == MODEL and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete") and response.output_text.strip()
    assert response.instructions == "Answer with one number." and response.max_output_tokens == 8
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.output_tokens_details.reasoning_tokens == 0
    assert response.store is False  # not stored: the answer says so

    cut = client.responses.create(model=MODEL, input="Tell me a long story.", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3


def test_a_response_and_the_same_chat_request_get_the_same_answer(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    response = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a color."}]}],
        instructions="Be brief.",
        max_output_tokens=10,
        temperature=0,
    )
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
        max_tokens=10,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_a_streamed_response_sends_the_responses_event_types_in_order(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    events = list(client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=12, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete") and "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1].response
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.output_text and final.usage.output_tokens > 0
    done = next(event for event in events if event.type == "response.output_text.done")
    assert done.text == final.output_text and done.item_id == final.output[0].id


def test_text_format_with_a_schema_gives_json_that_follows_it(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    response = client.responses.create(
        model=MODEL,
        input="Invent a user with a name and an age.",
        max_output_tokens=48,
        text={"format": {"type": "json_schema", "name": "user", "schema": USER, "strict": True}},
    )
    user = json.loads(response.output_text)
    assert isinstance(user["name"], str) and isinstance(user["age"], int)
    assert response.text.format.type == "json_schema"


def test_tools_are_called_as_function_call_items_streamed_or_not(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    asked = {"model": MODEL, "input": "What is the weather in Paris?", "tools": [WEATHER], "max_output_tokens": 40}
    response = client.responses.create(**asked, tool_choice="required")
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and all(call.name == "get_weather" for call in calls)
    assert isinstance(json.loads(calls[0].arguments)["city"], str) and calls[0].call_id.startswith("call_")
    named = client.responses.create(**asked, tool_choice={"type": "function", "name": "get_weather"})
    assert [item.type for item in named.output] == ["function_call"]
    events = list(client.responses.create(**asked, tool_choice="required", stream=True))
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" not in kinds
    streamed = events[-1].response.output
    assert streamed[0].type == "function_call" and streamed[0].name == "get_weather"


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"input": "x", "text": {"format": {"type": "json_schema", "name": "u", "schema": {"type": "objekt"}}}},
            "text.format.schema",
            "text.format.schema is not a valid JSON schema",
        ),
        (
            {"input": [{"type": "input_image", "image_url": "https://example.com/a.png"}]},
            "input[0].type",
            "input_image",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "input[0].content[0].type",
            "'input_audio' is not supported here",
        ),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "responses are not stored here"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools are supported"),
    ],
)
def test_bad_responses_requests_get_a_400_naming_the_field(
    smollm2_server: RunningServer, body: dict, param: str, message: str
) -> None:
    client = smollm2_server.client()
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, **body)
    assert raised.value.status_code == 400 and message in raised.value.message
    assert raised.value.body["param"] == param  # type: ignore[index]


def test_a_schema_the_grammar_compiler_refuses_is_a_400_naming_text_format(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 1}}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=MODEL, input="x", text={"format": {"type": "json_schema", "name": "n", "schema": schema}}
        )
    assert raised.value.body["param"] == "text.format"  # type: ignore[index]
    assert "text.format json_schema 'n' cannot be enforced: Invalid range" in raised.value.message
    assert "response_format" not in raised.value.message  # the Chat field it is converted to is not what was sent


def test_a_responses_batch_through_the_official_client(smollm2_server: RunningServer) -> None:
    client = smollm2_server.client()
    lines = [
        {"custom_id": f"r{n}", "method": "POST", "url": "/v1/responses", "body": {"input": q, "max_output_tokens": 6}}
        for n, q in enumerate(["Name a fruit.", "Name a planet.", "Name a river."])
    ]
    lines.append(
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"input": [{"type": "input_file", "file_id": "f"}]},
        }
    )
    uploaded = client.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h")
    batch = wait_for_batch(client, batch.id)
    assert batch.status == "completed" and batch.endpoint == "/v1/responses" and batch.model == MODEL
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    answered = [json.loads(text) for text in client.files.content(batch.output_file_id).text.splitlines()]
    responses = {
        item["custom_id"]: openai.types.responses.Response.model_validate(item["response"]["body"]) for item in answered
    }
    assert sorted(responses) == ["r0", "r1", "r2"]
    assert all(response.output_text and response.usage.output_tokens <= 6 for response in responses.values())
    [failed] = [json.loads(text) for text in client.files.content(batch.error_file_id).text.splitlines()]
    assert failed["custom_id"] == "bad" and failed["error"]["code"] == "invalid_body"
    assert "input[0].type 'input_file' is not supported" in failed["error"]["message"]
