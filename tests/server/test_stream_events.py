"""The streamed events' format, and text handed from an engine's thread to the event loop, without a server."""

from __future__ import annotations

import asyncio
import json
import threading

from flyteplugins_batcher.batch_api import BatchRequest, completion_body, parse_request_line
from flyteplugins_batcher.engines import Completion
from flyteplugins_batcher.server._http.deltas import TextDeltas
from flyteplugins_batcher.server._http.streaming import ChunkEvents, stream_events


def parsed(events: list[str]) -> list[dict]:
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(event.removeprefix("data: ")) for event in events[:-1]]


def text_body(texts: list[str]) -> dict:
    choices = [{"index": i, "text": text, "finish_reason": "length", "logprobs": None} for i, text in enumerate(texts)]
    usage = {"prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10}
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": choices, "usage": usage}


def test_a_whole_text_completion_is_one_event_per_choice_with_its_finish_reason() -> None:
    events = parsed(list(stream_events(text_body(["ab", "cd"]), include_usage=False)))

    assert [event["choices"] for event in events] == [
        [{"index": 0, "text": "ab", "logprobs": None, "finish_reason": "length"}],
        [{"index": 1, "text": "cd", "logprobs": None, "finish_reason": "length"}],
    ]


def test_the_closing_events_send_only_what_was_not_streamed_then_each_finish_then_usage() -> None:
    events = ChunkEvents("chatcmpl-1", "m", chat=True, choices=2)
    body = {
        "choices": [
            {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
            for i, text in enumerate(["hello", "world"])
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }

    streamed = [
        json.loads(event.removeprefix("data: ")) for event in (events.content(0, "hel"), events.content(1, "world"))
    ]
    closing = parsed(list(events.closing(body, include_usage=True)))

    assert [event["choices"][0]["delta"] for event in streamed] == [{"content": "hel"}, {"content": "world"}]

    assert [event["choices"] for event in closing] == [
        [{"index": 0, "delta": {"content": "lo"}, "logprobs": None, "finish_reason": None}],
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [{"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert closing[-1]["usage"] == body["usage"] and {event["id"] for event in closing} == {"chatcmpl-1"}


def test_the_usage_event_that_ends_a_stream_is_the_answers_usage_with_its_cached_prompt_tokens() -> None:
    line = {"custom_id": "o", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}]}}
    request = parse_request_line(json.dumps(line), 1)
    assert isinstance(request, BatchRequest)
    body = completion_body(request, Completion("Hello", 30, 2, "stop", cached_tokens=16), model="m", response_id="c-1")

    usage = parsed(list(stream_events(body, include_usage=True)))[-1]["usage"]

    assert usage == {
        "prompt_tokens": 30,
        "completion_tokens": 2,
        "total_tokens": 32,
        "prompt_tokens_details": {"cached_tokens": 16},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


async def test_text_from_another_thread_arrives_in_order_and_wakes_the_loop() -> None:
    deltas = TextDeltas(asyncio.get_running_loop())
    pieces = [(index % 2, str(index), ()) for index in range(2000)]
    engine = threading.Thread(target=lambda: [deltas(*piece) for piece in pieces])

    engine.start()
    received: list[tuple[int, str, tuple[()]]] = []
    while len(received) < len(pieces):
        await asyncio.wait_for(deltas.ready(), timeout=5)
        received += deltas.take()
    engine.join()

    assert received == pieces and deltas.take() == []
