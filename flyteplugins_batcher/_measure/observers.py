"""Observers: code told of every batch and every settled record as it happens (metrics exporters, say).

`BatchStats` is a snapshot to read when asked; an observer sees each event once, which is what a
histogram needs (Prometheus' buckets count observations, not percentiles of them).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from flyteplugins_batcher._types import DispatchReason, SettledOutcome

logger = logging.getLogger("flyteplugins_batcher")


class BatchObserver(Protocol):
    """Told of each batch and each group of settled records, on the batcher's event loop: keep it cheap.

    Example:
        ```python
        class BatchSizes:
            def on_dispatch(self, size, cost, reason, queue_waits_s):
                histogram.observe(size)

            def on_settled(self, outcome, latencies_s, failed):
                pass

        batcher.add_observer(BatchSizes())
        ```
    """

    def on_dispatch(self, size: int, cost: int, reason: DispatchReason, queue_waits_s: Sequence[float]) -> None:
        """A batch went to the process function: its records, cost, why it went, each record's wait since submit."""
        ...

    def on_settled(self, outcome: SettledOutcome, latencies_s: Sequence[float], failed: int) -> None:
        """Records ended: how, each one's time from submit, and (when `completed`) how many got an error."""
        ...


class Observers:
    """The observers of one batcher. One that raises is logged once and left out from then on."""

    __slots__ = ("_observers",)

    def __init__(self) -> None:
        self._observers: list[BatchObserver] = []

    def __bool__(self) -> bool:
        return bool(self._observers)

    def add(self, observer: BatchObserver) -> None:
        self._observers.append(observer)

    def remove(self, observer: BatchObserver) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    def dispatched(self, size: int, cost: int, reason: DispatchReason, queue_waits_s: Sequence[float]) -> None:
        for observer in list(self._observers):
            try:
                observer.on_dispatch(size, cost, reason, queue_waits_s)
            except Exception:
                self._drop(observer)

    def settled(self, outcome: SettledOutcome, latencies_s: Sequence[float], failed: int) -> None:
        for observer in list(self._observers):
            try:
                observer.on_settled(outcome, latencies_s, failed)
            except Exception:
                self._drop(observer)

    def _drop(self, observer: BatchObserver) -> None:
        # A metrics exporter must never fail a batch: say what went wrong once, then stop calling it.
        logger.exception("batch observer %r raised; it is no longer called", observer)
        self.remove(observer)
