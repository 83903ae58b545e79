"""`stream: true` over HTTP: the text goes out as the engine makes it (a simulated GPU: deterministic answers).

The simulated engine steps like vLLM and hands each step's new text to the record's listener, so a
streamed answer arrives token by token; its concatenation is the answer a request that is not
streamed gets. Times are compared with each other, never with a constant.
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from tests.server.conftest import RunningServer, openai, simulated, start_server

pytestmark = pytest.mark.slow

TOKENS = 48
"""Every answer's length (the simulated engine's draw, fixed: no spread)."""

ENGINE = simulated(time_scale=0.25, output_lengths={"mean": TOKENS, "spread": 0.0})
"""A simulated GPU 4 times slower than real time: a step takes about 30 ms, an answer about 1.5 s."""

CHAT = [{"role": "user", "content": "Tell me about streams."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("streaming") / "data", *ENGINE)
    yield running
    running.stop()


def test_a_streamed_chat_answer_is_the_answer_in_many_events(server: RunningServer) -> None:
    client = server.client()
    whole = client.chat.completions.create(model="simulated", messages=CHAT, temperature=0)

    with_usage = list(
        client.chat.completions.create(
            model="simulated", messages=CHAT, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    without_usage = list(client.chat.completions.create(model="simulated", messages=CHAT, temperature=0, stream=True))

    for events in (with_usage, without_usage):
        contents = [
            event.choices[0].delta.content for event in events if event.choices and event.choices[0].delta.content
        ]
        assert "".join(contents) == whole.choices[0].message.content
        assert len(contents) >= TOKENS // 2  # the text came in pieces, not in one event at the end
        assert events[0].choices[0].delta.role == "assistant"
        finishes = [event.choices[0].finish_reason for event in events if event.choices]
        assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
        assert len({event.id for event in events}) == 1
    assert with_usage[-1].choices == [] and with_usage[-1].usage == whole.usage
    assert all(event.usage is None for event in without_usage)


def test_each_of_n_choices_streams_under_its_index(server: RunningServer) -> None:
    client = server.client()

    greedy = list(client.chat.completions.create(model="simulated", messages=CHAT, temperature=0, n=2, stream=True))
    sampled = list(
        client.chat.completions.create(model="simulated", messages=CHAT, temperature=1, seed=3, n=2, stream=True)
    )

    for events in (greedy, sampled):
        texts = {index: "" for index in (0, 1)}
        finished = {}
        for event in events:
            choice = event.choices[0]
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished[choice.index] = choice.finish_reason
        assert set(finished) == {0, 1} and all(len(text) == 4 * TOKENS for text in texts.values())
        pieces = [event.choices[0].index for event in events if event.choices[0].delta.content]
        assert pieces.count(0) > 1 and pieces.count(1) > 1


def test_a_streamed_text_completion_is_its_answer_with_openais_null_finish_reasons(server: RunningServer) -> None:
    # OpenAI's own text completion events carry `finish_reason: null` until the last one (as vLLM's
    # do; openai/openai-openapi#100), but the SDK types `CompletionChoice.finish_reason` as required,
    # so its strict validation (`_strict_response_validation=True`) refuses OpenAI's own streams.
    # The SDK's default client, which users have, builds the events without that check: it reads
    # the stream here, and `test_every_event_has_openais_fields_and_types` validates each event strictly.
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(model="simulated", prompt="Once upon a time", max_tokens=20)

    events = list(
        client.completions.create(
            model="simulated",
            prompt="Once upon a time",
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    texts, usage = events[:-1], events[-1]
    assert all(isinstance(event, openai.types.Completion) for event in events)
    assert "".join(event.choices[0].text for event in texts) == whole.choices[0].text
    assert [event.choices[0].finish_reason for event in texts][-1] == "length" == whole.choices[0].finish_reason
    assert {event.choices[0].finish_reason for event in texts[:-1]} == {None} and len(texts) >= 10
    assert {(event.object, event.model) for event in events} == {("text_completion", "simulated")}
    assert len({event.id for event in events}) == 1
    assert all(isinstance(event.created, int) and event.created > 0 for event in events)
    assert all((choice.index, choice.logprobs) == (0, None) for event in texts for choice in event.choices)
    assert usage.choices == [] and usage.usage == whole.usage


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_every_event_has_openais_fields_and_types(server: RunningServer, endpoint: str) -> None:
    chat = endpoint == "/v1/chat/completions"
    body = {"model": "simulated", "max_tokens": 12, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    body.update({"messages": CHAT} if chat else {"prompt": "Once upon a time"})

    with httpx.stream("POST", f"{server.url}{endpoint}", json=body, timeout=60) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]

    assert lines[-1] == "[DONE]"
    events = [json.loads(line) for line in lines[:-1]]
    kind = openai.types.chat.ChatCompletionChunk if chat else openai.types.Completion
    last = {choice["index"]: number for number, event in enumerate(events) for choice in event["choices"]}
    for number, event in enumerate(events):
        assert_fields_of(kind, event)
        if not chat:  # validated as the SDK types it, but for OpenAI's null finish_reason before a choice's end
            for choice in event["choices"]:
                assert (choice["finish_reason"] is None) == (number < last[choice["index"]])
            event = {**event, "choices": [{**choice, "finish_reason": "length"} for choice in event["choices"]]}
        kind.model_validate(event)
    assert sorted(last) == [0, 1] and events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 24


def assert_fields_of(kind: type[BaseModel], data: dict[str, Any]) -> None:
    """`data` has only fields the SDK's `kind` knows, at every level (pydantic alone would let others pass)."""
    assert set(data) <= set(kind.model_fields), f"{kind.__name__}: {sorted(set(data) - set(kind.model_fields))}"
    for name, value in data.items():
        inner = _model_in(kind.model_fields[name].annotation)
        for item in value if isinstance(value, list) else [value]:
            if inner is not None and isinstance(item, dict):
                assert_fields_of(inner, item)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`Optional[X]`, `List[X]`, `X`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((model for arg in typing.get_args(annotation) if (model := _model_in(arg)) is not None), None)


def test_the_first_text_arrives_long_before_the_whole_answer(server: RunningServer) -> None:
    body = {"model": "simulated", "messages": CHAT, "temperature": 0, "stream": True}

    started = time.perf_counter()
    arrivals = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                arrivals.append(time.perf_counter() - started)
    total = time.perf_counter() - started

    assert len(arrivals) >= TOKENS // 2
    assert arrivals[0] < 0.25 * total  # vs. one event at the end: the whole answer's time
    assert arrivals[len(arrivals) // 2] > 2 * arrivals[0]  # they keep coming while the engine works


def test_a_prompt_that_cannot_run_is_an_http_error_even_when_streamed(server: RunningServer) -> None:
    client = server.client()
    too_long = [{"role": "user", "content": "word " * 9000}]

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="simulated", messages=too_long, max_tokens=8, stream=True)

    assert refused.value.status_code == 400
