"""Server-sent events as OpenAI's streaming API sends them, read from an `httpx` response by hand.

Raw parsing (not the `openai` client) so that a benchmark sees each event the moment its line
arrives, and a soak can stop reading after any event.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

DONE = "[DONE]"


async def sse_data(response: httpx.Response) -> AsyncIterator[dict[str, Any] | str]:
    """Each `data:` payload of a streamed response, decoded: a JSON object, or `DONE` for `data: [DONE]`.

    Raises:
        ValueError: A `data:` line that is neither `[DONE]` nor JSON.
    """
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[len("data:") :].strip()
        yield DONE if payload == DONE else json.loads(payload)


async def first_content_and_tokens(response: httpx.Response, sent: float) -> tuple[float, int]:
    """Read a streamed answer to `[DONE]`: seconds from `sent` (a `perf_counter`) to its first content, and its tokens.

    The first is 0.0 when no event carried content; the tokens are the usage event's completion tokens (0 without it).
    """
    first, tokens = 0.0, 0
    async for event in sse_data(response):
        if event == DONE:
            break
        if not first and delta_text(event):
            first = time.perf_counter() - sent
        tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
    return first, tokens


def delta_text(event: dict[str, Any]) -> str:
    """The text an event adds, chat (`delta.content`) or text completion (`text`), over its choices."""
    pieces = []
    for choice in event.get("choices") or []:
        delta = choice.get("delta")
        pieces.append((delta or {}).get("content") or "" if delta is not None else choice.get("text") or "")
    return "".join(pieces)


def finish_reasons(event: dict[str, Any]) -> list[str]:
    """The finish reasons an event carries (none until a choice ends)."""
    return [choice["finish_reason"] for choice in event.get("choices") or [] if choice.get("finish_reason")]
