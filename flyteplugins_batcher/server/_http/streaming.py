"""`stream: true`: a completion as the server-sent events of OpenAI's streaming API, sent as the engine makes it.

The events, in order: each choice's role (chat), then the content as it is made (each piece with
its choice's `index`), then each choice's `finish_reason`, then (with `stream_options.include_usage`)
a usage event, then `[DONE]`. The record carries a `TextDeltas` listener: an engine that streams
(vLLM stream mode, the simulated engine) hands it each step's new text, and the events go out as
it comes. An engine that answers whole records (Transformers, vLLM batch mode) never calls it: its
answer goes out in one content event per choice once it is complete. The completion's final text
has the last word: what it holds beyond what was streamed is sent before the finish events. A text
completion's content events carry `finish_reason: null`, as OpenAI's and vLLM's do, except the
last of each choice, which carries its finish reason (so a whole answer is one valid event each).

A request that asked for logprobs gets them on each content event, for the tokens of that event's
text, in its answer's shape (`BatchRequest.logprobs_object`). A chat request read for tool calls
(`tools` with a choice other than "none") is answered whole: its calls, found in the finished
text, go out as one `tool_calls` delta per choice before its finish event.

A client that stops reading cancels the record: Starlette cancels the response when its client
disconnects, and the events' `finally` (and the response's background task) cancels the record,
which stops it in the engine where the engine can stop it. The response only starts once the
record has its first text or its answer, so an error before then (a prompt that cannot run) is an
HTTP error, as for a request that is not streamed; one after it is an `error` event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from flyteplugins_batcher.batch_api import BatchRequest
from flyteplugins_batcher.engines import Completion, EngineDeadError, TokenLogprob
from flyteplugins_batcher.server._http.deltas import CLIENT_CLOSED_REQUEST, Piece, TextDeltas, until_done_or_gone
from flyteplugins_batcher.server._http.errors import engine_failed_message, log_incident
from flyteplugins_batcher.server._inference import Inference, OnlineRecord

DONE = "data: [DONE]\n\n"


class ChunkEvents:
    """The `data:` events of one streamed answer, chat (`chat.completion.chunk`) or text (`text_completion`).

    Args:
        response_id: The answer's id, on every event.
        model: The served model.
        chat: A chat answer (else a text completion).
        choices: How many choices (`n`).
        request: The request, when its logprobs are streamed (it shapes them).

    Example:
        ```python
        events = ChunkEvents("chatcmpl-1", "m", chat=True, choices=1)
        sent = [*events.opening(), events.content(0, "4"), *events.closing(body, include_usage=False)]
        ```
    """

    def __init__(
        self, response_id: str, model: str, *, chat: bool, choices: int, request: BatchRequest | None = None
    ) -> None:
        self.chat = chat
        self.choices = choices
        self.request = request
        self.sent = [Sent() for _ in range(choices)]
        self.head = {
            "id": response_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": model,
        }

    def opening(self) -> list[str]:
        """Each chat choice's role, before its content (nothing for a text completion)."""
        delta = {"role": "assistant", "content": ""}
        return [self._choice(index, delta) for index in range(self.choices)] if self.chat else []

    def content(self, index: int, text: str, logprobs: Sequence[TokenLogprob] = ()) -> str:
        """A piece of choice `index`'s text, with its tokens' logprobs when the request asked for them."""
        sent = self.sent[index]
        shaped = self.request.logprobs_object(logprobs, len(sent.text)) if logprobs and self.request else None
        sent.text += text
        sent.logprobs += len(logprobs)
        return self._choice(index, {"content": text} if self.chat else text, logprobs=shaped)

    def closing(self, body: dict[str, Any], *, include_usage: bool) -> Iterator[str]:
        """The rest of each choice (what its completion holds beyond what was sent), its finish, usage, `[DONE]`."""
        for choice in body["choices"]:
            index, sent = choice["index"], self.sent[choice["index"]]
            rest, logprobs = _rest(choice, sent.text, self.chat), _rest_logprobs(choice.get("logprobs"), sent.logprobs)
            sent.text += rest
            if not self.chat:  # a text completion's last event carries its last text and its finish reason
                yield self._choice(index, rest, choice["finish_reason"], logprobs=logprobs)
                continue
            if rest or logprobs:
                yield self._choice(index, {"content": rest}, logprobs=logprobs)
            calls = choice["message"].get("tool_calls")
            if calls:
                yield self._choice(index, {"tool_calls": [{"index": n, **call} for n, call in enumerate(calls)]})
        if self.chat:
            for choice in body["choices"]:
                yield self._choice(choice["index"], {}, choice["finish_reason"])
        if include_usage:
            yield _event({**self.head, "choices": [], "usage": body["usage"]})
        yield DONE

    def error(self, error: Exception) -> str:
        """The event that ends a stream whose record failed after it started: what happened, and an error id.

        The error's own text (the engine's, which may name paths or its internals) goes to the log
        under that id, with its traceback, and never into the event.
        """
        kind = "chat completion" if self.chat else "completion"
        incident = log_incident(f"the streamed {kind} {self.head['id']} failed", error)
        if isinstance(error, EngineDeadError):
            message, code = engine_failed_message(incident), "engine_unavailable"
        else:
            message = f"The server had an error while generating this answer (error id {incident}; its log has it)."
            code = "server_error"
        return _event({"error": {"message": message, "type": "server_error", "param": None, "code": code}})

    def _choice(
        self,
        index: int,
        delta: dict[str, Any] | str,
        finish_reason: str | None = None,
        *,
        logprobs: dict[str, Any] | None = None,
    ) -> str:
        key = "delta" if self.chat else "text"
        choice = {"index": index, key: delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return _event({**self.head, "choices": [choice]})


class Sent:
    """What went out of one choice so far: its text, and how many of its tokens' logprobs."""

    def __init__(self) -> None:
        self.text = ""
        self.logprobs = 0


def stream_events(body: dict[str, Any], *, include_usage: bool) -> Iterator[str]:
    """The events for a finished `chat.completion` or `text_completion` body, none of it streamed before."""
    chat = body["object"] == "chat.completion"
    events = ChunkEvents(body["id"], body["model"], chat=chat, choices=len(body["choices"]))
    events.head["created"] = body["created"]
    yield from events.opening()
    yield from events.closing(body, include_usage=include_usage)


async def streamed_answer(
    request: Request,
    inference: Inference,
    parsed: BatchRequest,
    answer: Callable[[Completion], dict[str, Any]],
    events: Callable[..., ChunkEvents],
    *,
    include_usage: bool,
) -> Response:
    """Start the record, and answer with its events once it has its first text or its answer.

    Args:
        request: The HTTP request (its client may leave while the record waits).
        inference: Where the record runs.
        parsed: The request.
        answer: The completion's response body (`completion_body`).
        events: The events' format, given `choices=`.
        include_usage: Send a usage event before `[DONE]`.

    Raises:
        QueueFullError: The batcher's queue is full.
        Exception: The record failed before its first text (its own error: a prompt that cannot run, say).
    """
    deltas = TextDeltas(asyncio.get_running_loop())
    whole = parsed.tools is not None and parsed.tools.calls_expected  # its calls are read in the finished text
    record = await inference.start(parsed, on_delta=None if whole else deltas)
    deltas.watch(record.future)
    try:
        present = await until_done_or_gone(request, deltas.ready())
    except BaseException:
        record.cancel()
        raise
    if not present:
        record.cancel()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    if record.future.done():
        record.future.result()  # its error, as an HTTP error
    streamed = events(choices=record.choices, request=parsed)
    sent = _sent_events(record, deltas, streamed, answer, include_usage=include_usage)
    return StreamingResponse(sent, media_type="text/event-stream", background=BackgroundTask(record.cancel))


async def _sent_events(
    record: OnlineRecord,
    deltas: TextDeltas,
    events: ChunkEvents,
    answer: Callable[[Completion], dict[str, Any]],
    *,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The events as the text comes; the record is cancelled if its client leaves before the end."""
    try:
        if events.chat:
            yield "".join(events.opening())
        while True:
            pieces = deltas.take()
            if pieces:
                yield "".join(_pieces(events, pieces))
            if record.future.done():
                break
            await deltas.ready()
        pieces = deltas.take()  # what came with the answer
        try:
            completion = record.future.result()
        except Exception as error:
            yield events.error(error)
            return
        sent = list(_pieces(events, pieces))
        yield "".join([*sent, *events.closing(answer(completion), include_usage=include_usage)])
    finally:
        record.cancel()  # nothing happens once it has its answer


def _pieces(events: ChunkEvents, pieces: list[Piece]) -> Iterator[str]:
    for index, text, logprobs in pieces:
        yield events.content(index, text, logprobs)


def _rest(choice: dict[str, Any], streamed: str, chat: bool) -> str:
    """What a choice's final text holds beyond what was streamed of it."""
    text = (choice["message"]["content"] or "") if chat else choice["text"]
    return text[len(streamed) :] if text.startswith(streamed) else ""


def _rest_logprobs(logprobs: dict[str, Any] | None, sent: int) -> dict[str, Any] | None:
    """A choice's logprobs object less the first `sent` tokens' (None when nothing is left)."""
    if logprobs is None:
        return None
    if "content" in logprobs:  # chat
        rest = logprobs["content"][sent:]
        return {"content": rest} if rest else None
    if len(logprobs["tokens"]) <= sent:
        return None
    return {key: values[sent:] for key, values in logprobs.items()}


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
