"""Deadlines: one timer for every record's `deadline_s`, so a record with a deadline costs a heap push, not a timer.

Records that a runner takes before their deadline are not removed from the heap (that would cost a
search per record); they are skipped when their deadline comes, and the heap is rebuilt without
them whenever they make up most of it (`trim`, after each batch), so memory follows the records
still waiting in the batcher, not how many went through it.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

from flyteplugins_batcher._pipeline.envelope import WAITING, Envelope

_SLACK = 64
"""Entries that can no longer expire tolerated beyond twice the records in the batcher before the heap is rebuilt."""


class DeadlineWatch:
    """Calls `on_expired(envelope)` on the event loop for each waiting record whose deadline passed.

    Args:
        loop: The batcher's event loop.
        on_expired: Receives each record whose deadline passed while it was still queued or staged.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, on_expired: Callable[[Envelope], None]) -> None:
        self._loop = loop
        self._on_expired = on_expired
        self._heap: list[tuple[float, int, Envelope]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = float("inf")

    def watch(self, envelope: Envelope) -> None:
        """Track a record with a deadline (`envelope.deadline`, in `time.monotonic()` seconds)."""
        deadline = envelope.deadline
        assert deadline is not None
        heapq.heappush(self._heap, (deadline, envelope.seq, envelope))
        if deadline < self._armed_for:
            self._arm(deadline)

    def trim(self, in_batcher: int) -> None:
        """Drop the entries that can no longer expire once they outnumber the `in_batcher` records."""
        if len(self._heap) > 2 * in_batcher + _SLACK:
            self._heap = [entry for entry in self._heap if entry[2].state in WAITING]
            heapq.heapify(self._heap)

    def close(self) -> None:
        """Stop watching (the batcher stopped)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._armed_for = None, float("inf")
        self._heap.clear()

    def _arm(self, deadline: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = deadline
        self._timer = self._loop.call_later(max(deadline - time.monotonic(), 0.0), self._fire)

    def _fire(self) -> None:
        self._timer, self._armed_for = None, float("inf")
        heap = self._heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            envelope = heapq.heappop(heap)[2]
            if envelope.state in WAITING:
                self._on_expired(envelope)
        if heap:
            self._arm(heap[0][0])
