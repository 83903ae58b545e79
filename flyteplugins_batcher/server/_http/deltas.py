"""A request in progress: its client may leave, and its text may arrive while the engine makes it.

- `until_done_or_gone`: Starlette does not cancel a handler whose client disconnects, so a handler
  waiting for a completion would keep its record running for nobody; this waits for either, by
  reading the ASGI `http.disconnect` message (its body has been read by then), and
  `completion_unless_gone` cancels the record when the client goes first.
- `TextDeltas`: the listener a streamed record carries (`Request.on_delta`). The engine calls it
  from its own thread (vLLM's engine loop, the simulated GPU thread) with each new piece of text;
  it keeps the pieces and wakes the server's event loop, once per batch of pieces rather than per
  token (`loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Any

from fastapi import Request

if TYPE_CHECKING:
    from flyteplugins_batcher.batch_api import BatchRequest
    from flyteplugins_batcher.engines import Completion, TokenLogprob
    from flyteplugins_batcher.server._inference import Inference

Piece = tuple[int, str, "tuple[TokenLogprob, ...]"]
"""A choice's index, its new text, and that text's tokens' logprobs (`()` unless asked for)."""

CLIENT_CLOSED_REQUEST = 499
"""The status logged and counted for a request whose client left before its answer (nginx's convention)."""


async def until_done_or_gone(request: Request, done: asyncio.Future[Any]) -> bool:
    """Wait until `done` resolves or the client disconnects; whether the client is still there.

    `done` itself is left alone (the caller cancels what it stands for).
    """
    if done.done():
        return True
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    return done.done()


async def _disconnected(request: Request) -> None:
    """Until the client disconnects (its request body was read: `receive` has nothing else to say)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class TextDeltas:
    """A streamed record's new text, from the engine's thread to the event loop that sends it.

    Call it from any thread with `(choice_index, text, logprobs)`; on the loop, `take()` what came, and await
    `ready()` for more (it also resolves when a watched future does: the record has its answer).

    Args:
        loop: The event loop that streams the answer.

    Example:
        ```python
        deltas = TextDeltas(asyncio.get_running_loop())
        record = await inference.start(request, on_delta=deltas)
        deltas.watch(record.future)
        while not record.future.done():
            await deltas.ready()
            for index, text, logprobs in deltas.take():
                send(index, text, logprobs)
        ```
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pieces: list[Piece] = []
        self._wake_scheduled = False
        self._ready: asyncio.Future[None] = loop.create_future()

    def __call__(self, index: int, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        """A new piece of choice `index`'s text, and its tokens' logprobs if the request asked (any thread)."""
        with self._lock:
            self._pieces.append((index, text, logprobs))
            if self._wake_scheduled:
                return  # the loop will take this one with the pieces before it
            self._wake_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is streaming any more
            self._loop.call_soon_threadsafe(self._wake)

    def watch(self, future: asyncio.Future[Any]) -> None:
        """Resolve `ready()` when `future` does, too."""
        future.add_done_callback(lambda _: self._wake())

    def ready(self) -> asyncio.Future[None]:
        """Resolves once there is text to take, or a watched future is done (on the loop)."""
        return self._ready

    def take(self) -> list[Piece]:
        """Every piece that came since the last `take()`, in order (on the loop)."""
        with self._lock:
            pieces, self._pieces = self._pieces, []
            self._wake_scheduled = False
        if self._ready.done():
            self._ready = self._loop.create_future()
        return pieces

    def _wake(self) -> None:
        if not self._ready.done():
            self._ready.set_result(None)


async def completion_unless_gone(request: Request, inference: Inference, parsed: BatchRequest) -> Completion | None:
    """The request's completion, or `None` when its client left first (its record is cancelled then).

    Raises:
        QueueFullError: The batcher's queue is full.
        Exception: The record's own error (a prompt that cannot run, an engine that died).
    """
    record = await inference.start(parsed)
    try:
        if not await until_done_or_gone(request, record.future):
            return None
        return record.future.result()
    finally:
        record.cancel()  # nothing happens once it has its answer
