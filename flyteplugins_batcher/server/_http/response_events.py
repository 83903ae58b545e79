"""`stream: true` on `/v1/responses`: an answer as the Responses API's typed server-sent events.

`ResponseEvents` is `ChunkEvents`' counterpart (`_http/streaming.py` drives either the same way):
`response.created` and `response.in_progress` first; then the message (`response.output_item.added`,
`response.content_part.added`, a `response.output_text.delta` per piece of text as the engine makes
it, `response.output_text.done`, `response.content_part.done`, `response.output_item.done`); then,
when the request gave tools and the answer calls them (such an answer is read whole), each call
(`response.output_item.added`, `response.function_call_arguments.delta` and `.done`,
`response.output_item.done`); last `response.completed` (or `response.incomplete`) with the whole
response, usage included. Each event names its `type` (and as the SSE `event:` field) and a
`sequence_number` from 0, as OpenAI's stream does; there is no `[DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from flyteplugins_batcher.batch_api import error_code
from flyteplugins_batcher.engines import EngineDeadError, InvalidPromptError, TokenLogprob
from flyteplugins_batcher.server._http.errors import engine_failed_message, log_incident


class ResponseEvents:
    """The events of one streamed Responses API answer.

    Args:
        response: The response as it starts (`status` `in_progress`, no output, no usage).
        choices: Always 1 (the Responses API has no `n`); taken for `ChunkEvents`' signature.
        request: Unused (no logprobs are streamed here); taken for `ChunkEvents`' signature.

    Example:
        ```python
        events = ResponseEvents(started)
        sent = [*events.opening(), events.content(0, "4"), *events.closing(body, include_usage=False)]
        ```
    """

    def __init__(self, response: dict[str, Any], *, choices: int = 1, request: object = None) -> None:
        self.response = response
        self.message_id = "msg" + str(response["id"]).removeprefix("resp")
        self.sequence = 0
        self.text = ""
        self.opened = False  # the message item (and its text part) announced

    def opening(self) -> list[str]:
        """`response.created` and `response.in_progress`, with the response as it starts."""
        return [
            self._event("response.created", response=self.response),
            self._event("response.in_progress", response=self.response),
        ]

    def content(self, index: int, text: str, logprobs: Sequence[TokenLogprob] = ()) -> str:
        """A piece of the message's text (the message and its text part are announced before the first)."""
        opened = "" if self.opened else "".join(self._open_message())
        self.text += text
        return opened + self._event("response.output_text.delta", **self._where(), delta=text, logprobs=[])

    def closing(self, body: dict[str, Any], *, include_usage: bool = True) -> Iterator[str]:
        """What the finished response holds beyond what was sent, each item's end, and `response.completed`."""
        for output_index, item in enumerate(body["output"]):
            if item["type"] == "message":
                yield from self._close_message(item, output_index)
            else:
                yield from self._call(item, output_index)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield self._event(kind, response=body)

    def error(self, error: Exception) -> str:
        """The `error` event that ends a stream whose record failed after it started (its details in the log)."""
        if isinstance(error, InvalidPromptError):
            return self._event("error", code=error_code(error), message=str(error), param=None)
        incident = log_incident(f"the streamed response {self.response['id']} failed", error)
        if isinstance(error, EngineDeadError):
            return self._event("error", code="engine_unavailable", message=engine_failed_message(incident), param=None)
        message = f"The server had an error while generating this answer (error id {incident}; its log has it)."
        return self._event("error", code="server_error", message=message, param=None)

    def _open_message(self) -> Iterator[str]:
        self.opened = True
        item = {"type": "message", "id": self.message_id, "status": "in_progress", "role": "assistant", "content": []}
        yield self._event("response.output_item.added", output_index=0, item=item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self._event("response.content_part.added", **self._where(), part=part)

    def _close_message(self, item: dict[str, Any], output_index: int) -> Iterator[str]:
        text = item["content"][0]["text"]
        if not self.opened:
            yield from self._open_message()
        rest = text[len(self.text) :] if text.startswith(self.text) else ""
        if rest:
            yield self.content(0, rest)
        where = self._where(output_index)
        yield self._event("response.output_text.done", **where, text=text, logprobs=[])
        yield self._event("response.content_part.done", **where, part=item["content"][0])
        yield self._event("response.output_item.done", output_index=output_index, item=item)

    def _call(self, item: dict[str, Any], output_index: int) -> Iterator[str]:
        started = {**item, "arguments": "", "status": "in_progress"}
        yield self._event("response.output_item.added", output_index=output_index, item=started)
        where = {"item_id": item["id"], "output_index": output_index}
        yield self._event("response.function_call_arguments.delta", **where, delta=item["arguments"])
        yield self._event(
            "response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"]
        )
        yield self._event("response.output_item.done", output_index=output_index, item=item)

    def _where(self, output_index: int = 0) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": output_index, "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
