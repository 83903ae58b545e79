"""The waiting room: submitted records in FIFO order, with cost accounting and backpressure."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

from flyteplugins_batcher._errors import short_repr
from flyteplugins_batcher._stats import StatsRecorder


class Envelope:
    """A submitted record with its future and accounting; lives only until its batch resolves."""

    __slots__ = ("cost", "future", "record", "seq", "settled", "submitted_at")

    def __init__(self, record: Any, cost: int, future: asyncio.Future[Any], submitted_at: float, seq: int) -> None:
        self.record = record
        self.cost = cost
        self.future = future
        self.submitted_at = submitted_at
        self.seq = seq
        self.settled = False  # counted in the stats as finished (once, however it finished)

    def describe(self) -> str:
        """Names the record in error messages: its submission number and a short repr."""
        return f"record #{self.seq} {short_repr(self.record)}"


class PendingQueue:
    """Records waiting for a batch, oldest first.

    Records leave only from the head and are never put back, so a bounded queue cannot deadlock
    on itself. Producers that find it full wait in FIFO order for space.

    Args:
        max_size: Most records that may wait; 0 means unbounded.
        stats: Told about records dropped because their caller cancelled them.
    """

    def __init__(self, max_size: int, stats: StatsRecorder) -> None:
        self.max_size = max_size
        self.cost = 0
        self._envelopes: deque[Envelope] = deque()
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._stats = stats

    def __len__(self) -> int:
        return len(self._envelopes)

    def __bool__(self) -> bool:
        return bool(self._envelopes)

    @property
    def head(self) -> Envelope:
        """The oldest waiting record."""
        return self._envelopes[0]

    def is_full(self) -> bool:
        """Whether a new record would have to wait for space."""
        return bool(self.max_size) and len(self._envelopes) >= self.max_size

    def append(self, envelope: Envelope) -> None:
        """Queue a record (callers wait for space first)."""
        self._envelopes.append(envelope)
        self.cost += envelope.cost

    async def wait_for_space(self) -> None:
        """Wait until a slot frees up, or raise the error `release_waiters` hands out."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._space_waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            slot_given = waiter.done() and not waiter.cancelled() and waiter.exception() is None
            waiter.cancel()
            with contextlib.suppress(ValueError):
                self._space_waiters.remove(waiter)
            if slot_given:
                self.wake_waiters()  # pass on the slot this cancelled producer will not use
            raise

    def wake_waiters(self) -> None:
        """Let as many waiting producers in as there is space."""
        free = self.max_size - len(self._envelopes) if self.max_size else len(self._space_waiters)
        while free > 0 and self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                free -= 1

    def release_waiters(self, error: BaseException) -> None:
        """Fail every producer waiting for space (the batcher is stopping or failed)."""
        while self._space_waiters:
            waiter = self._space_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)

    def drop_cancelled_head(self) -> None:
        """Discard records at the head whose callers cancelled them."""
        envelopes = self._envelopes
        if not envelopes or not envelopes[0].future.done():
            return
        while envelopes and envelopes[0].future.done():
            self._discard(envelopes.popleft())
        self.wake_waiters()

    def take_batch(self, budget: int, max_size: int) -> list[Envelope]:
        """Take records from the head while they fit `budget` and `max_size`.

        The first record is always taken, so one costlier than the budget runs alone; a later
        record that would cross the budget stays for the next batch. Cancelled records are dropped.
        """
        envelopes = self._envelopes
        batch: list[Envelope] = []
        cost = 0
        while envelopes and len(batch) < max_size:
            envelope = envelopes[0]
            if envelope.future.done():  # cancelled by its caller while it waited
                self._discard(envelopes.popleft())
                continue
            if batch and cost + envelope.cost > budget:
                break
            envelopes.popleft()
            self.cost -= envelope.cost
            cost += envelope.cost
            batch.append(envelope)
        self.wake_waiters()
        return batch

    def clear(self, error: BaseException | None = None) -> int:
        """Empty the queue: cancel every record, or fail it with `error`. Returns how many there were."""
        count = len(self._envelopes)
        while self._envelopes:
            future = self._envelopes.popleft().future
            if future.done():
                continue
            if error is None:
                future.cancel()
            else:
                future.set_exception(error)
        self.cost = 0
        self.wake_waiters()
        return count

    def _discard(self, envelope: Envelope) -> None:
        self.cost -= envelope.cost
        self._stats.record_dropped(time.monotonic(), 1, cancelled=True)
