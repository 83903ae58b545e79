"""Backpressure: producers wait in `submit` while the queue is full (no room), and are let in as it empties.

Waiters are woken in arrival order, one per free place. A producer cancelled after it was given a
place passes it on. When the batcher stops or fails, every waiter gets the error at once, so
`stop` never hangs on a full queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque

from flyteplugins_batcher._errors import QueueFullError
from flyteplugins_batcher._pipeline.pending import PendingQueue


class Backpressure:
    """The producers waiting for room in the queue, on the batcher's event loop.

    Args:
        loop: The batcher's event loop.
        pending: The queue whose size is bounded.
        capacity: Records that may wait there (`BatcherSettings.queue_capacity`; 0: unbounded).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, pending: PendingQueue, capacity: int) -> None:
        self.capacity: float = capacity or math.inf
        self.waiters: deque[asyncio.Future[None]] = deque()  # read on every submit, hence an attribute
        self._loop = loop
        self._pending = pending
        self._closed: BaseException | None = None

    async def wait_for_space(self) -> None:
        """Wait until the queue has room.

        Raises:
            BaseException: The error given to `close` (the batcher stopped or failed meanwhile).
        """
        while self._pending.size >= self.capacity:
            if self._closed is not None:
                raise self._closed
            waiter: asyncio.Future[None] = self._loop.create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                place_given = waiter.done() and not waiter.cancelled() and waiter.exception() is None
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
                if place_given:
                    self.wake()  # pass on the place this cancelled producer will not use
                raise
        if self._closed is not None:
            raise self._closed

    def refusal(self, batcher_name: str, records_per_s: float) -> QueueFullError:
        """The error for a producer that will not wait for room: how full the queue is, and when to come back."""
        depth = self._pending.size
        retry_after_s = max(1.0, depth / records_per_s) if records_per_s > 0 else 1.0
        return QueueFullError(
            f"{batcher_name}: the queue is full ({depth} records wait); retry in about {retry_after_s:.0f} s",
            queue_depth=depth,
            retry_after_s=retry_after_s,
        )

    def wake(self) -> None:
        """Let in as many waiting producers as there are free places."""
        waiters = self.waiters
        free = self.capacity - self._pending.size
        while free > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def close(self, error: BaseException) -> None:
        """Fail every waiting producer, and every later wait, with `error`."""
        self._closed = error
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
