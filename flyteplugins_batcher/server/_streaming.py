"""`stream: true`: a finished completion as the server-sent events of OpenAI's streaming API.

The engines answer a record once it is complete, so a streamed chat answer arrives as one content
event per choice, then each choice's `finish_reason` (a text completion's event carries both), then
(with `stream_options.include_usage`) a usage event, then `[DONE]`: what every OpenAI client reads
from a stream, in fewer events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def stream_events(body: dict[str, Any], *, include_usage: bool) -> Iterator[str]:
    """The `data:` events for a finished `chat.completion` or `text_completion` body."""
    chat = body["object"] == "chat.completion"
    head = {
        "id": body["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": body["created"],
        "model": body["model"],
    }
    if chat:
        for choice in body["choices"]:
            delta = {"role": "assistant", "content": choice["message"]["content"]}
            yield _event({**head, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]})
        for choice in body["choices"]:
            yield _event(
                {**head, "choices": [{"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}]}
            )
    else:  # a text completion's events carry a finish_reason each (the API's `Completion` requires one)
        for choice in body["choices"]:
            yield _event({**head, "choices": [choice]})
    if include_usage:
        yield _event({**head, "choices": [], "usage": body["usage"]})
    yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
